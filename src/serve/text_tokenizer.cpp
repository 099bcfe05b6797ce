#include "ds/serve/text_tokenizer.h"

#include "ds/core/error.h"

namespace ds::serve {
namespace fs = std::filesystem;

namespace {

class HfTokenizer final : public TextTokenizer {
 public:
  explicit HfTokenizer(std::unique_ptr<data::TextTokenizer> tok) : tok_(std::move(tok)) {
    int32_t eos = tok_->config().eos_id;
    if (eos < 0) eos = tok_->token_to_id("<|endoftext|>");  // GPT-2 files without a config
    if (eos >= 0) eos_.push_back(eos);
  }
  std::vector<int32_t> encode(std::string_view text) const override {
    return tok_->encode(text, /*add_special_tokens=*/true);
  }
  std::string decode(std::span<const int32_t> ids) const override {
    return tok_->decode(ids, /*skip_special_tokens=*/true);
  }
  std::vector<int32_t> eos_ids() const override { return eos_; }
  int32_t vocab_size() const override { return tok_->vocab_size(); }
  std::string name() const override { return std::string(tok_->kind()); }
  const data::TextTokenizer* hf() const override { return tok_.get(); }

 private:
  std::unique_ptr<data::TextTokenizer> tok_;
  std::vector<int32_t> eos_;
};

class ByteTokenizer final : public TextTokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    ids.reserve(text.size());
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::string s;
    s.reserve(ids.size());
    for (int32_t id : ids) {
      DS_CHECK(id >= 0 && id <= 256, "[tokenizer] byte tokenizer: id {} outside [0, 256]", id);
      if (id < 256) s.push_back(static_cast<char>(id));
    }
    return s;
  }
  std::vector<int32_t> eos_ids() const override { return {256}; }
  int32_t vocab_size() const override { return 257; }
  std::string name() const override { return "bytes"; }
};

}  // namespace

bool has_tokenizer_files(const fs::path& dir) { return data::has_tokenizer_files(dir); }

std::unique_ptr<TextTokenizer> load_text_tokenizer(const fs::path& dir) {
  return std::make_unique<HfTokenizer>(data::load_tokenizer(dir));
}

std::unique_ptr<TextTokenizer> make_byte_tokenizer() {
  return std::make_unique<ByteTokenizer>();
}

}  // namespace ds::serve

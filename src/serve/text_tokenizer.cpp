#include "ds/serve/text_tokenizer.h"

#include "ds/core/error.h"
#include "ds/data/tokenizer.h"

namespace ds::serve {
namespace fs = std::filesystem;

namespace {

class Gpt2Tokenizer final : public TextTokenizer {
 public:
  explicit Gpt2Tokenizer(data::Tokenizer tok) : tok_(std::move(tok)) {}
  std::vector<int32_t> encode(std::string_view text) const override { return tok_.encode(text); }
  std::string decode(std::span<const int32_t> ids) const override { return tok_.decode(ids); }
  std::vector<int32_t> eos_ids() const override { return {tok_.eot_id()}; }
  int32_t vocab_size() const override { return tok_.vocab_size(); }
  std::string name() const override { return "gpt2-bpe"; }

 private:
  data::Tokenizer tok_;
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

bool has_gpt2_tokenizer(const fs::path& dir) {
  return (fs::exists(dir / "vocab.json") && fs::exists(dir / "merges.txt")) ||
         (fs::exists(dir / "encoder.json") && fs::exists(dir / "vocab.bpe"));
}

std::unique_ptr<TextTokenizer> load_gpt2_tokenizer(const fs::path& dir) {
  if (fs::exists(dir / "vocab.json") && fs::exists(dir / "merges.txt"))
    return std::make_unique<Gpt2Tokenizer>(
        data::Tokenizer::load(dir / "vocab.json", dir / "merges.txt"));
  if (fs::exists(dir / "encoder.json") && fs::exists(dir / "vocab.bpe"))
    return std::make_unique<Gpt2Tokenizer>(data::Tokenizer::load_gpt2(dir));
  DS_THROW(
      "[tokenizer] {} holds no GPT-2 tokenizer (looked for vocab.json + merges.txt and "
      "encoder.json + vocab.bpe); pass --tokenizer <folder> (scripts/fetch_data.sh puts one in "
      ".cache/data/gpt2)",
      dir.string());
}

std::unique_ptr<TextTokenizer> make_byte_tokenizer() {
  return std::make_unique<ByteTokenizer>();
}

}  // namespace ds::serve

// SentencePiece tokenizer.model through Debian's libsentencepiece (the reference implementation).
#include <sentencepiece_processor.h>

#include "ds/core/error.h"
#include "hf_tokenizer_internal.h"

namespace ds::data::detail {

namespace fs = std::filesystem;

namespace {

class SentencePieceTokenizer final : public TextTokenizer {
 public:
  SentencePieceTokenizer(const fs::path& file, const TokenizerConfig& config) : file_(file) {
    model_ = read_text_file(file);
    const auto status = sp_.LoadFromSerializedProto(model_);
    DS_CHECK(status.ok(), "[tokenizer] '{}' is not a SentencePiece model: {}", file.string(),
             status.ToString());
    config_ = config;
    // LLaMA's tokenizer_config.json names the pieces; without one, the model's own ids.
    auto piece = [&](int id) { return id >= 0 ? sp_.IdToPiece(id) : std::string(); };
    if (config_.bos_token.empty()) config_.bos_token = piece(sp_.bos_id());
    if (config_.eos_token.empty()) config_.eos_token = piece(sp_.eos_id());
    if (config_.unk_token.empty()) config_.unk_token = piece(sp_.unk_id());
    if (config_.pad_token.empty()) config_.pad_token = piece(sp_.pad_id());
    resolve_special_ids(*this, config_, file);
  }

  std::string_view kind() const override { return "sentencepiece"; }

  void encode(std::string_view text, bool add_special_tokens, std::vector<int32_t>& ids,
              std::vector<TokenSpan>* spans) const override {
    const auto end = static_cast<uint32_t>(text.size());
    if (add_special_tokens && config_.add_bos_token && config_.bos_id >= 0) {
      ids.push_back(config_.bos_id);
      if (spans) spans->push_back({0, 0});
    }
    sentencepiece::ImmutableSentencePieceText spt;
    const auto status =
        sp_.Encode(absl::string_view(text.data(), text.size()), spt.mutable_proto());
    DS_CHECK(status.ok(), "[tokenizer] SentencePiece '{}' failed to encode: {}", file_.string(),
             status.ToString());
    for (const auto& p : spt.pieces()) {
      ids.push_back(static_cast<int32_t>(p.id()));
      if (spans) spans->push_back({p.begin(), p.end()});
    }
    if (add_special_tokens && config_.add_eos_token && config_.eos_id >= 0) {
      ids.push_back(config_.eos_id);
      if (spans) spans->push_back({end, end});
    }
  }

  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const override {
    std::vector<int> v;
    v.reserve(ids.size());
    for (int32_t id : ids) {
      DS_CHECK(id >= 0 && id < vocab_size(),
               "[tokenizer] token id {} is not in the vocabulary (size {})", id, vocab_size());
      v.push_back(id);
    }
    std::string out;
    const auto status = sp_.Decode(v, &out);
    DS_CHECK(status.ok(), "[tokenizer] SentencePiece '{}' failed to decode: {}", file_.string(),
             status.ToString());
    return out;
  }

  int32_t vocab_size() const override { return sp_.GetPieceSize(); }
  int32_t token_to_id(std::string_view token) const override {
    const int id = sp_.PieceToId(absl::string_view(token.data(), token.size()));
    return id >= 0 && id < vocab_size() && sp_.IdToPiece(id) == token ? id : -1;
  }
  std::string id_to_token(int32_t id) const override {
    DS_CHECK(id >= 0 && id < vocab_size(), "[tokenizer] token id {} is not in the vocabulary", id);
    return sp_.IdToPiece(id);
  }
  bool is_special(int32_t id) const override {
    return id >= 0 && id < vocab_size() && (sp_.IsControl(id) || sp_.IsUnknown(id));
  }
  void save_model_files(const fs::path& dir) const override {
    write_text_file(dir / "tokenizer.model", model_);
  }

 private:
  fs::path file_;
  std::string model_;  // the serialized ModelProto, written back unchanged
  sentencepiece::SentencePieceProcessor sp_;
};

}  // namespace

std::unique_ptr<TextTokenizer> load_sentencepiece(const fs::path& file,
                                                  const TokenizerConfig& config) {
  return std::make_unique<SentencePieceTokenizer>(file, config);
}

}  // namespace ds::data::detail

#pragma once
// Internal to src/data: the tokenizer.json pipeline every model shares, as Hugging Face
// `tokenizers` runs it:
//
//   text -> added tokens, normalized=false (added_tokens.h) -> normalizer (hf_normalizer.h)
//        -> added tokens, normalized=true -> pre-tokenizer (hf_pretokenizer.h)
//        -> model, one word at a time (HfModel below) -> post-processor (hf_template.h)
//
// HfTokenizer owns all of it: the top-level keys of tokenizer.json, the vocabulary with the added
// tokens laid over the model's, encode / encode_pair / post_process / normalize, decode's special
// token handling and export of tokenizer.json. A model (bpe_tokenizer.cpp, wordpiece_tokenizer.cpp,
// unigram_tokenizer.cpp) parses its "model" object and its decoder, names the components it
// accepts (ModelSpec: what is tested against `tokenizers` with it) and tokenizes one word.
//
// Thread safety: immutable after load; every const method may run on many threads at once.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "added_tokens.h"
#include "ds/data/text_tokenizer.h"
#include "hf_normalizer.h"
#include "hf_pretokenizer.h"
#include "hf_template.h"

namespace ds::data::detail {

// Ids and their spellings: the model's tokens, then the added tokens laid over them.
struct HfVocab {
  std::vector<std::string> tokens;  // id -> spelling ("Ġworld", "##ing", "▁the", "[CLS]")
  std::vector<uint8_t> in_model;    // id -> listed in model.vocab
  std::vector<uint8_t> special;     // id -> special added token
  std::vector<uint8_t> present;     // id -> in model.vocab or added (else a gap, never produced)
  std::unordered_map<std::string, int32_t> by_token;  // model's (a repeated piece: last id), then
                                                      // added tokens

  int32_t size() const { return static_cast<int32_t>(tokens.size()); }
  // Make room for ids [0, n).
  void resize(size_t n);
  // Record a model token; the model checks for repeats first.
  void add_model_token(const std::string& token, int32_t id);
};

// What a model accepts around it. Lists name tokenizer.json "type"s ("Sequence": a sequence of
// the others; in pre_tokenizers, "null": the field may be null, as the normalizer, post-processor
// and decoder always may).
struct ModelSpec {
  std::string_view kind;    // TextTokenizer::kind()
  std::string_view loader;  // in errors: "... is not supported by the BPE loader"
  Normalizer::Family normalizer;
  std::vector<std::string_view> pre_tokenizers;
  std::vector<std::string_view> post_processors;
  bool pairs_need_template;  // true: encode_pair throws without a pair template
  bool vocab_gaps;           // ids neither in model.vocab nor added are allowed
  bool ignores_truncation;   // true: tokenizer.json's truncation/padding are ignored, else refused
};

class HfModel {
 public:
  virtual ~HfModel() = default;
  virtual const ModelSpec& spec() const = 0;
  // Parse tokenizer.json's "model" (its "type" already checked): ids of the model's tokens into
  // vocab (vocab.resize to at least the largest id + 1, added's ids included).
  virtual void load(const nlohmann::json& model, const AddedVocabulary& added,
                    const std::filesystem::path& file, HfVocab& vocab) = 0;
  // After the added tokens are laid over the model's (e.g. BPE's merges name tokens by spelling).
  virtual void link(const nlohmann::json& model, const HfVocab& vocab,
                    const std::filesystem::path& file) {}
  // Checks across components (BPE: a ByteLevel pre-tokenizer).
  virtual void check(const PreTokenizer& pre, const std::filesystem::path& file) const {}
  // Parse tokenizer.json's "decoder" (null: none).
  virtual void set_decoder(const nlohmann::json& j, const std::filesystem::path& file) = 0;

  // Append the tokens of one pre-tokenized word, with their spans (word.span) when spans is set.
  virtual void tokenize(const WordView& word, std::vector<int32_t>& ids,
                        std::vector<TokenSpan>* spans) const = 0;
  // The text of ids (valid, specials already skipped as asked).
  virtual std::string decode(std::span<const int32_t> ids, const HfVocab& vocab) const = 0;
  // Files besides tokenizer.json for tools that predate it (vocab.json + merges.txt, vocab.txt).
  virtual void save_files(const std::filesystem::path& dir, const HfVocab& vocab) const {}
};

// The models (bpe_tokenizer.cpp, wordpiece_tokenizer.cpp, unigram_tokenizer.cpp).
std::unique_ptr<HfModel> make_bpe_model(const std::filesystem::path& merges_file = {});
std::unique_ptr<HfModel> make_wordpiece_model();
std::unique_ptr<HfModel> make_unigram_model();

// tokenizer.json's tokens joined with spaces: `tokenizers`' decode without a decoder.
std::string join_tokens(std::span<const int32_t> ids, const HfVocab& vocab);

class HfTokenizer final : public TextTokenizer {
 public:
  // json_text: the bytes save_model_files writes as tokenizer.json; j: parsed.
  HfTokenizer(std::unique_ptr<HfModel> model, const std::filesystem::path& file,
              std::string json_text, const nlohmann::json& j, const TokenizerConfig& config);

  std::string_view kind() const override { return model_->spec().kind; }
  void encode(std::string_view text, bool add_special_tokens, std::vector<int32_t>& ids,
              std::vector<TokenSpan>* spans) const override;
  PairEncoding encode_pair(std::string_view a, std::string_view b,
                           bool add_special_tokens) const override;
  PairEncoding post_process(std::span<const int32_t> a,
                            const std::span<const int32_t>* b) const override;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const override;
  int32_t vocab_size() const override { return vocab_.size(); }
  int32_t token_to_id(std::string_view token) const override;
  std::string id_to_token(int32_t id) const override { return vocab_.tokens[checked(id)]; }
  bool is_special(int32_t id) const override { return vocab_.special[checked(id)] != 0; }
  std::string normalize(std::string_view text) const override;
  void save_model_files(const std::filesystem::path& dir) const override;

 private:
  int32_t checked(int32_t id) const;
  void set_added_tokens(const std::filesystem::path& file);
  // Tokens of one sequence, no post-processor.
  void encode_sequence(std::string_view text, std::vector<int32_t>& ids,
                       std::vector<TokenSpan>* spans) const;
  bool has_pairs() const { return !model_->spec().pairs_need_template || !template_.pair.empty(); }

  std::unique_ptr<HfModel> model_;
  HfVocab vocab_;
  AddedVocabulary added_;
  Normalizer normalizer_;
  PreTokenizer pre_tokenizer_;
  PairTemplate template_;
  std::string json_text_;
};

}  // namespace ds::data::detail

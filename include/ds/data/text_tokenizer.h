#pragma once
// Tokenizers of Hugging Face model folders, behind one interface.
//
//   auto tok = ds::data::load_tokenizer("path/to/hf_model");      // tokenizer.json,
//   tokenizer.model, ... std::vector<int32_t> ids = tok->encode("Hello world");        // no
//   BOS/EOS std::vector<int32_t> with = tok->encode("Hi", /*add_special_tokens=*/true);  // + BOS
//   if the model adds it std::string text = tok->decode(ids); int32_t eos = tok->config().eos_id;
//   // -1 when the folder names none
//
// load_tokenizer looks in the folder, in this order, for:
//   tokenizer.json               byte-level BPE (GPT-2, Llama-3, Qwen2, ...: bpe_tokenizer.cpp),
//                                WordPiece (BERT: wordpiece_tokenizer.cpp) or Unigram
//                                (DeBERTa-v2/v3, T5: unigram_tokenizer.cpp), by model.type
//   spm.model                    DeBERTa-v2/v3 as the hub ships it: the Unigram pipeline of
//                                transformers 5's DebertaV2Tokenizer (deberta_spm.cpp)
//   tokenizer.model              SentencePiece (LLaMA-1/2, Mistral v0.1), through libsentencepiece
//   vocab.json + merges.txt      GPT-2's file pair (also encoder.json + vocab.bpe, OpenAI's names)
// and reads tokenizer_config.json (and chat_template.jinja) when present, for the names of the
// bos/eos/pad/unk (and BERT's cls/sep/mask) tokens, add_bos_token/add_eos_token and the chat
// template. Anything it does not implement exactly (another model type, an unknown pre-tokenizer
// regex, normalizer, ...) is a ds::Error naming the file and the field, never a silently different
// tokenization.
//
// Encoding follows HF `tokenizers` for tokenizer.json: added tokens (special or not) are matched
// first (leftmost, longest; normalized=true ones in the normalized text; lstrip/rstrip/single_word
// as there), the rest is normalized, pre-tokenized and BPE-merged
// (WordPiece: split greedily into the longest vocabulary pieces);
// with add_special_tokens the post-processor's tokens (e.g. Llama-3's BOS) are added. SentencePiece
// folders encode as the sentencepiece library does (text that spells "<s>" stays text).
//
// Sentence pairs (BERT's "[CLS] A [SEP] B [SEP]"): encode_pair gives the ids and the token type
// ids the post-processor's pair template assigns; tokenizers without one throw.
//
// Thread safety: a loaded tokenizer is immutable; all methods are const and may be called from
// many threads at once.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ds::data {

// What tokenizer_config.json (or, lacking it, the tokenizer itself) says about special tokens.
// Ids are -1 where the folder names no such token.
struct TokenizerConfig {
  std::string bos_token, eos_token, pad_token, unk_token;
  int32_t bos_id = -1, eos_id = -1, pad_id = -1, unk_id = -1;
  // BERT's: the classification and separator tokens of the pair template, and the MLM mask.
  std::string cls_token, sep_token, mask_token;
  int32_t cls_id = -1, sep_id = -1, mask_id = -1;
  // SentencePiece only (tokenizer.json carries its own post-processor): tokens encode(..., true)
  // adds.
  bool add_bos_token = false, add_eos_token = false;
  int64_t model_max_length = 0;  // 0 when not given
  std::string chat_template;     // Jinja source from tokenizer_config.json / chat_template.jinja
};

// Byte range [begin, end) of the input text a token came from (added tokens: their match; the
// tokens encode(..., true) adds: an empty range at 0 or at the end). For tokenizers with an NFC
// normalizer (NFC, BertNormalizer) the ranges refer to the normalized text: call normalize() first
// when that matters.
struct TokenSpan {
  uint32_t begin = 0, end = 0;
};

// A sequence pair as the model sees it: ids and, per id, its token type (segment) id.
struct PairEncoding {
  std::vector<int32_t> ids;        // (T)
  std::vector<uint32_t> type_ids;  // (T) BERT: 0 for [CLS] A [SEP], 1 for B [SEP]
};

class TextTokenizer {
 public:
  virtual ~TextTokenizer() = default;

  // "bpe" (byte-level BPE), "wordpiece", "unigram" (tokenizer.json) or "sentencepiece".
  virtual std::string_view kind() const = 0;

  // Append the tokens of text to ids; when spans is not null, append one TokenSpan per token.
  virtual void encode(std::string_view text, bool add_special_tokens, std::vector<int32_t>& ids,
                      std::vector<TokenSpan>* spans = nullptr) const = 0;
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const {
    std::vector<int32_t> ids;
    encode(text, add_special_tokens, ids);
    return ids;
  }

  // Encode the pair (a, b). With add_special_tokens, as the post-processor's pair template places
  // them (WordPiece/BERT: [CLS] a [SEP] b [SEP], type ids 0 through the first [SEP], then 1);
  // without, a's tokens (type 0) then b's (type 1), as `tokenizers` does. Throws ds::Error for
  // tokenizers that have no pair template (byte-level BPE without one, as GPT-2; SentencePiece).
  virtual PairEncoding encode_pair(std::string_view a, std::string_view b,
                                   bool add_special_tokens = true) const;

  // The post-processor's template applied to sequences already tokenized (and, e.g., truncated):
  // b null = the single template ([CLS] a [SEP], all type 0), else the pair template, exactly as
  // encode / encode_pair place the special tokens. Without a template: a (type 0), then b (type
  // 1). Throws ds::Error for tokenizers that have no pair template (byte-level BPE,
  // SentencePiece). HF truncation: truncate a and b to max_length minus
  // post_process({}, &empty).ids.size() first (ds/data/classification.h does).
  virtual PairEncoding post_process(std::span<const int32_t> a,
                                    const std::span<const int32_t>* b) const;

  // Text of the tokens. Byte-level BPE returns the exact bytes (a slice may end inside a UTF-8
  // character); SentencePiece drops the leading dummy-prefix space as the library does; WordPiece
  // joins words with spaces, glues "##" pieces and applies its decoder's cleanup. Throws on
  // an id outside the vocabulary.
  virtual std::string decode(std::span<const int32_t> ids,
                             bool skip_special_tokens = false) const = 0;

  // Number of ids (largest id + 1, added tokens included).
  virtual int32_t vocab_size() const = 0;
  // Id of a token as the vocabulary spells it ("Ġworld", "▁the", "<|eot_id|>"), or -1.
  virtual int32_t token_to_id(std::string_view token) const = 0;
  // The vocabulary's spelling of an id.
  virtual std::string id_to_token(int32_t id) const = 0;
  // True for special tokens (added tokens marked special; SentencePiece control tokens).
  virtual bool is_special(int32_t id) const = 0;
  // The text after the tokenizer's normalizer (identity unless tokenizer.json has one, e.g. NFC or
  // BertNormalizer; added tokens are kept as they are).
  virtual std::string normalize(std::string_view text) const { return std::string(text); }

  const TokenizerConfig& config() const { return config_; }

  // Write the tokenizer's own files (tokenizer.json + vocab.json + merges.txt, tokenizer.json +
  // vocab.txt for WordPiece, or tokenizer.model)
  // into dir. export_tokenizer (tokenizer_export.h) adds tokenizer_config.json.
  virtual void save_model_files(const std::filesystem::path& dir) const = 0;

 protected:
  TokenizerConfig config_;
};

// Load the tokenizer of a Hugging Face model folder (see the top of this file). Throws ds::Error
// naming the folder and what was looked for when nothing usable is there.
std::unique_ptr<TextTokenizer> load_tokenizer(const std::filesystem::path& folder);

// Whether folder holds one of the files load_tokenizer reads (it may still fail to load).
bool has_tokenizer_files(const std::filesystem::path& folder);

}  // namespace ds::data

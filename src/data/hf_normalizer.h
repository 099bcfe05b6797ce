#pragma once
// Internal to src/data: tokenizer.json normalizers as Hugging Face `tokenizers` runs them, with the
// alignment of every output byte to the input bytes it came from (for token offsets).
//
//   NormalizerChain n = parse_normalizer(j["normalizer"], file, "Unigram");
//   NormalizedText t = NormalizedText::from(text, /*base=*/0);
//   n.run(t);            // t.text normalized; t.span(a, b) = input range of t.text[a, b)
//
// Supported: NFC, NFD, NFKC, NFKD, Lowercase, Strip, Replace (string pattern, or the one regex
// DeBERTa-v2 uses: \s{2,}|[\n\r\t]), Prepend, Precompiled (SentencePiece's precompiled_charsmap:
// Darts double-array trie + normalized strings, looked up per grapheme as `tokenizers` does) and a
// Sequence of them. Anything else is a ds::Error naming the type. Normalizer (below) is what a
// tokenizer.json pipeline holds: this chain, or the text-only BertNormalizer or NFC.
//
// Offsets follow `tokenizers`: a character replacing several keeps the range of the last of them
// (Replace) or of the first (NFC and the other forms, Precompiled); inserted characters share the
// range of the character before them (prepended ones: the first).
// Immutable after parsing; run is const and thread-safe.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/data/text_tokenizer.h"

namespace ds::data::detail {

struct NormalizedText {
  std::string text;
  std::vector<TokenSpan> align;  // one per byte of text: the input byte range it came from

  // text as it is; input offsets start at base.
  static NormalizedText from(std::string_view text, uint32_t base);
  // The input range of text[from, to) (from < to).
  TokenSpan span(size_t from, size_t to) const { return {align[from].begin, align[to - 1].end}; }
  // Append the UTF-8 bytes of one character, all aligned to s.
  void push(std::string_view bytes, TokenSpan s) {
    text.append(bytes);
    align.insert(align.end(), bytes.size(), s);
  }
};

class NormalizerStep {
 public:
  virtual ~NormalizerStep() = default;
  virtual void run(NormalizedText& t) const = 0;
};

class NormalizerChain {
 public:
  void run(NormalizedText& t) const {
    for (const auto& s : steps_) s->run(t);
  }
  bool empty() const { return steps_.empty(); }
  void add(std::unique_ptr<NormalizerStep> s) { steps_.push_back(std::move(s)); }

 private:
  std::vector<std::shared_ptr<const NormalizerStep>> steps_;
};

// Parse a tokenizer.json normalizer (null: none). field names it in errors ("normalizer").
NormalizerChain parse_normalizer(const nlohmann::json& j, const std::string& field,
                                 const std::filesystem::path& file, std::string_view loader);

// BertNormalizer's options (WordPiece).
struct BertOptions {
  bool clean_text = true, handle_chinese_chars = true, strip_accents = true, lowercase = true;
};

// The normalizer of a tokenizer.json pipeline (hf_pipeline.h), in the family its model accepts:
//   kChain  the chain above; token spans are input offsets (Unigram).
//   kBert   BertNormalizer (WordPiece): text-only, spans are offsets into the whole normalized
//           text (normalize() of text_tokenizer.h).
//   kNfc    NFC or a Sequence of NFC (byte-level BPE; text that is not valid UTF-8 stays as it
//           is): text-only, spans are the input offset where the piece between two
//           normalized=false added tokens starts plus the offset in its NFC (input offsets
//           wherever NFC leaves the text as it is).
// Text-only alignments have one range per byte (a byte-level token may end inside a character).
// Immutable after construction; const methods are thread-safe.
class Normalizer {
 public:
  enum Family { kChain, kBert, kNfc };

  Normalizer() = default;
  // Parse j (null: none, the identity). A type the family does not hold is a
  // ds::Error naming the file, the field and loader (the model's name in messages).
  Normalizer(const nlohmann::json& j, Family family, const std::filesystem::path& file,
             std::string_view loader);
  // s normalized. Alignment (see the families): from input_base, the input offset of s, or
  // (kBert) from output_base, the normalized length of the text before s.
  NormalizedText run(std::string_view s, uint32_t input_base, uint32_t output_base) const;
  // s normalized, text only (what AddedVocabulary matches normalized=true tokens against).
  std::string text(std::string_view s) const;
  // Whether spans are input offsets where s starts (all but kBert): what the span of an added
  // token matched before normalization is.
  bool input_offsets() const { return family_ != kBert; }

 private:
  Family family_ = kChain;
  bool none_ = true;
  NormalizerChain chain_;
  BertOptions bert_;
};

// Rust's char::is_whitespace (the White_Space property), which Strip and WhitespaceSplit use.
bool is_white_space(char32_t c);

}  // namespace ds::data::detail

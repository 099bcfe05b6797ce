#pragma once
// Internal to src/data: a tokenizer.json's added_tokens and how Hugging Face `tokenizers`
// (AddedVocabulary) finds them in a text; one implementation for every tokenizer.json model (BPE,
// WordPiece, Unigram).
//
//   AddedVocabulary added(j["added_tokens"], file, "WordPiece");   // every entry checked
//   added.set_normalizer(file, [&](std::string_view s) { return my_normalize(s); });
//   std::vector<AddedSplit> raw, norm;
//   added.split(text, AddedVocabulary::kRaw, raw);          // 1. normalized=false tokens, raw text
//   for (const AddedSplit& p : raw)
//     if (!p.token) {                                        // 2. the rest: normalize, then the
//       std::string n = my_normalize(text.substr(p.begin, p.end - p.begin));  // normalized=true
//       added.split(n, AddedVocabulary::kNormalized, norm);                   // tokens in it
//       ... pre-tokenize and tokenize the pieces of norm that are not tokens
//     }
//
// The flags, as AddedVocabulary::find_matches applies them (tokenizers 0.23):
//   normalized   false: matched in the raw text, before normalization (pass kRaw).
//                true: matched in the normalized text between the kRaw matches, against the
//                content run through the same normalizer (pass kNormalized).
//                A missing key: !special (tokenizers' AddedToken::from).
//   single_word  a match with a word character (regex \w: letters, marks, Nl, Nd, Pc, ZWJ/ZWNJ and
//                the circled/squared Latin letters) right before or after it in the piece is
//                dropped; the text it covered is not searched again.
//   lstrip       the whitespace run before the match joins it (never past the previous match).
//   rstrip       the whitespace run after the match joins it.
// Matches are leftmost, the longest at a position, non-overlapping (Aho-Corasick LeftmostLongest).
// Immutable after set_normalizer; split is const and thread-safe.
#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace ds::data::detail {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool single_word = false, lstrip = false, rstrip = false, normalized = true, special = false;
};

// One piece of a split text: an added token's match (with the whitespace it strips) or the text
// between two matches (token null). Byte offsets into the text given to split.
struct AddedSplit {
  size_t begin = 0, end = 0;
  const AddedToken* token = nullptr;
};

class AddedVocabulary {
 public:
  enum Pass { kRaw, kNormalized };

  AddedVocabulary() = default;
  // added: tokenizer.json's "added_tokens" array (null: none). An entry with a key other than id,
  // content, single_word, lstrip, rstrip, normalized, special, a flag that is not a boolean, or an
  // empty content is a ds::Error naming the file, the entry and the loader.
  AddedVocabulary(const nlohmann::json& added, const std::filesystem::path& file,
                  std::string_view loader);

  // In file order.
  const std::vector<AddedToken>& tokens() const { return tokens_; }
  bool empty() const { return tokens_.empty(); }

  // Build the match tables; normalize is the tokenizer's normalizer (identity when it has none),
  // applied to the content of normalized=true tokens. Call once, after the constructor.
  void set_normalizer(const std::filesystem::path& file,
                      const std::function<std::string(std::string_view)>& normalize);

  // Replace out with the pieces of text, in order (none for an empty text). Without any token of
  // this pass: one piece, the whole text.
  void split(std::string_view text, Pass pass, std::vector<AddedSplit>& out) const;

  // Whether this pass has tokens to look for.
  bool has(Pass pass) const { return has_[pass]; }

 private:
  struct Pattern {
    std::string text;  // the content, or (kNormalized) the normalized content
    size_t token;      // index in tokens_
  };
  std::vector<AddedToken> tokens_;
  // Per pass, per first byte, longest first (ties: file order, special tokens first).
  std::array<std::array<std::vector<Pattern>, 256>, 2> by_first_;
  bool has_[2] = {false, false};
};

}  // namespace ds::data::detail

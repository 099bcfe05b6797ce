#pragma once
// Pre-tokenizer regexes of byte-level BPE tokenizers, hand-written over the Unicode tables of
// unicode.h (std::regex has no \p{..} and no lookahead). Internal to src/data.
//
//   GPT-2   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   Llama-3 (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//           ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   Qwen2   the Llama-3 regex with \p{N} (single digits) instead of \p{N}{1,3}
//
// Every position matches one of the alternatives, so a text is cut into consecutive words with no
// gaps (HF's Split "Isolated" behaviour and tiktoken's findall give the same words).
#include <cstddef>
#include <optional>
#include <string_view>

#include "ds/data/unicode.h"

namespace ds::data::detail {

enum class SplitPattern { kGpt2, kLlama3, kQwen2 };

inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// The pattern a tokenizer.json Split regex spells, or nullopt when it is none of the three.
inline std::optional<SplitPattern> split_pattern_from_regex(std::string_view regex) {
  if (regex == kGpt2Pattern) return SplitPattern::kGpt2;
  if (regex == kLlama3Pattern) return SplitPattern::kLlama3;
  if (regex == kQwen2Pattern) return SplitPattern::kQwen2;
  return std::nullopt;
}

struct ClassedChar {
  CharClass cls;
  uint8_t len;
};

// onig: classify as Oniguruma does (HF tokenizers) rather than as Python's `regex` (OpenAI's
// encoder.py, the GPT-2 Tokenizer of tokenizer.h). They differ only on recently assigned code
// points.
inline ClassedChar char_at(std::string_view s, size_t i, bool onig) {
  const auto b = static_cast<uint8_t>(s[i]);
  if (b < 0x80) return {classify(b), 1};
  const Utf8Char c = utf8_decode(s, i);
  if (!c.valid) return {CharClass::kOther, c.len};
  return {onig ? classify_onig(c.cp) : classify(c.cp), c.len};
}

// Length of 's 't 're 've 'm 'll 'd at s[i], or 0. Case-insensitive as Oniguruma's (?i:) is, where
// U+017F (long s) folds to 's'.
inline size_t contraction_len(std::string_view s, size_t i, bool ignore_case) {
  if (s[i] != '\'' || i + 1 >= s.size()) return 0;
  auto lower = [&](char c) { return ignore_case && c >= 'A' && c <= 'Z' ? char(c + 32) : c; };
  const char c1 = lower(s[i + 1]);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if (ignore_case && s.substr(i + 1).starts_with("\xC5\xBF")) return 3;  // U+017F
  if (i + 2 < s.size()) {
    const char c2 = lower(s[i + 2]);
    if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  }
  return 0;
}

// End of the run of characters of class cls starting at j (at most max_chars of them).
inline size_t class_run_end(std::string_view s, size_t j, CharClass cls, bool onig,
                            size_t max_chars = SIZE_MAX) {
  size_t count = 0;
  while (j < s.size() && count < max_chars) {
    const ClassedChar e = char_at(s, j, onig);
    if (e.cls != cls) break;
    j += e.len;
    ++count;
  }
  return j;
}

// \s+(?!\S)|\s+ at i (s[i] is whitespace): the whole run at the end of the text, otherwise all but
// its last character (so that " word" keeps its leading space), or one character when that is all.
inline size_t whitespace_match_end(std::string_view s, size_t i, bool onig) {
  size_t j = i + char_at(s, i, onig).len, last = i;
  while (j < s.size()) {
    const ClassedChar e = char_at(s, j, onig);
    if (e.cls != CharClass::kSpace) break;
    last = j;
    j += e.len;
  }
  return (j == s.size() || last == i) ? j : last;
}

// End of GPT-2's match at i.
inline size_t gpt2_match_end(std::string_view s, size_t i, bool onig) {
  if (size_t c = contraction_len(s, i, false)) return i + c;
  // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': an optional U+0020 then a run of one class.
  ClassedChar d = char_at(s, i, onig);
  size_t run = i;
  if (s[i] == ' ' && i + 1 < s.size()) {
    const ClassedChar next = char_at(s, i + 1, onig);
    if (next.cls != CharClass::kSpace) d = next, run = i + 1;
  }
  if (d.cls != CharClass::kSpace) return class_run_end(s, run + d.len, d.cls, onig);
  return whitespace_match_end(s, i, onig);
}

// End of the Llama-3 (max_digits 3) or Qwen2 (max_digits 1) match at i. The alternatives are tried
// in the regex's order; each comment says which.
inline size_t llama3_match_end(std::string_view s, size_t i, size_t max_digits, bool onig) {
  const size_t n = s.size();
  if (size_t c = contraction_len(s, i, true)) return i + c;
  const ClassedChar d = char_at(s, i, onig);
  const bool newline = s[i] == '\r' || s[i] == '\n';
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (d.cls == CharClass::kLetter) return class_run_end(s, i + d.len, CharClass::kLetter, onig);
  if (!newline && d.cls != CharClass::kNumber && i + d.len < n &&
      char_at(s, i + d.len, onig).cls == CharClass::kLetter)
    return class_run_end(s, i + d.len, CharClass::kLetter, onig);
  // \p{N}{1,3}
  if (d.cls == CharClass::kNumber) return class_run_end(s, i, CharClass::kNumber, onig, max_digits);
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
  size_t start = i;
  if (s[i] == ' ' && i + 1 < n && char_at(s, i + 1, onig).cls == CharClass::kOther) start = i + 1;
  if (char_at(s, start, onig).cls == CharClass::kOther) {
    size_t j = class_run_end(s, start, CharClass::kOther, onig);
    while (j < n && (s[j] == '\r' || s[j] == '\n')) ++j;
    return j;
  }
  // \s*[\r\n]+ : up to and including the last \r or \n of the whitespace run.
  size_t j = i, last_newline = SIZE_MAX;
  while (j < n) {
    const ClassedChar e = char_at(s, j, onig);
    if (e.cls != CharClass::kSpace) break;
    if (s[j] == '\r' || s[j] == '\n') last_newline = j;
    j += e.len;
  }
  if (last_newline != SIZE_MAX) return last_newline + 1;
  // \s+(?!\S)|\s+
  return whitespace_match_end(s, i, onig);
}

// Calls emit(word) for each match of the pattern in s, left to right.
template <class Emit>
void split_words(SplitPattern pattern, std::string_view s, bool onig, Emit&& emit) {
  size_t i = 0;
  while (i < s.size()) {
    size_t end;
    switch (pattern) {
      case SplitPattern::kGpt2:
        end = gpt2_match_end(s, i, onig);
        break;
      case SplitPattern::kLlama3:
        end = llama3_match_end(s, i, 3, onig);
        break;
      default:
        end = llama3_match_end(s, i, 1, onig);
        break;
    }
    emit(s.substr(i, end - i));
    i = end;
  }
}

}  // namespace ds::data::detail

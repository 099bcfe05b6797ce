#pragma once
// UTF-8 decoding and the three Unicode classes GPT-2's pre-tokenizer regex uses (\p{L}, \p{N}, \s).
// std::regex has no Unicode classes, so the classes are range tables generated from the Python
// `regex` module (scripts/codegen/gen_unicode_tables.py), the same module the reference encoder uses.
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace ds::data {

enum class CharClass : uint8_t {
  kLetter,  // \p{L}
  kNumber,  // \p{N}
  kSpace,   // \s (Unicode whitespace as Python's `regex` module defines it)
  kOther,   // everything else, including bytes that are not valid UTF-8
};

// Class of one code point. ASCII is a table lookup; the rest a binary search over ranges.
CharClass classify(char32_t cp);

// Class of one code point as Oniguruma, the regex engine of Hugging Face `tokenizers`, sees it:
// classify() except for the code points its older Unicode tables do not know (e.g. Unicode 17
// letters, which it takes as kOther). scripts/codegen/gen_onig_unicode_delta.py generates the differences.
CharClass classify_onig(char32_t cp);

struct Utf8Char {
  char32_t cp;  // the code point, or 0xFFFD when `valid` is false
  uint8_t len;  // bytes consumed, 1..4 (1 for an invalid byte)
  bool valid;
};

// Decode the code point starting at s[i] (i < s.size()). Malformed sequences (bad continuation,
// overlong forms, surrogates, > U+10FFFF, truncation) consume one byte and report valid = false,
// so any byte string can be walked without loss.
inline Utf8Char utf8_decode(std::string_view s, size_t i) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) return {b0, 1, true};
  const Utf8Char bad{0xFFFD, 1, false};
  int len;
  char32_t cp;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2, cp = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, cp = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, cp = b0 & 0x07;
  } else {
    return bad;
  }
  if (i + len > s.size()) return bad;
  for (int k = 1; k < len; ++k) {
    const auto b = static_cast<uint8_t>(s[i + k]);
    if ((b & 0xC0) != 0x80) return bad;
    cp = (cp << 6) | (b & 0x3F);
  }
  static constexpr char32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return bad;
  return {cp, static_cast<uint8_t>(len), true};
}

// Append the UTF-8 encoding of cp (a valid scalar value) to out.
template <class String>
void utf8_append(String& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace detail {
struct CodeRange {
  char32_t lo, hi;  // inclusive
};
struct ClassOverride {
  char32_t lo, hi;  // inclusive
  CharClass cls;
};
}  // namespace detail

}  // namespace ds::data

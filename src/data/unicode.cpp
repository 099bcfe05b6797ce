#include "ds/data/unicode.h"

#include <algorithm>
#include <array>

namespace ds::data {

namespace detail {
// Defined in unicode_tables.cpp (generated).
extern const CodeRange kLetterRanges[];
extern const size_t kLetterRangeCount;
extern const CodeRange kNumberRanges[];
extern const size_t kNumberRangeCount;
extern const CodeRange kSpaceRanges[];
extern const size_t kSpaceRangeCount;
// Defined in unicode_tables_onig.cpp (generated).
extern const ClassOverride kOnigOverrides[];
extern const size_t kOnigOverrideCount;
}  // namespace detail

namespace {

bool in_ranges(const detail::CodeRange* ranges, size_t n, char32_t cp) {
  // First range whose hi >= cp; cp is inside it when lo <= cp.
  const auto* end = ranges + n;
  const auto* it = std::lower_bound(
      ranges, end, cp, [](const detail::CodeRange& r, char32_t c) { return r.hi < c; });
  return it != end && it->lo <= cp;
}

constexpr std::array<CharClass, 128> make_ascii_table() {
  std::array<CharClass, 128> t{};
  for (int c = 0; c < 128; ++c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
      t[c] = CharClass::kLetter;
    } else if (c >= '0' && c <= '9') {
      t[c] = CharClass::kNumber;
    } else if (c == ' ' || (c >= 0x09 && c <= 0x0D)) {
      t[c] = CharClass::kSpace;
    } else {
      t[c] = CharClass::kOther;
    }
  }
  return t;
}

constexpr auto kAscii = make_ascii_table();

}  // namespace

CharClass classify(char32_t cp) {
  if (cp < 128) return kAscii[cp];
  if (in_ranges(detail::kLetterRanges, detail::kLetterRangeCount, cp)) return CharClass::kLetter;
  if (in_ranges(detail::kNumberRanges, detail::kNumberRangeCount, cp)) return CharClass::kNumber;
  if (in_ranges(detail::kSpaceRanges, detail::kSpaceRangeCount, cp)) return CharClass::kSpace;
  return CharClass::kOther;
}

CharClass classify_onig(char32_t cp) {
  const auto* begin = detail::kOnigOverrides;
  const auto* end = begin + detail::kOnigOverrideCount;
  if (cp < begin->lo) return classify(cp);
  const auto* it = std::lower_bound(
      begin, end, cp, [](const detail::ClassOverride& r, char32_t c) { return r.hi < c; });
  return it != end && it->lo <= cp ? it->cls : classify(cp);
}

}  // namespace ds::data

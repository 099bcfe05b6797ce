// tokenizer.json added tokens, matched as `tokenizers`' AddedVocabulary::find_matches does.
#include "added_tokens.h"

#include <algorithm>
#include <climits>

#include <utf8proc.h>

#include "ds/core/error.h"
#include "ds/data/unicode.h"
#include "hf_json.h"
#include "hf_normalizer.h"

namespace ds::data::detail {

namespace fs = std::filesystem;
using ojson = nlohmann::json;

namespace {

// The regex crate's Unicode \w: Alphabetic, M, Nd, Pc, Join_Control. Alphabetic is L, Nl and
// Other_Alphabetic, which outside M holds only the circled and squared Latin letters (So);
// checked against tokenizers 0.23 over every code point
// (tests/fixtures/generators/gen_added_token_fixtures.py).
bool is_word_char(char32_t c) {
  if (c == 0x200C || c == 0x200D || (c >= 0x24B6 && c <= 0x24E9) ||
      (c >= 0x1F130 && c <= 0x1F149) || (c >= 0x1F150 && c <= 0x1F169) ||
      (c >= 0x1F170 && c <= 0x1F189))
    return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

// The last character of s (not empty); an invalid trailing byte is one invalid character.
Utf8Char last_char(std::string_view s) {
  size_t i = s.size() - 1;
  for (int k = 0; k < 3 && i > 0 && (static_cast<uint8_t>(s[i]) & 0xC0) == 0x80; ++k) --i;
  const Utf8Char c = utf8_decode(s, i);
  return i + c.len == s.size() ? c : Utf8Char{0xFFFD, 1, false};
}

bool ends_with_word(std::string_view s) {
  if (s.empty()) return false;
  const Utf8Char c = last_char(s);
  return c.valid && is_word_char(c.cp);
}

bool starts_with_word(std::string_view s) {
  if (s.empty()) return false;
  const Utf8Char c = utf8_decode(s, 0);
  return c.valid && is_word_char(c.cp);
}

// Start of the whitespace run that ends s (s.size() when there is none): \s*$.
size_t space_leftmost_at_end(std::string_view s) {
  size_t i = s.size();
  while (i > 0) {
    const Utf8Char c = last_char(s.substr(0, i));
    if (!c.valid || !is_white_space(c.cp)) break;
    i -= c.len;
  }
  return i;
}

// Length of the whitespace run that starts s: ^\s*.
size_t space_rightmost_at_start(std::string_view s) {
  size_t j = 0;
  while (j < s.size()) {
    const Utf8Char c = utf8_decode(s, j);
    if (!c.valid || !is_white_space(c.cp)) break;
    j += c.len;
  }
  return j;
}

}  // namespace

AddedVocabulary::AddedVocabulary(const ojson& added, const fs::path& file,
                                 std::string_view loader) {
  if (added.is_null()) return;
  DS_CHECK(added.is_array(), "[tokenizer] '{}': added_tokens must be an array", file.string());
  for (size_t k = 0; k < added.size(); ++k) {
    const ojson& a = added[k];
    const std::string field = fmt::format("added_tokens[{}]", k);
    check_keys(a, {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"},
               field, file, loader);
    DS_CHECK(a.contains("id") && a["id"].is_number_integer() && a["id"].get<int64_t>() >= 0 &&
                 a["id"].get<int64_t>() < INT32_MAX && a.contains("content") &&
                 a["content"].is_string() && !a["content"].get<std::string>().empty(),
             "[tokenizer] '{}': {} needs a non-negative integer 'id' and a non-empty 'content'",
             file.string(), field);
    auto flag = [&](const char* key, bool fallback) {
      if (!a.contains(key) || a[key].is_null()) return fallback;
      DS_CHECK(a[key].is_boolean(), "[tokenizer] '{}': {}.{} must be true or false", file.string(),
               field, key);
      return a[key].get<bool>();
    };
    AddedToken t;
    t.content = a["content"].get<std::string>();
    t.id = a["id"].get<int32_t>();
    t.special = flag("special", false);
    t.single_word = flag("single_word", false);
    t.lstrip = flag("lstrip", false);
    t.rstrip = flag("rstrip", false);
    t.normalized = flag("normalized", !t.special);
    tokens_.push_back(std::move(t));
  }
}

void AddedVocabulary::set_normalizer(
    const fs::path& file, const std::function<std::string(std::string_view)>& normalize) {
  for (auto& pass : by_first_)
    for (auto& list : pass) list.clear();
  has_[kRaw] = has_[kNormalized] = false;
  auto add = [&](size_t k) {
    const AddedToken& t = tokens_[k];
    Pattern p{t.normalized ? normalize(t.content) : t.content, k};
    DS_CHECK(!p.text.empty(),
             "[tokenizer] '{}': added token '{}' (normalized=true) is empty after the normalizer, "
             "so it would match everywhere; set its normalized to false",
             file.string(), t.content);
    const Pass pass = t.normalized ? kNormalized : kRaw;
    by_first_[pass][static_cast<uint8_t>(p.text[0])].push_back(std::move(p));
    has_[pass] = true;
  };
  // tokenizers builds its tries from the special tokens, then the others, each in file order.
  for (size_t k = 0; k < tokens_.size(); ++k)
    if (tokens_[k].special) add(k);
  for (size_t k = 0; k < tokens_.size(); ++k)
    if (!tokens_[k].special) add(k);
  for (auto& pass : by_first_)
    for (auto& list : pass)
      std::stable_sort(list.begin(), list.end(), [](const Pattern& a, const Pattern& b) {
        return a.text.size() > b.text.size();
      });
}

void AddedVocabulary::split(std::string_view text, Pass pass, std::vector<AddedSplit>& out) const {
  out.clear();
  if (text.empty()) return;
  if (!has_[pass]) {
    out.push_back({0, text.size(), nullptr});
    return;
  }
  const auto& by_first = by_first_[pass];
  size_t start_offset = 0;  // end of the last piece
  for (size_t i = 0; i < text.size();) {
    const Pattern* hit = nullptr;
    for (const Pattern& p : by_first[static_cast<uint8_t>(text[i])])
      if (text.substr(i).starts_with(p.text)) {
        hit = &p;
        break;
      }
    if (!hit) {
      ++i;
      continue;
    }
    size_t start = i, stop = i + hit->text.size();
    i = stop;  // the search goes on after the match, whatever the flags make of it
    const AddedToken& t = tokens_[hit->token];
    if (t.single_word &&
        (ends_with_word(text.substr(0, start)) || starts_with_word(text.substr(stop))))
      continue;
    // The previous match may have taken those spaces (rstrip) already.
    if (t.lstrip) start = std::max(space_leftmost_at_end(text.substr(0, start)), start_offset);
    if (t.rstrip) stop += space_rightmost_at_start(text.substr(stop));
    if (start_offset < start) out.push_back({start_offset, start, nullptr});
    out.push_back({start, stop, &t});
    start_offset = stop;
  }
  if (start_offset != text.size()) out.push_back({start_offset, text.size(), nullptr});
}

}  // namespace ds::data::detail

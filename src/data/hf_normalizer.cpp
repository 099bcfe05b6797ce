// tokenizer.json normalizers with offset alignment (hf_normalizer.h).
#include "hf_normalizer.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <optional>

#include <utf8proc.h>

#include "ds/core/error.h"
#include "ds/data/unicode.h"
#include "hf_json.h"

namespace ds::data::detail {

namespace fs = std::filesystem;
using ojson = nlohmann::json;

bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

NormalizedText NormalizedText::from(std::string_view text, uint32_t base) {
  NormalizedText t;
  t.text.assign(text);
  t.align.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const uint8_t len = utf8_decode(text, i).len;
    t.align.insert(
        t.align.end(), len,
        TokenSpan{base + static_cast<uint32_t>(i), base + static_cast<uint32_t>(i + len)});
    i += len;
  }
  return t;
}

namespace {

struct Char {
  size_t at;  // byte offset in the text
  uint8_t len;
  char32_t cp;
};

std::vector<Char> chars_of(std::string_view s) {
  std::vector<Char> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const Utf8Char u = utf8_decode(s, i);
    out.push_back({i, u.len, u.cp});
    i += u.len;
  }
  return out;
}

// Which input characters the output keeps the ranges of when it is shorter (m < n characters):
enum class Shrink {
  kDropHead,  // the last m (Replace)
  kDropTail,  // the first m (NFC and the other forms, Precompiled)
};

// Append `repl` in place of the input characters whose ranges are orig (n >= 1 of them), with
// `tokenizers`' alignment; characters added beyond n share the range of the last input character.
void emit(NormalizedText& out, const std::vector<TokenSpan>& orig, std::string_view repl,
          Shrink shrink) {
  const std::vector<Char> nc = chars_of(repl);
  const size_t n = orig.size(), m = nc.size();
  for (size_t k = 0; k < m; ++k) {
    size_t src;
    if (m >= n) {
      src = std::min(k, n - 1);
    } else if (shrink == Shrink::kDropTail) {
      src = k;
    } else {
      src = n - m + k;
    }
    out.push(repl.substr(nc[k].at, nc[k].len), orig[src]);
  }
}

std::vector<TokenSpan> spans_of(const NormalizedText& t, const std::vector<Char>& cs, size_t from,
                                size_t to) {
  std::vector<TokenSpan> s;
  for (size_t k = from; k < to; ++k) s.push_back(t.align[cs[k].at]);
  return s;
}

// ---- Unicode normalization forms ----------------------------------------------------------------

// utf8proc_map with options, or nullopt (*error: utf8proc's code) when it fails, e.g. on text that
// is not valid UTF-8.
std::optional<std::string> utf8proc_try(std::string_view text, int options,
                                        utf8proc_ssize_t* error = nullptr) {
  if (text.empty()) return std::string();
  utf8proc_uint8_t* out = nullptr;
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                              static_cast<utf8proc_ssize_t>(text.size()), &out,
                              static_cast<utf8proc_option_t>(UTF8PROC_STABLE | options));
  if (n < 0) {
    if (error) *error = n;
    return std::nullopt;
  }
  std::string result(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return result;
}

std::string utf8proc_form(std::string_view text, int options) {
  utf8proc_ssize_t error = 0;
  std::optional<std::string> s = utf8proc_try(text, options, &error);
  DS_CHECK(s.has_value(), "[tokenizer] Unicode normalization failed: {}", utf8proc_errmsg(error));
  return std::move(*s);
}

class UnicodeForm final : public NormalizerStep {
 public:
  explicit UnicodeForm(int options) : options_(options) {}
  void run(NormalizedText& t) const override {
    const std::string whole = utf8proc_form(t.text, options_);
    if (whole == t.text) return;
    // Alignment: normalize runs that start at a character of combining class 0 one by one. When
    // that differs from normalizing the whole text (compositions across such runs, e.g. Hangul
    // jamo), every output byte gets the range of the whole text: ids are exact, offsets coarse.
    const std::vector<Char> cs = chars_of(t.text);
    NormalizedText out;
    for (size_t k = 0; k < cs.size();) {
      size_t e = k + 1;
      while (e < cs.size() &&
             utf8proc_get_property(static_cast<utf8proc_int32_t>(cs[e].cp))->combining_class != 0)
        ++e;
      const size_t from = cs[k].at, to = e < cs.size() ? cs[e].at : t.text.size();
      const std::string part =
          utf8proc_form(std::string_view(t.text).substr(from, to - from), options_);
      emit(out, spans_of(t, cs, k, e), part, Shrink::kDropTail);
      k = e;
    }
    if (out.text != whole) {
      const TokenSpan all = t.span(0, t.text.size());
      out.text = whole;
      out.align.assign(whole.size(), all);
    }
    t = std::move(out);
  }

 private:
  int options_;
};

// ---- Lowercase, Strip, Prepend, Replace ---------------------------------------------------------

class Lowercase final : public NormalizerStep {
 public:
  void run(NormalizedText& t) const override {
    NormalizedText out;
    for (const Char& c : chars_of(t.text)) {
      std::string low;
      if (c.cp == 0x130) {  // Rust's full lowercase mapping: İ -> i + combining dot above
        low = "i\xCC\x87";
      } else {
        utf8_append(low,
                    static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c.cp))));
      }
      emit(out, {t.align[c.at]}, low, Shrink::kDropHead);
    }
    t = std::move(out);
  }
};

class Strip final : public NormalizerStep {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void run(NormalizedText& t) const override {
    const std::vector<Char> cs = chars_of(t.text);
    size_t b = 0, e = cs.size();
    if (left_)
      while (b < e && is_white_space(cs[b].cp)) ++b;
    if (right_)
      while (e > b && is_white_space(cs[e - 1].cp)) --e;
    const size_t from = b < cs.size() ? cs[b].at : t.text.size();
    const size_t to = e < cs.size() ? cs[e].at : t.text.size();
    t.text = t.text.substr(from, to - from);
    t.align = std::vector<TokenSpan>(t.align.begin() + from, t.align.begin() + to);
  }

 private:
  bool left_, right_;
};

class Prepend final : public NormalizerStep {
 public:
  explicit Prepend(std::string s) : s_(std::move(s)) {}
  void run(NormalizedText& t) const override {
    if (t.text.empty()) return;
    t.text.insert(0, s_);
    t.align.insert(t.align.begin(), s_.size(), t.align.front());
  }

 private:
  std::string s_;
};

// Replace every match with content. kind: a plain string, or DeBERTa-v2's \s{2,}|[\n\r\t] (with
// Oniguruma's \s, i.e. the White_Space characters).
class Replace final : public NormalizerStep {
 public:
  Replace(std::string pattern, bool deberta_regex, std::string content)
      : pattern_(std::move(pattern)), regex_(deberta_regex), content_(std::move(content)) {}
  void run(NormalizedText& t) const override {
    const std::vector<Char> cs = chars_of(t.text);
    NormalizedText out;
    for (size_t k = 0; k < cs.size();) {
      const size_t n = match_chars(t.text, cs, k);
      if (n == 0) {
        out.push(std::string_view(t.text).substr(cs[k].at, cs[k].len), t.align[cs[k].at]);
        ++k;
        continue;
      }
      if (content_.empty()) {
        k += n;
        continue;
      }
      emit(out, spans_of(t, cs, k, k + n), content_, Shrink::kDropHead);
      k += n;
    }
    t = std::move(out);
  }

 private:
  // Characters matched at cs[k], 0 for none.
  size_t match_chars(const std::string& s, const std::vector<Char>& cs, size_t k) const {
    if (regex_) {
      size_t e = k;
      while (e < cs.size() && classify_onig(cs[e].cp) == CharClass::kSpace) ++e;
      if (e - k >= 2) return e - k;
      const char32_t c = cs[k].cp;
      return c == '\n' || c == '\r' || c == '\t' ? 1 : 0;
    }
    if (pattern_.empty() || s.compare(cs[k].at, pattern_.size(), pattern_) != 0) return 0;
    size_t e = k, end = cs[k].at + pattern_.size();
    while (e < cs.size() && cs[e].at < end) ++e;
    return e - k;
  }

  std::string pattern_;
  bool regex_;
  std::string content_;
};

// ---- Precompiled (SentencePiece's charsmap) -----------------------------------------------------

std::string base64_decode(std::string_view in, const fs::path& file, const std::string& field) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  out.reserve(in.size() * 3 / 4);
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    if (c == '=') break;
    const int v = value(c);
    DS_CHECK(v >= 0, "[tokenizer] '{}': {}.precompiled_charsmap is not base64", file.string(),
             field);
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  return out;
}

class Precompiled final : public NormalizerStep {
 public:
  Precompiled(std::string_view blob, const fs::path& file, const std::string& field) {
    // [u32 trie size in bytes][trie: u32 units, little endian][normalized strings, NUL-ended]
    DS_CHECK(blob.size() >= 4, "[tokenizer] '{}': {}.precompiled_charsmap is truncated",
             file.string(), field);
    uint32_t trie_bytes = 0;
    for (int k = 0; k < 4; ++k)
      trie_bytes |= static_cast<uint32_t>(static_cast<uint8_t>(blob[k])) << (8 * k);
    DS_CHECK(trie_bytes % 4 == 0 && trie_bytes > 0 && 4 + size_t{trie_bytes} <= blob.size(),
             "[tokenizer] '{}': {}.precompiled_charsmap has a bad trie size {} (blob of {} bytes)",
             file.string(), field, trie_bytes, blob.size());
    units_.resize(trie_bytes / 4);
    for (size_t u = 0; u < units_.size(); ++u) {
      uint32_t v = 0;
      for (int k = 0; k < 4; ++k)
        v |= static_cast<uint32_t>(static_cast<uint8_t>(blob[4 + 4 * u + k])) << (8 * k);
      units_[u] = v;
    }
    normalized_.assign(blob.substr(4 + trie_bytes));
  }

  void run(NormalizedText& t) const override {
    const std::vector<Char> cs = chars_of(t.text);
    NormalizedText out;
    utf8proc_int32_t state = 0;
    for (size_t k = 0; k < cs.size();) {
      // The grapheme cluster starting at cs[k] (extended, as unicode-segmentation's).
      size_t e = k + 1;
      while (e < cs.size() &&
             !utf8proc_grapheme_break_stateful(static_cast<utf8proc_int32_t>(cs[e - 1].cp),
                                               static_cast<utf8proc_int32_t>(cs[e].cp), &state))
        ++e;
      state = 0;
      const size_t from = cs[k].at, to = e < cs.size() ? cs[e].at : t.text.size();
      const std::string_view g = std::string_view(t.text).substr(from, to - from);
      std::string_view norm;
      if (g.size() < 6 && transform(g, norm)) {
        emit(out, spans_of(t, cs, k, e), norm, Shrink::kDropTail);
      } else {
        for (size_t c = k; c < e; ++c) {
          const std::string_view part = std::string_view(t.text).substr(cs[c].at, cs[c].len);
          if (transform(part, norm)) {
            emit(out, {t.align[cs[c].at]}, norm, Shrink::kDropTail);
          } else {
            out.push(part, t.align[cs[c].at]);
          }
        }
      }
      k = e;
    }
    t = std::move(out);
  }

 private:
  // The replacement of the shortest key of the trie that prefixes chunk (as `tokenizers`' and
  // sentencepiece's Darts::DoubleArray common-prefix search gives it first). False when none.
  bool transform(std::string_view chunk, std::string_view& norm) const {
    auto offset = [](uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); };
    size_t pos = offset(units_[0]);
    for (char ch : chunk) {
      const auto c = static_cast<uint8_t>(ch);
      if (c == 0) break;
      pos ^= c;
      if (pos >= units_.size()) return false;
      const uint32_t unit = units_[pos];
      if ((unit & ((1u << 31) | 0xFF)) != c) return false;
      pos ^= offset(unit);
      if ((unit >> 8) & 1) {
        if (pos >= units_.size()) return false;
        const size_t at = units_[pos] & ((1u << 31) - 1);
        if (at > normalized_.size()) return false;
        const size_t end = normalized_.find('\0', at);
        norm = std::string_view(normalized_)
                   .substr(at, (end == std::string::npos ? normalized_.size() : end) - at);
        return true;
      }
    }
    return false;
  }

  std::vector<uint32_t> units_;
  std::string normalized_;
};

void parse_into(NormalizerChain& chain, const ojson& j, const std::string& field,
                const fs::path& file, std::string_view loader) {
  const std::string type = json_type(j);
  auto string_field = [&](const char* key) {
    DS_CHECK(j.contains(key) && j[key].is_string(), "[tokenizer] '{}': {}.{} must be a string",
             file.string(), field, key);
    return j[key].get<std::string>();
  };
  if (type == "Sequence") {
    for_each_in_sequence(
        j, "normalizers", field, file, loader,
        [&](const ojson& item, const std::string& f) { parse_into(chain, item, f, file, loader); });
  } else if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    check_keys(j, {"type"}, field, file, loader);
    int options = type[type.size() - 1] == 'C' ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE;
    if (type[2] == 'K') options |= UTF8PROC_COMPAT;
    chain.add(std::make_unique<UnicodeForm>(options));
  } else if (type == "Lowercase") {
    check_keys(j, {"type"}, field, file, loader);
    chain.add(std::make_unique<Lowercase>());
  } else if (type == "Strip") {
    check_keys(j, {"type", "strip_left", "strip_right"}, field, file, loader);
    auto flag = [&](const char* key) {
      DS_CHECK(j.contains(key) && j[key].is_boolean(),
               "[tokenizer] '{}': {}.{} must be true or false", file.string(), field, key);
      return j[key].get<bool>();
    };
    chain.add(std::make_unique<Strip>(flag("strip_left"), flag("strip_right")));
  } else if (type == "Prepend") {
    check_keys(j, {"type", "prepend"}, field, file, loader);
    chain.add(std::make_unique<Prepend>(string_field("prepend")));
  } else if (type == "Replace") {
    check_keys(j, {"type", "pattern", "content"}, field, file, loader);
    const ojson& p = j.value("pattern", ojson());
    DS_CHECK(p.is_object() && p.size() == 1 &&
                 ((p.contains("String") && p["String"].is_string()) ||
                  (p.contains("Regex") && p["Regex"].is_string())),
             "[tokenizer] '{}': {}.pattern must be {{\"String\": ...}} or {{\"Regex\": ...}}",
             file.string(), field);
    const std::string content = string_field("content");
    if (p.contains("String")) {
      chain.add(std::make_unique<Replace>(p["String"].get<std::string>(), false, content));
    } else {
      const std::string regex = p["Regex"];
      DS_CHECK(regex == R"(\s{2,}|[\n\r\t])",
               "[tokenizer] '{}': {}.pattern.Regex '{}' is not supported (the regex Replace "
               "normalizer implements DeBERTa-v2's \\s{{2,}}|[\\n\\r\\t] only)",
               file.string(), field, regex);
      chain.add(std::make_unique<Replace>(regex, true, content));
    }
  } else if (type == "Precompiled") {
    check_keys(j, {"type", "precompiled_charsmap"}, field, file, loader);
    const ojson& m = j.value("precompiled_charsmap", ojson());
    if (m.is_null()) return;  // `tokenizers` treats a missing charsmap as the identity
    DS_CHECK(m.is_string(), "[tokenizer] '{}': {}.precompiled_charsmap must be a base64 string",
             file.string(), field);
    const std::string blob = base64_decode(m.get<std::string>(), file, field);
    if (blob.empty()) return;
    chain.add(std::make_unique<Precompiled>(blob, file, field));
  } else {
    DS_THROW(
        "[tokenizer] '{}': {}.type '{}' is not supported by the {} loader (supported: none, "
        "Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Strip, Prepend, Replace, Precompiled)",
        file.string(), field, type, loader);
  }
}

}  // namespace

NormalizerChain parse_normalizer(const ojson& j, const std::string& field, const fs::path& file,
                                 std::string_view loader) {
  NormalizerChain chain;
  if (!j.is_null()) parse_into(chain, j, field, file, loader);
  return chain;
}

// ---- text-only normalizers ----------------------------------------------------------------------

namespace {

utf8proc_category_t category(char32_t cp) {
  return static_cast<utf8proc_category_t>(
      utf8proc_get_property(static_cast<utf8proc_int32_t>(cp))->category);
}

// BertNormalizer's is_control: Cc, Cf, Co, Cs except \t \n \r (which count as whitespace).
bool is_bert_control(char32_t c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  const auto cat = category(c);
  return cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF ||
         cat == UTF8PROC_CATEGORY_CO || cat == UTF8PROC_CATEGORY_CS;
}

// The CJK ideograph blocks BERT puts spaces around (not Hangul, Hiragana or Katakana).
bool is_chinese_char(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// BertNormalizer's steps in its order: clean, space CJK, NFD + drop Mn, lowercase. The Unicode
// classes come from libutf8proc; `tokenizers` takes them from Rust's std and the
// unicode_categories crate, so code points whose category changed between those Unicode versions
// may differ. Unassigned code points (Cn) are not "control" there, and stay.
std::string bert_normalize(const BertOptions& o, std::string_view text) {
  std::string s;
  s.reserve(text.size() + text.size() / 2);
  for (size_t i = 0; i < text.size();) {
    const Utf8Char u = utf8_decode(text, i);  // invalid bytes read as U+FFFD
    i += u.len;
    char32_t c = u.cp;
    if (o.clean_text) {
      if (c == 0 || c == 0xFFFD || is_bert_control(c)) continue;
      if (is_white_space(c)) c = ' ';
    }
    if (o.handle_chinese_chars && is_chinese_char(c)) {
      s.push_back(' ');
      utf8_append(s, c);
      s.push_back(' ');
    } else {
      utf8_append(s, c);
    }
  }
  if (!o.strip_accents && !o.lowercase) return s;
  if (o.strip_accents) s = utf8proc_form(s, UTF8PROC_DECOMPOSE);
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const Utf8Char u = utf8_decode(s, i);
    i += u.len;
    if (o.strip_accents && category(u.cp) == UTF8PROC_CATEGORY_MN) continue;
    if (!o.lowercase) {
      utf8_append(out, u.cp);
    } else if (u.cp == 0x130) {  // Rust's full lowercase mapping: İ -> i + combining dot above
      out += "i\xCC\x87";
    } else {
      utf8_append(out,
                  static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(u.cp))));
    }
  }
  return out;
}

BertOptions parse_bert(const ojson& j, const fs::path& file, std::string_view loader) {
  DS_CHECK(json_type(j) == "BertNormalizer",
           "[tokenizer] '{}': normalizer.type '{}' is not supported by the {} loader "
           "(supported: none, BertNormalizer)",
           file.string(), json_type(j), loader);
  check_keys(j, {"type", "clean_text", "handle_chinese_chars", "strip_accents", "lowercase"},
             "normalizer", file, loader);
  BertOptions o;
  o.clean_text = json_bool(j, "clean_text", true, "normalizer", file);
  o.handle_chinese_chars = json_bool(j, "handle_chinese_chars", true, "normalizer", file);
  o.lowercase = json_bool(j, "lowercase", true, "normalizer", file);
  // strip_accents: null follows lowercase (bert-base-uncased strips, cased models keep accents).
  o.strip_accents = json_bool(j, "strip_accents", o.lowercase, "normalizer", file);
  return o;
}

// NFC, or a Sequence of NFC.
void parse_nfc(const ojson& j, const std::string& field, const fs::path& file,
               std::string_view loader) {
  const std::string type = json_type(j);
  if (type == "Sequence") {
    for_each_in_sequence(
        j, "normalizers", field, file, loader,
        [&](const ojson& item, const std::string& f) { parse_nfc(item, f, file, loader); });
    return;
  }
  DS_CHECK(type == "NFC",
           "[tokenizer] '{}': {}.type '{}' is not supported by the {} loader (supported: none, "
           "NFC, a Sequence of NFC)",
           file.string(), field, type, loader);
}

}  // namespace

Normalizer::Normalizer(const ojson& j, Family family, const fs::path& file, std::string_view loader)
    : family_(family), none_(j.is_null()) {
  if (none_) return;
  switch (family) {
    case kChain:
      chain_ = parse_normalizer(j, "normalizer", file, loader);
      break;
    case kBert:
      bert_ = parse_bert(j, file, loader);
      break;
    case kNfc:
      parse_nfc(j, "normalizer", file, loader);
      break;
  }
}

std::string Normalizer::text(std::string_view s) const {
  if (none_) return std::string(s);
  switch (family_) {
    case kBert:
      return bert_normalize(bert_, s);
    case kNfc:
      return utf8proc_try(s, UTF8PROC_COMPOSE).value_or(std::string(s));  // HF sees valid UTF-8
    default:
      break;
  }
  NormalizedText t = NormalizedText::from(s, 0);
  chain_.run(t);
  return std::move(t.text);
}

NormalizedText Normalizer::run(std::string_view s, uint32_t input_base,
                               uint32_t output_base) const {
  if (family_ == kChain) {
    NormalizedText t = NormalizedText::from(s, input_base);
    chain_.run(t);
    return t;
  }
  NormalizedText t;
  t.text = text(s);
  t.align.resize(t.text.size());
  const uint32_t base = family_ == kNfc ? input_base : output_base;
  for (size_t i = 0; i < t.align.size(); ++i)
    t.align[i] = {base + static_cast<uint32_t>(i), base + static_cast<uint32_t>(i + 1)};
  return t;
}

}  // namespace ds::data::detail

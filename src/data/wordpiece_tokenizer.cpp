// WordPiece as Hugging Face `tokenizers` runs it for a BERT tokenizer.json:
// added tokens (added_tokens.h) -> BertNormalizer -> BertPreTokenizer -> WordPiece (greedy longest
// match, "##" continuations, [UNK] for a word that cannot be covered or is too long) ->
// TemplateProcessing / BertProcessing ([CLS] A [SEP], [CLS] A [SEP] B [SEP] with type ids 0/1).
// Decoding is the WordPiece decoder (prefix removal, " " between words, cleanup).
//
// The Unicode classes come from libutf8proc; `tokenizers` takes them from Rust's std (whitespace,
// lowercase) and the unicode_categories crate (control, punctuation, nonspacing marks), so code
// points whose category changed between those Unicode versions may differ. Unassigned code points
// (Cn) are not "control" there, and stay.
#include <algorithm>
#include <array>
#include <climits>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <unordered_map>
#include <vector>

#include <utf8proc.h>

#include "added_tokens.h"
#include "ds/core/error.h"
#include "ds/data/unicode.h"
#include "hf_template.h"
#include "hf_tokenizer_internal.h"

namespace ds::data::detail {

namespace fs = std::filesystem;
using ojson = nlohmann::json;

namespace {

std::string type_of(const ojson& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>()
                                                                      : std::string("?");
}

// Every key of object j must be in allowed: an option we do not know is an error, never ignored.
void check_keys(const ojson& j, std::initializer_list<std::string_view> allowed,
                const std::string& field, const fs::path& file) {
  DS_CHECK(j.is_object(), "[tokenizer] '{}': {} must be an object", file.string(), field);
  for (const auto& [key, value] : j.items())
    DS_CHECK(std::find(allowed.begin(), allowed.end(), key) != allowed.end(),
             "[tokenizer] '{}': {}.{} is not supported by the WordPiece loader (supported keys: "
             "{}); remove it or convert the tokenizer",
             file.string(), field, key, fmt::join(allowed, ", "));
}

bool get_bool(const ojson& j, const char* key, bool fallback, const std::string& field,
              const fs::path& file) {
  if (!j.contains(key)) return fallback;
  DS_CHECK(j[key].is_boolean(), "[tokenizer] '{}': {}.{} must be true or false", file.string(),
           field, key);
  return j[key].get<bool>();
}

// ---- Unicode classes as `tokenizers` uses them
// ---------------------------------------------------

utf8proc_category_t category(char32_t cp) {
  return static_cast<utf8proc_category_t>(
      utf8proc_get_property(static_cast<utf8proc_int32_t>(cp))->category);
}

// Rust's char::is_whitespace (the White_Space property).
bool is_rust_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
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

// BertPreTokenizer's punctuation: ASCII punctuation (which includes $ + < = > ^ ` | ~) or P*.
bool is_bert_punctuation(char32_t c) {
  if (c < 0x80)
    return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
           (c >= 0x7B && c <= 0x7E);
  switch (category(c)) {
    case UTF8PROC_CATEGORY_PC:
    case UTF8PROC_CATEGORY_PD:
    case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI:
    case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO:
      return true;
    default:
      return false;
  }
}

std::string nfd(std::string_view text) {
  utf8proc_uint8_t* out = nullptr;
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                              static_cast<utf8proc_ssize_t>(text.size()), &out,
                              static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE));
  DS_CHECK(n >= 0, "[tokenizer] NFD failed: {}", utf8proc_errmsg(n));
  std::string result(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return result;
}

struct BertNormalizer {
  bool enabled = false;
  bool clean_text = true, handle_chinese_chars = true, strip_accents = true, lowercase = true;

  // The steps in BertNormalizer's order: clean, space CJK, NFD + drop Mn, lowercase.
  std::string run(std::string_view text) const {
    if (!enabled) return std::string(text);
    std::string s;
    s.reserve(text.size() + text.size() / 2);
    for (size_t i = 0; i < text.size();) {
      const Utf8Char u = utf8_decode(text, i);  // invalid bytes read as U+FFFD
      i += u.len;
      char32_t c = u.cp;
      if (clean_text) {
        if (c == 0 || c == 0xFFFD || is_bert_control(c)) continue;
        if (is_rust_whitespace(c)) c = ' ';
      }
      if (handle_chinese_chars && is_chinese_char(c)) {
        s.push_back(' ');
        utf8_append(s, c);
        s.push_back(' ');
      } else {
        utf8_append(s, c);
      }
    }
    if (!strip_accents && !lowercase) return s;
    if (strip_accents) s = nfd(s);
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
      const Utf8Char u = utf8_decode(s, i);
      i += u.len;
      if (strip_accents && category(u.cp) == UTF8PROC_CATEGORY_MN) continue;
      if (!lowercase) {
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
};

class WordPieceTokenizer final : public TextTokenizer {
 public:
  std::string_view kind() const override { return "wordpiece"; }
  void encode(std::string_view text, bool add_special_tokens, std::vector<int32_t>& ids,
              std::vector<TokenSpan>* spans) const override;
  PairEncoding encode_pair(std::string_view a, std::string_view b,
                           bool add_special_tokens) const override;
  PairEncoding post_process(std::span<const int32_t> a,
                            const std::span<const int32_t>* b) const override;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(tokens_.size()); }
  int32_t token_to_id(std::string_view token) const override {
    auto it = by_token_.find(std::string(token));
    return it == by_token_.end() ? -1 : it->second;
  }
  std::string id_to_token(int32_t id) const override { return tokens_.at(checked(id)); }
  bool is_special(int32_t id) const override { return special_.at(checked(id)) != 0; }
  std::string normalize(std::string_view text) const override;
  void save_model_files(const fs::path& dir) const override;

  void load(const ojson& j, std::string json_text, const TokenizerConfig& config,
            const fs::path& file);

 private:
  int32_t checked(int32_t id) const {
    DS_CHECK(id >= 0 && id < vocab_size() && !tokens_[id].empty(),
             "[tokenizer] token id {} is not in the vocabulary (size {})", id, vocab_size());
    return id;
  }
  void set_vocab(const ojson& model, const ojson& added, const fs::path& file);
  void set_normalizer(const ojson& j, const fs::path& file);
  void set_post_processor(const ojson& j, const fs::path& file);
  void set_decoder(const ojson& j, const fs::path& file);

  // Calls on_text(piece) for the normalized text between added tokens and on_added(token, match)
  // for each added token (match: the text it matched, normalized for normalized=true tokens), left
  // to right; the pieces and matches in order spell normalize(text).
  template <class OnText, class OnAdded>
  void split_added(std::string_view text, OnText&& on_text, OnAdded&& on_added) const;
  // Tokens of one sequence (no template); spans are offsets into normalize(text) plus base.
  void encode_sequence(std::string_view text, std::vector<int32_t>& ids,
                       std::vector<TokenSpan>* spans) const;
  void wordpiece(std::string_view word, uint32_t begin, std::vector<int32_t>& ids,
                 std::vector<TokenSpan>* spans) const;

  std::vector<std::string> tokens_;  // id -> token as the vocabulary spells it
  std::vector<uint8_t> special_;     // id -> special added token
  std::vector<uint8_t> in_model_;    // id -> listed in model.vocab (written to vocab.txt)
  std::unordered_map<std::string, int32_t> by_token_;
  std::unordered_map<std::string, int32_t> model_vocab_;  // what WordPiece matches against
  AddedVocabulary added_;
  BertNormalizer normalizer_;
  bool bert_pre_tokenizer_ = false;
  std::string prefix_ = "##";
  int32_t unk_id_ = -1;
  size_t max_input_chars_per_word_ = 100;
  PairTemplate template_;  // empty: no post-processor
  bool has_decoder_ = false;
  std::string decoder_prefix_ = "##";
  bool decoder_cleanup_ = true;
  std::string json_text_;
};

// ---- loading ------------------------------------------------------------------------------------

void WordPieceTokenizer::set_vocab(const ojson& model, const ojson& added, const fs::path& file) {
  check_keys(
      model,
      {"type", "unk_token", "continuing_subword_prefix", "max_input_chars_per_word", "vocab"},
      "model", file);
  const ojson& vocab = model.value("vocab", ojson());
  DS_CHECK(vocab.is_object() && !vocab.empty(),
           "[tokenizer] '{}': model.vocab must be a non-empty object token -> id", file.string());
  DS_CHECK(model.contains("unk_token") && model["unk_token"].is_string(),
           "[tokenizer] '{}': model.unk_token must be a string", file.string());
  if (model.contains("continuing_subword_prefix")) {
    DS_CHECK(model["continuing_subword_prefix"].is_string(),
             "[tokenizer] '{}': model.continuing_subword_prefix must be a string", file.string());
    prefix_ = model["continuing_subword_prefix"].get<std::string>();
  }
  if (model.contains("max_input_chars_per_word")) {
    const ojson& m = model["max_input_chars_per_word"];
    DS_CHECK(m.is_number_unsigned(),
             "[tokenizer] '{}': model.max_input_chars_per_word must be a non-negative integer",
             file.string());
    max_input_chars_per_word_ = m.get<size_t>();
  }
  int64_t max_id = -1;
  for (const auto& [tok, id] : vocab.items()) {
    DS_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < INT32_MAX,
             "[tokenizer] '{}': model.vocab['{}'] is not a non-negative 32-bit id", file.string(),
             tok);
    max_id = std::max(max_id, id.get<int64_t>());
  }
  added_ = AddedVocabulary(added, file, "WordPiece");
  for (const AddedToken& a : added_.tokens()) max_id = std::max(max_id, static_cast<int64_t>(a.id));
  const size_t n = static_cast<size_t>(max_id + 1);
  tokens_.assign(n, {});
  special_.assign(n, 0);
  in_model_.assign(n, 0);
  for (const auto& [tok, idj] : vocab.items()) {
    const auto id = idj.get<int32_t>();
    DS_CHECK(tokens_[id].empty() && !tok.empty(),
             "[tokenizer] '{}': model.vocab gives id {} to both '{}' and '{}' (or to an empty "
             "token)",
             file.string(), id, tokens_[id], tok);
    tokens_[id] = tok;
    in_model_[id] = 1;
    by_token_[tok] = id;
    model_vocab_[tok] = id;
  }
  for (const AddedToken& a : added_.tokens()) {
    DS_CHECK(tokens_[a.id].empty() || tokens_[a.id] == a.content,
             "[tokenizer] '{}': added token '{}' has id {}, which model.vocab gives to '{}'",
             file.string(), a.content, a.id, tokens_[a.id]);
    tokens_[a.id] = a.content;
    by_token_[a.content] = a.id;
    special_[a.id] = a.special ? 1 : 0;
  }
  const std::string unk = model["unk_token"];
  auto it = model_vocab_.find(unk);
  DS_CHECK(it != model_vocab_.end(),
           "[tokenizer] '{}': model.unk_token '{}' is not in model.vocab; WordPiece needs it for "
           "words it cannot split",
           file.string(), unk);
  unk_id_ = it->second;
}

void WordPieceTokenizer::set_normalizer(const ojson& j, const fs::path& file) {
  if (j.is_null()) return;
  DS_CHECK(type_of(j) == "BertNormalizer",
           "[tokenizer] '{}': normalizer.type '{}' is not supported by the WordPiece loader "
           "(supported: none, BertNormalizer)",
           file.string(), type_of(j));
  check_keys(j, {"type", "clean_text", "handle_chinese_chars", "strip_accents", "lowercase"},
             "normalizer", file);
  normalizer_.enabled = true;
  normalizer_.clean_text = get_bool(j, "clean_text", true, "normalizer", file);
  normalizer_.handle_chinese_chars = get_bool(j, "handle_chinese_chars", true, "normalizer", file);
  normalizer_.lowercase = get_bool(j, "lowercase", true, "normalizer", file);
  // strip_accents: null follows lowercase (bert-base-uncased strips, cased models keep accents).
  normalizer_.strip_accents = j.contains("strip_accents") && !j["strip_accents"].is_null()
                                  ? get_bool(j, "strip_accents", false, "normalizer", file)
                                  : normalizer_.lowercase;
}

void WordPieceTokenizer::set_post_processor(const ojson& j, const fs::path& file) {
  template_ = parse_post_processor(j, vocab_size(), file, "WordPiece");
}

void WordPieceTokenizer::set_decoder(const ojson& j, const fs::path& file) {
  if (j.is_null()) return;
  DS_CHECK(type_of(j) == "WordPiece",
           "[tokenizer] '{}': decoder.type '{}' is not supported by the WordPiece loader "
           "(supported: none, WordPiece)",
           file.string(), type_of(j));
  check_keys(j, {"type", "prefix", "cleanup"}, "decoder", file);
  has_decoder_ = true;
  if (j.contains("prefix")) {
    DS_CHECK(j["prefix"].is_string(), "[tokenizer] '{}': decoder.prefix must be a string",
             file.string());
    decoder_prefix_ = j["prefix"].get<std::string>();
  }
  decoder_cleanup_ = get_bool(j, "cleanup", true, "decoder", file);
}

void WordPieceTokenizer::load(const ojson& j, std::string json_text, const TokenizerConfig& config,
                              const fs::path& file) {
  check_keys(j,
             {"version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer",
              "model", "post_processor", "decoder"},
             "(top level)", file);
  for (const char* key : {"truncation", "padding"})
    DS_CHECK(!j.contains(key) || j[key].is_null(),
             "[tokenizer] '{}': {} is set; truncation and padding belong to the data pipeline "
             "here, set {} to null",
             file.string(), key, key);
  set_vocab(j["model"], j.value("added_tokens", ojson::array()), file);
  set_normalizer(j.value("normalizer", ojson()), file);
  added_.set_normalizer(file, [this](std::string_view s) { return normalizer_.run(s); });
  const ojson& pre = j.value("pre_tokenizer", ojson());
  DS_CHECK(type_of(pre) == "BertPreTokenizer",
           "[tokenizer] '{}': pre_tokenizer.type '{}' is not supported by the WordPiece loader "
           "(supported: BertPreTokenizer)",
           file.string(), pre.is_null() ? std::string("null") : type_of(pre));
  check_keys(pre, {"type"}, "pre_tokenizer", file);
  bert_pre_tokenizer_ = true;
  set_post_processor(j.value("post_processor", ojson()), file);
  set_decoder(j.value("decoder", ojson()), file);
  config_ = config;
  resolve_special_ids(*this, config_, file);
  json_text_ = std::move(json_text);
}

// ---- encoding -----------------------------------------------------------------------------------

template <class OnText, class OnAdded>
void WordPieceTokenizer::split_added(std::string_view text, OnText&& on_text,
                                     OnAdded&& on_added) const {
  std::vector<AddedSplit> raw, norm;
  added_.split(text, AddedVocabulary::kRaw, raw);
  for (const AddedSplit& p : raw) {
    if (p.token) {
      on_added(*p.token, text.substr(p.begin, p.end - p.begin));
      continue;
    }
    const std::string n = normalizer_.run(text.substr(p.begin, p.end - p.begin));
    added_.split(n, AddedVocabulary::kNormalized, norm);
    for (const AddedSplit& q : norm) {
      const std::string_view piece = std::string_view(n).substr(q.begin, q.end - q.begin);
      if (q.token) {
        on_added(*q.token, piece);
      } else {
        on_text(piece);
      }
    }
  }
}

std::string WordPieceTokenizer::normalize(std::string_view text) const {
  std::string out;
  split_added(
      text, [&](std::string_view piece) { out += piece; },
      [&](const AddedToken&, std::string_view match) { out += match; });
  return out;
}

void WordPieceTokenizer::wordpiece(std::string_view word, uint32_t begin, std::vector<int32_t>& ids,
                                   std::vector<TokenSpan>* spans) const {
  const auto whole = TokenSpan{begin, begin + static_cast<uint32_t>(word.size())};
  size_t chars = 0;
  for (size_t i = 0; i < word.size(); i += utf8_decode(word, i).len) ++chars;
  const size_t first = ids.size(), first_span = spans ? spans->size() : 0;
  bool bad = chars > max_input_chars_per_word_;
  // Greedy longest match from the left; a continuation is looked up with the prefix. Shrinking by
  // whole UTF-8 characters keeps every candidate valid text.
  std::string candidate;
  for (size_t start = 0; !bad && start < word.size();) {
    size_t end = word.size();
    int32_t found = -1;
    while (start < end) {
      candidate.assign(start > 0 ? prefix_ : std::string());
      candidate.append(word.substr(start, end - start));
      if (auto it = model_vocab_.find(candidate); it != model_vocab_.end()) {
        found = it->second;
        break;
      }
      do --end;
      while (end > start && (static_cast<uint8_t>(word[end]) & 0xC0) == 0x80);
    }
    if (found < 0) {
      bad = true;
      break;
    }
    ids.push_back(found);
    if (spans)
      spans->push_back({begin + static_cast<uint32_t>(start), begin + static_cast<uint32_t>(end)});
    start = end;
  }
  if (bad) {  // the whole word is [UNK]
    ids.resize(first);
    ids.push_back(unk_id_);
    if (spans) {
      spans->resize(first_span);
      spans->push_back(whole);
    }
  }
}

void WordPieceTokenizer::encode_sequence(std::string_view text, std::vector<int32_t>& ids,
                                         std::vector<TokenSpan>* spans) const {
  DS_CHECK(text.size() < UINT32_MAX / 4,
           "[tokenizer] text of {} bytes is too long to encode at once", text.size());
  uint32_t pos = 0;  // offset in normalize(text)
  auto on_text = [&](std::string_view norm) {
    // BertPreTokenizer: whitespace separates words and is dropped; punctuation is a word alone.
    size_t word_begin = 0;
    auto flush = [&](size_t end) {
      if (end > word_begin)
        wordpiece(norm.substr(word_begin, end - word_begin),
                  pos + static_cast<uint32_t>(word_begin), ids, spans);
    };
    for (size_t i = 0; i < norm.size();) {
      const Utf8Char u = utf8_decode(norm, i);
      if (is_rust_whitespace(u.cp)) {
        flush(i);
        word_begin = i + u.len;
      } else if (is_bert_punctuation(u.cp)) {
        flush(i);
        wordpiece(norm.substr(i, u.len), pos + static_cast<uint32_t>(i), ids, spans);
        word_begin = i + u.len;
      }
      i += u.len;
    }
    flush(norm.size());
    pos += static_cast<uint32_t>(norm.size());
  };
  auto on_added = [&](const AddedToken& a, std::string_view match) {
    ids.push_back(a.id);
    if (spans) spans->push_back({pos, pos + static_cast<uint32_t>(match.size())});
    pos += static_cast<uint32_t>(match.size());
  };
  split_added(text, on_text, on_added);
}

void WordPieceTokenizer::encode(std::string_view text, bool add_special_tokens,
                                std::vector<int32_t>& ids, std::vector<TokenSpan>* spans) const {
  auto sequence = [&](std::vector<int32_t>& out, std::vector<TokenSpan>* sp) {
    encode_sequence(text, out, sp);
  };
  if (!add_special_tokens)
    sequence(ids, spans);
  else
    template_.encode_single(sequence, ids, spans);
}

PairEncoding WordPieceTokenizer::encode_pair(std::string_view a, std::string_view b,
                                             bool add_special_tokens) const {
  std::vector<int32_t> ids_a, ids_b;
  encode_sequence(a, ids_a, nullptr);
  encode_sequence(b, ids_b, nullptr);
  if (!add_special_tokens) {  // as `tokenizers`: A with type 0, B with type 1
    PairEncoding out;
    out.ids = ids_a;
    out.ids.insert(out.ids.end(), ids_b.begin(), ids_b.end());
    out.type_ids.assign(ids_a.size(), 0);
    out.type_ids.insert(out.type_ids.end(), ids_b.size(), 1);
    return out;
  }
  const std::span<const int32_t> sb(ids_b);
  return post_process(ids_a, &sb);
}

PairEncoding WordPieceTokenizer::post_process(std::span<const int32_t> a,
                                              const std::span<const int32_t>* b) const {
  return template_.apply(a, b);
}

// ---- decoding -----------------------------------------------------------------------------------

namespace {

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
}

// The WordPiece decoder's cleanup, applied to each token in this order.
void cleanup(std::string& s) {
  static constexpr std::pair<std::string_view, std::string_view> kRules[] = {
      {" .", "."},   {" ?", "?"},     {" !", "!"},    {" ,", ","},
      {" ' ", "'"},  {" n't", "n't"}, {" 'm", "'m"},  {" do not", " don't"},
      {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (auto [from, to] : kRules) replace_all(s, from, to);
}

}  // namespace

std::string WordPieceTokenizer::decode(std::span<const int32_t> ids,
                                       bool skip_special_tokens) const {
  std::string out;
  size_t n = 0;  // tokens kept so far
  for (int32_t id : ids) {
    checked(id);
    if (skip_special_tokens && special_[id]) continue;
    const std::string& tok = tokens_[id];
    if (!has_decoder_) {  // `tokenizers` joins the tokens with spaces
      if (n++ > 0) out += ' ';
      out += tok;
      continue;
    }
    std::string piece;
    if (n++ == 0) {
      piece = tok;
    } else if (tok.starts_with(decoder_prefix_)) {
      piece = tok.substr(decoder_prefix_.size());
    } else {
      piece = " " + tok;
    }
    if (decoder_cleanup_) cleanup(piece);
    out += piece;
  }
  return out;
}

// ---- saving -------------------------------------------------------------------------------------

void WordPieceTokenizer::save_model_files(const fs::path& dir) const {
  write_text_file(dir / "tokenizer.json", json_text_);
  // vocab.txt (one token per line, line = id) for BertTokenizer and tools that predate
  // tokenizer.json; ids not in model.vocab are added tokens, kept in tokenizer.json.
  std::string vocab;
  for (size_t id = 0; id < tokens_.size(); ++id) {
    if (!in_model_[id]) break;  // vocab.txt cannot express a gap
    vocab += tokens_[id] + "\n";
  }
  write_text_file(dir / "vocab.txt", vocab);
}

}  // namespace

std::unique_ptr<TextTokenizer> load_wordpiece_tokenizer_json(const fs::path& file,
                                                             std::string json_text, const ojson& j,
                                                             const TokenizerConfig& config) {
  auto tok = std::make_unique<WordPieceTokenizer>();
  tok->load(j, std::move(json_text), config, file);
  return tok;
}

}  // namespace ds::data::detail

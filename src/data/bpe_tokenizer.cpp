// Byte-level BPE as Hugging Face `tokenizers` runs it for tokenizer.json (GPT-2, Llama-3, Qwen2):
// added tokens (added_tokens.h) -> normalizer (none or NFC) -> pre-tokenizer (ByteLevel / Split /
// Sequence) -> BPE (with ignore_merges) -> post-processor (ByteLevel / TemplateProcessing /
// Sequence).
#include <algorithm>
#include <array>
#include <climits>
#include <cstdlib>
#include <functional>
#include <unordered_map>

#include <utf8proc.h>

#include "added_tokens.h"
#include "ds/core/error.h"
#include "ds/data/unicode.h"
#include "hf_tokenizer_internal.h"
#include "merges_text.h"
#include "pretokenize.h"

namespace ds::data::detail {

namespace fs = std::filesystem;
// nlohmann::json, not ordered_json: the latter looks keys up linearly, quadratic for a 128k vocab.
using ojson = nlohmann::json;

namespace {

// GPT-2's bytes_to_unicode(): printable bytes map to themselves, the other 68 to U+0100.. in order.
// Byte-level vocabularies spell token bytes through this table.
const std::array<char32_t, 256>& byte_to_char() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    std::array<bool, 256> printable{};
    for (int b = '!'; b <= '~'; ++b) printable[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) t[b] = printable[b] ? static_cast<char32_t>(b) : next++;
    return t;
  }();
  return table;
}

// Raw bytes of a byte-level spelling, or false when a character is outside the alphabet.
bool spelled_to_bytes(std::string_view spelled, std::string& raw) {
  static const std::array<int, 324> char_to_byte = [] {
    std::array<int, 324> t;  // the table's image lies below U+0144
    t.fill(-1);
    for (int b = 0; b < 256; ++b) t[byte_to_char()[b]] = b;
    return t;
  }();
  raw.clear();
  for (size_t i = 0; i < spelled.size();) {
    const Utf8Char c = utf8_decode(spelled, i);
    if (!c.valid || c.cp >= char_to_byte.size() || char_to_byte[c.cp] < 0) return false;
    raw.push_back(static_cast<char>(char_to_byte[c.cp]));
    i += c.len;
  }
  return true;
}

std::string bytes_to_spelled(std::string_view raw) {
  std::string out;
  for (char b : raw) utf8_append(out, byte_to_char()[static_cast<uint8_t>(b)]);
  return out;
}

// NFC of valid UTF-8 text; other text is returned unchanged (HF only ever sees valid UTF-8).
std::string nfc(std::string_view text) {
  utf8proc_uint8_t* out = nullptr;
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                              static_cast<utf8proc_ssize_t>(text.size()), &out,
                              static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) return std::string(text);
  std::string result(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return result;
}

std::string type_of(const ojson& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>()
                                                                      : std::string("?");
}

class BpeTokenizer final : public TextTokenizer {
 public:
  std::string_view kind() const override { return "bpe"; }
  void encode(std::string_view text, bool add_special_tokens, std::vector<int32_t>& ids,
              std::vector<TokenSpan>* spans) const override;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const override;
  PairEncoding encode_pair(std::string_view a, std::string_view b,
                           bool add_special_tokens) const override;
  PairEncoding post_process(std::span<const int32_t> a,
                            const std::span<const int32_t>* b) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(tokens_.size()); }
  int32_t token_to_id(std::string_view token) const override {
    auto it = by_spelling_.find(std::string(token));
    return it == by_spelling_.end() ? -1 : it->second;
  }
  std::string id_to_token(int32_t id) const override { return spelled_.at(checked(id)); }
  bool is_special(int32_t id) const override { return special_.at(checked(id)) != 0; }
  std::string normalize(std::string_view text) const override {
    return nfc_ ? nfc(text) : std::string(text);
  }
  void save_model_files(const fs::path& dir) const override;

  // Builders (the loaders below).
  void set_vocab(const ojson& vocab, const ojson& added, const fs::path& file);
  void set_merges(const ojson& merges, const fs::path& file);
  void set_normalizer(const ojson& j, const fs::path& file);
  void set_pre_tokenizer(const ojson& j, const std::string& field, const fs::path& file);
  void set_post_processor(const ojson& j, const std::string& field, const fs::path& file);
  // json_text: the tokenizer.json save_model_files writes (the original file's bytes when loaded
  // from one).
  void finish(const TokenizerConfig& config, std::string json_text, const fs::path& file);

  bool ignore_merges_ = false;

 private:
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  int32_t checked(int32_t id) const {
    DS_CHECK(id >= 0 && id < vocab_size() && !tokens_[id].empty(),
             "[tokenizer] token id {} is not in the vocabulary (size {})", id, vocab_size());
    return id;
  }
  void encode_segment(std::string_view seg, uint32_t seg_begin, std::vector<int32_t>& ids,
                      std::vector<TokenSpan>* spans) const;
  void bpe(std::string_view word, std::vector<int32_t>& out) const;

  std::vector<std::string> tokens_;   // id -> raw bytes (added tokens: their content)
  std::vector<std::string> spelled_;  // id -> the vocabulary's spelling
  std::vector<uint8_t> special_;      // id -> special added token
  std::vector<uint8_t> in_model_;     // id -> listed in model.vocab (written to vocab.json)
  std::unordered_map<std::string, int32_t> by_spelling_;
  std::unordered_map<std::string, int32_t> by_bytes_;  // raw bytes -> id, model vocab only
  int32_t byte_token_[256] = {};
  std::unordered_map<uint64_t, Merge> merges_;
  std::vector<std::pair<int32_t, int32_t>> merge_list_;  // by rank
  AddedVocabulary added_;
  bool nfc_ = false;
  bool add_prefix_space_ = false;
  bool byte_level_ = false;
  std::vector<SplitPattern> splits_;
  std::vector<int32_t> prefix_ids_, suffix_ids_;  // added by encode(..., true)
  // RobertaProcessing: pairs are <s> A </s></s> B </s>, every type id 0 (tokenizers' roberta.rs).
  bool roberta_pair_ = false;
  std::string json_text_;  // the tokenizer.json save_model_files writes
};

// ---- loading ------------------------------------------------------------------------------------

void BpeTokenizer::set_vocab(const ojson& vocab, const ojson& added, const fs::path& file) {
  DS_CHECK(vocab.is_object() && !vocab.empty(),
           "[tokenizer] '{}': model.vocab must be a non-empty object token -> id", file.string());
  added_ = AddedVocabulary(added, file, "BPE");
  std::unordered_map<std::string, const AddedToken*> added_by_content;
  int64_t max_id = -1;
  for (const auto& [tok, id] : vocab.items()) {
    DS_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0,
             "[tokenizer] '{}': model.vocab['{}'] is not a non-negative integer id", file.string(),
             tok);
    max_id = std::max(max_id, id.get<int64_t>());
  }
  for (const AddedToken& a : added_.tokens()) {
    added_by_content[a.content] = &a;
    max_id = std::max(max_id, static_cast<int64_t>(a.id));
  }
  DS_CHECK(max_id < INT32_MAX, "[tokenizer] '{}': token id {} is too large", file.string(), max_id);
  const size_t n = static_cast<size_t>(max_id + 1);
  tokens_.assign(n, {});
  spelled_.assign(n, {});
  special_.assign(n, 0);
  in_model_.assign(n, 0);
  std::string raw;
  for (const auto& [tok, idj] : vocab.items()) {
    const auto id = idj.get<int32_t>();
    DS_CHECK(spelled_[id].empty(),
             "[tokenizer] '{}': model.vocab gives id {} to both '{}' and '{}'", file.string(), id,
             spelled_[id], tok);
    spelled_[id] = tok;
    in_model_[id] = 1;
    by_spelling_[tok] = id;
    if (added_by_content.count(tok)) {
      tokens_[id] = tok;
      continue;
    }
    DS_CHECK(spelled_to_bytes(tok, raw),
             "[tokenizer] '{}': model.vocab token '{}' has characters outside the byte-level "
             "alphabet; only byte-level BPE (GPT-2 style) vocabularies are supported",
             file.string(), tok);
    tokens_[id] = raw;
    by_bytes_.emplace(raw, id);
  }
  for (const auto& [content, a] : added_by_content) {
    const int32_t id = a->id;
    DS_CHECK(spelled_[id].empty() || spelled_[id] == content,
             "[tokenizer] '{}': added token '{}' has id {}, which model.vocab gives to '{}'",
             file.string(), content, id, spelled_[id]);
    spelled_[id] = content;
    tokens_[id] = content;
    by_spelling_[content] = id;
    special_[id] = a->special ? 1 : 0;
  }
  for (int b = 0; b < 256; ++b) {
    auto it = by_bytes_.find(std::string(1, static_cast<char>(b)));
    DS_CHECK(it != by_bytes_.end(),
             "[tokenizer] '{}': model.vocab lacks the one-byte token '{}' (byte {}); a byte-level "
             "BPE needs all 256",
             file.string(), bytes_to_spelled(std::string(1, static_cast<char>(b))), b);
    byte_token_[b] = it->second;
  }
}

void BpeTokenizer::set_merges(const ojson& merges, const fs::path& file) {
  DS_CHECK(merges.is_array(), "[tokenizer] '{}': model.merges must be an array", file.string());
  int32_t rank = 0;
  for (const auto& m : merges) {
    std::string a, b;
    if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0], b = m[1];
    } else if (m.is_string()) {  // legacy "a b"
      const std::string s = m;
      const size_t sp = s.find(' ');
      DS_CHECK(sp != std::string::npos && sp > 0 && s.find(' ', sp + 1) == std::string::npos,
               "[tokenizer] '{}': merge {} '{}' is not two tokens separated by one space",
               file.string(), rank, s);
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else {
      DS_THROW("[tokenizer] '{}': merge {} is neither [\"a\", \"b\"] nor \"a b\": {}",
               file.string(), rank, m.dump());
    }
    const int32_t ia = token_to_id(a), ib = token_to_id(b), iab = token_to_id(a + b);
    DS_CHECK(ia >= 0 && ib >= 0 && iab >= 0,
             "[tokenizer] '{}': merge {} ('{}', '{}') uses or makes a token missing from the "
             "vocabulary",
             file.string(), rank, a, b);
    // First occurrence wins, as in HF's BPE builder.
    if (merges_.emplace(pair_key(ia, ib), Merge{rank, iab}).second)
      merge_list_.emplace_back(ia, ib);
    ++rank;
  }
}

void BpeTokenizer::set_normalizer(const ojson& j, const fs::path& file) {
  if (j.is_null()) return;
  const std::string type = type_of(j);
  if (type == "NFC") {
    nfc_ = true;
  } else if (type == "Sequence" && j.contains("normalizers") && j["normalizers"].is_array()) {
    for (const auto& n : j["normalizers"]) set_normalizer(n, file);
  } else {
    DS_THROW(
        "[tokenizer] '{}': normalizer.type '{}' is not supported (supported: none, NFC, a "
        "Sequence of NFC)",
        file.string(), type);
  }
}

void BpeTokenizer::set_pre_tokenizer(const ojson& j, const std::string& field,
                                     const fs::path& file) {
  const std::string type = type_of(j);
  if (type == "ByteLevel") {
    const bool add_prefix = j.value("add_prefix_space", false);
    DS_CHECK(!add_prefix || splits_.empty(),
             "[tokenizer] '{}': {} is ByteLevel with add_prefix_space=true after a Split; not "
             "supported",
             file.string(), field);
    add_prefix_space_ = add_prefix_space_ || add_prefix;
    if (j.value("use_regex", true)) splits_.push_back(SplitPattern::kGpt2);
    byte_level_ = true;
  } else if (type == "Split") {
    DS_CHECK(j.contains("pattern") && j["pattern"].is_object() && j["pattern"].contains("Regex"),
             "[tokenizer] '{}': {}.pattern must be a {{\"Regex\": ...}} (a String pattern is not "
             "supported)",
             file.string(), field);
    const std::string regex = j["pattern"]["Regex"];
    const auto pattern = split_pattern_from_regex(regex);
    DS_CHECK(pattern.has_value(),
             "[tokenizer] '{}': {}.pattern.Regex '{}' is not one we implement; supported are "
             "GPT-2's '{}', Llama-3's '{}' and Qwen2's '{}'",
             file.string(), field, regex, kGpt2Pattern, kLlama3Pattern, kQwen2Pattern);
    DS_CHECK(j.value("behavior", std::string()) == "Isolated" && !j.value("invert", false),
             "[tokenizer] '{}': {} must have behavior 'Isolated' and invert false (found '{}', {})",
             file.string(), field, j.value("behavior", std::string()), j.value("invert", false));
    DS_CHECK(!byte_level_, "[tokenizer] '{}': {} is a Split after ByteLevel; not supported",
             file.string(), field);
    splits_.push_back(*pattern);
  } else if (type == "Sequence" && j.contains("pretokenizers") && j["pretokenizers"].is_array()) {
    for (size_t k = 0; k < j["pretokenizers"].size(); ++k)
      set_pre_tokenizer(j["pretokenizers"][k], fmt::format("{}.pretokenizers[{}]", field, k), file);
  } else {
    DS_THROW(
        "[tokenizer] '{}': {}.type '{}' is not supported (supported: ByteLevel, Split with "
        "the GPT-2/Llama-3/Qwen2 regex, Sequence of these)",
        file.string(), field, type);
  }
}

void BpeTokenizer::set_post_processor(const ojson& j, const std::string& field,
                                      const fs::path& file) {
  if (j.is_null()) return;
  const std::string type = type_of(j);
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence" && j.contains("processors") && j["processors"].is_array()) {
    for (size_t k = 0; k < j["processors"].size(); ++k)
      set_post_processor(j["processors"][k], fmt::format("{}.processors[{}]", field, k), file);
    return;
  }
  if (type == "RobertaProcessing") {  // RoBERTa: <s> A </s>, and <s> A </s></s> B </s> for pairs
    DS_CHECK(prefix_ids_.empty() && suffix_ids_.empty(),
             "[tokenizer] '{}': {} is a second post-processor with special tokens; not supported",
             file.string(), field);
    auto token_id = [&](const char* key) {
      const ojson& t = j.value(key, ojson());
      DS_CHECK(t.is_array() && t.size() == 2 && t[1].is_number_integer(),
               "[tokenizer] '{}': {}.{} must be [\"token\", id]", file.string(), field, key);
      return t[1].get<int32_t>();
    };
    prefix_ids_ = {token_id("cls")};
    suffix_ids_ = {token_id("sep")};
    roberta_pair_ = true;
    return;
  }
  DS_CHECK(type == "TemplateProcessing",
           "[tokenizer] '{}': {}.type '{}' is not supported (supported: ByteLevel, "
           "TemplateProcessing, RobertaProcessing, Sequence of these)",
           file.string(), field, type);
  DS_CHECK(prefix_ids_.empty() && suffix_ids_.empty(),
           "[tokenizer] '{}': {} is a second TemplateProcessing; not supported", file.string(),
           field);
  const ojson& specials = j.value("special_tokens", ojson::object());
  bool seen_a = false;
  for (const auto& item : j.value("single", ojson::array())) {
    if (item.contains("Sequence")) {
      DS_CHECK(item["Sequence"].value("id", std::string()) == "A" && !seen_a,
               "[tokenizer] '{}': {}.single must hold sequence A once", file.string(), field);
      seen_a = true;
    } else if (item.contains("SpecialToken")) {
      const std::string name = item["SpecialToken"].value("id", std::string());
      DS_CHECK(specials.contains(name) && specials[name].contains("ids"),
               "[tokenizer] '{}': {}.special_tokens lacks '{}'", file.string(), field, name);
      auto& dst = seen_a ? suffix_ids_ : prefix_ids_;
      for (const auto& id : specials[name]["ids"]) dst.push_back(id.get<int32_t>());
    } else {
      DS_THROW("[tokenizer] '{}': {}.single holds an item we do not understand: {}", file.string(),
               field, item.dump());
    }
  }
  DS_CHECK(seen_a, "[tokenizer] '{}': {}.single has no sequence A", file.string(), field);
}

PairEncoding BpeTokenizer::encode_pair(std::string_view a, std::string_view b,
                                       bool add_special_tokens) const {
  if (!roberta_pair_) return TextTokenizer::encode_pair(a, b, add_special_tokens);  // throws
  const std::vector<int32_t> ids_a = TextTokenizer::encode(a, false),
                             ids_b = TextTokenizer::encode(b, false);
  if (add_special_tokens) {
    const std::span<const int32_t> sb(ids_b);
    return post_process(ids_a, &sb);
  }
  PairEncoding out;  // as `tokenizers`: A with type 0, B with type 1
  out.ids = ids_a;
  out.ids.insert(out.ids.end(), ids_b.begin(), ids_b.end());
  out.type_ids.assign(ids_a.size(), 0);
  out.type_ids.insert(out.type_ids.end(), ids_b.size(), 1);
  return out;
}

PairEncoding BpeTokenizer::post_process(std::span<const int32_t> a,
                                        const std::span<const int32_t>* b) const {
  if (b && !roberta_pair_) return TextTokenizer::post_process(a, b);  // no pair template
  PairEncoding out;
  auto append = [&](std::span<const int32_t> ids) {
    out.ids.insert(out.ids.end(), ids.begin(), ids.end());
  };
  append(prefix_ids_);
  append(a);
  append(suffix_ids_);
  if (b) {
    append(suffix_ids_);
    append(*b);
    append(suffix_ids_);
  }
  out.type_ids.assign(out.ids.size(), 0);
  return out;
}

void BpeTokenizer::finish(const TokenizerConfig& config, std::string json_text,
                          const fs::path& file) {
  DS_CHECK(
      byte_level_,
      "[tokenizer] '{}': pre_tokenizer has no ByteLevel step, so this is not a byte-level BPE "
      "(only byte-level BPE tokenizer.json files are supported; SentencePiece models load from "
      "tokenizer.model)",
      file.string());
  for (int32_t id : prefix_ids_) checked(id);
  for (int32_t id : suffix_ids_) checked(id);
  added_.set_normalizer(file, [this](std::string_view s) { return normalize(s); });
  config_ = config;
  resolve_special_ids(*this, config_, file);
  json_text_ = std::move(json_text);
}

// ---- encoding -----------------------------------------------------------------------------------

void BpeTokenizer::bpe(std::string_view word, std::vector<int32_t>& out) const {
  // HF's algorithm (tokenizers/src/models/bpe/word.rs): symbols in a linked list, candidate pairs
  // in a min-heap by (rank, position); the lowest-ranked, leftmost pair is merged first and the
  // pairs it forms with its neighbours are pushed. O(n log n), so a long word (a whitespace run,
  // base64) costs no more than its length.
  struct Sym {
    int32_t id, prev, next;  // prev/next: index of the neighbour, -1 at the ends
    bool alive;
  };
  struct Cand {
    int32_t rank, pos, left, right, result;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  const auto n = static_cast<int32_t>(word.size());
  std::vector<Sym> syms(n);
  for (int32_t i = 0; i < n; ++i)
    syms[i] = {byte_token_[static_cast<uint8_t>(word[i])], i - 1, i + 1 < n ? i + 1 : -1, true};
  std::vector<Cand> heap;
  auto push = [&](int32_t pos) {
    const int32_t next = syms[pos].next;
    if (next < 0) return;
    auto it = merges_.find(pair_key(syms[pos].id, syms[next].id));
    if (it == merges_.end()) return;
    heap.push_back({it->second.rank, pos, syms[pos].id, syms[next].id, it->second.result});
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const Cand c = heap.back();
    heap.pop_back();
    Sym& s = syms[c.pos];
    // Stale when either symbol has since been merged into something else.
    if (!s.alive || s.id != c.left || s.next < 0 || syms[s.next].id != c.right) continue;
    Sym& right = syms[s.next];
    right.alive = false;
    s.id = c.result;
    s.next = right.next;
    if (s.next >= 0) syms[s.next].prev = c.pos;
    if (s.prev >= 0) push(s.prev);
    push(c.pos);
  }
  for (int32_t i = 0; i >= 0 && i < n; i = syms[i].next) out.push_back(syms[i].id);
}

void BpeTokenizer::encode_segment(std::string_view seg, uint32_t seg_begin,
                                  std::vector<int32_t>& ids, std::vector<TokenSpan>* spans) const {
  std::string prefixed;
  uint32_t shift = 0;  // bytes added in front of the segment
  if (add_prefix_space_ && !seg.starts_with(' ')) {
    prefixed = " " + std::string(seg);
    seg = prefixed;
    shift = 1;
  }
  // Words as (offset, length) into seg, refined by each Split in order.
  std::vector<std::pair<size_t, size_t>> words{{0, seg.size()}}, next;
  for (SplitPattern p : splits_) {
    next.clear();
    for (auto [off, len] : words)
      split_words(p, seg.substr(off, len), /*onig=*/true, [&](std::string_view w) {
        next.emplace_back(off + static_cast<size_t>(w.data() - seg.data() - off), w.size());
      });
    words.swap(next);
  }
  auto to_text = [&](size_t pos) {
    return seg_begin + static_cast<uint32_t>(pos >= shift ? pos - shift : 0);
  };
  for (auto [off, len] : words) {
    const std::string_view word = seg.substr(off, len);
    const size_t start = ids.size();
    auto whole = ignore_merges_ ? by_bytes_.find(std::string(word)) : by_bytes_.end();
    if (whole != by_bytes_.end()) {
      ids.push_back(whole->second);
    } else {
      bpe(word, ids);
    }
    if (spans) {
      size_t pos = off;
      for (size_t k = start; k < ids.size(); ++k) {
        const size_t n = tokens_[ids[k]].size();
        spans->push_back({to_text(pos), to_text(pos + n)});
        pos += n;
      }
    }
  }
}

void BpeTokenizer::encode(std::string_view text, bool add_special_tokens, std::vector<int32_t>& ids,
                          std::vector<TokenSpan>* spans) const {
  DS_CHECK(text.size() < UINT32_MAX, "[tokenizer] text of {} bytes is too long to encode at once",
           text.size());
  const auto end = static_cast<uint32_t>(text.size());
  if (add_special_tokens)
    for (int32_t id : prefix_ids_) {
      ids.push_back(id);
      if (spans) spans->push_back({0, 0});
    }
  // Added tokens first (normalized=false in the raw text, then normalized=true in the NFC of the
  // rest); spans of the second kind, and of what lies between them, are offsets into the NFC of
  // the piece, from the piece's start.
  std::vector<AddedSplit> raw, norm;
  std::string normalized;
  added_.split(text, AddedVocabulary::kRaw, raw);
  for (const AddedSplit& p : raw) {
    const auto at = static_cast<uint32_t>(p.begin);
    if (p.token) {
      ids.push_back(p.token->id);
      if (spans) spans->push_back({at, static_cast<uint32_t>(p.end)});
      continue;
    }
    std::string_view piece = text.substr(p.begin, p.end - p.begin);
    if (nfc_) {
      normalized = nfc(piece);
      piece = normalized;
    }
    added_.split(piece, AddedVocabulary::kNormalized, norm);
    for (const AddedSplit& q : norm) {
      if (!q.token) {
        encode_segment(piece.substr(q.begin, q.end - q.begin), at + static_cast<uint32_t>(q.begin),
                       ids, spans);
        continue;
      }
      ids.push_back(q.token->id);
      if (spans)
        spans->push_back({at + static_cast<uint32_t>(q.begin), at + static_cast<uint32_t>(q.end)});
    }
  }
  if (add_special_tokens)
    for (int32_t id : suffix_ids_) {
      ids.push_back(id);
      if (spans) spans->push_back({end, end});
    }
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string out;
  for (int32_t id : ids) {
    checked(id);
    if (skip_special_tokens && special_[id]) continue;
    out += tokens_[id];
  }
  return out;
}

// ---- saving -------------------------------------------------------------------------------------

void BpeTokenizer::save_model_files(const fs::path& dir) const {
  write_text_file(dir / "tokenizer.json", json_text_);
  // vocab.json + merges.txt for tools that predate tokenizer.json.
  ojson vocab = ojson::object();
  for (size_t id = 0; id < spelled_.size(); ++id)
    if (in_model_[id]) vocab[spelled_[id]] = id;
  write_text_file(dir / "vocab.json", vocab.dump() + "\n");
  std::string merges = "#version: 0.2\n";
  for (auto [a, b] : merge_list_) merges += spelled_[a] + " " + spelled_[b] + "\n";
  write_text_file(dir / "merges.txt", merges);
}

}  // namespace

// ---- loaders ------------------------------------------------------------------------------------

std::unique_ptr<TextTokenizer> load_tokenizer_json(const fs::path& file,
                                                   const TokenizerConfig& config) {
  std::string text = read_text_file(file);
  const ojson j = parse_json(text, file);
  DS_CHECK(j.is_object() && j.contains("model") && j["model"].is_object(),
           "[tokenizer] '{}' has no 'model' object; is it a Hugging Face tokenizer.json?",
           file.string());
  const std::string type = type_of(j["model"]);
  if (type == "WordPiece") return load_wordpiece_tokenizer_json(file, std::move(text), j, config);
  if (type == "Unigram") return load_unigram_tokenizer_json(file, std::move(text), j, config);
  DS_CHECK(type == "BPE",
           "[tokenizer] '{}': model.type '{}' is not supported; tokenizer.json files with a "
           "byte-level BPE, a WordPiece or a Unigram model are (SentencePiece models load from "
           "tokenizer.model)",
           file.string(), type);
  return load_bpe_tokenizer_json(file, std::move(text), j, config);
}

std::unique_ptr<TextTokenizer> load_bpe_tokenizer_json(const fs::path& file, std::string text,
                                                       const ojson& j,
                                                       const TokenizerConfig& config) {
  const ojson& model = j["model"];
  auto nonempty = [&](const char* key) {
    return model.contains(key) && !model[key].is_null() &&
           !(model[key].is_string() && model[key].get<std::string>().empty());
  };
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    DS_CHECK(!nonempty(key), "[tokenizer] '{}': model.{} is set; not supported", file.string(),
             key);
  DS_CHECK(!model.value("byte_fallback", false),
           "[tokenizer] '{}': model.byte_fallback=true (a SentencePiece-style BPE) is not "
           "supported; load the model's tokenizer.model instead",
           file.string());
  DS_CHECK(!model.contains("dropout") || model["dropout"].is_null() || model["dropout"] == 0,
           "[tokenizer] '{}': model.dropout is set; BPE dropout is not supported", file.string());

  auto tok = std::make_unique<BpeTokenizer>();
  tok->ignore_merges_ = model.value("ignore_merges", false);
  tok->set_vocab(model.value("vocab", ojson()), j.value("added_tokens", ojson::array()), file);
  tok->set_merges(model.value("merges", ojson::array()), file);
  tok->set_normalizer(j.value("normalizer", ojson()), file);
  DS_CHECK(j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null(),
           "[tokenizer] '{}': pre_tokenizer is null; a byte-level BPE needs ByteLevel",
           file.string());
  tok->set_pre_tokenizer(j["pre_tokenizer"], "pre_tokenizer", file);
  tok->set_post_processor(j.value("post_processor", ojson()), "post_processor", file);
  const ojson& decoder = j.value("decoder", ojson());
  DS_CHECK(decoder.is_null() || type_of(decoder) == "ByteLevel",
           "[tokenizer] '{}': decoder.type '{}' is not supported (supported: ByteLevel)",
           file.string(), type_of(decoder));
  tok->finish(config, std::move(text), file);
  return tok;
}

std::unique_ptr<TextTokenizer> load_bpe_vocab_merges(const fs::path& vocab_json,
                                                     const fs::path& merges_txt,
                                                     const TokenizerConfig& config) {
  // Build the tokenizer.json that HF's GPT2 converter writes, then load it: one code path, and
  // export gets a tokenizer.json for free.
  ojson vocab = read_json_file(vocab_json);
  DS_CHECK(vocab.is_object(), "[tokenizer] '{}' must be a JSON object token -> id",
           vocab_json.string());
  ojson merges = ojson::array();
  for_each_merge_line(read_text_file(merges_txt), merges_txt,
                      [&](size_t, std::string_view a, std::string_view b) {
                        merges.push_back(ojson::array({std::string(a), std::string(b)}));
                      });
  ojson added = ojson::array();
  TokenizerConfig cfg = config;
  if (vocab.contains("<|endoftext|>")) {
    added.push_back({{"id", vocab["<|endoftext|>"]},
                     {"content", "<|endoftext|>"},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", true},
                     {"special", true}});
    for (std::string* name : {&cfg.bos_token, &cfg.eos_token, &cfg.unk_token})
      if (name->empty()) *name = "<|endoftext|>";
  }
  const ojson byte_level = {{"type", "ByteLevel"},
                            {"add_prefix_space", false},
                            {"trim_offsets", true},
                            {"use_regex", true}};
  ojson j = {{"version", "1.0"},
             {"truncation", nullptr},
             {"padding", nullptr},
             {"added_tokens", added},
             {"normalizer", nullptr},
             {"pre_tokenizer", byte_level},
             {"post_processor", byte_level},
             {"decoder", byte_level},
             {"model",
              {{"type", "BPE"},
               {"dropout", nullptr},
               {"unk_token", nullptr},
               {"continuing_subword_prefix", ""},
               {"end_of_word_suffix", ""},
               {"fuse_unk", false},
               {"byte_fallback", false},
               {"ignore_merges", false},
               {"vocab", std::move(vocab)},
               {"merges", std::move(merges)}}}};
  auto tok = std::make_unique<BpeTokenizer>();
  tok->set_vocab(j["model"]["vocab"], added, vocab_json);
  tok->set_merges(j["model"]["merges"], merges_txt);
  tok->set_pre_tokenizer(byte_level, "pre_tokenizer", vocab_json);
  tok->finish(cfg, j.dump(2) + "\n", vocab_json);
  return tok;
}

}  // namespace ds::data::detail

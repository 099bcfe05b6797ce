// Byte-level BPE as Hugging Face `tokenizers` runs it for tokenizer.json (GPT-2, Llama-3, Qwen2),
// inside the shared pipeline (hf_pipeline.h: added tokens -> none or NFC -> ByteLevel / Split /
// Sequence -> here, with ignore_merges -> ByteLevel / TemplateProcessing / RobertaProcessing /
// Sequence), and GPT-2's vocab.json + merges.txt through the same pipeline. Tokens are kept as
// raw bytes, so the ByteLevel decoder is concatenation.
#include <algorithm>
#include <array>
#include <climits>
#include <functional>
#include <unordered_map>
#include <unordered_set>

#include "ds/core/error.h"
#include "ds/data/unicode.h"
#include "hf_json.h"
#include "hf_pipeline.h"
#include "hf_tokenizer_internal.h"
#include "merges_text.h"

namespace ds::data::detail {

namespace fs = std::filesystem;
// nlohmann::json, not ordered_json: the latter looks keys up linearly, quadratic for a 128k vocab.
using ojson = nlohmann::json;

namespace {

const ModelSpec kSpec = {
    .kind = "bpe",
    .loader = "BPE",
    .normalizer = Normalizer::kNfc,
    .pre_tokenizers = {"ByteLevel", "Split", "Sequence"},
    .post_processors = {"ByteLevel", "TemplateProcessing", "RobertaProcessing", "Sequence"},
    .pairs_need_template = true,
    .vocab_gaps = true,
    .ignores_truncation = true,
};

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

class BpeModel final : public HfModel {
 public:
  // merges_file: the file merge errors name (merges.txt), when not the tokenizer.json.
  explicit BpeModel(fs::path merges_file) : merges_file_(std::move(merges_file)) {}
  const ModelSpec& spec() const override { return kSpec; }
  void load(const ojson& model, const AddedVocabulary& added, const fs::path& file,
            HfVocab& vocab) override;
  void link(const ojson& model, const HfVocab& vocab, const fs::path& file) override;
  void check(const PreTokenizer& pre, const fs::path& file) const override {
    DS_CHECK(pre.has_byte_level(),
             "[tokenizer] '{}': pre_tokenizer has no ByteLevel step, so this is not a byte-level "
             "BPE (only byte-level BPE tokenizer.json files are supported; SentencePiece models "
             "load from tokenizer.model)",
             file.string());
  }
  void set_decoder(const ojson& j, const fs::path& file) override {
    DS_CHECK(j.is_null() || json_type(j) == "ByteLevel",
             "[tokenizer] '{}': decoder.type '{}' is not supported by the BPE loader (supported: "
             "ByteLevel)",
             file.string(), json_type(j));
  }
  void tokenize(const WordView& word, std::vector<int32_t>& ids,
                std::vector<TokenSpan>* spans) const override;
  std::string decode(std::span<const int32_t> ids, const HfVocab& vocab) const override;
  void save_files(const fs::path& dir, const HfVocab& vocab) const override;

 private:
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void check_model(const ojson& model, const fs::path& file) const;
  void bpe(std::string_view word, std::vector<int32_t>& out) const;

  fs::path merges_file_;
  bool ignore_merges_ = false;
  std::vector<std::string> bytes_;                     // id -> raw bytes (added tokens: content)
  std::unordered_map<std::string, int32_t> by_bytes_;  // raw bytes -> id, model vocab only
  int32_t byte_token_[256] = {};
  std::unordered_map<uint64_t, Merge> merges_;
  std::vector<std::pair<int32_t, int32_t>> merge_list_;  // by rank
};

// ---- loading ------------------------------------------------------------------------------------

void BpeModel::check_model(const ojson& model, const fs::path& file) const {
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
}

void BpeModel::load(const ojson& model, const AddedVocabulary& added, const fs::path& file,
                    HfVocab& v) {
  check_model(model, file);
  ignore_merges_ = json_bool(model, "ignore_merges", false, "model", file);
  const ojson& vocab = model.value("vocab", ojson());
  DS_CHECK(vocab.is_object() && !vocab.empty(),
           "[tokenizer] '{}': model.vocab must be a non-empty object token -> id", file.string());
  std::unordered_set<std::string> added_content;
  int64_t max_id = -1;
  for (const auto& [tok, id] : vocab.items()) {
    DS_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0,
             "[tokenizer] '{}': model.vocab['{}'] is not a non-negative integer id", file.string(),
             tok);
    max_id = std::max(max_id, id.get<int64_t>());
  }
  for (const AddedToken& a : added.tokens()) {
    added_content.insert(a.content);
    max_id = std::max(max_id, static_cast<int64_t>(a.id));
  }
  DS_CHECK(max_id < INT32_MAX, "[tokenizer] '{}': token id {} is too large", file.string(), max_id);
  v.resize(static_cast<size_t>(max_id + 1));
  bytes_.assign(v.tokens.size(), {});
  std::string raw;
  for (const auto& [tok, idj] : vocab.items()) {
    const auto id = idj.get<int32_t>();
    DS_CHECK(!v.in_model[id], "[tokenizer] '{}': model.vocab gives id {} to both '{}' and '{}'",
             file.string(), id, v.tokens[id], tok);
    v.add_model_token(tok, id);
    if (added_content.count(tok)) {  // an added token's spelling is its content, not bytes
      bytes_[id] = tok;
      continue;
    }
    DS_CHECK(spelled_to_bytes(tok, raw),
             "[tokenizer] '{}': model.vocab token '{}' has characters outside the byte-level "
             "alphabet; only byte-level BPE (GPT-2 style) vocabularies are supported",
             file.string(), tok);
    bytes_[id] = raw;
    by_bytes_.emplace(raw, id);
  }
  for (const AddedToken& a : added.tokens()) bytes_[a.id] = a.content;
  for (int b = 0; b < 256; ++b) {
    auto it = by_bytes_.find(std::string(1, static_cast<char>(b)));
    DS_CHECK(it != by_bytes_.end(),
             "[tokenizer] '{}': model.vocab lacks the one-byte token '{}' (byte {}); a byte-level "
             "BPE needs all 256",
             file.string(), bytes_to_spelled(std::string(1, static_cast<char>(b))), b);
    byte_token_[b] = it->second;
  }
}

void BpeModel::link(const ojson& model, const HfVocab& vocab, const fs::path& json_file) {
  const fs::path& file = merges_file_.empty() ? json_file : merges_file_;
  const ojson& merges = model.value("merges", ojson::array());
  auto token_to_id = [&](const std::string& t) {
    auto it = vocab.by_token.find(t);
    return it == vocab.by_token.end() ? -1 : it->second;
  };
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

// ---- encoding -----------------------------------------------------------------------------------

void BpeModel::bpe(std::string_view word, std::vector<int32_t>& out) const {
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

void BpeModel::tokenize(const WordView& w, std::vector<int32_t>& ids,
                        std::vector<TokenSpan>* spans) const {
  const size_t start = ids.size();
  auto whole = ignore_merges_ ? by_bytes_.find(std::string(w.text)) : by_bytes_.end();
  if (whole != by_bytes_.end()) {
    ids.push_back(whole->second);
  } else {
    bpe(w.text, ids);
  }
  if (!spans) return;
  size_t pos = 0;
  for (size_t k = start; k < ids.size(); ++k) {
    const size_t n = bytes_[ids[k]].size();
    spans->push_back(w.span(pos, pos + n));
    pos += n;
  }
}

std::string BpeModel::decode(std::span<const int32_t> ids, const HfVocab&) const {
  std::string out;
  for (int32_t id : ids) out += bytes_[id];
  return out;
}

void BpeModel::save_files(const fs::path& dir, const HfVocab& v) const {
  // vocab.json + merges.txt for tools that predate tokenizer.json.
  ojson vocab = ojson::object();
  for (size_t id = 0; id < v.tokens.size(); ++id)
    if (v.in_model[id]) vocab[v.tokens[id]] = id;
  write_text_file(dir / "vocab.json", vocab.dump() + "\n");
  std::string merges = "#version: 0.2\n";
  for (auto [a, b] : merge_list_) merges += v.tokens[a] + " " + v.tokens[b] + "\n";
  write_text_file(dir / "merges.txt", merges);
}

}  // namespace

std::unique_ptr<HfModel> make_bpe_model(const fs::path& merges_file) {
  return std::make_unique<BpeModel>(merges_file);
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
  std::string text = j.dump(2) + "\n";
  return std::make_unique<HfTokenizer>(make_bpe_model(merges_txt), vocab_json, std::move(text), j,
                                       cfg);
}

}  // namespace ds::data::detail

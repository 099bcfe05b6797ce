// Unigram (SentencePiece-style) tokenizer.json as Hugging Face `tokenizers` runs it, e.g. what
// transformers 5 writes for DebertaV2Tokenizer and T5Tokenizer:
// added tokens (added_tokens.h) -> normalizer (hf_normalizer.h) -> pre-tokenizer (WhitespaceSplit,
// Metaspace) -> Unigram (Viterbi over the pieces' log-probabilities; unknown characters are the
// unk piece with score min - 10, consecutive ones fused; optional <0xNN> byte fallback) ->
// TemplateProcessing (hf_template.h). Decoding runs the decoder chain (Metaspace, Replace,
// ByteFallback, Fuse, Strip).
#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

#include "added_tokens.h"
#include "ds/core/error.h"
#include "ds/data/unicode.h"
#include "hf_normalizer.h"
#include "hf_template.h"
#include "hf_tokenizer_internal.h"

namespace ds::data::detail {

namespace fs = std::filesystem;
using ojson = nlohmann::json;

namespace {

constexpr std::string_view kLoader = "Unigram";

std::string type_of(const ojson& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>()
                                                                      : std::string("?");
}

void check_keys(const ojson& j, std::initializer_list<std::string_view> allowed,
                const std::string& field, const fs::path& file) {
  DS_CHECK(j.is_object(), "[tokenizer] '{}': {} must be an object", file.string(), field);
  for (const auto& [key, value] : j.items())
    DS_CHECK(std::find(allowed.begin(), allowed.end(), key) != allowed.end(),
             "[tokenizer] '{}': {}.{} is not supported by the Unigram loader (supported keys: "
             "{}); remove it or convert the tokenizer",
             file.string(), field, key, fmt::join(allowed, ", "));
}

bool get_bool(const ojson& j, const char* key, bool fallback, const std::string& field,
              const fs::path& file) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  DS_CHECK(j[key].is_boolean(), "[tokenizer] '{}': {}.{} must be true or false", file.string(),
           field, key);
  return j[key].get<bool>();
}

enum class Prepend { kAlways, kFirst, kNever };

// Metaspace's options, shared by the pre-tokenizer and the decoder.
struct Metaspace {
  std::string replacement = "\xE2\x96\x81";  // U+2581
  Prepend prepend = Prepend::kAlways;
  bool split = true;
};

Metaspace parse_metaspace(const ojson& j, const std::string& field, const fs::path& file) {
  check_keys(j, {"type", "replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep"},
             field, file);
  Metaspace m;
  if (j.contains("replacement")) {
    DS_CHECK(j["replacement"].is_string(), "[tokenizer] '{}': {}.replacement must be a string",
             file.string(), field);
    m.replacement = j["replacement"].get<std::string>();
    DS_CHECK(!m.replacement.empty() && utf8_decode(m.replacement, 0).len == m.replacement.size(),
             "[tokenizer] '{}': {}.replacement must be one character", file.string(), field);
  }
  m.split = get_bool(j, "split", true, field, file);
  if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) {
    const std::string s =
        j["prepend_scheme"].is_string() ? j["prepend_scheme"].get<std::string>() : std::string("?");
    DS_CHECK(s == "always" || s == "first" || s == "never",
             "[tokenizer] '{}': {}.prepend_scheme must be \"always\", \"first\" or \"never\"",
             file.string(), field);
    m.prepend = s == "always" ? Prepend::kAlways : s == "first" ? Prepend::kFirst : Prepend::kNever;
  } else if (j.contains("add_prefix_space")) {  // older files
    m.prepend =
        get_bool(j, "add_prefix_space", true, field, file) ? Prepend::kAlways : Prepend::kNever;
  }
  return m;
}

// One decoder step over the token strings.
struct DecodeStep {
  enum Kind { kMetaspace, kReplace, kByteFallback, kFuse, kStrip } kind;
  Metaspace metaspace;        // kMetaspace
  std::string from, to;       // kReplace
  char32_t strip_char = ' ';  // kStrip
  size_t start = 0, stop = 0;
};

class UnigramTokenizer final : public TextTokenizer {
 public:
  std::string_view kind() const override { return "unigram"; }
  void encode(std::string_view text, bool add_special_tokens, std::vector<int32_t>& ids,
              std::vector<TokenSpan>* spans) const override;
  PairEncoding encode_pair(std::string_view a, std::string_view b,
                           bool add_special_tokens) const override;
  PairEncoding post_process(std::span<const int32_t> a,
                            const std::span<const int32_t>* b) const override {
    return template_.apply(a, b);
  }
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(tokens_.size()); }
  int32_t token_to_id(std::string_view token) const override {
    auto it = by_token_.find(std::string(token));
    return it == by_token_.end() ? -1 : it->second;
  }
  std::string id_to_token(int32_t id) const override { return tokens_.at(checked(id)); }
  bool is_special(int32_t id) const override { return special_.at(checked(id)) != 0; }
  std::string normalize(std::string_view text) const override;
  void save_model_files(const fs::path& dir) const override {
    write_text_file(dir / "tokenizer.json", json_text_);
  }

  void load(const ojson& j, std::string json_text, const TokenizerConfig& config,
            const fs::path& file);

 private:
  int32_t checked(int32_t id) const {
    DS_CHECK(id >= 0 && id < vocab_size(),
             "[tokenizer] token id {} is not in the vocabulary (size {})", id, vocab_size());
    return id;
  }
  void set_model(const ojson& model, const ojson& added, const fs::path& file);
  void set_pre_tokenizer(const ojson& j, const std::string& field, const fs::path& file);
  void set_decoder(const ojson& j, const std::string& field, const fs::path& file);

  // Calls on_text(piece) for the normalized text between added tokens and on_added(token, span,
  // match) for each added token, left to right (span: input offsets; match: the text it matched,
  // normalized for normalized=true tokens).
  template <class OnText, class OnAdded>
  void split_added(std::string_view text, OnText&& on_text, OnAdded&& on_added) const;
  void encode_sequence(std::string_view text, std::vector<int32_t>& ids,
                       std::vector<TokenSpan>* spans) const;
  void unigram(const NormalizedText& piece, std::vector<int32_t>& ids,
               std::vector<TokenSpan>* spans) const;

  // Vocabulary: model.vocab in order (ids 0..n-1), then added tokens beyond it.
  std::vector<std::string> tokens_;
  std::vector<double> scores_;                          // model pieces only
  std::vector<uint8_t> special_;                        // id -> special added token
  std::unordered_map<std::string, int32_t> by_token_;   // added tokens first, then the model's
  std::unordered_map<std::string, int32_t> model_ids_;  // piece -> its (last) id in model.vocab
  size_t max_piece_bytes_ = 0;
  double min_score_ = 0;
  int32_t unk_id_ = -1;
  bool byte_fallback_ = false;
  std::array<int32_t, 256> byte_ids_{};  // <0xNN> piece ids, -1 when missing
  AddedVocabulary added_;

  NormalizerChain normalizer_;
  bool whitespace_split_ = false;  // WhitespaceSplit before Metaspace
  bool has_metaspace_ = false;
  Metaspace metaspace_;
  PairTemplate template_;
  bool has_decoder_ = false;
  std::vector<DecodeStep> decoder_;
  std::string json_text_;
};

// ---- loading ------------------------------------------------------------------------------------

void UnigramTokenizer::set_model(const ojson& model, const ojson& added, const fs::path& file) {
  check_keys(model, {"type", "unk_id", "vocab", "byte_fallback"}, "model", file);
  const ojson& vocab = model.value("vocab", ojson());
  DS_CHECK(vocab.is_array() && !vocab.empty(),
           "[tokenizer] '{}': model.vocab must be a non-empty array of [piece, score]",
           file.string());
  const size_t n = vocab.size();
  tokens_.resize(n);
  scores_.resize(n);
  min_score_ = std::numeric_limits<double>::infinity();
  for (size_t id = 0; id < n; ++id) {
    const ojson& e = vocab[id];
    DS_CHECK(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_number(),
             "[tokenizer] '{}': model.vocab[{}] must be [\"piece\", score]", file.string(), id);
    tokens_[id] = e[0].get<std::string>();
    scores_[id] = e[1].get<double>();
    model_ids_[tokens_[id]] = static_cast<int32_t>(id);  // a repeated piece: the last id, as HF
    max_piece_bytes_ = std::max(max_piece_bytes_, tokens_[id].size());
    min_score_ = std::min(min_score_, scores_[id]);
  }
  if (model.contains("unk_id") && !model["unk_id"].is_null()) {
    DS_CHECK(model["unk_id"].is_number_integer() && model["unk_id"].get<int64_t>() >= 0 &&
                 model["unk_id"].get<uint64_t>() < n,
             "[tokenizer] '{}': model.unk_id must be an id in model.vocab (0..{})", file.string(),
             n - 1);
    unk_id_ = model["unk_id"].get<int32_t>();
  }
  byte_fallback_ = get_bool(model, "byte_fallback", false, "model", file);
  byte_ids_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    auto it = model_ids_.find(fmt::format("<0x{:02X}>", b));
    if (it != model_ids_.end()) byte_ids_[b] = it->second;
  }

  added_ = AddedVocabulary(added, file, kLoader);
  int64_t max_id = static_cast<int64_t>(n) - 1;
  for (const AddedToken& a : added_.tokens()) max_id = std::max(max_id, static_cast<int64_t>(a.id));
  tokens_.resize(static_cast<size_t>(max_id + 1));
  special_.assign(tokens_.size(), 0);
  for (const auto& [piece, id] : model_ids_) by_token_[piece] = id;
  for (const AddedToken& a : added_.tokens()) {
    DS_CHECK(static_cast<size_t>(a.id) >= n || tokens_[a.id] == a.content,
             "[tokenizer] '{}': added token '{}' has id {}, which model.vocab gives to '{}'",
             file.string(), a.content, a.id, tokens_[a.id]);
    tokens_[a.id] = a.content;
    by_token_[a.content] = a.id;
    special_[a.id] = a.special ? 1 : 0;
  }
  for (size_t id = n; id < tokens_.size(); ++id)
    DS_CHECK(!tokens_[id].empty(),
             "[tokenizer] '{}': id {} is neither in model.vocab nor an added token", file.string(),
             id);
}

void UnigramTokenizer::set_pre_tokenizer(const ojson& j, const std::string& field,
                                         const fs::path& file) {
  if (j.is_null()) return;
  const std::string type = type_of(j);
  if (type == "Sequence") {
    check_keys(j, {"type", "pretokenizers"}, field, file);
    DS_CHECK(j.contains("pretokenizers") && j["pretokenizers"].is_array(),
             "[tokenizer] '{}': {}.pretokenizers must be an array", file.string(), field);
    for (size_t k = 0; k < j["pretokenizers"].size(); ++k)
      set_pre_tokenizer(j["pretokenizers"][k], fmt::format("{}.pretokenizers[{}]", field, k), file);
    return;
  }
  if (type == "WhitespaceSplit") {
    check_keys(j, {"type"}, field, file);
    DS_CHECK(!has_metaspace_ && !whitespace_split_,
             "[tokenizer] '{}': {}: WhitespaceSplit is supported once, before Metaspace",
             file.string(), field);
    whitespace_split_ = true;
    return;
  }
  DS_CHECK(type == "Metaspace",
           "[tokenizer] '{}': {}.type '{}' is not supported by the Unigram loader (supported: "
           "Metaspace, WhitespaceSplit, a Sequence of them)",
           file.string(), field, type);
  DS_CHECK(!has_metaspace_, "[tokenizer] '{}': {}: a second Metaspace is not supported",
           file.string(), field);
  metaspace_ = parse_metaspace(j, field, file);
  has_metaspace_ = true;
}

void UnigramTokenizer::set_decoder(const ojson& j, const std::string& field, const fs::path& file) {
  if (j.is_null()) return;
  has_decoder_ = true;
  const std::string type = type_of(j);
  DecodeStep s{};
  if (type == "Sequence") {
    check_keys(j, {"type", "decoders"}, field, file);
    DS_CHECK(j.contains("decoders") && j["decoders"].is_array(),
             "[tokenizer] '{}': {}.decoders must be an array", file.string(), field);
    for (size_t k = 0; k < j["decoders"].size(); ++k)
      set_decoder(j["decoders"][k], fmt::format("{}.decoders[{}]", field, k), file);
    return;
  } else if (type == "Metaspace") {
    s.kind = DecodeStep::kMetaspace;
    s.metaspace = parse_metaspace(j, field, file);
  } else if (type == "Replace") {
    check_keys(j, {"type", "pattern", "content"}, field, file);
    const ojson& p = j.value("pattern", ojson());
    DS_CHECK(p.is_object() && p.contains("String") && p["String"].is_string() &&
                 !p["String"].get<std::string>().empty() && j.contains("content") &&
                 j["content"].is_string(),
             "[tokenizer] '{}': {} needs pattern {{\"String\": ...}} (a regex pattern is not "
             "supported in decoders) and a string content",
             file.string(), field);
    s.kind = DecodeStep::kReplace;
    s.from = p["String"].get<std::string>();
    s.to = j["content"].get<std::string>();
  } else if (type == "ByteFallback" || type == "Fuse") {
    check_keys(j, {"type"}, field, file);
    s.kind = type == "Fuse" ? DecodeStep::kFuse : DecodeStep::kByteFallback;
  } else if (type == "Strip") {
    check_keys(j, {"type", "content", "start", "stop"}, field, file);
    DS_CHECK(j.contains("content") && j["content"].is_string() &&
                 !j["content"].get<std::string>().empty() && j.contains("start") &&
                 j["start"].is_number_unsigned() && j.contains("stop") &&
                 j["stop"].is_number_unsigned(),
             "[tokenizer] '{}': {} needs a one-character content and non-negative start/stop",
             file.string(), field);
    const std::string c = j["content"];
    s.kind = DecodeStep::kStrip;
    s.strip_char = utf8_decode(c, 0).cp;
    s.start = j["start"].get<size_t>();
    s.stop = j["stop"].get<size_t>();
  } else {
    DS_THROW(
        "[tokenizer] '{}': {}.type '{}' is not supported by the Unigram loader (supported: none, "
        "Metaspace, Replace, ByteFallback, Fuse, Strip, a Sequence of them)",
        file.string(), field, type);
  }
  decoder_.push_back(std::move(s));
}

void UnigramTokenizer::load(const ojson& j, std::string json_text, const TokenizerConfig& config,
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
  set_model(j["model"], j.value("added_tokens", ojson::array()), file);
  normalizer_ = parse_normalizer(j.value("normalizer", ojson()), "normalizer", file, kLoader);
  added_.set_normalizer(file, [this](std::string_view s) {
    NormalizedText t = NormalizedText::from(s, 0);
    normalizer_.run(t);
    return t.text;
  });
  set_pre_tokenizer(j.value("pre_tokenizer", ojson()), "pre_tokenizer", file);
  template_ = parse_post_processor(j.value("post_processor", ojson()), vocab_size(), file, kLoader);
  set_decoder(j.value("decoder", ojson()), "decoder", file);
  config_ = config;
  resolve_special_ids(*this, config_, file);
  json_text_ = std::move(json_text);
}

// ---- encoding -----------------------------------------------------------------------------------

template <class OnText, class OnAdded>
void UnigramTokenizer::split_added(std::string_view text, OnText&& on_text,
                                   OnAdded&& on_added) const {
  std::vector<AddedSplit> raw, norm;
  added_.split(text, AddedVocabulary::kRaw, raw);
  for (const AddedSplit& p : raw) {
    if (p.token) {
      on_added(*p.token, TokenSpan{static_cast<uint32_t>(p.begin), static_cast<uint32_t>(p.end)},
               text.substr(p.begin, p.end - p.begin));
      continue;
    }
    NormalizedText t =
        NormalizedText::from(text.substr(p.begin, p.end - p.begin), static_cast<uint32_t>(p.begin));
    normalizer_.run(t);
    added_.split(t.text, AddedVocabulary::kNormalized, norm);
    if (norm.size() == 1 && !norm[0].token) {  // the common case: no normalized token in it
      on_text(t);
      continue;
    }
    for (const AddedSplit& q : norm) {
      if (q.token) {
        on_added(*q.token, t.span(q.begin, q.end),
                 std::string_view(t.text).substr(q.begin, q.end - q.begin));
        continue;
      }
      NormalizedText piece;
      piece.text = t.text.substr(q.begin, q.end - q.begin);
      piece.align.assign(t.align.begin() + q.begin, t.align.begin() + q.end);
      on_text(piece);
    }
  }
}

std::string UnigramTokenizer::normalize(std::string_view text) const {
  // Added tokens as they stand in the text (normalized=true ones: as normalized).
  std::string out;
  split_added(
      text, [&](const NormalizedText& t) { out += t.text; },
      [&](const AddedToken&, TokenSpan, std::string_view match) { out += match; });
  return out;
}

void UnigramTokenizer::unigram(const NormalizedText& piece, std::vector<int32_t>& ids,
                               std::vector<TokenSpan>* spans) const {
  // Viterbi over character boundaries, as `tokenizers`' encode_optimized: pieces are tried
  // shortest first and a later one wins only with a strictly better score; a character no piece
  // of its own length covers may be the unk piece, scored min_score - 10.
  const std::string& s = piece.text;
  const size_t n = s.size();
  if (n == 0) return;
  const double unk_score = min_score_ - 10.0;
  struct Node {
    int32_t id = -1;
    double score = 0;
    size_t start = SIZE_MAX;  // SIZE_MAX: not reached
  };
  std::vector<Node> best(n + 1);
  best[0].start = 0;
  std::string key;
  for (size_t at = 0; at < n;) {
    const size_t mblen = utf8_decode(s, at).len;
    const double here = best[at].score;
    bool single = false;
    for (size_t end = at + mblen; end <= n && end - at <= max_piece_bytes_;
         end += utf8_decode(s, end < n ? end : at).len) {
      key.assign(s, at, end - at);
      auto it = model_ids_.find(key);
      if (it != model_ids_.end()) {
        const double cand = scores_[it->second] + here;
        Node& t = best[end];
        if (t.start == SIZE_MAX || cand > t.score) t = {it->second, cand, at};
        if (end - at == mblen) single = true;
      }
      if (end == n) break;
    }
    if (!single) {
      DS_CHECK(unk_id_ >= 0,
               "[tokenizer] Unigram: '{}' is not in the vocabulary and model.unk_id is null",
               s.substr(at, mblen));
      const double cand = unk_score + here;
      Node& t = best[at + mblen];
      if (t.start == SIZE_MAX || cand > t.score) t = {unk_id_, cand, at};
    }
    at += mblen;
  }
  // Back from the end; consecutive unk pieces fuse into one token.
  std::vector<std::pair<size_t, size_t>> toks;  // [start, end) in s, reversed
  std::vector<bool> is_unk;
  for (size_t end = n; end > 0;) {
    const Node& node = best[end];
    const bool unk = node.id == unk_id_;
    if (unk && !toks.empty() && is_unk.back()) {
      toks.back().first = node.start;
    } else {
      toks.push_back({node.start, end});
      is_unk.push_back(unk);
    }
    end = node.start;
  }
  for (size_t k = toks.size(); k-- > 0;) {
    const auto [b, e] = toks[k];
    key.assign(s, b, e - b);
    auto it = model_ids_.find(key);
    if (it != model_ids_.end()) {
      ids.push_back(it->second);
      if (spans) spans->push_back(piece.span(b, e));
      continue;
    }
    bool bytes_ok = byte_fallback_;
    for (size_t i = b; bytes_ok && i < e; ++i)
      bytes_ok = byte_ids_[static_cast<uint8_t>(s[i])] >= 0;
    if (bytes_ok) {
      for (size_t i = b; i < e; ++i) {
        ids.push_back(byte_ids_[static_cast<uint8_t>(s[i])]);
        if (spans) spans->push_back(piece.span(b, e));
      }
      continue;
    }
    DS_CHECK(unk_id_ >= 0, "[tokenizer] Unigram: '{}' is not in the vocabulary and has no unk_id",
             key);
    ids.push_back(unk_id_);
    if (spans) spans->push_back(piece.span(b, e));
  }
}

void UnigramTokenizer::encode_sequence(std::string_view text, std::vector<int32_t>& ids,
                                       std::vector<TokenSpan>* spans) const {
  DS_CHECK(text.size() < UINT32_MAX / 4,
           "[tokenizer] text of {} bytes is too long to encode at once", text.size());
  const std::string& rep = metaspace_.replacement;
  auto metaspace = [&](const NormalizedText& t, bool at_start) {
    // ' ' -> replacement, character for character.
    NormalizedText r;
    for (size_t i = 0; i < t.text.size(); ++i) {
      if (t.text[i] == ' ') {
        r.push(rep, t.align[i]);
      } else {
        r.text.push_back(t.text[i]);
        r.align.push_back(t.align[i]);
      }
    }
    const bool prepend = metaspace_.prepend == Prepend::kAlways ||
                         (metaspace_.prepend == Prepend::kFirst && at_start);
    if (prepend && !r.text.empty() && !r.text.starts_with(rep)) {
      r.text.insert(0, rep);
      r.align.insert(r.align.begin(), rep.size(), r.align.front());
    }
    if (!metaspace_.split) {
      unigram(r, ids, spans);
      return;
    }
    // Split with the replacement merged with what follows it.
    size_t from = 0;
    auto flush = [&](size_t to) {
      if (to <= from) return;
      NormalizedText p;
      p.text = r.text.substr(from, to - from);
      p.align.assign(r.align.begin() + from, r.align.begin() + to);
      unigram(p, ids, spans);
    };
    for (size_t at = r.text.find(rep, 1); at != std::string::npos; at = r.text.find(rep, at + 1)) {
      flush(at);
      from = at;
    }
    flush(r.text.size());
  };
  auto on_text = [&](const NormalizedText& t) {
    if (!has_metaspace_) {
      // No pre-tokenizer (or WhitespaceSplit alone): words, or the whole text.
      if (!whitespace_split_) return unigram(t, ids, spans);
    }
    // Metaspace's "first" scheme: the text's first character comes from input offset 0 (after
    // the normalizer: a replaced first character can move it, as in `tokenizers`).
    if (!whitespace_split_) return metaspace(t, !t.text.empty() && t.align[0].begin == 0);
    // WhitespaceSplit: runs of non-whitespace characters.
    size_t w = SIZE_MAX;
    auto word = [&](size_t b, size_t e) {
      NormalizedText p;
      p.text = t.text.substr(b, e - b);
      p.align.assign(t.align.begin() + b, t.align.begin() + e);
      if (has_metaspace_) {
        metaspace(p, p.align[0].begin == 0);
      } else {
        unigram(p, ids, spans);
      }
    };
    for (size_t i = 0; i < t.text.size();) {
      const Utf8Char u = utf8_decode(t.text, i);
      if (is_white_space(u.cp)) {
        if (w != SIZE_MAX) word(w, i);
        w = SIZE_MAX;
      } else if (w == SIZE_MAX) {
        w = i;
      }
      i += u.len;
    }
    if (w != SIZE_MAX) word(w, t.text.size());
  };
  auto on_added = [&](const AddedToken& a, TokenSpan s, std::string_view) {
    ids.push_back(a.id);
    if (spans) spans->push_back(s);
  };
  split_added(text, on_text, on_added);
}

void UnigramTokenizer::encode(std::string_view text, bool add_special_tokens,
                              std::vector<int32_t>& ids, std::vector<TokenSpan>* spans) const {
  auto sequence = [&](std::vector<int32_t>& out, std::vector<TokenSpan>* sp) {
    encode_sequence(text, out, sp);
  };
  if (!add_special_tokens)
    sequence(ids, spans);
  else
    template_.encode_single(sequence, ids, spans);
}

PairEncoding UnigramTokenizer::encode_pair(std::string_view a, std::string_view b,
                                           bool add_special_tokens) const {
  std::vector<int32_t> ids_a, ids_b;
  encode_sequence(a, ids_a, nullptr);
  encode_sequence(b, ids_b, nullptr);
  const std::span<const int32_t> sb(ids_b);
  return template_.apply(ids_a, &sb, add_special_tokens);
}

// ---- decoding -----------------------------------------------------------------------------------

namespace {

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
}

// The byte of a "<0xNN>" token, or -1.
int byte_of(const std::string& t) {
  if (t.size() != 6 || !t.starts_with("<0x") || t[5] != '>') return -1;
  auto hex = [](char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                  : -1;
  };
  const int hi = hex(t[3]), lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const Utf8Char u = utf8_decode(s, i);
    if (!u.valid) return false;
    i += u.len;
  }
  return true;
}

void run_step(const DecodeStep& step, std::vector<std::string>& toks) {
  switch (step.kind) {
    case DecodeStep::kMetaspace: {
      const std::string& rep = step.metaspace.replacement;
      for (size_t i = 0; i < toks.size(); ++i)
        replace_all(toks[i], rep, i == 0 && step.metaspace.prepend != Prepend::kNever ? "" : " ");
      break;
    }
    case DecodeStep::kReplace:
      for (std::string& t : toks) replace_all(t, step.from, step.to);
      break;
    case DecodeStep::kByteFallback: {
      std::vector<std::string> out;
      std::string bytes;
      size_t count = 0;
      auto flush = [&] {
        if (count == 0) return;
        if (valid_utf8(bytes)) {
          out.push_back(bytes);
        } else {
          for (size_t k = 0; k < count; ++k) out.push_back("\xEF\xBF\xBD");  // U+FFFD per byte
        }
        bytes.clear();
        count = 0;
      };
      for (std::string& t : toks) {
        const int b = byte_of(t);
        if (b >= 0) {
          bytes.push_back(static_cast<char>(b));
          ++count;
        } else {
          flush();
          out.push_back(std::move(t));
        }
      }
      flush();
      toks = std::move(out);
      break;
    }
    case DecodeStep::kFuse: {
      std::string all;
      for (const std::string& t : toks) all += t;
      toks.assign(1, all);
      break;
    }
    case DecodeStep::kStrip:
      for (std::string& t : toks) {
        std::vector<std::pair<size_t, size_t>> cs;  // (at, len)
        for (size_t i = 0; i < t.size();) {
          const Utf8Char u = utf8_decode(t, i);
          cs.push_back({i, u.len});
          i += u.len;
        }
        auto is_c = [&](size_t k) { return utf8_decode(t, cs[k].first).cp == step.strip_char; };
        size_t b = 0, e = cs.size();
        while (b < step.start && b < e && is_c(b)) ++b;
        size_t stripped = 0;
        while (stripped < step.stop && e > b && is_c(e - 1)) --e, ++stripped;
        const size_t from = b < cs.size() ? cs[b].first : t.size();
        const size_t to = e < cs.size() ? cs[e].first : t.size();
        t = t.substr(from, to - from);
      }
      break;
  }
}

}  // namespace

std::string UnigramTokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (int32_t id : ids) {
    checked(id);
    if (skip_special_tokens && special_[id]) continue;
    toks.push_back(tokens_[id]);
  }
  std::string out;
  if (!has_decoder_) {  // `tokenizers` joins the tokens with spaces
    for (size_t k = 0; k < toks.size(); ++k) out += (k ? " " : "") + toks[k];
    return out;
  }
  for (const DecodeStep& s : decoder_) run_step(s, toks);
  for (const std::string& t : toks) out += t;
  return out;
}

}  // namespace

std::unique_ptr<TextTokenizer> load_unigram_tokenizer_json(const fs::path& file,
                                                           std::string json_text, const ojson& j,
                                                           const TokenizerConfig& config) {
  auto tok = std::make_unique<UnigramTokenizer>();
  tok->load(j, std::move(json_text), config, file);
  return tok;
}

}  // namespace ds::data::detail

// Unigram (SentencePiece-style) tokenizer.json as Hugging Face `tokenizers` runs it, e.g. what
// transformers 5 writes for DebertaV2Tokenizer and T5Tokenizer, inside the shared pipeline
// (hf_pipeline.h: added tokens -> normalizer chain -> WhitespaceSplit / Metaspace -> here ->
// TemplateProcessing): Viterbi over the pieces' log-probabilities; unknown characters are the unk
// piece with score min - 10, consecutive ones fused; optional <0xNN> byte fallback. Decoding runs
// the decoder chain (Metaspace, Replace, ByteFallback, Fuse, Strip).
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

#include "ds/core/error.h"
#include "ds/data/unicode.h"
#include "hf_json.h"
#include "hf_pipeline.h"
#include "hf_tokenizer_internal.h"

namespace ds::data::detail {

namespace fs = std::filesystem;
using ojson = nlohmann::json;

namespace {

constexpr std::string_view kLoader = "Unigram";

const ModelSpec kSpec = {
    .kind = "unigram",
    .loader = kLoader,
    .normalizer = Normalizer::kChain,
    .pre_tokenizers = {"null", "Metaspace", "WhitespaceSplit", "Sequence"},
    .post_processors = {"TemplateProcessing", "BertProcessing"},
    .pairs_need_template = false,
    .vocab_gaps = false,
    .ignores_truncation = false,
};

// One decoder step over the token strings.
struct DecodeStep {
  enum Kind { kMetaspace, kReplace, kByteFallback, kFuse, kStrip } kind;
  Metaspace metaspace;        // kMetaspace
  std::string from, to;       // kReplace
  char32_t strip_char = ' ';  // kStrip
  size_t start = 0, stop = 0;
};

class UnigramModel final : public HfModel {
 public:
  const ModelSpec& spec() const override { return kSpec; }
  void load(const ojson& model, const AddedVocabulary& added, const fs::path& file,
            HfVocab& vocab) override;
  void set_decoder(const ojson& j, const fs::path& file) override {
    add_decoder(j, "decoder", file);
  }
  void tokenize(const WordView& word, std::vector<int32_t>& ids,
                std::vector<TokenSpan>* spans) const override;
  std::string decode(std::span<const int32_t> ids, const HfVocab& vocab) const override;

 private:
  void add_decoder(const ojson& j, const std::string& field, const fs::path& file);

  std::vector<double> scores_;                          // model pieces only
  std::unordered_map<std::string, int32_t> model_ids_;  // piece -> its (last) id in model.vocab
  size_t max_piece_bytes_ = 0;
  double min_score_ = 0;
  int32_t unk_id_ = -1;
  bool byte_fallback_ = false;
  std::array<int32_t, 256> byte_ids_{};  // <0xNN> piece ids, -1 when missing
  bool has_decoder_ = false;
  std::vector<DecodeStep> decoder_;
};

// ---- loading ------------------------------------------------------------------------------------

void UnigramModel::load(const ojson& model, const AddedVocabulary& added, const fs::path& file,
                        HfVocab& v) {
  check_keys(model, {"type", "unk_id", "vocab", "byte_fallback"}, "model", file, kLoader);
  const ojson& vocab = model.value("vocab", ojson());
  DS_CHECK(vocab.is_array() && !vocab.empty(),
           "[tokenizer] '{}': model.vocab must be a non-empty array of [piece, score]",
           file.string());
  const size_t n = vocab.size();
  int64_t max_id = static_cast<int64_t>(n) - 1;
  for (const AddedToken& a : added.tokens()) max_id = std::max(max_id, static_cast<int64_t>(a.id));
  v.resize(static_cast<size_t>(max_id + 1));
  scores_.resize(n);
  min_score_ = std::numeric_limits<double>::infinity();
  for (size_t id = 0; id < n; ++id) {
    const ojson& e = vocab[id];
    DS_CHECK(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_number(),
             "[tokenizer] '{}': model.vocab[{}] must be [\"piece\", score]", file.string(), id);
    const std::string piece = e[0].get<std::string>();
    v.add_model_token(piece, static_cast<int32_t>(id));
    scores_[id] = e[1].get<double>();
    model_ids_[piece] = static_cast<int32_t>(id);  // a repeated piece: the last id, as HF
    max_piece_bytes_ = std::max(max_piece_bytes_, piece.size());
    min_score_ = std::min(min_score_, scores_[id]);
  }
  if (model.contains("unk_id") && !model["unk_id"].is_null()) {
    DS_CHECK(model["unk_id"].is_number_integer() && model["unk_id"].get<int64_t>() >= 0 &&
                 model["unk_id"].get<uint64_t>() < n,
             "[tokenizer] '{}': model.unk_id must be an id in model.vocab (0..{})", file.string(),
             n - 1);
    unk_id_ = model["unk_id"].get<int32_t>();
  }
  byte_fallback_ = json_bool(model, "byte_fallback", false, "model", file);
  byte_ids_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    auto it = model_ids_.find(fmt::format("<0x{:02X}>", b));
    if (it != model_ids_.end()) byte_ids_[b] = it->second;
  }
}

void UnigramModel::add_decoder(const ojson& j, const std::string& field, const fs::path& file) {
  if (j.is_null()) return;
  has_decoder_ = true;
  const std::string type = json_type(j);
  DecodeStep s{};
  if (type == "Sequence") {
    for_each_in_sequence(
        j, "decoders", field, file, kLoader,
        [&](const ojson& item, const std::string& f) { add_decoder(item, f, file); });
    return;
  } else if (type == "Metaspace") {
    s.kind = DecodeStep::kMetaspace;
    s.metaspace = parse_metaspace(j, field, file, kLoader);
  } else if (type == "Replace") {
    check_keys(j, {"type", "pattern", "content"}, field, file, kLoader);
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
    check_keys(j, {"type"}, field, file, kLoader);
    s.kind = type == "Fuse" ? DecodeStep::kFuse : DecodeStep::kByteFallback;
  } else if (type == "Strip") {
    check_keys(j, {"type", "content", "start", "stop"}, field, file, kLoader);
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

// ---- encoding -----------------------------------------------------------------------------------

void UnigramModel::tokenize(const WordView& piece, std::vector<int32_t>& ids,
                            std::vector<TokenSpan>* spans) const {
  // Viterbi over character boundaries, as `tokenizers`' encode_optimized: pieces are tried
  // shortest first and a later one wins only with a strictly better score; a character no piece
  // of its own length covers may be the unk piece, scored min_score - 10.
  const std::string_view s = piece.text;
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

// ---- decoding -----------------------------------------------------------------------------------

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

std::string UnigramModel::decode(std::span<const int32_t> ids, const HfVocab& vocab) const {
  if (!has_decoder_) return join_tokens(ids, vocab);
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (int32_t id : ids) toks.push_back(vocab.tokens[id]);
  for (const DecodeStep& s : decoder_) run_step(s, toks);
  std::string out;
  for (const std::string& t : toks) out += t;
  return out;
}

}  // namespace

std::unique_ptr<HfModel> make_unigram_model() {
  return std::make_unique<UnigramModel>();
}

}  // namespace ds::data::detail

#include "ds/data/seq2seq_set.h"

#include <algorithm>
#include <chrono>
#include <fstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "ds/core/error.h"
#include "ds/core/file_io.h"
#include "ds/core/text.h"
#include "ds/data/prepare.h"
#include "ds/data/set_file.h"

namespace ds::data {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr char kMagic[8] = {'D', 'S', 'S', 'E', 'Q', '2', 'S', '1'};
constexpr int32_t kIgnore = -100;

// The field pairs read when none is named, in order of preference.
const std::vector<std::pair<std::string, std::string>> kPairs = {{"source", "target"},
                                                                 {"src", "tgt"},
                                                                 {"prompt", "response"},
                                                                 {"input", "output"},
                                                                 {"question", "answer"}};

template <typename... Args>
[[noreturn]] void fail(const fs::path& file, size_t line, fmt::format_string<Args...> f,
                       Args&&... args) {
  DS_THROW("[seq2seq] {}:{}: {}", file.string(), line, fmt::format(f, std::forward<Args>(args)...));
}

bool blank(const std::string& s) {
  return s.find_first_not_of(" \t") == std::string::npos;
}

std::string known_pairs() {
  std::vector<std::string> names;
  for (const auto& [s, t] : kPairs) names.push_back(fmt::format("{}/{}", s, t));
  return fmt::format("{}", fmt::join(names, ", "));
}

// The single-sequence template around `ids` (no template: ids as they are).
std::vector<int32_t> apply_template(const TextTokenizer& tok, std::span<const int32_t> ids) {
  try {
    return tok.post_process(ids, nullptr).ids;
  } catch (const ds::Error&) {
    return {ids.begin(), ids.end()};
  }
}

}  // namespace

bool is_seq2seq_set(const fs::path& dir) {
  return is_set_of_kind(dir, "seq2seq");
}

std::vector<Seq2SeqRecord> read_seq2seq_file(const fs::path& path, const std::string& source_field,
                                             const std::string& target_field,
                                             std::pair<std::string, std::string>* fields) {
  const std::string ext = path.extension().string();
  DS_CHECK(ext == ".jsonl" || ext == ".json",
           "[seq2seq] {}: unknown file type '{}': give JSON Lines (.jsonl), one "
           "{{\"source\": ..., \"target\": ...}} object per line",
           path.string(), ext);
  std::ifstream in(path, std::ios::binary);
  DS_CHECK(in.good(), "[seq2seq] cannot read '{}'", path.string());
  std::vector<Seq2SeqRecord> out;
  std::string src_key = source_field, tgt_key = target_field;
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (n == 1) line.erase(0, line.size() - strip_utf8_bom(line).size());
    if (blank(line)) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      fail(path, n, "not a JSON object ({}): {}", e.what(), quoted_excerpt(line, 120));
    }
    if (!j.is_object()) fail(path, n, "a record must be a JSON object, not {}", j.type_name());
    if (src_key.empty() || tgt_key.empty()) {
      // Detect the pair from the first record (a named field is kept).
      for (const auto& [s, t] : kPairs) {
        if ((!src_key.empty() && src_key != s) || (!tgt_key.empty() && tgt_key != t)) continue;
        if (j.contains(src_key.empty() ? s : src_key) &&
            j.contains(tgt_key.empty() ? t : tgt_key)) {
          if (src_key.empty()) src_key = s;
          if (tgt_key.empty()) tgt_key = t;
          break;
        }
      }
      if (src_key.empty() || tgt_key.empty()) {
        std::vector<std::string> keys;
        for (const auto& [k, v] : j.items()) keys.push_back(k);
        fail(path, n,
             "no source/target fields: the record has {} but none of the pairs {}{}; name them "
             "with --source_field / --target_field",
             keys.empty() ? "no fields" : fmt::format("fields {}", fmt::join(keys, ", ")),
             known_pairs(),
             source_field.empty() && target_field.empty()
                 ? ""
                 : fmt::format(" (given: source '{}', target '{}')", source_field, target_field));
      }
    }
    Seq2SeqRecord r;
    r.line = n;
    for (auto [key, dst] : {std::pair{&src_key, &r.source}, std::pair{&tgt_key, &r.target}}) {
      const auto it = j.find(*key);
      if (it == j.end() || it->is_null())
        fail(path, n, "field '{}' is missing (the {} text of each record)", *key,
             dst == &r.source ? "source" : "target");
      if (!it->is_string())
        fail(path, n, "field '{}' must be a string, not {} ({})", *key, it->type_name(),
             quoted_excerpt(it->dump(), 60));
      *dst = it->get<std::string>();
    }
    if (r.source.empty()) fail(path, n, "field '{}' (the source) is empty", src_key);
    out.push_back(std::move(r));
  }
  DS_CHECK(!out.empty(), "[seq2seq] {}: no records (the file is empty or blank)", path.string());
  if (fields) *fields = {src_key, tgt_key};
  return out;
}

EncodedText encode_seq2seq_text(const TextTokenizer& tok, const std::string& text,
                                size_t max_length, bool append_eos, int32_t eos_id) {
  std::vector<int32_t> ids = tok.encode(text, false);
  const std::vector<int32_t> empty = apply_template(tok, {});
  // Whether the template ends with eos (BART's </s>): then nothing is appended.
  const bool add = append_eos && eos_id >= 0 && (empty.empty() || empty.back() != eos_id);
  const size_t specials = empty.size() + (add ? 1 : 0);
  DS_CHECK(max_length > specials,
           "[seq2seq] a maximum length of {} cannot hold the {} special tokens and a token of "
           "text; raise --max_source_len / --max_target_len",
           max_length, specials);
  EncodedText out;
  if (ids.size() > max_length - specials) {
    ids.resize(max_length - specials);
    out.truncated = true;
  }
  out.ids = apply_template(tok, ids);
  if (add) out.ids.push_back(eos_id);
  return out;
}

// ---- the set on disk --------------------------------------------------------------------------

Seq2SeqSet Seq2SeqSet::open_split(const fs::path& dir, const std::string& split) {
  const json meta = read_set_meta(dir, "seq2seq");
  const std::string where = (dir / "meta.json").string();
  DS_CHECK(meta.is_object() && meta.value("kind", std::string()) == "seq2seq",
           "[dataset] '{}' is not a seq2seq set (format '{}', no \"kind\": \"seq2seq\"): it holds "
           "{}; prepare source/target records with ds_prepare --task seq2seq",
           where, meta.is_object() ? meta.value("format", std::string("?")) : "?",
           set_kind_words(meta));
  const json& entry =
      set_split_entry(meta, where, kSeq2SeqFormat, kSeq2SeqVersion, "seq2seq", split);
  Seq2SeqSet s;
  s.dir_ = dir;
  const json& c = meta.at("seq2seq");
  s.pad_id_ = c.value("pad_id", 0);
  s.eos_id_ = c.value("eos_id", -1);
  s.bos_id_ = c.value("bos_id", -1);
  s.start_id_ = c.value("decoder_start_id", 0);
  s.tokenizer_ = meta.value("tokenizer", json::object()).value("path", std::string());
  s.file_ = dir / entry.at("files").at(0).get<std::string>();

  SplitFileReader in(s.file_, kMagic, "a seq2seq split file", where);
  const auto version = in.field<uint32_t>(8), S = in.field<uint32_t>(12),
             T = in.field<uint32_t>(16), vocab = in.field<uint32_t>(20);
  const auto n = in.field<uint64_t>(24);
  DS_CHECK(version == kSeq2SeqVersion, "[dataset] '{}': version {}, this build reads {}",
           s.file_.string(), version, kSeq2SeqVersion);
  DS_CHECK(S > 0 && T > 0 && n == entry.value("examples", n),
           "[dataset] '{}' does not match {} (S {}, T {}, {} examples); re-run ds_prepare",
           s.file_.string(), where, S, T, n);
  DS_CHECK(in.payload_is({{n, S, 4}, {n, 1, 4}, {n, T, 4}, {n, 1, 4}}),
           "[dataset] '{}' has the wrong size for {} examples of {} + {} ids (cut short or "
           "damaged); re-run ds_prepare",
           s.file_.string(), n, S, T);
  s.n_ = static_cast<int64_t>(n);
  s.s_ = S;
  s.t_ = T;
  s.vocab_ = vocab;
  s.src_.resize(n * S);
  s.src_len_.resize(n);
  s.labels_.resize(n * T);
  s.tgt_len_.resize(n);
  in.read(s.src_);
  in.read(s.src_len_);
  in.read(s.labels_);
  in.read(s.tgt_len_);
  DS_CHECK(in.complete(),
           "[dataset] '{}' has the wrong size for {} examples of {} + {} ids (cut short or "
           "damaged); re-run ds_prepare",
           s.file_.string(), n, S, T);
  for (size_t i = 0; i < n; ++i)
    DS_CHECK(s.src_len_[i] >= 1 && s.src_len_[i] <= S && s.tgt_len_[i] >= 1 && s.tgt_len_[i] <= T,
             "[dataset] '{}': example {} has source length {} (of {}) and target length {} (of "
             "{}); damaged file",
             s.file_.string(), i, s.src_len_[i], S, s.tgt_len_[i], T);
  return s;
}

void Seq2SeqSet::get(int64_t i, std::span<int32_t> source, std::span<int32_t> mask,
                     std::span<int32_t> labels) const {
  DS_CHECK(i >= 0 && i < n_, "[dataset] example {} outside [0, {})", i, n_);
  const size_t S = static_cast<size_t>(s_), T = static_cast<size_t>(t_);
  const size_t k = static_cast<size_t>(i);
  const uint32_t len = src_len_[k];
  for (size_t j = 0; j < S; ++j) {
    source[j] = src_[k * S + j];
    mask[j] = j < len ? 1 : 0;
  }
  std::copy_n(labels_.begin() + static_cast<std::ptrdiff_t>(k * T), T, labels.begin());
}

std::vector<int32_t> Seq2SeqSet::source(int64_t i) const {
  DS_CHECK(i >= 0 && i < n_, "[dataset] example {} outside [0, {})", i, n_);
  const auto at = src_.begin() + static_cast<std::ptrdiff_t>(i * s_);
  return {at, at + src_len_[static_cast<size_t>(i)]};
}

std::vector<int32_t> Seq2SeqSet::target(int64_t i) const {
  DS_CHECK(i >= 0 && i < n_, "[dataset] example {} outside [0, {})", i, n_);
  const auto at = labels_.begin() + static_cast<std::ptrdiff_t>(i * t_);
  return {at, at + tgt_len_[static_cast<size_t>(i)]};
}

// ---- ds_prepare --task seq2seq ----------------------------------------------------------------

namespace {

struct LoadedPair {
  Seq2SeqRecord r;
  size_t file;
};

// One split's examples as the set file stores them.
struct PairSplit {
  std::vector<int32_t> src, labels;
  std::vector<uint32_t> src_len, tgt_len;
  Seq2SeqSplitReport rep;
};

// Every record of every file, each file read with the first file's fields unless they are named.
std::vector<LoadedPair> read_pairs(const std::vector<InputFile>& files,
                                   const Seq2SeqPrepareOptions& o, Seq2SeqPrepareReport& report) {
  std::vector<LoadedPair> records;
  for (size_t f = 0; f < files.size(); ++f) {
    std::pair<std::string, std::string> used;
    auto rs = read_seq2seq_file(
        files[f].path, o.source_field.empty() ? report.source_field : o.source_field,
        o.target_field.empty() ? report.target_field : o.target_field, &used);
    report.source_field = used.first;
    report.target_field = used.second;
    report.files.emplace_back(files[f].path.string(), static_cast<int64_t>(rs.size()));
    for (auto& r : rs) records.push_back({std::move(r), f});
  }
  return records;
}

// The tokenizer's ids the set uses (eos ends every target; no pad token, as GPT-2's: unk, else
// eos, pads), after checking the lengths against its model_max_length.
void tokenizer_ids(const TokenizerConfig& tc, const Seq2SeqPrepareOptions& o,
                   Seq2SeqPrepareReport& report) {
  DS_CHECK(tc.eos_id >= 0,
           "[seq2seq] the tokenizer in {} names no eos token (tokenizer_config.json "
           "\"eos_token\"): a target needs one to end with",
           o.tokenizer_dir.string());
  for (auto [option, n] : {std::pair{"--max_source_len", o.max_source_len},
                           std::pair{"--max_target_len", o.max_target_len}})
    check_sequence_length("seq2seq", option, static_cast<int64_t>(n), tc.model_max_length,
                          o.tokenizer_dir);
  report.eos_id = tc.eos_id;
  report.pad_id = tc.pad_id >= 0 ? tc.pad_id : tc.unk_id >= 0 ? tc.unk_id : tc.eos_id;
  report.decoder_start_id = tc.eos_id;
}

// Record `l` encoded (source to S ids padded with pad_id, labels to T padded with -100) into `s`.
void append_pair(PairSplit& s, const LoadedPair& l, const TextTokenizer& tok, size_t S, size_t T,
                 int32_t pad_id, const std::string& where) {
  EncodedText a, b;
  try {
    a = encode_seq2seq_text(tok, l.r.source, S);
    b = encode_seq2seq_text(tok, l.r.target, T, /*append_eos=*/true, tok.config().eos_id);
  } catch (const ds::Error& err) {
    DS_THROW("[seq2seq] {}: {}", where, err.what());
  }
  s.src.insert(s.src.end(), a.ids.begin(), a.ids.end());
  s.src.insert(s.src.end(), S - a.ids.size(), pad_id);
  s.src_len.push_back(static_cast<uint32_t>(a.ids.size()));
  s.labels.insert(s.labels.end(), b.ids.begin(), b.ids.end());
  s.labels.insert(s.labels.end(), T - b.ids.size(), kIgnore);
  s.tgt_len.push_back(static_cast<uint32_t>(b.ids.size()));
  s.rep.examples += 1;
  s.rep.truncated_source += a.truncated;
  s.rep.truncated_target += b.truncated;
}

// The split files and meta.json into o.output_dir.
std::filesystem::path write_pair_set(const Seq2SeqPrepareOptions& o, const TextTokenizer& tok,
                                     const Seq2SeqPrepareReport& report, PairSplit& train,
                                     PairSplit& val) {
  const TokenizerConfig& tc = tok.config();
  const size_t S = o.max_source_len, T = o.max_target_len;
  const uint32_t vocab = static_cast<uint32_t>(tok.vocab_size());
  std::vector<SetSplit> splits;
  for (PairSplit* s : {&train, &val}) {
    auto bytes = [&, s] {
      return SplitFileBytes(kMagic)
          .field(static_cast<uint32_t>(kSeq2SeqVersion))
          .field(static_cast<uint32_t>(S))
          .field(static_cast<uint32_t>(T))
          .field(vocab)
          .field(static_cast<uint64_t>(s->rep.examples))
          .array(s->src)
          .array(s->src_len)
          .array(s->labels)
          .array(s->tgt_len)
          .take();
    };
    splits.push_back({s == &train ? "train" : "val",
                      s->rep.examples,
                      bytes,
                      {{"truncated_source", s->rep.truncated_source},
                       {"truncated_target", s->rep.truncated_target}},
                      &s->rep.file});
  }
  SetMeta meta;
  meta.format = kSeq2SeqFormat;
  meta.kind = "seq2seq";
  meta.version = kSeq2SeqVersion;
  meta.tokenizer_dir = o.tokenizer_dir;
  meta.tokenizer = {{"pad_id", tc.pad_id}, {"eos_id", tc.eos_id}, {"bos_id", tc.bos_id}};
  meta.task = {
      {"max_source_len", S},
      {"max_target_len", T},
      {"pad_id", report.pad_id},
      {"eos_id", tc.eos_id},
      {"bos_id", tc.bos_id},
      {"decoder_start_id", report.decoder_start_id},
      {"source_field", report.source_field},
      {"target_field", report.target_field},
      {"truncation",
       "tokenizer(text, truncation=True, max_length) (the template's special tokens kept); "
       "labels end with eos"},
      {"padding", "source right-padded with pad_id (lengths give the mask); labels with -100"}};
  meta.inputs = report.files;
  meta.split_rule = report.split_rule;
  return write_task_set(o.output_dir, ".s2s", tok, meta, splits);
}

}  // namespace

Seq2SeqPrepareReport prepare_seq2seq(const Seq2SeqPrepareOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  check_sequence_length("seq2seq", "--max_source_len", static_cast<int64_t>(o.max_source_len), 0,
                        {});
  check_sequence_length("seq2seq", "--max_target_len", static_cast<int64_t>(o.max_target_len), 0,
                        {});
  DS_CHECK(!o.output_dir.empty(), "[seq2seq] no output folder given");
  check_output_outside_inputs(o.inputs, o.output_dir, "seq2seq");
  const std::vector<InputFile> files =
      list_set_inputs(o.inputs, {".jsonl", ".json"}, "seq2seq", ".jsonl",
                      "seq2seq records are JSON Lines with a source and a target field",
                      o.output_dir);
  Seq2SeqPrepareReport report;
  RecordSplit split(files, o.val_fraction, o.val_files, "seq2seq");
  const std::vector<LoadedPair> records = read_pairs(files, o, report);
  split.count(records.size());
  report.split_rule = split.rule();
  const auto tok = load_tokenizer(o.tokenizer_dir);
  tokenizer_ids(tok->config(), o, report);
  PairSplit train, val;
  for (size_t k = 0; k < records.size(); ++k) {
    const LoadedPair& l = records[k];
    append_pair(split.is_val(k, l.file) ? val : train, l, *tok, o.max_source_len,
                o.max_target_len, report.pad_id,
                fmt::format("{}:{}", files[l.file].path.string(), l.r.line));
  }
  DS_CHECK(train.rep.examples > 0,
           "[seq2seq] no training example: all {} records went to validation ({})", records.size(),
           report.split_rule);
  report.meta = write_pair_set(o, *tok, report, train, val);
  report.train = train.rep;
  report.val = val.rep;
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

}  // namespace ds::data

#include "ds/data/classification_set.h"

#include <algorithm>
#include <functional>
#include <charconv>
#include <chrono>
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "ds/core/error.h"
#include "ds/core/file_io.h"
#include "ds/data/classification.h"
#include "ds/data/prepare.h"
#include "ds/data/set_file.h"
#include "ds/data/text_tokenizer.h"

namespace ds::data {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr char kMagic[8] = {'D', 'S', 'C', 'L', 'A', 'S', 'S', '1'};

}  // namespace

bool is_classification_set(const fs::path& dir) {
  return is_set_of_kind(dir, "classification");
}

ClassificationSet ClassificationSet::open_split(const fs::path& dir, const std::string& split) {
  const json meta = read_set_meta(dir, "classification");
  const std::string where = (dir / "meta.json").string();
  DS_CHECK(meta.is_object() && meta.value("kind", std::string()) == "classification",
           "[dataset] '{}' is not a classification set (format '{}', no \"kind\": "
           "\"classification\"): it holds {}; prepare sentence(-pair) classification data with "
           "ds_prepare --task classification",
           where, meta.is_object() ? meta.value("format", std::string("?")) : "?",
           set_kind_words(meta));
  const json& entry = set_split_entry(meta, where, kClassificationFormat, kClassificationVersion,
                                      "classification", split);
  ClassificationSet s;
  s.dir_ = dir;
  const json& c = meta.at("classification");
  s.label_names_ = c.at("labels").get<std::vector<std::string>>();
  s.pair_ = c.value("pair", true);
  s.pad_id_ = c.value("pad_id", 0);
  s.file_ = dir / entry.at("files").at(0).get<std::string>();

  SplitFileReader in(s.file_, kMagic, "a classification split file", where);
  const auto version = in.field<uint32_t>(8), t = in.field<uint32_t>(12);
  const auto n = in.field<uint64_t>(16);
  const auto vocab = in.field<uint32_t>(24), nl = in.field<uint32_t>(28);
  DS_CHECK(version == kClassificationVersion, "[dataset] '{}': version {}, this build reads {}",
           s.file_.string(), version, kClassificationVersion);
  DS_CHECK(t > 0 && nl == s.label_names_.size() && n == entry.value("examples", n),
           "[dataset] '{}' does not match {} (T {}, {} labels, {} examples); re-run ds_prepare",
           s.file_.string(), where, t, nl, n);
  DS_CHECK(in.payload_is({{n, t, 4}, {n, t, 1}, {n, 1, 4}, {n, 1, 4}}),
           "[dataset] '{}' has the wrong size for {} examples of {} ids (cut short or damaged); "
           "re-run ds_prepare",
           s.file_.string(), n, t);
  s.n_ = static_cast<int64_t>(n);
  s.t_ = t;
  s.nl_ = nl;
  s.vocab_ = vocab;
  const size_t nt = static_cast<size_t>(n) * t;
  s.ids_.resize(nt);
  s.types_.resize(nt);
  s.lengths_.resize(n);
  s.labels_.resize(n);
  in.read(s.ids_);
  in.read(s.types_);
  in.read(s.lengths_);
  in.read(s.labels_);
  DS_CHECK(in.complete(),
           "[dataset] '{}' has the wrong size for {} examples of {} ids (cut short or damaged); "
           "re-run ds_prepare",
           s.file_.string(), n, t);
  for (uint8_t t : s.types_) s.max_type_ = std::max<int32_t>(s.max_type_, t);
  for (size_t i = 0; i < n; ++i)
    DS_CHECK(s.labels_[i] >= 0 && s.labels_[i] < static_cast<int32_t>(nl) && s.lengths_[i] >= 1 &&
                 s.lengths_[i] <= t,
             "[dataset] '{}': example {} has label {} (of {}) and length {} (of {}); damaged file",
             s.file_.string(), i, s.labels_[i], nl, s.lengths_[i], t);
  return s;
}

void ClassificationSet::get(int64_t i, std::span<int32_t> ids, std::span<int32_t> types,
                            std::span<int32_t> mask, int32_t& label) const {
  DS_CHECK(i >= 0 && i < n_, "[dataset] example {} outside [0, {})", i, n_);
  const size_t T = static_cast<size_t>(t_), at = static_cast<size_t>(i) * T;
  const uint32_t len = lengths_[static_cast<size_t>(i)];
  for (size_t k = 0; k < T; ++k) {
    ids[k] = ids_[at + k];
    types[k] = types_[at + k];
    mask[k] = k < len ? 1 : 0;
  }
  label = labels_[static_cast<size_t>(i)];
}

namespace {

// A record and the input file (index into the file list) it came from.
struct Loaded {
  ClassificationRecord r;
  size_t file;
};

// One split's examples as the set file stores them.
struct Split {
  std::vector<int32_t> ids, labels;
  std::vector<uint8_t> types;
  std::vector<uint32_t> lengths;
  ClassificationSplitReport rep;
};

// Every record of every file, in file order; all single sentences or all pairs (report.pair).
std::vector<Loaded> read_records(const std::vector<InputFile>& files,
                                 ClassificationPrepareReport& report) {
  std::vector<Loaded> records;
  for (size_t f = 0; f < files.size(); ++f) {
    auto rs = read_classification_file(files[f].path);
    report.files.emplace_back(files[f].path.string(), static_cast<int64_t>(rs.size()));
    for (auto& r : rs) records.push_back({std::move(r), f});
  }
  report.pair = records.front().r.sentence2.has_value();
  for (const Loaded& l : records)
    DS_CHECK(l.r.sentence2.has_value() == report.pair,
             "[classification] {}:{}: field 'sentence2' is {}, but {} {} sentence pairs: all "
             "inputs must be one task",
             files[l.file].path.string(), l.r.line, l.r.sentence2 ? "present" : "missing",
             files[records.front().file].path.string(), report.pair ? "holds" : "holds no");
  return records;
}

// Integer labels: each a class id 0 .. 99999 ("+1" and "01" are the class 1, rewritten so);
// the classes are 0 .. the largest.
LabelMap integer_labels(std::vector<Loaded>& records,
                        const std::function<std::string(const Loaded&)>& where) {
  int64_t top = 0;
  for (Loaded& l : records) {
    int64_t v = 0;
    const char* b = l.r.label.data() + (l.r.label[0] == '+' ? 1 : 0);
    const char* e = l.r.label.data() + l.r.label.size();
    const auto [end, ec] = std::from_chars(b, e, v);
    DS_CHECK(ec == std::errc() && end == e,
             "[classification] {}: field 'label': '{}' is not a class id", where(l), l.r.label);
    DS_CHECK(v >= 0,
             "[classification] {}: field 'label': {} is negative; class ids are 0, 1, ...",
             where(l), v);
    DS_CHECK(v < 100000, "[classification] {}: field 'label': class id {} is too large",
             where(l), v);
    l.r.label = std::to_string(v);
    top = std::max(top, v);
  }
  return LabelMap::integers(top + 1);
}

// The classes: --labels, else the records' class ids, else their sorted distinct names.
LabelMap label_map(std::vector<Loaded>& records, const std::vector<std::string>& given,
                   const std::function<std::string(const Loaded&)>& where) {
  if (!given.empty()) return LabelMap::names(given);
  // All class ids or all names: one name among ids (or the reverse) is a typo or another file's
  // convention, and would silently turn every id into a name.
  const auto first_int = std::find_if(records.begin(), records.end(),
                                      [](const Loaded& l) { return l.r.label_is_int; });
  const auto first_name = std::find_if(records.begin(), records.end(),
                                       [](const Loaded& l) { return !l.r.label_is_int; });
  if (first_int != records.end() && first_name != records.end()) {
    const bool name_later = first_name > first_int;
    const Loaded& odd = name_later ? *first_name : *first_int;
    const Loaded& seen = name_later ? *first_int : *first_name;
    DS_THROW(
        "[classification] {}: field 'label': '{}' is {}, but {} has {} '{}': labels must be "
        "all class ids (0, 1, ...) or all names; fix the record, or give --labels with every "
        "name in class-id order",
        where(odd), odd.r.label, name_later ? "a name" : "a class id", where(seen),
        name_later ? "the class id" : "the name", seen.r.label);
  }
  const bool ids = first_name == records.end();
  LabelMap labels;
  if (ids) {
    labels = integer_labels(records, where);
  } else {
    std::set<std::string> seen;
    for (const Loaded& l : records) seen.insert(l.r.label);
    labels = LabelMap::names({seen.begin(), seen.end()});
  }
  DS_CHECK(labels.size() >= 2,
           "[classification] every one of the {} records has the label '{}': a classifier needs "
           "two classes at least; if the files lack the others, give them all with --labels "
           "(e.g. --labels {})",
           records.size(), records.front().r.label,
           ids ? "0,1" : records.front().r.label + ",other");
  return labels;
}

// Record `l` encoded to T ids (padded with pad_id) and appended to `s`.
void append_example(Split& s, const Loaded& l, int32_t y, const TextTokenizer& tok, size_t T,
                    int32_t pad_id, const std::string& where) {
  EncodedExample e;
  try {
    e = encode_example(tok, l.r.sentence1, l.r.sentence2, T);
  } catch (const ds::Error& err) {
    DS_THROW("[classification] {}: {}", where, err.what());
  }
  const size_t n = e.tokens.ids.size();
  s.ids.insert(s.ids.end(), e.tokens.ids.begin(), e.tokens.ids.end());
  s.ids.insert(s.ids.end(), T - n, pad_id);
  for (uint32_t t : e.tokens.type_ids) {
    DS_CHECK(t < 256, "[classification] {}: token type id {} does not fit a byte", where, t);
    s.types.push_back(static_cast<uint8_t>(t));
  }
  s.types.insert(s.types.end(), T - n, 0);
  s.lengths.push_back(static_cast<uint32_t>(n));
  s.labels.push_back(y);
  s.rep.examples += 1;
  s.rep.truncated += e.truncated;
  s.rep.label_counts[static_cast<size_t>(y)] += 1;
}

// The split files and meta.json into o.output_dir.
std::filesystem::path write_set(const ClassificationPrepareOptions& o, const TextTokenizer& tok,
                                const LabelMap& labels, ClassificationPrepareReport& report,
                                Split& train, Split& val) {
  const TokenizerConfig& tc = tok.config();
  const size_t T = o.seq_len;
  const uint32_t vocab = static_cast<uint32_t>(tok.vocab_size());
  std::vector<SetSplit> splits;
  for (Split* s : {&train, &val}) {
    auto bytes = [&, s] {
      return SplitFileBytes(kMagic)
          .field(static_cast<uint32_t>(kClassificationVersion))
          .field(static_cast<uint32_t>(T))
          .field(static_cast<uint64_t>(s->rep.examples))
          .field(vocab)
          .field(static_cast<uint32_t>(labels.size()))
          .array(s->ids)
          .array(s->types)
          .array(s->lengths)
          .array(s->labels)
          .take();
    };
    splits.push_back({s == &train ? "train" : "val",
                      s->rep.examples,
                      bytes,
                      {{"truncated", s->rep.truncated}, {"label_counts", s->rep.label_counts}},
                      &s->rep.file});
  }
  SetMeta meta;
  meta.format = kClassificationFormat;
  meta.kind = "classification";
  meta.version = kClassificationVersion;
  meta.tokenizer_dir = o.tokenizer_dir;
  meta.tokenizer = {{"pad_id", report.pad_id}, {"cls_id", tc.cls_id}, {"sep_id", tc.sep_id}};
  meta.task = {{"seq_len", T},
               {"num_labels", labels.size()},
               {"labels", labels.list()},
               {"pair", report.pair},
               {"pad_id", report.pad_id},
               {"truncation",
                "longest_first (Hugging Face tokenizers), to seq_len ids with the "
                "template's special tokens"},
               {"padding", "right, with pad_id; lengths[] give the attention mask"}};
  meta.inputs = report.files;
  meta.split_rule = report.split_rule;
  return write_task_set(o.output_dir, ".cls", tok, meta, splits);
}

}  // namespace

ClassificationPrepareReport prepare_classification(const ClassificationPrepareOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  check_sequence_length("classification", "--seq_len", static_cast<int64_t>(o.seq_len), 0, {});
  DS_CHECK(!o.output_dir.empty(), "[classification] no output folder given");
  check_output_outside_inputs(o.inputs, o.output_dir, "classification");
  const std::vector<InputFile> files =
      list_set_inputs(o.inputs, {".tsv", ".jsonl", ".json"}, "classification", ".tsv or .jsonl",
                      "classification records are GLUE TSV or JSON Lines", o.output_dir);
  ClassificationPrepareReport report;
  RecordSplit split(files, o.val_fraction, o.val_files, "classification");
  std::vector<Loaded> records = read_records(files, report);
  const std::function<std::string(const Loaded&)> where = [&](const Loaded& l) {
    return fmt::format("{}:{}", files[l.file].path.string(), l.r.line);
  };
  const LabelMap labels = label_map(records, o.labels, where);
  report.labels = labels.list();
  split.count(records.size());
  report.split_rule = split.rule();

  const auto tok = load_tokenizer(o.tokenizer_dir);
  const TokenizerConfig& tc = tok->config();
  check_sequence_length("classification", "--seq_len", static_cast<int64_t>(o.seq_len),
                        tc.model_max_length, o.tokenizer_dir);
  report.pad_id = tc.pad_id >= 0 ? tc.pad_id : 0;
  Split train, val;
  for (Split* s : {&train, &val}) s->rep.label_counts.assign(labels.list().size(), 0);
  for (size_t k = 0; k < records.size(); ++k) {
    const Loaded& l = records[k];
    append_example(split.is_val(k, l.file) ? val : train, l, labels.id(l.r.label, where(l)), *tok,
                   o.seq_len, report.pad_id, where(l));
  }
  DS_CHECK(train.rep.examples > 0,
           "[classification] no training example: all {} records went to validation ({})",
           records.size(), report.split_rule);
  for (size_t c = 0; c < labels.list().size(); ++c)
    if (train.rep.label_counts[c] == 0)
      report.notes.push_back(fmt::format(
          "warning: label '{}' (class {}) has no training example{}", labels.list()[c], c,
          val.rep.label_counts[c] > 0 ? " (only validation ones)" : ""));
  report.meta = write_set(o, *tok, labels, report, train, val);
  report.train = train.rep;
  report.val = val.rep;
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

}  // namespace ds::data

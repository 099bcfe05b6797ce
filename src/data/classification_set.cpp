#include "ds/data/classification_set.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "ds/core/error.h"
#include "ds/core/file_io.h"
#include "ds/data/classification.h"
#include "ds/data/prepare.h"
#include "ds/data/text_tokenizer.h"

namespace ds::data {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr char kMagic[8] = {'D', 'S', 'C', 'L', 'A', 'S', 'S', '1'};
constexpr size_t kHeaderBytes = 64;

json read_meta(const fs::path& dir) {
  const fs::path path = dir / "meta.json";
  std::ifstream in(path);
  DS_CHECK(in.good(),
           "[dataset] cannot open '{}'; prepare the set with ds_prepare --task classification "
           "--output {}",
           path.string(), dir.string());
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    DS_THROW("[dataset] '{}' is not valid JSON ({}); re-run ds_prepare", path.string(), e.what());
  }
}

template <class T>
void put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

template <class T>
void append_array(std::string& out, const std::vector<T>& v) {
  out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

}  // namespace

bool is_classification_set(const fs::path& dir) {
  std::ifstream in(dir / "meta.json");
  if (!in) return false;
  try {
    const json meta = json::parse(in);
    return meta.is_object() && meta.value("kind", std::string()) == "classification";
  } catch (const json::exception&) {
    return false;
  }
}

ClassificationSet ClassificationSet::open_split(const fs::path& dir, const std::string& split) {
  const json meta = read_meta(dir);
  const std::string where = (dir / "meta.json").string();
  DS_CHECK(meta.is_object() && meta.value("kind", std::string()) == "classification",
           "[dataset] '{}' is not a classification set (format '{}', no \"kind\": "
           "\"classification\"): it holds {}; prepare sentence(-pair) classification data with "
           "ds_prepare --task classification",
           where, meta.is_object() ? meta.value("format", std::string("?")) : "?",
           meta.is_object() && meta.contains("sft") ? "an SFT set (ds_prepare --sft)"
                                                    : "language-model tokens (ds_prepare)");
  DS_CHECK(meta.value("format", std::string()) == kClassificationFormat &&
               meta.value("version", 0) == kClassificationVersion,
           "[dataset] '{}': format '{}' version {}, but this build reads {} version {}; re-run "
           "ds_prepare --task classification",
           where, meta.value("format", std::string()), meta.value("version", 0),
           kClassificationFormat, kClassificationVersion);
  const json& splits = meta.value("splits", json::object());
  if (!splits.contains(split)) {
    std::vector<std::string> have;
    for (const auto& [k, v] : splits.items()) have.push_back(k);
    DS_THROW(
        "[dataset] '{}' has no split '{}' (it has: {}); check the split rule given to "
        "ds_prepare",
        where, split, fmt::join(have, ", "));
  }
  ClassificationSet s;
  s.dir_ = dir;
  const json& c = meta.at("classification");
  s.label_names_ = c.at("labels").get<std::vector<std::string>>();
  s.pair_ = c.value("pair", true);
  s.pad_id_ = c.value("pad_id", 0);
  s.file_ = dir / splits[split].at("files").at(0).get<std::string>();

  std::ifstream in(s.file_, std::ios::binary);
  DS_CHECK(in.good(), "[dataset] cannot read '{}' (listed in {})", s.file_.string(), where);
  char head[kHeaderBytes];
  in.read(head, kHeaderBytes);
  DS_CHECK(in.gcount() == static_cast<std::streamsize>(kHeaderBytes) &&
               std::memcmp(head, kMagic, 8) == 0,
           "[dataset] '{}' is not a classification split file (no DSCLASS1 header)",
           s.file_.string());
  uint32_t version, t, vocab, nl;
  uint64_t n;
  std::memcpy(&version, head + 8, 4);
  std::memcpy(&t, head + 12, 4);
  std::memcpy(&n, head + 16, 8);
  std::memcpy(&vocab, head + 24, 4);
  std::memcpy(&nl, head + 28, 4);
  DS_CHECK(version == kClassificationVersion, "[dataset] '{}': version {}, this build reads {}",
           s.file_.string(), version, kClassificationVersion);
  DS_CHECK(t > 0 && nl == s.label_names_.size() && n == splits[split].value("examples", n),
           "[dataset] '{}' does not match {} (T {}, {} labels, {} examples); re-run ds_prepare",
           s.file_.string(), where, t, nl, n);
  s.n_ = static_cast<int64_t>(n);
  s.t_ = t;
  s.nl_ = nl;
  s.vocab_ = vocab;
  const size_t nt = static_cast<size_t>(n) * t;
  s.ids_.resize(nt);
  s.types_.resize(nt);
  s.lengths_.resize(n);
  s.labels_.resize(n);
  in.read(reinterpret_cast<char*>(s.ids_.data()), static_cast<std::streamsize>(nt * 4));
  in.read(reinterpret_cast<char*>(s.types_.data()), static_cast<std::streamsize>(nt));
  in.read(reinterpret_cast<char*>(s.lengths_.data()), static_cast<std::streamsize>(n * 4));
  in.read(reinterpret_cast<char*>(s.labels_.data()), static_cast<std::streamsize>(n * 4));
  DS_CHECK(in.good() && in.peek() == std::char_traits<char>::eof(),
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

ClassificationPrepareReport prepare_classification(const ClassificationPrepareOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  DS_CHECK(o.seq_len > 0, "[classification] --seq_len must be positive");
  DS_CHECK(!o.output_dir.empty(), "[classification] no output folder given");
  DS_CHECK(!(o.val_fraction && !o.val_files.empty()),
           "[classification] give at most one split rule (--val_fraction or --val_files)");
  std::vector<InputFile> files;
  for (InputFile& f : list_inputs(o.inputs, "")) {
    const std::string ext = f.path.extension().string();
    if (ext == ".tsv" || ext == ".jsonl" || ext == ".json") files.push_back(std::move(f));
  }
  DS_CHECK(!files.empty(),
           "[classification] no .tsv or .jsonl file among the inputs ({}); classification "
           "records are GLUE TSV or JSON Lines",
           [&] {
             std::vector<std::string> names;
             for (const auto& p : o.inputs) names.push_back(p.string());
             return fmt::format("{}", fmt::join(names, ", "));
           }());
  ClassificationPrepareReport report;
  std::vector<bool> file_is_val(files.size(), false);
  if (!o.val_files.empty()) {
    PrepareOptions po;
    po.val_files = o.val_files;
    file_is_val = assign_val(files, po, &report.split_rule);
  }

  // ---- read every record ----
  struct Loaded {
    ClassificationRecord r;
    size_t file;
  };
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
  auto where = [&](const Loaded& l) {
    return fmt::format("{}:{}", files[l.file].path.string(), l.r.line);
  };

  // ---- the label list ----
  LabelMap labels;
  if (!o.labels.empty()) {
    labels = LabelMap::names(o.labels);
  } else if (std::all_of(records.begin(), records.end(),
                         [](const Loaded& l) { return l.r.label_is_int; })) {
    int64_t top = 1;
    for (const Loaded& l : records) {
      int64_t v = 0;
      const auto [end, ec] =
          std::from_chars(l.r.label.data(), l.r.label.data() + l.r.label.size(), v);
      DS_CHECK(ec == std::errc() && end == l.r.label.data() + l.r.label.size(),
               "[classification] {}: field 'label': '{}' is not a class id", where(l), l.r.label);
      DS_CHECK(v >= 0,
               "[classification] {}: field 'label': {} is negative; class ids are 0, 1, ...",
               where(l), v);
      DS_CHECK(v < 100000, "[classification] {}: field 'label': class id {} is too large", where(l),
               v);
      top = std::max(top, v);
    }
    labels = LabelMap::integers(top + 1);
  } else {
    std::set<std::string> seen;
    for (const Loaded& l : records) seen.insert(l.r.label);
    labels = LabelMap::names({seen.begin(), seen.end()});
  }
  report.labels = labels.list();

  // ---- the split ----
  size_t first_val = records.size();
  if (o.val_files.empty()) {
    const double f = o.val_fraction.value_or(0.1);
    DS_CHECK(f >= 0 && f < 1, "[classification] --val_fraction must be in [0, 1), got {}", f);
    size_t n_val = static_cast<size_t>(std::ceil(f * static_cast<double>(records.size())));
    if (!o.val_fraction && records.size() < 2) n_val = 0;
    DS_CHECK(n_val < records.size(),
             "[classification] --val_fraction {} would put all {} records in validation", f,
             records.size());
    first_val = records.size() - n_val;
    report.split_rule = fmt::format(
        "val_fraction={}: the last {} of {} records (files in path order) are validation", f, n_val,
        records.size());
  }

  // ---- encode ----
  const auto tok = load_tokenizer(o.tokenizer_dir);
  const TokenizerConfig& tc = tok->config();
  report.pad_id = tc.pad_id >= 0 ? tc.pad_id : 0;
  const size_t T = o.seq_len;
  struct Split {
    std::vector<int32_t> ids, labels;
    std::vector<uint8_t> types;
    std::vector<uint32_t> lengths;
    ClassificationSplitReport rep;
  } train, val;
  for (Split* s : {&train, &val}) s->rep.label_counts.assign(labels.list().size(), 0);
  for (size_t k = 0; k < records.size(); ++k) {
    const Loaded& l = records[k];
    const int32_t y = labels.id(l.r.label, where(l));
    EncodedExample e;
    try {
      e = encode_example(*tok, l.r.sentence1, l.r.sentence2, T);
    } catch (const ds::Error& err) {
      DS_THROW("[classification] {}: {}", where(l), err.what());
    }
    Split& s = (o.val_files.empty() ? k >= first_val : file_is_val[l.file]) ? val : train;
    const size_t n = e.tokens.ids.size();
    s.ids.insert(s.ids.end(), e.tokens.ids.begin(), e.tokens.ids.end());
    s.ids.insert(s.ids.end(), T - n, report.pad_id);
    for (uint32_t t : e.tokens.type_ids) {
      DS_CHECK(t < 256, "[classification] {}: token type id {} does not fit a byte", where(l), t);
      s.types.push_back(static_cast<uint8_t>(t));
    }
    s.types.insert(s.types.end(), T - n, 0);
    s.lengths.push_back(static_cast<uint32_t>(n));
    s.labels.push_back(y);
    s.rep.examples += 1;
    s.rep.truncated += e.truncated;
    s.rep.label_counts[static_cast<size_t>(y)] += 1;
  }
  DS_CHECK(train.rep.examples > 0,
           "[classification] no training example: all {} records went to validation ({})",
           records.size(), report.split_rule);

  // ---- write: the split files, then meta.json ----
  fs::create_directories(o.output_dir);
  const uint32_t vocab = static_cast<uint32_t>(tok->vocab_size());
  json splits = json::object();
  for (auto [name, s] : {std::pair{"train", &train}, std::pair{"val", &val}}) {
    const fs::path file = o.output_dir / (std::string(name) + ".cls");
    if (s->rep.examples == 0) {
      fs::remove(file);
      continue;
    }
    std::string bytes(kMagic, 8);
    put(bytes, static_cast<uint32_t>(kClassificationVersion));
    put(bytes, static_cast<uint32_t>(T));
    put(bytes, static_cast<uint64_t>(s->rep.examples));
    put(bytes, vocab);
    put(bytes, static_cast<uint32_t>(labels.size()));
    bytes.resize(kHeaderBytes, '\0');
    append_array(bytes, s->ids);
    append_array(bytes, s->types);
    append_array(bytes, s->lengths);
    append_array(bytes, s->labels);
    ds::write_file_atomic(file, bytes);
    s->rep.file = file.filename().string();
    splits[name] = {{"files", {s->rep.file}},
                    {"examples", s->rep.examples},
                    {"truncated", s->rep.truncated},
                    {"label_counts", s->rep.label_counts}};
  }
  report.train = train.rep;
  report.val = val.rep;
  json inputs = json::array();
  for (const auto& [f, n] : report.files) inputs.push_back({{"file", f}, {"records", n}});
  const json meta = {
      {"format", kClassificationFormat},
      {"kind", "classification"},
      {"version", kClassificationVersion},
      {"tokenizer",
       {{"name", fs::absolute(o.tokenizer_dir).lexically_normal().filename().string()},
        {"path", o.tokenizer_dir.string()},
        {"kind", std::string(tok->kind())},
        {"vocab_size", vocab},
        {"pad_id", report.pad_id},
        {"cls_id", tc.cls_id},
        {"sep_id", tc.sep_id}}},
      {"classification",
       {{"seq_len", T},
        {"num_labels", labels.size()},
        {"labels", labels.list()},
        {"pair", report.pair},
        {"pad_id", report.pad_id},
        {"truncation",
         "longest_first (Hugging Face tokenizers), to seq_len ids with the "
         "template's special tokens"},
        {"padding", "right, with pad_id; lengths[] give the attention mask"},
        {"inputs", inputs}}},
      {"split_rule", report.split_rule},
      {"created_by", "ds_prepare --task classification"},
      {"splits", splits}};
  report.meta = o.output_dir / "meta.json";
  ds::write_file_atomic(report.meta, meta.dump(2) + "\n");
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

}  // namespace ds::data

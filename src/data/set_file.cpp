#include "ds/data/set_file.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ds/core/error.h"
#include "ds/core/file_io.h"

namespace ds::data {

namespace fs = std::filesystem;
using nlohmann::json;

// ---- preparing a set ----------------------------------------------------------------------------

std::vector<InputFile> list_set_inputs(const std::vector<fs::path>& inputs,
                                       const std::vector<std::string>& extensions, const char* tag,
                                       const char* extensions_text, const char* what,
                                       const fs::path& output_dir) {
  std::vector<InputFile> files;
  for (InputFile& f : list_inputs(inputs, "", output_dir)) {
    const std::string ext = f.path.extension().string();
    if (std::find(extensions.begin(), extensions.end(), ext) != extensions.end())
      files.push_back(std::move(f));
  }
  if (files.empty()) {
    std::vector<std::string> names;
    for (const auto& p : inputs) names.push_back(p.string());
    DS_THROW("[{}] no {} file among the inputs ({}); {}", tag, extensions_text,
             fmt::join(names, ", "), what);
  }
  return files;
}

RecordSplit::RecordSplit(const std::vector<InputFile>& files, std::optional<double> val_fraction,
                         std::string val_files, const char* tag)
    : val_fraction_(val_fraction), val_files_(std::move(val_files)), tag_(tag) {
  DS_CHECK(!(val_fraction_ && !val_files_.empty()),
           "[{}] give at most one split rule (--val_fraction or --val_files)", tag_);
  file_is_val_.assign(files.size(), false);
  if (!val_files_.empty()) {
    PrepareOptions po;
    po.val_files = val_files_;
    file_is_val_ = assign_val(files, po, &rule_);
  }
}

void RecordSplit::count(size_t records) {
  first_val_ = records;
  if (!val_files_.empty()) return;
  const double f = val_fraction_.value_or(0.1);
  DS_CHECK(f >= 0 && f < 1, "[{}] --val_fraction must be in [0, 1), got {}", tag_, f);
  size_t n_val = static_cast<size_t>(std::ceil(f * static_cast<double>(records)));
  if (!val_fraction_ && records < 2) n_val = 0;
  DS_CHECK(n_val < records, "[{}] --val_fraction {} would put all {} records in validation", tag_,
           f, records);
  first_val_ = records - n_val;
  rule_ =
      fmt::format("val_fraction={}: the last {} of {} records (files in path order) are validation",
                  f, n_val, records);
}

fs::path write_task_set(const fs::path& dir, const std::string& ext, const TextTokenizer& tok,
                        const SetMeta& m, const std::vector<SetSplit>& splits) {
  fs::create_directories(dir);
  json entries = json::object();
  for (const SetSplit& s : splits) {
    const fs::path file = dir / (s.name + ext);
    const std::string name = s.examples > 0 ? file.filename().string() : "";
    if (s.file_name) *s.file_name = name;
    if (name.empty()) {
      fs::remove(file);
      continue;
    }
    ds::write_file_atomic(file, s.bytes());
    json entry = s.stats;
    entry["files"] = {name};
    entry["examples"] = s.examples;
    entries[s.name] = entry;
  }
  json inputs = json::array();
  for (const auto& [f, n] : m.inputs) inputs.push_back({{"file", f}, {"records", n}});
  json tokenizer = m.tokenizer, task = m.task;
  tokenizer["name"] = fs::absolute(m.tokenizer_dir).lexically_normal().filename().string();
  tokenizer["path"] = m.tokenizer_dir.string();
  tokenizer["kind"] = std::string(tok.kind());
  tokenizer["vocab_size"] = static_cast<uint32_t>(tok.vocab_size());
  task["inputs"] = inputs;
  const json meta = {{"format", m.format},
                     {"kind", m.kind},
                     {"version", m.version},
                     {"tokenizer", tokenizer},
                     {m.kind, task},
                     {"split_rule", m.split_rule},
                     {"created_by", "ds_prepare --task " + m.kind},
                     {"splits", entries}};
  const fs::path meta_file = dir / "meta.json";
  ds::write_file_atomic(meta_file, meta.dump(2) + "\n");
  return meta_file;
}

// ---- reading a set ------------------------------------------------------------------------------

json read_set_meta(const fs::path& dir, const std::string& kind) {
  const fs::path path = dir / "meta.json";
  std::ifstream in(path);
  DS_CHECK(in.good(),
           "[dataset] cannot open '{}'; prepare the set with ds_prepare --task {} --output {}",
           path.string(), kind, dir.string());
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    DS_THROW("[dataset] '{}' is not valid JSON ({}); re-run ds_prepare", path.string(), e.what());
  }
}

std::string set_kind_words(const json& meta) {
  if (!meta.is_object()) return "no set (meta.json is not a JSON object)";
  const std::string kind = meta.value("kind", std::string());
  if (kind == "seq2seq") return "a seq2seq set (ds_prepare --task seq2seq)";
  if (kind == "classification") return "a classification set (ds_prepare --task classification)";
  if (!kind.empty()) return fmt::format("an unknown kind of set ('{}')", kind);
  if (meta.contains("sft")) return "an SFT set (ds_prepare --sft)";
  return "language-model tokens (ds_prepare)";
}

bool is_set_of_kind(const fs::path& dir, const std::string& kind) {
  std::ifstream in(dir / "meta.json");
  if (!in) return false;
  try {
    const json meta = json::parse(in);
    return meta.is_object() && meta.value("kind", std::string()) == kind;
  } catch (const json::exception&) {
    return false;
  }
}

const json& set_split_entry(const json& meta, const std::string& where, const std::string& format,
                            int version, const std::string& kind, const std::string& split) {
  DS_CHECK(meta.value("format", std::string()) == format && meta.value("version", 0) == version,
           "[dataset] '{}': format '{}' version {}, but this build reads {} version {}; re-run "
           "ds_prepare --task {}",
           where, meta.value("format", std::string()), meta.value("version", 0), format, version,
           kind);
  const auto splits = meta.find("splits");
  if (splits == meta.end() || !splits->is_object() || !splits->contains(split)) {
    std::vector<std::string> have;
    if (splits != meta.end() && splits->is_object())
      for (const auto& [k, v] : splits->items()) have.push_back(k);
    DS_THROW(
        "[dataset] '{}' has no split '{}' (it has: {}); check the split rule given to "
        "ds_prepare",
        where, split, fmt::join(have, ", "));
  }
  return splits->at(split);
}

SplitFileReader::SplitFileReader(const fs::path& file, const char (&magic)[8], const char* what,
                                 const std::string& listed_in)
    : in_(file, std::ios::binary) {
  DS_CHECK(in_.good(), "[dataset] cannot read '{}' (listed in {})", file.string(), listed_in);
  std::error_code ec;
  file_bytes_ = fs::file_size(file, ec);
  in_.read(head_, kSetHeaderBytes);
  DS_CHECK(in_.gcount() == static_cast<std::streamsize>(kSetHeaderBytes) &&
               std::memcmp(head_, magic, 8) == 0,
           "[dataset] '{}' is not {} (no {} header)", file.string(), what, std::string(magic, 8));
}

bool SplitFileReader::payload_is(std::initializer_list<std::array<uint64_t, 3>> arrays) const {
  unsigned __int128 want = kSetHeaderBytes;
  for (const auto& [rows, cols, bytes] : arrays) {
    const unsigned __int128 n = static_cast<unsigned __int128>(rows) * cols;  // < 2^128
    if (n > file_bytes_) return false;  // also keeps the sum below from wrapping
    want += n * bytes;
  }
  return want == file_bytes_;
}

}  // namespace ds::data

#pragma once
// What the task sets share on disk and in their preparation (classification sets,
// classification_set.h; seq2seq sets, seq2seq_set.h): a folder holding meta.json (written last,
// so its presence means the set is complete) and one binary file per split, <split><ext>, made of
// a 64-byte header (an 8-byte magic, u32 version, the kind's fields, zeros) and the kind's arrays,
// all little-endian. meta.json: {"format", "kind", "version", "tokenizer": {"name", "path",
// "kind", "vocab_size", ...}, "<kind>": {..., "inputs": [{"file", "records"}]}, "split_rule",
// "created_by": "ds_prepare --task <kind>", "splits": {"<split>": {"files": [name], "examples",
// ...}}}. A kind's header fields, arrays and meta.json fields are its own (see its header); this
// file writes and reads the frame around them, and splits the records into train and val.
//
// Adding a set kind: its records and encoding, a SplitFileBytes per split, write_task_set;
// reading: read_set_meta, set_split_entry, SplitFileReader. Thread safety: functions are pure
// apart from the files they read and write; a SplitFileBytes or SplitFileReader is one thread's.
#include <array>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/data/prepare.h"
#include "ds/data/text_tokenizer.h"

namespace ds::data {

inline constexpr size_t kSetHeaderBytes = 64;

// ---- preparing a set ----------------------------------------------------------------------------

// The input files (list_inputs, skipping `output_dir`) whose extension is one of `extensions`.
// Throws "[TAG] no <extensions_text> file among the inputs (...); <what>" when there is none.
std::vector<InputFile> list_set_inputs(const std::vector<std::filesystem::path>& inputs,
                                       const std::vector<std::string>& extensions, const char* tag,
                                       const char* extensions_text, const char* what,
                                       const std::filesystem::path& output_dir);

// The train / val split of a task set's records (at most one rule): val_files, a glob choosing
// whole files (assign_val), or val_fraction f: the last ceil(f * records) records (files in path
// order) are val; default 0.1 (0: no val; with fewer than 2 records and no rule given: no val).
class RecordSplit {
 public:
  // Before the records are read: checks the rules and applies val_files. Errors start "[TAG]".
  RecordSplit(const std::vector<InputFile>& files, std::optional<double> val_fraction,
              std::string val_files, const char* tag);
  // After: the fraction rule over `records` records.
  void count(size_t records);
  // Whether record `record` (in reading order), read from files[file], is a val record.
  bool is_val(size_t record, size_t file) const {
    return val_files_.empty() ? record >= first_val_ : file_is_val_[file];
  }
  const std::string& rule() const { return rule_; }  // one line for meta.json and logs

 private:
  std::optional<double> val_fraction_;
  std::string val_files_;
  const char* tag_;
  std::vector<bool> file_is_val_;
  size_t first_val_ = 0;
  std::string rule_;
};

// A split file's bytes: the magic, the header fields in order (zero-padded to kSetHeaderBytes
// before the first array), then the arrays.
class SplitFileBytes {
 public:
  explicit SplitFileBytes(const char (&magic)[8]) : bytes_(magic, 8) {}
  template <class T>
  SplitFileBytes& field(T v) {
    bytes_.append(reinterpret_cast<const char*>(&v), sizeof(T));
    return *this;
  }
  template <class T>
  SplitFileBytes& array(const std::vector<T>& v) {
    if (bytes_.size() < kSetHeaderBytes) bytes_.resize(kSetHeaderBytes, '\0');
    bytes_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
    return *this;
  }
  std::string take() { return std::move(bytes_); }

 private:
  std::string bytes_;
};

// One split to write.
struct SetSplit {
  std::string name;                    // "train", "val"
  int64_t examples = 0;                // none: no file and no meta.json entry
  std::function<std::string()> bytes;  // the split file (made when it is written)
  nlohmann::json stats;                // its meta.json entry's fields beyond files and examples
  std::string* file_name = nullptr;    // receives the file's name ("" when none)
};

// What meta.json says beyond the splits.
struct SetMeta {
  std::string format, kind;  // "DSCLASSIFY", "classification"
  int version = 1;
  std::filesystem::path tokenizer_dir;
  nlohmann::json tokenizer;  // the "tokenizer" fields beyond name, path, kind and vocab_size
  nlohmann::json task;       // the "<kind>" fields beyond inputs
  std::vector<std::pair<std::string, int64_t>> inputs;  // input file, records
  std::string split_rule;
};

// Writes the splits with examples as dir/<name><ext> (removing the file of a split without any),
// then dir/meta.json, durably (write_file_atomic). Returns the meta.json path.
std::filesystem::path write_task_set(const std::filesystem::path& dir, const std::string& ext,
                                     const TextTokenizer& tok, const SetMeta& meta,
                                     const std::vector<SetSplit>& splits);

// ---- reading a set ------------------------------------------------------------------------------

// dir/meta.json parsed. Throws "[dataset] cannot open ...; prepare the set with ds_prepare --task
// KIND --output DIR" or "... is not valid JSON".
nlohmann::json read_set_meta(const std::filesystem::path& dir, const std::string& kind);
// What a parsed meta.json holds, in the words of an error that met the wrong kind: "a seq2seq set
// (ds_prepare --task seq2seq)", "a classification set (...)", "an SFT set (ds_prepare --sft)",
// "language-model tokens (ds_prepare)", or "an unknown kind of set ('x')".
std::string set_kind_words(const nlohmann::json& meta);
// Whether dir/meta.json says "kind": kind (false when it is missing or unreadable).
bool is_set_of_kind(const std::filesystem::path& dir, const std::string& kind);
// meta's entry for `split` after checking its format and version (`where`: the meta.json path for
// messages). Throws "[dataset] 'WHERE': format ..., re-run ds_prepare --task KIND" or "has no
// split ...".
const nlohmann::json& set_split_entry(const nlohmann::json& meta, const std::string& where,
                                      const std::string& format, int version,
                                      const std::string& kind, const std::string& split);

// A split file opened for reading, its header read and its magic checked (`what`: "a
// classification split file" in the error).
class SplitFileReader {
 public:
  SplitFileReader(const std::filesystem::path& file, const char (&magic)[8], const char* what,
                  const std::string& listed_in);
  // The header field at byte `offset`.
  template <class T>
  T field(size_t offset) const {
    T v;
    std::memcpy(&v, head_ + offset, sizeof(T));
    return v;
  }
  // Reads the next array, v.size() elements.
  template <class T>
  void read(std::vector<T>& v) {
    in_.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
  }
  // Whether every array was there and nothing follows.
  bool complete() { return in_.good() && in_.peek() == std::char_traits<char>::eof(); }
  // Whether the file after the header is exactly the arrays {rows, columns, bytes per element},
  // in 128-bit arithmetic: checked before anything is allocated, so a damaged header's huge
  // counts are an error, not a failed allocation.
  bool payload_is(std::initializer_list<std::array<uint64_t, 3>> arrays) const;

 private:
  std::ifstream in_;
  char head_[kSetHeaderBytes];
  uint64_t file_bytes_ = 0;
};

}  // namespace ds::data

#pragma once
// Classification sets: what ds_prepare --task classification writes and ds_train reads to train
// an encoder classifier (docs/data.md, "Classification sets"). The records and their encoding:
// ds/data/classification.h.
//
// A folder holds meta.json (written last) and one file per split, <split>.cls:
//   bytes 0-7    magic "DSCLASS1"
//   8-11         u32 version (1)
//   12-15        u32 T: ids per example (--seq_len)
//   16-23        u64 N: examples
//   24-27        u32 vocab_size of the tokenizer
//   28-31        u32 NL: num_labels
//   32-63        zero
//   64-          i32 ids[N][T] (right-padded with pad_id), u8 token_type_ids[N][T],
//                u32 lengths[N] (ids before the padding; attention mask = first length ones),
//                i32 labels[N] (class ids in [0, NL))
// all little-endian. meta.json: {"format": "DSCLASSIFY", "kind": "classification", "version": 1,
// "tokenizer": {...}, "classification": {"seq_len", "num_labels", "labels": [names], "pair",
// "pad_id", ...}, "split_rule", "splits": {"train": {"files": ["train.cls"], "examples",
// "label_counts"}, "val": ...}}. The LM and SFT formats (dataset.h) are "DSTOKENS"; each loader
// refuses the other's folder with an error naming its meta.json. The frame both task sets share
// (header, meta.json, the train/val split of records) is written and read by ds/data/set_file.h.
//
// A split is read into memory whole (GLUE tasks are megabytes). Thread safety: a loaded set is
// immutable; get() may be called from many threads.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace ds::data {

inline constexpr char kClassificationFormat[] = "DSCLASSIFY";
inline constexpr int kClassificationVersion = 1;

// Whether dir/meta.json says "kind": "classification" (false when it is missing or unreadable).
bool is_classification_set(const std::filesystem::path& dir);

class ClassificationSet {
 public:
  // Split `split` of a folder written by ds_prepare --task classification. Throws
  // "[dataset] DIR/meta.json: ..." for another kind of folder, a missing split or version, and
  // "[dataset] FILE: ..." for a damaged file.
  static ClassificationSet open_split(const std::filesystem::path& dir, const std::string& split);

  int64_t size() const { return n_; }         // N
  int64_t seq_len() const { return t_; }      // T
  int64_t num_labels() const { return nl_; }  // NL
  int64_t vocab_size() const { return vocab_; }
  int32_t pad_id() const { return pad_id_; }
  bool pair() const { return pair_; }                // sentence pairs (else single sentences)
  int32_t max_type_id() const { return max_type_; }  // largest token type id (BERT pairs: 1)
  const std::vector<std::string>& labels() const { return label_names_; }
  const std::filesystem::path& dir() const { return dir_; }
  const std::filesystem::path& file() const { return file_; }

  // Example i's T ids, token types, attention mask (1 then 0) and its label.
  void get(int64_t i, std::span<int32_t> ids, std::span<int32_t> types, std::span<int32_t> mask,
           int32_t& label) const;
  int32_t label(int64_t i) const { return labels_.at(static_cast<size_t>(i)); }
  int32_t length(int64_t i) const {
    return static_cast<int32_t>(lengths_.at(static_cast<size_t>(i)));
  }

 private:
  std::filesystem::path dir_, file_;
  int64_t n_ = 0, t_ = 0, nl_ = 0, vocab_ = 0;
  int32_t pad_id_ = 0, max_type_ = 0;
  bool pair_ = true;
  std::vector<std::string> label_names_;
  std::vector<int32_t> ids_;
  std::vector<uint8_t> types_;
  std::vector<uint32_t> lengths_;
  std::vector<int32_t> labels_;
};

struct ClassificationPrepareOptions {
  std::vector<std::filesystem::path> inputs;  // .tsv / .jsonl files, or folders holding them
  std::filesystem::path tokenizer_dir;        // a Hugging Face folder with a pair template
  std::filesystem::path output_dir;
  size_t seq_len = 128;             // T: ids per example, after truncation and padding
  std::vector<std::string> labels;  // the label list; empty: integers, or the sorted names seen
  // Split rule (at most one): val_files (a glob choosing whole files, e.g. "dev*"), or
  // val_fraction f: the last ceil(f * records) records (files in path order) are val. Default
  // 0.1 (0: no val).
  std::optional<double> val_fraction;
  std::string val_files;
};

struct ClassificationSplitReport {
  int64_t examples = 0, truncated = 0;
  std::vector<int64_t> label_counts;  // per class id
  std::string file;                   // relative to output_dir
};

struct ClassificationPrepareReport {
  ClassificationSplitReport train, val;
  std::vector<std::string> labels;
  std::vector<std::pair<std::string, int64_t>> files;  // input file, records
  bool pair = true;
  int32_t pad_id = 0;
  std::string split_rule;
  std::filesystem::path meta;
  double seconds = 0;
  std::vector<std::string> notes;  // "warning: label 'x' (class 2) has no training example"
};

// Reads, labels, encodes and writes the set, meta.json last. Errors name the input file and line.
ClassificationPrepareReport prepare_classification(const ClassificationPrepareOptions& options);

}  // namespace ds::data

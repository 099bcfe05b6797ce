#pragma once
// Sequence(-pair) classification inputs: GLUE-style TSV and JSONL records, their labels, and how a
// record becomes the ids an encoder classifier reads (ds/models/encoder.h). The dataset files
// ds_prepare --task classification writes from them: ds/data/classification_set.h.
//
// Files (by extension; docs/data.md, "Classification sets"):
//   .tsv    a header row, then one record per line, fields split on every tab (no quoting, as
//           GLUE's loaders). Columns by header name: sentence1 (or sentence, "#1 String",
//           question1, question), sentence2 (or "#2 String", question2; absent: single-sentence
//           task), label (or Quality: MRPC's header "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String").
//   .jsonl  one object per line: {"sentence1": str, "sentence2": str (optional), "label": int or
//           str}; "sentence" and "text" are read as sentence1.
// Blank lines are skipped; a UTF-8 byte order mark on the first line is dropped. Every problem is
// a ds::Error "[classification] FILE:LINE: ..." naming the field (a missing column names the
// header line).
//
// Labels are trimmed of spaces and tabs. Integers 0..NL-1 (a JSON number, or text of an optional
// sign and digits: "+1" and "01" are class 1), or strings mapped through a label list (LabelMap):
// the list given (ds_prepare --labels a,b,c; an unknown label is an error naming the file, line
// and label), or else the distinct strings of every input file, sorted. Without --labels the
// records' labels are all integers or all names (a mix is an error naming both lines), and there
// are two classes at least. A TSV line that repeats the header row, and a header naming a column
// twice, are errors. The list is recorded in meta.json and becomes the export's id2label.
//
// Encoding (encode_example): the tokenizer's post-processor template ([CLS] A [SEP] B [SEP] with
// token types 0 through the first [SEP], then 1, for BERT's WordPiece), after truncating A and B
// to max_length minus the template's special tokens with Hugging Face tokenizers' longest_first
// rule (truncate_longest_first). Thread safety: pure functions.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "ds/data/text_tokenizer.h"

namespace ds::data {

struct ClassificationRecord {
  std::string sentence1;
  std::optional<std::string> sentence2;  // absent: a single-sentence task
  std::string label;                     // as written, trimmed of spaces/tabs: "1", "+1", "equivalent"
  bool label_is_int = false;             // an integer: a JSON number, or text [+-]digits
  size_t line = 0;                       // 1-based line in its file
};

// The records of one .tsv or .jsonl file (see the top). Throws "[classification] FILE:LINE: ..."
// for a missing column or field, a wrong type, a row with another number of fields than the
// header, and for a file without records ("no records").
std::vector<ClassificationRecord> read_classification_file(const std::filesystem::path& path);

// Label names <-> class ids.
class LabelMap {
 public:
  // Integer labels: "0", "1", ... num_labels - 1.
  static LabelMap integers(int64_t num_labels);
  // A given list of names (ds_prepare --labels), or the sorted distinct names seen.
  static LabelMap names(std::vector<std::string> names);
  // The id of `label`; throws "[classification] WHERE: label 'x' is not one of the labels (a, b)"
  // (`where` = "FILE:LINE").
  int32_t id(const std::string& label, const std::string& where) const;
  const std::vector<std::string>& list() const { return names_; }
  int64_t size() const { return static_cast<int64_t>(names_.size()); }

 private:
  std::vector<std::string> names_;
};

// Hugging Face tokenizers' TruncationStrategy::LongestFirst for a pair: shortens a and b (keeping
// their beginnings) until |a| + |b| <= max_tokens. With n1 <= n2 the shorter one's length: the
// longer keeps max(n1, max_tokens - n1); if both must be cut, the shorter keeps max_tokens / 2 and
// the longer the rest (a, the first, is "shorter" on a tie). Returns whether anything was cut.
bool truncate_longest_first(std::vector<int32_t>& a, std::vector<int32_t>& b, size_t max_tokens);

// One record as the model reads it: the template applied to the truncated sequences, at most
// max_length ids (tokenizer(a, b, truncation=True, max_length=max_length) in transformers).
// Throws when max_length cannot hold the template's special tokens plus one token.
struct EncodedExample {
  PairEncoding tokens;
  bool truncated = false;
};
EncodedExample encode_example(const TextTokenizer& tok, const std::string& a,
                              const std::optional<std::string>& b, size_t max_length);

}  // namespace ds::data

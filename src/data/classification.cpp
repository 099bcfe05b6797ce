#include "ds/data/classification.h"

#include <algorithm>
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "ds/core/error.h"
#include "ds/core/text.h"

namespace ds::data {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

template <typename... Args>
[[noreturn]] void fail(const fs::path& file, size_t line, fmt::format_string<Args...> f,
                       Args&&... args) {
  DS_THROW("[classification] {}:{}: {}", file.string(), line,
           fmt::format(f, std::forward<Args>(args)...));
}

// Header names accepted for each column, in order of preference.
const std::vector<std::string> kFirst = {"sentence1", "sentence", "#1 String",
                                         "question1", "question", "text"};
const std::vector<std::string> kSecond = {"sentence2", "#2 String", "question2"};
const std::vector<std::string> kLabel = {"label", "Quality"};

// An integer as pandas and Python's int() read one: an optional sign, then digits ("+1", "-2",
// "01"); the caller has trimmed the text.
bool is_int_text(const std::string& s) {
  size_t i = s.size() > 1 && (s[0] == '-' || s[0] == '+') ? 1 : 0;
  if (i == s.size()) return false;
  for (; i < s.size(); ++i)
    if (s[i] < '0' || s[i] > '9') return false;
  return true;
}

// The text without leading and trailing spaces and tabs ("1 " and " 1" are the label "1").
std::string trimmed(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t tab = line.find('\t', start);
    out.push_back(line.substr(start, tab == std::string::npos ? tab : tab - start));
    if (tab == std::string::npos) return out;
    start = tab + 1;
  }
}

// The lines of a file, without '\r' and the first line's byte order mark.
std::vector<std::string> read_lines(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  DS_CHECK(in.good(), "[classification] cannot read '{}'", path.string());
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (lines.empty()) line.erase(0, line.size() - strip_utf8_bom(line).size());
    lines.push_back(std::move(line));
  }
  return lines;
}

bool blank(const std::string& s) {
  return s.find_first_not_of(" \t") == std::string::npos;
}

std::vector<ClassificationRecord> read_tsv(const fs::path& path) {
  const std::vector<std::string> lines = read_lines(path);
  size_t h = 0;
  while (h < lines.size() && blank(lines[h])) ++h;
  DS_CHECK(h < lines.size(),
           "[classification] {}: empty file (a TSV file needs a header row, e.g. "
           "sentence1<TAB>sentence2<TAB>label, then one record per line)",
           path.string());
  const std::vector<std::string> header = split_tabs(lines[h]);
  auto column = [&](const std::vector<std::string>& names) -> std::optional<size_t> {
    for (const std::string& n : names)
      for (size_t c = 0; c < header.size(); ++c)
        if (header[c] == n) return c;
    return std::nullopt;
  };
  const auto c1 = column(kFirst), c2 = column(kSecond), cl = column(kLabel);
  // A name twice would silently take the first of two columns.
  for (const auto& c : {c1, c2, cl}) {
    if (!c) continue;
    const auto n = std::count(header.begin(), header.end(), header[*c]);
    if (n > 1)
      fail(path, h + 1, "the header names column '{}' {} times; rename the extra ones",
           header[*c], n);
  }
  if (!c1)
    fail(path, h + 1,
         "the header has no first-sentence column (field 'sentence1'; also read: {}); the "
         "header is {}",
         fmt::join(kFirst, ", "), quoted_excerpt(lines[h]));
  if (!cl)
    fail(path, h + 1,
         "the header has no label column (field 'label' or MRPC's 'Quality'); the header is {} "
         "(unlabelled test files cannot be trained or evaluated on)",
         quoted_excerpt(lines[h]));
  std::vector<ClassificationRecord> out;
  for (size_t i = h + 1; i < lines.size(); ++i) {
    if (blank(lines[i])) continue;
    if (lines[i] == lines[h])
      fail(path, i + 1,
           "this line repeats the header row of line {} (files joined with cat?); remove it, or "
           "give the files to ds_prepare separately",
           h + 1);
    const std::vector<std::string> f = split_tabs(lines[i]);
    if (f.size() != header.size())
      fail(path, i + 1,
           "{} tab-separated fields, but the header has {} (a tab inside a sentence, or a cut "
           "line?): {}",
           f.size(), header.size(), quoted_excerpt(lines[i], 120));
    ClassificationRecord r;
    r.line = i + 1;
    r.sentence1 = f[*c1];
    if (c2) r.sentence2 = f[*c2];
    r.label = trimmed(f[*cl]);
    if (r.label.empty()) fail(path, i + 1, "field '{}' (the label) is empty", header[*cl]);
    r.label_is_int = is_int_text(r.label);
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<ClassificationRecord> read_jsonl(const fs::path& path) {
  const std::vector<std::string> lines = read_lines(path);
  std::vector<ClassificationRecord> out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (blank(lines[i])) continue;
    const size_t n = i + 1;
    json j;
    try {
      j = json::parse(lines[i]);
    } catch (const json::exception& e) {
      fail(path, n, "not a JSON object ({}): {}", e.what(), quoted_excerpt(lines[i], 120));
    }
    if (!j.is_object()) fail(path, n, "a record must be a JSON object, not {}", j.type_name());
    ClassificationRecord r;
    r.line = n;
    auto text = [&](const std::vector<std::string>& keys) -> std::optional<std::string> {
      for (const std::string& k : keys) {
        const auto it = j.find(k);
        if (it == j.end() || it->is_null()) continue;
        if (!it->is_string())
          fail(path, n, "field '{}' must be a string, not {}", k, it->type_name());
        return it->get<std::string>();
      }
      return std::nullopt;
    };
    const auto s1 = text({"sentence1", "sentence", "text"});
    if (!s1)
      fail(
          path, n,
          "field 'sentence1' is missing (records are {{\"sentence1\", \"sentence2\", \"label\"}})");
    r.sentence1 = *s1;
    r.sentence2 = text({"sentence2"});
    const auto it = j.find("label");
    if (it == j.end() || it->is_null())
      fail(path, n, "field 'label' is missing (an integer class id or a label name)");
    if (it->is_number_integer()) {
      r.label = std::to_string(it->get<int64_t>());
      r.label_is_int = true;
    } else if (it->is_string()) {
      // As in TSV, where every label is text: " 1" is the class id 1.
      r.label = trimmed(it->get<std::string>());
      if (r.label.empty()) fail(path, n, "field 'label' is empty");
      r.label_is_int = is_int_text(r.label);
    } else {
      fail(path, n, "field 'label' must be an integer or a string, not {} ({})", it->type_name(),
           it->dump());
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace

std::vector<ClassificationRecord> read_classification_file(const fs::path& path) {
  const std::string ext = path.extension().string();
  std::vector<ClassificationRecord> out;
  if (ext == ".tsv")
    out = read_tsv(path);
  else if (ext == ".jsonl" || ext == ".json")
    out = read_jsonl(path);
  else
    DS_THROW(
        "[classification] {}: unknown file type '{}': give .tsv (GLUE: a header row with "
        "sentence1/sentence2/label) or .jsonl ({{\"sentence1\", \"sentence2\", \"label\"}} per "
        "line)",
        path.string(), ext);
  // A pair task needs both sentences in every record, a single-sentence task none.
  for (const ClassificationRecord& r : out)
    if (r.sentence2.has_value() != out.front().sentence2.has_value())
      fail(path, r.line, "field 'sentence2' is {} here but {} at line {}: one file is one task",
           r.sentence2 ? "present" : "missing", r.sentence2 ? "missing" : "present",
           out.front().line);
  DS_CHECK(!out.empty(), "[classification] {}: no records (the file is empty or blank)",
           path.string());
  return out;
}

LabelMap LabelMap::integers(int64_t num_labels) {
  LabelMap m;
  for (int64_t i = 0; i < num_labels; ++i) m.names_.push_back(std::to_string(i));
  return m;
}

LabelMap LabelMap::names(std::vector<std::string> names) {
  std::set<std::string> seen;
  for (const std::string& n : names)
    DS_CHECK(!n.empty() && seen.insert(n).second,
             "[classification] the label list has an empty or repeated name '{}'", n);
  LabelMap m;
  m.names_ = std::move(names);
  return m;
}

int32_t LabelMap::id(const std::string& label, const std::string& where) const {
  const auto it = std::find(names_.begin(), names_.end(), label);
  DS_CHECK(it != names_.end(),
           "[classification] {}: field 'label': '{}' is not one of the labels ({})", where, label,
           fmt::join(names_, ", "));
  return static_cast<int32_t>(it - names_.begin());
}

bool truncate_longest_first(std::vector<int32_t>& a, std::vector<int32_t>& b, size_t max_tokens) {
  if (a.size() + b.size() <= max_tokens) return false;
  // tokenizers' truncate_encodings, LongestFirst with a pair (utils/truncation.rs).
  size_t n1 = a.size(), n2 = b.size();
  const bool swap = n1 > n2;
  if (swap) std::swap(n1, n2);
  if (n1 > max_tokens)
    n2 = n1;
  else
    n2 = std::max(n1, max_tokens - n1);
  if (n1 + n2 > max_tokens) {
    n1 = max_tokens / 2;
    n2 = n1 + max_tokens % 2;
  }
  if (swap) std::swap(n1, n2);
  a.resize(std::min(a.size(), n1));
  b.resize(std::min(b.size(), n2));
  return true;
}

EncodedExample encode_example(const TextTokenizer& tok, const std::string& a,
                              const std::optional<std::string>& b, size_t max_length) {
  std::vector<int32_t> ids_a = tok.encode(a, false), ids_b;
  if (b) ids_b = tok.encode(*b, false);
  const std::span<const int32_t> none;
  const size_t specials = tok.post_process({}, b ? &none : nullptr).ids.size();
  DS_CHECK(max_length > specials,
           "[classification] --seq_len {} cannot hold the {} special tokens of the template and a "
           "token of text",
           max_length, specials);
  EncodedExample out;
  const size_t budget = max_length - specials;
  if (b) {
    out.truncated = truncate_longest_first(ids_a, ids_b, budget);
  } else if (ids_a.size() > budget) {
    ids_a.resize(budget);
    out.truncated = true;
  }
  const std::span<const int32_t> sb(ids_b);
  out.tokens = tok.post_process(ids_a, b ? &sb : nullptr);
  return out;
}

}  // namespace ds::data

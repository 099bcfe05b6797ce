// tokenizer.json pre-tokenizers over aligned text (hf_pretokenizer.h).
#include "hf_pretokenizer.h"

#include <algorithm>

#include <utf8proc.h>

#include "ds/core/error.h"
#include "ds/data/unicode.h"
#include "hf_json.h"

namespace ds::data::detail {

namespace fs = std::filesystem;
using ojson = nlohmann::json;

namespace {

// BertPreTokenizer's punctuation: ASCII punctuation (which includes $ + < = > ^ ` | ~) or P*.
bool is_bert_punctuation(char32_t c) {
  if (c < 0x80)
    return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
           (c >= 0x7B && c <= 0x7E);
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_PC:
    case UTF8PROC_CATEGORY_PD:
    case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI:
    case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO:
      return true;
    default:
      return false;
  }
}

}  // namespace

Metaspace parse_metaspace(const ojson& j, const std::string& field, const fs::path& file,
                          std::string_view loader) {
  check_keys(j, {"type", "replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep"},
             field, file, loader);
  Metaspace m;
  if (j.contains("replacement")) {
    DS_CHECK(j["replacement"].is_string(), "[tokenizer] '{}': {}.replacement must be a string",
             file.string(), field);
    m.replacement = j["replacement"].get<std::string>();
    DS_CHECK(!m.replacement.empty() && utf8_decode(m.replacement, 0).len == m.replacement.size(),
             "[tokenizer] '{}': {}.replacement must be one character", file.string(), field);
  }
  m.split = json_bool(j, "split", true, field, file);
  if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) {
    const std::string s =
        j["prepend_scheme"].is_string() ? j["prepend_scheme"].get<std::string>() : std::string("?");
    DS_CHECK(s == "always" || s == "first" || s == "never",
             "[tokenizer] '{}': {}.prepend_scheme must be \"always\", \"first\" or \"never\"",
             file.string(), field);
    m.prepend = s == "always" ? Prepend::kAlways : s == "first" ? Prepend::kFirst : Prepend::kNever;
  } else if (j.contains("add_prefix_space")) {  // older files
    m.prepend =
        json_bool(j, "add_prefix_space", true, field, file) ? Prepend::kAlways : Prepend::kNever;
  }
  return m;
}

// ---- parsing ------------------------------------------------------------------------------------

PreTokenizer::PreTokenizer(const ojson& j, const std::vector<std::string_view>& accepted,
                           const fs::path& file, std::string_view loader)
    : accepted_(accepted), loader_(loader) {
  parse(j, "pre_tokenizer", file);
}

bool PreTokenizer::has_byte_level() const {
  return std::any_of(steps_.begin(), steps_.end(),
                     [](const Step& s) { return s.kind == Step::kByteLevel; });
}

void PreTokenizer::parse(const ojson& j, const std::string& field, const fs::path& file) {
  const std::string type = j.is_null() ? std::string("null") : json_type(j);
  if (std::find(accepted_.begin(), accepted_.end(), type) == accepted_.end()) {
    std::vector<std::string_view> supported(accepted_);
    std::replace(supported.begin(), supported.end(), std::string_view("null"),
                 std::string_view("none"));
    DS_THROW("[tokenizer] '{}': {}.type '{}' is not supported by the {} loader (supported: {})",
             file.string(), field, type, loader_, fmt::join(supported, ", "));
  }
  if (j.is_null()) return;
  auto has = [&](Step::Kind k) {
    return std::any_of(steps_.begin(), steps_.end(), [&](const Step& s) { return s.kind == k; });
  };
  DS_CHECK(!has(Step::kByteLevel), "[tokenizer] '{}': {} is a {} after ByteLevel; not supported",
           file.string(), field, type);
  Step s{};
  if (type == "Sequence") {
    for_each_in_sequence(j, "pretokenizers", field, file, loader_,
                         [&](const ojson& item, const std::string& f) { parse(item, f, file); });
    return;
  } else if (type == "ByteLevel") {
    check_keys(j, {"type", "add_prefix_space", "trim_offsets", "use_regex"}, field, file, loader_);
    s.kind = Step::kByteLevel;
    s.prefix_space = json_bool(j, "add_prefix_space", false, field, file);
    s.use_regex = json_bool(j, "use_regex", true, field, file);
    DS_CHECK(!s.prefix_space || steps_.empty(),
             "[tokenizer] '{}': {} is ByteLevel with add_prefix_space=true after a Split; not "
             "supported",
             file.string(), field);
  } else if (type == "Split") {
    check_keys(j, {"type", "pattern", "behavior", "invert"}, field, file, loader_);
    DS_CHECK(j.contains("pattern") && j["pattern"].is_object() && j["pattern"].contains("Regex") &&
                 j["pattern"]["Regex"].is_string(),
             "[tokenizer] '{}': {}.pattern must be a {{\"Regex\": ...}} (a String pattern is not "
             "supported)",
             file.string(), field);
    const std::string regex = j["pattern"]["Regex"];
    const auto pattern = split_pattern_from_regex(regex);
    DS_CHECK(pattern.has_value(),
             "[tokenizer] '{}': {}.pattern.Regex '{}' is not one we implement; supported are "
             "GPT-2's '{}', Llama-3's '{}' and Qwen2's '{}'",
             file.string(), field, regex, kGpt2Pattern, kLlama3Pattern, kQwen2Pattern);
    const std::string behavior = j.value("behavior", std::string());
    const bool invert = json_bool(j, "invert", false, field, file);
    DS_CHECK(behavior == "Isolated" && !invert,
             "[tokenizer] '{}': {} must have behavior 'Isolated' and invert false (found '{}', {})",
             file.string(), field, behavior, invert);
    s.kind = Step::kSplit;
    s.pattern = *pattern;
  } else if (type == "BertPreTokenizer") {
    check_keys(j, {"type"}, field, file, loader_);
    s.kind = Step::kBert;
  } else if (type == "WhitespaceSplit") {
    check_keys(j, {"type"}, field, file, loader_);
    DS_CHECK(!has(Step::kMetaspace) && !has(Step::kWhitespace),
             "[tokenizer] '{}': {}: WhitespaceSplit is supported once, before Metaspace",
             file.string(), field);
    s.kind = Step::kWhitespace;
  } else {
    DS_CHECK(type == "Metaspace", "[tokenizer] '{}': {}.type '{}' has no implementation",
             file.string(), field, type);
    DS_CHECK(!has(Step::kMetaspace), "[tokenizer] '{}': {}: a second Metaspace is not supported",
             file.string(), field);
    s.kind = Step::kMetaspace;
    s.metaspace = parse_metaspace(j, field, file, loader_);
  }
  steps_.push_back(std::move(s));
}

// ---- running ------------------------------------------------------------------------------------

void PreTokenizer::run_from(size_t k, const WordView& w, const Emit& emit) const {
  if (k == steps_.size()) return emit(w);
  const Step& step = steps_[k];
  const std::string_view s = w.text;
  auto words = [&](SplitPattern p, const WordView& v) {
    split_words(p, v.text, /*onig=*/true, [&](std::string_view word) {
      const auto at = static_cast<size_t>(word.data() - v.text.data());
      run_from(k + 1, v.sub(at, at + word.size()), emit);
    });
  };
  switch (step.kind) {
    case Step::kByteLevel: {
      if (!step.prefix_space || s.starts_with(' ')) {
        if (!step.use_regex) return run_from(k + 1, w, emit);
        return words(SplitPattern::kGpt2, w);
      }
      // The space added in front has an empty range where the text starts.
      NormalizedText r;
      const uint32_t at = s.empty() ? 0 : w.align[0].begin;
      r.push(" ", {at, at});
      r.text.append(s);
      r.align.insert(r.align.end(), w.align, w.align + s.size());
      const WordView v = WordView::of(r, 0, r.text.size());
      if (!step.use_regex) return run_from(k + 1, v, emit);
      return words(SplitPattern::kGpt2, v);
    }
    case Step::kSplit:
      return words(step.pattern, w);
    case Step::kMetaspace:
      return metaspace(k, step.metaspace, w, emit);
    default:
      break;
  }
  // kBert: whitespace separates words and is dropped, punctuation is a word alone; kWhitespace:
  // runs of non-whitespace characters.
  size_t word_begin = 0;
  auto flush = [&](size_t end) {
    if (end > word_begin) run_from(k + 1, w.sub(word_begin, end), emit);
  };
  for (size_t i = 0; i < s.size();) {
    const Utf8Char u = utf8_decode(s, i);
    if (is_white_space(u.cp)) {
      flush(i);
      word_begin = i + u.len;
    } else if (step.kind == Step::kBert && is_bert_punctuation(u.cp)) {
      flush(i);
      run_from(k + 1, w.sub(i, i + u.len), emit);
      word_begin = i + u.len;
    }
    i += u.len;
  }
  flush(s.size());
}

void PreTokenizer::metaspace(size_t k, const Metaspace& m, const WordView& w,
                             const Emit& emit) const {
  // ' ' -> replacement, character for character. The "first" scheme: the text's first character
  // comes from input offset 0 (after the normalizer: a replaced first character can move it, as in
  // `tokenizers`).
  const std::string& rep = m.replacement;
  NormalizedText r;
  for (size_t i = 0; i < w.text.size(); ++i) {
    if (w.text[i] == ' ') {
      r.push(rep, w.align[i]);
    } else {
      r.text.push_back(w.text[i]);
      r.align.push_back(w.align[i]);
    }
  }
  const bool at_start = !w.text.empty() && w.align[0].begin == 0;
  const bool prepend = m.prepend == Prepend::kAlways || (m.prepend == Prepend::kFirst && at_start);
  if (prepend && !r.text.empty() && !r.text.starts_with(rep)) {
    r.text.insert(0, rep);
    r.align.insert(r.align.begin(), rep.size(), r.align.front());
  }
  if (!m.split) return run_from(k + 1, WordView::of(r, 0, r.text.size()), emit);
  // Split with the replacement merged with what follows it.
  size_t from = 0;
  auto flush = [&](size_t to) {
    if (to > from) run_from(k + 1, WordView::of(r, from, to), emit);
  };
  for (size_t at = r.text.find(rep, 1); at != std::string::npos; at = r.text.find(rep, at + 1)) {
    flush(at);
    from = at;
  }
  flush(r.text.size());
}

}  // namespace ds::data::detail

#pragma once
// Internal to src/data: tokenizer.json pre-tokenizers, run over normalized text with its alignment
// (hf_normalizer.h), each word handed on as a view.
//
//   PreTokenizer pre(j["pre_tokenizer"], {"Metaspace", "WhitespaceSplit", "Sequence"}, file,
//   "Unigram"); pre.run(WordView::of(normalized, 0, n), [&](const WordView& w) { model.tokenize(w,
//   ...); });
//
// Supported (a model accepts a subset, PreTokenizer's `accepted`):
//   ByteLevel        add_prefix_space (a space before a text that lacks one), use_regex (GPT-2's
//                    split); bytes are not remapped: byte-level models work on raw bytes. Last.
//   Split            the GPT-2, Llama-3 or Qwen2 regex of pretokenize.h, behavior Isolated.
//   BertPreTokenizer whitespace separates words and is dropped; punctuation is a word alone.
//   WhitespaceSplit  runs of non-whitespace characters; once, before Metaspace.
//   Metaspace        ' ' -> replacement (U+2581), prepend_scheme, split before each replacement.
//   Sequence         of the above, applied in order.
// Immutable after parsing; run is const and thread-safe.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "hf_normalizer.h"
#include "pretokenize.h"

namespace ds::data::detail {

// A word: bytes and, per byte, the range its spans report (hf_normalizer.h's alignment).
struct WordView {
  std::string_view text;
  const TokenSpan* align = nullptr;

  // t.text[from, to).
  static WordView of(const NormalizedText& t, size_t from, size_t to) {
    return {std::string_view(t.text).substr(from, to - from), t.align.data() + from};
  }
  WordView sub(size_t from, size_t to) const {
    return {text.substr(from, to - from), align + from};
  }
  // The range of text[from, to) (from < to).
  TokenSpan span(size_t from, size_t to) const { return {align[from].begin, align[to - 1].end}; }
};

enum class Prepend { kAlways, kFirst, kNever };

// Metaspace's options, shared by the pre-tokenizer and the Unigram decoder.
struct Metaspace {
  std::string replacement = "\xE2\x96\x81";  // U+2581
  Prepend prepend = Prepend::kAlways;
  bool split = true;
};
Metaspace parse_metaspace(const nlohmann::json& j, const std::string& field,
                          const std::filesystem::path& file, std::string_view loader);

class PreTokenizer {
 public:
  using Emit = std::function<void(const WordView&)>;

  PreTokenizer() = default;
  // Parse j (null: none, the whole text is one word) accepting the types in accepted ("Sequence"
  // among them: a Sequence of the others); anything else is a ds::Error naming the file, the field
  // and loader.
  PreTokenizer(const nlohmann::json& j, const std::vector<std::string_view>& accepted,
               const std::filesystem::path& file, std::string_view loader);

  // Calls emit for each word of text, left to right.
  void run(const WordView& text, const Emit& emit) const { run_from(0, text, emit); }
  bool has_byte_level() const;

 private:
  struct Step {
    enum Kind { kByteLevel, kSplit, kBert, kWhitespace, kMetaspace } kind;
    bool prefix_space = false;                   // kByteLevel
    bool use_regex = true;                       // kByteLevel
    SplitPattern pattern = SplitPattern::kGpt2;  // kSplit
    Metaspace metaspace;                         // kMetaspace
  };
  void parse(const nlohmann::json& j, const std::string& field, const std::filesystem::path& file);
  void run_from(size_t step, const WordView& w, const Emit& emit) const;
  void metaspace(size_t step, const Metaspace& m, const WordView& w, const Emit& emit) const;

  std::vector<Step> steps_;
  std::vector<std::string_view> accepted_;
  std::string_view loader_;
};

}  // namespace ds::data::detail

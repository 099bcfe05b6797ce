#pragma once
// Internal to src/data: a tokenizer.json post-processor that places special tokens around one
// sequence or a pair (TemplateProcessing, BertProcessing, RobertaProcessing; ByteLevel, which only
// trims offsets, is a no-op; a Sequence of them), for every tokenizer.json model (hf_pipeline.h).
//
//   PairTemplate t = parse_post_processor(j["post_processor"], vocab_size, file, "Unigram",
//                                         {"TemplateProcessing", "BertProcessing"});
//   PairEncoding e = t.apply(ids_a, &ids_b);   // e.g. [CLS] a [SEP] b [SEP] with type ids
//
// Immutable after parsing; apply is const and thread-safe.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/data/text_tokenizer.h"

namespace ds::data::detail {

// One piece of a post-processor template: a special token's ids or sequence A / B.
struct TemplatePiece {
  enum Kind { kSpecial, kA, kB } kind;
  uint32_t type_id = 0;
  std::vector<int32_t> ids;  // kSpecial only
};

struct PairTemplate {
  std::vector<TemplatePiece> single, pair;  // both empty: no post-processor
  // TemplateProcessing: its type ids hold without the special tokens too (Bert/RobertaProcessing:
  // then a is type 0, b type 1).
  bool template_types = false;

  bool empty() const { return single.empty(); }
  // b null: the single template, else the pair template. Without a template: a (type 0), then b
  // (type 1), as `tokenizers` does. specials false: the sequences only, with a TemplateProcessing's
  // type ids (T5's pair template gives B type 0), as `tokenizers` encodes with
  // add_special_tokens=False.
  PairEncoding apply(std::span<const int32_t> a, const std::span<const int32_t>* b,
                     bool specials = true) const;
  // One sequence with the single template's specials around it: encode_sequence(ids, spans)
  // appends the sequence's tokens (and their spans when spans is not null); each special gets an
  // empty span where the sequence's spans end. Without a template: the sequence alone.
  void encode_single(
      const std::function<void(std::vector<int32_t>&, std::vector<TokenSpan>*)>& encode_sequence,
      std::vector<int32_t>& ids, std::vector<TokenSpan>* spans) const;
};

// Parse post_processor (null, or one of the types in accepted); ids must lie in [0, vocab_size).
// loader names the loader in error messages ("WordPiece", "Unigram").
PairTemplate parse_post_processor(const nlohmann::json& j, int32_t vocab_size,
                                  const std::filesystem::path& file, std::string_view loader,
                                  const std::vector<std::string_view>& accepted);

}  // namespace ds::data::detail

#include "ds/models/family.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ds/core/error.h"

namespace ds::models {

const std::vector<GPTFeature>& gpt_features() {
  static const std::vector<GPTFeature> all = {
      {"qk_norm", [](const GPTConfig& c) { return c.qk_norm; }},
      {"partial_rotary_factor", [](const GPTConfig& c) { return c.partial_rotary_factor != 1.0f; }},
      {"rope_interleaved", [](const GPTConfig& c) { return c.rope_interleaved; }},
      {"sandwich_norm", [](const GPTConfig& c) { return c.sandwich_norm; }},
      {"norm_unit_offset", [](const GPTConfig& c) { return c.norm_unit_offset; }},
      {"geglu", [](const GPTConfig& c) { return c.geglu; }},
      {"embed_scale", [](const GPTConfig& c) { return c.embed_scale; }},
      {"query_pre_attn_scalar", [](const GPTConfig& c) { return c.query_pre_attn_scalar != 0.0f; }},
      {"layer_types", [](const GPTConfig& c) { return !c.layer_types.empty(); }},
      {"rope_local_theta", [](const GPTConfig& c) { return c.rope_local_theta != 0.0f; }},
      {"attn_logit_softcapping",
       [](const GPTConfig& c) { return c.attn_logit_softcapping != 0.0f; }},
      {"final_logit_softcapping",
       [](const GPTConfig& c) { return c.final_logit_softcapping != 0.0f; }},
      // LongRoPE's switch (generate() recomputing at the original context) is Phi-3's class's.
      {"rope type longrope", [](const GPTConfig& c) { return c.rope_scaling.type == "longrope"; }},
  };
  return all;
}

void check_features(const Family& f, const GPTConfig& c) {
  for (const GPTFeature& feature : gpt_features()) {
    if (!feature.used(c)) continue;
    if (std::find(f.features.begin(), f.features.end(), feature.name) != f.features.end())
      continue;
    std::vector<std::string> have;
    for (const Family* other : all_families())
      if (std::find(other->features.begin(), other->features.end(), feature.name) !=
          other->features.end())
        have.push_back(other->name);
    DS_THROW("[model] {} needs family {} (got {})", feature.name, fmt::join(have, " or "), f.name);
  }
}

const std::vector<const Family*>& all_families() {
  static const std::vector<const Family*> all = {
      &families::gpt2,   &families::llama,      &families::mistral, &families::qwen2,
      &families::qwen3,  &families::glm,        &families::glm4,    &families::chatglm,
      &families::phi3,   &families::gemma2,     &families::gemma3_text};
  return all;
}

std::string supported_model_types() {
  std::vector<std::string> types;
  for (const Family* f : all_families())
    for (const auto& t : f->model_types) types.push_back(t);
  return fmt::format("{}", fmt::join(types, ", "));
}

const Family& family_for_model_type(const std::string& model_type, const std::string& source) {
  for (const Family* f : all_families())
    for (const auto& t : f->model_types)
      if (t == model_type) return *f;
  // Families our users ask for that another issue brings (docs/models.md "Not yet").
  std::string why;
  if (model_type == "bert" || model_type == "roberta" || model_type == "deberta-v2" ||
      model_type == "deberta")
    why = model_type == "deberta"
              ? "; DeBERTa (v1) is not supported yet (DeBERTa-v2 is, as an encoder classifier)"
              : "; encoder classifiers are read by models::read_hf_encoder_config "
                "(ds/models/encoder_io.h), not as a decoder; ds_train fine-tunes them on a "
                "classification set (ds_prepare --task classification)";
  else if (model_type == "bart" || model_type == "blenderbot" || model_type == "t5" ||
           model_type == "mt5" || model_type == "umt5")
    why = model_type != "mt5" && model_type != "umt5"
              ? "; encoder-decoders are read by models::read_hf_seq2seq_config into a Seq2Seq "
                "(ds/models/seq2seq_io.h), not as a decoder; ds_train fine-tunes them on a seq2seq "
                "set (ds_prepare --task seq2seq)"
              : "; mT5 and UMT5 are not supported yet (t5 is, as a Seq2Seq)";
  else if (model_type == "gemma" || model_type == "gemma3")
    why = model_type == "gemma"
              ? "; Gemma (v1) is not supported yet (gemma2 and gemma3_text are)"
              : "; gemma3 is the multimodal Gemma3ForConditionalGeneration: its text model "
                "(text_config, model_type gemma3_text) is supported, the vision tower not";
  DS_THROW("[hf_io] {}: model_type \"{}\" is not supported (supported: {}){}", source, model_type,
           supported_model_types(), why);
}

const Family& family_of(const GPTConfig& c) {
  const std::string name = c.resolved_family();
  for (const Family* f : all_families())
    if (f->name == name) return *f;
  std::vector<std::string> names;
  for (const Family* f : all_families()) names.push_back(f->name);
  DS_THROW("[model] family \"{}\" is unknown (known: {})", name, fmt::join(names, ", "));
}

const Family& export_family_of(const GPTConfig& c) {
  const Family& f = family_of(c);
  if (f.export_as.empty()) return f;
  for (const Family* g : all_families())
    if (g->name == f.export_as) return *g;
  DS_THROW("[model] internal: family {} exports as unknown family {}", f.name, f.export_as);
}

std::unique_ptr<IncrementalDecoder> make_decoder(std::shared_ptr<const GPT> model) {
  DS_CHECK(model != nullptr, "[generate] make_decoder: no model");
  const Family& f = family_of(model->config());
  DS_CHECK(f.make_decoder != nullptr, "[generate] the {} family has no incremental decoder",
           f.name);
  return f.make_decoder(std::move(model));
}

}  // namespace ds::models

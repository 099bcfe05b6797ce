#include "ds/models/family.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ds/core/error.h"
#include "ds/models/encoder.h"
#include "ds/models/seq2seq.h"

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
      {"moe", [](const GPTConfig& c) { return c.num_experts > 0; }},
      {"moe dense layers",
       [](const GPTConfig& c) {
         return c.num_experts > 0 && (c.decoder_sparse_step != 1 || !c.mlp_only_layers.empty());
       }},
      {"shared expert", [](const GPTConfig& c) { return c.shared_expert_hidden > 0; }},
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
      if (other->kind == f.kind && std::find(other->features.begin(), other->features.end(), feature.name) !=
          other->features.end())
        have.push_back(other->name);
    DS_THROW("[model] {} needs family {} (got {})", feature.name, fmt::join(have, " or "), f.name);
  }
}

const char* model_kind_name(ModelKind kind) {
  switch (kind) {
    case ModelKind::encoder_classifier:
      return "encoder classifier";
    case ModelKind::seq2seq:
      return "encoder-decoder";
    case ModelKind::decoder:
      break;
  }
  return "decoder";
}

bool EncoderParts::is_head(const std::string& ours) const {
  for (const auto& p : head_prefixes)
    if (ours.rfind(p, 0) == 0) return true;
  return false;
}

const std::vector<const Family*>& all_families() {
  static const std::vector<const Family*> all = {
      &families::gpt2,    &families::llama,  &families::mistral,    &families::qwen2,
      &families::qwen3,   &families::glm,    &families::glm4,       &families::chatglm,
      &families::phi3,    &families::gemma,  &families::gemma2,     &families::gemma3_text,
      &families::ernie4_5, &families::mixtral, &families::qwen2_moe, &families::qwen3_moe,
      &families::bert,    &families::roberta, &families::deberta_v2,
      &families::bart,    &families::blenderbot, &families::t5};
  return all;
}

std::string supported_model_types(ModelKind kind) {
  std::vector<std::string> types;
  for (const Family* f : all_families())
    if (f->kind == kind) types.insert(types.end(), f->model_types.begin(), f->model_types.end());
  return fmt::format("{}", fmt::join(types, ", "));
}

const Family* find_family(const std::string& model_type) {
  for (const Family* f : all_families())
    for (const auto& t : f->model_types)
      if (t == model_type) return f;
  return nullptr;
}

namespace {

// Why a model_type no family reads is refused: the types users ask for that we do not have yet
// (docs/models.md "Not yet").
std::string why_unsupported(const std::string& model_type) {
  if (model_type == "deberta") return "; DeBERTa (v1) is not supported (DeBERTa-v2 is)";
  if (model_type == "mt5" || model_type == "umt5")
    return "; mT5 and UMT5 are not supported yet (t5 is)";
  // Mixtures of experts whose layers differ from the two we have (docs/models.md "Not yet").
  if (model_type == "deepseek_v3")
    return "; DeepSeek-V3 (multi-head latent attention, shared experts, grouped sigmoid routing, "
           "dense first layers) is not supported; the mixture-of-experts families are "
           "mixtral, qwen2_moe and qwen3_moe";
  if (model_type == "gpt_oss")
    return "; GPT-OSS (attention sinks, experts with biases and a clamped SwiGLU, MXFP4 weights) "
           "is not supported; the mixture-of-experts families are mixtral, qwen2_moe and qwen3_moe";
  if (model_type == "gemma3")
    return "; gemma3 is the multimodal Gemma3ForConditionalGeneration: its text model "
           "(text_config, model_type gemma3_text) is supported, the vision tower not";
  return "";
}

// How a model of another kind is read and trained instead.
std::string how_kind_is_used(ModelKind kind) {
  switch (kind) {
    case ModelKind::encoder_classifier:
      return "models::read_hf_encoder_config reads it; ds_train fine-tunes it on a classification "
             "set (ds_prepare --task classification)";
    case ModelKind::seq2seq:
      return "models::read_hf_seq2seq_config reads it; ds_train fine-tunes it on a seq2seq set "
             "(ds_prepare --task seq2seq)";
    case ModelKind::decoder:
      break;
  }
  return "models::read_hf_config reads it; ds_train trains it as a language model";
}

}  // namespace

const Family& family_for_model_type(const std::string& model_type, const std::string& source,
                                    ModelKind kind) {
  const Family* f = find_family(model_type);
  if (f && f->kind == kind) return *f;
  const std::string why =
      f ? fmt::format("; it is an {} ({}): {}", model_kind_name(f->kind), f->architecture,
                      how_kind_is_used(f->kind))
        : why_unsupported(model_type);
  DS_THROW("[hf_io] {}: model_type \"{}\" is not supported as a{} {} (supported: {}){}", source,
           model_type, kind == ModelKind::decoder ? "" : "n", model_kind_name(kind),
           supported_model_types(kind), why);
}

const Family& family_named(const std::string& name, ModelKind kind) {
  std::vector<std::string> names;
  for (const Family* f : all_families()) {
    if (f->kind != kind) continue;
    if (f->name == name) return *f;
    names.push_back(f->name);
  }
  DS_THROW("[model] {} family \"{}\" is unknown (known: {})", model_kind_name(kind), name,
           fmt::join(names, ", "));
}

const Family& family_of(const GPTConfig& c) {
  return family_named(c.resolved_family(), ModelKind::decoder);
}

const Family& family_of(const EncoderConfig& c) {
  return family_named(c.family, ModelKind::encoder_classifier);
}

const Family& family_of(const Seq2SeqConfig& c) {
  return family_named(c.family, ModelKind::seq2seq);
}

const Family& export_family_of(const GPTConfig& c) {
  const Family& f = family_of(c);
  return f.export_as.empty() ? f : family_named(f.export_as, ModelKind::decoder);
}

std::unique_ptr<IncrementalDecoder> make_decoder(std::shared_ptr<const GPT> model) {
  DS_CHECK(model != nullptr, "[generate] make_decoder: no model");
  const Family& f = family_of(model->config());
  DS_CHECK(f.decoder.make_decoder != nullptr, "[generate] the {} family has no incremental decoder",
           f.name);
  return f.decoder.make_decoder(std::move(model));
}

std::unique_ptr<IncrementalDecoder> make_decoder(std::shared_ptr<Seq2Seq> model) {
  DS_CHECK(model != nullptr, "[generate] make_decoder: no model");
  const Family& f = family_of(model->config());
  DS_CHECK(f.seq2seq.make_decoder != nullptr, "[generate] the {} family has no incremental decoder",
           f.name);
  return f.seq2seq.make_decoder(std::move(model));
}

std::shared_ptr<SequenceClassifier> make_encoder_classifier(const EncoderConfig& c, bool init) {
  return family_of(c).encoder.build(c, init);
}

}  // namespace ds::models

// Gemma 2 and Gemma 3 (text): Gemma2ForCausalLM ("gemma2") and Gemma3ForCausalLM ("gemma3_text")
// (transformers 5; 4.x configs read too). The llama layout with Gemma's choices, each a GPTConfig
// feature:
//   RMSNorm scaling by (1 + w) (norm_unit_offset), q/k RMSNorm per head (qk_norm), a norm after
//   attention and after the MLP (sandwich_norm), GeGLU with gelu_pytorch_tanh (geglu), token
//   embeddings times sqrt(hidden_size) (embed_scale), scores scaled by query_pre_attn_scalar^-0.5,
//   a tied head, and per-layer attention: "sliding_attention" layers see their last
//   sliding_window keys with rotary base rope_local_base_freq (layer_types, sliding_window,
//   rope_local_theta), "full_attention" layers see every key with rope_theta and rope scaling.
// Gemma 2 has no q/k norms, one rotary base for every layer, alternating sliding and full layers,
// and soft-caps the attention scores and the logits, cap * tanh(x / cap)
// (attn_logit_softcapping 50, final_logit_softcapping 30 by default).
//
//   model.embed_tokens.weight, model.layers.{i}.input_layernorm.weight,
//   model.layers.{i}.self_attn.{q,k,v,o}_proj.weight, model.layers.{i}.self_attn.{q,k}_norm.weight,
//   model.layers.{i}.post_attention_layernorm.weight   (ours: post_self_attn_layernorm),
//   model.layers.{i}.pre_feedforward_layernorm.weight  (ours: post_attention_layernorm),
//   model.layers.{i}.mlp.{gate,up,down}_proj.weight,
//   model.layers.{i}.post_feedforward_layernorm.weight (ours: post_mlp_layernorm),
//   model.norm.weight; lm_head.weight only when untied. (Gemma 2: no q_norm / k_norm.)
// Our blocks are nn::LlamaBlock with sandwich norms, whose names are GLM-4's: place() maps them.
// Gemma 3's attn_logit_softcapping is refused by name: transformers 5.24's Gemma3Attention stores
// it but never applies it.
#include <regex>

#include "ds/core/error.h"
#include "ds/models/family.h"
#include "hf_config.h"

namespace ds::models {

namespace {

using nlohmann::json;

constexpr const char* kSliding = "sliding_attention";
constexpr const char* kFull = "full_attention";

// Defaults from transformers 5.24's configuration_gemma2.py and configuration_gemma3.py
// (Gemma3TextConfig).
hf::DecoderDefaults defaults_of(const std::string& type) {
  const bool g3 = type == "gemma3_text";
  hf::DecoderDefaults d;
  d.vocab_size = g3 ? 262208 : 256000;
  d.max_positions = g3 ? 131072 : 8192;
  d.hidden_size = 2304;
  d.layers = 26;
  d.heads = 8;
  d.kv_heads = 4;
  d.head_dim = 256;
  d.rms_norm_eps = 1e-6f;
  d.tie_word_embeddings = true;
  return d;
}

bool has(const json& j, const char* key) {
  return j.contains(key) && !j[key].is_null();
}

// The rope parameters of the full-attention layers (written back as a flat transformers 5
// rope_parameters for hf::read_decoder_fields) and the sliding layers' rotary base. 5.x nests
// them by layer type; 4.x has rope_theta / rope_scaling for the full layers and
// rope_local_base_freq for the sliding ones.
double split_rope(const json& j, const std::string& source, json& jj) {
  json full = json::object(), local = json::object();
  if (has(j, "rope_parameters")) {
    const json& rp = j["rope_parameters"];
    DS_CHECK(rp.is_object() && rp.contains(kFull) && rp.contains(kSliding),
             "[hf_io] {}: rope_parameters must hold \"full_attention\" and \"sliding_attention\" "
             "(got {})",
             source, rp.dump());
    full = rp[kFull].is_null() ? json::object() : rp[kFull];
    local = rp[kSliding].is_null() ? json::object() : rp[kSliding];
  }
  if (has(j, "rope_scaling")) full.update(j["rope_scaling"]);
  if (!full.contains("rope_theta"))
    full["rope_theta"] = has(j, "rope_theta") ? j["rope_theta"] : json(1e6);
  if (!full.contains("rope_type") && !full.contains("type")) full["rope_type"] = "default";
  if (!local.contains("rope_theta"))
    local["rope_theta"] = has(j, "rope_local_base_freq") ? j["rope_local_base_freq"] : json(1e4);
  const std::string ltype = local.value("rope_type", std::string("default"));
  DS_CHECK(ltype == "default" && local.size() <= 2 && local["rope_theta"].is_number(),
           "[hf_io] {}: rope_parameters.sliding_attention {} is not supported (rope_type default "
           "with a rope_theta only)",
           source, local.dump());
  for (const char* k : {"rope_parameters", "rope_scaling", "rope_theta", "rope_local_base_freq"})
    jj.erase(k);
  jj["rope_parameters"] = full;
  return local["rope_theta"].get<double>();
}

// layer_types, or (4.x) sliding_window_pattern's (6 for Gemma 3, 2 for Gemma 2): every pattern-th
// layer full, the rest sliding.
std::vector<std::string> layer_types_of(const json& j, int64_t n_layer, int64_t default_pattern,
                                        const std::string& source) {
  std::vector<std::string> types;
  if (has(j, "layer_types")) {
    try {
      types = j["layer_types"].get<std::vector<std::string>>();
    } catch (const json::exception&) {
      DS_THROW("[hf_io] {}: layer_types must be a list of strings, got {}", source,
               j["layer_types"].dump());
    }
    DS_CHECK(static_cast<int64_t>(types.size()) == n_layer,
             "[hf_io] {}: layer_types has {} entries for num_hidden_layers {}", source,
             types.size(), n_layer);
    for (const auto& t : types)
      DS_CHECK(t == kFull || t == kSliding,
               "[hf_io] {}: layer_types entry \"{}\" is not supported (full_attention, "
               "sliding_attention)",
               source, t);
    return types;
  }
  const int64_t pattern =
      hf::get_field<int64_t>(j, "sliding_window_pattern", default_pattern, source);
  DS_CHECK(pattern > 0, "[hf_io] {}: sliding_window_pattern {} must be positive", source, pattern);
  for (int64_t i = 0; i < n_layer; ++i) types.push_back((i + 1) % pattern ? kSliding : kFull);
  return types;
}

// Switches whose other values change the math in ways this class does not express.
void refuse_unsupported(const json& j, const std::string& type, const std::string& source) {
  DS_CHECK(type != "gemma3_text" || !has(j, "attn_logit_softcapping"),
           "[hf_io] {}: attn_logit_softcapping {} is not supported for gemma3_text: transformers "
           "5.24's Gemma3Attention never applies it, so what it means is unclear (Gemma 3 "
           "checkpoints have null)",
           source, has(j, "attn_logit_softcapping") ? j["attn_logit_softcapping"].dump() : "");
  DS_CHECK(!hf::get_field<bool>(j, "attention_bias", false, source),
           "[hf_io] {}: attention_bias true is not supported for {}", source, type);
  DS_CHECK(!hf::get_field<bool>(j, "use_bidirectional_attention", false, source),
           "[hf_io] {}: use_bidirectional_attention true (EmbeddingGemma's encoder attention) is "
           "not supported; decoders attend causally",
           source);
  for (const char* k : {"hidden_activation", "hidden_act"}) {
    const auto act = hf::get_field<std::string>(j, k, "gelu_pytorch_tanh", source);
    DS_CHECK(act == "gelu_pytorch_tanh",
             "[hf_io] {}: {} \"{}\" is not supported (Gemma uses gelu_pytorch_tanh)", source, k,
             act);
  }
}

// A soft-capping field: absent = the class's default, null = none (0).
float softcap_field(const json& j, const char* key, float fallback, const std::string& source) {
  if (!j.contains(key)) return fallback;
  const float v = hf::get_field<float>(j, key, 0.0f, source);
  DS_CHECK(v >= 0.0f && std::isfinite(v), "[hf_io] {}: {} {} must be positive or null", source, key,
           v);
  return v;
}

GPTConfig read(const json& j, const std::string& type, const std::string& source) {
  const bool g3 = type == "gemma3_text";
  std::set<std::string> handled = hf::decoder_fields();
  handled.insert({"hidden_activation", "query_pre_attn_scalar", "sliding_window", "layer_types",
                  "sliding_window_pattern", "final_logit_softcapping", "attn_logit_softcapping",
                  "attention_bias", "use_bidirectional_attention", "cache_implementation",
                  "initializer_range"});
  if (g3) handled.insert("rope_local_base_freq");
  hf::check_known_fields(j, handled, type, source);
  refuse_unsupported(j, type, source);
  json jj = j;
  jj.erase("hidden_activation");
  jj.erase("hidden_act");  // checked above: read_decoder_fields knows silu only
  const double local_theta = g3 ? split_rope(j, source, jj) : 0.0;
  GPTConfig c = hf::read_decoder_fields(jj, type, source, defaults_of(type));
  DS_CHECK(c.partial_rotary_factor == 1.0f,
           "[hf_io] {}: partial_rotary_factor {} is not supported for {}", source,
           c.partial_rotary_factor, type);
  c.sandwich_norm = c.norm_unit_offset = c.geglu = c.embed_scale = true;
  c.qk_norm = g3;
  c.rope_local_theta = static_cast<float>(local_theta);
  c.final_logit_softcapping =
      softcap_field(j, "final_logit_softcapping", g3 ? 0.0f : 30.0f, source);
  c.attn_logit_softcapping = g3 ? 0.0f : softcap_field(j, "attn_logit_softcapping", 50.0f, source);
  c.query_pre_attn_scalar = hf::get_field<float>(j, "query_pre_attn_scalar", 256.0f, source);
  DS_CHECK(c.query_pre_attn_scalar > 0.0f, "[hf_io] {}: query_pre_attn_scalar {} must be positive",
           source, c.query_pre_attn_scalar);
  c.layer_types = layer_types_of(j, c.n_layer, g3 ? 6 : 2, source);
  c.sliding_window = hf::get_field<int64_t>(j, "sliding_window", 4096, source);
  DS_CHECK(c.sliding_window > 0, "[hf_io] {}: sliding_window {} must be positive", source,
           c.sliding_window);
  return c;
}

json write(const GPTConfig& c) {
  json j = hf::write_decoder_fields(c);
  j.erase("hidden_act");
  j["hidden_activation"] = "gelu_pytorch_tanh";
  const bool g3 = c.resolved_family() == "gemma3_text";
  if (g3)
    j["rope_parameters"] = {
        {kFull, hf::rope_parameters(c)},
        {kSliding,
         {{"rope_type", "default"},
          {"rope_theta",
           hf::shortest(c.rope_local_theta > 0.0f ? c.rope_local_theta : c.rope_theta)}}}};
  auto cap = [](float v) { return v > 0.0f ? json(hf::shortest(v)) : json(nullptr); };
  // An int in transformers' (strict) config class; our float holds it exactly.
  const float qs =
      c.query_pre_attn_scalar > 0.0f ? c.query_pre_attn_scalar : static_cast<float>(c.head_dim());
  j["query_pre_attn_scalar"] =
      qs == std::trunc(qs) ? json(static_cast<int64_t>(qs)) : json(hf::shortest(qs));
  j["sliding_window"] = c.sliding_window > 0 ? c.sliding_window : c.block_size;
  j["layer_types"] = c.layer_types.empty()
                         ? std::vector<std::string>(static_cast<size_t>(c.n_layer), kFull)
                         : c.layer_types;
  j["final_logit_softcapping"] = cap(c.final_logit_softcapping);
  j["attn_logit_softcapping"] = cap(c.attn_logit_softcapping);
  j["attention_bias"] = false;
  j["use_bidirectional_attention"] = false;
  return j;
}

HFPlace place(const GPTConfig&, const std::string& ours) {
  if (ours == "lm_head.weight") return {ours};
  static const std::regex layer(R"((layers\.\d+\.)(.*))");
  std::smatch m;
  if (std::regex_match(ours, m, layer)) {
    const std::string p = "model." + m[1].str(), rest = m[2].str();
    if (rest == "post_self_attn_layernorm.weight") return {p + "post_attention_layernorm.weight"};
    if (rest == "post_attention_layernorm.weight") return {p + "pre_feedforward_layernorm.weight"};
    if (rest == "post_mlp_layernorm.weight") return {p + "post_feedforward_layernorm.weight"};
  }
  return {"model." + ours};
}

bool is_buffer(const std::string& name) {
  static const std::regex rotary(R"((model\.)?(layers\.\d+\.self_attn\.)?rotary_emb\..*inv_freq)");
  return std::regex_match(name, rotary);
}

void check(const GPTConfig& c) {
  const std::string fam = c.resolved_family();
  const bool g3 = fam == "gemma3_text";
  DS_CHECK(c.layout == nn::Layout::llama, "[model] family {} needs the llama layout", fam);
  DS_CHECK(c.sandwich_norm && c.norm_unit_offset && c.geglu && c.embed_scale,
           "[model] family {} has sandwich norms, (1 + w) norms, GeGLU and scaled embeddings: "
           "sandwich_norm, norm_unit_offset, geglu and embed_scale true",
           fam);
  DS_CHECK(c.qk_norm == g3, "[model] family {} {} q/k norms (qk_norm {})", fam,
           g3 ? "has" : "has no", g3);
  DS_CHECK(!c.bias && !c.qkv_bias, "[model] family {} has no biases", fam);
}

Family make(const std::string& name, const std::string& arch) {
  Family f;
  f.name = name;
  f.model_types = {name};
  f.architecture = arch;
  f.decoder.layout = nn::Layout::llama;
  f.lora_targets = {"q_proj", "v_proj"};
  f.prefix = "model.";
  // Gemma 3 adds q/k norms and a rotary base of its own for the sliding layers, and stores but
  // never applies attn_logit_softcapping (transformers 5.24's Gemma3Attention).
  f.features = {"sandwich_norm",  "norm_unit_offset", "geglu",
                "embed_scale",    "query_pre_attn_scalar", "layer_types",
                "final_logit_softcapping"};
  if (name == "gemma2") f.features.push_back("attn_logit_softcapping");
  if (name == "gemma3_text") f.features.insert(f.features.end(), {"qk_norm", "rope_local_theta"});
  f.decoder.read_config = read;
  f.decoder.write_config = write;
  f.decoder.place = place;
  f.is_buffer = is_buffer;
  f.decoder.check = check;
  return f;
}

}  // namespace

namespace families {
const Family gemma2 = make("gemma2", "Gemma2ForCausalLM");
const Family gemma3_text = make("gemma3_text", "Gemma3ForCausalLM");
}  // namespace families

}  // namespace ds::models

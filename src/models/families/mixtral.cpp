// Mixtral: MixtralForCausalLM (transformers 5; 4.x configs and per-expert files read too). The
// llama layout with every block's MLP a mixture of experts (nn::MoEMLP):
//
//   model.embed_tokens.weight, model.layers.{i}.input_layernorm.weight,
//   model.layers.{i}.self_attn.{q,k,v,o}_proj.weight, ...post_attention_layernorm.weight,
//   model.layers.{i}.mlp.gate.weight                  (E, C)      the router
//   model.layers.{i}.mlp.experts.gate_up_proj         (E, 2I, C)  [w1; w3] of each expert
//   model.layers.{i}.mlp.experts.down_proj            (E, C, I)   w2 of each expert
//   model.norm.weight, lm_head.weight
//
// transformers 4.x files name them block_sparse_moe.gate.weight and
// block_sparse_moe.experts.{j}.w1/w2/w3.weight (one (I, C) / (C, I) tensor per expert):
// the import assembles ours from those (DecoderParts::legacy_pieces); export writes 5.x names.
#include <regex>

#include "ds/core/error.h"
#include "ds/models/family.h"
#include "hf_config.h"

namespace ds::models {

namespace {

using nlohmann::json;

// MixtralConfig's defaults (transformers 5's configuration_mixtral.py).
hf::DecoderDefaults defaults() {
  hf::DecoderDefaults d;
  d.max_positions = 4096 * 32;
  d.hidden_size = 4096;
  d.kv_heads = 8;
  d.rms_norm_eps = 1e-5f;
  return d;
}

GPTConfig read(const json& j, const std::string& type, const std::string& source) {
  std::set<std::string> handled = hf::decoder_fields();
  handled.insert({"sliding_window", "num_experts_per_tok", "num_local_experts",
                  "output_router_logits", "router_aux_loss_coef", "router_jitter_noise"});
  hf::check_known_fields(j, handled, type, source);
  hf::DecoderDefaults d = defaults();
  // intermediate_size defaults to 14336 in MixtralConfig; read_decoder_fields takes it when given.
  GPTConfig c = hf::read_decoder_fields(j, type, source, d);
  if (!j.contains("intermediate_size")) c.ffn_hidden = 14336;
  DS_CHECK(c.partial_rotary_factor == 1.0f,
           "[hf_io] {}: partial_rotary_factor {} is not supported for model_type mixtral", source,
           c.partial_rotary_factor);
  const int64_t w = hf::get_field<int64_t>(j, "sliding_window", 0, source);
  DS_CHECK(w >= 0, "[hf_io] {}: sliding_window {} must be >= 0", source, w);
  if (w > 0) {  // as mistral: sequences limited to the window instead of implementing it
    c.sliding_window = w;
    c.block_size = std::min(c.block_size, w);
  }
  c.num_experts = hf::get_field<int64_t>(j, "num_local_experts", 8, source);
  c.experts_per_tok = hf::get_field<int64_t>(j, "num_experts_per_tok", 2, source);
  DS_CHECK(c.num_experts >= 1 && c.experts_per_tok >= 1 && c.experts_per_tok <= c.num_experts,
           "[hf_io] {}: num_local_experts {} and num_experts_per_tok {} must satisfy 1 <= "
           "num_experts_per_tok <= num_local_experts",
           source, c.num_experts, c.experts_per_tok);
  c.moe_ffn_hidden = c.ffn_hidden;
  c.norm_topk_prob = true;  // MixtralTopKRouter always renormalises
  c.output_router_logits = hf::get_field<bool>(j, "output_router_logits", false, source);
  c.router_aux_loss_coef = hf::get_field<float>(j, "router_aux_loss_coef", 0.001f, source);
  const float jitter = hf::get_field<float>(j, "router_jitter_noise", 0.0f, source);
  DS_CHECK(
      jitter == 0.0f,
      "[hf_io] {}: router_jitter_noise {} is not supported (training-time multiplicative noise "
      "on the router's input); set it to 0",
      source, jitter);
  return c;
}

json write(const GPTConfig& c) {
  json j = hf::write_decoder_fields(c);
  j["intermediate_size"] = c.resolved_moe_ffn_hidden();
  j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
  j["num_local_experts"] = c.num_experts;
  j["num_experts_per_tok"] = c.experts_per_tok;
  j["output_router_logits"] = c.output_router_logits;
  j["router_aux_loss_coef"] = hf::shortest(c.router_aux_loss_coef);
  j["router_jitter_noise"] = 0.0;
  return j;
}

HFPlace place(const GPTConfig&, const std::string& ours) {
  if (ours == "lm_head.weight") return {ours};
  return {"model." + ours};
}

// transformers 4.x's per-expert tensors (block_sparse_moe.*), read on import.
std::vector<HFPiece> legacy_pieces(const GPTConfig& c, const std::string& ours) {
  static const std::regex moe(
      R"(layers\.(\d+)\.mlp\.(gate\.weight|experts\.gate_up_proj|experts\.down_proj))");
  std::smatch m;
  if (!std::regex_match(ours, m, moe)) return {};
  const std::string layer = "model.layers." + m[1].str() + ".block_sparse_moe.";
  const int64_t E = c.num_experts, C = c.n_embd, I = c.resolved_moe_ffn_hidden();
  if (m[2] == "gate.weight") return {{layer + "gate.weight", {E, C}}};
  std::vector<HFPiece> pieces;
  for (int64_t j = 0; j < E; ++j) {
    const std::string e = layer + "experts." + std::to_string(j) + ".";
    if (m[2] == "experts.down_proj") {
      pieces.push_back({e + "w2.weight", {C, I}});
    } else {
      pieces.push_back({e + "w1.weight", {I, C}});  // gate
      pieces.push_back({e + "w3.weight", {I, C}});  // up
    }
  }
  return pieces;
}

bool is_buffer(const std::string& name) {
  static const std::regex rotary(R"((model\.)?layers\.\d+\.self_attn\.rotary_emb\.inv_freq)");
  return std::regex_match(name, rotary);
}

void check(const GPTConfig& c) {
  DS_CHECK(c.layout == nn::Layout::llama, "[model] family mixtral needs the llama layout");
  DS_CHECK(c.num_experts > 0,
           "[model] family mixtral needs num_experts > 0 (a mixture of experts)");
  DS_CHECK(!c.bias && !c.qkv_bias, "[model] family mixtral has no biases");
  DS_CHECK(c.norm_topk_prob,
           "[model] family mixtral always renormalises the top-k routing weights "
           "(norm_topk_prob true)");
  DS_CHECK(c.moe_ffn_hidden == 0 || c.moe_ffn_hidden == c.resolved_ffn_hidden(),
           "[model] family mixtral's experts have the width ffn_hidden ({}), got moe_ffn_hidden {}",
           c.resolved_ffn_hidden(), c.moe_ffn_hidden);
}

Family make() {
  Family f;
  f.name = "mixtral";
  f.model_types = {"mixtral"};
  f.architecture = "MixtralForCausalLM";
  f.decoder.layout = nn::Layout::llama;
  f.lora_targets = {"q_proj", "v_proj"};
  f.prefix = "model.";
  f.features = {"moe"};
  f.decoder.read_config = read;
  f.decoder.write_config = write;
  f.decoder.place = place;
  f.decoder.legacy_pieces = legacy_pieces;
  f.is_buffer = is_buffer;
  f.decoder.check = check;
  return f;
}

}  // namespace

namespace families {
const Family mixtral = make();
}  // namespace families

}  // namespace ds::models

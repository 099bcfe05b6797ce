// Qwen2-MoE: Qwen2MoeForCausalLM (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B; transformers 5, 4.x
// per-expert files read too). Qwen2's attention (q/k/v biases, qkv_bias) with a mixture of experts
// and a shared expert in every sparse block (nn::MoEMLP):
//
//   model.layers.{i}.mlp.gate.weight                          (E, C)      the router
//   model.layers.{i}.mlp.experts.gate_up_proj                 (E, 2I, C)  [gate_proj; up_proj]
//   model.layers.{i}.mlp.experts.down_proj                    (E, C, I)
//   model.layers.{i}.mlp.shared_expert.{gate,up,down}_proj.weight        a SwiGLU MLP of width S
//   model.layers.{i}.mlp.shared_expert_gate.weight            (1, C)      sigmoid gate of it
//
// Dense layers among the sparse ones (mlp_only_layers, decoder_sparse_step) are SwiGLU MLPs of
// intermediate_size (mlp.{gate,up,down}_proj).
#include "ds/core/error.h"
#include "ds/models/family.h"
#include "hf_config.h"
#include "qwen_moe.h"

namespace ds::models {

namespace {

using nlohmann::json;

// Qwen2MoeConfig's defaults (transformers 5's configuration_qwen2_moe.py).
hf::DecoderDefaults defaults() {
  hf::DecoderDefaults d;
  d.vocab_size = 151936;
  d.max_positions = 32768;
  d.hidden_size = 2048;
  d.layers = 24;
  d.kv_heads = 16;
  return d;
}

GPTConfig read(const json& j, const std::string& type, const std::string& source) {
  std::set<std::string> handled = hf::decoder_fields();
  const std::set<std::string> moe = qwen_moe::fields();
  handled.insert(moe.begin(), moe.end());
  handled.insert({"qkv_bias", "shared_expert_intermediate_size"});
  hf::check_known_fields(j, handled, type, source);
  GPTConfig c = hf::read_decoder_fields(j, type, source, defaults());
  if (!j.contains("intermediate_size")) c.ffn_hidden = 5632;
  DS_CHECK(c.partial_rotary_factor == 1.0f,
           "[hf_io] {}: partial_rotary_factor {} is not supported for model_type qwen2_moe", source,
           c.partial_rotary_factor);
  c.qkv_bias = hf::get_field<bool>(j, "qkv_bias", true, source);
  qwen_moe::read_moe(j, c, {.num_experts = 60, .experts_per_tok = 4, .moe_hidden = 1408}, type,
                     source);
  c.shared_expert_hidden =
      hf::get_field<int64_t>(j, "shared_expert_intermediate_size", 5632, source);
  DS_CHECK(c.shared_expert_hidden >= 1,
           "[hf_io] {}: shared_expert_intermediate_size {} must be positive", source,
           c.shared_expert_hidden);
  return c;
}

json write(const GPTConfig& c) {
  json j = hf::write_decoder_fields(c);
  j["qkv_bias"] = c.qkv_bias;
  qwen_moe::write_moe(c, j);
  j["shared_expert_intermediate_size"] = c.shared_expert_hidden;
  return j;
}

void check(const GPTConfig& c) {
  DS_CHECK(c.layout == nn::Layout::llama, "[model] family qwen2_moe needs the llama layout");
  DS_CHECK(c.num_experts > 0 && c.shared_expert_hidden > 0,
           "[model] family qwen2_moe needs num_experts > 0 and a shared expert "
           "(shared_expert_hidden > 0)");
  DS_CHECK(!c.qk_norm && !c.bias, "[model] family qwen2_moe has no q/k norms and no o_proj or MLP "
                                  "biases (qkv_bias only)");
  DS_CHECK(c.sliding_window == 0, "[model] family qwen2_moe has no sliding window here");
}

Family make() {
  Family f = qwen_moe::family();
  f.name = "qwen2_moe";
  f.model_types = {"qwen2_moe"};
  f.architecture = "Qwen2MoeForCausalLM";
  f.features = {"moe", "moe dense layers", "shared expert"};
  f.decoder.read_config = read;
  f.decoder.write_config = write;
  f.decoder.check = check;
  return f;
}

}  // namespace

namespace families {
const Family qwen2_moe = make();
}  // namespace families

}  // namespace ds::models

// Qwen3-MoE: Qwen3MoeForCausalLM (transformers 5; 4.x per-expert files read too). Qwen3's
// attention (q/k RMSNorms, no biases) with every block's MLP a mixture of experts (nn::MoEMLP):
//
//   model.layers.{i}.mlp.gate.weight                  (E, C)      the router
//   model.layers.{i}.mlp.experts.gate_up_proj         (E, 2I, C)  [gate_proj; up_proj] per expert
//   model.layers.{i}.mlp.experts.down_proj            (E, C, I)
//
// 4.x files hold mlp.experts.{j}.{gate,up,down}_proj.weight per expert (DecoderParts::
// legacy_pieces); export writes 5.x names. Dense layers among the sparse ones (mlp_only_layers,
// decoder_sparse_step > 1) are SwiGLU MLPs of intermediate_size (mlp.{gate,up,down}_proj).
#include "ds/core/error.h"
#include "ds/models/family.h"
#include "hf_config.h"
#include "qwen_moe.h"

namespace ds::models {

namespace {

using nlohmann::json;

// Qwen3MoeConfig's defaults (transformers 5's configuration_qwen3_moe.py).
hf::DecoderDefaults defaults() {
  hf::DecoderDefaults d;
  d.vocab_size = 151936;
  d.max_positions = 32768;
  d.hidden_size = 2048;
  d.layers = 24;
  d.kv_heads = 4;
  return d;
}

GPTConfig read(const json& j, const std::string& type, const std::string& source) {
  std::set<std::string> handled = hf::decoder_fields();
  const std::set<std::string> moe = qwen_moe::fields();
  handled.insert(moe.begin(), moe.end());
  handled.insert("attention_bias");
  hf::check_known_fields(j, handled, type, source);
  GPTConfig c = hf::read_decoder_fields(j, type, source, defaults());
  if (!j.contains("intermediate_size")) c.ffn_hidden = 6144;
  DS_CHECK(c.partial_rotary_factor == 1.0f,
           "[hf_io] {}: partial_rotary_factor {} is not supported for model_type qwen3_moe", source,
           c.partial_rotary_factor);
  DS_CHECK(!hf::get_field<bool>(j, "attention_bias", false, source),
           "[hf_io] {}: attention_bias true is not supported for qwen3_moe", source);
  c.qk_norm = true;
  qwen_moe::read_moe(j, c, {.num_experts = 128, .experts_per_tok = 8, .moe_hidden = 768}, type,
                     source);
  return c;
}

json write(const GPTConfig& c) {
  json j = hf::write_decoder_fields(c);
  j["attention_bias"] = false;
  qwen_moe::write_moe(c, j);
  return j;
}

void check(const GPTConfig& c) {
  DS_CHECK(c.layout == nn::Layout::llama, "[model] family qwen3_moe needs the llama layout");
  DS_CHECK(c.num_experts > 0,
           "[model] family qwen3_moe needs num_experts > 0 (a mixture of experts)");
  DS_CHECK(c.qk_norm && !c.bias && !c.qkv_bias,
           "[model] family qwen3_moe has qk_norm and no biases");
  DS_CHECK(c.sliding_window == 0, "[model] family qwen3_moe has no sliding window here");
}

Family make() {
  Family f = qwen_moe::family();
  f.name = "qwen3_moe";
  f.model_types = {"qwen3_moe"};
  f.architecture = "Qwen3MoeForCausalLM";
  f.features = {"qk_norm", "moe", "moe dense layers"};
  f.decoder.read_config = read;
  f.decoder.write_config = write;
  f.decoder.check = check;
  return f;
}

}  // namespace

namespace families {
const Family qwen3_moe = make();
}  // namespace families

}  // namespace ds::models

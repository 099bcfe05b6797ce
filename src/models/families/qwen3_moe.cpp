// Qwen3-MoE: Qwen3MoeForCausalLM (transformers 5; 4.x per-expert files read too). Qwen3's
// attention (q/k RMSNorms, no biases) with every block's MLP a mixture of experts (nn::MoEMLP):
//
//   model.layers.{i}.mlp.gate.weight                  (E, C)      the router
//   model.layers.{i}.mlp.experts.gate_up_proj         (E, 2I, C)  [gate_proj; up_proj] per expert
//   model.layers.{i}.mlp.experts.down_proj            (E, C, I)
//
// 4.x files hold mlp.experts.{j}.{gate,up,down}_proj.weight per expert (DecoderParts::
// legacy_pieces); export writes 5.x names. Dense layers among the sparse ones (mlp_only_layers,
// decoder_sparse_step > 1) are refused: every layer here is a mixture of experts.
#include <regex>

#include "ds/core/error.h"
#include "ds/models/family.h"
#include "hf_config.h"

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

void check_all_sparse(const json& j, int64_t layers, const std::string& source) {
  const int64_t step = hf::get_field<int64_t>(j, "decoder_sparse_step", 1, source);
  DS_CHECK(step == 1,
           "[hf_io] {}: decoder_sparse_step {} (dense MLP layers between the sparse ones) is not "
           "supported: every layer must be a mixture of experts",
           source, step);
  if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null())
    DS_CHECK(j["mlp_only_layers"].empty(),
             "[hf_io] {}: mlp_only_layers {} (dense MLP layers) is not supported: every layer must "
             "be a mixture of experts",
             source, j["mlp_only_layers"].dump());
  const int64_t window_layers = hf::get_field<int64_t>(j, "max_window_layers", layers, source);
  DS_CHECK(!hf::get_field<bool>(j, "use_sliding_window", false, source) || window_layers >= layers,
           "[hf_io] {}: use_sliding_window true is not supported: sliding-window attention is not "
           "implemented for qwen3_moe",
           source);
}

GPTConfig read(const json& j, const std::string& type, const std::string& source) {
  std::set<std::string> handled = hf::decoder_fields();
  handled.insert({"attention_bias", "use_sliding_window", "sliding_window", "max_window_layers",
                  "decoder_sparse_step", "moe_intermediate_size", "num_experts_per_tok",
                  "num_experts", "num_local_experts", "norm_topk_prob", "output_router_logits",
                  "router_aux_loss_coef", "mlp_only_layers"});
  hf::check_known_fields(j, handled, type, source);
  GPTConfig c = hf::read_decoder_fields(j, type, source, defaults());
  if (!j.contains("intermediate_size")) c.ffn_hidden = 6144;
  DS_CHECK(c.partial_rotary_factor == 1.0f,
           "[hf_io] {}: partial_rotary_factor {} is not supported for model_type qwen3_moe", source,
           c.partial_rotary_factor);
  DS_CHECK(!hf::get_field<bool>(j, "attention_bias", false, source),
           "[hf_io] {}: attention_bias true is not supported for qwen3_moe", source);
  check_all_sparse(j, c.n_layer, source);
  c.qk_norm = true;
  // transformers 5 saves num_experts as num_local_experts (Qwen3MoeConfig's attribute_map);
  // released configs say num_experts.
  c.num_experts = hf::get_field<int64_t>(
      j, "num_local_experts", hf::get_field<int64_t>(j, "num_experts", 128, source), source);
  c.experts_per_tok = hf::get_field<int64_t>(j, "num_experts_per_tok", 8, source);
  DS_CHECK(c.num_experts >= 1 && c.experts_per_tok >= 1 && c.experts_per_tok <= c.num_experts,
           "[hf_io] {}: num_experts {} and num_experts_per_tok {} must satisfy 1 <= "
           "num_experts_per_tok <= num_experts",
           source, c.num_experts, c.experts_per_tok);
  c.moe_ffn_hidden = hf::get_field<int64_t>(j, "moe_intermediate_size", 768, source);
  DS_CHECK(c.moe_ffn_hidden >= 1, "[hf_io] {}: moe_intermediate_size {} must be positive", source,
           c.moe_ffn_hidden);
  c.norm_topk_prob = hf::get_field<bool>(j, "norm_topk_prob", false, source);
  c.output_router_logits = hf::get_field<bool>(j, "output_router_logits", false, source);
  c.router_aux_loss_coef = hf::get_field<float>(j, "router_aux_loss_coef", 0.001f, source);
  return c;
}

json write(const GPTConfig& c) {
  json j = hf::write_decoder_fields(c);
  j["attention_bias"] = false;
  j["use_sliding_window"] = false;
  j["sliding_window"] = nullptr;
  j["max_window_layers"] = c.n_layer;
  j["decoder_sparse_step"] = 1;
  j["mlp_only_layers"] = json::array();
  j["moe_intermediate_size"] = c.resolved_moe_ffn_hidden();
  j["num_experts"] = c.num_experts;
  j["num_experts_per_tok"] = c.experts_per_tok;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["output_router_logits"] = c.output_router_logits;
  j["router_aux_loss_coef"] = hf::shortest(c.router_aux_loss_coef);
  return j;
}

HFPlace place(const GPTConfig&, const std::string& ours) {
  if (ours == "lm_head.weight") return {ours};
  return {"model." + ours};
}

// transformers 4.x's per-expert tensors (mlp.experts.{j}.{gate,up,down}_proj), read on import.
std::vector<HFPiece> legacy_pieces(const GPTConfig& c, const std::string& ours) {
  static const std::regex moe(R"(layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj))");
  std::smatch m;
  if (!std::regex_match(ours, m, moe)) return {};
  const std::string layer = "model.layers." + m[1].str() + ".mlp.experts.";
  const int64_t E = c.num_experts, C = c.n_embd, I = c.resolved_moe_ffn_hidden();
  std::vector<HFPiece> pieces;
  for (int64_t j = 0; j < E; ++j) {
    const std::string e = layer + std::to_string(j) + ".";
    if (m[2] == "down_proj") {
      pieces.push_back({e + "down_proj.weight", {C, I}});
    } else {
      pieces.push_back({e + "gate_proj.weight", {I, C}});
      pieces.push_back({e + "up_proj.weight", {I, C}});
    }
  }
  return pieces;
}

bool is_buffer(const std::string& name) {
  static const std::regex rotary(R"((model\.)?layers\.\d+\.self_attn\.rotary_emb\.inv_freq)");
  return std::regex_match(name, rotary);
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
  Family f;
  f.name = "qwen3_moe";
  f.model_types = {"qwen3_moe"};
  f.architecture = "Qwen3MoeForCausalLM";
  f.decoder.layout = nn::Layout::llama;
  f.lora_targets = {"q_proj", "v_proj"};
  f.prefix = "model.";
  f.features = {"qk_norm", "moe"};
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
const Family qwen3_moe = make();
}  // namespace families

}  // namespace ds::models

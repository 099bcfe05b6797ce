#include "qwen_moe.h"

#include <regex>

#include "ds/core/error.h"
#include "hf_config.h"

namespace ds::models::qwen_moe {

using nlohmann::json;

namespace {

void read_layers(const nlohmann::json& j, GPTConfig& c, const std::string& type,
                 const std::string& source) {
  c.decoder_sparse_step = hf::get_field<int64_t>(j, "decoder_sparse_step", 1, source);
  DS_CHECK(c.decoder_sparse_step >= 1, "[hf_io] {}: decoder_sparse_step {} must be >= 1", source,
           c.decoder_sparse_step);
  if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null()) {
    DS_CHECK(j["mlp_only_layers"].is_array(), "[hf_io] {}: mlp_only_layers must be a list, got {}",
             source, j["mlp_only_layers"].dump());
    for (const auto& l : j["mlp_only_layers"]) {
      DS_CHECK(l.is_number_integer() && l.get<int64_t>() >= 0 && l.get<int64_t>() < c.n_layer,
               "[hf_io] {}: mlp_only_layers entry {} is not a layer index in [0, {})", source,
               l.dump(), c.n_layer);
      c.mlp_only_layers.push_back(l.get<int64_t>());
    }
  }
  // transformers 5 writes layer_types ("full_attention" for every layer without a sliding window).
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    const json& t = j["layer_types"];
    DS_CHECK(t.is_array() && static_cast<int64_t>(t.size()) == c.n_layer,
             "[hf_io] {}: layer_types must list {} entries, got {}", source, c.n_layer, t.dump());
    for (const auto& e : t)
      DS_CHECK(e == "full_attention",
               "[hf_io] {}: layer_types entry {} is not supported for {} (sliding-window attention "
               "is not implemented here; every layer must be full_attention)",
               source, e.dump(), type);
  }
  const int64_t window_layers = hf::get_field<int64_t>(j, "max_window_layers", c.n_layer, source);
  DS_CHECK(!hf::get_field<bool>(j, "use_sliding_window", false, source) || window_layers >= c.n_layer,
           "[hf_io] {}: use_sliding_window true is not supported: sliding-window attention is not "
           "implemented for {}",
           source, type);
}

HFPlace place(const GPTConfig&, const std::string& ours) {
  if (ours == "lm_head.weight") return {ours};
  return {"model." + ours};
}

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

}  // namespace

std::set<std::string> fields() {
  return {"use_sliding_window",   "sliding_window",      "max_window_layers",
          "decoder_sparse_step",  "mlp_only_layers",     "layer_types",
          "moe_intermediate_size", "num_experts_per_tok", "num_experts",
          "num_local_experts",    "norm_topk_prob",      "output_router_logits",
          "router_aux_loss_coef"};
}

void read_moe(const json& j, GPTConfig& c, const ExpertDefaults& d, const std::string& type,
              const std::string& source) {
  read_layers(j, c, type, source);
  // transformers 5 saves num_experts as num_local_experts (the configs' attribute_map); released
  // configs say num_experts.
  c.num_experts = hf::get_field<int64_t>(
      j, "num_local_experts", hf::get_field<int64_t>(j, "num_experts", d.num_experts, source),
      source);
  c.experts_per_tok = hf::get_field<int64_t>(j, "num_experts_per_tok", d.experts_per_tok, source);
  DS_CHECK(c.num_experts >= 1 && c.experts_per_tok >= 1 && c.experts_per_tok <= c.num_experts,
           "[hf_io] {}: num_experts {} and num_experts_per_tok {} must satisfy 1 <= "
           "num_experts_per_tok <= num_experts",
           source, c.num_experts, c.experts_per_tok);
  c.moe_ffn_hidden = hf::get_field<int64_t>(j, "moe_intermediate_size", d.moe_hidden, source);
  DS_CHECK(c.moe_ffn_hidden >= 1, "[hf_io] {}: moe_intermediate_size {} must be positive", source,
           c.moe_ffn_hidden);
  c.norm_topk_prob = hf::get_field<bool>(j, "norm_topk_prob", false, source);
  c.output_router_logits = hf::get_field<bool>(j, "output_router_logits", false, source);
  c.router_aux_loss_coef = hf::get_field<float>(j, "router_aux_loss_coef", 0.001f, source);
}

void write_moe(const GPTConfig& c, json& j) {
  j["use_sliding_window"] = false;
  j["sliding_window"] = nullptr;
  j["max_window_layers"] = c.n_layer;
  j["decoder_sparse_step"] = c.decoder_sparse_step;
  j["mlp_only_layers"] = c.mlp_only_layers;
  j["moe_intermediate_size"] = c.resolved_moe_ffn_hidden();
  j["num_experts"] = c.num_experts;
  j["num_experts_per_tok"] = c.experts_per_tok;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["output_router_logits"] = c.output_router_logits;
  j["router_aux_loss_coef"] = hf::shortest(c.router_aux_loss_coef);
}

Family family() {
  Family f;
  f.decoder.layout = nn::Layout::llama;
  f.lora_targets = {"q_proj", "v_proj"};
  f.prefix = "model.";
  f.decoder.place = place;
  f.decoder.legacy_pieces = legacy_pieces;
  f.is_buffer = is_buffer;
  return f;
}

}  // namespace ds::models::qwen_moe

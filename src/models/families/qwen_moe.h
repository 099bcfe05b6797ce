#pragma once
// What the Qwen mixture-of-experts families (qwen2_moe.cpp, qwen3_moe.cpp) share: the dense
// layers among the sparse ones (decoder_sparse_step, mlp_only_layers), the Hugging Face place of
// every tensor, and transformers 4.x's per-expert tensors read on import. Internal to
// src/models/families.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/models/family.h"

namespace ds::models::qwen_moe {

// decoder_sparse_step and mlp_only_layers from config.json into c (n_layer set); use_sliding_window
// refused (not implemented for these families). Errors name `source` and `type`.
void read_layers(const nlohmann::json& j, GPTConfig& c, const std::string& type,
                 const std::string& source);
// The same fields (and the sliding-window ones, off) into config.json.
void write_layers(const GPTConfig& c, nlohmann::json& j);
// "model." + ours, lm_head.weight as it is.
HFPlace place(const GPTConfig& c, const std::string& ours);
// transformers 4.x's mlp.experts.{j}.{gate,up,down}_proj.weight for our stacked
// layers.{i}.mlp.experts.{gate_up_proj,down_proj}; {} for any other name.
std::vector<HFPiece> legacy_pieces(const GPTConfig& c, const std::string& ours);
// layers.{i}.self_attn.rotary_emb.inv_freq (older files' buffers).
bool is_buffer(const std::string& name);

}  // namespace ds::models::qwen_moe

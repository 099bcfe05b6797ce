#pragma once
// What the Qwen mixture-of-experts families (qwen2_moe.cpp, qwen3_moe.cpp) share: the dense
// layers among the sparse ones (decoder_sparse_step, mlp_only_layers), the experts' and router's
// config fields, the Hugging Face place of every tensor, and transformers 4.x's per-expert
// tensors read on import. Internal to src/models/families.
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/models/family.h"

namespace ds::models::qwen_moe {

// The config.json fields read_moe handles (for hf::check_known_fields).
std::set<std::string> fields();

// A family's defaults for what its config.json may leave out (Qwen2MoeConfig's, Qwen3MoeConfig's).
struct ExpertDefaults {
  int64_t num_experts = 0;
  int64_t experts_per_tok = 0;
  int64_t moe_hidden = 0;  // moe_intermediate_size
};

// Into c (n_layer set): the dense layers among the sparse ones (decoder_sparse_step,
// mlp_only_layers; use_sliding_window and non-"full_attention" layer_types refused), the experts
// (num_experts, or transformers 5's num_local_experts; num_experts_per_tok;
// moe_intermediate_size) and the router (norm_topk_prob, output_router_logits,
// router_aux_loss_coef). Errors name `source` and `type`.
void read_moe(const nlohmann::json& j, GPTConfig& c, const ExpertDefaults& d,
              const std::string& type, const std::string& source);
// The same fields (and the sliding-window ones, off) into config.json.
void write_moe(const GPTConfig& c, nlohmann::json& j);

// A Family with what the Qwen-MoE families share: the llama layout, LoRA's q_proj/v_proj, the
// "model." prefix and place, transformers 4.x's per-expert tensors on import, the rotary buffers
// of older files. The caller sets the names, features, config reading, writing and check.
Family family();

}  // namespace ds::models::qwen_moe

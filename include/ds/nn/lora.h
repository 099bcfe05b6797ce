#pragma once
// LoRA (low-rank adaptation) as DeepSpeed-Chat offers it (dschat/utils/module/lora.py), with
// PEFT's parameter names and initialisation (peft's src/peft/tuners/lora/layer.py;
// docs/finetuning.md):
//
//   y = W x + b + (alpha / r) * B (A dropout(x)),   A (r, in), B (out, r)
//
// apply_lora() adds A and B to every nn::Linear whose module name contains one of the targets
// (DeepSpeed-Chat's `lora_module_name` is such a substring: "q_proj" matches
// "layers.0.self_attn.q_proj", "layers." every projection of every block). A is Kaiming-uniform
// with a = sqrt(5) as PEFT's default (U(-1/sqrt(in), 1/sqrt(in))), B zero, so the adapted model
// starts as the base model. The base weight of an adapted Linear is frozen (requires_grad false,
// as DeepSpeed-Chat); only_optimize_lora freezes every other parameter too (embeddings, norms,
// biases, the other Linears), leaving only the LoRA matrices to train. Frozen parameters get no
// gradient buffer and no optimizer state in any ZeRO stage (zero/strategy.h).
//
// Names: the adapted Linear "layers.0.self_attn.q_proj" gains "layers.0.self_attn.q_proj.lora_A.
// weight" and "....lora_B.weight"; its base weight keeps its name, so checkpoints and the Hugging
// Face export see the same base names as without LoRA.
//
// Threading: apply_lora() and merge_lora_weights() are called from one thread, before the engine
// is built (apply) or on gathered weights (merge).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ds/core/tensor.h"
#include "ds/nn/module.h"

namespace ds::nn {

struct LoraConfig {
  int64_t r = 0;  // lora_dim; 0 = LoRA off
  // Scaling alpha / r. DeepSpeed-Chat has no alpha and scales by 1 / r: alpha 1 (the default).
  // PEFT users usually give alpha = r or 2 r.
  float alpha = 1.0f;
  float dropout = 0.0f;              // on the LoRA path's input, in training
  std::vector<std::string> targets;  // substrings of module names; at least one
  bool only_optimize_lora = false;   // freeze everything but the LoRA matrices
  // How a target selects a module: false (DeepSpeed-Chat) when the module name contains it; true
  // (PEFT's target_modules rule, encoder classifiers) when the name equals it or ends in
  // ".<target>" ("query_proj" then leaves DeBERTa's "pos_query_proj" alone, as PEFT does).
  bool peft_match = false;
  // Modules kept trainable under only_optimize_lora, by PEFT's rule above: PEFT's modules_to_save
  // (for TaskType.SEQ_CLS "classifier" and "score": the classification head).
  std::vector<std::string> modules_to_save;
  uint64_t seed = 0;  // A's initialisation (rank-independent)

  float scaling() const { return alpha / static_cast<float>(r); }
  // Throws "[lora] ..." naming the bad field (r <= 0, alpha <= 0, dropout outside [0, 1), no
  // target or an empty one).
  void validate() const;
};

struct LoraReport {
  // adapted Linear modules, in model order, then the adapted stacked expert weights
  // ("layers.0.mlp.experts.gate_up_proj")
  std::vector<std::string> modules;
  int64_t lora_params = 0;           // elements of all A and B
  int64_t trainable_params = 0;      // elements with requires_grad after apply_lora
  int64_t total_params = 0;          // every parameter once (tied weights once)
};

// Adds LoRA to the matching Linear modules of `root` and to the selected stacked expert weights
// of its mixtures of experts (lora_selects_expert_weight; reported as "<experts>.gate_up_proj")
// (`root` must not be handed to an engine yet: the engine lays out its buffers from the
// parameters' requires_grad at construction). Throws "[lora] ..." when nothing matches (listing a
// few Linear names), when a matching Linear's weight is tied to another parameter (GPT-2's LM
// head shares wte: exclude it from the targets), or when experts are selected with a dropout
// (PEFT's ParamWrapper has none) or after expert parallelism split them.
LoraReport apply_lora(Module& root, const LoraConfig& config);

// Whether the config selects the stacked expert weight `weight` ("gate_up_proj" or "down_proj")
// of the nn::MoEExperts module `experts` ("layers.0.mlp.experts"): when a target selects the
// experts module under the config's rule ("experts", "mlp", "layers."), equals the weight's name
// ("down_proj"), or ends the parameter's name after a dot as PEFT's target_parameters do
// ("mlp.experts.down_proj", "experts.gate_up_proj"). apply_lora then adds an nn::ExpertLora
// (nn/expert_lora.h: PEFT's ParamWrapper layout, A (r E, in), B (out, r E)) to the weight.
bool lora_selects_expert_weight(const LoraConfig& config, const std::string& experts,
                                const std::string& weight);

// Whether module `name` is selected by `target` under the config's rule (peft_match above).
bool lora_target_matches(const LoraConfig& config, const std::string& name,
                         const std::string& target);
// Whether parameter `name` belongs to one of the config's modules_to_save (the module itself or
// one of its children, matched by PEFT's rule).
bool in_modules_to_save(const LoraConfig& config, const std::string& name);

// Whether a parameter name is a LoRA matrix ("....lora_A.weight" / "....lora_B.weight").
bool is_lora_parameter(const std::string& name);

// Whole weights by name (a model's named_parameters() or a strategy's full_weights()) with the
// LoRA matrices folded into their base weights, W + scaling * B A (a stacked expert weight
// (E, out, in): W + scaling * expert_lora_delta, PEFT's layout) computed in fp32 and stored in
// W's dtype, and the LoRA entries dropped: the weights of the plain model. Throws if a LoRA
// matrix has no base weight or the shapes disagree.
std::vector<std::pair<std::string, Tensor>> merge_lora_weights(
    const std::vector<std::pair<std::string, Tensor>>& named_weights, float scaling);

}  // namespace ds::nn

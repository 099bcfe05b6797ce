#pragma once
// LoRA adapters in PEFT's folder format (peft's save_pretrained: adapter_config.json and
// adapter_model.safetensors; docs/finetuning.md), for models::GPT with LoRA applied by
// nn::apply_lora:
//
//   dir/adapter_config.json        peft_type "LORA", task_type "CAUSAL_LM", r, lora_alpha,
//                                  lora_dropout, target_modules, fan_in_fan_out (true for GPT-2's
//                                  Conv1D), base_model_name_or_path, bias "none", ...
//   dir/adapter_model.safetensors  base_model.model.<Hugging Face module>.lora_A.weight (r, in)
//                                  and .lora_B.weight (out, r); metadata {"format": "pt"}
//
// so that peft.PeftModel.from_pretrained(base, dir) loads it (checked by
// tests/fixtures/generators/gen_lora_fixture.py --check-adapter). A and B are stored as we hold
// them for both layouts: PEFT's LoRA on GPT-2's Conv1D keeps A (r, in) and B (out, r) too; only its
// merge transposes.
//
// LoRA on a mixture of experts' stacked weights (nn/expert_lora.h) is written as peft's
// target_parameters (ParamWrapper): adapter_config.json lists them under "target_parameters"
// (target_modules then [] if no Linear is adapted, as peft writes it), and the factors, A (r E, in)
// and B (out, r E), sit on the experts module: base_model.model.model.layers.0.mlp.experts.
// lora_A.weight for down_proj (or for gate_up_proj when it is the only one adapted) and
// ....mlp.experts.base_layer.lora_A.weight for gate_up_proj when both are (peft nests one wrapper
// per parameter, in the module's parameter order). Checked against peft by test_lora_experts
// (tests/fixtures/lora_moe) and tests/fixtures/generators/check_moe_lora_adapter.py.
//
//   auto rep = nn::apply_lora(*model, lora);
//   ... train ...
//   models::export_peft_adapter(model->config(), engine->full_weights(), lora, "out/adapter",
//                               "/models/llama-7b");
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/core/dtype.h"
#include "ds/models/encoder.h"
#include "ds/models/gpt.h"
#include "ds/models/seq2seq.h"
#include "ds/nn/lora.h"

namespace ds::models {

// The PEFT name of one of our LoRA parameter names ("layers.0.self_attn.q_proj.lora_A.weight" ->
// "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"); throws for a non-LoRA name.
std::string peft_name(nn::Layout layout, const std::string& ours);

// adapter_config.json's content for the adapted modules `modules` (our names). target_modules
// lists the modules' last names ("q_proj") when that selects exactly the adapted modules in the
// Hugging Face model, else their full Hugging Face names.
nlohmann::json peft_adapter_config(const GPTConfig& config, const nn::LoraConfig& lora,
                                   const std::vector<std::string>& modules,
                                   const std::vector<std::string>& all_linear_modules,
                                   const std::string& base_model_name_or_path);

// adapter_config.json's target_parameters for the adapted stacked expert weights `weights` (our
// names, "layers.0.mlp.experts.down_proj"): their last names ("down_proj", which peft matches as
// a suffix) when that selects exactly them among `all_expert_weights`, else their full Hugging
// Face names.
nlohmann::json peft_target_parameters(const GPTConfig& config,
                                      const std::vector<std::string>& weights,
                                      const std::vector<std::string>& all_expert_weights);

// Writes the adapter folder from whole weights by our names (a model's named_parameters() or
// Strategy::full_weights(): rank 0's list under ZeRO-3); only the LoRA entries are written, in
// `dtype`. `model` names the Linear modules (its LoRA decides the adapted ones). Throws
// "[peft] ..." when the weights hold no LoRA matrix.
void export_peft_adapter(const GPT& model,
                         const std::vector<std::pair<std::string, Tensor>>& named_weights,
                         const nn::LoraConfig& lora, const std::filesystem::path& dir,
                         const std::string& base_model_name_or_path = "", DType dtype = DType::f32);

// Fills the LoRA matrices of `model` (LoRA already applied with the adapter's r and targets,
// expert weights included) from a PEFT adapter folder or .safetensors file; returns the number of
// tensors read. Throws "[peft] ..." listing every missing, extra or mis-shaped tensor; nothing is
// written unless all match.
int64_t load_peft_adapter(GPT& model, const std::filesystem::path& path);

// ---- encoder sequence classifiers: PEFT's TaskType.SEQ_CLS adapter ----------------------------
// adapter_config.json: task_type "SEQ_CLS", modules_to_save the config's (["classifier", "score"]),
// target_modules the adapted modules' last names (PEFT's rule); adapter_model.safetensors: the
// LoRA matrices under the class's names (base_model.model.bert.encoder.layer.0.attention.self.
// query.lora_A.weight) and every parameter of the modules to save under its file name
// (base_model.model.classifier.weight; roberta: classifier.dense.* and classifier.out_proj.*), as
// PeftModel.save_pretrained writes them (checked by tests/fixtures/generators/gen_lora_classifier_fixture.py).

// The PEFT name of our LoRA matrix or head parameter `ours`.
std::string peft_classifier_name(const EncoderConfig& config, const std::string& ours);

// Writes the adapter folder from whole weights by our names (rank 0's Engine::full_weights()),
// in `dtype`. `model` names the Linear modules (its LoRA decides the adapted ones). Throws
// "[peft] ..." when the weights hold no LoRA matrix.
void export_peft_classifier_adapter(
    const SequenceClassifier& model,
    const std::vector<std::pair<std::string, Tensor>>& named_weights, const nn::LoraConfig& lora,
    const std::filesystem::path& dir, const std::string& base_model_name_or_path = "",
    DType dtype = DType::f32);

// Fills the LoRA matrices and the modules to save of `model` (LoRA applied with `lora`) from a
// SEQ_CLS adapter folder or file; returns the tensors read. Throws "[peft] ..." listing every
// missing, extra or mis-shaped tensor; nothing is written unless all match.
int64_t load_peft_classifier_adapter(SequenceClassifier& model, const nn::LoraConfig& lora,
                                     const std::filesystem::path& path);

// ---- encoder-decoders: PEFT's TaskType.SEQ_2_SEQ_LM adapter -----------------------------------
// adapter_config.json: task_type "SEQ_2_SEQ_LM", modules_to_save null, target_modules the adapted
// modules' last names (PEFT's rule; e.g. ["q_proj", "v_proj"], T5 ["q", "v"]);
// adapter_model.safetensors: the LoRA matrices only, under the class's names with peft's prefix
// (base_model.model.model.encoder.layers.0.self_attn.q_proj.lora_A.weight for BART / BlenderBot,
// base_model.model.encoder.block.0.layer.0.SelfAttention.q.lora_A.weight for T5), as
// PeftModelForSeq2SeqLM.save_pretrained writes them (checked by
// tests/fixtures/generators/gen_lora_classifier_fixture.py --task seq2seq).

// The PEFT name of our LoRA matrix `ours` (Seq2Seq's names are the Hugging Face class's).
std::string peft_seq2seq_name(const std::string& ours);

// Writes the adapter folder from whole weights by our names (rank 0's Engine::full_weights()), in
// `dtype`. `model` names the Linear modules (its LoRA decides the adapted ones). Throws
// "[peft] ..." when the weights hold no LoRA matrix or `lora` has modules to save.
void export_peft_seq2seq_adapter(const Seq2Seq& model,
                                 const std::vector<std::pair<std::string, Tensor>>& named_weights,
                                 const nn::LoraConfig& lora, const std::filesystem::path& dir,
                                 const std::string& base_model_name_or_path = "",
                                 DType dtype = DType::f32);

// Fills the LoRA matrices of `model` (LoRA applied with the adapter's r and targets) from a
// SEQ_2_SEQ_LM adapter folder or file; returns the tensors read. Throws "[peft] ..." listing every
// missing, extra or mis-shaped tensor; nothing is written unless all match.
int64_t load_peft_seq2seq_adapter(Seq2Seq& model, const std::filesystem::path& path);

}  // namespace ds::models

#pragma once
// ds_train's LoRA set-up and export (docs/finetuning.md): the flags into an nn::LoraConfig, and the
// end-of-run export as a PEFT adapter or as merged Hugging Face weights.
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ds/models/encoder.h"
#include "ds/models/gpt.h"
#include "ds/nn/lora.h"
#include "ds/train/options.h"

namespace ds::train {

// nullopt when --lora_dim is 0 (then any other LoRA flag is an error naming it). Targets: the
// --lora_module_name list, or PEFT's default for the layout (llama q_proj,v_proj; gpt2 c_attn).
// Throws "[ds_train] --lora_... ..." saying what to change.
std::optional<nn::LoraConfig> lora_config(const Options& o, const Given& g,
                                          const models::GPTConfig& model);

// The same with the default targets given (used when --lora_module_name is not).
std::optional<nn::LoraConfig> lora_config(const Options& o, const Given& g,
                                          const std::vector<std::string>& default_targets);

// An encoder sequence classifier's LoRA, with PEFT's TaskType.SEQ_CLS semantics: targets matched
// as PEFT's target_modules (nn::LoraConfig::peft_match), by default the family's
// (models::EncoderFamily::lora_targets: bert/roberta query,value; deberta-v2
// query_proj,value_proj), and the head ("classifier", "score": PEFT's modules_to_save) kept
// trainable with
// --only_optimize_lora.
std::optional<nn::LoraConfig> encoder_lora_config(const Options& o, const Given& g,
                                                  const models::EncoderConfig& model);

// Elements LoRA would add to a model of `model`'s shape and the elements it would freeze, from the
// shapes alone (the model is built under nn::PartitionedInit: nothing allocated), for the start-up
// memory check (fit.h).
struct LoraCounts {
  int64_t lora_params = 0, frozen = 0;
};
LoraCounts count_lora(const models::GPTConfig& model, const nn::LoraConfig& c);

// The start-up line: "LoRA: r 8, alpha 16 (scaling 2), 4 modules (q_proj, ...), trainable 1.2K of
// 3.4M parameters (0.04%), only LoRA trained".
std::string describe_lora(const nn::LoraConfig& c, const nn::LoraReport& rep);

// Writes the trained LoRA at `dir`: with merge, a plain Hugging Face folder of the merged weights;
// otherwise a PEFT adapter folder whose base_model_name_or_path is `base` (the --init_from folder,
// made absolute; empty when the run started from scratch). `weights`: Engine::full_weights() (rank
// 0's). Returns what was written, for the summary line.
std::string export_lora(const models::GPT& model,
                        const std::vector<std::pair<std::string, Tensor>>& weights,
                        const nn::LoraConfig& c, bool merge, const std::filesystem::path& dir,
                        const std::string& base);

}  // namespace ds::train

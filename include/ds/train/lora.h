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
#include "ds/models/seq2seq.h"
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
// (models::Family::lora_targets: bert/roberta query,value; deberta-v2
// query_proj,value_proj), and the head ("classifier", "score": PEFT's modules_to_save) kept
// trainable with
// --only_optimize_lora.
std::optional<nn::LoraConfig> encoder_lora_config(const Options& o, const Given& g,
                                                  const models::EncoderConfig& model);

// An encoder-decoder's LoRA (models::Seq2Seq: BART, BlenderBot, T5), with PEFT's
// TaskType.SEQ_2_SEQ_LM semantics: targets matched as PEFT's target_modules (peft_match), by
// default seq2seq_lora_targets; no modules to save (peft saves and trains the adapters only: the
// tied shared embedding and lm_head stay frozen under --only_optimize_lora).
std::optional<nn::LoraConfig> seq2seq_lora_config(const Options& o, const Given& g,
                                                  const models::Seq2SeqConfig& model);
// peft's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING for the family (peft 0.21.2): bart
// q_proj,v_proj (the encoder's and decoder's self_attn and the decoder's encoder_attn), t5 q,v
// (SelfAttention and EncDecAttention). blenderbot, which the table lacks (peft then asks for
// target_modules), gets BART's: the same attention modules.
std::vector<std::string> seq2seq_lora_targets(const models::Seq2SeqConfig& model);

// Whether a run's export is a PEFT adapter: LoRA on, only the LoRA matrices (and modules to save)
// trained (--only_optimize_lora), no --merge_lora. Otherwise the export holds the merged weights
// (an adapter alone would lose the other trained parameters).
bool exports_lora_adapter(const std::optional<nn::LoraConfig>& lora, const Options& o);
// The adapter's base_model_name_or_path: --init_from made absolute; "" for a from-scratch run.
std::string lora_adapter_base(const Options& o);

// Writes a seq2seq run's PEFT SEQ_2_SEQ_LM adapter at `dir` from `weights` (rank 0's
// Engine::full_weights()); returns the summary line's text.
std::string export_seq2seq_lora_adapter(const models::Seq2Seq& model,
                                        const std::vector<std::pair<std::string, Tensor>>& weights,
                                        const nn::LoraConfig& c, const Options& o,
                                        const std::filesystem::path& dir);
// What a seq2seq run's export folder holds and what reads it, for the closing "HF export:" line
// (`with_tokenizer`: whether tokenizer files were written beside it).
std::string seq2seq_export_note(const std::optional<nn::LoraConfig>& lora, const Options& o,
                                bool with_tokenizer);

// Elements LoRA would add to a model of `model`'s shape and the elements it would freeze, from the
// shapes alone (the model is built under nn::PartitionedInit: nothing allocated), for the start-up
// memory check (fit.h).
struct LoraCounts {
  int64_t lora_params = 0, frozen = 0;
  int64_t expert_weights = 0;  // stacked expert weights adapted (nn::lora_selects_expert_weight)
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

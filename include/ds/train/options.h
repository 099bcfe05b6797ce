#pragma once
// What a training run is asked to do (train::plan_run's input): ds_train's flags, with the Hugging
// Face Trainer's names, as plain values. No command-line parser here: tools/train/options.cpp binds
// these fields to ds_train's option table, and an embedding program fills them directly.
#include <cstdint>
#include <string>
#include <vector>

namespace ds::train {

// The flags, with the Hugging Face Trainer's names. Defaults here are ds_train's; docs/training.md
// has the table.
struct Options {
  std::string deepspeed;
  std::string model;
  std::string train_data;
  std::string eval_data;
  std::string output_dir = "out/ds_train";
  int64_t per_device_train_batch_size = 8;
  int64_t gradient_accumulation_steps = 1;
  double learning_rate = 5e-4;
  double weight_decay = 0.0;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_epsilon = 1e-8;
  double max_grad_norm = 1.0;
  int64_t warmup_steps = 0;
  int64_t max_steps = -1;
  double num_train_epochs = 3.0;
  int64_t logging_steps = 0;  // 0: the config's steps_per_print
  int64_t eval_steps = -1;    // -1: a tenth of the run
  int64_t save_steps = 500;
  int64_t save_total_limit = 0;
  uint64_t seed = 42;
  bool bf16 = false;
  bool fp16 = false;
  bool gradient_checkpointing = false;
  int tensor_parallel_size = 0;    // 0: the config's tensor_parallel.autotp_size, else 1
  int pipeline_parallel_size = 0;  // 0: the config's pipeline.stages, else 1
  int expert_parallel_size = 0;    // 0: the config's expert_parallel (autoep_size), else 1
  std::string device = "cpu";      // cpu or cuda (cuda:0): where the model trains (docs/cuda.md)
  double device_memory_limit_gib = 0.0;  // --device_memory_limit: GPU memory cap, 0 = none
  bool skip_memory_check = false;
  bool no_shuffle = false;  // the data in file order (every epoch the same)
  bool eval_only = false;   // evaluate the model on the eval data and stop: no training
  std::string resume_from_checkpoint;
  std::string mup_base_shapes;  // --mup_base_shapes: mup's base shapes (.bsh YAML or JSON)
  std::string init_from;
  std::string export_hf;
  int64_t block_size = 0;  // 0: min(256, the model's block_size)
  int64_t eval_batches = 20;
  // Seq2seq runs only (ds/train/seq2seq_trainer.h; transformers' Seq2SeqTrainingArguments names):
  // each evaluation generates for the first eval_bleu_examples validation examples (0: none) with
  // generation_num_beams beams (1: greedy) and at most generation_max_length new tokens (0: the
  // set's max_target_len), and reports their corpus BLEU.
  int64_t eval_bleu_examples = 64;
  int64_t generation_num_beams = 1;
  int64_t generation_max_length = 0;
  std::string sample_prompt;
  int64_t sample_tokens = 64;
  int64_t sample_top_k = 40;
  std::string tokenizer;
  // --report_to: monitors added to the config's (ds/runtime/monitor_master.h, parse_report_to):
  // "tensorboard", "csv", "all", "none"; each may be a comma list.
  std::vector<std::string> report_to;
  int threads = 0;
  int local_rank = -1;
  // LoRA (DeepSpeed-Chat's flag names; docs/finetuning.md). lora_dim 0 = off.
  int64_t lora_dim = 0;
  double lora_alpha = 1.0;       // scaling alpha / r; 1 = DeepSpeed-Chat's 1 / r
  std::string lora_module_name;  // comma list of substrings; empty: PEFT's default per layout
  bool only_optimize_lora = false;
  double lora_dropout = 0.0;
  bool merge_lora = false;  // export merged weights instead of a PEFT adapter
};

// What the user typed, so that only explicit arguments reach TrainerArgs (and are checked against
// explicit config values). A program that fills Options directly sets the flags it means.
struct Given {
  bool per_device_train_batch_size = false, gradient_accumulation_steps = false,
       learning_rate = false, weight_decay = false, adam_beta1 = false, adam_beta2 = false,
       adam_epsilon = false, max_grad_norm = false, warmup_steps = false, max_steps = false,
       num_train_epochs = false, bf16 = false, fp16 = false, model = false, deepspeed = false,
       lora_alpha = false, lora_module_name = false, lora_dropout = false, eval_batches = false,
       sample_tokens = false, sample_top_k = false, eval_bleu_examples = false,
       generation_num_beams = false, generation_max_length = false;
};

// Where the GPT-2 tokenizer files are by default: $DS_CACHE_DIR/gpt2 or .cache/data/gpt2.
std::string default_tokenizer_dir();

}  // namespace ds::train

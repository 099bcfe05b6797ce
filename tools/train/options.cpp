#include "options.h"

#include <cstdlib>
#include <filesystem>

#include <CLI/CLI.hpp>

namespace ds::train {

void add_options(CLI::App& app, Options& o, Given& g,
                 std::vector<std::pair<CLI::Option*, bool*>>& given) {
  app.get_formatter()->column_width(40);
  // A later value wins, so wrappers (scripts/run_demo.sh) can put defaults first and pass the
  // user's flags after them.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  auto opt = [&](const std::string& name, auto& var, const std::string& help,
                 bool* flag = nullptr) {
    CLI::Option* op = app.add_option(name, var, help);
    if (flag) given.emplace_back(op, flag);
    return op;
  };
  opt("--deepspeed", o.deepspeed,
      "DeepSpeed config: a JSON file or inline JSON (default: the built-in configs/ds_demo.json)",
      &g.deepspeed);
  opt("--model", o.model,
      "Model: a preset (tiny, gpt2, gpt2-medium, llama-tiny, ...) or a model JSON file (default: "
      "tiny, or --init_from's config.json)",
      &g.model);
  opt("--train_data", o.train_data, "Folder written by ds_prepare (its train split)")->required();
  opt("--eval_data", o.eval_data,
      "Folder written by ds_prepare whose val split is used for evaluation (default: "
      "--train_data's val split, when it has one)");
  opt("--output_dir", o.output_dir, "Checkpoints, metrics, memory.json, loss.svg, sample, export")
      ->capture_default_str();
  opt("--per_device_train_batch_size", o.per_device_train_batch_size,
      "Micro-batch per rank (config: train_micro_batch_size_per_gpu) [8 when neither sets it]",
      &g.per_device_train_batch_size)
      ->check(CLI::PositiveNumber);
  opt("--gradient_accumulation_steps", o.gradient_accumulation_steps,
      "Micro-batches per optimizer step [1 when neither sets it]", &g.gradient_accumulation_steps)
      ->check(CLI::PositiveNumber);
  opt("--learning_rate", o.learning_rate, "Peak learning rate (optimizer lr, warmup_max_lr)",
      &g.learning_rate)
      ->capture_default_str();
  opt("--weight_decay", o.weight_decay, "AdamW weight decay", &g.weight_decay)
      ->capture_default_str();
  opt("--adam_beta1", o.adam_beta1, "Adam beta1", &g.adam_beta1)->capture_default_str();
  opt("--adam_beta2", o.adam_beta2, "Adam beta2", &g.adam_beta2)->capture_default_str();
  opt("--adam_epsilon", o.adam_epsilon, "Adam epsilon", &g.adam_epsilon)->capture_default_str();
  opt("--max_grad_norm", o.max_grad_norm, "Gradient clipping (config: gradient_clipping)",
      &g.max_grad_norm)
      ->capture_default_str();
  opt("--warmup_steps", o.warmup_steps, "Warm-up steps (scheduler warmup_num_steps)",
      &g.warmup_steps)
      ->capture_default_str();
  opt("--max_steps", o.max_steps,
      "Optimizer steps to train (overrides --num_train_epochs; also the schedule's "
      "total_num_steps)",
      &g.max_steps)
      ->check(CLI::PositiveNumber);
  opt("--num_train_epochs", o.num_train_epochs,
      "Epochs when --max_steps is not given (default 3, or the config's total_num_steps when it "
      "has one)",
      &g.num_train_epochs);
  opt("--logging_steps", o.logging_steps, "Log a line every N steps (default: steps_per_print)");
  opt("--eval_steps", o.eval_steps,
      "Evaluate every N steps (default: a tenth of the run; 0: only at the end)");
  opt("--save_steps", o.save_steps, "Checkpoint every N steps (0: only at the end)")
      ->capture_default_str();
  opt("--save_total_limit", o.save_total_limit,
      "Keep at most N checkpoints, deleting the oldest (never the one in 'latest'); 0: keep all")
      ->capture_default_str();
  opt("--seed", o.seed, "Seed of the data order, dropout and the sample")->capture_default_str();
  given.emplace_back(app.add_flag("--bf16", o.bf16, "bf16 mixed precision (config bf16.enabled)"),
                     &g.bf16);
  given.emplace_back(app.add_flag("--fp16", o.fp16, "fp16 with loss scaling (config fp16.enabled)"),
                     &g.fp16);
  app.add_flag("--gradient_checkpointing", o.gradient_checkpointing,
               "Recompute each block's activations in backward (less memory, ~1/3 more compute)");
  opt("--resume_from_checkpoint", o.resume_from_checkpoint,
      "'latest' (the newest checkpoint in --output_dir) or a checkpoint folder");
  opt("--init_from", o.init_from,
      "Start from Hugging Face style weights: a folder (config.json + model.safetensors) or a "
      ".safetensors file");
  opt("--export_hf", o.export_hf,
      "Where to write the trained model in Hugging Face layout at the end (default: "
      "<output_dir>/hf_model; 'none' to skip)");
  opt("--block_size,--seq_len", o.block_size,
      "Sequence length T (default: min(256, the model's block_size))");
  opt("--eval_batches", o.eval_batches, "Validation micro-batches per evaluation")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  opt("--sample_prompt", o.sample_prompt,
      "Prompt of the text sample generated at the end (default: a new document)");
  opt("--sample_tokens", o.sample_tokens, "Length of the sample in tokens (0: no sample)")
      ->capture_default_str();
  opt("--sample_top_k", o.sample_top_k, "Sample from the k most likely tokens (1: greedy)")
      ->capture_default_str();
  opt("--tokenizer", o.tokenizer,
      "Folder with encoder.json and vocab.bpe, for the sample (default: $DS_CACHE_DIR/gpt2 or "
      ".cache/data/gpt2)");
  opt("--threads", o.threads, "Threads (default: all cores)");
  opt("--local_rank", o.local_rank, "Accepted for the DeepSpeed launcher (the rank comes from mpirun's environment)");
}

std::string default_tokenizer_dir() {
  if (const char* c = std::getenv("DS_CACHE_DIR"); c && *c)
    return (std::filesystem::path(c) / "gpt2").string();
  return ".cache/data/gpt2";
}

}  // namespace ds::train

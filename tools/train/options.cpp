#include "options.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

namespace ds::train {

namespace {

// CLI11's own range checks print the bound as a number with hundreds of digits (DBL_MAX) or say
// "Value abc not in range"; these validators parse the text themselves and say what is allowed.
std::string allowed_integers(int64_t lo, int64_t hi) {
  if (hi == std::numeric_limits<int64_t>::max()) return fmt::format("an integer >= {}", lo);
  return fmt::format("an integer in [{}, {}]", lo, hi);
}

CLI::Validator integer_in(int64_t lo, int64_t hi = std::numeric_limits<int64_t>::max()) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        int64_t v = 0;
        const char* b = text.data();
        const char* e = b + text.size();
        const auto [end, ec] = std::from_chars(b, e, v);
        if (ec == std::errc::result_out_of_range ||
            (ec == std::errc() && end == e && (v < lo || v > hi)))
          return fmt::format("'{}' is out of range: allowed is {}", text, allowed_integers(lo, hi));
        if (ec != std::errc() || end != e)
          return fmt::format("'{}' is not an integer: allowed is {}", text,
                             allowed_integers(lo, hi));
        return {};
      },
      allowed_integers(lo, hi));
}

CLI::Validator unsigned_integer() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        uint64_t v = 0;
        const char* b = text.data();
        const char* e = b + text.size();
        const auto [end, ec] = std::from_chars(b, e, v);
        if (ec != std::errc() || end != e)
          return fmt::format("'{}' is not allowed: allowed is an integer in [0, 2^64 - 1]", text);
        return {};
      },
      "an integer >= 0");
}

// A finite number in [lo, hi] (or [lo, hi) when hi_open).
CLI::Validator number_in(double lo, double hi, bool lo_open = false, bool hi_open = false) {
  std::string what;
  if (std::isinf(hi))
    what = fmt::format("a finite number {} {}", lo_open ? ">" : ">=", lo);
  else
    what = fmt::format("a number in {}{}, {}{}", lo_open ? "(" : "[", lo, hi, hi_open ? ")" : "]");
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        char* end = nullptr;
        errno = 0;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size())
          return fmt::format("'{}' is not a number: allowed is {}", text, what);
        const bool ok = std::isfinite(v) && errno != ERANGE && (lo_open ? v > lo : v >= lo) &&
                        (std::isinf(hi) || (hi_open ? v < hi : v <= hi));
        if (!ok) return fmt::format("'{}' is out of range: allowed is {}", text, what);
        return {};
      },
      what);
}

constexpr int64_t kMaxSteps = 1'000'000'000'000;  // far beyond any run, far below overflow

}  // namespace

namespace {

// Adds options to one CLI11 app, recording which ones the user gave (Given) through `given`.
struct Adder {
  CLI::App& app;
  std::vector<std::pair<CLI::Option*, bool*>>& given;
  template <typename T>
  CLI::Option* operator()(const std::string& name, T& var, const std::string& help,
                          bool* flag = nullptr) {
    CLI::Option* op = app.add_option(name, var, help);
    if (flag) given.emplace_back(op, flag);
    return op;
  }
};

// The run: config, model, data, output folder and batch sizes.
void add_run_options(Adder& opt, Options& o, Given& g) {
  opt("--deepspeed", o.deepspeed,
      "DeepSpeed config: a JSON file or inline JSON (default: the built-in configs/ds_demo.json)",
      &g.deepspeed);
  opt("--model", o.model,
      "Model: a preset (tiny, gpt2, gpt2-medium, llama-tiny, ...), a model JSON file or a Hugging "
      "Face folder's config.json (default: tiny, or --init_from's config.json). Classification "
      "sets: bert-tiny (the default) or an encoder config JSON",
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
      ->check(integer_in(1, 1 << 20));
  opt("--gradient_accumulation_steps", o.gradient_accumulation_steps,
      "Micro-batches per optimizer step [1 when neither sets it]", &g.gradient_accumulation_steps)
      ->check(integer_in(1, 1 << 20));
}

// The optimizer, the schedule and the step counts.
void add_optimizer_options(Adder& opt, Options& o, Given& g) {
  opt("--learning_rate", o.learning_rate, "Peak learning rate (optimizer lr, warmup_max_lr)",
      &g.learning_rate)
      ->capture_default_str()
      ->check(number_in(0, INFINITY));
  opt("--weight_decay", o.weight_decay, "AdamW weight decay", &g.weight_decay)
      ->capture_default_str()
      ->check(number_in(0, INFINITY));
  opt("--adam_beta1", o.adam_beta1, "Adam beta1", &g.adam_beta1)
      ->capture_default_str()
      ->check(number_in(0, 1, false, true));
  opt("--adam_beta2", o.adam_beta2, "Adam beta2", &g.adam_beta2)
      ->capture_default_str()
      ->check(number_in(0, 1, false, true));
  opt("--adam_epsilon", o.adam_epsilon, "Adam epsilon", &g.adam_epsilon)
      ->capture_default_str()
      ->check(number_in(0, INFINITY));
  opt("--max_grad_norm", o.max_grad_norm, "Gradient clipping (config: gradient_clipping)",
      &g.max_grad_norm)
      ->capture_default_str()
      ->check(number_in(0, INFINITY));
  opt("--warmup_steps", o.warmup_steps, "Warm-up steps (scheduler warmup_num_steps)",
      &g.warmup_steps)
      ->capture_default_str()
      ->check(integer_in(0, kMaxSteps));
  opt("--max_steps", o.max_steps,
      "Optimizer steps to train (overrides --num_train_epochs; also the schedule's "
      "total_num_steps)",
      &g.max_steps)
      ->check(integer_in(1, kMaxSteps));
  opt("--num_train_epochs", o.num_train_epochs,
      "Epochs when --max_steps is not given (default 3, or the config's total_num_steps when it "
      "has one)",
      &g.num_train_epochs)
      ->check(number_in(0, 1e9, true));
  opt("--logging_steps", o.logging_steps, "Log a line every N steps (default: steps_per_print)")
      ->check(integer_in(1, kMaxSteps));
  opt("--eval_steps", o.eval_steps,
      "Evaluate every N steps (default: a tenth of the run; 0: only at the end)")
      ->check(integer_in(0, kMaxSteps));
  opt("--save_steps", o.save_steps, "Checkpoint every N steps (0: only at the end)")
      ->capture_default_str()
      ->check(integer_in(0, kMaxSteps));
  opt("--save_total_limit", o.save_total_limit,
      "Keep at most N checkpoints, deleting the oldest (never the one in 'latest'); 0: keep all")
      ->capture_default_str()
      ->check(integer_in(0, 1 << 30));
  opt("--seed", o.seed, "Seed of the data order, dropout and the sample")
      ->capture_default_str()
      ->check(unsigned_integer());
}

// Precision, parallelism, device and memory.
void add_engine_options(Adder& opt, Options& o, Given& g) {
  CLI::App& app = opt.app;
  auto& given = opt.given;
  given.emplace_back(app.add_flag("--bf16", o.bf16, "bf16 mixed precision (config bf16.enabled)"),
                     &g.bf16);
  given.emplace_back(app.add_flag("--fp16", o.fp16, "fp16 with loss scaling (config fp16.enabled)"),
                     &g.fp16);
  opt("--tensor_parallel_size", o.tensor_parallel_size,
      "Cut every layer over this many ranks (Megatron-style; docs/parallelism.md); the rest of "
      "the ranks are data parallel. 0: the config's tensor_parallel.autotp_size, else 1")
      ->check(CLI::NonNegativeNumber);
  opt("--pipeline_parallel_size", o.pipeline_parallel_size,
      "Split the model's layers into this many pipeline stages, one per group of ranks (1F1B; "
      "docs/parallelism.md). 0: the config's pipeline.stages, else 1")
      ->check(CLI::NonNegativeNumber);
  opt("--expert_parallel_size", o.expert_parallel_size,
      "Split the experts of a mixture-of-experts model over groups of this many data-parallel "
      "ranks (all-to-all token dispatch; docs/parallelism.md). 0: the config's expert_parallel "
      "section (enabled, autoep_size), else 1")
      ->check(CLI::NonNegativeNumber);
  opt("--device", o.device,
      "Where the model trains: cpu, or cuda (cuda:0, one GPU per rank; a -DDS_WITH_CUDA=ON "
      "build): parameters, activations and gradients on the GPU, fp32 master weights and Adam "
      "state in host memory (ZeRO-Offload's layout; every ZeRO stage, pipeline and tensor "
      "parallelism; collectives through host memory; docs/cuda.md); or sim, the device emulator "
      "for tests (GPU-like memory on the CPU's kernels)")
      ->capture_default_str();
  opt("--device_memory_limit", o.device_memory_limit_gib,
      "With --device cuda: cap the GPU memory this process may reserve, in GiB (as a smaller "
      "card would; PyTorch's set_per_process_memory_fraction). 0: the whole card")
      ->check(CLI::NonNegativeNumber);
  opt("--mup_base_shapes", o.mup_base_shapes,
      "With optimizer MuAdam, MuAdamW or MuSGD: the base model's shapes by parameter name (mup's "
      ".bsh file from save_base_shapes / make_base_shapes, or JSON {name: [dims, null = finite]}); "
      "without it the muP width multipliers are 1");
  app.add_flag("--gradient_checkpointing", o.gradient_checkpointing,
               "Recompute each block's activations in backward (less memory, ~1/3 more compute)");
  app.add_flag("--skip_memory_check", o.skip_memory_check,
               "Start even when the start-up estimate says the run does not fit in memory");
  app.add_flag("--no_shuffle", o.no_shuffle,
               "Read the training samples in file order (every epoch the same order)");
}

// Evaluation and the evaluation generations of seq2seq sets.
void add_eval_options(Adder& opt, Options& o, Given& g) {
  CLI::App& app = opt.app;
  app.add_flag(
      "--eval_only", o.eval_only,
      "Evaluate the model (--init_from, --resume_from_checkpoint or a new one) on the "
      "eval data, print loss and perplexity (classifiers: loss, accuracy, F1), and stop: no "
      "training, no outputs");
  opt("--eval_batches", o.eval_batches,
      "Validation micro-batches per evaluation (classifiers: default all of the eval data)",
      &g.eval_batches)
      ->capture_default_str()
      ->check(integer_in(1, 1 << 30));
  opt("--eval_bleu_examples", o.eval_bleu_examples,
      "Seq2seq sets: validation examples generated for BLEU at each evaluation (0: loss only)",
      &g.eval_bleu_examples)
      ->capture_default_str()
      ->check(integer_in(0, 1 << 30));
  opt("--generation_num_beams", o.generation_num_beams,
      "Seq2seq sets: beams of the evaluation's generations (1: greedy)", &g.generation_num_beams)
      ->capture_default_str()
      ->check(integer_in(1, 64));
  opt("--generation_max_length", o.generation_max_length,
      "Seq2seq sets: new tokens at most per evaluation generation (default: the set's "
      "max_target_len)",
      &g.generation_max_length)
      ->check(integer_in(1, 1 << 20));
}

// Checkpoints, initial weights, the export and the end-of-run sample.
void add_io_options(Adder& opt, Options& o, Given& g) {
  opt("--resume_from_checkpoint", o.resume_from_checkpoint,
      "'latest' (the newest checkpoint in --output_dir) or a checkpoint folder");
  opt("--init_from", o.init_from,
      "Start from Hugging Face style weights: a folder (config.json + model.safetensors) or a "
      ".safetensors file");
  opt("--export_hf", o.export_hf,
      "Where to write the trained model in Hugging Face layout at the end (default: "
      "<output_dir>/hf_model; 'none' to skip)");
  opt("--block_size,--seq_len", o.block_size,
      "Sequence length T (default: an SFT set's seq_len, else min(256, the model's block_size))")
      ->check(integer_in(1, 1 << 24));
  opt("--sample_prompt", o.sample_prompt,
      "Prompt of the text sample generated at the end (default: a new document)");
  opt("--sample_tokens", o.sample_tokens, "Length of the sample in tokens (0: no sample)",
      &g.sample_tokens)
      ->capture_default_str()
      ->check(integer_in(0, 1 << 20));
  opt("--sample_top_k", o.sample_top_k, "Sample from the k most likely tokens (1: greedy)",
      &g.sample_top_k)
      ->capture_default_str()
      ->check(integer_in(1, 1 << 24));
  opt("--tokenizer", o.tokenizer,
      "Folder with encoder.json and vocab.bpe, for the sample (default: $DS_CACHE_DIR/gpt2 or "
      ".cache/data/gpt2)");
}

// LoRA, and the launcher's and threads' options.
void add_lora_options(Adder& opt, Options& o, Given& g) {
  CLI::App& app = opt.app;
  opt("--lora_dim", o.lora_dim,
      "LoRA rank r (0: off): adds A (r, in) and B (out, r) to the Linear modules named by "
      "--lora_module_name and freezes their base weights (docs/finetuning.md)")
      ->capture_default_str()
      ->check(integer_in(0, 1 << 20));
  opt("--lora_alpha", o.lora_alpha,
      "LoRA scaling alpha / r (default 1: DeepSpeed-Chat's 1 / r; PEFT users often give r or 2r)",
      &g.lora_alpha)
      ->check(number_in(0, INFINITY, true));
  opt("--lora_module_name", o.lora_module_name,
      "Comma list; LoRA goes to every Linear whose name contains one (default: PEFT's targets, "
      "q_proj,v_proj for llama, c_attn for gpt2; 'layers.' adapts every LLaMA projection). "
      "Encoder classifiers: PEFT's rule (the name or its last part; default query,value, "
      "deberta-v2 query_proj,value_proj)",
      &g.lora_module_name);
  app.add_flag("--only_optimize_lora", o.only_optimize_lora,
               "Train the LoRA matrices only: freeze embeddings, norms, biases and the other "
               "Linears (no gradients, no optimizer state); encoder classifiers also train their "
               "classifier head (PEFT's modules_to_save)");
  opt("--lora_dropout", o.lora_dropout, "Dropout on the LoRA path's input", &g.lora_dropout)
      ->capture_default_str()
      ->check(number_in(0, 1, false, true));
  app.add_flag("--merge_lora", o.merge_lora,
               "At the end, export the base weights with LoRA merged (W + alpha/r B A) as a plain "
               "Hugging Face folder instead of a PEFT adapter (adapter_config.json + "
               "adapter_model.safetensors)");
  opt("--report_to", o.report_to,
      "Where the metrics go besides the CSV files (the Hugging Face Trainer's flag): tensorboard, "
      "csv, all (both) or none; several separated by spaces or commas. Enables the config's "
      "tensorboard / csv_monitor section (an empty output_path: --output_dir). wandb and comet_ml "
      "are not available: use tensorboard (docs/training.md, \"Metrics\")")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->delimiter(',');
  opt("--threads", o.threads, "Threads (default: all cores)")->check(integer_in(1, 4096));
  opt("--local_rank", o.local_rank,
      "Accepted for the DeepSpeed launcher (the rank comes from mpirun's environment)")
      ->check(integer_in(-1, 1 << 20));
}

}  // namespace

void add_options(CLI::App& app, Options& o, Given& g,
                 std::vector<std::pair<CLI::Option*, bool*>>& given) {
  app.get_formatter()->column_width(40);
  // A later value wins, so wrappers (scripts/run_demo.sh) can put defaults first and pass the
  // user's flags after them.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  Adder opt{app, given};
  add_run_options(opt, o, g);
  add_optimizer_options(opt, o, g);
  add_engine_options(opt, o, g);
  add_eval_options(opt, o, g);
  add_io_options(opt, o, g);
  add_lora_options(opt, o, g);
}

}  // namespace ds::train

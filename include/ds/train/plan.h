#pragma once
// A training run's set-up decisions, kept apart from the training loop: which data, which model,
// which DeepSpeed config with which "auto" values, how many steps, the data/tensor/pipeline
// parallel sizes and the activation-memory estimate. train::plan_run makes them all, once, from a
// train::Options; the Trainer (trainer.h) and the caller's console read the RunPlan.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/data/dataset.h"
#include "ds/data/tokenizer.h"
#include "ds/models/gpt.h"
#include "ds/nn/lora.h"
#include "ds/config/config.h"
#include "ds/train/options.h"

namespace ds::train {

// Whether a dotted path of the raw config holds a value, "auto", or nothing.
enum class Slot { Absent, Auto, Value };
Slot slot(const nlohmann::json& root, const std::string& path);

// TrainerArgs = the explicit arguments, plus ds_train's defaults where the config says "auto" (the
// Trainer always has a value for every argument; only explicit ones are checked against explicit
// config values, so a default never contradicts a file). Batch sizes: with neither the file nor
// the user giving them, micro-batch 8 and no accumulation. total_steps is left to
// resolve_run_config.
config::TrainerArgs trainer_args(const Options& o, const Given& g, const nlohmann::json& raw);

// The built-in default config starts with comment lines, but an inline config must start with '{'.
std::string strip_leading_comments(const std::string& text);

// --model (a preset or a model JSON file), else --init_from's config.json, else "tiny".
models::GPTConfig resolve_model(const Options& o, const Given& g);

// Whether a ds_prepare folder's meta.json lists `split`.
bool has_split(const std::filesystem::path& dir, const std::string& split);

struct RunConfig {
  config::DeepSpeedConfig cfg;
  config::ConfigContext ctx;   // what resolved it (InitOptions::ctx)
  std::string source;           // the config's name in messages
  int64_t steps_per_epoch = 0;  // floor(samples / train_batch_size)
  int64_t total_steps = 0;      // optimizer steps of this run
  std::string total_why;        // where total_steps came from, for the start-up line
  int tensor_parallel = 1;      // tp: --tensor_parallel_size or tensor_parallel.autotp_size
  int pipeline_parallel = 1;    // pp: --pipeline_parallel_size or pipeline.stages
};

// Reads the config (--deepspeed or the built-in default), fills "auto" from the arguments and the
// model's width, and decides the run length (docs/training.md, "Run length"). The config is parsed
// once: before it, only the model-parallel sections (the data-parallel size the batch rules count)
// and, for a run length in epochs, the batch triad are read (config::read_parallel_sizes,
// config::resolve_batch_sizes); tp and pp reach cfg.tensor_parallel / cfg.pipeline through the
// parse. `samples` is the number of training windows of T tokens. Throws "[config] ..." /
// "[ds_train] ..." on any problem, listing every contradiction between the file and the explicit
// arguments.
RunConfig resolve_run_config(const Options& o, const Given& g, const models::GPTConfig& model,
                             uint64_t samples, int64_t T, const char* builtin_config);

// Bytes the forward pass keeps for backward, per rank (docs/training.md, "Memory"): for each of
// B*T tokens, per layer 14 C values (norm inputs/outputs, q k v and their head-major copies,
// attention output, projections, residual sums) + 2 F (MLP hidden before and after the
// activation), plus 2 C for the final norm and 2 V for the logits and their gradient, which live
// at the same time at the start of backward. With gradient checkpointing a layer keeps only its
// input (C) and one layer is recomputed at a time.
int64_t activation_estimate(const models::GPTConfig& c, int64_t B, int64_t T, bool ckpt,
                            int64_t elem_bytes);
// The same count for any stack of L layers of width C and MLP width F over `tokens` tokens, with
// `after` values per token after the stack (2 C + 2 V for an LM's final norm and logits): what the
// task trainers estimate their encoders and decoders with (a decoder layer's cross-attention
// counted as 2 C more of F).
int64_t stack_activation_estimate(int64_t tokens, int64_t L, int64_t C, int64_t F, int64_t after,
                                  bool ckpt, int64_t elem_bytes);

// --device's value as a Device: "cpu", "cuda" or "cuda:0", "sim" or "sim:0"; anything else is an
// error naming the flag (cuda:N > 0 says to choose the GPU with CUDA_VISIBLE_DEVICES). ds_train,
// ds_serve and ds_generate read --device with it.
Device parse_device(const std::string& name);
// --device and --device_memory_limit of any run (plan_run, the task runs' resolve_task_run):
// parse_device(o.device) with its backend initialised (a build without CUDA, or no GPU, says so
// here); --device_memory_limit is refused without a device.
Device plan_device(const Options& o);
// Caps `device`'s memory at --device_memory_limit (before anything is allocated there) and
// returns the line to show; "" when there is no limit (or the run is on the CPU).
std::string apply_device_memory_limit(Device device, const Options& o);

// The words a run's messages and checkpoints use.
struct TaskNames {
  const char* task = "";    // the set's kind and a checkpoint's ds_train.task: "classification"
  const char* run = "";     // "classifier": "not a classifier run's checkpoint"
  const char* models = "";  // "encoder classifiers": "--x does not apply to encoder classifiers"
};
// A decoder LM run's: its checkpoints record no task (check_checkpoint_task reads none as "lm").
inline constexpr TaskNames kLmNames{"lm", "language-model", "decoder language models"};

// What every run plans, whatever it trains: the options, the data folder, the resolved DeepSpeed
// config and run length, the device and the data-parallel size. RunPlan (the decoder LM's) and
// TaskPlan (task_plan.h: the task trainers') derive from it; train::TrainerBase
// (trainer_base.h) reads only this part.
struct PlanBase {
  TaskNames names = kLmNames;
  Options spec;
  Given given;
  std::filesystem::path train_dir;      // the ds_prepare folder of --train_data
  std::string val_from;                 // where the val split came from ("": none), for messages
  std::filesystem::path tokenizer_dir;  // copied beside the export ("": none)
  std::string model_name;               // the preset, file or folder name (messages, chart title)
  RunConfig run;                        // the resolved DeepSpeed config, run length, tp and pp
  Device device = kCPU;                 // --device, checked: where the model trains
  int world_size = 1;                   // ranks of the job: data x pipeline x tensor
  int data_parallel = 1;                // world / (tp x pp): the ranks ZeRO shards over
  int64_t tokens_per_example = 0;       // tokens a sample counts for in throughput (LM: T)
  std::vector<std::string> notes;       // lines for the caller to show (a skipped sample, ...)

  const config::DeepSpeedConfig& config() const { return run.cfg; }
  int64_t micro_batch() const { return run.cfg.batch.train_micro_batch_size_per_gpu; }  // B
  int64_t grad_accum() const { return run.cfg.batch.gradient_accumulation_steps; }      // A
  int64_t global_batch() const { return run.cfg.batch.train_batch_size; }               // G
  int64_t total_steps() const { return run.total_steps; }
};

// Everything decided before the model is built. Made by plan_run; read-only afterwards (the
// datasets are shared with the Trainer's loader, which only reads them).
struct RunPlan : PlanBase {
  // ---- data ----
  std::shared_ptr<data::TokenDataset> train;  // train_dir's "train" split
  std::shared_ptr<data::TokenDataset> val;    // --eval_data's or train_dir's "val"; null: none
  std::optional<data::Tokenizer> sample_tokenizer;  // for the end-of-run sample, when asked for
  int64_t seq_len = 0;                          // T: tokens per sample
  uint64_t samples = 0;                         // S: training windows of T tokens
  // ---- model ----
  models::GPTConfig model;
  std::optional<nn::LoraConfig> lora;  // --lora_dim > 0
  // Stage 3 builds each rank's piece of every parameter only (DeepSpeed's zero.Init), unless the
  // weights come from a Hugging Face folder, LoRA needs the base whole, or tp/pp slice it first.
  bool partitioned_build = false;
  int64_t activation_bytes = 0;  // per rank, activation_estimate for B x T

  int tensor_parallel() const { return run.tensor_parallel; }
  int pipeline_parallel() const { return run.pipeline_parallel; }
};

// Opens the data, resolves the model, the config ("auto" from the arguments, the builtin config
// when spec.deepspeed is not given: JSON text, possibly after // comment lines) and the run length,
// and checks that they fit each other (T against the model and an SFT set, the vocabulary, LoRA
// against tp/pp, dp x pp x tp against comm::world()). Throws "[ds_train] ..." / "[config] ..."
// saying what to change; reads files only (collective-free: every rank plans the same run).
RunPlan plan_run(const Options& spec, const Given& given, const char* builtin_config);

}  // namespace ds::train

#pragma once
// ds_train's set-up decisions, kept apart from the training loop: which model, which DeepSpeed
// config with which "auto" values, how many steps, and the activation-memory estimate.
#include <cstdint>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "ds/models/gpt.h"
#include "ds/runtime/config.h"
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
runtime::TrainerArgs trainer_args(const Options& o, const Given& g, const nlohmann::json& raw);

// The built-in default config starts with comment lines, but an inline config must start with '{'.
std::string strip_leading_comments(const std::string& text);

// --model (a preset or a model JSON file), else --init_from's config.json, else "tiny".
models::GPTConfig resolve_model(const Options& o, const Given& g);

// Whether a ds_prepare folder's meta.json lists `split`.
bool has_split(const std::filesystem::path& dir, const std::string& split);

struct RunConfig {
  runtime::DeepSpeedConfig cfg;
  runtime::ConfigContext ctx;   // what resolved it (InitOptions::ctx)
  std::string source;           // the config's name in messages
  int64_t steps_per_epoch = 0;  // floor(samples / train_batch_size)
  int64_t total_steps = 0;      // optimizer steps of this run
  std::string total_why;        // where total_steps came from, for the start-up line
  int tensor_parallel = 1;      // tp: --tensor_parallel_size or tensor_parallel.autotp_size
  int pipeline_parallel = 1;    // pp: --pipeline_parallel_size or pipeline.stages
};

// Reads the config (--deepspeed or the built-in default), fills "auto" from the arguments and the
// model's width, and decides the run length (docs/training.md, "Run length"). `samples` is the
// number of training windows of T tokens. Throws "[config] ..." / "[ds_train] ..." on any problem,
// listing every contradiction between the file and the explicit arguments.
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

}  // namespace ds::train

#pragma once
// The training engine: ds::initialize(model, config) -> Engine with forward / backward / step.
//
//   auto engine = ds::runtime::initialize(model, "ds_config.json", {.loss_fn = ..., .ctx = ...});
//   for (...) {
//     Tensor loss = engine->forward(inputs, targets);  // (B, T) ids -> scalar
//     engine->backward(loss);                          // scaled by loss_scale / gas
//     engine->step();  // an optimizer step only at a gradient-accumulation boundary
//   }
//
// What initialize() does with the model: every parameter moves into one flat buffer in the
// training dtype (fp32, bf16 or fp16: precision is a property of buffers) with its gradient in a
// flat buffer of the accumulation dtype; under bf16/fp16 the optimizer keeps fp32 master weights
// and fp32 moments and writes the rounded 16-bit weights back in the same pass.
//
// The optimizer step, at each boundary (reference/deepspeed-behaviour.md §5):
//   norm = ||grads|| (fp32, fixed-order double sum); overflow = !isfinite(norm)
//   fp16 dynamic scaling: the loss scaler's state machine decides (skip + OVERFLOW message);
//   any precision: a non-finite norm skips the step with a message, and `max_consecutive_skips`
//   skips in a row end the run with advice;
//   otherwise k = max(1, (norm/scale + 1e-6)/clip) and the optimizer sees grads * 1/(k*scale);
//   lr (and OneCycle's beta1) from the schedule; the schedule steps only on applied steps.
// A skipped step still counts in global_steps (as in DeepSpeed) and in skipped_steps.
//
// This engine runs one data-parallel rank group of size 1; ZeRO stages > 0 are accepted (their
// arithmetic is the identity at world size 1) and partition across ranks once the comm layer lands.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "ds/core/tensor.h"
#include "ds/nn/flat.h"
#include "ds/nn/module.h"
#include "ds/optim/optimizer.h"
#include "ds/runtime/config.h"
#include "ds/runtime/loss_scaler.h"
#include "ds/runtime/lr_schedule.h"

namespace ds::runtime {

// Computes the scalar training loss of a batch: the glue between a model and the engine.
using LossFn = std::function<Tensor(nn::Module& model, const Tensor& inputs, const Tensor& targets)>;

struct InitOptions {
  ConfigContext ctx;  // world size, the trainer's arguments ("auto"), the model's hidden size
  // Default: the model's loss(inputs, targets) when it is a models::GPT.
  LossFn loss_fn;
  int rank = 0;
  // Consecutive skipped steps (overflow or non-finite gradients) after which step() throws.
  int max_consecutive_skips = 50;
  // Receives the engine's log lines (OVERFLOW messages, skips); default: stderr on rank 0.
  std::function<void(const std::string&)> log;
};

// Model-state bytes held by this rank, by kind (the ZeRO paper's accounting).
struct MemoryBudget {
  int64_t params = 0;             // working parameters (training dtype)
  int64_t grads = 0;              // gradient buffer (accumulation dtype)
  int64_t master_weights = 0;     // fp32 copy under bf16/fp16 (0 in fp32: params are the master)
  int64_t optimizer_states = 0;   // moments
  int64_t total() const { return params + grads + master_weights + optimizer_states; }
};

class Engine {
 public:
  Engine(std::shared_ptr<nn::Module> model, DeepSpeedConfig config, InitOptions options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Training forward: records the graph. inputs/targets (B, T) int.
  Tensor forward(const Tensor& inputs, const Tensor& targets);
  // Loss without a graph (evaluation); eval mode for the call.
  Tensor eval_loss(const Tensor& inputs, const Tensor& targets);
  // Backpropagates loss * loss_scale / gradient_accumulation_steps into the flat gradients.
  void backward(const Tensor& loss);
  // Counts the micro-step; at an accumulation boundary, runs the optimizer step described above.
  // Returns true when an optimizer step was applied (false between boundaries or when skipped).
  bool step();

  bool is_gradient_accumulation_boundary() const;
  double get_lr() const;
  int64_t global_steps() const { return global_steps_; }
  int64_t global_samples() const { return global_samples_; }
  int64_t skipped_steps() const { return skipped_steps_; }
  int64_t micro_steps() const { return micro_steps_; }
  double loss_scale() const { return scaler_.scale(); }
  // The global gradient norm (unscaled) of the last boundary; NaN before the first.
  double last_grad_norm() const { return last_grad_norm_; }
  bool last_step_skipped() const { return last_step_skipped_; }

  const DeepSpeedConfig& config() const { return config_; }
  nn::Module& module() { return *model_; }
  std::shared_ptr<nn::Module> module_ptr() { return model_; }
  const nn::FlatParameters& flat() const { return flat_; }
  const Tensor& master_weights() const { return master_; }
  optim::Optimizer& optimizer() { return *optimizer_; }
  DType training_dtype() const { return config_.training_dtype(); }
  DType grad_dtype() const { return flat_.grads.dtype(); }
  MemoryBudget memory_budget() const;
  int rank() const { return options_.rank; }
  int world_size() const { return config_.batch.world_size; }

  // ---- checkpoints (layout: reference/deepspeed-behaviour.md §8; docs/checkpoints.md) ----
  // Writes dir/<tag>/ atomically (a temporary folder renamed into place), then dir/latest.
  // tag "" = "global_step<N>". client_state is stored and returned by load_checkpoint.
  void save_checkpoint(const std::string& dir, const std::string& tag = "",
                       const nlohmann::json& client_state = nlohmann::json::object());
  // tag "" = the tag named in dir/latest. Verifies checksums, names, shapes and dtypes; restores
  // weights, master weights, moments, counters, schedule, loss scaler and the dropout stream.
  // Returns the client state.
  nlohmann::json load_checkpoint(const std::string& dir, const std::string& tag = "");

 private:
  friend class CheckpointIO;
  double grad_norm_squared();  // over the fp32 gradients (converted into grads32_ if 16-bit)
  const float* grads_fp32() const;
  void zero_grads();
  void log(const std::string& line) const;

  std::shared_ptr<nn::Module> model_;
  DeepSpeedConfig config_;
  InitOptions options_;
  nn::FlatParameters flat_;  // params in the training dtype, grads in the accumulation dtype
  Tensor master_;            // (padded_numel,) fp32; aliases flat_.params in fp32 training
  Tensor grads32_;           // (padded_numel,) fp32 scratch when grads are 16-bit
  std::unique_ptr<optim::Optimizer> optimizer_;  // owns the moments, over [0, padded_numel)
  LRScheduler scheduler_;
  LossScaler scaler_;
  int64_t global_steps_ = 0;
  int64_t global_samples_ = 0;
  int64_t skipped_steps_ = 0;
  int64_t micro_steps_ = 0;
  int consecutive_skips_ = 0;
  double last_grad_norm_;
  bool last_step_skipped_ = false;
};

// Parses the config (path or JSON text) with ctx and builds the engine.
std::unique_ptr<Engine> initialize(std::shared_ptr<nn::Module> model,
                                   const std::string& config_path_or_json, InitOptions options = {});
std::unique_ptr<Engine> initialize(std::shared_ptr<nn::Module> model, DeepSpeedConfig config,
                                   InitOptions options = {});

}  // namespace ds::runtime

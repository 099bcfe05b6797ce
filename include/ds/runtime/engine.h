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
// The optimizer step, at each boundary (DeepSpeed's deepspeed/runtime/engine.py step and
// deepspeed/runtime/fp16/loss_scaler.py):
//   norm = ||grads|| (fp32, fixed-order double sum); overflow = !isfinite(norm)
//   fp16 dynamic scaling: the loss scaler's state machine decides (skip + OVERFLOW message);
//   any precision: a non-finite norm skips the step with a message, and `max_consecutive_skips`
//   skips in a row end the run with advice;
//   otherwise k = max(1, (norm/scale + 1e-6)/clip) and the optimizer sees grads * 1/(k*scale);
//   lr (and OneCycle's beta1) from the schedule; the schedule steps only on applied steps.
// A skipped step still counts in global_steps (as in DeepSpeed) and in skipped_steps.
//
// Data parallelism and ZeRO (docs/zero.md) over a comm::Group of N ranks:
//   stage 0  every rank holds everything; at the accumulation boundary gradients are all-reduced in
//            buckets of reduce_bucket_size elements as backward produces them (overlapped);
//   stage 1  the flat buffer is padded and cut into N contiguous partitions; fp32 master weights
//   and
//            moments exist only for the rank's partition; gradients are reduce-scattered at the
//            boundary; updated partitions are all-gathered;
//   stage 2  as 1, and each rank keeps gradients only for its partition: every micro-step's
//            gradients are reduced bucket by bucket during backward and the parameter's own
//            gradient is dropped as soon as it is copied into its bucket.
//   stage 3  as 2, and every parameter is itself cut into N pieces (padded to a multiple of N): a
//            rank holds only its piece of each. Module hooks gather a module's parameters before
//            its forward and its backward and release them after, except persistent small ones
//            (numel <= stage3_param_persistence_threshold); each parameter's gradient is
//            reduce-scattered as soon as it is complete. Build the model under nn::PartitionedInit
//            so that no rank ever holds the whole model; the engine then initialises each shard.
// Gradients are averaged over ranks; gradient_predivide_factor / prescale_gradients choose where
// the division happens (before the reduction or folded into the optimizer's gradient scale).
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "ds/comm/group.h"
#include "ds/comm/topology.h"
#include "ds/core/tensor.h"
#include "ds/nn/flat.h"
#include "ds/nn/batch.h"
#include "ds/nn/module.h"
#include "ds/optim/optimizer.h"
#include "ds/config/config.h"
#include "ds/runtime/activation_stash.h"
#include "ds/runtime/flops_profiler.h"
#include "ds/runtime/loss_scaler.h"
#include "ds/runtime/lr_schedule.h"
#include "ds/runtime/wall_clock.h"
#include "ds/zero/partition.h"
#include "ds/zero/strategy.h"

namespace ds::runtime {

// Computes the scalar training loss of a batch (its tensors by role, ds/nn/batch.h, already on
// the model's device): the glue between a model and the engine.
using LossFn = std::function<Tensor(nn::Module& model, const nn::Batch& batch)>;

struct InitOptions {
  config::ConfigContext ctx;  // world size, the trainer's arguments ("auto"), the model's hidden size
  // Default: the model's own loss(batch) (nn::Module::loss: input_ids and labels for a decoder
  // LM; encoders and encoder-decoders read their other inputs).
  LossFn loss_fn;
  // The data-parallel group ZeRO shards over; default comm::world() (MPI under mpirun, else a
  // size-1 group). With tensor or pipeline parallelism, give `topology` instead: ZeRO then takes
  // topology->data_parallel().
  std::shared_ptr<comm::Group> group;
  std::shared_ptr<comm::Topology> topology;
  // Consecutive skipped steps (overflow or non-finite gradients) after which step() throws.
  int max_consecutive_skips = 50;
  // Receives the engine's log lines (OVERFLOW messages, skips); default: stderr on rank 0.
  std::function<void(const std::string&)> log;
  // muP (optimizer MuAdam, MuAdamW, MuSGD): the base model's shape of every trainable parameter
  // by name (what mup.set_base_shapes takes). Empty: width multipliers 1 (optim/mup.h).
  std::map<std::string, std::vector<int64_t>> mup_base_shapes;
};

// Model-state bytes held by this rank, by kind (the ZeRO paper's accounting).
struct MemoryBudget {
  int64_t params = 0;            // working parameters (training dtype)
  int64_t grads = 0;             // gradient buffer (accumulation dtype)
  int64_t master_weights = 0;    // fp32 copy under bf16/fp16 (0 in fp32: params are the master)
  int64_t optimizer_states = 0;  // moments
  int64_t scratch = 0;  // fp32 copy of 16-bit gradients for the optimizer (not model state)
  int64_t nvme = 0;     // optimizer state reserved on disk (offload_optimizer.device = "nvme")
  int64_t total() const { return params + grads + master_weights + optimizer_states; }
};

// One micro-batch for Engine::train_batch and PipelineEngine (which calls it PipeBatch).
struct MicroBatch {
  nn::Batch batch;  // by role; a decoder LM's: input_ids (B, T), labels (B, T) with -100 ignored
  // The dropout stream's position of the micro-batch's first sample (rng::DropoutState::
  // sample_base; ds_train: the loader's global sample position), so that a resumed run draws the
  // masks of a run that never stopped.
  uint64_t sample_base = 0;
};

class Engine {
 public:
  Engine(std::shared_ptr<nn::Module> model, config::DeepSpeedConfig config, InitOptions options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Training forward: records the graph. The batch's tensors move to the model's device.
  Tensor forward(const nn::Batch& batch);
  // A decoder LM's batch: inputs/targets (B, T) int (= forward({.input_ids, .labels})).
  Tensor forward(const Tensor& inputs, const Tensor& targets);
  // Loss without a graph (evaluation); eval mode for the call.
  Tensor eval_loss(const nn::Batch& batch);
  Tensor eval_loss(const Tensor& inputs, const Tensor& targets);
  // Backpropagates loss * loss_scale / gradient_accumulation_steps into the flat gradients. With
  // ZeRO-3 offload, no gradient_clipping and no fp16, the boundary micro-step's backward also
  // starts the optimizer step, sub-group by sub-group as gradients become final (docs/offload.md);
  // step() then completes it. zero_optimization.offload_optimizer.step_in_backward = false turns
  // that off.
  void backward(const Tensor& loss);
  // A pipeline stage's backward (runtime/pipeline_engine.h): roots[i] receives grads[i], which
  // already carry the loss scale and 1/gradient_accumulation_steps (they come from the last
  // stage's backward(loss)). Same ZeRO handling as backward(loss).
  void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads);
  // Counts the micro-step; at an accumulation boundary, runs the optimizer step described above.
  // Returns true when an optimizer step was applied (false between boundaries or when skipped).
  bool step();
  // One optimizer step over gradient_accumulation_steps micro-batches: for each, next() gives the
  // batch, its sample_base positions the dropout masks, then forward, backward and step(). Returns
  // the mean micro-batch loss averaged over the data-parallel group (every rank gets the same
  // value: the loss of the whole global batch), like PipelineEngine::train_batch. Must start at an
  // accumulation boundary. A collective over group() (one all-reduce per micro-batch).
  double train_batch(const std::function<MicroBatch()>& next);

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

  const config::DeepSpeedConfig& config() const { return config_; }
  nn::Module& module() { return *model_; }
  std::shared_ptr<nn::Module> module_ptr() { return model_; }
  // Names, shapes and flat offsets of every trainable parameter (and, stages 0-2, the flat
  // buffers); frozen ones (requires_grad false, e.g. LoRA's base) are in strategy().frozen().
  const nn::FlatParameters& flat() const { return zero_->flat(); }
  const Tensor& master_weights() const { return zero_->master(); }
  optim::Optimizer& optimizer() { return *optimizer_; }
  // The ZeRO strategy: where parameters, gradients and optimizer state live (zero/strategy.h).
  zero::Strategy& strategy() { return *zero_; }
  DType training_dtype() const { return config_.training_dtype(); }
  DType grad_dtype() const { return grad_dtype_; }
  MemoryBudget memory_budget() const;
  int rank() const { return group_->rank(); }
  int world_size() const { return group_->size(); }
  int zero_stage() const { return zero_->stage(); }
  // ZeRO-3: parameter gathers issued ahead of use along the recorded trace (0 otherwise).
  int64_t prefetched_gathers() const { return zero_->prefetched_gathers(); }
  const zero::PartitionPlan& partition_plan() const { return zero_->plan(); }
  comm::Group& group() { return *group_; }

  // Every parameter whole, by name, in the training dtype, for export: the model's own tensors
  // under stages 0-2; under ZeRO-3 each parameter is gathered in turn (a collective: every rank
  // must call it) and only rank 0 receives the list (empty elsewhere), as DeepSpeed's
  // stage3_gather_16bit_weights_on_model_save does. With tensor parallelism the parts are
  // gathered over the tensor-parallel group too (every rank receives the whole tensors).
  std::vector<std::pair<std::string, Tensor>> full_weights();

  // Waits for work still running in the background (stage 3 with offload steps the optimizer on a
  // worker while the next forward runs) and raises its failure on every rank. A collective.
  // Checkpoints, evaluation and the next backward do it themselves; call it when training ends.
  void synchronize();

  // ---- checkpoints (DeepSpeed's layout, deepspeed/runtime/engine.py; docs/checkpoints.md) ----
  // With tensor parallelism every tp rank writes its slices and records which part of each whole
  // parameter they are; a checkpoint loads at any (dp, tp) and ZeRO stage. Collectives over the
  // whole job (the topology's world).
  // Writes dir/<tag>/ atomically (a temporary folder renamed into place), then dir/latest.
  // tag "" = "global_step<N>". client_state is stored and returned by load_checkpoint.
  void save_checkpoint(const std::string& dir, const std::string& tag = "",
                       const nlohmann::json& client_state = nlohmann::json::object());
  // tag "" = the tag named in dir/latest. Verifies checksums, names, shapes and dtypes; restores
  // weights, master weights, moments, counters, schedule, loss scaler and the dropout stream.
  // Returns the client state.
  nlohmann::json load_checkpoint(const std::string& dir, const std::string& tag = "");

  // The activation_checkpointing section's stash (its statistics), or null when the section asks
  // for nothing (runtime/activation_stash.h).
  const ActivationStash* activation_stash() const {
    return activation_stash_ ? activation_stash_->stash() : nullptr;
  }
  // The flops_profiler section's profile (global rank 0, enabled; null otherwise): profiles the
  // first forward of global step profile_step and prints it at that micro-step's step().
  const FlopsProfileStep* flops_profile() const { return flops_profile_.get(); }

 private:
  void log(const std::string& line) const;
  // Whether the boundary micro-step's backward starts the optimizer step (zero/strategy.h, "the
  // optimizer step during backward"): offloaded stage 3, no gradient clipping, no fp16.
  bool steps_in_backward() const;
  void set_optimizer_schedule();  // the scheduler's lr (and OneCycle's beta1) into the optimizer
  // Parts of the constructor, in its order.
  void warn_unused_download_key();
  void install_activation_stash(int tp_size);
  void install_flops_profile(int tp_size);
  void set_parallel_axes();
  // expert_parallel.autoep_size > 1: the groups, data rank 0's weights on every rank, the MoE
  // layers' experts split; returns the group the strategy runs over.
  std::shared_ptr<comm::Group> split_experts();
  void wire_optimizer();
  // The 1-bit optimizers (optim/onebit.h): the gradient all-reduce on or off for the coming step
  // as the optimizer wants it, and the skip decision agreed by every rank while it is off.
  void follow_onebit_all_reduce();
  bool any_rank_overflow(bool mine, const std::string& ctx);
  bool take_step();  // step()'s work, timed by wall_clock_
  std::string step_label() const;  // "step N" of the step being computed, for collectives
  void check_single_model_part(const char* what) const;  // refuses pp > 1 checkpoints
  // load_checkpoint's work: checks and reads this rank's files and streams its optimizer state,
  // calls local_part_done() (the ranks' agreement), then restores the collective rest.
  nlohmann::json load_checkpoint_files(const std::string& dir, const std::string& tag,
                                       const std::function<void()>& local_part_done);
  // save_checkpoint's parts (checkpoint.cpp): the ds_engine record; rank 0's model-states file
  // (weights: this model-parallel part's, gathered) and buffers file; this rank's optimizer shard.
  // Each writes into the tag's temporary folder `tmp`.
  nlohmann::json checkpoint_record(const nlohmann::json& client_state) const;
  void write_model_states(const std::string& tmp,
                          const std::vector<std::pair<std::string, Tensor>>& weights,
                          const nlohmann::json& client_state) const;
  void write_optimizer_shard(const std::string& tmp) const;

  std::shared_ptr<nn::Module> model_;
  config::DeepSpeedConfig config_;
  InitOptions options_;
  std::shared_ptr<comm::Group> group_;
  // expert_parallel: the expert-parallel and expert-data-parallel groups inside group_ (null
  // without expert parallelism); the strategy runs over expert_data.
  comm::ExpertGroups experts_;
  DType grad_dtype_ = DType::f32;
  std::unique_ptr<zero::Strategy> zero_;
  std::unique_ptr<optim::Optimizer> optimizer_;  // owns the moments of the strategy's range
  LRScheduler scheduler_;
  LossScaler scaler_;
  int64_t global_steps_ = 0;
  int64_t global_samples_ = 0;
  int64_t skipped_steps_ = 0;
  int64_t micro_steps_ = 0;
  int consecutive_skips_ = 0;
  double last_grad_norm_;
  bool last_step_skipped_ = false;
  bool logged_step_in_backward_ = false;
  WallClockBreakdown wall_clock_;  // config's wall_clock_breakdown
  // activation_checkpointing's stash for checkpointed layers (cpu_checkpointing,
  // synchronize_checkpoint_boundary, partition_activations), installed for the engine's lifetime.
  std::unique_ptr<ActivationStashScope> activation_stash_;
  std::unique_ptr<FlopsProfileStep> flops_profile_;  // flops_profiler, on global rank 0
};

// The gradient accumulation dtype a config trains with: data_types.grad_accum_dtype when given;
// otherwise fp32 for fp32 and bf16 training (DeepSpeed's bf16 optimizer accumulates in fp32) and
// fp16 for fp16 training.
DType gradient_dtype(const config::DeepSpeedConfig& config);

// What the ZeRO strategy is told of a config (zero_optimization, the gradient-averaging keys,
// NVMe offload and aio) for `world_size` data-parallel ranks accumulating gradients in `grads`.
// initialize() builds the strategy from it; train::plan_fit's memory model reads it too.
zero::Options zero_options(const config::DeepSpeedConfig& config, DType grads, int world_size);

// Parses the config (path or JSON text) with ctx and builds the engine.
std::unique_ptr<Engine> initialize(std::shared_ptr<nn::Module> model,
                                   const std::string& config_path_or_json,
                                   InitOptions options = {});
std::unique_ptr<Engine> initialize(std::shared_ptr<nn::Module> model, config::DeepSpeedConfig config,
                                   InitOptions options = {});

}  // namespace ds::runtime

#pragma once
// Pipeline parallelism: DeepSpeed's PipelineEngine (deepspeed/runtime/pipe/engine.py). Each rank
// runs one stage of the model (a contiguous range of its layers, nn::PipelineStage) and drives it
// through the 1F1B schedule of pipeline_schedule.h; the optimizer, ZeRO on the data-parallel axis
// and the precision are an ordinary Engine's, one per stage.
//
//   comm::Topology topo(comm::world(), tp, pp);                     // collective
//   auto parts = partition_layers(layers, pp, "parameters");        // pipeline_partition.h
//   auto stage = std::make_shared<models::GPT>(cfg, tp_group, models::PipeRange{parts[s], parts[s+1]});
//   PipelineEngine pipe(stage, config, {.topology = topo_ptr});
//   float loss = pipe.train_batch(next);  // gradient_accumulation_steps micro-batches, one step
//
// train_batch(next): the first and the last stage call next() gradient_accumulation_steps times
// (the first uses the inputs, the last the targets: both must see the same sequence); other
// stages never call it. Before the schedule runs, the stages agree on the micro-batch shape over
// the pipeline group (an all-gather), so a mismatch between stages (different batch shapes on the
// first and last stage, a hidden size one stage does not expect, different accumulation steps) is
// the same error on every rank, naming both stages, instead of a hang. A next() that throws on the
// first or last stage is agreed on the same way: every stage raises.
//
// Activations and their gradients travel point to point (asynchronous sends, waited receives) to
// the neighbouring stage with the same data and tensor coordinates. The loss: the last stage
// averages the micro-batches' losses, averages that over the data-parallel group and broadcasts
// it to every stage, so every rank returns it (DeepSpeed's _aggregate_total_loss). Gradient
// norms sum over every stage (Strategy::set_pipeline_parallel), so all stages clip and skip alike.
//
// Dropout: every stage draws the masks of the one-process model. The stream offset of a dropout
// call counts calls since the start (rng::DropoutState::offset); the engine counts once, at
// construction, how many calls each stage's forward makes, and positions each stage's forward of
// micro-batch k where the whole model's forward would be.
//
// Tied weights (GPT-2's wte on the first and last stage): the last stage sends its copy's
// accumulated gradient to the first stage, which adds it in its last backward of the batch; after
// the step the first stage sends the updated weight back. The weight has one optimizer state.
//
// ZeRO stages 0-3 on the data axis (DeepSpeed refuses 2 and 3 because it defers the gradient
// reduction to the end of the batch; here each stage's Engine reduces and gathers per micro-step
// exactly as without a pipeline), with or without tensor parallelism.
//
// Threading: one thread per rank; every call is collective over the whole topology.
#include <functional>
#include <memory>
#include <vector>

#include "ds/comm/topology.h"
#include "ds/core/tensor.h"
#include "ds/nn/module.h"
#include "ds/nn/pipeline_stage.h"
#include "ds/runtime/engine.h"
#include "ds/runtime/pipeline_schedule.h"

namespace ds::runtime {

// batch.input_ids (B, T), batch.labels (B, T) (a decoder LM's; other inputs are refused by name) and
// the sample_base of the micro-batch's first sample; stage 0's sample_base reaches every stage, so
// each stage draws the masks the one-process model would.
using PipeBatch = MicroBatch;

// Where one stage's time went in the last train_batch (the bubble benchmark): compute is forward
// and backward passes, the optimizer step is counted apart, and wait is time blocked in receives
// and at the end of the schedule (idle: the pipeline bubble and transfer time).
struct PipelineTimes {
  double compute_s = 0.0;
  double wait_s = 0.0;
  double step_s = 0.0;
  double total_s = 0.0;
};

class PipelineEngine {
 public:
  // stage: this rank's part of the model, an nn::Module that is an nn::PipelineStage.
  // options.topology is required; the engine's ZeRO group is its data-parallel group.
  PipelineEngine(std::shared_ptr<nn::Module> stage, config::DeepSpeedConfig config, InitOptions options);
  ~PipelineEngine();
  PipelineEngine(const PipelineEngine&) = delete;
  PipelineEngine& operator=(const PipelineEngine&) = delete;

  // One optimizer step over gradient_accumulation_steps micro-batches (1F1B). Returns the mean
  // micro-batch loss, averaged over data-parallel ranks, on every rank.
  float train_batch(const std::function<PipeBatch()>& next);
  // Loss of micro_batches micro-batches without gradients (DeepSpeed's InferenceSchedule), averaged
  // like train_batch's, on every rank.
  float eval_batch(const std::function<PipeBatch()>& next, int micro_batches);

  // Every parameter of the whole model, by name, for export: each stage's (gathered over its
  // tensor-parallel group, Engine::full_weights), sent to stage 0, where the ranks receive the whole
  // list in stage order; other stages receive an empty list. A collective over the topology.
  std::vector<std::pair<std::string, Tensor>> full_weights();

  // Checkpoints (docs/checkpoints.md): every rank writes its stage's (and tensor slice's) part
  // under the whole model's parameter names, so the folder loads at any (dp, pp, tp), one process
  // included. load_checkpoint then sends the first stage's tied weight to the last stage's copy.
  // Collectives over the topology.
  void save_checkpoint(const std::string& dir, const std::string& tag = "",
                       const nlohmann::json& client_state = nlohmann::json::object());
  nlohmann::json load_checkpoint(const std::string& dir, const std::string& tag = "");

  Engine& engine() { return *engine_; }  // optimizer, schedule, counters of this stage
  const comm::Topology& topology() const { return *topology_; }
  int stage_id() const { return topology_->stage(); }
  int num_stages() const { return topology_->grid().pp; }
  bool is_first_stage() const { return stage_id() == 0; }
  bool is_last_stage() const { return stage_id() == num_stages() - 1; }
  const PipelineTimes& last_times() const { return times_; }

 private:
  // All-gathers each stage's (B, T, C, micro-batch count, dtype, whether next() failed) over the
  // pipe group and checks them; the same error on every rank. Sets batch_ and seq_.
  void agree_on_shapes(const std::vector<PipeBatch>& batches, int micro_batches, const char* what,
                       const std::string& load_error);
  void sync_tied_weight();
  std::vector<PipeBatch> load(const std::function<PipeBatch()>& next, int count);
  float aggregate_loss(double loss_sum, int micro_batches);
  Tensor new_activation() const;
  int64_t count_dropout_calls();  // of one forward of this stage (a tiny probe)
  // train_batch's schedule, one instruction kind each (pipeline_engine.cpp): the micro-batches'
  // activations, gradients and sends in flight live in TrainState.
  struct TrainState;
  void train_forward(TrainState& st, int mb);
  void train_backward(TrainState& st, int mb);
  void train_optimizer_step(TrainState& st);
  Tensor receive(TrainState& st, int from, int tag, const char* what);

  std::shared_ptr<nn::Module> module_;
  nn::PipelineStage* stage_ = nullptr;
  std::shared_ptr<comm::Topology> topology_;
  std::unique_ptr<Engine> engine_;
  int64_t batch_ = 0, seq_ = 0, hidden_ = 0;  // the agreed activation shape (B, T, C)
  DType act_dtype_ = DType::f32;
  // Where this stage's parameters live: activations and gradients between stages are received
  // there (comm takes a device tensor through host memory).
  Device device_ = kCPU;
  int64_t dropout_prefix_ = 0;  // dropout calls of the stages before this one, per forward
  int64_t dropout_total_ = 0;   // dropout calls of one forward of the whole model
  PipelineTimes times_;
};

}  // namespace ds::runtime

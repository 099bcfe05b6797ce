#pragma once
// The task trainers' layer on TrainerBase (trainer_base.h, the one trainer shape): a model that is
// not a models::GPT (an encoder classifier, an encoder-decoder) trained on a task set (ds_prepare
// --task ...) through one runtime::Engine, data parallel with ZeRO stages 0-3. TaskTrainer owns
// that engine and a data::DistributedSampler over the set's examples (the data position in a
// checkpoint); resume, save, rotation, the step loop, the evaluation schedule and the check that
// the run applied a step are TrainerBase's. A task supplies what differs: its batches, its loss,
// its evaluation and metrics, its export.
//
// What a new task implements (ClassifierTrainer in classifier.h and Seq2SeqTrainer in
// seq2seq_trainer.h are the two):
//   - a plan struct deriving from TaskPlan (task_plan.h), made by plan_<task>();
//   - an observer deriving from TrainerObserver with an on_<task>_eval(report);
//   - a class deriving from TaskTrainer whose constructor builds the model (imports
//     spec.init_from, applies LoRA) and then calls start(model, loss_fn), and the hooks:
//       plan_base()         its plan (the PlanBase part);
//       pack_train(idx, b)  training examples idx as the micro-batch its loss function unpacks;
//       checkpoint_fields() what identifies its run in a checkpoint (lengths, the model, labels),
//       check_checkpoint()  and the check of those fields when resuming;
//       describe_data()     the start-up lines about the data;
//       report_evaluation() evaluate (its own report type) and call its observer's on_*_eval;
//   - export_model(dir), and evaluate() and last_eval() with its own report type.
//
// Collectives and threading: TrainerBase's (every rank constructs the trainer and calls the same
// methods in the same order; ZeRO-3 gathers in evaluation and export). One thread per rank.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ds/data/sampler.h"
#include "ds/nn/module.h"
#include "ds/runtime/engine.h"
#include "ds/train/task_plan.h"
#include "ds/train/trainer_base.h"

namespace ds::train {

class TaskTrainer : public TrainerBase {
 public:
  ~TaskTrainer() override;

 protected:
  // `observer` must outlive the trainer.
  explicit TaskTrainer(TrainerObserver& observer);

  // Checks that the run fits (unless --skip_memory_check: train/fit.h, from the model's parameter
  // count, its frozen ones and activation_bytes()), moves `model` to the plan's device (--device;
  // with --device_memory_limit applied first), builds the engine over it with the plan's config and `loss_fn` (the loss of the task's named
  // micro-batches; empty: the model's own loss(const nn::Batch&)), attaches it (dropout stream,
  // memory budget), builds the sampler over the training split, says describe_data() and opens
  // the output folder. The task's constructor calls it once, after its plan is in place.
  // Collective.
  void start(std::shared_ptr<nn::Module> model, runtime::LossFn loss_fn);

  // ---- what a task implements (and TrainerBase's plan_base, checkpoint_fields,
  // check_checkpoint, report_evaluation, export_model) ----
  // Training examples `idx` as the engine's micro-batch; sample_base: the dropout position.
  virtual runtime::MicroBatch pack_train(const std::vector<uint64_t>& idx,
                                         uint64_t sample_base) const = 0;
  virtual std::vector<std::string> describe_data() const = 0;  // the start-up lines
  // Bytes the forward pass keeps for backward per rank, estimated (train::stack_activation_estimate
  // over the task's micro-batch and lengths).
  virtual int64_t activation_bytes() const = 0;

 private:
  const TaskPlan& task_plan() const { return static_cast<const TaskPlan&>(plan_base()); }
  // The start-up memory check (train/fit.h) for `model` as built; says a warning, throws "[ds_train]
  // this run does not fit ..." with what would fit.
  void check_memory(const nn::Module& model);
  runtime::MicroBatch next_micro_batch() override;
  nlohmann::json data_state() const override { return sampler_->state(); }
  void load_data_state(const nlohmann::json& state) override { sampler_->load_state(state); }

  std::unique_ptr<runtime::Engine> engine_;
  std::unique_ptr<data::DistributedSampler> sampler_;
};

// Evaluation's micro-batches: examples [0, n) in order, `b` at a time (the last one smaller).
std::vector<std::vector<uint64_t>> eval_batches(int64_t n, int64_t b);

// Copies `weights` (Engine::full_weights: name, tensor) into the parameters of `whole` (a fresh
// fp32 model of the same config), by name; throws naming a parameter the engine lacks.
void copy_weights(nn::Module& whole, const std::vector<std::pair<std::string, Tensor>>& weights);

}  // namespace ds::train

#pragma once
// The skeleton of the task trainers: a model that is not a models::GPT (an encoder classifier, an
// encoder-decoder) trained on a task set (ds_prepare --task ...) through one runtime::Engine,
// data parallel with ZeRO stages 0-3. TaskTrainer owns the engine, the sampler, checkpoints
// (resume, save, rotation: DeepSpeed's layout with the data position, so that a resumed run takes
// the steps of one that never stopped, bit for bit), the step loop with its observer callbacks,
// the evaluation schedule and the check that the run applied a step. A task supplies what
// differs: its batches, its evaluation and metrics, its export.
//
// What a new task implements (ClassifierTrainer in classifier.h and Seq2SeqTrainer in
// seq2seq_trainer.h are the two):
//   - a plan struct deriving from TaskPlan (task_plan.h), made by plan_<task>();
//   - an observer deriving from TrainerObserver with an on_<task>_eval(report);
//   - a class deriving from TaskTrainer whose constructor builds the model (imports
//     spec.init_from, applies LoRA) and then calls start(model, loss_fn), and the hooks below:
//       task_plan()         its plan (the TaskPlan part);
//       pack_train(idx, b)  training examples idx as the micro-batch its loss function unpacks;
//       checkpoint_fields() what identifies its run in a checkpoint (lengths, the model, labels),
//       check_checkpoint()  and the check of those fields when resuming;
//       describe_data()     the start-up lines about the data;
//       report_evaluation() evaluate (its own report type) and call its observer's on_*_eval;
//   - export_model(dir), and evaluate() and last_eval() with its own report type.
// The LM trainer (train::Trainer, trainer.h) is the same shape with pipeline and tensor
// parallelism, a memory check and a token loader; it shares the step report and the end-of-run
// check (step_loop.h), not this class.
//
// Collectives and threading: every rank constructs the trainer and calls the same methods in the
// same order (the constructor, resume, save, evaluate_now, step, fit are collective over
// comm::world(); ZeRO-3 gathers in evaluation and export). One thread per rank; the observer is
// called on it, on every rank.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/data/sampler.h"
#include "ds/nn/module.h"
#include "ds/runtime/engine.h"
#include "ds/train/task_plan.h"
#include "ds/train/trainer.h"

namespace ds::train {

class TaskTrainer {
 public:
  virtual ~TaskTrainer();
  TaskTrainer(const TaskTrainer&) = delete;
  TaskTrainer& operator=(const TaskTrainer&) = delete;

  // spec.resume_from_checkpoint ("latest", a folder holding tags, or one tag's folder): restores
  // the engine, the data position and the dropout stream. nullopt when none was asked for (then a
  // note names an earlier run's checkpoints in the output folder, which rotation never deletes).
  // Throws for a missing checkpoint or one of another kind of run. Collective.
  std::optional<ResumeReport> resume();
  // output_dir/global_step<N> with the data position and the run's identity, then rotation
  // (spec.save_total_limit, this run's checkpoints only). Collective.
  SaveReport save();
  // The task's evaluation reported through its observer, once per step. Collective.
  void evaluate_now();
  // One optimizer step over the global batch, reported through on_step. Collective.
  StepReport step();
  // To the plan's total steps, evaluating every eval_steps() and saving every spec.save_steps,
  // then the final evaluation and save (unless that step was saved). Throws "[ds_train] every one
  // of the N steps ... was skipped" when no step of this call applied. Returns the steps run.
  int64_t fit();
  // The task's Hugging Face export at `dir` (rank 0 writes). Collective (ZeRO-3 gathers).
  virtual void export_model(const std::string& dir) = 0;

  bool is_lead() const { return rank_ == 0; }  // rank 0 prints and writes the job's files
  int64_t eval_steps() const;  // spec.eval_steps, or a tenth of the run (-1 given); 0 = end only
  runtime::Engine& engine() { return *engine_; }
  const std::filesystem::path& output_dir() const { return out_dir_; }

 protected:
  // `observer` must outlive the trainer.
  explicit TaskTrainer(TrainerObserver& observer);

  // Moves `model` to the plan's device (--device; with --device_memory_limit applied first), builds
  // the engine over it with the plan's config and `loss_fn` (the loss of the task's
  // named micro-batches; empty: the model's own loss(const nn::Batch&)), seeds the dropout stream,
  // reports the memory budget, builds the sampler over the training split, says describe_data() and
  // removes temporaries an interrupted run left in the output folder. The task's constructor calls
  // it once, after its plan is in place. Collective.
  void start(std::shared_ptr<nn::Module> model, runtime::LossFn loss_fn);
  void say(const std::string& s) { observer_.message(s); }

  // ---- what a task implements ----
  virtual const TaskPlan& task_plan() const = 0;
  // Training examples `idx` as the engine's micro-batch; sample_base: the dropout position.
  virtual runtime::MicroBatch pack_train(const std::vector<uint64_t>& idx,
                                         uint64_t sample_base) const = 0;
  // The task's fields of a checkpoint's "ds_train" object (the base adds task, total_steps, seed
  // and train_data), and the check, on resume, that a checkpoint's fields fit this run (throws).
  virtual nlohmann::json checkpoint_fields() const = 0;
  virtual void check_checkpoint(const nlohmann::json& ds_train) const = 0;
  virtual std::vector<std::string> describe_data() const = 0;  // the start-up lines
  // Evaluates and calls the task's observer (nothing without eval data). Collective.
  virtual void report_evaluation() = 0;

 private:
  TrainerObserver& observer_;
  int rank_ = 0;
  std::filesystem::path out_dir_;
  std::unique_ptr<runtime::Engine> engine_;
  std::unique_ptr<data::DistributedSampler> sampler_;
  int64_t evaluated_at_ = -1;  // the step of the newest evaluation
  int64_t last_saved_ = -1;    // the step of the newest checkpoint this run has (or resumed)
  // global_step folders of an earlier run found at a fresh start: rotation never deletes them.
  std::vector<std::string> earlier_run_;
};

// Evaluation's micro-batches: examples [0, n) in order, `b` at a time (the last one smaller).
std::vector<std::vector<uint64_t>> eval_batches(int64_t n, int64_t b);

// Copies `weights` (Engine::full_weights: name, tensor) into the parameters of `whole` (a fresh
// fp32 model of the same config), by name; throws naming a parameter the engine lacks.
void copy_weights(nn::Module& whole, const std::vector<std::pair<std::string, Tensor>>& weights);

}  // namespace ds::train

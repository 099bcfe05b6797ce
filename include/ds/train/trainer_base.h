#pragma once
// The one trainer shape: what every ds_train trainer does the same way, whatever it trains. The
// decoder LM trainer (train::Trainer, trainer.h) and the task trainers (train::TaskTrainer,
// task_trainer.h: ClassifierTrainer, Seq2SeqTrainer) derive from TrainerBase, which owns
//   - checkpoints: resume (the kind check before anything loads, the run's identity, the data
//     position), save (DeepSpeed's layout with the data position and the run's identity in the
//     client state, so that a resumed run takes the steps of one that never stopped, bit for bit)
//     and rotation (spec.save_total_limit, never an earlier run's checkpoints);
//   - the step: the learning rate it applies, the engine's numbers after it, on_step;
//   - fit(): steps, the evaluation schedule, periodic checkpoints, on_steps_done, the check that
//     the run applied a step, the final checkpoint and evaluation;
//   - the start-up memory budget and the output folder's clean-up of an interrupted run.
// A derived trainer builds its model and engine, then calls attach_engine() and open_output(); it
// supplies, as hooks: its plan (the PlanBase part), its next training micro-batch and the data
// position behind it, its fields of a checkpoint's "ds_train" object and their check on resume,
// its evaluation (reported through its observer) and its export. A pipeline-parallel trainer
// overrides train_batch / load_checkpoint / save_checkpoint to go through its PipelineEngine.
//
// Collectives and threading: every rank constructs the trainer and calls the same methods in the
// same order; resume, save, evaluate_now, step, fit and export_model are collective over
// comm::world(). One thread per rank; the observer is called on it, on every rank (a console
// prints on rank 0 only: is_lead()).
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/data/sampler.h"
#include "ds/nn/module.h"
#include "ds/runtime/engine.h"
#include "ds/train/plan.h"

namespace ds::train {

// One optimizer step, after it ran.
struct StepReport {
  int64_t step = 0;         // global steps after this one
  int64_t total_steps = 0;  // of the run
  int64_t samples = 0;      // global samples after this step (the metrics' x axis)
  double loss = 0.0;        // mean over the global batch (micro-batches and data-parallel ranks)
  double lr = 0.0;          // the rate this step applied
  double grad_norm = 0.0;   // unscaled global norm; NaN before the first boundary
  double loss_scale = 1.0;
  int64_t skipped_steps = 0;       // of the whole run (non-finite gradients)
  double seconds = 0.0;            // wall time of this step
  double tokens_per_second = 0.0;  // of the global batch
};

struct EvalReport {
  int64_t step = 0, samples = 0;
  double loss = 0.0;  // mean over the evaluated batches (finite: NaN results are not reported)
  double seconds = 0.0;
};

struct SaveReport {
  int64_t step = 0;
  std::filesystem::path dir;                   // the output folder (dir/global_step<step>)
  std::vector<std::filesystem::path> deleted;  // by rotation (save_total_limit), rank 0's
  double seconds = 0.0;
};

struct ResumeReport {
  std::filesystem::path dir;  // the folder holding the tags
  std::string tag;            // the tag loaded
  int64_t step = 0, samples = 0;
};

// The caller's side of a run. Every method has an empty default.
class TrainerObserver {
 public:
  virtual ~TrainerObserver() = default;
  // A one-line report (ds_train prints it after "[ds_train] ").
  virtual void message(const std::string& text) { (void)text; }
  // A table row or a block printed as it is (memory tables, pipeline stages, engine log lines).
  virtual void detail(const std::string& text) { (void)text; }
  virtual void on_step(const StepReport& r) { (void)r; }
  virtual void on_eval(const EvalReport& r) { (void)r; }
  virtual void on_save(const SaveReport& r) { (void)r; }
  // fit()'s last step ran; its final evaluation and checkpoint follow (a progress bar ends here).
  virtual void on_steps_done() {}
};

class TrainerBase {
 public:
  virtual ~TrainerBase();
  TrainerBase(const TrainerBase&) = delete;
  TrainerBase& operator=(const TrainerBase&) = delete;

  // spec.resume_from_checkpoint: "latest" (output_dir's newest checkpoint), a folder holding tags,
  // or one tag's folder. Restores the engine, the data position and the dropout stream; nullopt
  // when no resume was asked for (then a note says whether output_dir holds an earlier run's
  // checkpoints, which rotation never deletes). Throws "[ds_train] ..." for a missing checkpoint
  // or one of another kind of run. Collective.
  std::optional<ResumeReport> resume();
  std::optional<ResumeReport> resume_from(const std::string& from);
  // output_dir/global_step<N> with the data position and the run's identity, then rotation
  // (spec.save_total_limit, this run's checkpoints only, never the newest good one). Collective.
  SaveReport save();
  // The trainer's evaluation reported through its observer, once per step. Collective.
  void evaluate_now();
  // One optimizer step over the global batch; reported through on_step and returned. Collective.
  StepReport step();
  // To the plan's total steps, evaluating every eval_steps() and saving every spec.save_steps
  // (neither at the last step), then on_steps_done, waits for the engine, saves (unless that step
  // was saved) and evaluates. Throws "[ds_train] every one of the N steps of this run was skipped
  // ..." when no step of this call applied: its checkpoint and export would be the starting
  // weights. Returns the steps this call ran. Collective.
  int64_t fit();
  // The Hugging Face export at `dir` (rank 0 writes); returns a summary note ("" for none).
  // Collective (ZeRO-3 and pipelines gather the weights).
  virtual std::string export_model(const std::string& dir) = 0;

  int rank() const { return rank_; }           // in comm::world()
  bool is_lead() const { return rank_ == 0; }  // rank 0 prints and writes the job's files
  bool resumed() const { return resumed_; }
  int64_t eval_steps() const;  // spec.eval_steps, or a tenth of the run (-1 given); 0 = end only
  int64_t tokens_per_step() const;  // of the whole global batch: G x tokens_per_example
  const runtime::MemoryBudget& memory_budget() const { return mem_; }
  runtime::Engine& engine() { return *engine_; }
  const std::filesystem::path& output_dir() const { return out_dir_; }

 protected:
  // `observer` must outlive the trainer.
  explicit TrainerBase(TrainerObserver& observer);

  // The set-up steps a derived constructor calls, in this order. attach_engine: `engine` (owned
  // by the derived trainer, or its PipelineEngine) is the one that steps; output_dir() becomes
  // spec.output_dir; seeds the dropout stream from spec.seed and reports the memory budget (a
  // table of every rank's model states with several ranks; collective). open_output: creates
  // spec.output_dir and (rank 0) removes the temporaries an interrupted run left there.
  void attach_engine(runtime::Engine& engine);
  void open_output();
  // Moves `model` to the plan's device and says so; nothing on the CPU. The engine keeps the model
  // where it is: its flat parameters, activations and gradients stay on the device, the master
  // weights and optimizer state go to host memory (ZeRO-Offload's layout, docs/cuda.md).
  void move_to_device(nn::Module& model);
  // The engine's options from the plan (the config's context; the engine's log lines through
  // observer().detail), and, once attached, the sampler's over the global batch (B, A, this
  // rank's data-parallel position, spec.seed, spec.no_shuffle; the caller sets num_samples).
  runtime::InitOptions engine_options();
  data::SamplerOptions sampler_options() const;
  void say(const std::string& text) { obs_.message(text); }
  void line(const std::string& text) { obs_.detail(text); }
  TrainerObserver& observer() { return obs_; }
  // The step whose evaluation the trainer has (evaluate_now does not repeat it).
  void set_evaluated_at(int64_t step) { evaluated_at_ = step; }

  // ---- what a trainer implements ----
  virtual const PlanBase& plan_base() const = 0;
  // This rank's next micro-batch of the global batch, its sample_base the global position of its
  // first sample (the dropout masks follow it); the data position it leaves, and its restore.
  virtual runtime::MicroBatch next_micro_batch() = 0;
  virtual nlohmann::json data_state() const = 0;
  virtual void load_data_state(const nlohmann::json& state) = 0;
  // The trainer's fields of a checkpoint's "ds_train" object (the base adds total_steps, seed,
  // train_data and, for a task, plan_base().names.task), and the check, on resume, that a
  // checkpoint's fields fit this run (an empty object for a checkpoint without them; throws).
  virtual nlohmann::json checkpoint_fields() const = 0;
  virtual void check_checkpoint(const nlohmann::json& ds_train) const = 0;
  // Evaluates and calls the observer (nothing without eval data). Collective.
  virtual void report_evaluation() = 0;
  // The engine calls; a pipeline-parallel trainer goes through its PipelineEngine instead.
  virtual double train_batch(const std::function<runtime::MicroBatch()>& next);
  virtual nlohmann::json load_checkpoint(const std::string& dir, const std::string& tag);
  virtual void save_checkpoint(const std::string& dir, const nlohmann::json& client);

 private:
  std::filesystem::path resume_dir(const std::string& from, std::string* tag) const;
  void note_earlier_run();

  TrainerObserver& obs_;
  int rank_ = 0;
  std::filesystem::path out_dir_;
  runtime::Engine* engine_ = nullptr;  // the one that steps (attach_engine)
  runtime::MemoryBudget mem_;
  bool resumed_ = false;
  int64_t evaluated_at_ = -1;  // the step of the newest evaluation
  int64_t last_saved_ = -1;    // the step of the newest checkpoint this run has (or resumed)
  // global_step folders of an earlier run found in the output folder when this run started afresh:
  // --save_total_limit never deletes them (this run did not write them).
  std::vector<std::string> earlier_run_;
};

}  // namespace ds::train

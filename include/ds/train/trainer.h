#pragma once
// The trainer: one training run of a planned job (train::plan_run, plan.h), Hugging Face Trainer
// style. It owns the model (built from a preset or imported from a Hugging Face folder, sliced for
// tensor parallelism, cut into a pipeline stage, LoRA applied), the engine (runtime::Engine, or a
// runtime::PipelineEngine holding the stage's Engine), the data loader, checkpoints (resume, save
// and rotation, through one object whatever pp is), evaluation, the step loop and the export.
//
//   train::RunPlan plan = train::plan_run(spec, given, builtin_config_json);
//   MyObserver obs;                        // prints, draws the progress bar, writes metric files
//   train::Trainer trainer(std::move(plan), obs);   // checks memory, builds model and engine
//   trainer.resume();                      // spec.resume_from_checkpoint, when given
//   trainer.fit();                         // steps, evaluations and checkpoints per the plan
//   trainer.export_model(dir);
//
// What the caller sees: TrainerObserver's callbacks. The trainer composes the set-up reports
// (messages and table rows); the per-step numbers, evaluations and checkpoints arrive as structs,
// and what to print or write for them (console lines, a progress bar, CSV metrics) is the caller's.
//
// Several ranks (mpirun or the deepspeed launcher): every rank constructs its Trainer and calls
// the same methods in the same order; the constructor, resume, save, evaluate, step, fit,
// report_memory and export_model are collectives over comm::world(). Observer calls happen on
// every rank (a console prints on rank 0 only: is_lead()).
//
// Threading: one thread per rank; the observer is called on it.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ds/comm/topology.h"
#include "ds/data/loader.h"
#include "ds/models/gpt.h"
#include "ds/runtime/engine.h"
#include "ds/runtime/pipeline_engine.h"
#include "ds/train/outputs.h"
#include "ds/train/plan.h"
#include "ds/train/train_util.h"

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

class Trainer {
 public:
  // Checks that the run fits in memory (unless spec.skip_memory_check; throws "[ds_train] ... does
  // not fit ..." before anything large is allocated), builds the topology, the model (this rank's
  // stage and slices), imports spec.init_from, applies LoRA, builds the engine and the loader,
  // reports the memory budget and the data, and removes temporaries an interrupted run left in
  // spec.output_dir. `observer` must outlive the Trainer. Collective.
  Trainer(RunPlan plan, TrainerObserver& observer);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // spec.resume_from_checkpoint: "latest" (output_dir's newest checkpoint), a folder holding tags,
  // or one tag's folder. Restores the engine, the data position and the dropout stream; nullopt
  // when no resume was asked for (then a note says whether output_dir holds an earlier run's
  // checkpoints). Throws "[ds_train] ..." for a missing or foreign checkpoint. Collective.
  std::optional<ResumeReport> resume();
  std::optional<ResumeReport> resume_from(const std::string& from);

  // Writes output_dir/global_step<N> with the data position and the run's identity, then deletes
  // the oldest checkpoints beyond spec.save_total_limit (never the newest good one). Collective.
  SaveReport save();

  // Mean loss of the first `batches` micro-batches of the validation set, in order (the same
  // samples every time, so evaluations along a run compare); NaN without eval data or batches.
  // Collective (pipeline stages run it together).
  double evaluate(int64_t batches);
  // An evaluation of spec.eval_batches reported through on_eval, unless this step was evaluated
  // already (mark_evaluated) or there is no eval data. Collective.
  void evaluate_now();
  // Tells the trainer that `step` was evaluated already with `loss` (a run resumed at its end
  // finds its last evaluation in its metric files and must not evaluate that step twice).
  void mark_evaluated(int64_t step, double loss);

  // One optimizer step over the global batch; reported through on_step and returned. Collective.
  StepReport step();
  // The run: steps up to the plan's total, evaluating every eval_steps() and saving every
  // spec.save_steps, then waits for the engine, evaluates and saves at the end (unless that step
  // was saved). Throws "[ds_train] every one of the N steps ... was skipped" when no step of this
  // call applied. Returns the steps this call ran. Collective.
  int64_t fit();

  // Every rank's memory (model states, peaks) in rank order; rank 0 writes them to json_file
  // (memory.json, outputs.h) when it is not empty. Collective.
  std::vector<RankMemory> report_memory(const std::filesystem::path& json_file);
  // A text sample from the trained model (spec.sample_*), nullopt when no tokenizer was loaded or
  // the model is tensor- or pipeline-parallel (then a message says so). Every rank generates.
  std::optional<std::string> generate_sample();
  // The Hugging Face export at `dir` (LoRA: a PEFT adapter or merged weights, per spec), with the
  // tokenizer and an SFT set's chat template beside it; rank 0 writes. Returns the summary note
  // ("" for a plain export). Collective (ZeRO-3 and pipelines gather the weights).
  std::string export_model(const std::string& dir);

  const RunPlan& plan() const { return plan_; }
  bool is_lead() const { return rank_ == 0; }  // rank 0 prints and writes the job's files
  bool resumed() const { return resumed_; }
  int64_t eval_steps() const;  // spec.eval_steps, or a tenth of the run (-1 given); 0 = end only
  int64_t tokens_per_step() const;                 // B x T x A x dp: the whole global batch
  double last_eval() const { return last_eval_; }  // NaN before the first evaluation
  const runtime::MemoryBudget& memory_budget() const { return mem_; }
  const UnigramStats& unigram() const { return unigram_; }  // of the training data
  double eval_baseline() const { return eval_baseline_; }   // NaN without eval data
  const std::filesystem::path& output_dir() const { return out_dir_; }
  runtime::Engine& engine() { return *engine_; }
  runtime::PipelineEngine* pipeline() { return pipe_.get(); }  // null when pp = 1
  models::GPT& model() { return *model_; }
  data::DataLoader& loader() { return *loader_; }

 private:
  void check_memory();
  void build_model();
  void build_engine();
  void report_memory_budget();
  void open_data();
  void remove_stale_temporaries();
  void say(const std::string& text) { obs_.message(text); }
  void line(const std::string& text) { obs_.detail(text); }

  RunPlan plan_;
  TrainerObserver& obs_;
  int rank_ = 0;
  std::filesystem::path out_dir_;
  std::shared_ptr<comm::Topology> topology_;  // with tp or pp > 1
  models::PipeRange layers_;                  // this rank's pipeline stage (all when pp = 1)
  std::shared_ptr<models::GPT> model_;
  std::unique_ptr<runtime::PipelineEngine> pipe_;  // pp > 1: owns the stage's Engine
  std::unique_ptr<runtime::Engine> engine_owner_;  // pp = 1
  runtime::Engine* engine_ = nullptr;              // the one that steps
  std::unique_ptr<data::DataLoader> loader_;
  runtime::MemoryBudget mem_;
  UnigramStats unigram_;
  double eval_baseline_;
  bool resumed_ = false;
  // global_step folders of an earlier run found in the output folder when this run started afresh:
  // --save_total_limit never deletes them (this run did not write them).
  std::vector<std::string> earlier_run_;
  int64_t last_saved_ = -1;    // the step of the newest checkpoint this run has (or resumed)
  int64_t evaluated_at_ = -1;  // the step of the newest evaluation
  double last_eval_;
};

}  // namespace ds::train

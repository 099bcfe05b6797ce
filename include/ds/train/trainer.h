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
// The run's skeleton (resume, save and rotation, the step, fit()'s schedule and end-of-run check,
// the memory budget, the output folder) is train::TrainerBase's (trainer_base.h), shared with the
// task trainers; this class is the decoder LM's own part: the fit check, tensor and pipeline
// parallelism (the PipelineEngine behind TrainerBase's train_batch and checkpoint hooks), the
// token loader, the LM evaluation, the sample and the export.
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
#include "ds/train/trainer_base.h"

namespace ds::train {

class Trainer : public TrainerBase {
 public:
  // Checks that the run fits in memory (unless spec.skip_memory_check; throws "[ds_train] ... does
  // not fit ..." before anything large is allocated), builds the topology, the model (this rank's
  // stage and slices), imports spec.init_from, applies LoRA, builds the engine and the loader,
  // reports the memory budget and the data, and removes temporaries an interrupted run left in
  // spec.output_dir. `observer` must outlive the Trainer. Collective.
  Trainer(RunPlan plan, TrainerObserver& observer);
  ~Trainer() override;

  // resume(), resume_from(), save(), evaluate_now(), step(), fit(): TrainerBase's.

  // Mean loss of the first `batches` micro-batches of the validation set, in order (the same
  // samples every time, so evaluations along a run compare); NaN without eval data or batches.
  // Collective (pipeline stages run it together).
  double evaluate(int64_t batches);
  // Tells the trainer that `step` was evaluated already with `loss` (a run resumed at its end
  // finds its last evaluation in its metric files and must not evaluate that step twice).
  void mark_evaluated(int64_t step, double loss);

  // Every rank's memory (model states, peaks) in rank order; rank 0 writes them to json_file
  // (memory.json, outputs.h) when it is not empty. Collective.
  std::vector<RankMemory> report_memory(const std::filesystem::path& json_file);
  // A text sample from the trained model (spec.sample_*), nullopt when no tokenizer was loaded or
  // the model is tensor- or pipeline-parallel (then a message says so). Every rank generates.
  std::optional<std::string> generate_sample();
  // The Hugging Face export at `dir` (LoRA: a PEFT adapter or merged weights, per spec), with the
  // tokenizer and an SFT set's chat template beside it; rank 0 writes. Returns the summary note
  // ("" for a plain export). Collective (ZeRO-3 and pipelines gather the weights).
  std::string export_model(const std::string& dir) override;

  const RunPlan& plan() const { return plan_; }
  double last_eval() const { return last_eval_; }           // NaN before the first evaluation
  const UnigramStats& unigram() const { return unigram_; }  // of the training data
  double eval_baseline() const { return eval_baseline_; }   // NaN without eval data
  runtime::PipelineEngine* pipeline() { return pipe_.get(); }  // null when pp = 1
  models::GPT& model() { return *model_; }
  data::DataLoader& loader() { return *loader_; }

 private:
  void check_memory();
  void build_model();
  void build_engine();
  void open_data();

  // ---- TrainerBase's hooks ----
  const PlanBase& plan_base() const override { return plan_; }
  runtime::MicroBatch next_micro_batch() override;
  nlohmann::json data_state() const override { return loader_->state(); }
  void load_data_state(const nlohmann::json& state) override { loader_->load_state(state); }
  nlohmann::json checkpoint_fields() const override;
  void check_checkpoint(const nlohmann::json& ds_train) const override;
  void report_evaluation() override;
  // Through the PipelineEngine when pp > 1 (it also restores the last stage's tied embedding).
  double train_batch(const std::function<runtime::MicroBatch()>& next) override;
  nlohmann::json load_checkpoint(const std::string& dir, const std::string& tag) override;
  void save_checkpoint(const std::string& dir, const nlohmann::json& client) override;

  RunPlan plan_;
  std::shared_ptr<comm::Topology> topology_;  // with tp or pp > 1
  models::PipeRange layers_;                  // this rank's pipeline stage (all when pp = 1)
  std::shared_ptr<models::GPT> model_;
  std::unique_ptr<runtime::PipelineEngine> pipe_;  // pp > 1: owns the stage's Engine
  std::unique_ptr<runtime::Engine> engine_owner_;  // pp = 1
  std::unique_ptr<data::DataLoader> loader_;
  UnigramStats unigram_;
  double eval_baseline_;
  double last_eval_;
};

}  // namespace ds::train

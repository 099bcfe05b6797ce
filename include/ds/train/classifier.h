#pragma once
// Training an encoder sequence(-pair) classifier (models::SequenceClassifier: BERT, RoBERTa,
// DeBERTa-v2, whatever models::make_encoder_classifier builds for the config's family) on a
// classification set (ds_prepare --task classification; ds/data/classification_set.h): the
// Accelerate guide's experiment, fine-tuning on MRPC and reporting accuracy and F1.
//
// ds_train picks this trainer instead of train::Trainer (trainer.h, the decoder LM trainer) when
// --train_data is a classification set: that one check is the seam (is_classification_run); the
// rest of the GPT path is untouched. Both train through runtime::Engine with the same DeepSpeed
// config handling (train::resolve_run_config: "auto" values, batch sizes, run length, precisions,
// ZeRO stages 0-3, offload), write the same checkpoints (DeepSpeed's layout, with the data
// position) and report through the same TrainerObserver, plus on_classify_eval.
//
//   train::ClassifierPlan plan = train::plan_classifier(spec, given, builtin_config_json);
//   train::ClassifierTrainer trainer(std::move(plan), observer);
//   trainer.resume();                 // spec.resume_from_checkpoint, when given
//   trainer.fit();                    // steps, evaluations (loss, accuracy, F1), checkpoints
//   trainer.export_model(dir);        // a Hugging Face *ForSequenceClassification folder
//
// The model: --init_from a Hugging Face folder whose model_type is an encoder family (its
// classifier head is kept when its num_labels matches the data's, and initialised fresh when the
// folder has none, e.g. bert-base-uncased), or --model: the preset "bert-tiny" (2 layers, width
// 128, 2 heads; vocabulary, labels and pad id from the data) or an EncoderConfig JSON file (our
// form, models::EncoderConfig::to_json; absent vocab_size / num_labels / pad_token_id come from the
// data), randomly initialised from --seed.
//
// LoRA (--lora_dim and the other LoRA flags, docs/finetuning.md) with PEFT's TaskType.SEQ_CLS
// semantics (train::encoder_lora_config): applied after the import, before the engine; the export
// is a PEFT SEQ_CLS adapter with --only_optimize_lora (the LoRA matrices and the head), else
// (or with --merge_lora) the merged plain classifier.
//
// What a classifier run refuses, naming the option (it would otherwise be ignored): tensor or
// pipeline parallelism (flags or config), the sample options, --gradient_checkpointing,
// --device other than cpu, --block_size other than the set's seq_len, --model with --init_from.
//
// Batches: one micro-batch is B examples of the set's T ids; the engine receives them packed as
// inputs (3, B, T) int32 = [ids, token types, attention mask] and targets (B) int32 labels, and
// the loss function unpacks them (the cross entropy of SequenceClassifier::loss). Evaluation runs
// every validation example in order (or the first eval_batches x B when --eval_batches is given),
// in micro-batches of B (the last one smaller), on every rank (ZeRO-3 gathers together).
//
// Collectives and threading: as train::Trainer (every rank calls the same methods in order; one
// thread per rank).
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ds/data/classification_set.h"
#include "ds/data/sampler.h"
#include "ds/models/encoder.h"
#include "ds/nn/lora.h"
#include "ds/runtime/engine.h"
#include "ds/train/classify_metrics.h"
#include "ds/train/plan.h"
#include "ds/train/trainer.h"

namespace ds::train {

// Whether spec.train_data is a classification set (then ds_train runs ClassifierTrainer).
bool is_classification_run(const Options& spec);

struct ClassifierPlan {
  Options spec;
  Given given;
  std::filesystem::path train_dir;
  std::shared_ptr<const data::ClassificationSet> train, val;  // val null: none
  std::string val_from;
  std::filesystem::path tokenizer_dir;  // copied beside the export: --tokenizer, else the set's
  models::EncoderConfig model;
  std::string model_name;
  std::optional<nn::LoraConfig> lora;  // --lora_dim > 0 (train::encoder_lora_config)
  RunConfig run;
  int world_size = 1;
  int data_parallel = 1;
  int64_t seq_len = 0;        // T, the set's
  int64_t eval_examples = 0;  // per evaluation (all of val, or eval_batches x B)
  std::vector<std::string> notes;

  const runtime::DeepSpeedConfig& config() const { return run.cfg; }
  int64_t micro_batch() const { return run.cfg.batch.train_micro_batch_size_per_gpu; }
  int64_t grad_accum() const { return run.cfg.batch.gradient_accumulation_steps; }
  int64_t global_batch() const { return run.cfg.batch.train_batch_size; }
  int64_t total_steps() const { return run.total_steps; }
};

// Opens the set, resolves the model and the config, and checks what a classifier run refuses
// (above). Throws "[ds_train] ..." / "[config] ..." naming the option or file. Reads files only.
ClassifierPlan plan_classifier(const Options& spec, const Given& given, const char* builtin_config);

struct ClassifyEvalReport {
  int64_t step = 0, samples = 0;
  double loss = 0.0;  // mean cross entropy per example
  ClassifyScores scores;
  double seconds = 0.0;
};

// TrainerObserver plus the classifier's evaluations (on_eval is not called by this trainer).
class ClassifierObserver : public TrainerObserver {
 public:
  virtual void on_classify_eval(const ClassifyEvalReport& r) { (void)r; }
};

class ClassifierTrainer {
 public:
  // Builds the model (imports spec.init_from), the engine and the sampler. Collective.
  ClassifierTrainer(ClassifierPlan plan, ClassifierObserver& observer);
  ~ClassifierTrainer();
  ClassifierTrainer(const ClassifierTrainer&) = delete;
  ClassifierTrainer& operator=(const ClassifierTrainer&) = delete;

  // spec.resume_from_checkpoint ("latest", a folder holding tags, or one tag's folder); nullopt
  // when none was asked for. Throws for a missing checkpoint or one of another kind of run.
  std::optional<ResumeReport> resume();
  SaveReport save();
  // Loss, accuracy and F1 over the evaluation examples; nullopt without eval data. Collective.
  std::optional<ClassifyEvalReport> evaluate();
  void evaluate_now();  // evaluate() reported through on_classify_eval, once per step
  StepReport step();
  int64_t fit();  // to the plan's total steps, evaluating and saving as ds_train does
  // The Hugging Face export (config.json with id2label from the set's labels, model.safetensors,
  // the tokenizer). Collective (ZeRO-3 gathers); rank 0 writes.
  void export_model(const std::string& dir);

  const ClassifierPlan& plan() const { return plan_; }
  bool is_lead() const { return rank_ == 0; }
  int64_t eval_steps() const;
  runtime::Engine& engine() { return *engine_; }
  models::SequenceClassifier& model() { return *model_; }
  const std::filesystem::path& output_dir() const { return out_dir_; }
  const std::optional<ClassifyEvalReport>& last_eval() const { return last_eval_; }

 private:
  void say(const std::string& s) { obs_.message(s); }
  // Examples idx into a packed batch: inputs (3, n, T), targets (n).
  runtime::MicroBatch pack(const data::ClassificationSet& set, const std::vector<uint64_t>& idx,
                           uint64_t sample_base) const;

  ClassifierPlan plan_;
  ClassifierObserver& obs_;
  int rank_ = 0;
  std::filesystem::path out_dir_;
  std::shared_ptr<models::SequenceClassifier> model_;  // the family's class
  std::unique_ptr<runtime::Engine> engine_;
  std::unique_ptr<data::DistributedSampler> sampler_;
  std::shared_ptr<Tensor> logits_;  // the loss function's latest logits (evaluation reads them)
  std::optional<ClassifyEvalReport> last_eval_;
  int64_t evaluated_at_ = -1, last_saved_ = -1;
  std::vector<std::string> earlier_run_;  // global_step folders found at a fresh start: kept
};

}  // namespace ds::train

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
// Batches: one micro-batch is B examples of the set's T ids; the engine receives an nn::Batch of
// input_ids, token_type_ids, attention_mask (B, T) int32 and labels (B) int32, and the loss
// function is the cross entropy of the classifier's logits (kept for evaluation's metrics).
// Evaluation runs every validation example in order (or the first eval_batches x B when
// --eval_batches is given), in micro-batches of B (the last one smaller), on every rank (ZeRO-3
// gathers together).
//
// The skeleton (checkpoints, the step loop, the evaluation schedule) is train::TrainerBase's
// (trainer_base.h), the engine and sampler train::TaskTrainer's (task_trainer.h); this class is
// the classifier's batches, loss, evaluation and export. Collectives and threading: as
// TrainerBase's.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ds/data/classification_set.h"
#include "ds/models/encoder.h"
#include "ds/nn/lora.h"
#include "ds/runtime/engine.h"
#include "ds/train/classify_metrics.h"
#include "ds/train/plan.h"
#include "ds/train/task_trainer.h"

namespace ds::train {

// Whether spec.train_data is a classification set (then ds_train runs ClassifierTrainer).
bool is_classification_run(const Options& spec);

// The TaskPlan (task_plan.h: spec, config, run length, eval_examples, ...) plus the sets and the
// encoder.
struct ClassifierPlan : TaskPlan {
  std::shared_ptr<const data::ClassificationSet> train, val;  // val null: none
  models::EncoderConfig model;
  std::optional<nn::LoraConfig> lora;  // --lora_dim > 0 (train::encoder_lora_config)
  int64_t seq_len = 0;                 // T, the set's
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

class ClassifierTrainer : public TaskTrainer {
 public:
  // Builds the model (imports spec.init_from, applies LoRA), the engine and the sampler.
  // Collective.
  ClassifierTrainer(ClassifierPlan plan, ClassifierObserver& observer);
  ~ClassifierTrainer() override;

  // resume(), save(), evaluate_now(), step(), fit(): TrainerBase's (trainer_base.h).

  // Loss, accuracy and F1 over the evaluation examples; nullopt without eval data. Collective.
  std::optional<ClassifyEvalReport> evaluate();
  // The Hugging Face export (config.json with id2label from the set's labels, model.safetensors,
  // the tokenizer), or with LoRA a PEFT SEQ_CLS adapter (see the top). Collective (ZeRO-3
  // gathers); rank 0 writes.
  std::string export_model(const std::string& dir) override;

  const ClassifierPlan& plan() const { return plan_; }
  models::SequenceClassifier& model() { return *model_; }
  const std::optional<ClassifyEvalReport>& last_eval() const { return last_eval_; }

 private:
  // Examples idx as a named batch: input_ids, token_type_ids, attention_mask (n, T), labels (n).
  runtime::MicroBatch pack(const data::ClassificationSet& set, const std::vector<uint64_t>& idx,
                           uint64_t sample_base) const;

  // ---- TaskTrainer's and TrainerBase's hooks ----
  const PlanBase& plan_base() const override { return plan_; }
  runtime::MicroBatch pack_train(const std::vector<uint64_t>& idx,
                                 uint64_t sample_base) const override {
    return pack(*plan_.train, idx, sample_base);
  }
  nlohmann::json checkpoint_fields() const override;
  void check_checkpoint(const nlohmann::json& ds_train) const override;
  std::vector<std::string> describe_data() const override;
  int64_t activation_bytes() const override;
  void report_evaluation() override;

  ClassifierPlan plan_;
  ClassifierObserver& obs_;
  std::shared_ptr<models::SequenceClassifier> model_;  // the family's class
  std::shared_ptr<Tensor> logits_;  // the loss function's latest logits (evaluation reads them)
  std::optional<ClassifyEvalReport> last_eval_;
};

}  // namespace ds::train

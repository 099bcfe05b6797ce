#pragma once
// Fine-tuning an encoder-decoder (models::Seq2Seq: BART, BlenderBot) on a seq2seq set (ds_prepare
// --task seq2seq; ds/data/seq2seq_set.h): transformers' Seq2SeqTrainer with
// predict_with_generate, reporting the loss and the corpus BLEU (ds/train/bleu.h, sacreBLEU's
// defaults) of generations on the validation set.
//
// ds_train picks this trainer when --train_data is a seq2seq set (is_seq2seq_run), as it picks
// ClassifierTrainer for a classification set; the GPT path is untouched. The same config handling
// (train::resolve_run_config: "auto" values, batch sizes, run length, precisions, ZeRO stages
// 0-3, offload), checkpoints (DeepSpeed's layout, with the data position: a resumed run takes the
// steps of one that never stopped, bit for bit) and TrainerObserver, plus on_seq2seq_eval.
//
//   train::Seq2SeqPlan plan = train::plan_seq2seq(spec, given, builtin_config_json);
//   train::Seq2SeqTrainer trainer(std::move(plan), observer);
//   trainer.resume();                 // spec.resume_from_checkpoint, when given
//   trainer.fit();                    // steps, evaluations (loss, BLEU), checkpoints
//   trainer.export_model(dir);        // a Hugging Face *ForConditionalGeneration folder
//
// The model: --init_from a Hugging Face folder whose model_type is bart or blenderbot, or
// --model: the presets "bart-tiny" (BART's layout: 2 + 2 layers, d_model 64, 4 heads, FFN 128)
// and "blenderbot-tiny" (the same sizes, BlenderBot's pre-LN layout), a Seq2SeqConfig JSON file
// (our form, models::Seq2SeqConfig::to_json) or a Hugging Face config.json (with model_type).
// For presets and our JSON, absent vocab_size, pad / bos / eos / decoder start ids and
// max_positions come from the data; parameters are drawn from --seed. The data must use the
// model's pad and decoder start ids and fit its vocabulary and positions (errors say so).
//
// What a seq2seq run refuses, naming the option: tensor or pipeline parallelism, the sample
// options, --device other than cpu, --block_size, --model with --init_from.
//
// LoRA (--lora_dim and the other LoRA flags, docs/finetuning.md) with PEFT's TaskType.SEQ_2_SEQ_LM
// semantics (train::seq2seq_lora_config): applied after the import, before the engine;
// evaluations generate from the merged weights; the export is a PEFT SEQ_2_SEQ_LM adapter with
// --only_optimize_lora (the LoRA matrices), else (or with --merge_lora) the merged plain model.
// --gradient_checkpointing checkpoints every encoder and decoder layer.
//
// Batches: one micro-batch is B examples; the engine receives an nn::Batch of input_ids and
// attention_mask (B, S) int32 (the source) and labels (B, T) int32 (-100 = ignored); the engine's
// default loss is Seq2Seq::loss(batch) with the decoder input shift_tokens_right(labels), so the
// loss is the mean cross entropy over target tokens only. Evaluation: the loss of every validation
// example in order (or the first eval_batches x B when --eval_batches is given), in micro-batches
// of B (the last one smaller), as the mean over target tokens; then (rank 0) generations for the
// first eval_bleu_examples examples from an fp32 copy of the whole model (greedy, or beam search
// with generation_num_beams; at most generation_max_length new tokens, default the set's T),
// decoded without special tokens, and their corpus BLEU against the decoded targets.
//
// The skeleton (checkpoints, the step loop, the evaluation schedule) is train::TrainerBase's
// (trainer_base.h), the engine and sampler train::TaskTrainer's (task_trainer.h); this class is
// the encoder-decoder's batches, evaluation (loss and BLEU) and export. Collectives and
// threading: as TrainerBase's; evaluate(), generate() and export_model() are collective (ZeRO-3
// gathers).
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ds/data/seq2seq_set.h"
#include "ds/data/text_tokenizer.h"
#include "ds/models/seq2seq.h"
#include "ds/nn/lora.h"
#include "ds/runtime/engine.h"
#include "ds/train/bleu.h"
#include "ds/train/plan.h"
#include "ds/train/task_trainer.h"

namespace ds::train {

// Whether spec.train_data is a seq2seq set (then ds_train runs Seq2SeqTrainer).
bool is_seq2seq_run(const Options& spec);

// The TaskPlan (task_plan.h: spec, config, run length, eval_examples, ...) plus the sets, the
// encoder-decoder and the evaluation's generation settings.
struct Seq2SeqPlan : TaskPlan {
  std::shared_ptr<const data::Seq2SeqSet> train, val;  // val null: none
  models::Seq2SeqConfig model;
  int64_t source_len = 0, target_len = 0;  // S, T: the set's
  int64_t bleu_examples = 0;               // generated per evaluation
  models::BeamOptions generation;          // the evaluation's generation settings
  std::optional<nn::LoraConfig> lora;      // --lora_dim > 0 (train::seq2seq_lora_config)
};

// Opens the set, resolves the model and the config, and checks what a seq2seq run refuses (above).
// Throws "[ds_train] ..." / "[config] ..." naming the option or file. Reads files only.
Seq2SeqPlan plan_seq2seq(const Options& spec, const Given& given, const char* builtin_config);

struct Seq2SeqEvalReport {
  int64_t step = 0, samples = 0;
  double loss = 0.0;  // mean cross entropy per target token
  int64_t examples = 0, tokens = 0;
  std::optional<BleuScore> bleu;  // none without generations (eval_bleu_examples 0, no tokenizer)
  int64_t generated = 0;          // examples generated for BLEU
  std::vector<std::string> sources, hypotheses, references;  // the first few, for a look
  double seconds = 0.0;
};

// TrainerObserver plus the seq2seq evaluations (on_eval is not called by this trainer).
class Seq2SeqObserver : public TrainerObserver {
 public:
  virtual void on_seq2seq_eval(const Seq2SeqEvalReport& r) { (void)r; }
};

class Seq2SeqTrainer : public TaskTrainer {
 public:
  // Builds the model (imports spec.init_from), the engine and the sampler; loads the tokenizer
  // that decodes generations (plan.tokenizer_dir). Collective.
  Seq2SeqTrainer(Seq2SeqPlan plan, Seq2SeqObserver& observer);
  ~Seq2SeqTrainer() override;

  // resume(), save(), evaluate_now(), step(), fit(): TrainerBase's (trainer_base.h).

  // Loss and BLEU over the evaluation examples; nullopt without eval data. Collective.
  std::optional<Seq2SeqEvalReport> evaluate();
  // Generations for source ids (B, S) / mask (B, S) with `opt`, decoded without special tokens,
  // from an fp32 copy of the whole model. Collective (ZeRO-3 gathers); the texts on rank 0, empty
  // on the others.
  std::vector<std::string> generate(const Tensor& ids, const Tensor& mask,
                                    const models::BeamOptions& opt);
  // The Hugging Face export (config.json, generation_config.json, model.safetensors, the
  // tokenizer; LoRA merged), or a PEFT adapter folder (train::exports_lora_adapter). Collective
  // (ZeRO-3 gathers); rank 0 writes.
  std::string export_model(const std::string& dir) override;

  const Seq2SeqPlan& plan() const { return plan_; }
  models::Seq2Seq& model() { return *model_; }
  const data::TextTokenizer* tokenizer() const { return tok_.get(); }
  const std::optional<Seq2SeqEvalReport>& last_eval() const { return last_eval_; }

 private:
  // Examples idx as a named batch: input_ids, attention_mask (n, S), labels (n, T).
  runtime::MicroBatch pack(const data::Seq2SeqSet& set, const std::vector<uint64_t>& idx,
                           uint64_t sample_base) const;
  // An fp32 model with the engine's current weights (rank 0; nullptr on the others). Collective.
  std::unique_ptr<models::Seq2Seq> whole_model();

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

  Seq2SeqPlan plan_;
  Seq2SeqObserver& obs_;
  std::shared_ptr<models::Seq2Seq> model_;
  std::unique_ptr<data::TextTokenizer> tok_;
  std::optional<Seq2SeqEvalReport> last_eval_;
};

}  // namespace ds::train

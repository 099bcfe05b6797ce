#include "ds/train/classifier.h"

#include <algorithm>
#include <chrono>
#include <fstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "ds/core/error.h"
#include "ds/core/file_io.h"
#include "ds/core/safetensors.h"
#include "ds/models/family.h"
#include "ds/models/encoder_io.h"
#include "ds/models/peft_io.h"
#include "ds/nn/lora.h"
#include "ds/ops/ops.h"
#include "ds/train/lora.h"
#include "ds/train/outputs.h"
#include "ds/train/train_util.h"

namespace ds::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The random-init preset: BERT's layout, small enough for a CPU test (about 0.4M parameters
// besides the embeddings).
json bert_tiny() {
  return {{"family", "bert"},  {"n_layer", 2},         {"n_head", 2},         {"n_embd", 128},
          {"ffn_hidden", 512}, {"max_positions", 512}, {"hidden_act", "gelu"}};
}

// Whether the weights at `path` (a .safetensors file or a folder of them) hold a classifier head
// (tensors named classifier.*): a pretraining checkpoint (bert-base-uncased) has none.
bool has_classifier_head(const fs::path& path) {
  std::vector<fs::path> files;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.path().extension() == ".safetensors") files.push_back(e.path());
  } else {
    files.push_back(path);
  }
  for (const fs::path& f : files) {
    const safetensors::Reader r(f.string());
    for (const std::string& n : r.names())
      if (n.rfind("classifier.", 0) == 0) return true;
  }
  return false;
}

// The set's tokenizer folder as meta.json records it ("" when it is gone).
fs::path set_tokenizer(const fs::path& dir) {
  try {
    const json meta = json::parse(std::ifstream(dir / "meta.json"));
    const fs::path p = meta.at("tokenizer").value("path", std::string());
    std::error_code ec;
    return !p.empty() && fs::is_directory(p, ec) ? p : fs::path();
  } catch (const std::exception&) {
    return {};
  }
}

models::EncoderConfig resolve_encoder(const Options& o, const Given& g,
                                      const data::ClassificationSet& set, std::string* name) {
  // Values the data decides unless the model says otherwise.
  json from_data = {{"vocab_size", set.vocab_size()},
                    {"num_labels", set.num_labels()},
                    {"pad_token_id", set.pad_id()},
                    {"max_positions", std::max<int64_t>(512, set.seq_len())}};
  if (!o.init_from.empty()) {
    DS_CHECK(!g.model,
             "[ds_train] --model {} with --init_from {}: give one (the model is --init_from's "
             "config.json)",
             o.model, o.init_from);
    const auto c = models::read_hf_encoder_config(o.init_from);
    DS_CHECK(c.has_value(),
             "[ds_train] --init_from {}: no config.json with an encoder model_type ({}) there, "
             "but --train_data {} is a classification set, which trains an encoder classifier",
             o.init_from, models::supported_model_types(models::ModelKind::encoder_classifier), o.train_data);
    *name = fs::path(o.init_from).filename().string();
    models::EncoderConfig m = *c;
    if ((m.num_labels != set.num_labels() || m.regression()) && !has_classifier_head(o.init_from)) {
      // No head to keep (a pretraining checkpoint): the new one has the data's labels, as
      // from_pretrained(..., num_labels=NL) makes it.
      m.num_labels = set.num_labels();
      m.problem_type = "single_label_classification";
    }
    return m;
  }
  json j = from_data;
  const std::string model = g.model ? o.model : "bert-tiny";
  if (model == "bert-tiny") {
    j.update(bert_tiny());
    *name = "bert-tiny";
  } else {
    const std::string file_name = model_json_file(model);
    std::error_code ec;
    DS_CHECK(fs::is_regular_file(file_name, ec),
             "[ds_train] --model {}: a classification set trains an encoder classifier: give "
             "the preset bert-tiny, an encoder config JSON file (models::EncoderConfig's fields), "
             "a Hugging Face folder or config.json of model_type {} (random weights), or "
             "--init_from such a folder (its weights)",
             model, models::supported_model_types(models::ModelKind::encoder_classifier));
    const json file = read_model_json(file_name);
    if (file.contains("model_type")) {  // a Hugging Face config.json
      const auto c = models::encoder_config_from_json(file, file_name);
      *name = model_display_name(model);
      return c;
    }
    j.update(file);
    *name = model_display_name(model);
  }
  j["seed"] = o.seed;
  try {
    return models::EncoderConfig::from_json(j);
  } catch (const Error& e) {
    DS_THROW("[ds_train] --model {}: {}", model, e.what());
  }
}

}  // namespace

bool is_classification_run(const Options& spec) {
  return !spec.train_data.empty() && data::is_classification_set(spec.train_data);
}

constexpr TaskNames kClassifier{"classification", "classifier", "encoder classifiers"};

ClassifierPlan plan_classifier(const Options& o, const Given& g, const char* builtin_config) {
  ClassifierPlan p;
  p.names = kClassifier;
  p.spec = o;
  p.given = g;
  // ---- options that do not apply to a classifier: errors, not silence ----
  refuse_common_options(p.names, o, g, "a classifier generates no text");
  refuse_option(p.names, o.gradient_checkpointing, "--gradient_checkpointing",
                "not wired for encoder classifiers yet");

  // ---- data ----
  open_task_splits(p, &p.train, &p.val);
  const data::ClassificationSet& tr = *p.train;
  if (p.val)
    DS_CHECK(p.val->seq_len() == tr.seq_len() && p.val->labels() == tr.labels(),
             "[ds_train] --eval_data {}: seq_len {} and labels ({}) differ from --train_data's "
             "({}; {}); prepare both with the same --seq_len and --labels",
             p.val_from, p.val->seq_len(), fmt::join(p.val->labels(), ", "), tr.seq_len(),
             fmt::join(tr.labels(), ", "));
  p.seq_len = p.tokens_per_example = tr.seq_len();
  DS_CHECK(o.block_size <= 0 || o.block_size == p.seq_len,
           "[ds_train] --block_size {}: the classification set {} was prepared with --seq_len {} "
           "(every example is {} ids); give --block_size {} or none, or re-run ds_prepare",
           o.block_size, p.train_dir.string(), p.seq_len, p.seq_len, p.seq_len);

  // ---- model ----
  p.model = resolve_encoder(o, g, tr, &p.model_name);
  models::EncoderConfig& m = p.model;
  DS_CHECK(!m.regression() && m.problem_type != "multi_label_classification",
           "[ds_train] the model ({}) is configured for {}, but a classification set has one "
           "class id per example (single_label_classification)",
           p.model_name, m.regression() ? "regression" : "multi-label classification");
  DS_CHECK(m.num_labels == tr.num_labels(),
           "[ds_train] the model ({}) has num_labels {}, the data {} ({}); set num_labels in the "
           "model's config.json to {} (a pretraining checkpoint without a classifier head takes "
           "any)",
           p.model_name, m.num_labels, tr.num_labels(), fmt::join(tr.labels(), ", "),
           tr.num_labels());
  // The eval set too: a mismatch found at the first evaluation would cost the steps before it.
  for (const data::ClassificationSet* set : {p.train.get(), p.val.get()})
    DS_CHECK(!set || set->vocab_size() <= m.vocab_size,
             "[ds_train] {}: the data's vocabulary ({} ids) does not fit the model's vocab_size "
             "{}: prepare the data with the model's tokenizer",
             set ? set->file().string() : "", set ? set->vocab_size() : 0, m.vocab_size);
  DS_CHECK(tr.pad_id() == m.pad_token_id,
           "[ds_train] the data is padded with id {}, the model's pad_token_id is {}: prepare the "
           "data with the model's tokenizer",
           tr.pad_id(), m.pad_token_id);
  p.tokenizer_dir = o.tokenizer.empty()
                       ? set_tokenizer(p.train_dir)
                       : checked_tokenizer_option(o, tr.vocab_size(), m.vocab_size);
  p.lora = encoder_lora_config(o, g, m);
  // DeBERTa-v2 with type_vocab_size 0 (deberta-v2-xlarge) has no token type embedding: it ignores
  // the ids, as transformers does.
  for (const data::ClassificationSet* set : {p.train.get(), p.val.get()})
    DS_CHECK(!set || m.type_vocab_size == 0 || set->max_type_id() < m.type_vocab_size,
             "[ds_train] {} has token type ids up to {}, the model's type_vocab_size is {}: "
             "prepare the data with the model's tokenizer (RoBERTa's pairs have type 0 only)",
             set ? set->file().string() : "", set ? set->max_type_id() : 0, m.type_vocab_size);
  const int64_t positions = m.roberta() ? p.seq_len + m.pad_token_id + 1 : p.seq_len;
  DS_CHECK(positions <= m.max_positions,
           "[ds_train] the set's seq_len {} needs {} position embeddings, the model has {} "
           "(max_position_embeddings)",
           p.seq_len, positions, m.max_positions);
  m.seed = o.seed;
  m.validate();

  // ---- config, run length ----
  resolve_task_run(p, m.n_embd, m.n_layer, p.val ? p.val->size() : 0, builtin_config);
  return p;
}

// ---- the trainer -----------------------------------------------------------------------------

ClassifierTrainer::ClassifierTrainer(ClassifierPlan plan, ClassifierObserver& observer)
    : TaskTrainer(observer),
      plan_(std::move(plan)),
      obs_(observer),
      logits_(std::make_shared<Tensor>()) {
  const ClassifierPlan& p = plan_;
  const Options& o = p.spec;
  const bool import = !o.init_from.empty();
  model_ = models::make_encoder_classifier(p.model, /*init=*/true);
  if (import) {
    const auto rep = models::load_hf_encoder_weights(*model_, o.init_from,
                                                     /*allow_missing_head=*/true);
    say(fmt::format(
        "initialised from {}: {} tensors{}{}", fmt::join(rep.files, ", "), rep.tensors,
        rep.ignored.empty() ? "" : fmt::format("; ignored {}", fmt::join(rep.ignored, ", ")),
        rep.missing_head.empty()
            ? ""
            : fmt::format("; new classifier head (not in the folder, initialised "
                          "from --seed): {}",
                          fmt::join(rep.missing_head, ", "))));
  }
  if (p.lora) {
    // Before the engine: it lays out gradients and optimizer states for what requires grad.
    const nn::LoraReport rep = nn::apply_lora(*model_, *p.lora);
    say(describe_lora(*p.lora, rep));
  }
  const models::EncoderConfig& m = p.model;
  say(
      fmt::format("model: {} ({} encoder classifier, L {}, NH {}, C {}, V {}, {} labels): {} "
                  "parameters",
                  p.model_name, m.family, m.n_layer, m.n_head, m.n_embd, m.vocab_size, m.num_labels,
                  human_count(static_cast<double>(model_->num_parameters()))));

  // The loss of the batch's ids, mask and token types against its labels; the logits are kept
  // for evaluation.
  std::shared_ptr<Tensor> keep = logits_;
  start(model_, [keep](nn::Module& module, const nn::Batch& b) {
    auto& enc = dynamic_cast<models::SequenceClassifier&>(module);
    Tensor logits = enc.logits({b.input_ids, b.attention_mask, b.token_type_ids});
    *keep = logits.detach();
    return ops::cross_entropy(logits, ops::reshape(b.labels, {b.input_ids.size(0)}), -100);
  });
}

ClassifierTrainer::~ClassifierTrainer() = default;

int64_t ClassifierTrainer::activation_bytes() const {
  // The encoder's layers over B x T tokens, then its final hidden states (the head reads one row
  // of each sequence).
  const models::EncoderConfig& m = plan_.model;
  return stack_activation_estimate(plan_.micro_batch() * plan_.seq_len, m.n_layer, m.n_embd,
                                   m.ffn_hidden, 2 * m.n_embd, /*ckpt=*/false,
                                   static_cast<int64_t>(dtype_size(plan_.config().training_dtype())));
}

std::vector<std::string> ClassifierTrainer::describe_data() const {
  const ClassifierPlan& p = plan_;
  const auto& tr = *p.train;
  std::vector<std::string> lines = {
      fmt::format("train data: {}: {} {} examples of T {} ({} labels: {}) -> {} steps/epoch at {} "
                  "examples/step (micro-batch {} x accumulation {})",
                  p.train_dir.string(), tr.size(), tr.pair() ? "sentence-pair" : "single-sentence",
                  tr.seq_len(), tr.num_labels(), fmt::join(tr.labels(), ", "),
                  p.run.steps_per_epoch, p.global_batch(), p.micro_batch(), p.grad_accum())};
  if (p.val)
    lines.push_back(
        fmt::format("eval data: {} (val): {} of {} examples per evaluation; loss, accuracy, {}",
                    p.val_from, p.eval_examples, p.val->size(),
                    tr.num_labels() == 2 ? "binary F1 of label 1" : "macro F1"));
  return lines;
}

runtime::MicroBatch ClassifierTrainer::pack(const data::ClassificationSet& set,
                                            const std::vector<uint64_t>& idx,
                                            uint64_t sample_base) const {
  const int64_t n = static_cast<int64_t>(idx.size()), T = set.seq_len();
  runtime::MicroBatch b{{.input_ids = Tensor::empty({n, T}, DType::i32),
                         .labels = Tensor::empty({n}, DType::i32),
                         .attention_mask = Tensor::empty({n, T}, DType::i32),
                         .token_type_ids = Tensor::empty({n, T}, DType::i32)},
                        sample_base};
  int32_t* x = b.batch.input_ids.data<int32_t>();
  int32_t* types = b.batch.token_type_ids.data<int32_t>();
  int32_t* mask = b.batch.attention_mask.data<int32_t>();
  int32_t* y = b.batch.labels.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    const size_t at = static_cast<size_t>(i * T);
    set.get(static_cast<int64_t>(idx[static_cast<size_t>(i)]), {x + at, static_cast<size_t>(T)},
            {types + at, static_cast<size_t>(T)}, {mask + at, static_cast<size_t>(T)}, y[i]);
  }
  return b;
}

// ---- checkpoints -----------------------------------------------------------------------------

json ClassifierTrainer::checkpoint_fields() const {
  return {{"seq_len", plan_.seq_len},
          {"model", plan_.model.to_json()},
          {"labels", plan_.train->labels()}};
}

void ClassifierTrainer::check_checkpoint(const json& d) const {
  DS_CHECK(d.value("seq_len", plan_.seq_len) == plan_.seq_len,
           "[ds_train] the checkpoint was trained on examples of {} ids, this run's set has {}",
           d.value("seq_len", plan_.seq_len), plan_.seq_len);
}

// ---- evaluation ------------------------------------------------------------------------------

std::optional<ClassifyEvalReport> ClassifierTrainer::evaluate() {
  if (!plan_.val || plan_.eval_examples == 0) return std::nullopt;
  const auto t0 = std::chrono::steady_clock::now();
  const data::ClassificationSet& val = *plan_.val;
  const int64_t N = plan_.eval_examples, B = plan_.micro_batch();
  std::vector<int32_t> pred, labels;
  double loss_sum = 0.0;
  for (const std::vector<uint64_t>& idx : eval_batches(N, B)) {
    const runtime::MicroBatch b = pack(val, idx, 0);
    const double loss = engine().eval_loss(b.batch).item();
    loss_sum += loss * static_cast<double>(idx.size());
    const std::vector<float> lg = logits_->to_vector();
    const int64_t NL = val.num_labels();
    for (size_t i = 0; i < idx.size(); ++i) {
      const float* row = lg.data() + i * static_cast<size_t>(NL);
      pred.push_back(static_cast<int32_t>(std::max_element(row, row + NL) - row));
      labels.push_back(val.label(static_cast<int64_t>(idx[i])));
    }
  }
  ClassifyEvalReport r;
  r.step = engine().global_steps();
  r.samples = engine().global_samples();
  r.loss = loss_sum / static_cast<double>(N);
  r.scores = classify_scores(pred, labels, val.num_labels());
  r.seconds = seconds_since(t0);
  return r;
}

void ClassifierTrainer::report_evaluation() {
  last_eval_ = evaluate();
  if (last_eval_) obs_.on_classify_eval(*last_eval_);
}

// ---- the export ------------------------------------------------------------------------------

std::string ClassifierTrainer::export_model(const std::string& dir) {
  auto weights = engine().full_weights();  // ZeRO-3: every rank gathers, rank 0 receives
  if (!is_lead()) return "";
  const std::optional<nn::LoraConfig>& lora = plan_.lora;
  if (exports_lora_adapter(lora, plan_.spec)) {
    // Only LoRA and the head trained: PEFT's adapter holds everything that changed.
    const std::string base = lora_adapter_base(plan_.spec);
    models::export_peft_classifier_adapter(*model_, weights, *lora, dir, base);
    say(fmt::format(
        "{} (PEFT SEQ_CLS adapter: adapter_config.json + adapter_model.safetensors{})", dir,
        base.empty() ? "; the base is this run's from-scratch model: --merge_lora exports it whole"
                     : "; base " + base));
    return "";  // as a decoder's adapter: no tokenizer (the base folder has it)
  }
  // Merged (--merge_lora, or other weights trained too): W + scaling B A, the plain classifier.
  if (lora) weights = nn::merge_lora_weights(weights, lora->scaling());
  // A whole fp32 copy (the engine's parameters may be 16-bit or ZeRO-3 shards).
  const auto whole = models::make_encoder_classifier(plan_.model, /*init=*/false);
  copy_weights(*whole, weights);
  models::export_hf_encoder(*whole, dir);
  // The set's label names (MRPC: 0 / 1; names given to ds_prepare --labels) as id2label.
  models::write_hf_label_names(dir, plan_.train->labels());
  say(export_tokenizer_beside(dir, {fs::path(plan_.spec.init_from), plan_.tokenizer_dir},
                              plan_.model.vocab_size));
  // A PreTrainedTokenizerFast folder (what the tokenizer export writes) returns no token type ids
  // unless model_input_names lists them, and the model would then see every token as segment 0:
  // transformers' pipeline would score pairs differently from this training.
  const fs::path tok_cfg = fs::path(dir) / "tokenizer_config.json";
  if (plan_.train->pair() && plan_.model.type_vocab_size > 1 && fs::exists(tok_cfg)) {
    json t = json::parse(std::ifstream(tok_cfg));
    if (t.is_object() && !t.contains("model_input_names")) {
      t["model_input_names"] = {"input_ids", "token_type_ids", "attention_mask"};
      write_file_atomic(tok_cfg, t.dump(2) + "\n");
    }
  }
  return "";
}

}  // namespace ds::train

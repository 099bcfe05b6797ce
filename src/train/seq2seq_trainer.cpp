#include "ds/train/seq2seq_trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "ds/core/error.h"
#include "ds/core/file_io.h"
#include "ds/models/family.h"
#include "ds/models/seq2seq_io.h"
#include "ds/nn/lora.h"
#include "ds/ops/ops.h"
#include "ds/train/lora.h"
#include "ds/train/outputs.h"
#include "ds/train/train_util.h"

namespace ds::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr size_t kKeepExamples = 3;  // generations kept in the report for a look

// The random-init presets: small enough for a CPU test (about 0.1M parameters besides the
// embeddings); the family's architecture flags.
models::Seq2SeqConfig tiny_preset(const std::string& family) {
  models::Seq2SeqConfig c;
  c.family = family;
  c.set_family_architecture();
  c.d_model = 64;
  c.encoder_layers = c.decoder_layers = 2;
  c.encoder_heads = c.decoder_heads = 4;
  c.encoder_ffn = c.decoder_ffn = 128;
  c.activation = "gelu";
  c.dropout = 0.1f;
  return c;
}

models::Seq2SeqConfig resolve_seq2seq(const Options& o, const Given& g, const data::Seq2SeqSet& set,
                                      std::string* name) {
  if (!o.init_from.empty()) {
    DS_CHECK(!g.model,
             "[ds_train] --model {} with --init_from {}: give one (the model is --init_from's "
             "config.json)",
             o.model, o.init_from);
    const auto c = models::read_hf_seq2seq_config(o.init_from);
    DS_CHECK(c.has_value(),
             "[ds_train] --init_from {}: no config.json with an encoder-decoder model_type ({}) "
             "there, but --train_data {} is a seq2seq set, which trains an encoder-decoder",
             o.init_from, models::supported_model_types(models::ModelKind::seq2seq), o.train_data);
    *name = fs::path(o.init_from).filename().string();
    return *c;
  }
  // Values the data decides unless the model says otherwise.
  const int64_t eos = set.eos_id();
  const json from_data = {
      {"vocab_size", set.vocab_size()},
      {"pad_token_id", set.pad_id()},
      {"bos_token_id", set.bos_id() >= 0 ? set.bos_id() : eos},
      {"eos_token_id", eos},
      {"decoder_start_token_id", set.decoder_start_id()},
      {"forced_eos_token_id", eos},
      {"max_positions", std::max<int64_t>({128, set.source_len(), set.target_len()})}};
  const std::string model = g.model ? o.model : "bart-tiny";
  json j;
  if (model == "bart-tiny" || model == "blenderbot-tiny") {
    j = tiny_preset(model == "bart-tiny" ? "bart" : "blenderbot").to_json();
    j.update(from_data);
    *name = model;
  } else {
    const std::string file_name = model_json_file(model);
    std::error_code ec;
    DS_CHECK(fs::is_regular_file(file_name, ec),
             "[ds_train] --model {}: a seq2seq set trains an encoder-decoder: give the preset "
             "bart-tiny or blenderbot-tiny, a Seq2SeqConfig JSON file, a Hugging Face folder or "
             "config.json of model_type {} (random weights), or --init_from such a folder (its "
             "weights)",
             model, models::supported_model_types(models::ModelKind::seq2seq));
    const json file = read_model_json(file_name);
    *name = model_display_name(model);
    if (file.contains("model_type")) return models::seq2seq_config_from_json(file, file_name);
    models::Seq2SeqConfig base;
    base.family = file.value("family", std::string("bart"));
    base.set_family_architecture();
    j = base.to_json();
    j.update(from_data);
    j.update(file);
  }
  j["seed"] = o.seed;
  try {
    return models::Seq2SeqConfig::from_json(j);
  } catch (const Error& e) {
    DS_THROW("[ds_train] --model {}: {}", model, e.what());
  }
}

// The tokenizer that decodes generations without --tokenizer: the set's, the --init_from folder.
fs::path pick_tokenizer(const Options& o, const data::Seq2SeqSet& set) {
  std::error_code ec;
  for (const fs::path& p : {set.tokenizer_path(), fs::path(o.init_from)})
    if (!p.empty() && fs::is_directory(p, ec) && data::has_tokenizer_files(p)) return p;
  return {};
}

// Row ids of a generation (B, 1 + n): after the start token, up to eos, without pad.
std::vector<int32_t> generated_row(const std::vector<int64_t>& out, int64_t row, int64_t width,
                                   int64_t eos, int64_t pad) {
  std::vector<int32_t> ids;
  for (int64_t k = 1; k < width; ++k) {
    const int64_t id = out[static_cast<size_t>(row * width + k)];
    if (id == eos) break;
    if (id == pad) continue;
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

}  // namespace

bool is_seq2seq_run(const Options& spec) {
  return !spec.train_data.empty() && data::is_seq2seq_set(spec.train_data);
}

constexpr TaskNames kSeq2Seq{"seq2seq", "seq2seq", "encoder-decoders"};

Seq2SeqPlan plan_seq2seq(const Options& o, const Given& g, const char* builtin_config) {
  Seq2SeqPlan p;
  p.names = kSeq2Seq;
  p.spec = o;
  p.given = g;
  auto refuse = [&p](bool given, const char* option, const char* why) {
    refuse_option(p.names, given, option, why);
  };
  refuse_common_options(p.names, o, g,
                        "evaluations generate from the validation sources and report BLEU");
  refuse(o.block_size > 0, "--block_size",
         "the set's --max_source_len / --max_target_len fix the lengths");

  // ---- data ----
  open_task_splits(p, &p.train, &p.val);
  const data::Seq2SeqSet& tr = *p.train;
  if (p.val)
    DS_CHECK(p.val->source_len() == tr.source_len() && p.val->target_len() == tr.target_len() &&
                 p.val->pad_id() == tr.pad_id(),
             "[ds_train] --eval_data {}: max_source_len {}, max_target_len {} and pad id {} differ "
             "from --train_data's ({}, {}, {}); prepare both with the same tokenizer and lengths",
             p.val_from, p.val->source_len(), p.val->target_len(), p.val->pad_id(), tr.source_len(),
             tr.target_len(), tr.pad_id());
  p.source_len = tr.source_len();
  p.target_len = p.tokens_per_example = tr.target_len();

  // ---- model ----
  p.model = resolve_seq2seq(o, g, tr, &p.model_name);
  models::Seq2SeqConfig& m = p.model;
  // The eval set too: a mismatch found at the first evaluation would cost the steps before it.
  for (const data::Seq2SeqSet* set : {p.train.get(), p.val.get()})
    DS_CHECK(!set || set->vocab_size() <= m.vocab_size,
             "[ds_train] {}: the data's vocabulary ({} ids) does not fit the model's vocab_size "
             "{}: prepare the data with the model's tokenizer",
             set ? set->file().string() : "", set ? set->vocab_size() : 0, m.vocab_size);
  DS_CHECK(tr.pad_id() == m.pad_token_id,
           "[ds_train] the data is padded with id {}, the model's pad_token_id is {}: prepare the "
           "data with the model's tokenizer",
           tr.pad_id(), m.pad_token_id);
  DS_CHECK(tr.eos_id() == m.eos_token_id,
           "[ds_train] the data's targets end with eos id {}, the model's eos_token_id is {}: "
           "prepare the data with the model's tokenizer",
           tr.eos_id(), m.eos_token_id);
  DS_CHECK(std::max(p.source_len, p.target_len) <= m.max_positions,
           "[ds_train] the set's max_source_len {} / max_target_len {} exceed the model's "
           "max_position_embeddings {}: prepare the data with smaller lengths",
           p.source_len, p.target_len, m.max_positions);
  m.seed = o.seed;
  m.validate();
  p.lora = seq2seq_lora_config(o, g, m);
  p.tokenizer_dir = o.tokenizer.empty()
                       ? pick_tokenizer(o, tr)
                       : checked_tokenizer_option(o, tr.vocab_size(), m.vocab_size);

  // ---- config, run length ----
  resolve_task_run(p, m.d_model, m.encoder_layers + m.decoder_layers, p.val ? p.val->size() : 0,
                   builtin_config);
  if (p.val) {
    p.bleu_examples = std::min<int64_t>(p.val->size(), o.eval_bleu_examples);
    if (p.bleu_examples > 0 && p.tokenizer_dir.empty()) {
      p.notes.push_back(
          "no tokenizer to decode generations (the set's is gone; give --tokenizer): "
          "evaluations report the loss only");
      p.bleu_examples = 0;
    }
  }
  // Generation: transformers' defaults with the config's eos, as Seq2SeqTrainer with
  // predict_with_generate, generation_num_beams and generation_max_length.
  p.generation.num_beams = o.generation_num_beams;
  // Checked here, not at the first evaluation: a run must not train for hours and then fail.
  // Learned positions (BART, BlenderBot) hold the start token and max_new_tokens more.
  const int64_t positions = m.is_t5() ? INT64_MAX : m.max_positions - 1;
  DS_CHECK(o.generation_max_length <= positions,
           "[ds_train] --generation_max_length {}: the decoder start token and {} generated "
           "tokens need {} positions, the model has {} (max_position_embeddings); give at most {}",
           o.generation_max_length, o.generation_max_length, o.generation_max_length + 1,
           m.max_positions, positions);
  p.generation.max_new_tokens = o.generation_max_length > 0
                                    ? o.generation_max_length
                                    : std::min<int64_t>(p.target_len, positions);
  return p;
}

// ---- the trainer -----------------------------------------------------------------------------

Seq2SeqTrainer::Seq2SeqTrainer(Seq2SeqPlan plan, Seq2SeqObserver& observer)
    : TaskTrainer(observer), plan_(std::move(plan)), obs_(observer) {
  const Seq2SeqPlan& p = plan_;
  const Options& o = p.spec;
  const bool import = !o.init_from.empty();
  model_ = std::make_shared<models::Seq2Seq>(p.model, /*init=*/!import);
  if (import) {
    const auto rep = models::load_hf_seq2seq_weights(*model_, o.init_from);
    say(fmt::format(
        "initialised from {}: {} tensors{}", fmt::join(rep.files, ", "), rep.tensors,
        rep.ignored.empty() ? "" : fmt::format("; tied copies skipped: {}", rep.ignored.size())));
  }
  // Before the engine: it lays out gradients and optimizer states for what requires grad.
  if (p.lora) say(describe_lora(*p.lora, nn::apply_lora(*model_, *p.lora)));
  model_->set_gradient_checkpointing(o.gradient_checkpointing);
  const models::Seq2SeqConfig& m = p.model;
  say(fmt::format(
      "model: {} ({} encoder-decoder, layers {} + {}, heads {}, d_model {}, V {}): {} "
      "parameters",
      p.model_name, m.family, m.encoder_layers, m.decoder_layers, m.encoder_heads, m.d_model,
      m.vocab_size, human_count(static_cast<double>(model_->num_parameters()))));

  if (!p.tokenizer_dir.empty()) tok_ = data::load_tokenizer(p.tokenizer_dir);
  // The loss: the engine's default, Seq2Seq::loss of the batch (source ids, mask, labels).
  start(model_, {});
}

Seq2SeqTrainer::~Seq2SeqTrainer() = default;

int64_t Seq2SeqTrainer::activation_bytes() const {
  // The encoder over B x S source tokens; the decoder over B x T target tokens, each layer's
  // cross-attention as 2 C more of its MLP, then the final norm and the logits with their gradient.
  const models::Seq2SeqConfig& m = plan_.model;
  const int64_t B = plan_.micro_batch(), C = m.d_model;
  const bool ckpt = plan_.spec.gradient_checkpointing;
  const int64_t e = static_cast<int64_t>(dtype_size(plan_.config().training_dtype()));
  return stack_activation_estimate(B * plan_.source_len, m.encoder_layers, C, m.encoder_ffn,
                                   2 * C, ckpt, e) +
         stack_activation_estimate(B * plan_.target_len, m.decoder_layers, C,
                                   m.decoder_ffn + 2 * C, 2 * C + 2 * m.vocab_size, ckpt, e);
}

std::vector<std::string> Seq2SeqTrainer::describe_data() const {
  const Seq2SeqPlan& p = plan_;
  const auto& tr = *p.train;
  std::vector<std::string> lines = {
      fmt::format("train data: {}: {} source/target examples (S {}, T {}) -> {} steps/epoch at {} "
                  "examples/step (micro-batch {} x accumulation {})",
                  p.train_dir.string(), tr.size(), tr.source_len(), tr.target_len(),
                  p.run.steps_per_epoch, p.global_batch(), p.micro_batch(), p.grad_accum())};
  if (p.val)
    lines.push_back(fmt::format(
        "eval data: {} (val): loss over {} of {} examples; BLEU of {} generations ({}, at most "
        "{} new tokens){}",
        p.val_from, p.eval_examples, p.val->size(), p.bleu_examples,
        p.generation.num_beams > 1 ? fmt::format("beam search, {} beams", p.generation.num_beams)
                                   : "greedy",
        p.generation.max_new_tokens,
        p.tokenizer_dir.empty() ? "" : fmt::format("; decoded with {}", p.tokenizer_dir.string())));
  return lines;
}

runtime::MicroBatch Seq2SeqTrainer::pack(const data::Seq2SeqSet& set,
                                         const std::vector<uint64_t>& idx,
                                         uint64_t sample_base) const {
  const int64_t n = static_cast<int64_t>(idx.size()), S = set.source_len(), T = set.target_len();
  runtime::MicroBatch b{{.input_ids = Tensor::empty({n, S}, DType::i32),
                         .labels = Tensor::empty({n, T}, DType::i32),
                         .attention_mask = Tensor::empty({n, S}, DType::i32)},
                        sample_base};
  int32_t* x = b.batch.input_ids.data<int32_t>();
  int32_t* mask = b.batch.attention_mask.data<int32_t>();
  int32_t* y = b.batch.labels.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    const size_t at = static_cast<size_t>(i * S);
    set.get(static_cast<int64_t>(idx[static_cast<size_t>(i)]), {x + at, static_cast<size_t>(S)},
            {mask + at, static_cast<size_t>(S)},
            {y + static_cast<size_t>(i * T), static_cast<size_t>(T)});
  }
  return b;
}

// ---- checkpoints -----------------------------------------------------------------------------

json Seq2SeqTrainer::checkpoint_fields() const {
  return {{"source_len", plan_.source_len},
          {"target_len", plan_.target_len},
          {"model", plan_.model.to_json()}};
}

void Seq2SeqTrainer::check_checkpoint(const json& d) const {
  DS_CHECK(d.value("source_len", plan_.source_len) == plan_.source_len &&
               d.value("target_len", plan_.target_len) == plan_.target_len,
           "[ds_train] the checkpoint was trained on examples of {} + {} ids, this run's set has "
           "{} + {}",
           d.value("source_len", plan_.source_len), d.value("target_len", plan_.target_len),
           plan_.source_len, plan_.target_len);
}

// ---- evaluation and generation ---------------------------------------------------------------

std::unique_ptr<models::Seq2Seq> Seq2SeqTrainer::whole_model() {
  auto weights = engine().full_weights();  // ZeRO-3: every rank gathers, rank 0 receives
  if (!is_lead()) return nullptr;
  if (plan_.lora) weights = nn::merge_lora_weights(weights, plan_.lora->scaling());
  auto whole = std::make_unique<models::Seq2Seq>(plan_.model, /*init=*/false);
  copy_weights(*whole, weights);
  // final_logits_bias is a buffer (never trained): the imported values.
  std::map<std::string, Tensor> buffers;
  for (auto& [name, t] : model_->named_buffers()) buffers.emplace(name, t);
  for (auto& [name, t] : whole->named_buffers())
    if (const auto it = buffers.find(name); it != buffers.end()) t.copy_from(it->second);
  whole->train(false);
  return whole;
}

std::vector<std::string> Seq2SeqTrainer::generate(const Tensor& ids, const Tensor& mask,
                                                  const models::BeamOptions& opt) {
  const auto whole = whole_model();
  if (!whole) return {};
  DS_CHECK(tok_ != nullptr, "[ds_train] no tokenizer to decode generations with; give --tokenizer");
  const Tensor out = whole->generate(ids, mask, opt);  // (B, 1 + n) i64
  const std::vector<int64_t> v = out.to_int_vector();
  const int64_t B = out.size(0), W = out.size(1);
  std::vector<std::string> texts;
  for (int64_t b = 0; b < B; ++b)
    texts.push_back(tok_->decode(
        generated_row(v, b, W, plan_.model.eos_token_id, plan_.model.pad_token_id), true));
  return texts;
}

std::optional<Seq2SeqEvalReport> Seq2SeqTrainer::evaluate() {
  if (!plan_.val || plan_.eval_examples == 0) return std::nullopt;
  const auto t0 = std::chrono::steady_clock::now();
  const data::Seq2SeqSet& val = *plan_.val;
  const int64_t N = plan_.eval_examples, B = plan_.micro_batch();
  Seq2SeqEvalReport r;
  double loss_sum = 0.0;
  for (const std::vector<uint64_t>& idx : eval_batches(N, B)) {
    int64_t tokens = 0;
    for (const uint64_t i : idx)
      tokens += static_cast<int64_t>(val.target(static_cast<int64_t>(i)).size());
    const runtime::MicroBatch b = pack(val, idx, 0);
    // The batch's mean over its target tokens, weighted back to a sum.
    loss_sum += engine().eval_loss(b.batch).item() * static_cast<double>(tokens);
    r.tokens += tokens;
  }
  r.examples = N;
  r.loss = loss_sum / static_cast<double>(std::max<int64_t>(1, r.tokens));
  if (plan_.bleu_examples > 0) {
    const auto whole = whole_model();  // collective: every rank gathers
    if (whole) {
      const int64_t G = plan_.bleu_examples;
      std::vector<std::string> hyps;
      std::vector<std::vector<std::string>> refs;
      for (int64_t first = 0; first < G; first += B) {
        const int64_t n = std::min(G, first + B) - first;
        // Each batch padded to its longest source (generation's cost is per position).
        int64_t width = 1;
        for (int64_t i = first; i < first + n; ++i)
          width = std::max<int64_t>(width, static_cast<int64_t>(val.source(i).size()));
        std::vector<int64_t> ids(static_cast<size_t>(n * width), val.pad_id()),
            mask(static_cast<size_t>(n * width), 0);
        for (int64_t i = 0; i < n; ++i) {
          const auto src = val.source(first + i);
          for (size_t k = 0; k < src.size(); ++k) {
            ids[static_cast<size_t>(i * width) + k] = src[k];
            mask[static_cast<size_t>(i * width) + k] = 1;
          }
        }
        const Tensor out = whole->generate(Tensor::from_ints(ids, {n, width}),
                                           Tensor::from_ints(mask, {n, width}), plan_.generation);
        const std::vector<int64_t> v = out.to_int_vector();
        for (int64_t i = 0; i < n; ++i) {
          hyps.push_back(tok_->decode(
              generated_row(v, i, out.size(1), plan_.model.eos_token_id, plan_.model.pad_token_id),
              true));
          refs.push_back({tok_->decode(val.target(first + i), true)});
          if (r.sources.size() < kKeepExamples) {
            r.sources.push_back(tok_->decode(val.source(first + i), true));
            r.hypotheses.push_back(hyps.back());
            r.references.push_back(refs.back().front());
          }
        }
      }
      r.bleu = corpus_bleu(hyps, refs);
      r.generated = G;
    }
  }
  r.step = engine().global_steps();
  r.samples = engine().global_samples();
  r.seconds = seconds_since(t0);
  return r;
}

void Seq2SeqTrainer::report_evaluation() {
  last_eval_ = evaluate();
  if (last_eval_) obs_.on_seq2seq_eval(*last_eval_);
}

// ---- the export ------------------------------------------------------------------------------

std::string Seq2SeqTrainer::export_model(const std::string& dir) {
  if (exports_lora_adapter(plan_.lora, plan_.spec)) {
    const auto weights = engine().full_weights();  // collective
    if (is_lead()) say(export_seq2seq_lora_adapter(*model_, weights, *plan_.lora, plan_.spec, dir));
    return "";  // as a decoder's adapter: no tokenizer (the base folder has it)
  }
  const auto whole = whole_model();
  if (!whole) return "";
  models::export_hf_seq2seq(*whole, dir);
  // The --init_from folder's generation settings (num_beams, length_penalty, ...) go along, as
  // save_pretrained writes them.
  std::error_code ec;
  const fs::path gen = fs::path(plan_.spec.init_from) / "generation_config.json";
  if (!plan_.spec.init_from.empty() && fs::is_regular_file(gen, ec))
    fs::copy_file(gen, fs::path(dir) / "generation_config.json",
                  fs::copy_options::overwrite_existing);
  say(export_tokenizer_beside(dir, {fs::path(plan_.spec.init_from), plan_.tokenizer_dir},
                              plan_.model.vocab_size));
  return "";
}

}  // namespace ds::train

#include "ds/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "ds/backend/backend.h"
#include "ds/comm/group.h"
#include "ds/core/allocator.h"
#include "ds/core/error.h"
#include "ds/core/file_io.h"
#include "ds/core/rng.h"
#include "ds/models/hf_io.h"
#include "ds/nn/lora.h"
#include "ds/nn/tensor_parallel.h"
#include "ds/runtime/pipeline_partition.h"
#include "ds/train/fit.h"
#include "ds/train/lora.h"
#include "ds/train/train_util.h"

namespace ds::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// (B, T) int32 token ids.
Tensor ids(int64_t B, int64_t T) {
  return Tensor::empty({B, T}, DType::i32);
}

// Samples first .. first + B of `d` in order into fresh (B, T) inputs and targets.
runtime::MicroBatch read_batch(const data::TokenDataset& d, uint64_t first, int64_t B, int64_t T) {
  runtime::MicroBatch b{{.input_ids = ids(B, T), .labels = ids(B, T)}, first};
  for (int64_t i = 0; i < B; ++i)
    d.get(first + static_cast<uint64_t>(i), static_cast<size_t>(T),
          std::span<int32_t>(b.batch.input_ids.data<int32_t>() + i * T, static_cast<size_t>(T)),
          std::span<int32_t>(b.batch.labels.data<int32_t>() + i * T, static_cast<size_t>(T)));
  return b;
}

// " (12.9B active per token: 2 of 8 experts)" for a mixture of experts, which holds (and the fit
// check counts) every expert while a token runs experts_per_tok of them; "" otherwise.
std::string active_note(const models::GPTConfig& c) {
  if (c.num_experts <= 0) return "";
  return fmt::format(" ({} active per token: {} of {} experts)",
                     human_count(static_cast<double>(c.num_active_parameters())), c.experts_per_tok,
                     c.num_experts);
}

}  // namespace

Trainer::Trainer(RunPlan plan, TrainerObserver& observer)
    : TrainerBase(observer),
      plan_(std::move(plan)),
      eval_baseline_(std::nan("")),
      last_eval_(std::nan("")) {
  // Before the fit check, which reads what the limit leaves.
  if (const std::string limit = apply_device_memory_limit(plan_.device, plan_.spec); !limit.empty())
    say(limit);
  if (!plan_.spec.skip_memory_check) {
    // Each rank measures its own node's memory: one that does not fit stops every rank, none is
    // left waiting in the model build's or the engine's first collective.
    std::string error;
    try {
      check_memory();
    } catch (const Error& e) {
      error = e.what();
    }
    comm::raise_if_any_failed(*comm::world(), error, "the start-up memory check");
  }
  say(fmt::format("GEMM: {}", backend::cpu().gemm_info()));
  build_model();
  build_engine();
  open_data();
  open_output();
}

Trainer::~Trainer() = default;

// ---- set-up ----------------------------------------------------------------------------------

void Trainer::check_memory() {
  const RunPlan& p = plan_;
  const LoraCounts lc = p.lora ? count_lora(p.model, *p.lora) : LoraCounts{};
  DS_CHECK(lc.expert_weights == 0 || p.config().expert_parallel.size <= 1,
           "[ds_train] --lora_module_name '{}' adapts {} stacked expert weights, and expert "
           "parallelism (--expert_parallel_size / expert_parallel.autoep_size {}) is not supported "
           "with LoRA on the "
           "experts (peft's lora_B interleaves the experts, so a rank's experts are not a slice "
           "of it): train without expert parallelism, or target the attention projections and "
           "routers only",
           fmt::join(p.lora->targets, ","), lc.expert_weights, p.config().expert_parallel.size);
  if (!p.device.is_cpu()) {  // the GPU and host memory, ZeRO-Offload's way
    const GpuFitPlan g =
        plan_fit_gpu(p.model.num_parameters(), p.config(), p.activation_bytes, lc.lora_params, lc.frozen,
                     p.data_parallel, p.tensor_parallel() * p.pipeline_parallel());
    const std::string note =
        check_fit_gpu(g, static_cast<int64_t>(backend::get(p.device).available_memory()),
                      available_memory_bytes(), p.device.str(), p.config());
    if (!note.empty()) say(note);
    return;
  }
  // Expert parallelism: a rank holds 1/ep of the experts, and ZeRO runs over the dp / ep ranks
  // holding the same ones (docs/parallelism.md); the whole model is built first.
  const int ep = std::max(1, p.config().expert_parallel.size);
  int64_t params = p.model.num_parameters(), frozen = lc.frozen;
  if (ep > 1) {
    const int64_t experts = p.model.num_moe_layers() * p.model.num_experts * 3 *
                            p.model.resolved_moe_ffn_hidden() * p.model.n_embd;
    params -= experts - experts / ep;
    if (frozen >= experts) frozen -= experts - experts / ep;  // LoRA: the experts are frozen
  }
  FitPlan fit = plan_fit(params, p.config(), p.data_parallel / ep, local_ranks(),
                         p.activation_bytes, p.partitioned_build, lc.lora_params, frozen,
                         p.tensor_parallel() * p.pipeline_parallel());
  if (ep > 1) fit.model_build = 4 * p.model.num_parameters();
  std::error_code ec;
  fs::create_directories(p.spec.output_dir, ec);
  const std::string note = check_fit(fit, available_memory_bytes(), p.model.num_parameters(), p.config(),
                                     p.data_parallel, p.spec.output_dir);
  if (!note.empty()) say(note);
}

void Trainer::build_model() {
  const RunPlan& p = plan_;
  const Options& o = p.spec;
  const models::GPTConfig& mcfg = p.model;
  const config::DeepSpeedConfig& cfg = p.config();
  const int tp_size = p.tensor_parallel(), pp_size = p.pipeline_parallel();
  const auto world = comm::world();
  std::optional<nn::PartitionedInit> pieces_only;
  if (p.partitioned_build) pieces_only.emplace();
  if (tp_size > 1 || pp_size > 1)
    topology_ = std::make_shared<comm::Topology>(world, tp_size, pp_size);
  // Pipeline stages: the model's layers (embedding, blocks, head) cut by pipeline.partition.
  if (pp_size > 1) {
    const auto pipe_layers = models::GPT::pipe_layers(mcfg);
    std::vector<runtime::PipeLayer> weights;
    for (const auto& l : pipe_layers) weights.push_back({l.type_name, l.num_parameters});
    const auto bounds = runtime::partition_layers(weights, pp_size, cfg.pipeline.partition);
    say(fmt::format("pipeline: {} stages, partition \"{}\":", pp_size, cfg.pipeline.partition));
    for (int st = 0; st < pp_size; ++st) {
      const int64_t a = bounds[st], b = bounds[st + 1];
      DS_CHECK(b > a,
               "[ds_train] pipeline stage {} of {} holds no layers (partition \"{}\" over {} "
               "layers); use fewer stages or another pipeline.partition",
               st, pp_size, cfg.pipeline.partition, pipe_layers.size());
      int64_t n = 0;
      for (int64_t i = a; i < b; ++i) n += pipe_layers[static_cast<size_t>(i)].num_parameters;
      std::vector<std::string> parts;
      if (a == 0) parts.push_back("embedding");
      const int64_t b0 = std::max<int64_t>(a, 1) - 1,
                    b1 = std::min<int64_t>(b, mcfg.n_layer + 1) - 1;
      if (b1 > b0)
        parts.push_back(b1 - b0 == 1 ? fmt::format("block {}", b0)
                                     : fmt::format("blocks {}-{}", b0, b1 - 1));
      if (b == mcfg.n_layer + 2)
        parts.push_back(mcfg.tie_embeddings && a > 0 ? "head (tied to stage 0's wte)" : "head");
      line(fmt::format("  stage {}: layers [{}, {}) = {}: {} parameters", st, a, b,
                       fmt::join(parts, " + "), human_count(static_cast<double>(n))));
    }
    layers_ = {bounds[topology_->stage()], bounds[topology_->stage() + 1]};
  }
  model_ = std::make_shared<models::GPT>(
      mcfg,
      tp_size > 1 ? std::make_shared<nn::TensorParallel>(topology_->tensor_parallel()) : nullptr,
      layers_, /*init=*/o.init_from.empty());
  if (topology_) {
    const comm::Coord at = topology_->coord();
    say(
        fmt::format("parallelism: {} (pipeline x data x tensor); this rank is pipe {} data {} "
                    "tensor {}; {} (docs/parallelism.md)",
                    topology_->grid().str(), at.pipe, at.data, at.model,
                    tp_size > 1 ? fmt::format("each rank holds 1/{} of every cut layer", tp_size)
                                : "tensor parallelism off"));
    // Every rank's coordinates, in rank order.
    const int world_size = world->size();
    std::vector<int64_t> mine = {at.pipe, at.data, at.model},
                         all(3 * static_cast<size_t>(world_size));
    world->all_gather(mine.data(), all.data(), 3, DType::i64, "rank coordinates");
    std::vector<std::string> coords;
    for (int r = 0; r < world_size; ++r)
      coords.push_back(fmt::format("{}:({},{},{})", r, all[3 * r], all[3 * r + 1], all[3 * r + 2]));
    line(fmt::format("  rank:(pipe,data,tensor) {}", fmt::join(coords, " ")));
  }
  pieces_only.reset();
  if (!o.init_from.empty()) {
    // With tensor parallelism each rank reads its stage's layers whole once and keeps its slices
    // (the whole copy goes before the engine is built).
    std::optional<models::GPT> whole;
    if (tp_size > 1) whole.emplace(mcfg, nullptr, layers_, /*init=*/false);
    const auto rep = models::load_hf_weights(whole ? *whole : *model_, o.init_from);
    if (whole) {
      const auto splits = nn::tp_splits(*model_);
      std::map<std::string, Tensor> full;
      for (auto& [name, t] : whole->named_parameters()) full[name] = t.detach();
      for (auto& [name, t] : model_->named_parameters()) {
        const auto it = splits.find(name);
        t.copy_from(it == splits.end() ? full.at(name) : nn::local_part(full.at(name), it->second));
      }
    }
    say(fmt::format(
        "initialised from {}: {} tensors ({} Conv1D weights transposed){}",
        fmt::join(rep.files, ", "), rep.tensors, rep.transposed,
        rep.ignored.empty() ? "" : fmt::format("; ignored {} buffers", rep.ignored.size())));
  }
  if (p.lora) say(describe_lora(*p.lora, nn::apply_lora(*model_, *p.lora)));
  if (o.gradient_checkpointing) model_->set_gradient_checkpointing(true);
  move_to_device(*model_);
  say(fmt::format("model: {} ({}, L {}, NH {}, C {}, V {}, block {}): {} parameters{}{}",
                  p.model_name, nn::layout_name(mcfg.layout), mcfg.n_layer, mcfg.n_head,
                  mcfg.n_embd, mcfg.vocab_size, mcfg.block_size,
                  human_count(model_->num_parameters()), active_note(mcfg),
                  o.gradient_checkpointing ? ", gradient checkpointing" : ""));
}

void Trainer::build_engine() {
  runtime::InitOptions init = engine_options();
  init.topology = topology_;
  // A pipeline stage trains through the PipelineEngine, which owns the stage's Engine.
  if (plan_.pipeline_parallel() > 1)
    pipe_ = std::make_unique<runtime::PipelineEngine>(model_, plan_.config(), init);
  else
    engine_owner_ = runtime::initialize(model_, plan_.config(), init);
  attach_engine(pipe_ ? pipe_->engine() : *engine_owner_);
  line(fmt::format("  activations     ~ {:>12}  (estimate for B {} x T {}; docs/training.md)",
                   mib(plan_.activation_bytes), plan_.micro_batch(), plan_.seq_len));
}

void Trainer::open_data() {
  const RunPlan& p = plan_;
  const int64_t B = p.micro_batch(), T = p.seq_len;
  loader_ = std::make_unique<data::DataLoader>(p.train, static_cast<size_t>(T), sampler_options());
  unigram_ = unigram_stats(*p.train);
  say(
      fmt::format("train data: {}: {} tokens, {} samples of T {} -> {} steps/epoch at {} "
                  "samples/step (micro-batch {} x accumulation {})",
                  p.train_dir.string(), human_count(static_cast<double>(p.train->num_tokens())),
                  p.samples, T, p.run.steps_per_epoch, p.global_batch(), B, p.grad_accum()));
  say(fmt::format(
      "unigram entropy of the train {}: {:.3f} nats/token ({} distinct ids{}): "
      "the loss of a model that ignores context",
      p.train->is_sft() ? fmt::format("set's {} trained tokens", unigram_.tokens) : "tokens",
      unigram_.entropy_nats, unigram_.distinct,
      unigram_.scanned < p.train->num_tokens() ? fmt::format(", first {} tokens", unigram_.scanned)
                                               : ""));
  // Validation text differs from training text (SOTU: later years), so its context-free baseline
  // is the train frequencies' loss on it, not the train entropy.
  if (p.val) {
    eval_baseline_ = unigram_cross_entropy(unigram_, unigram_stats(*p.val));
    say(fmt::format(
        "eval data: {} (val): {} tokens, {} batches of {} x {} per evaluation; train unigram "
        "frequencies score {:.3f} nats/token on it",
        p.val_from, human_count(static_cast<double>(p.val->num_tokens())),
        std::min<int64_t>(p.spec.eval_batches,
                          static_cast<int64_t>(p.val->num_samples(static_cast<size_t>(T))) / B),
        B, T, eval_baseline_));
  } else {
    say("eval data: none (no val split; give --eval_data to evaluate)");
  }
}

// ---- checkpoints -----------------------------------------------------------------------------

json Trainer::checkpoint_fields() const {
  return {{"seq_len", plan_.seq_len}, {"model", plan_.model.to_json()}};
}

void Trainer::check_checkpoint(const json& d) const {
  const int64_t T = plan_.seq_len;
  DS_CHECK(d.value("seq_len", T) == T,
           "[ds_train] the checkpoint was trained with --block_size {}, this run uses {}",
           d.value("seq_len", T), T);
}

// Tensor- and pipeline-parallel checkpoints load at any (dp, pp, tp) (docs/checkpoints.md); a
// pipeline also restores the last stage's copy of the tied embedding.
json Trainer::load_checkpoint(const std::string& dir, const std::string& tag) {
  return pipe_ ? pipe_->load_checkpoint(dir, tag) : TrainerBase::load_checkpoint(dir, tag);
}

void Trainer::save_checkpoint(const std::string& dir, const json& client) {
  if (pipe_)
    pipe_->save_checkpoint(dir, "", client);
  else
    TrainerBase::save_checkpoint(dir, client);
}

// ---- evaluation ------------------------------------------------------------------------------

double Trainer::evaluate(int64_t batches) {
  if (!plan_.val) return std::nan("");
  const data::TokenDataset& val = *plan_.val;
  const int64_t B = plan_.micro_batch(), T = plan_.seq_len;
  const int64_t S = static_cast<int64_t>(val.num_samples(static_cast<size_t>(T)));
  const int64_t n = std::min(batches, S / B);
  if (n == 0) return std::nan("");
  if (pipe_) {
    // The batches run through the stages; the loss comes back averaged like train_batch's.
    int64_t i = 0;
    return pipe_->eval_batch(
        [&] {
          runtime::MicroBatch b = read_batch(val, static_cast<uint64_t>(i++ * B), B, T);
          b.sample_base = 0;  // no dropout in evaluation
          return b;
        },
        static_cast<int>(n));
  }
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const runtime::MicroBatch b = read_batch(val, static_cast<uint64_t>(i * B), B, T);
    sum += engine().eval_loss(b.batch).item();
  }
  return sum / static_cast<double>(n);
}

void Trainer::report_evaluation() {
  if (!plan_.val) return;
  const auto t0 = std::chrono::steady_clock::now();
  last_eval_ = evaluate(plan_.spec.eval_batches);
  if (!std::isfinite(last_eval_)) return;
  observer().on_eval(
      {engine().global_steps(), engine().global_samples(), last_eval_, seconds_since(t0)});
}

void Trainer::mark_evaluated(int64_t step, double loss) {
  set_evaluated_at(step);
  last_eval_ = loss;
}

// ---- the step ------------------------------------------------------------------------------

// This rank's micro-batches of the global batch; the first and last pipeline stage read the same
// ones. Dropout masks follow each micro-batch's global sample position.
runtime::MicroBatch Trainer::next_micro_batch() {
  const int64_t B = plan_.micro_batch(), T = plan_.seq_len;
  runtime::MicroBatch b{{.input_ids = ids(B, T), .labels = ids(B, T)},
                        loader_->sampler().next_sample_position()};
  loader_->next(std::span<int32_t>(b.batch.input_ids.data<int32_t>(), static_cast<size_t>(B * T)),
                std::span<int32_t>(b.batch.labels.data<int32_t>(), static_cast<size_t>(B * T)));
  return b;
}

double Trainer::train_batch(const std::function<runtime::MicroBatch()>& next) {
  return pipe_ ? static_cast<double>(pipe_->train_batch(next)) : TrainerBase::train_batch(next);
}

// ---- the end ---------------------------------------------------------------------------------

std::vector<RankMemory> Trainer::report_memory(const fs::path& json_file) {
  // One file for the job, written by rank 0 from every rank's numbers.
  const auto ranks = gather_memory(
      engine(),
      {.rank = rank(),
       .mem = memory_budget(),
       .peak_tensor_bytes = static_cast<int64_t>(cpu_allocator().stats().peak_bytes_in_use),
       .peak_rss_bytes = peak_rss_bytes()});
  if (is_lead() && !json_file.empty())
    write_memory_json(json_file, engine(), ranks, plan_.activation_bytes);
  return ranks;
}

std::optional<std::string> Trainer::generate_sample() {
  const Options& o = plan_.spec;
  if (!plan_.sample_tokenizer) return std::nullopt;
  if (plan_.tensor_parallel() > 1 || pipe_) {
    say("note: no sample: generation from a tensor- or pipeline-parallel model is not "
        "implemented (generate from the HF export with ds_generate)");
    return std::nullopt;
  }
  return train::generate_sample(*model_, *plan_.sample_tokenizer, o.sample_prompt, o.sample_tokens,
                                o.sample_top_k, o.seed);
}

std::string Trainer::export_model(const std::string& dir) {
  const Options& o = plan_.spec;
  const std::optional<nn::LoraConfig>& lora = plan_.lora;
  // Under ZeRO-3 no rank holds the whole model: every rank takes part in gathering it, rank 0
  // writes it (DeepSpeed's stage3_gather_16bit_weights_on_model_save).
  const auto weights = pipe_ ? pipe_->full_weights() : engine().full_weights();
  if (!is_lead()) return "";
  // LoRA: a PEFT adapter when only the LoRA matrices trained (and --merge_lora is not given);
  // otherwise the merged weights (an adapter alone would lose the other trained parameters).
  if (exports_lora_adapter(lora, o))
    return export_lora(*model_, weights, *lora, false, dir, lora_adapter_base(o));
  std::string note;
  if (lora)
    note = export_lora(*model_, weights, *lora, true, dir, "");
  else
    models::export_hf(plan_.model, weights, dir);
  say(export_tokenizer_beside(
      dir, {o.init_from.empty() ? fs::path() : fs::path(o.init_from), plan_.tokenizer_dir},
      plan_.model.vocab_size));
  // Fine-tuned on a chat set: the export carries the template its examples were rendered with,
  // so ds_serve, ds_generate and transformers' apply_chat_template format prompts the way the
  // model was trained.
  if (const std::string t = sft_template_of(plan_.train_dir); !t.empty())
    say(set_export_chat_template(dir, t));
  return note;
}

}  // namespace ds::train

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
#include "ds/train/step_loop.h"
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

}  // namespace

Trainer::Trainer(RunPlan plan, TrainerObserver& observer)
    : plan_(std::move(plan)),
      obs_(observer),
      rank_(comm::world()->rank()),
      out_dir_(plan_.spec.output_dir),
      eval_baseline_(std::nan("")),
      last_eval_(std::nan("")) {
  // Before the fit check, which reads what the limit leaves.
  if (const std::string limit = apply_device_memory_limit(plan_.device, plan_.spec); !limit.empty())
    say(limit);
  if (!plan_.spec.skip_memory_check) check_memory();
  say(fmt::format("GEMM: {}", backend::cpu().gemm_info()));
  build_model();
  build_engine();
  report_memory_budget();
  open_data();
  fs::create_directories(out_dir_);
  if (is_lead()) remove_stale_temporaries();
}

Trainer::~Trainer() = default;

// ---- set-up ----------------------------------------------------------------------------------

void Trainer::check_memory() {
  const RunPlan& p = plan_;
  const LoraCounts lc = p.lora ? count_lora(p.model, *p.lora) : LoraCounts{};
  if (!p.device.is_cpu()) {  // the GPU and host memory, ZeRO-Offload's way
    const GpuFitPlan g =
        plan_fit_gpu(p.model, p.config(), p.activation_bytes, lc.lora_params, lc.frozen,
                     p.data_parallel, p.tensor_parallel() * p.pipeline_parallel());
    const std::string note =
        check_fit_gpu(g, static_cast<int64_t>(backend::get(p.device).available_memory()),
                      available_memory_bytes(), p.device.str(), p.config());
    if (!note.empty()) say(note);
    return;
  }
  const FitPlan fit = plan_fit(p.model, p.config(), p.data_parallel, local_ranks(),
                               p.activation_bytes, p.partitioned_build, lc.lora_params, lc.frozen,
                               p.tensor_parallel() * p.pipeline_parallel());
  std::error_code ec;
  fs::create_directories(p.spec.output_dir, ec);
  const std::string note = check_fit(fit, available_memory_bytes(), p.model, p.config(),
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
  if (!p.device.is_cpu()) {
    // The engine keeps the model where it is: its flat parameters and gradients stay on the GPU,
    // the master weights and optimizer state go to host memory (docs/cuda.md).
    model_->to(p.device);
    say(fmt::format("device: {} ({})", p.device.str(), backend::get(p.device).gemm_info()));
  }
  say(fmt::format("model: {} ({}, L {}, NH {}, C {}, V {}, block {}): {} parameters{}",
                  p.model_name, nn::layout_name(mcfg.layout), mcfg.n_layer, mcfg.n_head,
                  mcfg.n_embd, mcfg.vocab_size, mcfg.block_size,
                  human_count(model_->num_parameters()),
                  o.gradient_checkpointing ? ", gradient checkpointing" : ""));
}

void Trainer::build_engine() {
  runtime::InitOptions init;
  init.ctx = plan_.run.ctx;
  init.topology = topology_;
  init.log = [this](const std::string& m) { line(m); };
  // A pipeline stage trains through the PipelineEngine, which owns the stage's Engine.
  if (plan_.pipeline_parallel() > 1)
    pipe_ = std::make_unique<runtime::PipelineEngine>(model_, plan_.config(), init);
  else
    engine_owner_ = runtime::initialize(model_, plan_.config(), init);
  engine_ = pipe_ ? &pipe_->engine() : engine_owner_.get();
  rng::dropout_state() = rng::DropoutState{plan_.spec.seed, 0, 0};
}

void Trainer::report_memory_budget() {
  const config::DeepSpeedConfig& cfg = plan_.config();
  mem_ = engine_->memory_budget();
  if (plan_.world_size > 1) {
    // Every rank's model-state bytes, next to the ZeRO paper's prediction.
    const auto ranks = gather_memory(*engine_, {.rank = rank_, .mem = mem_});
    say(fmt::format("model-state memory per rank, ZeRO stage {}, {} params, {} grads:",
                    cfg.zero_optimization.stage, dtype_name(engine_->training_dtype()),
                    dtype_name(engine_->grad_dtype())));
    print_memory_table(ranks, paper_model_state_bytes(*engine_),
                       [&](const std::string& l) { line(l); });
  } else {
    say(fmt::format("memory, ZeRO stage {}, {} params, {} grads:", cfg.zero_optimization.stage,
                    dtype_name(engine_->training_dtype()), dtype_name(engine_->grad_dtype())));
    line(fmt::format("  parameters        {:>12}", mib(mem_.params)));
    line(fmt::format("  gradients         {:>12}", mib(mem_.grads)));
    line(fmt::format("  master weights    {:>12}", mib(mem_.master_weights)));
    line(fmt::format("  optimizer states  {:>12}", mib(mem_.optimizer_states)));
    line(fmt::format("  model states      {:>12}", mib(mem_.total())));
  }
  if (const auto& fz = engine_->strategy().frozen(); fz.numel > 0)
    line(
        fmt::format("  frozen            {:>12}  (in parameters: {} frozen weights, whole on "
                    "every rank, without gradients or optimizer state)",
                    mib(static_cast<int64_t>(fz.params.nbytes())), human_count(fz.numel)));
  if (mem_.nvme > 0)
    line(
        fmt::format("  on NVMe           {:>12}  (optimizer state swapped through RAM buffers; "
                    "docs/offload.md)",
                    mib(mem_.nvme)));
  if (mem_.scratch > 0)
    line(
        fmt::format("  gradient scratch  {:>12}  (fp32 copy of the 16-bit gradients for the "
                    "optimizer)",
                    mib(mem_.scratch)));
  line(fmt::format("  activations     ~ {:>12}  (estimate for B {} x T {}; docs/training.md)",
                   mib(plan_.activation_bytes), plan_.micro_batch(), plan_.seq_len));
}

void Trainer::open_data() {
  const RunPlan& p = plan_;
  const int64_t B = p.micro_batch(), T = p.seq_len;
  loader_ = std::make_unique<data::DataLoader>(
      p.train, static_cast<size_t>(T),
      data::SamplerOptions{.micro_batch = static_cast<int>(B),
                           .grad_accum = static_cast<int>(p.grad_accum()),
                           .world_size = engine_->world_size(),
                           .rank = engine_->rank(),
                           .seed = p.spec.seed,
                           .shuffle = !p.spec.no_shuffle});
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

void Trainer::remove_stale_temporaries() {
  // A crash (kill, full disk) can leave temporaries as large as a checkpoint: this run owns the
  // folder, so they go now.
  const auto stale = train::remove_stale_temporaries(out_dir_, export_folder(plan_.spec));
  if (stale.empty()) return;
  std::vector<std::string> names;
  for (const auto& f : stale) names.push_back(f.lexically_relative(out_dir_).string());
  say(fmt::format("removed {} temporar{} left by an interrupted earlier run in {}: {}",
                  stale.size(), stale.size() == 1 ? "y" : "ies", out_dir_.string(),
                  fmt::join(names, ", ")));
}

// ---- checkpoints -----------------------------------------------------------------------------

std::optional<ResumeReport> Trainer::resume() {
  const std::string& from = plan_.spec.resume_from_checkpoint;
  if (!from.empty()) return resume_from(from);
  // An earlier run's checkpoints: say so, and never rotate them away (DeepSpeed users lose runs
  // exactly this way: a restart without resume plus save_total_limit deleted the old run).
  earlier_run_.clear();
  for (const auto& p : checkpoint_folders(out_dir_)) earlier_run_.push_back(p.filename().string());
  if (!earlier_run_.empty()) {
    const std::string tag = latest_tag(out_dir_);
    say(fmt::format(
        "note: {} holds checkpoints of an earlier run ({}{}); this run starts afresh "
        "(--resume_from_checkpoint {} would continue that run). A save at the same step replaces "
        "that step's folder; --save_total_limit rotates only this run's checkpoints and keeps the "
        "earlier ones: delete them yourself when no longer needed",
        out_dir_.string(), fmt::join(earlier_run_, ", "),
        tag.empty() ? "; no 'latest' file" : fmt::format("; latest: {}", tag),
        tag.empty() ? (out_dir_ / earlier_run_.back()).string() : "latest"));
  }
  return std::nullopt;
}

std::optional<ResumeReport> Trainer::resume_from(const std::string& from) {
  const int64_t T = plan_.seq_len, total_steps = plan_.total_steps();
  fs::path dir = from == "latest" ? out_dir_ : fs::path(from);
  std::string tag;
  if (from == "latest" && !fs::exists(out_dir_ / "latest")) {
    // `latest` is written last by a save: without it the newest folder may be incomplete, but the
    // folders are there, and starting afresh is what loses them.
    std::vector<std::string> tags;
    for (const auto& p : checkpoint_folders(out_dir_)) tags.push_back(p.filename().string());
    DS_CHECK(!tags.empty(),
             "[ds_train] --resume_from_checkpoint latest: {} holds no checkpoint (no 'latest' "
             "file and no global_step* folder); start without --resume_from_checkpoint",
             out_dir_.string());
    DS_THROW(
        "[ds_train] --resume_from_checkpoint latest: {} has no 'latest' file, but it holds the "
        "checkpoint folders {}. Resume from one explicitly, newest first: "
        "--resume_from_checkpoint {} (each folder's checksums are verified when it loads; if the "
        "newest was cut short, take the one before). Starting without --resume_from_checkpoint "
        "would begin a new run in this folder",
        out_dir_.string(), fmt::join(tags, ", "), (out_dir_ / tags.back()).string());
  }
  if (from != "latest" && !fs::exists(dir / "latest") && fs::is_directory(dir)) {
    // A tag folder (out/global_step100) rather than the folder holding the tags.
    tag = dir.filename().string();
    dir = dir.parent_path();
  }
  check_checkpoint_task(dir, tag, "lm", plan_.train_dir.string());  // before any tensor loads
  // A pipeline also restores the last stage's copy of the tied embedding.
  const json client = pipe_ ? pipe_->load_checkpoint(dir.string(), tag)
                            : engine_->load_checkpoint(dir.string(), tag);
  DS_CHECK(client.contains("data"),
           "[ds_train] the checkpoint in {} has no data-loader position (not written by "
           "ds_train?); cannot resume exactly",
           dir.string());
  if (client.contains("ds_train")) {
    const json& d = client["ds_train"];
    DS_CHECK(d.value("seq_len", T) == T,
             "[ds_train] the checkpoint was trained with --block_size {}, this run uses {}",
             d.value("seq_len", T), T);
  }
  loader_->load_state(client["data"]);
  if (client.contains("ds_train") &&
      client["ds_train"].value("total_steps", total_steps) != total_steps)
    say(
        fmt::format("note: the checkpoint's run was planned for {} steps, this one for {}; the "
                    "learning-rate schedule follows the new length from here",
                    client["ds_train"].value("total_steps", total_steps), total_steps));
  ResumeReport r{dir, tag.empty() ? latest_tag(dir) : tag, engine_->global_steps(),
                 engine_->global_samples()};
  say(fmt::format("resumed from {} (tag {}): step {}, {} samples seen", r.dir.string(), r.tag,
                  r.step, r.samples));
  resumed_ = true;
  last_saved_ = engine_->global_steps();  // that checkpoint exists already
  return r;
}

SaveReport Trainer::save() {
  const auto t0 = std::chrono::steady_clock::now();
  const RunPlan& p = plan_;
  const json client = {{"data", loader_->state()},
                       {"ds_train",
                        {{"seq_len", p.seq_len},
                         {"model", p.model.to_json()},
                         {"total_steps", p.total_steps()},
                         {"seed", p.spec.seed},
                         {"train_data", p.train_dir.string()}}}};
  // Tensor- and pipeline-parallel checkpoints load at any (dp, pp, tp) (docs/checkpoints.md).
  if (pipe_)
    pipe_->save_checkpoint(out_dir_.string(), "", client);
  else
    engine_->save_checkpoint(out_dir_.string(), "", client);
  last_saved_ = engine_->global_steps();
  // This run's folder now, even if an earlier run had written one of the same step.
  std::erase(earlier_run_, fmt::format("global_step{}", last_saved_));
  SaveReport r;
  r.step = engine_->global_steps();
  r.dir = out_dir_;
  if (is_lead()) r.deleted = rotate_checkpoints(out_dir_, p.spec.save_total_limit, earlier_run_);
  r.seconds = seconds_since(t0);
  obs_.on_save(r);
  return r;
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
    sum += engine_->eval_loss(b.batch).item();
  }
  return sum / static_cast<double>(n);
}

void Trainer::evaluate_now() {
  if (!plan_.val || evaluated_at_ == engine_->global_steps()) return;
  evaluated_at_ = engine_->global_steps();
  const auto t0 = std::chrono::steady_clock::now();
  last_eval_ = evaluate(plan_.spec.eval_batches);
  if (!std::isfinite(last_eval_)) return;
  obs_.on_eval({engine_->global_steps(), engine_->global_samples(), last_eval_, seconds_since(t0)});
}

void Trainer::mark_evaluated(int64_t step, double loss) {
  evaluated_at_ = step;
  last_eval_ = loss;
}

// ---- the loop --------------------------------------------------------------------------------

int64_t Trainer::eval_steps() const {
  return plan_.spec.eval_steps >= 0 ? plan_.spec.eval_steps
                                    : std::max<int64_t>(1, plan_.total_steps() / 10);
}

int64_t Trainer::tokens_per_step() const {
  return plan_.micro_batch() * plan_.seq_len * plan_.grad_accum() * plan_.data_parallel;
}

StepReport Trainer::step() {
  const int64_t B = plan_.micro_batch(), T = plan_.seq_len;
  const auto t0 = std::chrono::steady_clock::now();
  const double lr = engine_->get_lr();  // the rate this step applies
  // This rank's micro-batches of the global batch; the first and last pipeline stage read the
  // same ones. Dropout masks follow each micro-batch's global sample position.
  std::vector<int32_t> x(static_cast<size_t>(B * T)), y(static_cast<size_t>(B * T));
  auto next = [&] {
    const uint64_t position = loader_->sampler().next_sample_position();
    loader_->next(x, y);
    runtime::MicroBatch b{{.input_ids = ids(B, T), .labels = ids(B, T)}, position};
    std::copy(x.begin(), x.end(), b.batch.input_ids.data<int32_t>());
    std::copy(y.begin(), y.end(), b.batch.labels.data<int32_t>());
    return b;
  };
  const double loss =
      pipe_ ? static_cast<double>(pipe_->train_batch(next)) : engine_->train_batch(next);
  StepReport r = engine_step_report(*engine_, loss, lr, seconds_since(t0), plan_.total_steps());
  r.tokens_per_second = static_cast<double>(tokens_per_step()) / r.seconds;
  obs_.on_step(r);
  return r;
}

int64_t Trainer::fit() {
  return run_fit(*engine_, obs_, plan_.total_steps(), eval_steps(), plan_.spec.save_steps,
                 {.step = [this] { return step().step; },
                  .evaluate_now = [this] { evaluate_now(); },
                  .save = [this] { save(); },
                  .saved_now = [this] { return last_saved_ == engine_->global_steps(); }});
}

// ---- the end ---------------------------------------------------------------------------------

std::vector<RankMemory> Trainer::report_memory(const fs::path& json_file) {
  // One file for the job, written by rank 0 from every rank's numbers.
  const auto ranks = gather_memory(
      *engine_,
      {.rank = rank_,
       .mem = mem_,
       .peak_tensor_bytes = static_cast<int64_t>(cpu_allocator().stats().peak_bytes_in_use),
       .peak_rss_bytes = peak_rss_bytes()});
  if (is_lead() && !json_file.empty())
    write_memory_json(json_file, *engine_, ranks, plan_.activation_bytes);
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
  const auto weights = pipe_ ? pipe_->full_weights() : engine_->full_weights();
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

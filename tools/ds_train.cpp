// ds_train: train a GPT model with a DeepSpeed config, Hugging Face Trainer style.
//
//   ds_prepare --tokenizer .cache/data/gpt2 --output .cache/prepared/sotu
//              --val_from_year 2001 .cache/data/sotu
//   ds_train --deepspeed configs/ds_demo.json --model tiny --train_data .cache/prepared/sotu
//            --output_dir out/demo --max_steps 300 --learning_rate 1e-3
//
// One process, or several through the deepspeed launcher / mpirun (every rank trains its slice of
// each global batch). Flags, outputs and resume are described in docs/training.md.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "ds/backend/backend.h"
#include "ds/comm/group.h"
#include "ds/comm/topology.h"
#include "ds/comm/logger.h"
#include "ds/core/allocator.h"
#include "ds/core/error.h"
#include "ds/core/file_io.h"
#include "ds/core/parallel.h"
#include "ds/core/rng.h"
#include "ds/data/dataset.h"
#include "ds/data/loader.h"
#include "ds/data/tokenizer.h"
#include "ds/models/gpt.h"
#include "ds/models/hf_io.h"
#include "ds/nn/lora.h"
#include "ds/nn/tensor_parallel.h"
#include "ds/runtime/pipeline_engine.h"
#include "ds/runtime/pipeline_partition.h"
#include "ds/runtime/config.h"
#include "ds/runtime/engine.h"
#include "ds/runtime/monitor.h"
#include "ds/train/fit.h"
#include "ds/train/lora.h"
#include "ds/train/outputs.h"
#include "ds/train/plan.h"
#include "ds/train/train_util.h"
#include "ds_train_default_config.h"
#include "options.h"

namespace fs = std::filesystem;
using ds::train::Given;
using ds::train::human_count;
using ds::train::human_duration;
using ds::train::mib;
using ds::train::Options;
using ds::train::RunConfig;
using nlohmann::json;

namespace {

// Fills a (B, T) int32 tensor's data from a loader buffer; the tensors are allocated once.
void fill_ids(const ds::Tensor& t, const std::vector<int32_t>& v) {
  std::copy(v.begin(), v.end(), t.data<int32_t>());
}

// Mean loss over the first `batches` micro-batches of the validation set in order (the same
// samples at every evaluation, so the numbers are comparable along the run).
// With pipeline parallelism (pipe given) the batches run through the stages (eval_batch).
double evaluate(ds::runtime::Engine& engine, ds::runtime::PipelineEngine* pipe,
                const ds::data::TokenDataset& val, int64_t B, int64_t T, int64_t batches) {
  const int64_t S = static_cast<int64_t>(val.num_samples(static_cast<size_t>(T)));
  const int64_t n = std::min(batches, S / B);
  std::vector<int32_t> x(static_cast<size_t>(B * T)), y(static_cast<size_t>(B * T));
  ds::Tensor xt = ds::Tensor::empty({B, T}, ds::DType::i32);
  ds::Tensor yt = ds::Tensor::empty({B, T}, ds::DType::i32);
  double sum = 0.0;
  if (pipe) {
    if (n == 0) return std::nan("");
    int64_t i = 0;
    return pipe->eval_batch(
        [&] {
          ds::Tensor xi = ds::Tensor::empty({B, T}, ds::DType::i32);
          ds::Tensor yi = ds::Tensor::empty({B, T}, ds::DType::i32);
          for (int64_t b = 0; b < B; ++b)
            val.get(static_cast<uint64_t>(i * B + b), static_cast<size_t>(T),
                    std::span<int32_t>(xi.data<int32_t>() + b * T, static_cast<size_t>(T)),
                    std::span<int32_t>(yi.data<int32_t>() + b * T, static_cast<size_t>(T)));
          ++i;
          return ds::runtime::PipeBatch{xi, yi};
        },
        static_cast<int>(n));
  }
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t b = 0; b < B; ++b)
      val.get(static_cast<uint64_t>(i * B + b), static_cast<size_t>(T),
              std::span<int32_t>(x.data() + b * T, static_cast<size_t>(T)),
              std::span<int32_t>(y.data() + b * T, static_cast<size_t>(T)));
    fill_ids(xt, x);
    fill_ids(yt, y);
    sum += engine.eval_loss(xt, yt).item();
  }
  return n > 0 ? sum / static_cast<double>(n) : std::nan("");
}

// ---------------------------------------------------------------------------------------------

int run(const Options& o, const Given& g) {
  const auto t_start = std::chrono::steady_clock::now();
  ds::train::Console con;
  auto say = [&](const std::string& s) { con.line("[ds_train] " + s); };

  // Several ranks (mpirun or the deepspeed launcher): every rank trains its slice of each global
  // batch; rank 0 prints and writes the metrics, the picture, the sample and the export.
  const auto world = ds::comm::world();
  const int rank = world->rank(), world_size = world->size();
  const bool lead = rank == 0;
  con.set_quiet(!lead);
  if (o.threads > 0) {
    const unsigned cores = std::thread::hardware_concurrency();
    if (cores > 0 && static_cast<unsigned>(o.threads) > cores)
      say(
          fmt::format("warning: --threads {} is more than the {} cores this process may use; the "
                      "threads will compete for them (slower, and OpenBLAS may spin)",
                      o.threads, cores));
    ds::set_num_threads(o.threads);
  }

  // ---- inputs that are only used at the end are checked now, not after the whole run ----
  const fs::path tok_dir =
      o.tokenizer.empty() ? fs::path(ds::train::default_tokenizer_dir()) : fs::path(o.tokenizer);
  std::optional<ds::data::Tokenizer> sample_tokenizer;
  if (o.sample_tokens > 0) {
    if (fs::exists(tok_dir / "encoder.json")) {
      sample_tokenizer = ds::data::Tokenizer::load_gpt2(tok_dir);  // throws on a damaged file
    } else {
      DS_CHECK(o.tokenizer.empty(),
               "[ds_train] --tokenizer {}: no encoder.json there (the GPT-2 tokenizer files "
               "encoder.json and vocab.bpe are needed for the sample; --sample_tokens 0 skips it)",
               o.tokenizer);
      say(
          fmt::format("note: no sample at the end: tokenizer files not found in {} (give "
                      "--tokenizer DIR, or run scripts/fetch_data.sh)",
                      tok_dir.string()));
    }
  }

  // ---- data ----
  DS_CHECK(!o.train_data.empty(),
           "[ds_train] --train_data is required: a folder made by ds_prepare");
  const fs::path train_dir = o.train_data;
  if (!fs::exists(train_dir / "meta.json"))
    DS_THROW(
        "[ds_train] --train_data {}: no prepared corpus there (no meta.json). Create it with: "
        "ds_prepare --tokenizer {} --output {} <text files or folders>   (the demo corpus: bash "
        "scripts/fetch_data.sh, then ds_prepare --tokenizer .cache/data/gpt2 --output {} "
        "--val_from_year 2001 .cache/data/sotu)",
        train_dir.string(), ds::train::default_tokenizer_dir(), train_dir.string(),
        train_dir.string());
  auto train = std::make_shared<ds::data::TokenDataset>(
      ds::data::TokenDataset::open_split(train_dir, "train"));
  std::shared_ptr<ds::data::TokenDataset> val;
  std::string val_from;
  if (!o.eval_data.empty()) {
    val = std::make_shared<ds::data::TokenDataset>(
        ds::data::TokenDataset::open_split(o.eval_data, "val"));
    val_from = o.eval_data;
  } else if (ds::train::has_split(train_dir, "val")) {
    val = std::make_shared<ds::data::TokenDataset>(
        ds::data::TokenDataset::open_split(train_dir, "val"));
    val_from = train_dir.string();
  }

  // ---- model config, sequence length ----
  const ds::models::GPTConfig mcfg = ds::train::resolve_model(o, g);
  // An SFT set (ds_prepare --sft) fixes T: its examples are exactly T + 1 tokens; without
  // --block_size it is the default, and any other length is refused naming both.
  const int64_t T = o.block_size > 0  ? o.block_size
                    : train->is_sft() ? static_cast<int64_t>(train->sft_seq_len())
                                      : std::min<int64_t>(256, mcfg.block_size);
  DS_CHECK(T > 0, "[ds_train] --block_size must be positive, got {}", T);
  for (const ds::data::TokenDataset* d : {train.get(), val.get()})
    if (d) d->check_seq_len(static_cast<size_t>(T));
  DS_CHECK(T <= mcfg.block_size,
           "[ds_train] --block_size {} exceeds the model's block_size {} (its position table)", T,
           mcfg.block_size);
  DS_CHECK(static_cast<int64_t>(train->vocab_size()) <= mcfg.vocab_size,
           "[ds_train] the data's vocabulary ({} ids) does not fit the model's vocab_size {}",
           train->vocab_size(), mcfg.vocab_size);
  const uint64_t S = train->num_samples(static_cast<size_t>(T));

  const RunConfig rc = ds::train::resolve_run_config(o, g, mcfg, S, T, kDefaultDeepSpeedConfig);
  const ds::runtime::DeepSpeedConfig& cfg = rc.cfg;
  const std::string& cfg_source = rc.source;
  const int64_t total_steps = rc.total_steps, steps_per_epoch = rc.steps_per_epoch;
  const int64_t G = cfg.batch.train_batch_size;
  const int64_t B = cfg.batch.train_micro_batch_size_per_gpu;
  const int64_t A = cfg.batch.gradient_accumulation_steps;

  say(fmt::format("DeepSpeed config: {}", cfg_source));
  con.line(ds::runtime::format_effective_config(cfg));
  ds::runtime::print_config_warnings(cfg, stdout);

  // ---- will it fit? (before anything large is allocated) ----
  const int64_t act_bytes =
      ds::train::activation_estimate(mcfg, B, T, o.gradient_checkpointing,
                                     static_cast<int64_t>(ds::dtype_size(cfg.training_dtype())));
  // Stage 3 builds each rank's piece of every parameter only (DeepSpeed's zero.Init), unless the
  // weights come from a Hugging Face folder (read whole, then sharded).
  // LoRA needs the whole base model built (its frozen weights stay whole on every rank).
  const std::optional<ds::nn::LoraConfig> lora = ds::train::lora_config(o, g, mcfg);
  // A pipeline stage is built whole (its layers only) and then sharded; so is a tensor-parallel
  // rank's part (its slices).
  const bool partitioned_build = cfg.zero_optimization.stage == 3 && o.init_from.empty() && !lora &&
                                 rc.pipeline_parallel == 1 && rc.tensor_parallel == 1;
  // Tensor parallelism (docs/parallelism.md): each rank builds its slices of the model; ZeRO
  // shards over the data-parallel ranks (world / tp).
  const int tp_size = rc.tensor_parallel;
  const int pp_size = rc.pipeline_parallel;
  const int dp_size = world_size / (tp_size * pp_size);
  if (pp_size > 1) {
    DS_CHECK(!lora, "[ds_train] LoRA (--lora_dim) with --pipeline_parallel_size {} is not "
             "implemented yet; use --pipeline_parallel_size 1", pp_size);
  }
  if (tp_size > 1) {
    DS_CHECK(!lora, "[ds_train] LoRA (--lora_dim) with --tensor_parallel_size {} is not "
             "implemented yet; use --tensor_parallel_size 1", tp_size);
  }
  if (!o.skip_memory_check) {
    const ds::train::LoraCounts lc =
        lora ? ds::train::count_lora(mcfg, *lora) : ds::train::LoraCounts{};
    const auto fit = ds::train::plan_fit(mcfg, cfg, dp_size, ds::train::local_ranks(), act_bytes,
                                         partitioned_build, lc.lora_params, lc.frozen,
                                         tp_size * pp_size);
    std::error_code ec;
    fs::create_directories(o.output_dir, ec);
    const std::string note = ds::train::check_fit(fit, ds::train::available_memory_bytes(), mcfg,
                                                  cfg, dp_size, o.output_dir);
    if (!note.empty()) say(note);
  }

  // ---- model, engine ----
  say(fmt::format("GEMM: {}", ds::backend::cpu().gemm_info()));
  std::optional<ds::nn::PartitionedInit> pieces_only;
  if (partitioned_build) pieces_only.emplace();
  std::shared_ptr<ds::comm::Topology> topology;
  if (tp_size > 1 || pp_size > 1)
    topology = std::make_shared<ds::comm::Topology>(world, tp_size, pp_size);
  // Pipeline stages: the model's layers (embedding, blocks, head) cut by pipeline.partition.
  ds::models::PipeRange layers;
  if (pp_size > 1) {
    const auto pipe_layers = ds::models::GPT::pipe_layers(mcfg);
    std::vector<ds::runtime::PipeLayer> weights;
    for (const auto& l : pipe_layers) weights.push_back({l.type_name, l.num_parameters});
    const auto bounds = ds::runtime::partition_layers(weights, pp_size, cfg.pipeline.partition);
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
      const int64_t b0 = std::max<int64_t>(a, 1) - 1, b1 = std::min<int64_t>(b, mcfg.n_layer + 1) - 1;
      if (b1 > b0) parts.push_back(b1 - b0 == 1 ? fmt::format("block {}", b0)
                                                : fmt::format("blocks {}-{}", b0, b1 - 1));
      if (b == mcfg.n_layer + 2) parts.push_back(mcfg.tie_embeddings && a > 0 ? "head (tied to stage 0's wte)" : "head");
      con.line(fmt::format("  stage {}: layers [{}, {}) = {}: {} parameters", st, a, b,
                           fmt::join(parts, " + "), human_count(static_cast<double>(n))));
    }
    layers = {bounds[topology->stage()], bounds[topology->stage() + 1]};
  }
  auto model = std::make_shared<ds::models::GPT>(
      mcfg,
      tp_size > 1 ? std::make_shared<ds::nn::TensorParallel>(topology->tensor_parallel()) : nullptr,
      layers, /*init=*/o.init_from.empty());
  if (topology) {
    const ds::comm::Coord at = topology->coord();
    say(fmt::format("parallelism: {} (pipeline x data x tensor); this rank is pipe {} data {} "
                    "tensor {}; {} (docs/parallelism.md)",
                    topology->grid().str(), at.pipe, at.data, at.model,
                    tp_size > 1 ? fmt::format("each rank holds 1/{} of every cut layer", tp_size)
                                : "tensor parallelism off"));
    // Every rank's coordinates, in rank order, printed by rank 0.
    std::vector<int64_t> mine = {at.pipe, at.data, at.model}, all(3 * static_cast<size_t>(world_size));
    world->all_gather(mine.data(), all.data(), 3, ds::DType::i64, "rank coordinates");
    std::vector<std::string> coords;
    for (int r = 0; r < world_size; ++r)
      coords.push_back(fmt::format("{}:({},{},{})", r, all[3 * r], all[3 * r + 1], all[3 * r + 2]));
    con.line(fmt::format("  rank:(pipe,data,tensor) {}", fmt::join(coords, " ")));
  }
  pieces_only.reset();
  if (!o.init_from.empty()) {
    // With tensor parallelism each rank reads its stage's layers whole once and keeps its slices
    // (the whole copy goes before the engine is built).
    std::optional<ds::models::GPT> whole;
    if (tp_size > 1) whole.emplace(mcfg, nullptr, layers, /*init=*/false);
    const auto rep = ds::models::load_hf_weights(whole ? *whole : *model, o.init_from);
    if (whole) {
      const auto splits = ds::nn::tp_splits(*model);
      std::map<std::string, ds::Tensor> full;
      for (auto& [name, p] : whole->named_parameters()) full[name] = p.detach();
      for (auto& [name, p] : model->named_parameters()) {
        const auto it = splits.find(name);
        p.copy_from(it == splits.end() ? full.at(name)
                                       : ds::nn::local_part(full.at(name), it->second));
      }
    }
    say(fmt::format(
        "initialised from {}: {} tensors ({} Conv1D weights transposed){}",
        fmt::join(rep.files, ", "), rep.tensors, rep.transposed,
        rep.ignored.empty() ? "" : fmt::format("; ignored {} buffers", rep.ignored.size())));
  }
  if (lora) say(ds::train::describe_lora(*lora, ds::nn::apply_lora(*model, *lora)));
  if (o.gradient_checkpointing) model->set_gradient_checkpointing(true);
  // A short name for messages and the chart title: the preset, or the file or folder name.
  const std::string model_name =
      g.model                ? (fs::exists(o.model) ? fs::path(o.model).stem().string() : o.model)
      : !o.init_from.empty() ? fs::path(o.init_from).filename().string()
                             : "tiny";
  say(fmt::format("model: {} ({}, L {}, NH {}, C {}, V {}, block {}): {} parameters{}", model_name,
                  ds::nn::layout_name(mcfg.layout), mcfg.n_layer, mcfg.n_head, mcfg.n_embd,
                  mcfg.vocab_size, mcfg.block_size, human_count(model->num_parameters()),
                  o.gradient_checkpointing ? ", gradient checkpointing" : ""));

  ds::runtime::InitOptions init;
  init.ctx = rc.ctx;
  init.topology = topology;
  init.log = [&](const std::string& m) { con.line(m); };
  // A pipeline stage trains through the PipelineEngine, which owns the stage's Engine.
  std::unique_ptr<ds::runtime::PipelineEngine> pipe;
  std::unique_ptr<ds::runtime::Engine> engine_owner;
  if (pp_size > 1) {
    pipe = std::make_unique<ds::runtime::PipelineEngine>(model, cfg, init);
  } else {
    engine_owner = ds::runtime::initialize(model, cfg, init);
  }
  ds::runtime::Engine* const engine = pipe ? &pipe->engine() : engine_owner.get();
  ds::rng::dropout_state() = ds::rng::DropoutState{o.seed, 0, 0};

  const ds::runtime::MemoryBudget mem = engine->memory_budget();
  if (world_size > 1) {
    // Every rank's model-state bytes, next to the ZeRO paper's prediction.
    const auto ranks = ds::train::gather_memory(*engine, {.rank = rank, .mem = mem});
    say(fmt::format("model-state memory per rank, ZeRO stage {}, {} params, {} grads:",
                    cfg.zero_optimization.stage, ds::dtype_name(engine->training_dtype()),
                    ds::dtype_name(engine->grad_dtype())));
    ds::train::print_memory_table(ranks, ds::train::paper_model_state_bytes(*engine),
                                  [&](const std::string& l) { con.line(l); });
  } else {
    say(fmt::format("memory, ZeRO stage {}, {} params, {} grads:", cfg.zero_optimization.stage,
                    ds::dtype_name(engine->training_dtype()),
                    ds::dtype_name(engine->grad_dtype())));
    con.line(fmt::format("  parameters        {:>12}", mib(mem.params)));
    con.line(fmt::format("  gradients         {:>12}", mib(mem.grads)));
    con.line(fmt::format("  master weights    {:>12}", mib(mem.master_weights)));
    con.line(fmt::format("  optimizer states  {:>12}", mib(mem.optimizer_states)));
    con.line(fmt::format("  model states      {:>12}", mib(mem.total())));
  }
  if (const auto& fz = engine->strategy().frozen(); fz.numel > 0)
    con.line(
        fmt::format("  frozen            {:>12}  (in parameters: {} frozen weights, whole on every "
                    "rank, without gradients or optimizer state)",
                    mib(static_cast<int64_t>(fz.params.nbytes())), human_count(fz.numel)));
  if (mem.nvme > 0)
    con.line(
        fmt::format("  on NVMe           {:>12}  (optimizer state swapped through RAM buffers; "
                    "docs/offload.md)",
                    mib(mem.nvme)));
  if (mem.scratch > 0)
    con.line(
        fmt::format("  gradient scratch  {:>12}  (fp32 copy of the 16-bit gradients for the "
                    "optimizer)",
                    mib(mem.scratch)));
  con.line(fmt::format("  activations     ~ {:>12}  (estimate for B {} x T {}; docs/training.md)",
                       mib(act_bytes), B, T));

  // ---- data loader ----
  ds::data::DataLoader loader(train, static_cast<size_t>(T),
                              {.micro_batch = static_cast<int>(B),
                               .grad_accum = static_cast<int>(A),
                               .world_size = engine->world_size(),
                               .rank = engine->rank(),
                               .seed = o.seed,
                               .shuffle = !o.no_shuffle});
  const auto uni = ds::train::unigram_stats(*train);
  say(
      fmt::format("train data: {}: {} tokens, {} samples of T {} -> {} steps/epoch at {} "
                  "samples/step (micro-batch {} x accumulation {})",
                  train_dir.string(), human_count(static_cast<double>(train->num_tokens())), S, T,
                  steps_per_epoch, G, B, A));
  say(fmt::format(
      "unigram entropy of the train {}: {:.3f} nats/token ({} distinct ids{}): "
      "the loss of a model that ignores context",
      train->is_sft() ? fmt::format("set's {} trained tokens", uni.tokens) : "tokens",
      uni.entropy_nats, uni.distinct,
      uni.scanned < train->num_tokens() ? fmt::format(", first {} tokens", uni.scanned) : ""));
  // Validation text differs from training text (SOTU: later years), so its context-free baseline
  // is the train frequencies' loss on it, not the train entropy.
  double eval_baseline = std::nan("");
  if (val) {
    eval_baseline = ds::train::unigram_cross_entropy(uni, ds::train::unigram_stats(*val));
    say(fmt::format(
        "eval data: {} (val): {} tokens, {} batches of {} x {} per evaluation; train unigram "
        "frequencies score {:.3f} nats/token on it",
        val_from, human_count(static_cast<double>(val->num_tokens())),
        std::min<int64_t>(o.eval_batches,
                          static_cast<int64_t>(val->num_samples(static_cast<size_t>(T))) / B),
        B, T, eval_baseline));
  } else
    say("eval data: none (no val split; give --eval_data to evaluate)");

  // ---- resume ----
  const fs::path out_dir = o.output_dir;
  fs::create_directories(out_dir);
  const std::string export_dir =
      o.export_hf.empty() ? (out_dir / "hf_model").string() : o.export_hf;
  if (lead) {
    // A crash (kill, full disk) can leave temporaries as large as a checkpoint: this run owns the
    // folder, so they go now.
    const auto stale = ds::train::remove_stale_temporaries(
        out_dir, export_dir == "none" ? fs::path() : fs::path(export_dir));
    if (!stale.empty()) {
      std::vector<std::string> names;
      for (const auto& p : stale) names.push_back(p.lexically_relative(out_dir).string());
      say(fmt::format("removed {} temporar{} left by an interrupted earlier run in {}: {}",
                      stale.size(), stale.size() == 1 ? "y" : "ies", out_dir.string(),
                      fmt::join(names, ", ")));
    }
  }
  if (!o.resume_from_checkpoint.empty()) {
    fs::path dir =
        o.resume_from_checkpoint == "latest" ? out_dir : fs::path(o.resume_from_checkpoint);
    std::string tag;
    if (o.resume_from_checkpoint == "latest") {
      DS_CHECK(fs::exists(out_dir / "latest"),
               "[ds_train] --resume_from_checkpoint latest: {} holds no checkpoint (no 'latest' "
               "file); start without --resume_from_checkpoint",
               out_dir.string());
    } else if (!fs::exists(dir / "latest") && fs::is_directory(dir)) {
      // A tag folder (out/global_step100) rather than the folder holding the tags.
      tag = dir.filename().string();
      dir = dir.parent_path();
    }
    // A pipeline also restores the last stage's copy of the tied embedding.
    const json client = pipe ? pipe->load_checkpoint(dir.string(), tag)
                             : engine->load_checkpoint(dir.string(), tag);
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
    loader.load_state(client["data"]);
    if (client.contains("ds_train") &&
        client["ds_train"].value("total_steps", total_steps) != total_steps)
      say(
          fmt::format("note: the checkpoint's run was planned for {} steps, this one for {}; the "
                      "learning-rate schedule follows the new length from here",
                      client["ds_train"].value("total_steps", total_steps), total_steps));
    say(fmt::format("resumed from {} (tag {}): step {}, {} samples seen", dir.string(),
                    tag.empty() ? ds::train::latest_tag(dir) : tag, engine->global_steps(),
                    engine->global_samples()));
  }
  const bool resumed = !o.resume_from_checkpoint.empty();
  if (!resumed && !ds::train::latest_tag(out_dir).empty())
    say(
        fmt::format("note: {} holds checkpoints of an earlier run (latest: {}); this run starts "
                    "afresh and its checkpoints replace them (--resume_from_checkpoint latest "
                    "would continue that run)",
                    out_dir.string(), ds::train::latest_tag(out_dir)));

  // ---- metrics ----
  const fs::path csv_root =
      cfg.csv_monitor.output_path.empty() ? out_dir : fs::path(cfg.csv_monitor.output_path);
  const std::string job = cfg.csv_monitor.enabled ? cfg.csv_monitor.job_name : "metrics";
  ds::runtime::CsvMonitor monitor(
      csv_root, job, resumed ? std::optional<int64_t>(engine->global_samples()) : std::nullopt);

  const int64_t logging_steps = o.logging_steps > 0 ? o.logging_steps : cfg.steps_per_print;
  const int64_t eval_steps =
      o.eval_steps >= 0 ? o.eval_steps : std::max<int64_t>(1, total_steps / 10);
  // Tokens of the whole global batch (every rank's micro-batches), like samples/step.
  const int64_t tokens_per_step = B * T * A * dp_size;
  say(fmt::format(
      "training {} steps ({}), {} tokens/step; logging every {}, eval every {}, "
      "checkpoint every {} -> {}",
      total_steps, rc.total_why, human_count(static_cast<double>(tokens_per_step)), logging_steps,
      eval_steps > 0 ? std::to_string(eval_steps) : "- (end only)",
      o.save_steps > 0 ? std::to_string(o.save_steps) : "- (end only)", out_dir.string()));

  // ---- checkpoint and eval helpers ----
  int64_t last_saved = resumed ? engine->global_steps() : -1;  // that checkpoint exists already
  // Tensor- and pipeline-parallel checkpoints load at any (dp, pp, tp) (docs/checkpoints.md).
  const bool pipelined = pp_size > 1;
  auto save = [&]() {
    const auto t0 = std::chrono::steady_clock::now();
    const json client = {{"data", loader.state()},
                         {"ds_train",
                          {{"seq_len", T},
                           {"model", mcfg.to_json()},
                           {"total_steps", total_steps},
                           {"seed", o.seed},
                           {"train_data", train_dir.string()}}}};
    engine->save_checkpoint(out_dir.string(), "", client);
    last_saved = engine->global_steps();
    std::string rotated;
    if (lead)
      for (const auto& p : ds::train::rotate_checkpoints(out_dir, o.save_total_limit))
        rotated += " " + p.filename().string();
    say(fmt::format("step {}: checkpoint {}/global_step{} ({:.1f}s){}", engine->global_steps(),
                    out_dir.string(), engine->global_steps(), ds::train::seconds_since(t0),
                    rotated.empty() ? "" : "; deleted" + rotated));
  };
  double last_eval = std::nan("");
  int64_t evaluated_at = -1;  // the step of the newest eval row
  if (resumed) {
    // A run resumed at its end (nothing left to train) must not evaluate, and log, that step twice.
    for (const auto& [samples, loss] :
         ds::runtime::CsvMonitor::read(monitor.file_of("Eval/Samples/eval_loss")))
      if (samples == engine->global_samples())
        evaluated_at = engine->global_steps(), last_eval = loss;
  }
  auto run_eval = [&]() {
    if (!val || evaluated_at == engine->global_steps()) return;
    evaluated_at = engine->global_steps();
    const auto t0 = std::chrono::steady_clock::now();
    last_eval = evaluate(*engine, pipe.get(), *val, B, T, o.eval_batches);
    if (!std::isfinite(last_eval)) return;
    const double ppl = std::exp(last_eval);
    if (lead)
      monitor.write_events({{"Eval/Samples/eval_loss", last_eval, engine->global_samples()},
                            {"Eval/Samples/eval_perplexity", ppl, engine->global_samples()}});
    say(fmt::format("step {}: eval loss {:.4f}, perplexity {:.2f} ({:.1f}s)",
                    engine->global_steps(), last_eval, ppl, ds::train::seconds_since(t0)));
  };

  if (o.eval_only) {
    // The model as loaded, on the eval data, and nothing else: no step, checkpoint or export.
    DS_CHECK(val, "[ds_train] --eval_only needs eval data: a 'val' split in {} or --eval_data",
             train_dir.string());
    const int64_t batches = std::min<int64_t>(
        o.eval_batches, static_cast<int64_t>(val->num_samples(static_cast<size_t>(T))) / B);
    DS_CHECK(batches > 0,
             "[ds_train] --eval_only: the eval data has fewer than one batch of {} x {} tokens",
             B, T);
    const auto t0 = std::chrono::steady_clock::now();
    const double loss = evaluate(*engine, pipe.get(), *val, B, T, o.eval_batches);
    say(fmt::format("eval only: loss {:.6f}, perplexity {:.4f} over {} batches of {} x {} "
                    "({:.1f}s)",
                    loss, std::exp(loss), batches, B, T, ds::train::seconds_since(t0)));
    return 0;
  }

  // ---- the loop ----
  std::vector<int32_t> x(static_cast<size_t>(B * T)), y(static_cast<size_t>(B * T));
  const int64_t first_step = engine->global_steps();
  const int64_t skipped_before = engine->skipped_steps();
  double window_loss = 0.0, window_time = 0.0, train_time = 0.0;
  int64_t window_steps = 0;
  double last_loss = std::nan("");
  std::deque<double> recent;  // the last logging_steps losses, for the final report
  bool reported_peak = false;
  while (engine->global_steps() < total_steps) {
    const auto t0 = std::chrono::steady_clock::now();
    const double lr = engine->get_lr();  // the rate this step applies
    // Every rank's micro-batches of the global batch; the loss is the mean over micro-batches and
    // data-parallel ranks. The first and last pipeline stage read the same micro-batches.
    auto next = [&] {
      const uint64_t position = loader.sampler().next_sample_position();
      loader.next(x, y);
      ds::Tensor xi = ds::Tensor::empty({B, T}, ds::DType::i32);
      ds::Tensor yi = ds::Tensor::empty({B, T}, ds::DType::i32);
      fill_ids(xi, x);
      fill_ids(yi, y);
      return ds::runtime::MicroBatch{xi, yi, position};
    };
    last_loss = pipe ? static_cast<double>(pipe->train_batch(next)) : engine->train_batch(next);
    const double dt = ds::train::seconds_since(t0);
    const int64_t step = engine->global_steps();
    recent.push_back(last_loss);
    if (static_cast<int64_t>(recent.size()) > logging_steps) recent.pop_front();
    window_loss += last_loss, window_time += dt, train_time += dt, ++window_steps;
    const double tok_s = static_cast<double>(tokens_per_step) / dt;
    const int64_t samples = engine->global_samples();
    std::vector<ds::runtime::MonitorEvent> ev = {
        {"Train/Samples/train_loss", last_loss, samples},
        {"Train/Samples/lr", lr, samples},
        {"Train/Samples/loss_scale", engine->loss_scale(), samples},
        {"Train/Samples/tokens_per_second", tok_s, samples}};
    if (std::isfinite(engine->last_grad_norm()))
      ev.push_back({"Train/Samples/grad_norm", engine->last_grad_norm(), samples});
    if (lead) monitor.write_events(ev);

    if (!reported_peak) {
      reported_peak = true;
      const int64_t peak = static_cast<int64_t>(ds::cpu_allocator().stats().peak_bytes_in_use);
      say(fmt::format(
          "step {}: measured peak tensor memory {} (model states {} + activations and "
          "temporaries {}); RSS {}",
          step, mib(peak), mib(mem.total()), mib(std::max<int64_t>(0, peak - mem.total())),
          mib(ds::train::current_rss_bytes())));
    }
    const double avg_step = train_time / static_cast<double>(step - first_step);
    const double eta = avg_step * static_cast<double>(total_steps - step);
    con.bar(fmt::format("step {}/{} [{}] loss {:.4f} | lr {:.2e} | {} tok/s | ETA {}", step,
                        total_steps, ds::train::bar_cells(double(step) / total_steps, 24),
                        last_loss, lr, human_count(tok_s), human_duration(eta)));
    if (step % logging_steps == 0 || step == total_steps) {
      say(fmt::format(
          "step {}/{} | loss {:.4f} | lr {:.3e} | grad norm {:.3f} | {} tok/s | "
          "{:.2f}s/step | elapsed {} | ETA {}{}",
          step, total_steps, window_loss / window_steps, lr, engine->last_grad_norm(),
          human_count(static_cast<double>(tokens_per_step * window_steps) / window_time),
          window_time / window_steps, human_duration(ds::train::seconds_since(t_start)),
          human_duration(eta),
          engine->skipped_steps() > 0 ? fmt::format(" | skipped {}", engine->skipped_steps())
                                      : ""));
      window_loss = window_time = 0.0;
      window_steps = 0;
    }
    if (eval_steps > 0 && step % eval_steps == 0 && step != total_steps) run_eval();
    if (o.save_steps > 0 && step % o.save_steps == 0 && step != total_steps) save();
  }
  con.end_bar();
  engine->synchronize();  // the last optimizer step may still run in the background (offload)

  // A run that never applied a step trained nothing: its checkpoint and export would be the
  // starting weights. Fail instead of reporting success.
  const int64_t steps_run = engine->global_steps() - first_step;
  if (steps_run > 0 && engine->skipped_steps() - skipped_before >= steps_run)
    DS_THROW(
        "[ds_train] every one of the {} steps of this run was skipped for non-finite gradients: "
        "the "
        "model did not train and nothing was saved. Lower --learning_rate, set gradient_clipping, "
        "use bf16 instead of fp16, or check the data",
        steps_run);

  // ---- the end: eval, checkpoint, memory.json, picture, sample, export ----
  run_eval();
  if (last_saved != engine->global_steps()) save();

  const int64_t peak_rss = ds::train::peak_rss_bytes();
  // One file for the job, written by rank 0 from every rank's numbers.
  const auto ranks = ds::train::gather_memory(
      *engine,
      {.rank = rank,
       .mem = mem,
       .peak_tensor_bytes = static_cast<int64_t>(ds::cpu_allocator().stats().peak_bytes_in_use),
       .peak_rss_bytes = peak_rss});
  if (lead) ds::train::write_memory_json(out_dir / "memory.json", *engine, ranks, act_bytes);

  // The picture is drawn from the CSV files, which hold the whole run across resumes.
  const fs::path svg = out_dir / "loss.svg";
  if (lead)
    ds::train::write_loss_chart(svg, monitor, G, T,
                                fmt::format("{} on {}", model_name, train_dir.filename().string()),
                                uni.entropy_nats, eval_baseline);

  // A generated sample, decoded with the tokenizer (loaded and checked at start-up).
  std::string sample_note;
  if (sample_tokenizer && (tp_size > 1 || pipelined)) {
    say("note: no sample: generation from a tensor- or pipeline-parallel model is not "
        "implemented (generate from the HF export with ds_generate)");
  } else if (sample_tokenizer) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string text = ds::train::generate_sample(*model, *sample_tokenizer, o.sample_prompt,
                                                        o.sample_tokens, o.sample_top_k, o.seed);
    if (lead) ds::write_file_atomic(out_dir / "sample.txt", text + "\n");
    say(fmt::format("sample ({} tokens, top-k {}, seed {}, {:.1f}s):", o.sample_tokens,
                    o.sample_top_k, o.seed, ds::train::seconds_since(t0)));
    con.line("---\n" + text + "\n---");
    sample_note = (out_dir / "sample.txt").string();
  }

  // comms_logger: per-operation counts, bytes and times of this rank's collectives.
  if (cfg.comms_logger.enabled && lead)
    con.line("comms_logger (rank 0):\n" + ds::comm::comms_logger().table());

  // Under ZeRO-3 no rank holds the whole model: every rank takes part in gathering it, rank 0
  // writes it (DeepSpeed's stage3_gather_16bit_weights_on_model_save).
  bool exported = false;
  std::string export_note;
  if (export_dir != "none") {
    const auto weights = pipe ? pipe->full_weights() : engine->full_weights();
    // LoRA: a PEFT adapter when only the LoRA matrices trained (and --merge_lora is not given);
    // otherwise the merged weights (an adapter alone would lose the other trained parameters).
    const bool merge = lora && (o.merge_lora || !lora->only_optimize_lora);
    if (lead && lora && !merge) {
      std::error_code ec;
      const std::string base =
          o.init_from.empty() ? "" : fs::absolute(o.init_from, ec).lexically_normal().string();
      export_note = ds::train::export_lora(*model, weights, *lora, false, export_dir, base);
    } else if (lead) {
      if (lora)
        export_note = ds::train::export_lora(*model, weights, *lora, true, export_dir, "");
      else
        ds::models::export_hf(mcfg, weights, export_dir);
      say(ds::train::export_tokenizer_beside(
          export_dir, {o.init_from.empty() ? fs::path() : fs::path(o.init_from), tok_dir},
          mcfg.vocab_size));
      // Fine-tuned on a chat set: the export carries the template its examples were rendered
      // with, so ds_serve, ds_generate and transformers' apply_chat_template format prompts the
      // way the model was trained.
      if (const std::string t = ds::train::sft_template_of(train_dir); !t.empty())
        say(ds::train::set_export_chat_template(export_dir, t));
    }
    exported = true;
  }

  double recent_mean = 0.0;
  for (double l : recent) recent_mean += l / static_cast<double>(recent.size());
  say(fmt::format("done: {} steps in {}", engine->global_steps(),
                  human_duration(ds::train::seconds_since(t_start))));
  if (!recent.empty())
    say(fmt::format("train loss {:.4f} (mean of the last {} steps; unigram entropy {:.3f})",
                    recent_mean, recent.size(), uni.entropy_nats));
  if (std::isfinite(last_eval))
    say(fmt::format("eval loss  {:.4f}, perplexity {:.1f} (train unigram frequencies: {:.3f})",
                    last_eval, std::exp(last_eval), eval_baseline));
  say(fmt::format("metrics:    {}/*.csv", monitor.log_dir().string()));
  say(fmt::format("loss curve: {}", svg.string()));
  say(fmt::format("checkpoint: {}/{} (resume: --resume_from_checkpoint latest)", out_dir.string(),
                  ds::train::latest_tag(out_dir)));
  if (exported)
    say(fmt::format("HF export:  {}", export_note.empty()
                                          ? export_dir + " (config.json + model.safetensors)"
                                          : export_note));
  if (!sample_note.empty()) say(fmt::format("sample:     {}", sample_note));
  int64_t max_rss = 0;
  for (const auto& r : ranks) max_rss = std::max(max_rss, r.peak_rss_bytes);
  say(fmt::format(
      "memory:     {}/memory.json (peak RSS {}{})", out_dir.string(), mib(peak_rss),
      world_size > 1 ? fmt::format(" on rank 0, {} on the largest rank", mib(max_rss)) : ""));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  Given g;
  CLI::App app{
      "Train a GPT model with a DeepSpeed config (one process). Flags follow the Hugging Face "
      "Trainer; \"auto\" values in the config take them. docs/training.md has the details.\n"
      "Example:\n  ds_train --deepspeed configs/ds_demo.json --model tiny --train_data "
      ".cache/prepared/sotu --output_dir out/demo --max_steps 300 --learning_rate 1e-3",
      "ds_train"};
  std::vector<std::pair<CLI::Option*, bool*>> given;
  ds::train::add_options(app, o, g, given);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; a bad flag exits 2, the usual status of a usage error.
    return app.exit(e) == 0 ? 0 : 2;
  }
  for (auto& [op, flag] : given) *flag = op->count() > 0;

  try {
    return run(o, g);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    // The communication layer has printed its report and is ending the job with its own status.
    if (ds::comm::job_failed()) ds::comm::abort_job(ds::comm::kCommFailureExitCode, "");
    const std::string what = e.what();
    // The world may be what failed (WORLD_SIZE=2 without mpirun): then this is one process.
    std::shared_ptr<ds::comm::Group> world;
    try {
      world = ds::comm::world();
    } catch (const std::exception&) {
    }
    const bool several = world && world->size() > 1;
    // Most errors (config, data, arguments) happen on every rank alike: let rank 0 report and end
    // the job, so the message appears once. An error only this rank hit still gets printed after
    // the pause, when rank 0 has not ended the job.
    if (several && world->rank() != 0) std::this_thread::sleep_for(std::chrono::seconds(2));
    // On a terminal the progress bar may still occupy the line.
    fmt::print(stderr, "{}{}{}\n", ::isatty(STDERR_FILENO) ? "\n" : "",
               what.rfind('[', 0) == 0 ? "" : "[ds_train] error: ", what);
    // The other ranks would wait for this one at their next collective: end the whole job now.
    if (several)
      ds::comm::abort_job(1, fmt::format("[ds_train] rank {} stopped the job", world->rank()));
    return 1;
  }
}

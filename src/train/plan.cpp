#include "ds/train/plan.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>

#include <fmt/format.h>

#include "ds/backend/backend.h"
#include "ds/comm/group.h"
#include "ds/core/error.h"
#include "ds/data/text_tokenizer.h"
#include "ds/models/hf_io.h"
#include "ds/train/lora.h"

namespace ds::train {

namespace fs = std::filesystem;
using nlohmann::json;

Slot slot(const json& root, const std::string& path) {
  const json* node = &root;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string key = path.substr(start, dot == std::string::npos ? dot : dot - start);
    if (!node->is_object() || !node->contains(key)) return Slot::Absent;
    node = &(*node)[key];
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  if (node->is_null()) return Slot::Absent;
  return node->is_string() && node->get<std::string>() == "auto" ? Slot::Auto : Slot::Value;
}

config::TrainerArgs trainer_args(const Options& o, const Given& g, const json& raw) {
  config::TrainerArgs a;
  auto is_auto = [&](const char* p) { return slot(raw, p) == Slot::Auto; };
  const bool train_explicit = slot(raw, "train_batch_size") == Slot::Value;
  if (g.per_device_train_batch_size ||
      (!train_explicit && slot(raw, "train_micro_batch_size_per_gpu") != Slot::Value))
    a.per_device_train_batch_size = o.per_device_train_batch_size;
  if (g.gradient_accumulation_steps ||
      (!train_explicit && slot(raw, "gradient_accumulation_steps") != Slot::Value))
    a.gradient_accumulation_steps = o.gradient_accumulation_steps;
  if (g.learning_rate || is_auto("optimizer.params.lr") ||
      is_auto("scheduler.params.warmup_max_lr"))
    a.learning_rate = o.learning_rate;
  const bool betas_auto = is_auto("optimizer.params.betas");
  if (g.adam_beta1 || betas_auto) a.adam_beta1 = o.adam_beta1;
  if (g.adam_beta2 || betas_auto) a.adam_beta2 = o.adam_beta2;
  if (g.adam_epsilon || is_auto("optimizer.params.eps")) a.adam_epsilon = o.adam_epsilon;
  if (g.weight_decay || is_auto("optimizer.params.weight_decay")) a.weight_decay = o.weight_decay;
  if (g.max_grad_norm || is_auto("gradient_clipping")) a.max_grad_norm = o.max_grad_norm;
  if (g.warmup_steps || is_auto("scheduler.params.warmup_num_steps"))
    a.warmup_steps = o.warmup_steps;
  if (g.fp16 || is_auto("fp16.enabled")) a.fp16 = o.fp16;
  if (g.bf16 || is_auto("bf16.enabled")) a.bf16 = o.bf16;
  return a;
}

std::string strip_leading_comments(const std::string& text) {
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    const std::string line = text.substr(pos, nl == std::string::npos ? nl : nl - pos);
    const size_t first = line.find_first_not_of(" \t\r");
    if (first != std::string::npos && line.compare(first, 2, "//") != 0) break;
    if (nl == std::string::npos) return "";
    pos = nl + 1;
  }
  return text.substr(pos);
}

models::GPTConfig resolve_model(const Options& o, const Given& g) {
  if (!g.model && !o.init_from.empty()) {
    if (auto c = models::read_hf_config(o.init_from)) return *c;
  }
  return models::resolve_model_config(g.model ? o.model : "tiny", "ds_train");
}

bool has_split(const fs::path& dir, const std::string& split) {
  std::ifstream in(dir / "meta.json");
  if (!in) return false;
  try {
    const json meta = json::parse(in);
    return meta.contains("splits") && meta["splits"].contains(split);
  } catch (const json::exception&) {
    return false;
  }
}

RunConfig resolve_run_config(const Options& o, const Given& g, const models::GPTConfig& mcfg,
                             uint64_t S, int64_t T, const char* builtin_config) {
  std::string cfg_source;
  const json raw =
      g.deepspeed ? config::load_config_json(o.deepspeed, &cfg_source)
                  : config::load_config_json(strip_leading_comments(builtin_config), &cfg_source);
  if (!g.deepspeed) cfg_source = "built-in default (configs/ds_demo.json)";
  // ---- the model-parallel sizes first: the batch sizes count data-parallel ranks, world / (tp x
  // pp) (DeepSpeed's rule). The flag, or the config's tensor_parallel.autotp_size /
  // pipeline.stages (a number; "auto" = the flag or 1); both given must agree. ----
  const config::ParallelSizes file = config::read_parallel_sizes(raw, cfg_source);
  const int cfg_tp = file.tensor_parallel.size, cfg_pp = file.pipeline.stages;
  DS_CHECK(o.tensor_parallel_size == 0 || cfg_tp <= 1 || o.tensor_parallel_size == cfg_tp,
           "[ds_train] --tensor_parallel_size {} disagrees with tensor_parallel.autotp_size {} in "
           "{}; give one, or the same number",
           o.tensor_parallel_size, cfg_tp, cfg_source);
  const int tp = o.tensor_parallel_size > 0 ? o.tensor_parallel_size : std::max(1, cfg_tp);
  DS_CHECK(o.pipeline_parallel_size == 0 || cfg_pp <= 0 || o.pipeline_parallel_size == cfg_pp,
           "[ds_train] --pipeline_parallel_size {} disagrees with pipeline.stages {} in {}; give "
           "one, or the same number",
           o.pipeline_parallel_size, cfg_pp, cfg_source);
  const int pp = o.pipeline_parallel_size > 0 ? o.pipeline_parallel_size : std::max(1, cfg_pp);
  const int world = ds::comm::world()->size();  // ranks under mpirun / the deepspeed launcher
  DS_CHECK(world % (tp * pp) == 0,
           "[ds_train] tensor parallel size {} x pipeline parallel size {} = {} does not divide "
           "the {} ranks of the job; launch a multiple of {} ranks (world = dp x pp x tp)",
           tp, pp, tp * pp, world, tp * pp);
  DS_CHECK(pp <= mcfg.n_layer + 2,
           "[ds_train] --pipeline_parallel_size {} exceeds the model's {} pipeline layers "
           "(embedding, {} blocks, head): every stage needs at least one",
           pp, mcfg.n_layer + 2, mcfg.n_layer);
  config::ConfigContext ctx;
  ctx.world_size = world / (tp * pp);
  ctx.hidden_size = mcfg.n_embd;
  ctx.source_name = cfg_source;
  ctx.args = trainer_args(o, g, raw);
  // The sizes reach the typed config through the parse (a flag alone sets them too).
  if (tp > 1) ctx.args.tensor_parallel_size = tp;
  if (pp > 1) ctx.args.pipeline_parallel_size = pp;
  if (o.expert_parallel_size > 0) ctx.args.expert_parallel_size = o.expert_parallel_size;

  // ---- the run length (docs/training.md, "Run length"): --max_steps, else the file's
  // scheduler.params.total_num_steps, else epochs of floor(samples / train_batch_size) steps,
  // which needs the batch sizes before the parse ----
  const Slot total_slot = slot(raw, "scheduler.params.total_num_steps");
  const bool file_total = !g.max_steps && !g.num_train_epochs && total_slot == Slot::Value;
  const bool in_epochs = !g.max_steps && !file_total;
  int64_t total_steps = 0, steps_per_epoch = 0;
  std::string total_why;
  auto per_epoch = [&](int64_t G) {
    DS_CHECK(S >= static_cast<uint64_t>(G),
             "[ds_train] the training set has {} samples of {} tokens, fewer than one global "
             "batch ({}): use a smaller batch or --block_size, or more data",
             S, T, G);
    return static_cast<int64_t>(S / static_cast<uint64_t>(G));
  };
  if (g.max_steps) {
    total_steps = o.max_steps;
    total_why = "--max_steps";
  } else if (file_total) {
    // The file's schedule length is the run length when the user gave none.
    total_steps = raw["scheduler"]["params"]["total_num_steps"].get<int64_t>();
    total_why = "the config's scheduler.params.total_num_steps";
  } else {
    DS_CHECK(o.num_train_epochs > 0, "[ds_train] --num_train_epochs must be positive, got {}",
             o.num_train_epochs);
    steps_per_epoch = per_epoch(config::resolve_batch_sizes(raw, ctx).train_batch_size);
    total_steps = std::max<int64_t>(
        1,
        static_cast<int64_t>(std::ceil(o.num_train_epochs * static_cast<double>(steps_per_epoch))));
    total_why = fmt::format("{} epoch{} x {} steps", o.num_train_epochs,
                            o.num_train_epochs == 1 ? "" : "s", steps_per_epoch);
  }
  if (g.max_steps || g.num_train_epochs || total_slot == Slot::Auto)
    ctx.args.total_steps = total_steps;

  // ---- the one parse ----
  RunConfig r;
  r.cfg = config::parse_config_json(raw, ctx);
  if (!in_epochs) steps_per_epoch = per_epoch(r.cfg.batch.train_batch_size);
  r.tensor_parallel = tp;
  r.pipeline_parallel = pp;
  r.ctx = ctx;
  r.source = cfg_source;
  r.steps_per_epoch = steps_per_epoch;
  r.total_steps = total_steps;
  r.total_why = total_why;
  return r;
}

Device parse_device(const std::string& name) {
  if (name == "cpu") return kCPU;
  if (name == "cuda" || name == "cuda:0") return Device{DeviceType::cuda, 0};
  // The device emulator (backend::sim): GPU-like memory on the CPU's kernels, for testing a run's
  // device code paths on a machine without a GPU (docs/cuda.md); not a performance device.
  if (name == "sim" || name == "sim:0") return Device{DeviceType::sim, 0};
  DS_CHECK(name.rfind("cuda:", 0) != 0,
           "[device] --device {}: one GPU per process, seen as cuda:0; choose the GPU with "
           "CUDA_VISIBLE_DEVICES and pass --device cuda",
           name);
  DS_THROW("[device] --device '{}' is not a device: use cpu, cuda or sim (the emulator)", name);
}

Device plan_device(const Options& o) {
  const Device device = parse_device(o.device);
  if (!device.is_cpu()) {
    backend::get(device);  // a build without CUDA, or no GPU, says so here
  } else {
    DS_CHECK(o.device_memory_limit_gib == 0.0,
             "[ds_train] --device_memory_limit {} caps GPU memory: it needs --device cuda",
             o.device_memory_limit_gib);
  }
  return device;
}

std::string apply_device_memory_limit(Device device, const Options& o) {
  if (device.is_cpu() || o.device_memory_limit_gib <= 0.0) return "";
  backend::get(device).set_memory_limit(
      static_cast<uint64_t>(o.device_memory_limit_gib * 1024.0 * 1024.0 * 1024.0));
  return fmt::format("device memory limit: {:.1f} GiB", o.device_memory_limit_gib);
}

RunPlan plan_run(const Options& o, const Given& g, const char* builtin_config) {
  RunPlan p;
  p.spec = o;
  p.given = g;
  std::vector<std::string>& notes = p.notes;

  // ---- inputs that are only used at the end are checked now, not after the whole run ----
  p.tokenizer_dir = o.tokenizer.empty() ? fs::path(default_tokenizer_dir()) : fs::path(o.tokenizer);
  if (o.sample_tokens > 0) {
    if (fs::exists(p.tokenizer_dir / "encoder.json")) {
      p.sample_tokenizer = data::Tokenizer::load_gpt2(p.tokenizer_dir);  // throws on a damaged file
    } else {
      DS_CHECK(o.tokenizer.empty(),
               "[ds_train] --tokenizer {}: no encoder.json there (the GPT-2 tokenizer files "
               "encoder.json and vocab.bpe are needed for the sample; --sample_tokens 0 skips it)",
               o.tokenizer);
      notes.push_back(
          fmt::format("note: no sample at the end: tokenizer files not found in {} (give "
                      "--tokenizer DIR, or run scripts/fetch_data.sh)",
                      p.tokenizer_dir.string()));
    }
  }

  // The export at the end copies the tokenizer of --init_from, else of --tokenizer: one that cannot
  // be read would only be found after the whole run ("no tokenizer exported", or another folder's
  // tokenizer beside the model). Read each now.
  if (o.export_hf != "none")
    for (auto [flag, dir] : {std::pair{"--init_from", o.init_from}, {"--tokenizer", o.tokenizer}}) {
      std::error_code ec;
      if (dir.empty() || !fs::is_directory(dir, ec) || !data::has_tokenizer_files(dir)) continue;
      try {
        (void)data::load_tokenizer(dir);
      } catch (const Error& e) {
        DS_THROW(
            "[ds_train] {} {}: its tokenizer cannot be read, so the export at the end would have "
            "none: {}. Fix or replace the tokenizer files, or give --export_hf none",
            flag, dir, e.what());
      }
    }

  // ---- data ----
  DS_CHECK(!o.train_data.empty(),
           "[ds_train] --train_data is required: a folder made by ds_prepare");
  p.train_dir = o.train_data;
  const fs::path& train_dir = p.train_dir;
  if (!fs::exists(train_dir / "meta.json"))
    DS_THROW(
        "[ds_train] --train_data {}: no prepared corpus there (no meta.json). Create it with: "
        "ds_prepare --tokenizer {} --output {} <text files or folders>   (the demo corpus: bash "
        "scripts/fetch_data.sh, then ds_prepare --tokenizer .cache/data/gpt2 --output {} "
        "--val_from_year 2001 .cache/data/sotu)",
        train_dir.string(), default_tokenizer_dir(), train_dir.string(), train_dir.string());
  p.train =
      std::make_shared<data::TokenDataset>(data::TokenDataset::open_split(train_dir, "train"));
  if (!o.eval_data.empty()) {
    p.val = std::make_shared<data::TokenDataset>(data::TokenDataset::open_split(o.eval_data, "val"));
    p.val_from = o.eval_data;
  } else if (has_split(train_dir, "val")) {
    p.val = std::make_shared<data::TokenDataset>(data::TokenDataset::open_split(train_dir, "val"));
    p.val_from = train_dir.string();
  }

  // ---- model config, sequence length ----
  p.model = resolve_model(o, g);
  const models::GPTConfig& mcfg = p.model;
  // An SFT set (ds_prepare --sft) fixes T: its examples are exactly T + 1 tokens; without
  // --block_size it is the default, and any other length is refused naming both.
  const int64_t T = o.block_size > 0    ? o.block_size
                    : p.train->is_sft() ? static_cast<int64_t>(p.train->sft_seq_len())
                                        : std::min<int64_t>(256, mcfg.block_size);
  DS_CHECK(T > 0, "[ds_train] --block_size must be positive, got {}", T);
  for (const data::TokenDataset* d : {p.train.get(), p.val.get()})
    if (d) d->check_seq_len(static_cast<size_t>(T));
  DS_CHECK(T <= mcfg.block_size,
           "[ds_train] --block_size {} exceeds the model's block_size {} (its position table)", T,
           mcfg.block_size);
  // The eval set too: a mismatch found at the first evaluation would cost the steps before it.
  for (const data::TokenDataset* d : {p.train.get(), p.val.get()})
    DS_CHECK(!d || static_cast<int64_t>(d->vocab_size()) <= mcfg.vocab_size,
             "[ds_train] {}: the data's vocabulary ({} ids) does not fit the model's vocab_size "
             "{}; prepare it with the model's tokenizer",
             d == p.train.get() ? "--train_data " + o.train_data : "the eval data",
             d ? d->vocab_size() : 0, mcfg.vocab_size);
  p.seq_len = p.tokens_per_example = T;
  p.samples = p.train->num_samples(static_cast<size_t>(T));

  // ---- config, run length, parallel sizes ----
  p.run = resolve_run_config(o, g, mcfg, p.samples, T, builtin_config);
  const config::DeepSpeedConfig& cfg = p.run.cfg;
  p.activation_bytes =
      activation_estimate(mcfg, p.micro_batch(), T, o.gradient_checkpointing,
                          static_cast<int64_t>(dtype_size(cfg.training_dtype())));
  p.lora = lora_config(o, g, mcfg);
  const int tp = p.run.tensor_parallel, pp = p.run.pipeline_parallel;
  p.world_size = comm::world()->size();
  p.data_parallel = p.run.ctx.world_size;  // world / (tp x pp), what the batch rules counted
  if (pp > 1) {
    DS_CHECK(!p.lora, "[ds_train] LoRA (--lora_dim) with --pipeline_parallel_size {} is not "
             "implemented yet; use --pipeline_parallel_size 1", pp);
  }
  if (tp > 1) {
    DS_CHECK(!p.lora, "[ds_train] LoRA (--lora_dim) with --tensor_parallel_size {} is not "
             "implemented yet; use --tensor_parallel_size 1", tp);
  }
  // AutoEP's preset names the model family it expects: here the model's own family says it.
  const std::string& preset = cfg.expert_parallel.preset_model;
  DS_CHECK(preset.empty() || preset == mcfg.resolved_family(),
           "[ds_train] expert_parallel.preset_model is '{}' but the model is family '{}'; set the "
           "preset to the model's family or remove the key",
           preset, mcfg.resolved_family());
  // Every stage, pipeline and tensor parallelism run on a device; collectives go through host
  // memory (comm/group.h: GPU-to-GPU collectives, NCCL, are not built yet).
  p.device = plan_device(o);
  // A pipeline stage is built whole (its layers only) and then sharded; so is a tensor-parallel
  // rank's part (its slices).
  // A model on a device is built whole in host memory and then moved (Module::to). With expert
  // parallelism each rank cuts its experts from the whole layers.
  p.partitioned_build = cfg.zero_optimization.stage == 3 && o.init_from.empty() && !p.lora &&
                        pp == 1 && tp == 1 && p.device.is_cpu() &&
                        cfg.expert_parallel.size <= 1;
  p.model_name = g.model                ? (fs::exists(o.model) ? fs::path(o.model).stem().string()
                                                               : o.model)
                 : !o.init_from.empty() ? fs::path(o.init_from).filename().string()
                                        : "tiny";
  return p;
}

int64_t activation_estimate(const models::GPTConfig& c, int64_t B, int64_t T, bool ckpt,
                            int64_t elem_bytes) {
  const int64_t C = c.n_embd, V = c.vocab_size;
  return stack_activation_estimate(B * T, c.n_layer, C, c.resolved_ffn_hidden(), 2 * C + 2 * V,
                                   ckpt, elem_bytes);
}

int64_t stack_activation_estimate(int64_t tokens, int64_t L, int64_t C, int64_t F, int64_t after,
                                  bool ckpt, int64_t elem_bytes) {
  const int64_t per_layer = 14 * C + 2 * F;
  const int64_t per_token = (ckpt ? L * C + per_layer : L * per_layer) + after;
  return tokens * per_token * elem_bytes;
}

std::string default_tokenizer_dir() {
  if (const char* c = std::getenv("DS_CACHE_DIR"); c && *c)
    return (std::filesystem::path(c) / "gpt2").string();
  return ".cache/data/gpt2";
}

}  // namespace ds::train

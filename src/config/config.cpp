// DeepSpeed config: the sections and their keys (§1), the batch rules (§2), the cross-section
// checks, and the effective-config report. The order of steps is in parse_root().
#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include "config_internal.h"
#include "ds/config/config.h"
#include "ds/core/error.h"

namespace ds::config {

using detail::above;
using detail::any_value;
using detail::at_least;
using detail::between;
using detail::json;
using detail::ParseState;
using detail::Range;
using detail::Section;

std::string_view origin_name(Origin o) {
  switch (o) {
    case Origin::Default:
      return "default";
    case Origin::File:
      return "file";
    case Origin::Auto:
      return "auto";
    case Origin::Derived:
      return "derived";
  }
  return "?";
}

namespace {

struct OptimizerName {
  OptimizerType type;
  const char* name;
};
constexpr OptimizerName kOptimizers[] = {
    {OptimizerType::Adam, "Adam"},
    {OptimizerType::AdamW, "AdamW"},
    {OptimizerType::Lamb, "Lamb"},
    {OptimizerType::SGD, "SGD"},
    {OptimizerType::Adagrad, "Adagrad"},
    {OptimizerType::Lion, "Lion"},
    {OptimizerType::Muon, "Muon"},
    {OptimizerType::OneBitAdam, "OneBitAdam"},
    {OptimizerType::ZeroOneAdam, "ZeroOneAdam"},
    {OptimizerType::OneBitLamb, "OneBitLamb"},
    {OptimizerType::MuAdam, "MuAdam"},
    {OptimizerType::MuAdamW, "MuAdamW"},
    {OptimizerType::MuSGD, "MuSGD"},
};

struct SchedulerName {
  SchedulerType type;
  const char* name;
};
constexpr SchedulerName kSchedulers[] = {
    {SchedulerType::WarmupLR, "WarmupLR"},
    {SchedulerType::WarmupDecayLR, "WarmupDecayLR"},
    {SchedulerType::WarmupCosineLR, "WarmupCosineLR"},
    {SchedulerType::OneCycle, "OneCycle"},
    {SchedulerType::LRRangeTest, "LRRangeTest"},
};

const std::vector<std::string> kDTypeNames = {"fp32", "fp16", "bf16"};

ds::DType dtype_of(const std::string& s) {
  return s == "fp16" ? ds::DType::f16 : s == "bf16" ? ds::DType::bf16 : ds::DType::f32;
}

const char* dtype_label(ds::DType t) {
  return t == ds::DType::f16 ? "fp16" : t == ds::DType::bf16 ? "bf16" : "fp32";
}

// ---- sections -------------------------------------------------------------------------------

void read_fp16(Section s, FP16Config& c) {
  c.enabled = s.boolean("enabled", false);
  c.loss_scale = s.number("loss_scale", 0.0, at_least(0));
  c.initial_scale_power = static_cast<int>(s.integer("initial_scale_power", 16, between(0, 64)));
  c.loss_scale_window = s.integer("loss_scale_window", 1000, at_least(1));
  // Any count beyond 2^31 never runs out in practice; clamp rather than refuse.
  c.hysteresis = static_cast<int>(
      std::min<int64_t>(s.integer("hysteresis", 2, at_least(1)), std::numeric_limits<int>::max()));
  c.consecutive_hysteresis = s.boolean("consecutive_hysteresis", false);
  c.min_loss_scale = s.number("min_loss_scale", 1.0, above(0));
  c.auto_cast = s.boolean("auto_cast", false);
  s.todo("auto_cast", "fp16 autocast of the model's inputs");
  c.fp16_master_weights_and_grads = s.boolean("fp16_master_weights_and_grads", false);
  s.todo("fp16_master_weights_and_grads", "fp16 master weights and gradients");
  s.finish();
}

void read_bf16(Section s, BF16Config& c) {
  c.enabled = s.boolean("enabled", false);
  c.immediate_grad_update = s.boolean("immediate_grad_update", true);
  s.todo("immediate_grad_update", "deferred bf16 gradient updates");
  s.finish();
}

// Adam's and Lamb's shared parameters.
void read_adam_like(Section& p, OptimizerConfig& c) {
  c.lr = p.number("lr", 1e-3, at_least(0));
  c.betas = p.number_pair("betas", {0.9, 0.999}, between(0, 1));
  c.eps = p.number("eps", 1e-8, at_least(0));
  c.weight_decay = p.number("weight_decay", 0.0, at_least(0));
  c.bias_correction = p.boolean("bias_correction", true);
}

void refuse_amsgrad(Section& p, const ParseState& st) {
  if (p.boolean("amsgrad", false))
    DS_THROW(
        "[config] optimizer.params.amsgrad = true is not supported in {} (DeepSpeed's fused "
        "and CPU optimizers refuse it too): remove it",
        st.source);
}

// The 1-bit optimizers' communication settings, plus their own `keys` kept as given.
void read_one_bit_extras(Section& p, OptimizerConfig& c, std::initializer_list<const char*> keys) {
  c.cuda_aware = p.boolean("cuda_aware", false);
  c.comm_backend_name = p.string("comm_backend_name", "nccl");
  for (const char* k : keys) {
    json v = p.any(k, nullptr);
    if (!v.is_null()) c.extra_params[k] = v;
  }
}

// 16-bit optimizer states are not implemented: the key is accepted, and said when false.
void read_fp32_states(Section& p, OptimizerConfig& c) {
  c.fp32_optimizer_states = p.boolean("fp32_optimizer_states", true);
  p.todo("fp32_optimizer_states", "16-bit optimizer states (they are always fp32 here)");
}

// Adam, AdamW, OneBitAdam, ZeroOneAdam, MuAdam, MuAdamW.
void read_adam_params(Section& p, OptimizerConfig& c, ParseState& st, const std::string& type) {
  read_adam_like(p, c);
  const bool adamw = c.type == OptimizerType::AdamW || c.type == OptimizerType::MuAdamW;
  c.adam_w_mode = p.boolean("adam_w_mode", true);
  if (adamw && !c.adam_w_mode) {
    st.warn(
        fmt::format("[config] optimizer.params.adam_w_mode = false is ignored for type {} "
                    "(AdamW always decouples weight decay; use \"type\": \"Adam\" with "
                    "\"adam_w_mode\": false for L2 regularisation)",
                    type));
    c.adam_w_mode = true;
  }
  c.torch_adam = p.boolean("torch_adam", false);
  read_fp32_states(p, c);
  p.boolean("set_grad_none", true);  // a PyTorch memory knob; meaningless here
  refuse_amsgrad(p, st);
  if (c.type == OptimizerType::OneBitAdam) {
    c.freeze_step = p.integer("freeze_step", 100000, at_least(0));
    read_one_bit_extras(p, c, {});
  } else if (c.type == OptimizerType::ZeroOneAdam) {
    read_one_bit_extras(p, c, {});
    // Kept in extra_params (the engine maps them onto optim::OneBitParams), checked here.
    c.extra_params["var_freeze_step"] = p.integer("var_freeze_step", 100000, at_least(0));
    c.extra_params["var_update_scaler"] = p.integer("var_update_scaler", 16, at_least(1));
    c.extra_params["local_step_scaler"] = p.integer("local_step_scaler", 32678, at_least(1));
    c.extra_params["local_step_clipper"] = p.integer("local_step_clipper", 16, at_least(1));
  }
}

// Lamb and OneBitLamb.
void read_lamb_params(Section& p, OptimizerConfig& c, ParseState& st) {
  read_adam_like(p, c);
  c.max_coeff = p.number("max_coeff", 10.0, at_least(0));
  c.min_coeff = p.number("min_coeff", 0.01, at_least(0));
  p.boolean("eps_inside_sqrt", false);
  p.todo("eps_inside_sqrt", "Lamb's eps inside the square root");
  refuse_amsgrad(p, st);
  if (c.type == OptimizerType::OneBitLamb) {
    c.freeze_step = p.integer("freeze_step", 100000, at_least(0));
    read_one_bit_extras(p, c, {});
    // Kept in extra_params (the engine maps them onto optim::OneBitParams), checked here.
    c.extra_params["coeff_beta"] = p.number("coeff_beta", 0.9, between(0, 1));
    c.extra_params["factor_max"] = p.number("factor_max", 4.0, at_least(0));
    c.extra_params["factor_min"] = p.number("factor_min", 0.5, at_least(0));
    c.extra_params["factor_threshold"] = p.number("factor_threshold", 0.1, at_least(0));
  }
}

// SGD and MuSGD.
void read_sgd_params(Section& p, OptimizerConfig& c, const ParseState& st) {
  c.lr = p.number("lr", 1e-3, at_least(0));
  c.momentum = p.number("momentum", 0.0, at_least(0));
  c.dampening = p.number("dampening", 0.0, any_value());
  c.weight_decay = p.number("weight_decay", 0.0, at_least(0));
  c.nesterov = p.boolean("nesterov", false);
  if (c.nesterov && (c.momentum <= 0 || c.dampening != 0))
    DS_THROW(
        "[config] optimizer.params.nesterov = true needs momentum > 0 and dampening 0 in "
        "{} (got momentum {}, dampening {})",
        st.source, c.momentum, c.dampening);
}

void read_adagrad_params(Section& p, OptimizerConfig& c, ParseState& st) {
  c.lr = p.number("lr", 1e-2, at_least(0));
  c.eps = p.number("eps", 1e-10, at_least(0));
  c.weight_decay = p.number("weight_decay", 0.0, at_least(0));
  c.lr_decay = p.number("lr_decay", 0.0, at_least(0));
  c.initial_accumulator_value = p.number("initial_accumulator_value", 0.0, at_least(0));
  read_fp32_states(p, c);
  refuse_amsgrad(p, st);
}

void read_lion_params(Section& p, OptimizerConfig& c) {
  c.lr = p.number("lr", 1e-3, at_least(0));
  c.betas = p.number_pair("betas", {0.9, 0.999}, between(0, 1));
  c.weight_decay = p.number("weight_decay", 0.0, at_least(0));
  read_fp32_states(p, c);
  p.boolean("set_grad_none", true);
}

// Muon: DeepSpeed 0.19's keys (engine._configure_basic_optimizer) and MuonWithAuxAdam's defaults.
void read_muon_params(Section& p, OptimizerConfig& c) {
  const std::optional<double> lr = p.opt_number("lr", at_least(0));
  c.lr_given = lr.has_value();
  c.lr = lr.value_or(0.02);  // the lr a schedule scales (Muon's default)
  c.muon_lr = p.opt_number("muon_lr", at_least(0)).value_or(-1.0);
  c.adam_lr = p.opt_number("adam_lr", at_least(0)).value_or(-1.0);
  c.momentum = p.number("momentum", 0.95, between(0, 1));
  c.weight_decay = p.number("weight_decay", 0.0, at_least(0));
  c.betas = p.number_pair("betas", {0.9, 0.95}, between(0, 1));
  c.eps = p.number("eps", 1e-10, at_least(0));
  c.ns_method = p.choice("ns_method", "gram", {"gram", "standard"});
}

void read_optimizer(Section s, OptimizerConfig& c, ParseState& st) {
  if (!s.present()) {
    s.declare("type");
    return;
  }
  std::vector<std::string> names;
  for (auto& o : kOptimizers) names.emplace_back(o.name);
  auto type = s.opt_choice("type", names, /*ci=*/true);
  DS_CHECK(type.has_value(),
           "[config] optimizer.type is missing in {}: give one of Adam, AdamW, Lamb, SGD, Adagrad, "
           "Lion, Muon (or remove the optimizer section to let the program choose)",
           st.source);
  for (auto& o : kOptimizers)
    if (*type == o.name) c.type = o.type;
  c.legacy_fusion = s.boolean("legacy_fusion", false);
  s.todo("legacy_fusion", "legacy optimizer fusion");
  Section p = s.child("params");
  if (const json* mg = p.raw_value("max_grad_norm"))
    DS_THROW(
        "[config] optimizer.params.max_grad_norm = {} is not allowed in {}: DeepSpeed clips "
        "gradients itself; use the top-level \"gradient_clipping\": {} instead",
        detail::json_show(*mg), st.source, detail::json_show(*mg));
  switch (c.type) {
    case OptimizerType::Adam:
    case OptimizerType::AdamW:
    case OptimizerType::OneBitAdam:
    case OptimizerType::ZeroOneAdam:
    case OptimizerType::MuAdam:
    case OptimizerType::MuAdamW: read_adam_params(p, c, st, *type); break;
    case OptimizerType::Lamb:
    case OptimizerType::OneBitLamb: read_lamb_params(p, c, st); break;
    case OptimizerType::SGD:
    case OptimizerType::MuSGD: read_sgd_params(p, c, st); break;
    case OptimizerType::Adagrad: read_adagrad_params(p, c, st); break;
    case OptimizerType::Lion: read_lion_params(p, c); break;
    case OptimizerType::Muon: read_muon_params(p, c); break;
    case OptimizerType::None: break;
  }
  p.finish();
  s.finish();
}

// Shared by WarmupLR and WarmupDecayLR.
// DeepSpeed 0.19 raises ValueError for warmup_num_steps = 0. A Trainer-style run without warm-up
// fills "auto" with 0, so 0 is accepted here and runs as DeepSpeed 0.16 did (W = max(2, 0));
// written in the file, it warns.
int64_t read_warmup_steps(Section& p, ParseState& st) {
  const int64_t w = p.integer("warmup_num_steps", 1000, at_least(0));
  if (w == 0 && !st.auto_filled.count("scheduler.params.warmup_num_steps"))
    st.warn(
        "[config] scheduler.params.warmup_num_steps = 0: DeepSpeed 0.19 refuses 0; deepspeed.cpp "
        "runs it as DeepSpeed 0.16 did (a warm-up of 2 steps); write 1 or more to silence this");
  return w;
}

// WarmupLR's warmup_max_lr defaults to the optimizer's lr (DeepSpeed 0.19); WarmupDecayLR keeps
// 1e-3.
template <class P>
void read_warmup(Section& p, P& w, double default_max_lr, ParseState& st) {
  w.warmup_min_lr = p.number("warmup_min_lr", 0.0, at_least(0));
  w.warmup_max_lr = p.number("warmup_max_lr", default_max_lr, at_least(0));
  w.warmup_num_steps = read_warmup_steps(p, st);
  w.warmup_type = p.choice("warmup_type", "log", {"log", "linear"}) == "log" ? WarmupType::Log
                                                                             : WarmupType::Linear;
}

int64_t required_steps(Section& p, const char* key, const char* type, ParseState& st) {
  auto v = p.opt_integer(key, at_least(1));
  DS_CHECK(v.has_value(), "[config] scheduler.params.{} is required for {} in {}", key, type,
           st.source);
  return *v;
}

void read_scheduler(Section s, SchedulerConfig& c, const OptimizerConfig& opt, ParseState& st) {
  if (!s.present()) {
    s.declare("type");
    return;
  }
  std::vector<std::string> names;
  for (auto& n : kSchedulers) names.emplace_back(n.name);
  auto type = s.opt_choice("type", names, /*ci=*/true);
  DS_CHECK(type.has_value(), "[config] scheduler.type is missing in {}: give one of {}", st.source,
           fmt::join(names, ", "));
  for (auto& n : kSchedulers)
    if (*type == n.name) c.type = n.type;
  Section p = s.child("params");
  c.last_batch_iteration = p.integer("last_batch_iteration", -1, at_least(-1));
  switch (c.type) {
    case SchedulerType::WarmupLR: {
      WarmupLRParams w;
      read_warmup(p, w, opt.lr, st);
      if (!p.has("warmup_max_lr"))
        st.update("scheduler.params.warmup_max_lr", w.warmup_max_lr, Origin::Derived,
                  "= optimizer.params.lr (DeepSpeed 0.19)");
      c.params = w;
      break;
    }
    case SchedulerType::WarmupDecayLR: {
      WarmupDecayLRParams w;
      w.total_num_steps = required_steps(p, "total_num_steps", "WarmupDecayLR", st);
      read_warmup(p, w, 1e-3, st);
      if (w.total_num_steps < std::max<int64_t>(2, w.warmup_num_steps))
        st.warn(
            fmt::format("[config] scheduler.params.total_num_steps {} is less than "
                        "warmup_num_steps {}: the lr decays to 0 right after warm-up",
                        w.total_num_steps, w.warmup_num_steps));
      c.params = w;
      break;
    }
    case SchedulerType::WarmupCosineLR: {
      WarmupCosineLRParams w;
      w.total_num_steps = required_steps(p, "total_num_steps", "WarmupCosineLR", st);
      w.warmup_min_ratio = p.number("warmup_min_ratio", 0.0, between(0, 1));
      w.warmup_num_steps = read_warmup_steps(p, st);
      w.cos_min_ratio = p.number("cos_min_ratio", 1e-4, between(0, 1));
      w.warmup_type = p.choice("warmup_type", "log", {"log", "linear"}) == "log"
                          ? WarmupType::Log
                          : WarmupType::Linear;
      if (w.total_num_steps < std::max<int64_t>(2, w.warmup_num_steps))
        st.warn(
            fmt::format("[config] scheduler.params.total_num_steps {} is less than "
                        "warmup_num_steps {}: the lr holds cos_min_ratio right after warm-up",
                        w.total_num_steps, w.warmup_num_steps));
      c.params = w;
      break;
    }
    case SchedulerType::OneCycle: {
      OneCycleParams o;
      auto min_lr = p.opt_number("cycle_min_lr", at_least(0));
      auto max_lr = p.opt_number("cycle_max_lr", at_least(0));
      DS_CHECK(min_lr && max_lr,
               "[config] scheduler.params.cycle_min_lr and cycle_max_lr are required for OneCycle "
               "in {}",
               st.source);
      o.cycle_min_lr = *min_lr;
      o.cycle_max_lr = *max_lr;
      o.decay_lr_rate = p.number("decay_lr_rate", 0.0, at_least(0));
      o.cycle_first_step_size = p.integer("cycle_first_step_size", 2000, at_least(1));
      // DeepSpeed accepts an empty second half (0): the cycle is then a ramp up only.
      auto second = p.opt_integer("cycle_second_step_size", at_least(0));
      o.cycle_second_step_size = second.value_or(o.cycle_first_step_size);
      if (!second)
        st.update("scheduler.params.cycle_second_step_size", o.cycle_second_step_size,
                  Origin::Derived, "= cycle_first_step_size");
      o.cycle_first_stair_count = p.integer("cycle_first_stair_count", 0, at_least(0));
      o.cycle_second_stair_count = p.opt_integer("cycle_second_stair_count", at_least(0))
                                       .value_or(o.cycle_first_stair_count);
      o.decay_step_size = p.integer("decay_step_size", 0, at_least(0));
      o.cycle_momentum = p.boolean("cycle_momentum", true);
      o.cycle_min_mom = p.number("cycle_min_mom", 0.8, between(0, 1));
      o.cycle_max_mom = p.number("cycle_max_mom", 0.9, between(0, 1));
      o.decay_mom_rate = p.number("decay_mom_rate", 0.0, any_value());
      if (o.cycle_momentum &&
          (opt.type == OptimizerType::SGD || opt.type == OptimizerType::Adagrad ||
           opt.type == OptimizerType::MuSGD)) {
        st.warn(
            fmt::format("[config] scheduler.params.cycle_momentum is disabled: optimizer {} "
                        "has no betas",
                        optimizer_type_name(opt.type)));
        o.cycle_momentum = false;
        st.update("scheduler.params.cycle_momentum", false, Origin::Derived,
                  "optimizer has no betas");
      }
      if (o.cycle_momentum && opt.betas[1] != 0.99)
        st.warn(fmt::format(
            "[config] scheduler.params.cycle_momentum: OneCycle sets beta2 to 0.99 while it cycles "
            "beta1, as DeepSpeed does, replacing optimizer.params.betas[1] = {}; set "
            "\"cycle_momentum\": false to keep the configured betas",
            opt.betas[1]));
      c.params = o;
      break;
    }
    case SchedulerType::LRRangeTest: {
      LRRangeTestParams r;
      r.lr_range_test_min_lr = p.number("lr_range_test_min_lr", 1e-3, at_least(0));
      r.lr_range_test_step_size = p.integer("lr_range_test_step_size", 2000, at_least(1));
      r.lr_range_test_step_rate = p.number("lr_range_test_step_rate", 1.0, at_least(0));
      r.lr_range_test_staircase = p.boolean("lr_range_test_staircase", false);
      c.params = r;
      break;
    }
    case SchedulerType::None:
      break;
  }
  p.finish();
  s.finish();
}

OffloadDevice read_device(Section& s) {
  auto d = s.choice("device", "none", {"none", "cpu", "nvme"});
  return d == "cpu" ? OffloadDevice::CPU : d == "nvme" ? OffloadDevice::NVMe : OffloadDevice::None;
}

void read_zero(Section s, ZeroConfig& z, ParseState& st) {
  const Range nonneg = at_least(0);
  z.stage = static_cast<int>(s.integer("stage", 0, between(0, 3)));
  z.contiguous_gradients = s.boolean("contiguous_gradients", true);
  z.reduce_scatter = s.boolean("reduce_scatter", true);
  z.reduce_bucket_size = s.integer("reduce_bucket_size", z.reduce_bucket_size, nonneg);
  z.use_multi_rank_bucket_allreduce = s.boolean("use_multi_rank_bucket_allreduce", true);
  z.allgather_partitions = s.boolean("allgather_partitions", true);
  z.allgather_bucket_size = s.integer("allgather_bucket_size", z.allgather_bucket_size, nonneg);
  auto overlap = s.opt_boolean("overlap_comm");
  z.overlap_comm = overlap.value_or(z.stage == 3);
  if (!overlap)
    st.update("zero_optimization.overlap_comm", z.overlap_comm, Origin::Default,
              "true for stage 3, false otherwise");
  z.load_from_fp32_weights = s.boolean("load_from_fp32_weights", true);
  z.elastic_checkpoint = s.boolean("elastic_checkpoint", false);
  s.todo("elastic_checkpoint", "elastic checkpoints");

  {
    Section o = s.child("offload_optimizer");
    auto& c = z.offload_optimizer;
    c.device = read_device(o);
    c.nvme_path = o.opt_string("nvme_path").value_or("");
    c.buffer_count = o.integer("buffer_count", c.buffer_count, nonneg);
    c.pin_memory = o.boolean("pin_memory", false);
    // DeepSpeed's defaults are false (no overlap); deepspeed.cpp overlaps unless told not to.
    for (auto [key, field] : {std::pair{"pipeline_read", &c.pipeline_read},
                              std::pair{"pipeline_write", &c.pipeline_write}}) {
      auto v = o.opt_boolean(key);
      *field = v.value_or(true);
      if (!v)
        st.update(std::string("zero_optimization.offload_optimizer.") + key, true, Origin::Default,
                  "deepspeed.cpp overlaps NVMe I/O by default (DeepSpeed: false)");
    }
    c.fast_init = o.boolean("fast_init", false);
    o.todo("fast_init", "fast NVMe optimizer initialisation from parameter swap files");
    c.ratio = o.number("ratio", 1.0, between(0, 1));
    // deepspeed.cpp's own scheduling keys (docs/offload.md): on unless turned off.
    c.overlap_step = o.boolean("overlap_step", true);
    c.step_in_backward = o.boolean("step_in_backward", true);
    c.prefetch_in_backward = o.boolean("prefetch_in_backward", true);
    c.download_in_backward = o.boolean("download_in_backward", true);
    o.finish();
  }
  {
    Section o = s.child("offload_param");
    auto& c = z.offload_param;
    c.device = read_device(o);
    c.nvme_path = o.opt_string("nvme_path").value_or("");
    c.buffer_count = o.integer("buffer_count", c.buffer_count, nonneg);
    c.buffer_size = o.integer("buffer_size", c.buffer_size, nonneg);
    c.max_in_cpu = o.integer("max_in_cpu", c.max_in_cpu, nonneg);
    c.pin_memory = o.boolean("pin_memory", false);
    o.finish();
  }
  z.sub_group_size = s.integer("sub_group_size", z.sub_group_size, nonneg);
  z.stage3_prefetch_bucket_size =
      s.integer("stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size, nonneg);
  z.stage3_param_persistence_threshold = s.integer(
      "stage3_param_persistence_threshold", z.stage3_param_persistence_threshold, nonneg);
  z.stage3_model_persistence_threshold =
      s.integer("stage3_model_persistence_threshold", INT64_MAX, nonneg);
  s.todo("stage3_model_persistence_threshold", "a model-wide persistence budget");
  z.stage3_max_live_parameters =
      s.integer("stage3_max_live_parameters", z.stage3_max_live_parameters, nonneg);
  z.stage3_max_reuse_distance =
      s.integer("stage3_max_reuse_distance", z.stage3_max_reuse_distance, nonneg);
  z.stage3_gather_16bit_weights_on_model_save =
      s.boolean("stage3_gather_16bit_weights_on_model_save", false);
  z.stage3_module_granularity_threshold =
      s.integer("stage3_module_granularity_threshold", 0, nonneg);
  s.todo("stage3_module_granularity_threshold", "module-granularity prefetch grouping");
  z.stage3_use_all_reduce_for_fetch_params =
      s.boolean("stage3_use_all_reduce_for_fetch_params", false);
  s.todo("stage3_use_all_reduce_for_fetch_params", "all-reduce based parameter fetching");
  z.ignore_unused_parameters = s.boolean("ignore_unused_parameters", true);
  z.legacy_stage1 = s.boolean("legacy_stage1", false);
  s.todo("legacy_stage1", "the legacy stage-1 implementation");
  z.round_robin_gradients = s.boolean("round_robin_gradients", false);
  s.todo("round_robin_gradients", "round-robin gradient partitioning");
  z.zero_hpz_partition_size = s.integer("zero_hpz_partition_size", 1, nonneg);
  z.zero_quantized_weights = s.boolean("zero_quantized_weights", false);
  z.zero_quantized_nontrainable_weights = s.boolean("zero_quantized_nontrainable_weights", false);
  z.zero_quantized_gradients = s.boolean("zero_quantized_gradients", false);
  z.zeropp_loco_param = s.any("zeropp_loco_param", nullptr);
  // DeepSpeed 0.19 refuses the key (DeepSpeedConfigError); so does deepspeed.cpp.
  DS_CHECK(z.zeropp_loco_param.is_null(),
           "[config] zero_optimization.zeropp_loco_param in {}: LoCo-ZeRO++ has been removed from "
           "DeepSpeed (0.19 refuses the key, deepspeedai/DeepSpeed#8489) and deepspeed.cpp does "
           "not have it; remove the key to use ZeRO++ quantized gradients "
           "(zero_quantized_gradients) without LoCo error feedback",
           st.source);
  z.mics_shard_size = s.integer("mics_shard_size", -1, at_least(-1));
  z.mics_hierarchical_params_gather = s.boolean("mics_hierarchical_params_gather", false);
  z.memory_efficient_linear = s.boolean("memory_efficient_linear", true);
  s.todo("memory_efficient_linear", "a PyTorch-specific linear-layer hook");
  z.pipeline_loading_checkpoint = s.boolean("pipeline_loading_checkpoint", false);
  s.todo("pipeline_loading_checkpoint", "pipelined checkpoint loading");
  z.override_module_apply = s.boolean("override_module_apply", true);
  s.todo("override_module_apply", "a PyTorch-specific module.apply override");
  z.log_trace_cache_warnings = s.boolean("log_trace_cache_warnings", false);
  s.todo("log_trace_cache_warnings", "PyTorch trace-cache warnings");
  // Muon's momentum stays in RAM here in every run (NVMe offload of the optimizer state needs
  // Adam or AdamW), which is what true asks for: accepted, nothing to do either way.
  z.save_muon_momentum_buffer_in_memory = s.boolean("save_muon_momentum_buffer_in_memory", false);
  // Names that normalisation already mapped; offered in "did you mean" for typos of them.
  s.add_aliases({"cpu_offload", "cpu_offload_param", "cpu_offload_use_pin_memory",
                 "stage3_gather_fp16_weights_on_model_save", "prefetch_bucket_size",
                 "param_persistence_threshold", "model_persistence_threshold",
                 "max_live_parameters", "max_reuse_distance", "gather_16bit_weights_on_model_save",
                 "module_granularity_threshold", "use_all_reduce_for_fetch_params"});
  s.finish();
}

void read_aio(Section s, AioConfig& a) {
  a.block_size = s.integer("block_size", a.block_size, at_least(1));
  a.queue_depth = s.integer("queue_depth", a.queue_depth, at_least(1));
  a.intra_op_parallelism = s.integer("intra_op_parallelism", a.intra_op_parallelism, at_least(1));
  a.single_submit = s.boolean("single_submit", a.single_submit);
  a.overlap_events = s.boolean("overlap_events", a.overlap_events);
  a.use_gds = s.boolean("use_gds", false);
  a.use_direct_io = s.boolean("use_direct_io", a.use_direct_io);  // our own key (offload.md)
  DS_CHECK(!a.use_gds,
           "[config] aio.use_gds = true: GPUDirect Storage needs a CUDA device and deepspeed.cpp "
           "has no GPU backend yet; remove the key or set it to false");
  s.add_aliases({"thread_count"});
  s.finish();
}

void read_activation_checkpointing(Section s, ActivationCheckpointingConfig& a) {
  a.partition_activations = s.boolean("partition_activations", false);
  a.cpu_checkpointing = s.boolean("cpu_checkpointing", false);
  a.contiguous_memory_optimization = s.boolean("contiguous_memory_optimization", false);
  a.number_checkpoints = s.opt_integer("number_checkpoints", at_least(1));
  // As DeepSpeed's checkpointing.configure() asserts.
  DS_CHECK(!a.contiguous_memory_optimization || a.partition_activations,
           "[config] {} = true needs {} = true (DeepSpeed: contiguous checkpointing is only "
           "available with partitioned activations)",
           s.key_path("contiguous_memory_optimization"), s.key_path("partition_activations"));
  DS_CHECK(!a.contiguous_memory_optimization || a.number_checkpoints.has_value(),
           "[config] {} = true needs {}: the number of checkpointed layers (the slots of the "
           "contiguous buffer)",
           s.key_path("contiguous_memory_optimization"), s.key_path("number_checkpoints"));
  a.synchronize_checkpoint_boundary = s.boolean("synchronize_checkpoint_boundary", false);
  a.profile = s.boolean("profile", false);
  s.finish();
}

void read_checkpoint(Section s, CheckpointConfig& c) {
  auto mode = s.choice("tag_validation", "Warn", {"Warn", "Ignore", "Fail"}, /*ci=*/true);
  c.tag_validation = mode == "Fail"     ? TagValidation::Fail
                     : mode == "Ignore" ? TagValidation::Ignore
                                        : TagValidation::Warn;
  c.load_universal = s.boolean("load_universal", false);
  c.use_node_local_storage = s.boolean("use_node_local_storage", false);
  s.todo("use_node_local_storage", "node-local checkpoint storage");
  Section pw = s.child("parallel_write");
  c.parallel_write_pipeline_stage = pw.boolean("pipeline_stage", false);
  pw.todo("pipeline_stage", "pipeline-parallel checkpoint writing");
  pw.finish();
  s.finish();
}

// DeepSpeed's TPTrainingConfig (deepspeed/runtime/tensor_parallel/config.py): autotp_size is the
// degree; the rest belongs to its automatic module rewriting (here the model is built
// tensor-parallel, see docs/parallelism.md) and is accepted with a warning when set.
void read_tensor_parallel(Section s, TensorParallelConfig& c, ParseState& st) {
  const int64_t size = s.integer("autotp_size", 0, {0, 1 << 16});
  c.size = size <= 1 ? 1 : static_cast<int>(size);
  Section tp = s.child("tp");
  const int64_t tp_size = tp.integer("tp_size", 1, {1, 1 << 16});
  DS_CHECK(tp_size == 1 || tp_size == c.size,
           "[config] {}: tensor_parallel.tp.tp_size = {} must be 1 or equal to "
           "tensor_parallel.autotp_size ({})",
           st.source, tp_size, size);
  tp.todo("tp_grain_size", "AutoTP's grain size (the cut follows heads and the MLP width here)");
  tp.todo("mpu", "an external model-parallel unit (the topology comes from the job's ranks here)");
  tp.todo("tp_group", "an external tensor-parallel group (the topology comes from the job's ranks)");
  tp.finish();
  s.todo("dtype", "AutoTP's dtype (the training dtype is the config's fp16/bf16)");
  s.todo("tp_overlap_comm", "overlapping tensor-parallel all-reduces with compute");
  s.todo("preset_model", "AutoTP's preset module rewriting");
  s.todo("partition_config", "AutoTP's per-layer partition specs");
  s.todo("keep_module_on_host", "AutoTP's host-resident modules");
  s.todo("injection_policy_tuple", "AutoTP's injection policies");
  s.finish();
}

// DeepSpeed 0.19's AutoEP section (parse_autoep_config's keys and defaults).
void read_expert_parallel(Section s, ExpertParallelConfig& c, const TrainerArgs& a,
                          ParseState& st) {
  c.enabled = s.boolean("enabled", false);
  const int64_t size = s.integer("autoep_size", 1, {1, 1 << 16});
  const auto preset = s.opt_string("preset_model");
  if (preset) {
    static const std::vector<std::string> kOurs = {"mixtral", "qwen2_moe", "qwen3_moe"};
    static const std::vector<std::string> kTheirs = {"qwen3_5_moe", "deepseek_v2", "deepseek_v3",
                                                     "minimax_m3"};
    DS_CHECK(std::find(kOurs.begin(), kOurs.end(), *preset) != kOurs.end(),
             "[config] {}: expert_parallel.preset_model '{}' {}; the MoE families here are "
             "mixtral, qwen2_moe and qwen3_moe (docs/models.md)",
             st.source, *preset,
             std::find(kTheirs.begin(), kTheirs.end(), *preset) != kTheirs.end()
                 ? "is a DeepSpeed preset for a model family deepspeed.cpp does not have"
                 : "is not an AutoEP preset");
    c.preset_model = *preset;
  }
  const int64_t etp = s.integer("expert_tensor_parallel_size", 1, {1, 1 << 16});
  DS_CHECK(etp == 1,
           "[config] {}: expert_parallel.expert_tensor_parallel_size = {}: cutting each expert "
           "over tensor-parallel ranks is not implemented; set it to 1",
           st.source, etp);
  if (const json* v = s.raw_value("load_balance_coeff"); v && !v->is_null())
    DS_THROW("[config] {}: expert_parallel.load_balance_coeff = {}: auxiliary-loss-free load "
             "balancing is not supported (DeepSpeed's AutoEP refuses it too); set it to null or "
             "remove the key (the router's aux loss is the model config's router_aux_loss_coef)",
             st.source, v->dump());
  s.declare("load_balance_coeff");
  s.boolean("use_grouped_mm", true);
  s.todo("use_grouped_mm", "an ungrouped expert GEMM (the experts' GEMMs are always grouped)");
  s.choice("comm_backend", "comm", {"comm", "deepep"});
  s.todo("comm_backend", "DeepEP's dispatch (tokens travel by MPI all-to-all here)");
  for (const char* k : {"validate_folding_routing", "async_split_plan", "disable_triton_grouped_mm"})
    s.todo(k, "an AutoEP option for PyTorch's CUDA kernels");
  for (const char* k : {"combine_impl", "row_weighting_impl", "gate_up_impl", "comm_num_sm",
                        "comm_qp_margin", "comm_max_tokens_per_rank"})
    s.todo(k, "an AutoEP kernel choice (the combine is a weighted sum in token order here)");
  for (const char* k : {"moe_layer_pattern", "expert_pattern", "router_pattern", "expert_w1",
                        "expert_w2", "expert_w3", "num_experts_attr", "top_k_attr",
                        "has_shared_experts", "shared_experts_pattern",
                        "shared_experts_gate_pattern", "expert_activation", "route_norm",
                        "route_scale", "score_apply", "score_func", "top_k",
                        "routed_scaling_factor", "num_expert_groups", "num_limited_groups"})
    s.todo(k, "describing a PyTorch model's MoE layers to AutoEP (the model family's own file "
              "describes them here, and its config.json sets the routing)");
  s.finish();
  c.size = c.enabled ? static_cast<int>(size) : 1;
  if (!c.enabled && size > 1)
    st.warn(fmt::format("[config] expert_parallel.autoep_size = {} has no effect while "
                        "expert_parallel.enabled is false",
                        size));
  if (a.expert_parallel_size) {
    const int ep = *a.expert_parallel_size;
    DS_CHECK(ep >= 1, "[config] the trainer's expert_parallel_size must be >= 1, got {}", ep);
    DS_CHECK(c.size <= 1 || c.size == ep,
             "[config] the trainer's expert_parallel_size {} disagrees with "
             "expert_parallel.autoep_size {} in {}; give one, or the same number",
             ep, c.size, st.source);
    if (ep > 1 && c.size != ep) {
      c.enabled = true;
      c.size = ep;
      st.update("expert_parallel.autoep_size", ep, Origin::Auto, "trainer expert_parallel_size");
    }
  }
}

// DeepSpeed's get_pipeline_config defaults: stages "auto", partition "best", seed_layers false,
// activation_checkpoint_interval 0, pipe/grad_partitioned true. DeepSpeed ignores stages and
// partition (PipelineModule arguments decide); here they are used, and "best" (its unused
// default) means our default, "parameters".
void read_pipeline(Section s, PipelineConfig& c, ParseState& st) {
  if (const json* v = s.raw_value("stages"); v && v->is_string()) {
    DS_CHECK(v->get<std::string>() == "auto",
             "[config] {}: pipeline.stages must be a number of stages or \"auto\", got \"{}\"",
             st.source, v->get<std::string>());
    // Section::string refuses an unresolved "auto"; here "auto" is a value (DeepSpeed's
    // default), not a placeholder for the trainer to fill.
    s.declare("stages");
    st.record(s.key_path("stages"), "auto", Origin::File);
    c.stages = 0;
  } else {
    c.stages = static_cast<int>(s.integer("stages", 0, {0, 1 << 16}));
  }
  std::string part = s.string("partition", "best");
  c.partition = part == "best" ? "parameters" : part;
  const std::string lower = [&] {
    std::string l = c.partition;
    for (auto& ch : l) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return l;
  }();
  DS_CHECK(lower == "parameters" || lower == "uniform" || lower.rfind("type:", 0) == 0,
           "[config] {}: pipeline.partition = \"{}\" is not a partition method; use "
           "\"parameters\", \"uniform\" or \"type:<regex>\" (e.g. \"type:transformer\")",
           st.source, part);
  c.activation_checkpoint_interval =
      static_cast<int>(s.integer("activation_checkpoint_interval", 0, {0, 1 << 20}));
  c.pipe_partitioned = s.boolean("pipe_partitioned", true);
  c.grad_partitioned = s.boolean("grad_partitioned", true);
  s.boolean("seed_layers", false);
  s.todo("seed_layers", "per-layer seeds (initialisation here is a pure function of the seed and "
                        "the parameter, the same at any pipeline size)");
  s.boolean("use_reentrant", true);
  s.finish();
}

void read_file_monitor(Section s, FileMonitorConfig& m) {
  m.enabled = s.boolean("enabled", false);
  m.output_path = s.string("output_path", "");
  m.job_name = s.string("job_name", "DeepSpeedJobName");
  // The job name becomes a folder under output_path: "../x" or "a/b" would write elsewhere.
  const std::string& j = m.job_name;
  if (j.empty() || j == "." || j == ".." || j.find_first_of("/\\") != std::string::npos ||
      j.find('\0') != std::string::npos)
    DS_THROW(
        "[config] {} = \"{}\" is not allowed: the job name becomes a folder under output_path, so "
        "it must be a plain name without '/' or '\\' (and not \".\" or \"..\"); put folders in "
        "output_path instead",
        s.key_path("job_name"), j);
  s.finish();
}

// DeepSpeed raises at start-up when wandb or comet_ml cannot be imported (check_wandb_availability,
// check_comet_availability); here neither can ever be, so "enabled": true stops the parse, on every
// rank alike, instead of a warning that scrolls by while the run logs nowhere the user looks.
void refuse_unavailable_monitor(Section& s, bool enabled, std::string_view section) {
  if (enabled)
    DS_THROW("[config] {0} = true: {1}; then set {0} to false", s.key_path("enabled"),
             unavailable_monitor_message(section));
}

}  // namespace

std::string unavailable_monitor_message(std::string_view section) {
  if (section == "wandb")
    return "Weights & Biases logging is not available in deepspeed.cpp: W&B has no C++ client, "
           "and its offline run files (wandb/offline-run-*/run-*.wandb) are an internal format "
           "of the wandb Python package. Log to TensorBoard instead (config \"tensorboard\": "
           "{\"enabled\": true}, or ds_train --report_to tensorboard) and upload the event "
           "files with `wandb sync --sync-tensorboard <output_path>/<job_name>`, or to CSV files "
           "(\"csv_monitor\")";
  return "Comet logging is not available in deepspeed.cpp: Comet has no C++ client, and its "
         "offline experiment archives are an internal format of the comet_ml Python package. Log "
         "to TensorBoard instead (config \"tensorboard\": {\"enabled\": true}, or ds_train "
         "--report_to tensorboard) or to CSV files (\"csv_monitor\")";
}

namespace {

void read_wandb(Section s, WandbConfig& w) {
  w.enabled = s.boolean("enabled", false);
  refuse_unavailable_monitor(s, w.enabled, "wandb");
  w.group = s.opt_string("group");
  w.team = s.opt_string("team");
  w.project = s.string("project", "deepspeed");
  s.finish();
}

void read_comet(Section s, CometConfig& c) {
  c.enabled = s.boolean("enabled", false);
  refuse_unavailable_monitor(s, c.enabled, "comet");
  c.samples_log_interval = s.integer("samples_log_interval", 100, at_least(1));
  c.project = s.opt_string("project");
  c.workspace = s.opt_string("workspace");
  c.api_key = s.opt_string("api_key");
  c.experiment_name = s.opt_string("experiment_name");
  c.experiment_key = s.opt_string("experiment_key");
  c.online = s.opt_boolean("online");
  c.mode = s.opt_string("mode");
  s.finish();
}

void read_flops_profiler(Section s, FlopsProfilerConfig& f) {
  f.enabled = s.boolean("enabled", false);
  f.recompute_fwd_factor = s.number("recompute_fwd_factor", 0.0, at_least(0));
  f.profile_step = s.integer("profile_step", 1, at_least(1));
  f.module_depth = s.integer("module_depth", -1, at_least(-1));
  f.top_modules = s.integer("top_modules", 1, at_least(0));
  f.detailed = s.boolean("detailed", true);
  f.output_file = s.opt_string("output_file");
  s.finish();
}

void read_comms_logger(Section s, CommsLoggerConfig& c) {
  c.enabled = s.boolean("enabled", false);
  c.verbose = s.boolean("verbose", false);
  c.prof_all = s.boolean("prof_all", true);
  c.prof_ops = s.string_list("prof_ops");
  c.debug = s.boolean("debug", false);
  s.finish();
}

// DeepSpeed sections this project does not model key by key: accepted verbatim, with a warning
// when the section would do something (present, non-empty and not "enabled": false).
struct OpaqueSection {
  const char* key;
  const char* what;
};
constexpr OpaqueSection kOpaqueSections[] = {
    {"autotuning", "the autotuner"},
    {"data_efficiency", "data efficiency (curriculum learning, random-LTD)"},
    {"weight_quantization", "weight quantization"},
    {"compile", "torch.compile integration"},
    {"timers", "DeepSpeed's throughput timers"},
    {"hybrid_engine", "the RLHF hybrid engine"},
};

// Top-level keys DeepSpeed 0.19 removed and refuses when present, whatever their value
// (runtime/config.py's _REMOVED_TOP_LEVEL_CONFIG_KEYS, deepspeedai/DeepSpeed#8489): refused here
// too, with DeepSpeed's advice.
constexpr OpaqueSection kRemovedSections[] = {
    {"nebula", "Nebula checkpointing"},
    {"compression_training", "the compression library"},
    {"amp", "NVIDIA Apex AMP integration (use \"fp16\" or \"bf16\")"},
    {"quantize_training", "Mixture-of-Quantization (MoQ)"},
    {"sparse_gradients", "sparse compression of dense embedding gradients"},
    {"eigenvalue", "eigenvalue-based MoQ"},
    {"sparse_attention", "Sparse Attention"},
    {"elasticity", "elastic training (set the batch sizes directly)"},
    {"graph_harvesting", "graph harvesting"},
    {"curriculum_learning",
     "the legacy top-level curriculum_learning (DeepSpeed's replacement is "
     "data_efficiency.data_sampling.curriculum_learning)"},
    {"progressive_layer_drop", "Progressive Layer Dropping"},
};

bool section_active(const json& v) {
  if (v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (!v.is_object()) return true;
  if (v.empty()) return false;
  auto e = v.find("enabled");
  return !(e != v.end() && e->is_boolean() && !e->get<bool>());
}

void report_unknown(const ParseState& st) {
  if (st.unknown.empty()) return;
  std::vector<std::pair<std::string, std::string>> lines;  // (path, hint)
  for (const auto& u : st.unknown) {
    const std::string path = u.section.empty() ? u.key : u.section + "." + u.key;
    std::vector<std::string> candidates = u.candidates;
    candidates.insert(candidates.end(), u.aliases.begin(), u.aliases.end());
    std::string hint;
    if (auto near = detail::nearest_key(u.key, candidates)) {
      hint = fmt::format("did you mean '{}'?", u.section.empty() ? *near : u.section + "." + *near);
    } else {
      // A valid key in the wrong section ("hysteresis" at the top level) is a common slip.
      for (const auto& e : st.effective) {
        auto dot = e.path.rfind('.');
        std::string leaf = dot == std::string::npos ? e.path : e.path.substr(dot + 1);
        if (leaf == u.key && e.path != path) {
          hint = fmt::format("did you mean '{}'? ('{}' belongs there)", e.path, u.key);
          break;
        }
      }
      if (hint.empty()) {
        std::vector<std::string> valid = u.candidates;
        std::sort(valid.begin(), valid.end());
        hint = fmt::format("valid keys {} are {}",
                           u.section.empty() ? "at the top level" : "in " + u.section,
                           fmt::join(valid, ", "));
      }
    }
    lines.emplace_back(path, hint);
  }
  if (lines.size() == 1)
    DS_THROW("[config] unknown key '{}' in {}: {}", lines[0].first, st.source, lines[0].second);
  std::string all;
  for (const auto& [path, hint] : lines) all += fmt::format("\n  unknown key '{}': {}", path, hint);
  DS_THROW("[config] {} unknown keys in {}:{}", lines.size(), st.source, all);
}

// §2: derive the missing batch values, then check positivity and the invariant.
void derive_batch(std::optional<int64_t> tb, std::optional<int64_t> mb, std::optional<int64_t> gas,
                  int n, BatchConfig& b, ParseState& st) {
  std::vector<std::string> given;
  if (tb) given.push_back(fmt::format("train_batch_size={}", *tb));
  if (mb) given.push_back(fmt::format("train_micro_batch_size_per_gpu={}", *mb));
  if (gas) given.push_back(fmt::format("gradient_accumulation_steps={}", *gas));
  std::string given_text = given.empty() ? "none" : fmt::format("{}", fmt::join(given, ", "));
  if (!st.auto_dropped.empty())
    given_text +=
        fmt::format("; \"auto\" with no trainer value: {}", fmt::join(st.auto_dropped, ", "));

  std::vector<std::string> derived;
  auto derive = [&](const char* key, int64_t v, std::string how) {
    derived.push_back(fmt::format("{}={} ({})", key, v, how));
    st.update(key, v, Origin::Derived, how);
  };
  if (tb && mb && gas) {
  } else if (tb && mb) {
    gas = *tb / *mb / n;
    derive("gradient_accumulation_steps", *gas, fmt::format("= {} // {} // {} ranks", *tb, *mb, n));
  } else if (tb && gas) {
    mb = *tb / n / *gas;
    derive("train_micro_batch_size_per_gpu", *mb,
           fmt::format("= {} // {} ranks // {}", *tb, n, *gas));
  } else if (mb && gas) {
    tb = *mb * *gas * n;
    derive("train_batch_size", *tb, fmt::format("= {} * {} * {} ranks", *mb, *gas, n));
  } else if (tb) {
    gas = 1;
    derive("gradient_accumulation_steps", 1, "= 1 when only train_batch_size is given");
    mb = *tb / n;
    derive("train_micro_batch_size_per_gpu", *mb, fmt::format("= {} // {} ranks", *tb, n));
  } else if (mb) {
    gas = 1;
    derive("gradient_accumulation_steps", 1,
           "= 1 when only train_micro_batch_size_per_gpu is given");
    tb = *mb * n;
    derive("train_batch_size", *tb, fmt::format("= {} * {} ranks", *mb, n));
  } else {
    DS_THROW(
        "[config] Either train_batch_size or train_micro_batch_size_per_gpu needs to be "
        "provided (in {}; given: {}; world size {})",
        st.source, given_text, n);
  }
  const std::string context =
      fmt::format("given: {}{}; world size N={} data-parallel ranks", given_text,
                  derived.empty() ? "" : fmt::format("; derived: {}", fmt::join(derived, ", ")), n);
  DS_CHECK(*tb > 0, "[config] Train batch size: {} has to be greater than 0 ({}; {})", *tb,
           st.source, context);
  DS_CHECK(*mb > 0, "[config] Micro batch size per gpu: {} has to be greater than 0 ({}; {})", *mb,
           st.source, context);
  DS_CHECK(*gas > 0, "[config] Gradient accumulation steps: {} has to be greater than 0 ({}; {})",
           *gas, st.source, context);
  DS_CHECK(*tb == *mb * *gas * n,
           "[config] Check batch related parameters. train_batch_size is not equal to "
           "micro_batch_per_gpu * gradient_acc_step * world_size {} != {} * {} * {} ({}; {})",
           *tb, *mb, *gas, n, st.source, context);
  b.train_batch_size = *tb;
  b.train_micro_batch_size_per_gpu = *mb;
  b.gradient_accumulation_steps = *gas;
  b.world_size = n;
}

// ZeRO++'s weight keys act on stage 3's parameter gathers (docs/zero.md, "ZeRO++").
void warn_zeropp(const ZeroConfig& z, ParseState& st) {
  for (auto [key, on] : {std::pair<const char*, bool>{"zero_quantized_weights", z.zero_quantized_weights},
                         {"zero_hpz_partition_size", z.zero_hpz_partition_size > 1},
                         {"zero_quantized_gradients", z.zero_quantized_gradients}})
    if (on && z.stage != 3)
      st.warn(fmt::format("[config] zero_optimization.{} has no effect below stage 3 (stage is "
                          "{}): it changes how stage 3 gathers parameters and reduces gradients",
                          key, z.stage));
  if (z.mics_shard_size > 0 && z.stage != 3)
    st.warn(fmt::format("[config] zero_optimization.mics_shard_size has no effect below stage 3 "
                        "(stage is {}): MiCS partitions stage 3's parameters",
                        z.stage));
  if (z.mics_hierarchical_params_gather)
    st.warn("[config] zero_optimization.mics_hierarchical_params_gather = true changes nothing: "
            "it splits a shard group's parameter gather into an intra-node and an inter-node "
            "step, and deepspeed.cpp's gathers within a node already run as one shared-memory "
            "collective (docs/communication.md); across nodes MPI's all-gather chooses its own "
            "algorithm");
  if (z.zero_quantized_nontrainable_weights)
    st.warn("[config] zero_optimization.zero_quantized_nontrainable_weights = true changes "
            "nothing: deepspeed.cpp does not partition frozen parameters (LoRA's base weights "
            "stay whole on every rank, outside the gathers), so there is nothing to gather "
            "quantized");
}

// The 1-bit optimizers average their momentum over every rank's whole copy: ZeRO stage 0 only
// (DeepSpeed's engine asserts "1bit-Adam is not compatible with ZeRO", even with
// zero_allow_untested_optimizer).
void check_one_bit_zero(OptimizerType t, int stage, const ParseState& st) {
  const char* ds_name = t == OptimizerType::OneBitAdam    ? "1bit-Adam"
                        : t == OptimizerType::ZeroOneAdam ? "0/1 Adam"
                        : t == OptimizerType::OneBitLamb  ? "1bit-Lamb"
                                                          : nullptr;
  if (ds_name && stage > 0)
    DS_THROW(
        "[config] optimizer.type = \"{}\" needs zero_optimization.stage 0, got stage {} in {}: "
        "the 1-bit optimizers compress the momentum of the whole model on every rank (DeepSpeed: "
        "\"{} is not compatible with ZeRO\"); set zero_optimization.stage to 0, or use Adam with "
        "ZeRO",
        optimizer_type_name(t), stage, st.source, ds_name);
}

void cross_checks(DeepSpeedConfig& cfg, ParseState& st) {
  DS_CHECK(!(cfg.fp16.enabled && cfg.bf16.enabled),
           "[config] fp16.enabled and bf16.enabled are both true in {}: bfloat16 and fp16 modes "
           "cannot be simultaneously enabled; keep one",
           st.source);

  if (cfg.fp16.enabled && cfg.fp16.dynamic() &&
      cfg.fp16.min_loss_scale > std::ldexp(1.0, cfg.fp16.initial_scale_power))
    DS_THROW(
        "[config] fp16.min_loss_scale = {} is larger than the initial scale 2^{} in {}: lower "
        "min_loss_scale or raise initial_scale_power",
        cfg.fp16.min_loss_scale, cfg.fp16.initial_scale_power, st.source);

  auto& z = cfg.zero_optimization;
  const auto t = cfg.optimizer.type;
  check_one_bit_zero(t, z.stage, st);
  if (z.stage > 0 && t != OptimizerType::None && t != OptimizerType::Adam &&
      t != OptimizerType::AdamW && t != OptimizerType::Adagrad && t != OptimizerType::Lion &&
      t != OptimizerType::Muon && t != OptimizerType::MuAdam && t != OptimizerType::MuAdamW &&
      !cfg.zero_allow_untested_optimizer)
    DS_THROW(
        "[config] optimizer {} is not supported with ZeRO (stage {}) in {}: ZeRO supports "
        "Adam, AdamW, Adagrad, Lion, Muon, MuAdam and MuAdamW (as in DeepSpeed); set \"zero_allow_untested_optimizer\": "
        "true to run it anyway{}",
        optimizer_type_name(t), z.stage, st.source,
        t == OptimizerType::Lamb
            ? " (deepspeed.cpp then runs Lamb exactly: its per-tensor norms are "
              "summed across ranks)"
        : t == OptimizerType::SGD ? " (SGD is elementwise: it runs exactly on the partitions)"
                                  : "");

  // DeepSpeed allows ratio < 1 only at stage 3; the NVMe store here is the same at every stage.
  if (z.offload_optimizer.ratio < 1.0 && z.offload_optimizer.device != OffloadDevice::NVMe)
    st.warn(fmt::format(
        "[config] zero_optimization.offload_optimizer.ratio = {} has no effect unless device is "
        "\"nvme\" (it is \"{}\")",
        z.offload_optimizer.ratio, offload_device_name(z.offload_optimizer.device)));
  for (auto [name, on] :
       {std::pair{"offload_optimizer", z.offload_optimizer.device == OffloadDevice::NVMe},
        std::pair{"offload_param", z.offload_param.device == OffloadDevice::NVMe && z.stage == 3}})
    if (on && t != OptimizerType::Adam && t != OptimizerType::AdamW && t != OptimizerType::None)
      DS_THROW(
          "[config] zero_optimization.{}.device = \"nvme\" needs the Adam or AdamW optimizer in "
          "{} (the state is stepped one sub-group at a time; {} is not elementwise or keeps "
          "per-run state); use AdamW, or {}.device = \"none\"",
          name, st.source, optimizer_type_name(t), name);
  for (auto [name, dev, path] :
       {std::tuple{"offload_optimizer", z.offload_optimizer.device, &z.offload_optimizer.nvme_path},
        std::tuple{"offload_param", z.offload_param.device, &z.offload_param.nvme_path}}) {
    if (dev == OffloadDevice::CPU) {
      // The optimizer state is in host memory in every run (a GPU model trains ZeRO-Offload's
      // way); parameters stay with the model. The user asked for something: say what it does.
      st.warn(std::string_view(name) == "offload_param"
                  ? std::string("[config] zero_optimization.offload_param.device = \"cpu\": "
                                "parameter offload to host memory is not implemented; parameters "
                                "stay with the model (host memory for a model on the CPU, GPU "
                                "memory for one on a GPU); the key is accepted and ignored")
                  : std::string("[config] zero_optimization.offload_optimizer.device = \"cpu\": "
                                "the optimizer state is in host memory already: deepspeed.cpp "
                                "keeps it there in every run (a model on a GPU trains "
                                "ZeRO-Offload's way, docs/cuda.md), so the key changes nothing"));
      continue;
    }
    if (dev != OffloadDevice::NVMe) continue;
    DS_CHECK(!path->empty(),
             "[config] zero_optimization.{}.nvme_path is required when device is \"nvme\" in {}",
             name, st.source);
    const int64_t buffers = std::string_view(name) == "offload_param"
                                ? z.offload_param.buffer_count
                                : z.offload_optimizer.buffer_count;
    DS_CHECK(buffers >= 1,
             "[config] zero_optimization.{}.buffer_count = {} in {}: NVMe offload streams through "
             "at least one swap buffer (4 or more overlap reading, stepping and writing)",
             name, buffers, st.source);
    const bool pinned = std::string_view(name) == "offload_param" ? z.offload_param.pin_memory
                                                                   : z.offload_optimizer.pin_memory;
    if (pinned)
      st.warn(fmt::format(
          "[config] zero_optimization.{}.pin_memory = true has no effect with NVMe offload: the "
          "swap buffers are aligned host memory either way, and page-locked memory only speeds up "
          "copies to a GPU (a GPU model's offload copies are always page-locked)",
          name));
  }
  if (z.offload_optimizer.device == OffloadDevice::CPU && z.stage == 0)
    st.warn("[config] zero_optimization.offload_optimizer has no effect at stage 0");
  if (z.offload_param.device != OffloadDevice::None && z.stage != 3)
    st.warn(
        fmt::format("[config] zero_optimization.offload_param has no effect below stage 3 "
                    "(stage is {})",
                    z.stage));
  warn_zeropp(z, st);
}

}  // namespace

std::string_view optimizer_type_name(OptimizerType t) {
  if (t == OptimizerType::None) return "none";
  for (auto& o : kOptimizers)
    if (o.type == t) return o.name;
  return "?";
}

std::string_view scheduler_type_name(SchedulerType t) {
  if (t == SchedulerType::None) return "none";
  for (auto& s : kSchedulers)
    if (s.type == t) return s.name;
  return "?";
}

std::string_view offload_device_name(OffloadDevice d) {
  return d == OffloadDevice::CPU ? "cpu" : d == OffloadDevice::NVMe ? "nvme" : "none";
}

const ConfigValue* DeepSpeedConfig::find(std::string_view path) const {
  for (const auto& e : effective)
    if (e.path == path) return &e;
  return nullptr;
}

namespace {

// The trainer's model-parallel sizes (TrainerArgs) into the typed sections: they decide where the
// file leaves the size open and must agree where it does not.
void apply_parallel_sizes(const TrainerArgs& a, DeepSpeedConfig& cfg, ParseState& st) {
  if (a.tensor_parallel_size) {
    const int tp = *a.tensor_parallel_size;
    DS_CHECK(tp >= 1, "[config] the trainer's tensor_parallel_size must be >= 1, got {}", tp);
    DS_CHECK(cfg.tensor_parallel.size <= 1 || cfg.tensor_parallel.size == tp,
             "[config] the trainer's tensor_parallel_size {} disagrees with "
             "tensor_parallel.autotp_size {} in {}; give one, or the same number",
             tp, cfg.tensor_parallel.size, st.source);
    if (cfg.tensor_parallel.size != tp) {
      cfg.tensor_parallel.size = tp;
      st.update("tensor_parallel.autotp_size", tp, Origin::Auto, "trainer tensor_parallel_size");
    }
  }
  if (a.pipeline_parallel_size) {
    const int pp = *a.pipeline_parallel_size;
    DS_CHECK(pp >= 1, "[config] the trainer's pipeline_parallel_size must be >= 1, got {}", pp);
    DS_CHECK(cfg.pipeline.stages <= 0 || cfg.pipeline.stages == pp,
             "[config] the trainer's pipeline_parallel_size {} disagrees with pipeline.stages {} "
             "in {}; give one, or the same number",
             pp, cfg.pipeline.stages, st.source);
    if (cfg.pipeline.stages != pp) {
      cfg.pipeline.stages = pp;
      st.update("pipeline.stages", pp, Origin::Auto, "trainer pipeline_parallel_size");
    }
  }
}

}  // namespace

ParallelSizes read_parallel_sizes(const nlohmann::json& input, const std::string& source_name) {
  ParseState st;
  st.source = source_name.empty() ? "<json>" : source_name;
  DS_CHECK(input.is_object(), "[config] {}: a DeepSpeed config must be a JSON object, got {}",
           st.source, detail::json_kind(input));
  ParallelSizes out;
  Section top(st, &input, "");
  read_tensor_parallel(top.child("tensor_parallel"), out.tensor_parallel, st);
  read_pipeline(top.child("pipeline"), out.pipeline, st);
  return out;
}

BatchConfig resolve_batch_sizes(const nlohmann::json& input, const ConfigContext& ctx) {
  ParseState st;
  st.source = ctx.source_name.empty() ? "<json>" : ctx.source_name;
  DS_CHECK(input.is_object(), "[config] {}: a DeepSpeed config must be a JSON object, got {}",
           st.source, detail::json_kind(input));
  DS_CHECK(ctx.world_size >= 1, "[config] world size must be >= 1, got {}", ctx.world_size);
  // Only the triad: the other keys' "auto" values and contradictions are parse_config_json's.
  json root = json::object();
  for (const char* k :
       {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"})
    if (input.contains(k)) root[k] = input[k];
  ConfigContext batch_only;
  batch_only.world_size = ctx.world_size;
  batch_only.args.per_device_train_batch_size = ctx.args.per_device_train_batch_size;
  batch_only.args.gradient_accumulation_steps = ctx.args.gradient_accumulation_steps;
  detail::resolve_auto(root, batch_only, st);
  Section top(st, &root, "");
  auto tb = top.opt_integer("train_batch_size", at_least(1));
  auto mb = top.opt_integer("train_micro_batch_size_per_gpu", at_least(1));
  auto gas = top.opt_integer("gradient_accumulation_steps", at_least(1));
  BatchConfig b;
  derive_batch(tb, mb, gas, ctx.world_size, b, st);
  return b;
}

DeepSpeedConfig parse_config_json(const nlohmann::json& input, const ConfigContext& ctx) {
  ParseState st;
  st.source = ctx.source_name.empty() ? "<json>" : ctx.source_name;
  DS_CHECK(input.is_object(), "[config] {}: a DeepSpeed config must be a JSON object, got {}",
           st.source, detail::json_kind(input));
  DS_CHECK(ctx.world_size >= 1, "[config] world size must be >= 1, got {}", ctx.world_size);
  json root = input;  // the rewrites below must not touch the caller's object

  detail::normalize_deprecated(root, st);
  detail::resolve_auto(root, ctx, st);

  DeepSpeedConfig cfg;
  cfg.source = st.source;
  Section top(st, &root, "");

  auto tb = top.opt_integer("train_batch_size", at_least(1));
  auto mb = top.opt_integer("train_micro_batch_size_per_gpu", at_least(1));
  auto gas = top.opt_integer("gradient_accumulation_steps", at_least(1));

  cfg.steps_per_print = top.integer("steps_per_print", 10, at_least(1));
  cfg.wall_clock_breakdown = top.boolean("wall_clock_breakdown", false);
  cfg.gradient_clipping = top.number("gradient_clipping", 0.0, at_least(0));
  cfg.prescale_gradients = top.boolean("prescale_gradients", false);
  cfg.gradient_predivide_factor = top.number("gradient_predivide_factor", 1.0, above(0));
  auto comm = top.opt_choice("communication_data_type", kDTypeNames);
  cfg.zero_allow_untested_optimizer = top.boolean("zero_allow_untested_optimizer", false);
  cfg.zero_force_ds_cpu_optimizer = top.boolean("zero_force_ds_cpu_optimizer", true);
  cfg.memory_breakdown = top.boolean("memory_breakdown", false);
  cfg.dump_state = top.boolean("dump_state", false);

  read_fp16(top.child("fp16"), cfg.fp16);
  read_bf16(top.child("bf16"), cfg.bf16);
  top.add_aliases({"bfloat16"});
  {
    Section dt = top.child("data_types");
    auto acc = dt.opt_choice("grad_accum_dtype", kDTypeNames);
    if (acc) cfg.data_types.grad_accum_dtype = dtype_of(*acc);
    dt.finish();
  }
  read_optimizer(top.child("optimizer"), cfg.optimizer, st);
  read_scheduler(top.child("scheduler"), cfg.scheduler, cfg.optimizer, st);
  read_zero(top.child("zero_optimization"), cfg.zero_optimization, st);
  read_aio(top.child("aio"), cfg.aio);
  read_activation_checkpointing(top.child("activation_checkpointing"),
                                cfg.activation_checkpointing);
  if (cfg.activation_checkpointing.number_checkpoints &&
      !cfg.activation_checkpointing.contiguous_memory_optimization)
    st.warn(fmt::format(
        "[config] activation_checkpointing.number_checkpoints = {} has no effect without "
        "contiguous_memory_optimization (it sizes the contiguous buffer; DeepSpeed ignores it too)",
        *cfg.activation_checkpointing.number_checkpoints));
  read_checkpoint(top.child("checkpoint"), cfg.checkpoint);
  read_tensor_parallel(top.child("tensor_parallel"), cfg.tensor_parallel, st);
  read_pipeline(top.child("pipeline"), cfg.pipeline, st);
  apply_parallel_sizes(ctx.args, cfg, st);
  read_expert_parallel(top.child("expert_parallel"), cfg.expert_parallel, ctx.args, st);
  read_file_monitor(top.child("tensorboard"), cfg.tensorboard);
  read_file_monitor(top.child("csv_monitor"), cfg.csv_monitor);
  read_wandb(top.child("wandb"), cfg.wandb);
  read_comet(top.child("comet"), cfg.comet);
  read_flops_profiler(top.child("flops_profiler"), cfg.flops_profiler);
  read_comms_logger(top.child("comms_logger"), cfg.comms_logger);

  // Top-level switches of DeepSpeed features this project does not implement.
  top.boolean("disable_allgather", false);
  top.todo("disable_allgather", "disabling the parameter all-gather");
  top.opt_integer("vocabulary_size", at_least(1));
  top.boolean("dataloader_drop_last", false);
  top.todo("dataloader_drop_last", "DeepSpeed's data loader");
  top.choice("seq_parallel_communication_data_type", "fp32", kDTypeNames);
  top.todo("seq_parallel_communication_data_type", "sequence parallelism");
  top.boolean("use_data_before_expert_parallelism", false);
  top.todo("use_data_before_expert_parallelism",
           "the data-before-expert rank order (expert-parallel groups are consecutive "
           "data-parallel ranks here)");
  top.declare("allgather_size");  // old form only; not a value of ours, so not in the report
  if (top.raw_value("allgather_size"))
    st.warn(
        "[config] allgather_size only applies to the old \"zero_optimization\": true form; "
        "use zero_optimization.allgather_bucket_size");
  for (const auto& o : kRemovedSections) {
    top.declare(o.key);
    DS_CHECK(!top.raw_value(o.key),
             "[config] {} in {}: DeepSpeed 0.19 removed {} and refuses the key "
             "(deepspeedai/DeepSpeed#8489); deepspeed.cpp does not have it either: remove the "
             "key",
             o.key, st.source, o.what);
  }
  for (const auto& o : kOpaqueSections) {
    top.declare(o.key);
    const json* v = top.raw_value(o.key);
    if (!v) continue;  // absent: nothing to report, the section is simply off
    st.record(o.key, *v, Origin::File, "accepted verbatim, not interpreted");
    if (section_active(*v))
      st.warn(
          fmt::format("[config] {}: {} is not implemented in deepspeed.cpp yet; the section "
                      "is accepted and ignored",
                      o.key, o.what));
  }
  top.finish();
  report_unknown(st);

  derive_batch(tb, mb, gas, ctx.world_size, cfg.batch, st);

  cfg.communication_data_type = comm ? dtype_of(*comm) : cfg.training_dtype();
  if (!comm)
    st.update("communication_data_type", dtype_label(cfg.communication_data_type), Origin::Derived,
              "the training dtype");
  cross_checks(cfg, st);

  cfg.warnings = std::move(st.warnings);
  cfg.effective = std::move(st.effective);
  return cfg;
}

DeepSpeedConfig parse_config(const std::string& path_or_json, const ConfigContext& ctx) {
  std::string source;
  json root = load_config_json(path_or_json, &source);
  ConfigContext c = ctx;
  if (source != "<json string>" || c.source_name.empty()) c.source_name = source;
  return parse_config_json(root, c);
}

std::string format_effective_config(const DeepSpeedConfig& cfg) {
  size_t path_w = 0, value_w = 0;
  std::vector<std::string> values;
  values.reserve(cfg.effective.size());
  for (const auto& e : cfg.effective) {
    values.push_back(detail::json_show(e.value));
    path_w = std::max(path_w, e.path.size());
    value_w = std::max(value_w, values.back().size());
  }
  path_w = std::min<size_t>(path_w, 60);
  value_w = std::min<size_t>(value_w, 24);
  std::string out =
      fmt::format("DeepSpeed config {} (world size {}):\n", cfg.source, cfg.batch.world_size);
  out += fmt::format("  {:<{}}  {:<{}}  {}\n", "key", path_w, "value", value_w, "origin");
  for (size_t i = 0; i < cfg.effective.size(); ++i) {
    const auto& e = cfg.effective[i];
    out += fmt::format("  {:<{}}  {:<{}}  {}{}\n", e.path, path_w, values[i], value_w,
                       origin_name(e.origin), e.note.empty() ? "" : " (" + e.note + ")");
  }
  return out;
}

void print_config_warnings(const DeepSpeedConfig& cfg, std::FILE* out) {
  for (const auto& w : cfg.warnings) std::fprintf(out, "%s\n", w.c_str());
}

}  // namespace ds::config

#include "ds/runtime/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include <fmt/ranges.h>

#include "ds/autograd/engine.h"
#include "ds/autograd/grad_mode.h"
#include "ds/comm/logger.h"
#include "ds/core/allocator.h"
#include "ds/core/device_registry.h"
#include "ds/core/error.h"
#include "ds/core/rng.h"
#include "ds/nn/expert_parallel.h"
#include "ds/nn/pipeline_stage.h"
#include "ds/nn/tensor_parallel.h"
#include "ds/ops/ops.h"
#include "ds/optim/muon.h"
#include "ds/optim/mup.h"
#include "ds/optim/onebit.h"
#include "ds/zero/muon_plan.h"

namespace ds::runtime {
namespace {

optim::OptimizerParams optimizer_params(const config::OptimizerConfig& o) {
  optim::OptimizerParams p;
  p.lr = static_cast<float>(o.lr);
  p.beta1 = static_cast<float>(o.betas[0]);
  p.beta2 = static_cast<float>(o.betas[1]);
  p.eps = static_cast<float>(o.eps);
  p.weight_decay = static_cast<float>(o.weight_decay);
  p.bias_correction = o.bias_correction;
  p.adam_w_mode = o.adam_w_mode;
  p.max_coeff = static_cast<float>(o.max_coeff);
  p.min_coeff = static_cast<float>(o.min_coeff);
  p.momentum = static_cast<float>(o.momentum);
  p.dampening = static_cast<float>(o.dampening);
  p.nesterov = o.nesterov;
  p.muon_lr = static_cast<float>(o.muon_lr);  // Muon's keys (config.h)
  p.adam_lr = static_cast<float>(o.adam_lr);
  p.lr_given = o.lr_given;
  p.ns_method = o.ns_method;
  p.onebit.freeze_step = o.freeze_step;
  // ZeroOneAdam's keys, checked by the config (config.cpp, read_adam_params).
  const auto extra = [&](const char* key, int64_t& out) {
    if (auto it = o.extra_params.find(key); it != o.extra_params.end() && it->is_number_integer())
      out = it->get<int64_t>();
  };
  extra("var_freeze_step", p.onebit.var_freeze_step);
  extra("var_update_scaler", p.onebit.var_update_scaler);
  extra("local_step_scaler", p.onebit.local_step_scaler);
  extra("local_step_clipper", p.onebit.local_step_clipper);
  // OneBitLamb's keys, checked by the config (read_lamb_params).
  const auto real = [&](const char* key, float& out) {
    if (auto it = o.extra_params.find(key); it != o.extra_params.end() && it->is_number())
      out = it->get<float>();
  };
  real("coeff_beta", p.onebit.coeff_beta);
  real("factor_max", p.onebit.factor_max);
  real("factor_min", p.onebit.factor_min);
  real("factor_threshold", p.onebit.factor_threshold);
  return p;
}

std::string optimizer_name(const config::OptimizerConfig& o) {
  switch (o.type) {
    case config::OptimizerType::None:   // no optimizer section: DeepSpeed leaves it to the client; we
    case config::OptimizerType::AdamW:  // default to AdamW with the section's defaults
      return "AdamW";
    case config::OptimizerType::Adam:
      return "Adam";
    case config::OptimizerType::Lamb:
      return "Lamb";
    case config::OptimizerType::SGD:
      return "SGD";
    case config::OptimizerType::Muon:
      return "Muon";
    case config::OptimizerType::MuAdam:
      return "MuAdam";
    case config::OptimizerType::MuAdamW:
      return "MuAdamW";
    case config::OptimizerType::MuSGD:
      return "MuSGD";
    case config::OptimizerType::OneBitAdam:
      return "OneBitAdam";
    case config::OptimizerType::ZeroOneAdam:
      return "ZeroOneAdam";
    case config::OptimizerType::OneBitLamb:
      return "OneBitLamb";
    default:
      DS_THROW(
          "[engine] optimizer '{}' is accepted by the config but not implemented yet; use "
          "Adam, AdamW, Lamb, SGD, Muon, the muP types, OneBitAdam, ZeroOneAdam or OneBitLamb",
          config::optimizer_type_name(o.type));
  }
}

LossFn default_loss_fn() {
  return [](nn::Module& m, const nn::Batch& b) { return m.loss(b); };
}

// The environment variables that came before the config keys (deprecated): "0" still turns its
// feature off, and the first engine of the process says which key to use instead.
void apply_deprecated_offload_env(zero::Options& o,
                                  const std::function<void(const std::string&)>& log) {
  struct Var {
    const char* name;
    const char* key;
    std::vector<bool*> fields;
  };
  const Var vars[] = {
      {"DS_OFFLOAD_STEP_OVERLAP",
       "zero_optimization.offload_optimizer.overlap_step",
       {&o.overlap_step}},
      {"DS_OFFLOAD_STEP_IN_BACKWARD",
       "zero_optimization.offload_optimizer.step_in_backward",
       {&o.step_in_backward}},
      {"DS_OFFLOAD_PREFETCH",
       "zero_optimization.offload_optimizer.prefetch_in_backward",
       {&o.prefetch_in_backward}},
      {"DS_OFFLOAD_DIRECT",
       "aio.use_direct_io",
       {o.nvme_optimizer ? &o.nvme_optimizer->aio.use_direct_io : nullptr,
        o.nvme_params ? &o.nvme_params->aio.use_direct_io : nullptr}},
  };
  static std::mutex mu;
  static std::set<std::string> warned;
  for (const Var& v : vars) {
    const char* env = std::getenv(v.name);
    if (!env) continue;
    const bool off = std::string(env) == "0";
    if (off)
      for (bool* f : v.fields)
        if (f) *f = false;
    std::lock_guard<std::mutex> lock(mu);
    if (!warned.insert(v.name).second || !log) continue;
    log(off ? fmt::format("[offload] {}=0 is deprecated (honoured for now): set {} to false in "
                          "the config instead (docs/offload.md)",
                          v.name, v.key)
            : fmt::format("[offload] {} is deprecated and ignored unless \"0\": {} in the config "
                          "decides (docs/offload.md)",
                          v.name, v.key));
  }
}

}  // namespace

zero::Options zero_options(const config::DeepSpeedConfig& c, DType grads, int world_size) {
  const auto& z = c.zero_optimization;
  zero::Options o;
  o.stage = z.stage;
  o.train_dtype = c.training_dtype();
  o.grad_dtype = grads;
  // With one rank nothing travels: keep the accumulation dtype rather than round for nothing.
  o.comm_dtype = world_size > 1 ? c.communication_data_type : grads;
  o.reduce_bucket_size = std::max<int64_t>(1, static_cast<int64_t>(z.reduce_bucket_size));
  o.overlap_comm = z.overlap_comm;
  o.reduce_scatter = z.reduce_scatter;
  o.prescale_gradients = c.prescale_gradients;
  o.gradient_predivide_factor = c.gradient_predivide_factor;
  o.param_persistence_threshold = static_cast<int64_t>(z.stage3_param_persistence_threshold);
  o.prefetch_bucket_size = static_cast<int64_t>(z.stage3_prefetch_bucket_size);
  o.max_live_parameters = static_cast<int64_t>(z.stage3_max_live_parameters);
  o.max_reuse_distance = static_cast<int64_t>(z.stage3_max_reuse_distance);
  o.quantized_weights = z.zero_quantized_weights && z.stage == 3;
  o.quantized_gradients = z.zero_quantized_gradients && z.stage == 3;
  o.hpz_partition_size = z.stage == 3 ? std::max<int64_t>(1, z.zero_hpz_partition_size) : 1;
  o.mics_shard_size = z.stage == 3 ? z.mics_shard_size : -1;
  o.sub_group_size = std::max<int64_t>(1, static_cast<int64_t>(z.sub_group_size));
  o.overlap_step = z.offload_optimizer.overlap_step;
  o.step_in_backward = z.offload_optimizer.step_in_backward;
  o.prefetch_in_backward = z.offload_optimizer.prefetch_in_backward;
  o.download_in_backward = z.offload_optimizer.download_in_backward;
  io::AioOptions aio;
  aio.block_size = c.aio.block_size;
  aio.queue_depth = static_cast<int>(c.aio.queue_depth);
  aio.threads = static_cast<int>(c.aio.intra_op_parallelism);
  aio.single_submit = c.aio.single_submit;
  aio.overlap_events = c.aio.overlap_events;
  aio.use_direct_io = c.aio.use_direct_io;
  if (z.offload_param.device == config::OffloadDevice::NVMe && z.stage == 3) {
    const config::OffloadParamConfig& f = z.offload_param;
    zero::NvmeParamOffloadOptions n;
    n.nvme_path = f.nvme_path;
    n.buffer_count = f.buffer_count;
    n.buffer_size = f.buffer_size;
    n.max_in_cpu = f.max_in_cpu;
    n.aio = aio;
    o.nvme_params = n;
  }
  if (z.offload_optimizer.device == config::OffloadDevice::NVMe) {
    const config::OffloadOptimizerConfig& f = z.offload_optimizer;
    zero::NvmeOffloadOptions n;
    n.nvme_path = f.nvme_path;
    n.buffer_count = f.buffer_count;
    n.pipeline_read = f.pipeline_read;
    n.pipeline_write = f.pipeline_write;
    n.ratio = f.ratio;
    n.sub_group_size = o.sub_group_size;
    n.aio = aio;
    o.nvme_optimizer = n;
  }
  return o;
}

Engine::Engine(std::shared_ptr<nn::Module> model, config::DeepSpeedConfig config, InitOptions options)
    : model_(std::move(model)),
      config_(std::move(config)),
      options_(std::move(options)),
      scheduler_(config_.scheduler, config_.optimizer.lr),
      scaler_(LossScaler::from_config(config_.fp16)),
      last_grad_norm_(std::numeric_limits<double>::quiet_NaN()) {
  DS_CHECK(model_, "[engine] initialize() needs a model");
  DS_CHECK(!(options_.group && options_.topology),
           "[engine] give InitOptions::group or InitOptions::topology, not both");
  group_ = options_.topology ? options_.topology->data_parallel()
           : options_.group  ? options_.group
                             : comm::world();
  const int tp_size = options_.topology ? options_.topology->tensor_parallel()->size() : 1;
  DS_CHECK(
      config_.tensor_parallel.size == tp_size,
      "[engine] the config's tensor_parallel.autotp_size is {} but the engine's topology has "
      "tensor-parallel size {}; build the Topology (and the model) with {} (docs/parallelism.md)",
      config_.tensor_parallel.size, tp_size, config_.tensor_parallel.size);
  const int n = group_->size();
  DS_CHECK(config_.batch.world_size == n,
           "[engine] the config's batch sizes were resolved for {} ranks but the job has {}; pass "
           "ConfigContext::world_size = {} when parsing",
           config_.batch.world_size, n, n);
  if (!options_.loss_fn) options_.loss_fn = default_loss_fn();
  if (config_.comms_logger.enabled) comm::comms_logger().enable(true);
  scaler_.set_rank(group_->rank());
  scaler_.set_log_sink([this](const std::string& m) { log(m); });
  grad_dtype_ = gradient_dtype(config_);
  install_activation_stash(tp_size);
  install_flops_profile(tp_size);
  {
    const auto params = model_->named_parameters();
    wall_clock_ = WallClockBreakdown(config_.wall_clock_breakdown,
                                     params.empty() ? kCPU : params.front().second.device());
  }

  // Where parameters, gradients and master weights live, and how they are reduced and gathered.
  zero::Options zo = zero_options(config_, grad_dtype_, n);
  zo.log = [this](const std::string& m) { log(m); };
  apply_deprecated_offload_env(zo, zo.log);
  zero_ = zero::make_strategy(*model_, split_experts(), zo);
  set_parallel_axes();
  warn_unused_download_key();

  optimizer_ =
      optim::make_optimizer(optimizer_name(config_.optimizer), optimizer_params(config_.optimizer));
  // One segment per parameter tensor over this rank's range (Lamb's trust ratio is per tensor).
  optimizer_->set_segments(zero_->segments());
  wire_optimizer();
  // Master weights and moments: in RAM, or streamed from NVMe (offload_optimizer).
  zero_->attach_optimizer(*optimizer_, [this](const std::string& m) { log(m); });

  // The model's original parameter storages were just freed (everything now lives in the flat or
  // shard buffers). Give their memory back rather than keep it cached: those blocks are sized per
  // parameter and fragment the large pool, so the moments, gradients and activations allocated next
  // would need new memory anyway (GPT-2 124M: ~540 MiB per rank that peak RSS would otherwise
  // carry).
  cpu_allocator().empty_cache();
  // On a device, the same for the parameters' blocks freed there (frozen ones, flattened in the
  // training dtype; the flat strategies return theirs before allocating the flat buffers).
  if (const auto params = model_->named_parameters();
      !params.empty() && !params.front().second.device().is_cpu())
    device_ops(params.front().second.device()).allocator->empty_cache();
}

// offload_optimizer.download_in_backward schedules a device model's gradient copies at stages 0-2;
// set to false anywhere else it would change nothing, so the user hears it.
void Engine::warn_unused_download_key() {
  if (config_.zero_optimization.offload_optimizer.download_in_backward) return;
  const auto params = model_->named_parameters();
  const bool on_device = !params.empty() && !params.front().second.device().is_cpu();
  if (on_device && config_.zero_optimization.stage <= 2) return;
  log(fmt::format("[engine] zero_optimization.offload_optimizer.download_in_backward = false has "
                  "no effect: {} (it schedules the gradient copies of a model on a GPU at stages "
                  "0-2)",
                  on_device ? "this run is at stage 3" : "the model is in host memory"));
}

// The activation_checkpointing section's stash, and a line saying what it does.
void Engine::install_activation_stash(int tp_size) {
  activation_stash_ = std::make_unique<ActivationStashScope>(
      config_.activation_checkpointing,
      options_.topology ? options_.topology->tensor_parallel() : nullptr,
      [this](const std::string& m) { log(m); });
  if (activation_stash_->stash()) {
    const auto& ac = config_.activation_checkpointing;
    std::vector<std::string> what;
    if (ac.cpu_checkpointing)
      what.push_back("checkpointed layers' inputs wait in host memory (cpu_checkpointing)");
    if (ac.partition_activations && tp_size > 1)
      what.push_back(fmt::format(
          "each tensor-parallel rank keeps 1/{} of a checkpointed layer's input, gathered for the "
          "recompute (partition_activations)",
          tp_size));
    if (ac.contiguous_memory_optimization && ac.number_checkpoints)
      what.push_back(fmt::format(
          "they are kept in one buffer of {} slots (contiguous_memory_optimization)",
          *ac.number_checkpoints));
    if (ac.profile)
      what.push_back("each one's forward and recompute are timed and logged (profile)");
    if (ac.synchronize_checkpoint_boundary)
      what.push_back("the device is synchronized after each checkpointed layer "
                     "(synchronize_checkpoint_boundary)");
    log(fmt::format("activation checkpointing: {}; for the layers checkpointed "
                    "(ds_train --gradient_checkpointing, nn::Module::set_gradient_checkpointing)",
                    fmt::join(what, "; ")));
  }
  if (config_.activation_checkpointing.partition_activations && tp_size == 1)
    log("activation checkpointing: partition_activations changes nothing without tensor "
        "parallelism (it cuts checkpointed inputs over the tensor-parallel ranks, which hold them "
        "whole; here there is one)");
}

// flops_profiler: on global rank 0 only (DeepSpeed profiles there).
void Engine::install_flops_profile(int tp_size) {
  const int n = group_->size();
  if (config_.flops_profiler.enabled &&
      (options_.topology ? options_.topology->rank() : group_->world_rank(group_->rank())) == 0) {
    ProfileRun run;
    run.world_size = options_.topology ? options_.topology->world()->size() : n;
    run.dp_size = n;
    run.mp_size = tp_size;
    run.micro_batch = config_.batch.train_micro_batch_size_per_gpu;
    flops_profile_ = std::make_unique<FlopsProfileStep>(
        *model_, config_.flops_profiler, run, config_.wall_clock_breakdown,
        [this](const std::string& m) { log(m); });
  }
}

// Tensor and pipeline parallelism beside ZeRO's data-parallel group.
std::shared_ptr<comm::Group> Engine::split_experts() {
  const int ep = config_.expert_parallel.size;
  if (ep <= 1) return group_;
  const auto& z = config_.zero_optimization;
  DS_CHECK(z.mics_shard_size <= 0 && z.zero_hpz_partition_size <= 1,
           "[engine] expert parallelism (expert_parallel.autoep_size {}) with MiCS or hpZ "
           "(zero_optimization.mics_shard_size / zero_hpz_partition_size) is not implemented; "
           "use plain ZeRO or autoep_size 1",
           ep);
  DS_CHECK(z.offload_optimizer.device != config::OffloadDevice::NVMe &&
               z.offload_param.device != config::OffloadDevice::NVMe,
           "[engine] expert parallelism (expert_parallel.autoep_size {}) with NVMe offload is not "
           "implemented yet; use autoep_size 1 or keep the optimizer state in RAM",
           ep);
  const std::string opt = optimizer_name(config_.optimizer);
  for (const char* refused : {"OneBitAdam", "ZeroOneAdam", "OneBitLamb", "Muon"})
    DS_CHECK(opt != refused,
             "[engine] the {} optimizer does not combine with expert parallelism here "
             "(expert_parallel.autoep_size {}); use AdamW or autoep_size 1",
             opt, ep);
  DS_CHECK(group_->size() % ep == 0,
           "[engine] expert_parallel.autoep_size {} must divide the data-parallel size {} (each "
           "group of {} consecutive data-parallel ranks holds every expert once)",
           ep, group_->size(), ep);
  if (!config_.expert_parallel.preset_model.empty())
    log(fmt::format("expert parallelism: preset_model '{}' is not checked here (the engine splits "
                    "the MoE layers the model has; ds_train checks the preset against the model's "
                    "family)",
                    config_.expert_parallel.preset_model));
  experts_ = comm::split_expert_parallel(group_, ep);
  // Every rank starts from data rank 0's weights (the strategy broadcasts only within its group,
  // and the experts are cut from the whole layers next).
  for (const auto& [name, p] : model_->named_parameters())
    group_->broadcast(p, 0, "initial weights (expert parallelism)");
  const int layers = nn::shard_experts(*model_, experts_.expert);
  DS_CHECK(layers > 0 || (options_.topology && options_.topology->pipeline()->size() > 1),
           "[engine] expert parallelism (expert_parallel.autoep_size {}) needs a "
           "mixture-of-experts model (mixtral, qwen3_moe), and this one has no MoE layer; set "
           "autoep_size to 1",
           ep);
  log(fmt::format("expert parallelism: the experts of {} MoE layers split over {} ranks (this "
                  "rank: expert slice {} of {}); their gradients are summed over {} ranks, the "
                  "dense ones over all {}",
                  layers, ep, experts_.expert->rank(), ep, experts_.expert_data->size(),
                  group_->size()));
  return experts_.expert_data;
}

void Engine::set_parallel_axes() {
  if (experts_.expert) {
    std::set<std::string> names;
    for (const auto& [name, split] : nn::expert_splits(*model_)) names.insert(name);
    zero_->set_expert_parallel(experts_.expert, names);
  }
  if (options_.topology && options_.topology->tensor_parallel()->size() > 1) {
    // The model's cut parameters (nn/tensor_parallel.h) count once per distinct part in the
    // global norm.
    std::map<std::string, int> cut;
    for (const auto& [name, split] : nn::tp_splits(*model_))
      if (!split.replicated()) cut[name] = split.copies;
    DS_CHECK(!cut.empty(),
             "[engine] the topology has tensor_parallel size {} but the model has no "
             "tensor-parallel layers; build it with that group (models::GPT(config, tp))",
             options_.topology->tensor_parallel()->size());
    zero_->set_tensor_parallel(options_.topology->tensor_parallel(), cut);
  }
  if (options_.topology && options_.topology->pipeline()->size() > 1) {
    DS_CHECK(dynamic_cast<nn::PipelineStage*>(model_.get()),
             "[engine] the topology has {} pipeline stages but the model is not a pipeline stage; "
             "build each rank's stage (models::GPT(config, tp, PipeRange)) and train it with "
             "runtime::PipelineEngine (docs/parallelism.md)",
             options_.topology->pipeline()->size());
    zero_->set_pipeline_parallel(options_.topology->pipeline());
  }
}

// What an optimizer needs from the strategy and the group: Lamb's cross-rank norms, muP's
// multipliers, Muon's matrices, the 1-bit family's group.
void Engine::wire_optimizer() {
  if (auto* lamb = dynamic_cast<optim::Lamb*>(optimizer_.get()); lamb && zero_->partitioned()) {
    // A tensor cut by partition boundaries has a piece on several ranks: its ||p||^2 and
    // ||update||^2 are the sums of the pieces'. Gathered as raw doubles and summed in rank order,
    // so every rank computes the same trust ratios.
    lamb->set_norm_reducer([this](double* sums, int64_t count) {
      const int n = group_->size();
      std::vector<double> all(static_cast<size_t>(count) * static_cast<size_t>(n));
      group_->all_gather(sums, all.data(), static_cast<size_t>(count), DType::i64,
                         fmt::format("step {} Lamb norms", global_steps_));
      for (int64_t k = 0; k < count; ++k) {
        double total = 0.0;
        for (int r = 0; r < n; ++r) total += all[static_cast<size_t>(r * count + k)];
        sums[k] = total;
      }
    });
  }
  if (auto* mup = dynamic_cast<optim::Mup*>(optimizer_.get())) {
    // One multiplier pair per segment (= per flat entry), from the base shapes.
    std::vector<std::pair<std::string, std::vector<int64_t>>> tensors;
    for (const auto& e : zero_->flat().entries) tensors.emplace_back(e.name, e.shape);
    mup->set_scales(optim::mup_scales(mup->kind(), tensors, options_.mup_base_shapes));
    if (options_.mup_base_shapes.empty())
      log(fmt::format("[mup] {}: no base shapes (InitOptions::mup_base_shapes), so every width "
                      "multiplier is 1: the plain optimizer",
                      mup->name()));
  }
  if (auto* muon = dynamic_cast<optim::Muon*>(optimizer_.get())) {
    // Newton-Schulz needs each whole matrix; a tensor-parallel slice is not one.
    DS_CHECK(!options_.topology || options_.topology->tensor_parallel()->size() == 1,
             "[engine] the Muon optimizer does not support tensor parallelism (each rank would "
             "orthogonalise its slice of a matrix, not the matrix); use AdamW or tensor_parallel 1");
    zero::attach_muon(*muon, *zero_, [this](const std::string& m) { log(m); });
  }
  if (auto* onebit = dynamic_cast<optim::CompressedOptimizer*>(optimizer_.get())) {
    // The 1-bit family averages its momentum over the data-parallel ranks itself.
    DS_CHECK(zero_->stage() == 0, "[engine] {} needs ZeRO stage 0 (got {})", onebit->name(),
             zero_->stage());
    onebit->set_group(group_);
  }
}

Engine::~Engine() {
  // A background optimizer step uses the optimizer, which goes before the strategy.
  if (zero_) zero_->join_step();
}

void Engine::log(const std::string& line) const {
  if (options_.log) {
    options_.log(line);
  } else if (group_->rank() == 0) {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

std::string Engine::step_label() const {
  return fmt::format("step {}", global_steps_ + 1);
}

namespace {

// The batch's tensors on the model's device (the first parameter's): a loader's host batch goes
// up to a GPU model here, so callers feed the engine the same tensors on any device.
nn::Batch batch_on_device(const nn::Module& model, const nn::Batch& b) {
  const auto params = model.named_parameters();
  if (params.empty()) return b;
  const Device dev = params.front().second.device();
  auto move = [&](const Tensor& t) { return t.defined() ? t.to(dev) : t; };
  return {move(b.input_ids), move(b.labels), move(b.attention_mask), move(b.token_type_ids),
          move(b.decoder_input_ids)};
}

}  // namespace

Tensor Engine::forward(const nn::Batch& batch) {
  const WallClockBreakdown::Scope timed(wall_clock_, WallClockBreakdown::kForward);
  model_->train(true);
  zero_->begin_forward(/*training=*/true);
  const nn::Batch on_device = batch_on_device(*model_, batch);
  const FlopsProfileStep::Forward profiled(flops_profile_.get(), global_steps_);
  return options_.loss_fn(*model_, on_device);
}

Tensor Engine::forward(const Tensor& inputs, const Tensor& targets) {
  return forward(nn::Batch{.input_ids = inputs, .labels = targets});
}

Tensor Engine::eval_loss(const nn::Batch& batch) {
  autograd::NoGradGuard no_grad;
  const bool was_training = model_->is_training();
  model_->train(false);
  // Evaluation gathers in its own order: ZeRO-3 neither records nor follows its trace.
  zero_->begin_forward(/*training=*/false);
  Tensor loss = options_.loss_fn(*model_, batch_on_device(*model_, batch));
  model_->train(was_training);
  zero_->end_eval();
  return loss;
}

Tensor Engine::eval_loss(const Tensor& inputs, const Tensor& targets) {
  return eval_loss(nn::Batch{.input_ids = inputs, .labels = targets});
}

bool Engine::steps_in_backward() const {
  // Each sub-group may be updated as soon as its gradients are final when nothing global (the
  // norm for clipping, the fp16 overflow check) must be known first.
  return config_.gradient_clipping <= 0 && !config_.fp16.enabled && zero_->can_step_in_backward();
}

void Engine::follow_onebit_all_reduce() {
  // DeepSpeed's 1-bit optimizers turn the engine's backward all-reduce off after their warm-up
  // (enable_backward_allreduce = False): each rank's own gradient goes to the optimizer then.
  if (auto* onebit = dynamic_cast<optim::CompressedOptimizer*>(optimizer_.get()))
    zero_->set_gradient_all_reduce(onebit->wants_reduced_gradients());
}

bool Engine::any_rank_overflow(bool mine, const std::string& ctx) {
  // With local gradients (1-bit optimizers after the freeze) the norm is this rank's own: the
  // skip decision must still be the same everywhere, or ranks would issue different collectives.
  if (zero_->gradient_all_reduce() || group_->size() == 1) return mine;
  float flag = mine ? 1.0f : 0.0f;
  group_->all_reduce(&flag, 1, DType::f32, comm::ReduceOp::max, ctx + " overflow check");
  return flag != 0.0f;
}

void Engine::set_optimizer_schedule() {
  optimizer_->set_lr(static_cast<float>(scheduler_.get_lr()));
  if (auto beta1 = scheduler_.get_beta1())
    optimizer_->set_betas(static_cast<float>(*beta1),
                          static_cast<float>(LRScheduler::kOneCycleBeta2));
}

void Engine::backward(const Tensor& loss) {
  DS_CHECK(loss.defined() && loss.numel() == 1, "[engine] backward() needs the scalar loss");
  const WallClockBreakdown::Scope timed(wall_clock_, WallClockBreakdown::kBackward);
  const auto started = std::chrono::steady_clock::now();
  const double gas = static_cast<double>(config_.batch.gradient_accumulation_steps);
  if (is_gradient_accumulation_boundary() && steps_in_backward()) {
    if (!logged_step_in_backward_) {
      logged_step_in_backward_ = true;
      log("[offload] the optimizer steps each sub-group during backward, as soon as its gradients "
          "are final (no gradient_clipping, no fp16 loss scaling), so its NVMe traffic overlaps "
          "backward and forward. A non-finite gradient then stops the run instead of skipping "
          "the step; set zero_optimization.offload_optimizer.step_in_backward = false (or "
          "gradient_clipping) to step after backward");
    }
    set_optimizer_schedule();
    // No clipping: the factor does not depend on the norm.
    const ClipCoefficient clip = unscale_and_clip_coefficient(0.0, scaler_.scale(), 0.0);
    zero_->plan_step_in_backward(*optimizer_,
                                 static_cast<float>(clip.factor * zero_->grad_post_scale()));
  }
  follow_onebit_all_reduce();
  zero_->begin_backward(is_gradient_accumulation_boundary(), step_label());
  ops::mul(loss.dtype() == DType::f32 ? loss : ops::cast(loss, DType::f32),
           static_cast<float>(scaler_.scale() / gas))
      .backward();
  zero_->end_backward();
  if (flops_profile_)
    flops_profile_->add_backward_seconds(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
}

void Engine::backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads) {
  DS_CHECK(!roots.empty() && roots.size() == grads.size(),
           "[engine] a stage backward needs one gradient per root ({} roots, {} gradients)",
           roots.size(), grads.size());
  const WallClockBreakdown::Scope timed(wall_clock_, WallClockBreakdown::kBackward);
  follow_onebit_all_reduce();
  zero_->begin_backward(is_gradient_accumulation_boundary(), step_label());
  autograd::backward(roots, grads);
  zero_->end_backward();
}

std::vector<std::pair<std::string, Tensor>> Engine::full_weights() {
  std::vector<std::pair<std::string, Tensor>> weights = zero_->full_weights();
  if (experts_.expert && !weights.empty()) {
    // Each expert-parallel rank holds a slice of dimension 0 (under stage 3 only the ranks of
    // expert-data rank 0 hold the list, the whole expert-parallel group of data rank 0).
    const auto splits = nn::expert_splits(*model_);
    comm::Group& ep = *experts_.expert;
    for (auto& [name, t] : weights)
      if (splits.count(name)) {
        Shape whole = t.shape();
        whole[0] *= ep.size();
        Tensor all = Tensor::empty(whole, t.dtype(), t.device());
        ep.all_gather(t.contiguous(), all, "gathering the experts of " + name);
        t = all;
      }
  }
  if (!options_.topology || options_.topology->tensor_parallel()->size() == 1) return weights;
  const nn::TensorParallel tp(options_.topology->tensor_parallel());
  const auto splits = nn::tp_splits(*model_);
  for (auto& [name, t] : weights)
    if (auto it = splits.find(name); it != splits.end()) t = nn::gather_full(t, it->second, tp);
  return weights;
}

void Engine::synchronize() {
  zero_->synchronize(fmt::format("after step {}", global_steps_));
}

bool Engine::is_gradient_accumulation_boundary() const {
  return (micro_steps_ + 1) % config_.batch.gradient_accumulation_steps == 0;
}

double Engine::get_lr() const {
  return scheduler_.get_lr();
}

double Engine::train_batch(const std::function<MicroBatch()>& next) {
  const int64_t A = config_.batch.gradient_accumulation_steps;
  DS_CHECK(micro_steps_ % A == 0,
           "[engine] train_batch() must start at an accumulation boundary; {} micro-steps of the "
           "current batch were run by forward/backward/step",
           micro_steps_ % A);
  const int n = group_->size();
  double loss_sum = 0.0;
  for (int64_t m = 0; m < A; ++m) {
    const MicroBatch b = next();
    // Dropout masks are keyed by the global sample position, as in a run that never stopped.
    rng::dropout_state().sample_base = b.sample_base;
    Tensor loss = forward(b.batch);
    float local = loss.item();
    if (n > 1) group_->all_reduce(&local, 1, DType::f32, comm::ReduceOp::sum, "loss for logging");
    loss_sum += static_cast<double>(local) / n;
    backward(loss);
    step();
  }
  return loss_sum / static_cast<double>(A);
}

bool Engine::step() {
  const int64_t before = global_steps_;
  bool applied = false;
  const auto started = std::chrono::steady_clock::now();
  {
    const WallClockBreakdown::Scope timed(wall_clock_, WallClockBreakdown::kStep);
    applied = take_step();
  }
  if (flops_profile_)
    flops_profile_->after_step(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  if (global_steps_ != before && wall_clock_.enabled()) {
    wall_clock_.step_done();
    if (config_.steps_per_print > 0 && global_steps_ % config_.steps_per_print == 0)
      log(fmt::format("[engine] step {}: {}", global_steps_, wall_clock_.report()));
  }
  return applied;
}

bool Engine::take_step() {
  const bool boundary = is_gradient_accumulation_boundary();
  ++micro_steps_;
  global_samples_ += config_.batch.train_micro_batch_size_per_gpu * config_.batch.world_size;
  if (!boundary) return false;

  const std::string ctx = step_label();
  // The step may already be under way since backward (steps_in_backward()).
  const bool in_backward = zero_->stepping_in_backward();
  Tensor g;
  double sq = 0;
  if (in_backward) {
    sq = zero_->step_in_backward_sum_of_squares(ctx);
  } else {
    g = zero_->reduced_gradients(ctx);
    sq = zero_->global_sum_of_squares(g, ctx);
  }
  const double scale = scaler_.scale();
  // The buffers hold prescale * sum over ranks; the average is that times grad_post_scale.
  const double norm_scaled = std::sqrt(sq) * zero_->grad_post_scale();
  const bool overflow = any_rank_overflow(!std::isfinite(norm_scaled), ctx);
  last_grad_norm_ = norm_scaled / scale;
  ++global_steps_;

  if (in_backward) {
    // The norm is global: every rank stops here together.
    DS_CHECK(!overflow,
             "[engine] step {}: the gradient norm is not finite (inf/NaN in the gradients), and "
             "the optimizer had already applied them during backward (no gradient_clipping: "
             "docs/offload.md). Resume from the last checkpoint with "
             "zero_optimization.offload_optimizer.step_in_backward = false or gradient_clipping "
             "set, so that such a step is skipped; lower the learning rate or check the data",
             global_steps_);
    last_step_skipped_ = false;
    consecutive_skips_ = 0;
    zero_->after_step(ctx);
    scheduler_.step();
    zero_->zero_grads();
    return true;
  }

  bool skip = false;
  if (config_.fp16.enabled && scaler_.dynamic()) {
    skip = scaler_.update(overflow).skip_step;  // logs OVERFLOW and throws at the minimum scale
  } else if (overflow) {
    skip = true;
    log(
        fmt::format("[engine] step {}: the gradient norm is not finite (inf/NaN in the gradients); "
                    "skipping this step",
                    global_steps_));
  } else if (config_.fp16.enabled) {
    scaler_.update(false);
  }
  last_step_skipped_ = skip;
  if (skip) {
    ++skipped_steps_;
    zero_->zero_grads();
    DS_CHECK(++consecutive_skips_ < options_.max_consecutive_skips,
             "[engine] {} optimizer steps in a row were skipped because the gradients are not "
             "finite (last at step {}). The run is diverging: lower the learning rate, enable "
             "gradient_clipping, use bf16 instead of fp16, or check the data for bad tokens",
             consecutive_skips_, global_steps_);
    return false;
  }
  consecutive_skips_ = 0;

  // Unscale, average and clip in one factor (DeepSpeed's unscale_and_clip_grads,
  // deepspeed/runtime/fp16/fused_optimizer.py).
  const ClipCoefficient clip =
      unscale_and_clip_coefficient(norm_scaled, scale, config_.gradient_clipping);
  set_optimizer_schedule();
  zero_->optimizer_step(*optimizer_, g, static_cast<float>(clip.factor * zero_->grad_post_scale()),
                        ctx);
  zero_->after_step(ctx);
  scheduler_.step();
  zero_->zero_grads();
  return true;
}

MemoryBudget Engine::memory_budget() const {
  const zero::MemoryBytes z = zero_->memory();
  MemoryBudget b;
  b.params = z.params;
  b.grads = z.grads;
  b.master_weights = z.master_weights;
  b.scratch = z.scratch;
  const zero::StoreStats st = zero_->state().stats();
  b.optimizer_states = st.ram_bytes;
  b.nvme = st.disk_bytes;
  return b;
}

DType gradient_dtype(const config::DeepSpeedConfig& c) {
  if (c.data_types.grad_accum_dtype) return *c.data_types.grad_accum_dtype;
  return c.fp16.enabled ? DType::f16 : DType::f32;
}

std::unique_ptr<Engine> initialize(std::shared_ptr<nn::Module> model, config::DeepSpeedConfig config,
                                   InitOptions options) {
  return std::make_unique<Engine>(std::move(model), std::move(config), std::move(options));
}

std::unique_ptr<Engine> initialize(std::shared_ptr<nn::Module> model,
                                   const std::string& config_path_or_json, InitOptions options) {
  // The batch sizes are per data-parallel rank: resolve them for the group ZeRO will use.
  if (options.topology) {
    options.ctx.world_size = options.topology->data_parallel()->size();
  } else {
    if (!options.group) options.group = comm::world();
    options.ctx.world_size = options.group->size();
  }
  config::DeepSpeedConfig cfg = config::parse_config(config_path_or_json, options.ctx);
  return initialize(std::move(model), std::move(cfg), std::move(options));
}

}  // namespace ds::runtime


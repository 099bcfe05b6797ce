#include "ds/train/fit.h"

#include "ds/core/memory_info.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "ds/core/error.h"
#include "ds/io/aio.h"
#include "ds/io/swap_dir.h"
#include "ds/runtime/engine.h"
#include "ds/zero/memory_model.h"
#include "ds/zero/partition.h"
#include "ds/train/train_util.h"

namespace ds::train {

namespace {

// Model-state bytes per rank in RAM and on disk for `cfg`: the one memory model
// (zero/memory_model.h) over what the engine's strategy is told (runtime::zero_options), so the
// check and the engine agree. "cpu" offload is not modelled: the engine keeps optimizer state in
// host memory in every run. A GPU run (--device cuda) is counted as if it all lived in host memory
// (its parameters and gradients are on the GPU): an overestimate of RAM, never an underestimate.
zero::RankMemory model_state_bytes(int64_t params, int64_t frozen,
                                   const config::DeepSpeedConfig& cfg, int world_size) {
  const zero::Options o = runtime::zero_options(cfg, runtime::gradient_dtype(cfg), world_size);
  const zero::MemorySpec spec = zero::memory_spec(o, world_size, /*state_floats=*/2);  // Adam
  return zero::model_state_memory(spec, params, frozen);
}

}  // namespace

FitPlan plan_fit(int64_t model_params, const config::DeepSpeedConfig& cfg,
                 int world_size, int ranks_on_node, int64_t activations, bool partitioned_build,
                 int64_t lora_params, int64_t frozen, int model_parallel) {
  FitPlan p;
  p.lora_params = lora_params;
  p.frozen = frozen;
  const int64_t mp = std::max(1, model_parallel);
  const int64_t P = (model_params + lora_params + mp - 1) / mp;
  const zero::RankMemory m = model_state_bytes(P - frozen, frozen, cfg, world_size);
  p.model_states = m.ram();
  p.nvme = m.disk();
  p.offload_buffers = m.buffers;
  const auto& z = cfg.zero_optimization;
  p.nvme_path = z.offload_optimizer.device == config::OffloadDevice::NVMe
                    ? z.offload_optimizer.nvme_path
                    : z.offload_param.nvme_path;
  // Stage 3 built piecewise holds only its fp32 piece before the optimizer state moves to disk.
  p.model_build = partitioned_build && z.stage == 3
                      ? (p.nvme > 0 ? 4 * zero::plan_partitions(P, world_size).partition_numel : 0)
                      : 4 * P;
  p.activations = activations;
  p.ranks_on_node = ranks_on_node;
  return p;
}

GpuFitPlan plan_fit_gpu(int64_t model_params, const config::DeepSpeedConfig& cfg,
                        int64_t activations, int64_t lora_params, int64_t frozen, int data_parallel,
                        int model_parallel) {
  // As the engine lays it out (zero/flat_strategy.cpp, Strategy::device_optimizer_step; stage 3:
  // zero/stage3.cpp): this rank's part of the model (1/model_parallel of it: its tensor slices or
  // pipeline stage), trainable elements in the flat buffers, frozen ones beside them; the fp32
  // master weights and moments of this rank's ZeRO partition in host memory.
  const int64_t mp = std::max(1, model_parallel), dp = std::max(1, data_parallel);
  const int64_t P = (model_params + lora_params + mp - 1) / mp;
  const int64_t trainable = P - (frozen + mp - 1) / mp;
  const auto& z = cfg.zero_optimization;
  const int64_t part = z.stage == 0 ? trainable : (trainable + dp - 1) / dp;
  const DType train = cfg.training_dtype(), grads = runtime::gradient_dtype(cfg);
  const int64_t t = static_cast<int64_t>(dtype_size(train)),
                g = static_cast<int64_t>(dtype_size(grads));
  GpuFitPlan p;
  p.activations = activations;
  p.host_build = 4 * P;
  if (z.stage == 3) {
    // Gathered parameters only (what is live at once: max_live_parameters plus a prefetch
    // bucket), gradients reduced to host memory as each is complete; the host keeps the shards
    // of the working parameters and the gradients beside the master weights and moments.
    p.params = std::min<int64_t>(P, z.stage3_max_live_parameters + z.stage3_prefetch_bucket_size) * t;
    p.grads = 0;
    // Master weights and moments, the gradient shard (and its fp32 copy when it is 16-bit), the
    // working shard in 16-bit training (in fp32 the master weights are the working shard).
    p.host_states =
        part * (4 + 8 + g + (grads != DType::f32 ? 4 : 0) + (train != DType::f32 ? t : 0));
    return p;
  }
  p.params = P * t;
  // Stages 0-1 accumulate into the flat gradient buffer; stage 2 into its partition with the
  // per-parameter gradients freed bucket by bucket.
  p.grads = (z.stage == 2 ? part : trainable) * g;
  // Master weights (fp32) and two Adam moments; the gradients come down in their own dtype and
  // 16-bit training stages the rounded parameters on the way up.
  p.host_states = part * (4 + 8 + g + (train != DType::f32 ? t : 0));
  return p;
}

std::string check_fit_gpu(const GpuFitPlan& plan, int64_t device_available, int64_t host_available,
                          const std::string& device, const config::DeepSpeedConfig& cfg) {
  std::string warning;
  if (device_available > 0) {
    const int64_t need = plan.device();
    const std::string breakdown =
        fmt::format("parameters {} ({}), gradients {} ({}), activations ~{}", mib(plan.params),
                    dtype_name(cfg.training_dtype()), mib(plan.grads),
                    dtype_name(runtime::gradient_dtype(cfg)), mib(plan.activations));
    if (need > device_available) {
      std::vector<std::string> fixes;
      if (cfg.training_dtype() == DType::f32) fixes.push_back("bf16 training (--bf16)");
      if (runtime::gradient_dtype(cfg) == DType::f32)
        fixes.push_back(
            fmt::format(R"(16-bit gradients (data_types.grad_accum_dtype "bf16": {} less))",
                        mib(plan.grads / 2)));
      fixes.push_back(
          "--gradient_checkpointing or a smaller --per_device_train_batch_size "
          "(activations)");
      DS_THROW(
          "[ds_train] this run does not fit on {}: it needs ~{} there ({}); {} is available (the "
          "card's free memory, or --device_memory_limit). The optimizer state is already in host "
          "memory. Options: {}. (--skip_memory_check runs anyway.)",
          device, mib(need), breakdown, mib(device_available), fmt::join(fixes, "; "));
    }
    if (need * 10 > device_available * 9)
      warning = fmt::format(
          "warning: this run needs ~{} of the {} available on {} ({}); it may "
          "not fit",
          mib(need), mib(device_available), device, breakdown);
  }
  if (host_available > 0) {
    const int64_t need = plan.host();
    DS_CHECK(need <= host_available,
             "[ds_train] this run does not fit in host memory: the GPU run keeps the fp32 master "
             "weights, the Adam moments and the staging buffers there, ~{} ({} to build the fp32 "
             "model first), and {} is available. Free memory, or train a smaller model. "
             "(--skip_memory_check runs anyway.)",
             mib(need), mib(plan.host_build), mib(host_available));
    if (warning.empty() && need * 10 > host_available * 9)
      warning = fmt::format(
          "warning: this run needs ~{} of the {} of host memory available; it "
          "may not fit",
          mib(need), mib(host_available));
  }
  return warning;
}

int64_t available_memory_bytes() {
  return ds::available_memory_bytes();  // core/memory_info.h: the one place that reads it
}

int local_ranks() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_SIZE"})
    if (const char* s = std::getenv(v); s && *s) {
      try {
        return std::max(1, std::stoi(s));
      } catch (...) {
      }
    }
  return 1;
}

std::string check_fit(const FitPlan& plan, int64_t available, int64_t model_params,
                      const config::DeepSpeedConfig& cfg, int world_size,
                      const std::string& scratch_dir) {
  // Disk first: an NVMe offload that cannot reserve its swap files fails anyway, later.
  if (plan.nvme > 0) {
    // A killed run's swap folder is still on disk here; its lock says it is dead and the
    // engine's start removes it, so it counts as free (io/swap_dir.h).
    const int64_t free = io::available_bytes(plan.nvme_path);
    const io::SwapSpace swap = io::swap_space(plan.nvme_path);
    DS_CHECK(free < 0 || plan.nvme_per_node() <= free + swap.reclaimable,
             "[ds_train] the NVMe offload needs {} on {} ({} per rank x {}), {} is free there{}: "
             "free space, point nvme_path at a larger disk, or lower "
             "offload_optimizer.ratio",
             mib(plan.nvme_per_node()), plan.nvme_path, mib(plan.nvme), plan.ranks_on_node,
             mib(free + swap.reclaimable), swap.folders);
  }
  if (available <= 0) return "";
  const int64_t need = plan.per_node();
  const std::string breakdown = fmt::format(
      "{} per rank x {} rank{} on this node: model states {} (ZeRO stage {}, {}{}), the fp32 "
      "model built before partitioning {}, activations ~{}",
      mib(plan.model_states + plan.model_build + plan.activations), plan.ranks_on_node,
      plan.ranks_on_node > 1 ? "s" : "", mib(plan.model_states), cfg.zero_optimization.stage,
      dtype_name(cfg.training_dtype()),
      plan.nvme > 0 ? fmt::format("; {} more on NVMe, {} of swap buffers in RAM", mib(plan.nvme),
                                  mib(plan.offload_buffers))
                    : "",
      mib(plan.model_build), mib(plan.activations));
  if (need <= available) {
    if (need * 10 > available * 9)
      return fmt::format("warning: this run needs ~{} of the {} available ({}); it may not fit",
                         mib(need), mib(available), breakdown);
    return "";
  }
  // What would fit: a higher stage (same ranks), then bf16, then NVMe offload.
  std::vector<std::string> fixes;
  const int64_t P = model_params + plan.lora_params;
  auto fits = [&](const config::DeepSpeedConfig& c) {
    const FitPlan q = plan_fit(model_params, c, world_size, plan.ranks_on_node, plan.activations,
                               plan.model_build < 4 * P, plan.lora_params, plan.frozen);
    return std::pair{q.per_node() <= available, q};
  };
  for (int s = cfg.zero_optimization.stage + 1; s <= 3; ++s) {
    config::DeepSpeedConfig c = cfg;
    c.zero_optimization.stage = s;
    if (auto [ok, q] = fits(c); ok) {
      fixes.push_back(fmt::format("zero_optimization.stage {} ({} of model states per rank)", s,
                                  mib(q.model_states)));
      break;
    }
  }
  if (cfg.training_dtype() == DType::f32) {
    // bf16 keeps fp32 master weights and (by default) fp32 gradients: it only helps when sharding
    // spreads those over ranks.
    config::DeepSpeedConfig c = cfg;
    c.bf16.enabled = true;
    if (auto [ok, q] = fits(c); ok)
      fixes.push_back(
          fmt::format("bf16 training (--bf16; {} of model states per rank)", mib(q.model_states)));
  }
  // NVMe offload: the optimizer state first; with stage 3 the parameters too.
  const int64_t free_here = io::available_bytes(scratch_dir);
  for (bool params : {false, true}) {
    config::DeepSpeedConfig c = cfg;
    auto& z = c.zero_optimization;
    if (z.offload_optimizer.device == config::OffloadDevice::NVMe && (!params || z.stage < 3))
      continue;
    z.offload_optimizer.device = config::OffloadDevice::NVMe;
    z.offload_optimizer.nvme_path = scratch_dir;
    // Swap buffers within an eighth of the memory: sub-groups of at most this many elements.
    const int64_t group = std::clamp<int64_t>(
        available / 8 / (z.offload_optimizer.buffer_count * 12) / 2048 * 2048, 2048, 100000000);
    z.sub_group_size = std::min<int64_t>(z.sub_group_size, group);
    if (params) {
      z.stage = 3;
      z.offload_param.device = config::OffloadDevice::NVMe;
      z.offload_param.nvme_path = scratch_dir;
      z.offload_param.max_in_cpu = 0;
    }
    auto [ok, q] = fits(c);
    if (!ok) continue;
    fixes.push_back(fmt::format(
        "{}offload_optimizer.device=nvme{} with sub_group_size {} (needs {} on disk{}, {} of "
        "RAM)",
        params ? "zero_optimization.stage 3 with " : "enable ",
        params ? " and offload_param.device=nvme" : "", z.sub_group_size, mib(q.nvme_per_node()),
        free_here >= 0 ? fmt::format("; {} is free on {}", mib(free_here), scratch_dir) : "",
        mib(q.per_node())));
    break;
  }
  fixes.push_back("more ranks on more nodes (the sharded states shrink with the world size)");
  fixes.push_back(
      "a smaller --per_device_train_batch_size or --gradient_checkpointing (activations)");
  DS_THROW(
      "[ds_train] this run does not fit in memory: it needs ~{} on this node, {} is available "
      "({}). Options: {}. (--skip_memory_check runs anyway.)",
      mib(need), mib(available), breakdown, fmt::join(fixes, "; "));
}

}  // namespace ds::train

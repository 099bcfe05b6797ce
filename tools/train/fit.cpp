#include "fit.h"

#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "ds/core/error.h"
#include "ds/runtime/engine.h"
#include "ds/zero/partition.h"
#include "train_util.h"

namespace ds::train {

namespace {

int64_t model_state_bytes(int64_t params, int stage, DType train, DType grads, int world_size) {
  const auto plan = zero::plan_partitions(params, world_size);
  return zero::expected_model_state_bytes(stage, plan, train, grads, /*state_floats=*/2).total();
}

int64_t read_int_file(const char* path) {
  std::ifstream in(path);
  std::string s;
  if (!(in >> s) || s == "max") return 0;
  try {
    return std::stoll(s);
  } catch (...) {
    return 0;
  }
}

}  // namespace

FitPlan plan_fit(const models::GPTConfig& model, const runtime::DeepSpeedConfig& cfg,
                 int world_size, int ranks_on_node, int64_t activations) {
  FitPlan p;
  const int64_t P = model.num_parameters();
  p.model_states = model_state_bytes(P, cfg.zero_optimization.stage, cfg.training_dtype(),
                                     runtime::gradient_dtype(cfg), world_size);
  p.model_build = 4 * P;
  p.activations = activations;
  p.ranks_on_node = ranks_on_node;
  return p;
}

int64_t available_memory_bytes() {
  int64_t avail = 0;
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") {
      avail = kb * 1024;
      break;
    }
  // cgroup v2: a container's limit can be far below the machine's memory.
  const int64_t max = read_int_file("/sys/fs/cgroup/memory.max");
  const int64_t cur = read_int_file("/sys/fs/cgroup/memory.current");
  if (max > 0 && max - cur > 0 && (avail == 0 || max - cur < avail)) avail = max - cur;
  return avail;
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

std::string check_fit(const FitPlan& plan, int64_t available, const models::GPTConfig& model,
                      const runtime::DeepSpeedConfig& cfg, int world_size) {
  if (available <= 0) return "";
  const int64_t need = plan.per_node();
  const std::string breakdown = fmt::format(
      "{} per rank x {} rank{} on this node: model states {} (ZeRO stage {}, {}), the fp32 model "
      "built before partitioning {}, activations ~{}",
      mib(plan.model_states + plan.model_build + plan.activations), plan.ranks_on_node,
      plan.ranks_on_node > 1 ? "s" : "", mib(plan.model_states), cfg.zero_optimization.stage,
      dtype_name(cfg.training_dtype()), mib(plan.model_build), mib(plan.activations));
  if (need <= available) {
    if (need * 10 > available * 9)
      return fmt::format("warning: this run needs ~{} of the {} available ({}); it may not fit",
                         mib(need), mib(available), breakdown);
    return "";
  }
  // What would fit: a higher stage (same ranks), then bf16.
  std::vector<std::string> fixes;
  const int64_t P = model.num_parameters();
  for (int s = cfg.zero_optimization.stage + 1; s <= 3; ++s) {
    const int64_t states =
        model_state_bytes(P, s, cfg.training_dtype(), runtime::gradient_dtype(cfg), world_size);
    if ((states + plan.model_build + plan.activations) * plan.ranks_on_node <= available) {
      fixes.push_back(
          fmt::format("zero_optimization.stage {} ({} of model states per rank)", s, mib(states)));
      break;
    }
  }
  if (cfg.training_dtype() == DType::f32) {
    // bf16 keeps fp32 master weights and (by default) fp32 gradients: it only helps when sharding
    // spreads those over ranks.
    const int64_t states =
        model_state_bytes(P, cfg.zero_optimization.stage, DType::bf16, DType::f32, world_size);
    if ((states + plan.model_build + plan.activations) * plan.ranks_on_node <= available)
      fixes.push_back(
          fmt::format("bf16 training (--bf16; {} of model states per rank)", mib(states)));
  }
  fixes.push_back("more ranks on more nodes (the sharded states shrink with the world size)");
  fixes.push_back(
      "a smaller --per_device_train_batch_size or --gradient_checkpointing (activations)");
  DS_THROW(
      "[ds_train] this run does not fit in memory: it needs ~{} on this node, {} is available "
      "({}). "
      "Options: {}. (CPU/NVMe offload, which would move the states out of RAM, is not implemented "
      "yet; --skip_memory_check runs anyway.)",
      mib(need), mib(available), breakdown, fmt::join(fixes, "; "));
}

}  // namespace ds::train

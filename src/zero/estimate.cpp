// DeepSpeed's memory estimator (estimate.h). The arithmetic keeps DeepSpeed's order of operations
// and its int() truncations, so the printed numbers match to the last digit.
#include "ds/zero/estimate.h"

#include <algorithm>
#include <limits>
#include <set>

#include <fmt/format.h>

#include "ds/core/error.h"

namespace ds::zero {

MemorySpec deepspeed_estimator_spec(int stage, bool cpu_offload, bool cpu_offload_params) {
  MemorySpec s;
  s.stage = stage;
  s.param_dtype = DType::f16;
  // Stage 2 counts "16-bit grads 2 + fp32 grads 4 + fp32 params 4 + moments 8"; stage 3 counts
  // "fp32 param, grad, m, v" plus the 16-bit parameter, with no 16-bit gradient partition
  // (the comments of estimate_zero2/3_model_states_mem_needs in DeepSpeed's
  // deepspeed/runtime/zero/stage_1_and_2.py and stage3.py).
  s.grad_dtype = stage == 3 ? DType::f32 : DType::f16;
  s.state_floats = 2;
  s.whole_tensor_optimizer = true;  // DeepSpeed's fp32 gradient partition (its "fp32 grads 4")
  s.optimizer = cpu_offload ? OffloadTarget::cpu : OffloadTarget::none;
  s.params = cpu_offload_params ? OffloadTarget::cpu : OffloadTarget::none;
  return s;
}

namespace {

// The accelerator column: whole·P + int(sharded·P / T), DeepSpeed's order and truncation.
int64_t device_bytes(const PerElementBytes& e, int64_t P, int64_t total_gpus) {
  const PerElement d = e.device();
  return d.whole * P +
         static_cast<int64_t>(static_cast<double>(d.sharded * P) / static_cast<double>(total_gpus));
}

// Each local process builds the model in fp32 before it is partitioned (zero_init=0).
constexpr int64_t kFp32Build = 4;

}  // namespace

Estimate estimate_zero2(int64_t params, int gpus_per_node, int nodes, bool cpu_offload,
                        double abf) {
  const int64_t total_gpus = static_cast<int64_t>(nodes) * gpus_per_node;
  const auto P = params;
  const PerElementBytes e = per_element_bytes(deepspeed_estimator_spec(2, cpu_offload, false));
  const int64_t gpu = device_bytes(e, P, total_gpus);  // 2P + int(18P/T), or 2P offloaded
  double cpu = 0.0;
  if (cpu_offload) {
    // The host's 16 bytes per element counted for the whole model per node (DeepSpeed's formula
    // has neither 1/T nor 1/nodes here), or every process's fp32 build when larger.
    cpu = static_cast<double>(P * std::max<int64_t>(kFp32Build * total_gpus, e.host.sharded)) * abf;
  } else {
    cpu = static_cast<double>(P * kFp32Build * gpus_per_node) * abf;
  }
  return {static_cast<int64_t>(cpu), gpu};
}

Estimate estimate_zero3(int64_t params, int64_t largest_layer, int gpus_per_node, int nodes,
                        bool cpu_offload, bool cpu_offload_params, bool zero_init, double abf) {
  const int64_t total_gpus = static_cast<int64_t>(nodes) * gpus_per_node;
  const double gpus_factor = 1.0 / nodes;
  const auto P = params;
  const PerElementBytes e = per_element_bytes(
      deepspeed_estimator_spec(3, cpu_offload, cpu_offload && cpu_offload_params));
  // The largest layer gathered with its 16-bit gradient (4L), plus the device's shard.
  const int64_t gpu = e.gathered * largest_layer + device_bytes(e, P, total_gpus);
  double cpu = 0.0;
  // Python evaluates P * k * gpus_factor * abf left to right: an integer product, then floats.
  auto scaled = [&](double k) { return static_cast<double>(P) * k * abf; };
  if (cpu_offload) {
    // The host holds 16 bytes per element (18 with the parameters), P/nodes elements per node.
    const int64_t k = e.host.sharded;
    cpu = zero_init ? static_cast<double>(P * k) * gpus_factor * abf
                    : scaled(std::max(static_cast<double>(kFp32Build) * gpus_per_node,
                                      static_cast<double>(k) * gpus_factor));
  } else {
    cpu = zero_init ? static_cast<double>(largest_layer * kFp32Build * gpus_per_node) * abf
                    : static_cast<double>(P * kFp32Build * gpus_per_node) * abf;
  }
  return {static_cast<int64_t>(cpu), gpu};
}

namespace {

std::string header(int64_t params, int gpus_per_node, int nodes) {
  return fmt::format(
      "Estimated memory needed for params, optim states and gradients for a:\n"
      "HW: Setup with {} {}, {} {} per node.\n",
      nodes, nodes > 1 ? "nodes" : "node", gpus_per_node, gpus_per_node > 1 ? "GPUs" : "GPU");
}

// Python's int(x / 1e6) for the "M params" figures.
int64_t millions(int64_t n) {
  return static_cast<int64_t>(static_cast<double>(n) / 1e6);
}

std::string row(const Estimate& e, const std::string& options) {
  const double gib = static_cast<double>(int64_t{1} << 30);
  return fmt::format(" {:7.2f}GB | {:6.2f}GB | {}\n", static_cast<double>(e.cpu) / gib,
                     static_cast<double>(e.gpu) / gib, options);
}

}  // namespace

std::string zero2_table(int64_t params, int gpus_per_node, int nodes, double abf) {
  std::string out = header(params, gpus_per_node, nodes);
  out += fmt::format("SW: Model with {}M total params.\n", millions(params));
  out += "  per CPU  |  per GPU |   Options\n";
  for (bool offload : {true, false})
    out += row(estimate_zero2(params, gpus_per_node, nodes, offload, abf),
               fmt::format("offload_optimizer={}", offload ? "cpu " : "none"));
  return out;
}

std::string zero3_table(int64_t params, int64_t largest_layer, int gpus_per_node, int nodes,
                        double abf) {
  std::string out = header(params, gpus_per_node, nodes);
  out += fmt::format("SW: Model with {}M total params, {}M largest layer params.\n",
                     millions(params), millions(largest_layer));
  out += "  per CPU  |  per GPU |   Options\n";
  for (bool offload : {true, false})
    for (bool offload_params : {true, false}) {
      if (!offload && offload_params) continue;  // never estimated by DeepSpeed
      for (bool zero_init : {true, false})
        out += row(estimate_zero3(params, largest_layer, gpus_per_node, nodes, offload,
                                  offload_params, zero_init, abf),
                   fmt::format("offload_param={}, offload_optimizer={}, zero_init={}",
                               offload_params ? "cpu " : "none", offload ? "cpu " : "none",
                               zero_init ? 1 : 0));
    }
  return out;
}

NvmeEstimate estimate_nvme(int stage, bool params_on_nvme, int64_t params, int64_t largest_layer,
                           int gpus_per_node, int nodes, int64_t sub_group_size) {
  const int64_t T = static_cast<int64_t>(gpus_per_node) * nodes;
  DS_CHECK(T <= std::numeric_limits<int>::max(),
           "[ds_estimate] {} GPUs per node x {} nodes is more processes than the NVMe rows take; "
           "give at most {} in all",
           gpus_per_node, nodes, std::numeric_limits<int>::max());
  MemorySpec s;
  s.stage = stage;
  s.world_size = static_cast<int>(T);
  s.param_dtype = DType::bf16;
  s.grad_dtype = DType::f32;
  s.state_floats = 2;
  s.optimizer = OffloadTarget::nvme;
  s.sub_group_size = sub_group_size;
  if (params_on_nvme) {
    s.params = OffloadTarget::nvme;
    s.param_max_in_cpu = 0;  // every piece on disk
  }
  s.largest_layer = largest_layer;
  const RankMemory m = model_state_memory(s, params);
  NvmeEstimate e;
  e.ram = m.ram();
  e.disk = m.disk();
  // The optimizer state is read and written once per step; the parameter pieces are read in the
  // forward and again in the backward, and written after the step.
  e.read = m.disk_optimizer + 2 * m.disk_params;
  e.written = m.disk_optimizer + m.disk_params;
  // A checkpoint: the optimizer state again plus this process's share of the 16-bit weights.
  e.disk_with_checkpoint = e.disk + m.disk_optimizer + 2 * params / T;
  return e;
}

std::string nvme_table(int stage, int64_t params, int64_t largest_layer, int gpus_per_node,
                       int nodes, double read_bps, double write_bps, int64_t sub_group_size) {
  auto gb = [](int64_t b) { return fmt::format("{:8.2f}GB", static_cast<double>(b) / (1 << 30)); };
  std::string out =
      fmt::format(
          "deepspeed.cpp with NVMe offload (bf16, fp32 gradients, Adam, sub_group_size {}; "
          "per process; not a DeepSpeed estimate):\n",
          sub_group_size) +
      "    RAM    |    disk   | disk+ckpt |  moved/step | I/O s/step | Options\n";
  for (bool on_nvme : {false, true}) {
    if (on_nvme && stage < 3) continue;
    const NvmeEstimate e =
        estimate_nvme(stage, on_nvme, params, largest_layer, gpus_per_node, nodes, sub_group_size);
    const std::string secs =
        read_bps > 0 && write_bps > 0
            ? fmt::format("{:10.1f}", static_cast<double>(e.read) / read_bps +
                                          static_cast<double>(e.written) / write_bps)
            : fmt::format("{:>10}", "-");
    out += fmt::format(" {} | {} | {} | {}  | {} | offload_optimizer=nvme{}\n", gb(e.ram),
                       gb(e.disk), gb(e.disk_with_checkpoint), gb(e.read + e.written), secs,
                       on_nvme ? ", offload_param=nvme" : "");
  }
  return out;
}

ParameterCounts count_parameters(const nn::Module& model) {
  ParameterCounts c;
  for (const auto& [name, p] : model.named_parameters()) c.params += p.numel();  // tied once
  for (const auto& [name, m] : model.named_modules()) {
    int64_t own = 0;
    std::set<const void*> seen;  // a tensor registered twice in one module counts once
    for (const auto& [pname, p] : m->own_parameters())
      if (seen.insert(p.impl()).second) own += p.numel();
    c.largest_layer = std::max(c.largest_layer, own);
  }
  return c;
}

}  // namespace ds::zero

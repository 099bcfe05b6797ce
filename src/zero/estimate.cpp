// DeepSpeed's memory estimator (estimate.h). The arithmetic keeps DeepSpeed's order of operations
// and its int() truncations, so the printed numbers match to the last digit.
#include "ds/zero/estimate.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

namespace ds::zero {

Estimate estimate_zero2(int64_t params, int gpus_per_node, int nodes, bool cpu_offload,
                        double abf) {
  const int64_t total_gpus = static_cast<int64_t>(nodes) * gpus_per_node;
  const auto P = params;
  double cpu = 0.0;
  int64_t gpu = 0;
  if (cpu_offload) {
    gpu = 2 * P;
    cpu = static_cast<double>(P * std::max<int64_t>(4 * total_gpus, 16)) * abf;
  } else {
    // 2 = 16-bit params; 18 = 16-bit grads 2 + fp32 grads 4 + fp32 params 4 + moments 8.
    gpu =
        2 * P + static_cast<int64_t>(static_cast<double>(18 * P) / static_cast<double>(total_gpus));
    cpu = static_cast<double>(P * 4 * gpus_per_node) * abf;
  }
  return {static_cast<int64_t>(cpu), gpu};
}

Estimate estimate_zero3(int64_t params, int64_t largest_layer, int gpus_per_node, int nodes,
                        bool cpu_offload, bool cpu_offload_params, bool zero_init, double abf) {
  const int64_t total_gpus = static_cast<int64_t>(nodes) * gpus_per_node;
  const double gpus_factor = 1.0 / nodes;
  const int64_t largest_layer_memory = 4 * largest_layer;
  const auto P = params;
  double cpu = 0.0;
  int64_t gpu = 0;
  // Python evaluates P * k * gpus_factor * abf left to right: an integer product, then floats.
  auto scaled = [&](double k) { return static_cast<double>(P) * k * abf; };
  if (cpu_offload) {
    if (cpu_offload_params) {
      gpu = largest_layer_memory;
      cpu = zero_init ? static_cast<double>(P * 18) * gpus_factor * abf
                      : scaled(std::max(4.0 * gpus_per_node, 18 * gpus_factor));
    } else {
      gpu = largest_layer_memory +
            static_cast<int64_t>(static_cast<double>(2 * P) / static_cast<double>(total_gpus));
      cpu = zero_init ? static_cast<double>(P * 16) * gpus_factor * abf
                      : scaled(std::max(4.0 * gpus_per_node, 16 * gpus_factor));
    }
  } else {
    gpu = largest_layer_memory +
          static_cast<int64_t>(static_cast<double>(18 * P) / static_cast<double>(total_gpus));
    cpu = zero_init ? static_cast<double>(largest_layer * 4 * gpus_per_node) * abf
                    : static_cast<double>(P * 4 * gpus_per_node) * abf;
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
  const int64_t p = (params + T - 1) / T;  // this process's partition
  const int64_t ring = 4 * std::min(sub_group_size, p) * 12;
  NvmeEstimate e;
  const int64_t grads = (stage >= 2 ? p : params) * 4;
  if (params_on_nvme) {
    const int64_t read_ahead = std::min<int64_t>(500000000, p) * 2;
    e.ram = grads + ring + read_ahead + 2 * 2 * largest_layer;
    e.disk = 14 * p;
    e.read = 12 * p + 2 * 2 * p;
    e.written = 12 * p + 2 * p;
  } else {
    e.ram = (stage >= 3 ? p : params) * 2 + grads + ring;
    e.disk = 12 * p;
    e.read = 12 * p;
    e.written = 12 * p;
  }
  e.disk_with_checkpoint = e.disk + 12 * p + 2 * params / T;
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

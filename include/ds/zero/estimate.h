#pragma once
// DeepSpeed's memory estimator (estimate_zero2/3_model_states_mem_needs and their _all_cold
// tables; reference/deepspeed-behaviour.md §7, reference/offload.md §5), byte-exact, plus the
// parameter counts DeepSpeed's _all_live variants take from a model.
//
//   auto counts = zero::count_parameters(model);   // P (tied weights once), largest layer L
//   fmt::print("{}", zero::zero3_table(counts.params, counts.largest_layer, /*gpus=*/1,
//   /*nodes=*/1));
//
// Units are bytes. "GPU" is DeepSpeed's accelerator column: on this CPU build the training device's
// memory is host memory too, so a CPU-only run needs the sum of both columns per node (the table is
// printed as DeepSpeed prints it, for users comparing with it). abf ("additional_buffer_factor",
// default 1.5) scales the CPU column only, as in DeepSpeed. Pure functions.
#include <cstdint>
#include <string>

#include "ds/nn/module.h"

namespace ds::zero {

struct Estimate {
  int64_t cpu = 0;  // per node's host memory
  int64_t gpu = 0;  // per accelerator
};

// estimate_zero2_model_states_mem_needs(P, gpus_per_node, nodes, cpu_offload, abf).
Estimate estimate_zero2(int64_t params, int gpus_per_node, int nodes, bool cpu_offload,
                        double abf = 1.5);
// estimate_zero3_model_states_mem_needs(P, L, gpus_per_node, nodes, cpu_offload,
// cpu_offload_params, zero_init, abf).
Estimate estimate_zero3(int64_t params, int64_t largest_layer, int gpus_per_node, int nodes,
                        bool cpu_offload, bool cpu_offload_params, bool zero_init,
                        double abf = 1.5);

// The tables DeepSpeed's *_all_cold print (ZeRO-2: two rows, ZeRO-3: six), byte for byte, except
// that the offload device prints as "cpu " where Python 3.11 prints "OffloadDeviceEnum.cpu".
std::string zero2_table(int64_t params, int gpus_per_node, int nodes, double abf = 1.5);
std::string zero3_table(int64_t params, int64_t largest_layer, int gpus_per_node, int nodes,
                        double abf = 1.5);

// DeepSpeed's model_to_params: every parameter once (tied weights once) and the largest sum of one
// module's own (direct) parameters (an embedding or a Linear, not a block). Reads shapes only, so
// a model built under nn::PartitionedInit (nothing allocated) can be counted.
struct ParameterCounts {
  int64_t params = 0;
  int64_t largest_layer = 0;
};
ParameterCounts count_parameters(const nn::Module& model);

}  // namespace ds::zero

#pragma once
// DeepSpeed's memory estimator (estimate_zero2/3_model_states_mem_needs and their _all_cold
// tables, in DeepSpeed's deepspeed/runtime/zero/stage_1_and_2.py and stage3.py), byte-exact, plus
// the parameter counts DeepSpeed's _all_live variants take from a model. The bytes per element
// come from the one memory model (zero/memory_model.h) under DeepSpeed's assumptions
// (deepspeed_estimator_spec); DeepSpeed's own arithmetic (its abf, its fp32 build of the model per
// process, its float order and int() truncations) is kept around them.
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
#include "ds/zero/memory_model.h"

namespace ds::zero {

struct Estimate {
  int64_t cpu = 0;  // per node's host memory
  int64_t gpu = 0;  // per accelerator
};

// What DeepSpeed's estimator assumes of a run: fp16 parameters, Adam, "cpu" offload; stage 2 with
// 16-bit gradients and their fp32 copy (2P + 18P/T), stage 3 with fp32 gradient partitions only
// (18P/T), as the comments of its estimate_zero2/3_model_states_mem_needs count them.
// The spec's world size is left at 1: the bytes per element do not depend on it.
MemorySpec deepspeed_estimator_spec(int stage, bool cpu_offload, bool cpu_offload_params);

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

// Beyond DeepSpeed: this system's NVMe offload (zero/state_store.h, offload/param_file.h) for bf16
// training with fp32 gradients and Adam, per process (T = gpus_per_node * nodes ranks, p = P / T
// padded as zero/partition.h pads it), from zero::model_state_memory:
//
//   option                   RAM per process                        disk per process
//   optimizer on NVMe        params (stage 3: 2p, else 2P) + 4p     12p (master, exp_avg,
//                            grads (stage 2+) + swap ring             exp_avg_sq)
//                            (+ stage 3: 2 x 2L, the largest layer
//                            gathered with its gradient)
//   + parameters on NVMe     4p grads + swap ring + read-ahead      12p + 2p (bf16 pieces)
//     (stage 3)              + 2 x 2L
//
// with swap ring = buffer_count (4) x min(sub_group_size, p) x 12 bytes and read-ahead = min(5 x
// 1e8, p) x 2 bytes (DeepSpeed's defaults; the run clamps the ring to a quarter of free RAM).
// Moved per step: 12p read + 12p written (the optimizer state), plus 2p read twice (forward and
// backward gathers) and 2p written with the parameters on NVMe. A checkpoint needs another 12p +
// 2P/T on disk ("disk + checkpoint"). Time per step = read / read_bps + written / write_bps (the
// disk does one at a time); bandwidths <= 0 print "-".
struct NvmeEstimate {
  int64_t ram = 0, disk = 0, disk_with_checkpoint = 0, read = 0, written = 0;
};
NvmeEstimate estimate_nvme(int stage, bool params_on_nvme, int64_t params, int64_t largest_layer,
                           int gpus_per_node, int nodes, int64_t sub_group_size = 1000000000);
std::string nvme_table(int stage, int64_t params, int64_t largest_layer, int gpus_per_node,
                       int nodes, double read_bps, double write_bps,
                       int64_t sub_group_size = 1000000000);

// DeepSpeed's model_to_params: every parameter once (tied weights once) and the largest sum of one
// module's own (direct) parameters (an embedding or a Linear, not a block). Reads shapes only, so
// a model built under nn::PartitionedInit (nothing allocated) can be counted.
struct ParameterCounts {
  int64_t params = 0;
  int64_t largest_layer = 0;
};
ParameterCounts count_parameters(const nn::Module& model);

}  // namespace ds::zero

#pragma once
// "Will it fit": before ds_train builds the model, the model states each rank will hold for the
// chosen ZeRO stage, precision, offload and world size (zero/memory_model.h, the one model the
// engine's accounting and ds_estimate share), the fp32 model built whole before the engine
// partitions it, and the activation estimate, summed over this node's ranks and compared with the
// memory this process may use (MemAvailable, or the cgroup limit when lower). A run that cannot
// fit stops with the shortfall and the changes that would make it fit, instead of being killed by
// the OOM killer minutes later.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "ds/config/config.h"

namespace ds::train {

struct FitPlan {
  int64_t model_states = 0;     // per rank in RAM, stage's sharding, after offload
  int64_t model_build = 0;      // per rank: the fp32 model (or its piece) built before sharding
  int64_t activations = 0;      // per rank, estimate
  int64_t offload_buffers = 0;  // per rank: NVMe swap and read-ahead buffers (in model_states)
  int64_t nvme = 0;             // per rank on disk (offload_optimizer / offload_param "nvme")
  std::string nvme_path;        // where that goes (the optimizer's path, else the parameters')
  int ranks_on_node = 1;
  // LoRA (docs/finetuning.md): elements the LoRA matrices add, and the frozen elements, which
  // take the training dtype's bytes on every rank and nothing else.
  int64_t lora_params = 0, frozen = 0;
  int64_t per_node() const { return (model_states + model_build + activations) * ranks_on_node; }
  int64_t nvme_per_node() const { return nvme * ranks_on_node; }
};

// `model_params`: the whole model's parameter count, of any kind (GPTConfig::num_parameters, an
// encoder classifier's or encoder-decoder's). `partitioned_build`: stage 3 builds each rank's piece only (nn::PartitionedInit), never the
// whole fp32 model. Offload (zero/state_store.h, zero/offload/) moves master weights, moments and
// stage-3 parameter pieces to disk and adds its buffers. `lora_params` and `frozen` (elements,
// e.g. from train::count_lora): the ZeRO formulas then apply to the trainable elements
// (model + lora_params - frozen) only, and the frozen ones cost the training dtype's bytes.
// `model_parallel` = tp × pp: each rank holds about 1/model_parallel of the parameters (its
// tensor slices of its stage's layers) before ZeRO shards them over `world_size` data-parallel
// ranks; the estimate divides evenly (replicated norms and uneven stages make it a few percent
// low for the largest part: bench/RESULTS.md, "Memory per rank").
FitPlan plan_fit(int64_t model_params, const config::DeepSpeedConfig& cfg,
                 int world_size, int ranks_on_node, int64_t activations,
                 bool partitioned_build = false, int64_t lora_params = 0, int64_t frozen = 0,
                 int model_parallel = 1);

// A GPU run (--device cuda; ZeRO-Offload's layout: docs/cuda.md). What one rank's GPU holds and
// what its host memory holds, in bytes: its 1/model_parallel of the model (tensor x pipeline
// parallel), its ZeRO partition of the optimizer state over data_parallel ranks; stage 3 keeps
// only the gathered parameters on the device.
struct GpuFitPlan {
  int64_t params = 0;       // the working parameters, in the training dtype
  int64_t grads = 0;        // the flat gradients (accumulation dtype), and stage 2's partition
  int64_t activations = 0;  // estimate (the CPU run's: the same tensors)
  int64_t host_states = 0;  // fp32 master weights, Adam moments, the page-locked staging
  int64_t host_build = 0;   // the fp32 model built on the host before it moves to the GPU
  int64_t device() const { return params + grads + activations; }
  int64_t host() const { return std::max(host_states, host_build); }
};
GpuFitPlan plan_fit_gpu(int64_t model_params, const config::DeepSpeedConfig& cfg,
                        int64_t activations, int64_t lora_params = 0, int64_t frozen = 0,
                        int data_parallel = 1, int model_parallel = 1);

// Throws "[ds_train] this run does not fit on <device>: ..." naming the need, what is available
// (`device_available`: the card's free memory, or --device_memory_limit when lower) and what
// would fit (bf16, 16-bit gradients, gradient checkpointing, a smaller batch), or "... in host
// memory ..." when `host_available` (0 = unknown) is short; returns a warning line when either
// is within 10%; "" otherwise. device_available 0 = unknown: no device check.
std::string check_fit_gpu(const GpuFitPlan& plan, int64_t device_available,
                          int64_t host_available, const std::string& device,
                          const config::DeepSpeedConfig& cfg);

// Bytes this process may still allocate: min(MemAvailable, cgroup memory.max - memory.current);
// 0 when unknown.
int64_t available_memory_bytes();

// Ranks of this job on this node (OMPI_COMM_WORLD_LOCAL_SIZE / LOCAL_SIZE), 1 when unknown.
int local_ranks();

// Throws "[ds_train] ... does not fit ..." naming the need, what is available and the ZeRO stage,
// precision or NVMe offload (with the disk it needs) that would fit, when plan.per_node() exceeds
// `available`, or when the NVMe offload needs more disk than nvme_path's filesystem has; returns
// a warning line when RAM is within 10% of it; "" otherwise. available 0 = unknown: no RAM check.
// `scratch_dir`: where an NVMe suggestion measures free disk (the output folder).
std::string check_fit(const FitPlan& plan, int64_t available, int64_t model_params,
                      const config::DeepSpeedConfig& cfg, int world_size,
                      const std::string& scratch_dir = ".");

}  // namespace ds::train

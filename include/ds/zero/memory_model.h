#pragma once
// The one memory model of ZeRO's model states: the bytes each rank holds of working parameters,
// gradients, fp32 master weights, optimizer moments and the fp32 copy of 16-bit gradients, in
// RAM (the training device's memory) and where offload puts them, for a stage, precision,
// optimizer, offload and world size. Everything that predicts memory asks it:
//
//   ds_train's will-it-fit check     train::plan_fit (src/train/fit.cpp)
//   ds_estimate, DeepSpeed's tables  zero::estimate_zero2/3 take its per-element bytes
//   ds_estimate, the NVMe rows       zero::estimate_nvme
//   memory.json's "paper" row        zero::expected_model_state_bytes
// and the engines agree with it: tests/test_memory_model.cpp compares it with Strategy::memory()
// and the optimizer state of real engines at stages 0-3, one and two ranks (byte for byte in RAM;
// NVMe offload within one sub-group, which the store rounds to whole, aligned slots).
//
// The ZeRO paper's form: a state of b bytes per element is held either for every element
// ("whole", b·P per rank) or for this rank's 1/N of them ("sharded", b·P/N):
//
//   state             bytes per element                whole at stage   sharded at stage
//   params            training dtype (2 or 4)          0, 1, 2          3
//   grads             accumulation dtype (2 or 4)      0, 1             2, 3
//   master weights    4 when params are 16-bit         0                1, 2, 3
//   moments           4 x state_floats (Adam: 8)       0                1, 2, 3
//   grad copy         4 when grads are 16-bit          0                1, 2, 3
//
// Model states (all but the grad copy), stages 0-3: fp32 Adam 16P, 8P + 8P/N, 4P + 12P/N, 16P/N;
// bf16 with fp32 gradients (our default) 18P, 6P + 12P/N, 2P + 16P/N, 18P/N; fp16 (16-bit
// gradients) 16P, 4P + 12P/N, 2P + 14P/N, 16P/N, plus 4P (stage 0) or 4P/N of grad copy. Exact
// counts add the padding zero/partition.h describes (stages 0-2: the flat buffer rounded to 16·N
// elements; stage 3: each parameter to a multiple of N, the shard to 16), stage 3's persistent
// parameters, which every rank keeps whole, and frozen parameters (LoRA's base: the training
// dtype's bytes, whole on every rank, nothing else).
//
// Offload moves states off the training device:
//   "cpu" (DeepSpeed's ZeRO-Offload on an accelerator): master weights, moments and the gradients
//     live on the host, the gradients as fp32 (DeepSpeed reduces each bucket straight into the
//     host's fp32 partition, deepspeed/runtime/zero/stage_1_and_2.py, so from stage 2 on no
//     gradient stays on the device); with offload_param "cpu" (stage 3) the parameter pieces too.
//     The engine keeps optimizer state in host memory in every run, so it ignores "cpu"
//     (train::plan_fit models it as "none"); a GPU model (docs/cuda.md) is laid out like this.
//   "nvme" (this system's ZeRO-Infinity, zero/state_store.h, zero/offload/param_file.h): master
//     weights (also in fp32 training once the parameters leave RAM) and moments go to disk, `ratio`
//     of them, through a RAM ring of buffer_count sub-groups; gradients stay in RAM in their dtype
//     and no fp32 copy is made (the store widens one sub-group at a time). offload_param "nvme":
//     stage 3's pieces beyond max_in_cpu go to disk, read through buffer_count x buffer_size
//     elements of read-ahead.
//
// Pure functions; no allocation beyond the result.
#include <cstdint>
#include <span>

#include "ds/core/dtype.h"
#include "ds/zero/partition.h"

namespace ds::zero {

struct Options;  // zero/strategy.h

enum class OffloadTarget { none, cpu, nvme };

// What the model needs to know about a run. Sizes are elements.
struct MemorySpec {
  int stage = 0;
  int world_size = 1;              // data-parallel ranks the states are sharded over
  DType param_dtype = DType::f32;  // the training dtype
  DType grad_dtype = DType::f32;   // the gradient accumulation dtype
  int state_floats = 2;            // fp32 optimizer values per element (Adam 2, SGD 0 or 1)
  // Lamb and SGD step whole tensors, so 16-bit gradients get an fp32 copy for them; Adam/AdamW
  // read 16-bit gradients a chunk at a time (zero::Strategy::step_16bit_gradients).
  bool whole_tensor_optimizer = false;
  OffloadTarget optimizer = OffloadTarget::none;  // offload_optimizer.device
  OffloadTarget params = OffloadTarget::none;     // offload_param.device (stage 3 only)
  // NVMe offload (zero::NvmeOffloadOptions, zero::NvmeParamOffloadOptions; DeepSpeed's defaults).
  double optimizer_ratio = 1.0;  // fraction of the optimizer state on disk
  int64_t optimizer_buffer_count = 4;
  int64_t sub_group_size = 1000000000;
  int64_t param_max_in_cpu = 1000000000;
  int64_t param_buffer_count = 5, param_buffer_size = 100000000;
  // Stage 3: parameters with at most this many elements are kept whole on every rank.
  int64_t persistence_threshold = 100000;
  // Stage 3: the largest module's own parameters, gathered whole with their gradient during its
  // backward (DeepSpeed's "largest layer"); 0 leaves that working set out.
  int64_t largest_layer = 0;
};

// The spec of an engine's strategy options (what runtime::zero_options makes of a config).
MemorySpec memory_spec(const Options& options, int world_size, int state_floats);

// Bytes per element of one state: `whole` for every element, `sharded` for this rank's 1/N.
struct PerElement {
  int64_t whole = 0, sharded = 0;
  PerElement& operator+=(const PerElement& o) {
    whole += o.whole;
    sharded += o.sharded;
    return *this;
  }
};

// The table above for a spec: what stays on the training device (RAM here), what "cpu" offload
// moves to the host and what "nvme" offload moves to disk. The persistent parameters, padding,
// the NVMe ring and read-ahead buffers and the parts offload keeps in RAM (ratio < 1, max_in_cpu)
// are not per-element terms: model_state_memory adds them.
struct PerElementBytes {
  PerElement params, grads, master_weights, moments, grad_copy;  // on the training device
  PerElement host;                                               // on the host ("cpu" offload)
  PerElement disk_optimizer;  // optimizer state on NVMe (before ratio)
  PerElement disk_params;     // stage-3 pieces on NVMe (before max_in_cpu)
  int64_t gathered = 0;       // stage 3: bytes per element of the largest layer gathered
  PerElement device() const {
    PerElement t = params;
    t += grads;
    t += master_weights;
    t += moments;
    t += grad_copy;
    return t;
  }
};
PerElementBytes per_element_bytes(const MemorySpec& spec);

// Bytes one rank holds, after offload. ram() is what lives in RAM (the training device's memory
// on an accelerator build); `host` is on the host under "cpu" offload, disk() on NVMe.
struct RankMemory {
  int64_t params = 0;            // working parameters: shard + persistent (+ frozen), in RAM
  int64_t grads = 0;             // gradient buffers (accumulation dtype)
  int64_t master_weights = 0;    // fp32 master weights in RAM (0 when the params are the master)
  int64_t optimizer_states = 0;  // moments in RAM, plus the NVMe store's ring of swap buffers
  int64_t grad_copy = 0;         // fp32 copy of 16-bit gradients a whole-tensor optimizer reads
  int64_t buffers = 0;           // NVMe swap ring and parameter read-ahead (within the above)
  int64_t gathered = 0;          // stage 3: the largest layer gathered with its gradient
  int64_t host = 0;              // on the host ("cpu" offload)
  int64_t disk_optimizer = 0;    // on NVMe: master weights and moments (ratio of them)
  int64_t disk_params = 0;       // on NVMe: stage-3 parameter pieces beyond max_in_cpu
  int64_t disk() const { return disk_optimizer + disk_params; }
  // Model states in RAM, as Engine::memory_budget().total() counts them (no grad copy).
  int64_t model_states() const { return params + grads + master_weights + optimizer_states; }
  int64_t ram() const { return model_states() + grad_copy + gathered; }
};

// From counts: `trainable` elements (tied weights once), `frozen` elements (LoRA's base: whole on
// every rank in the training dtype, nothing else). Stage 3 is then approximated as one tensor
// (no per-parameter padding, no persistent parameters).
RankMemory model_state_memory(const MemorySpec& spec, int64_t trainable, int64_t frozen = 0);
// From the trainable parameters' sizes, in order: stage 3 exact (each parameter padded to a
// multiple of N, persistent parameters whole, as src/zero/stage3.cpp lays them out).
RankMemory model_state_memory(const MemorySpec& spec, std::span<const int64_t> trainable_numels,
                              int64_t frozen = 0);

// The ZeRO paper's model states for stages 0-2 and stage 3 as one tensor (docs/zero.md's table):
// model_state_memory without offload, by kind.
struct ModelStateBytes {
  int64_t params = 0, grads = 0, master_weights = 0, optimizer_states = 0;
  int64_t total() const { return params + grads + master_weights + optimizer_states; }
};
ModelStateBytes expected_model_state_bytes(int stage, const PartitionPlan& plan, DType param_dtype,
                                           DType grad_dtype, int state_floats);

}  // namespace ds::zero

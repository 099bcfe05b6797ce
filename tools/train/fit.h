#pragma once
// "Will it fit": before ds_train builds the model, the model states each rank will hold for the
// chosen ZeRO stage, precision and world size (the ZeRO paper's bytes, zero/partition.h), the
// fp32 model built whole before the engine partitions it, and the activation estimate, summed over
// this node's ranks and compared with the memory this process may use (MemAvailable, or the cgroup
// limit when lower). A run that cannot fit stops with the shortfall and the changes that would
// make it fit, instead of being killed by the OOM killer minutes later.
#include <cstdint>
#include <string>
#include <vector>

#include "ds/models/gpt.h"
#include "ds/runtime/config.h"

namespace ds::train {

struct FitPlan {
  int64_t model_states = 0;  // per rank, stage's sharding
  int64_t model_build = 0;   // per rank: the fp32 model built whole before the engine shards it
  int64_t activations = 0;   // per rank, estimate
  int ranks_on_node = 1;
  int64_t per_node() const { return (model_states + model_build + activations) * ranks_on_node; }
};

FitPlan plan_fit(const models::GPTConfig& model, const runtime::DeepSpeedConfig& cfg,
                 int world_size, int ranks_on_node, int64_t activations);

// Bytes this process may still allocate: min(MemAvailable, cgroup memory.max - memory.current);
// 0 when unknown.
int64_t available_memory_bytes();

// Ranks of this job on this node (OMPI_COMM_WORLD_LOCAL_SIZE / LOCAL_SIZE), 1 when unknown.
int local_ranks();

// Throws "[ds_train] ... does not fit ..." naming the need, what is available and the ZeRO stage
// (or precision) that would fit, when plan.per_node() exceeds `available`; returns a warning line
// when it is within 10% of it; "" otherwise. available 0 = unknown: no check.
std::string check_fit(const FitPlan& plan, int64_t available, const models::GPTConfig& model,
                      const runtime::DeepSpeedConfig& cfg, int world_size);

}  // namespace ds::train

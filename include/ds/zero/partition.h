#pragma once
// ZeRO's arithmetic on offsets (stages 1 and 2): how a flat buffer is padded and cut into one
// contiguous partition per rank, and how gradient buckets are laid over it (the bytes per rank
// this implies: zero/memory_model.h). Pure functions: the sharding logic is tested in one process by
// constructing ranks 0..N-1.
#include <cstdint>
#include <vector>

#include "ds/nn/flat.h"

namespace ds::zero {

// Partitions are padded so that each one starts 64-byte aligned in fp32 (16 elements) and the
// total is a multiple of 2N as in DeepSpeed: padded = round_up(numel, N * 16).
inline constexpr int64_t kPartitionAlignment = 16;
int64_t padding_multiple(int world_size);

struct PartitionPlan {
  int world_size = 1;
  int64_t numel = 0;         // unpadded elements
  int64_t padded_numel = 0;  // a multiple of padding_multiple(world_size)
  int64_t partition_numel = 0;  // padded_numel / world_size
  int64_t begin(int rank) const { return rank * partition_numel; }
  int64_t end(int rank) const { return (rank + 1) * partition_numel; }
};
PartitionPlan plan_partitions(int64_t numel, int world_size);

// A contiguous range of the flat gradient buffer reduced as one message, and the parameters that
// write into it. Buckets are laid from the end of the buffer, since backward produces the last
// layers' gradients first.
struct Bucket {
  int64_t begin = 0, end = 0;
  std::vector<int> params;  // indices into the flat entries overlapping [begin, end)
};
std::vector<Bucket> plan_buckets(const std::vector<nn::FlatEntry>& entries, int64_t padded_numel,
                                 int64_t bucket_numel);

}  // namespace ds::zero

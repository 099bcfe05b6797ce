#include "ds/zero/partition.h"

#include <algorithm>

#include "ds/core/error.h"

namespace ds::zero {

int64_t padding_multiple(int world_size) {
  return static_cast<int64_t>(world_size) * kPartitionAlignment;
}

PartitionPlan plan_partitions(int64_t numel, int world_size) {
  DS_CHECK(world_size >= 1, "[zero] world size must be >= 1, got {}", world_size);
  PartitionPlan p;
  p.world_size = world_size;
  p.numel = numel;
  const int64_t m = padding_multiple(world_size);
  p.padded_numel = std::max<int64_t>(m, (numel + m - 1) / m * m);
  p.partition_numel = p.padded_numel / world_size;
  return p;
}

std::vector<Bucket> plan_buckets(const std::vector<nn::FlatEntry>& entries, int64_t padded_numel,
                                 int64_t bucket_numel) {
  DS_CHECK(bucket_numel > 0, "[zero] reduce_bucket_size must be > 0, got {}", bucket_numel);
  std::vector<Bucket> buckets;
  for (int64_t end = padded_numel; end > 0; end -= bucket_numel) {
    Bucket b;
    b.end = end;
    b.begin = std::max<int64_t>(0, end - bucket_numel);
    for (size_t i = 0; i < entries.size(); ++i) {
      const auto& e = entries[i];
      if (e.numel > 0 && e.offset < b.end && e.offset + e.numel > b.begin)
        b.params.push_back(static_cast<int>(i));
    }
    buckets.push_back(std::move(b));
  }
  return buckets;
}

}  // namespace ds::zero

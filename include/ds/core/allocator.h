#pragma once
// The caching allocator. Tensor memory is never returned to the system during training: freed
// blocks are cached and handed out again, so after the first training step every allocation is a
// cache hit (a "miss" is a call to the system allocator). The policy (ds/core/block_pool.h) is
// shared by the host, sim and CUDA allocators: blocks are carved out of 2 MiB-aligned segments by
// best fit, split and merged with free neighbours (as PyTorch's CUDA caching allocator), small
// (<= 1 MiB) and large requests in separate segments, so memory freed as one size serves another.
// Host segments are advised to use huge pages: first-touching fresh 4 KiB pages costs ~2.4 GB/s
// on our machines, which would otherwise dominate a step (docs/architecture.md).
#include <cstddef>
#include <cstdint>
#include <memory>

namespace ds {

struct AllocatorStats {
  uint64_t allocations = 0;    // calls to allocate()
  uint64_t misses = 0;         // allocations that went to the system allocator
  uint64_t bytes_in_use = 0;   // handed out and not yet freed (whole blocks)
  uint64_t peak_bytes_in_use = 0;
  uint64_t bytes_reserved = 0;  // obtained from the system: in use + cached (+ rounding)
  uint64_t peak_bytes_reserved = 0;
  // Free bytes inside segments that also hold a block in use: they serve only requests that
  // fit them and cannot go back to the system (PyTorch's inactive_split_bytes): fragmentation.
  uint64_t bytes_inactive_split = 0;
  uint64_t segments = 0;  // segments obtained from the system and not yet returned
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;  // 64-byte aligned; nbytes may be 0
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  virtual AllocatorStats stats() const = 0;
  virtual void reset_peak() = 0;  // both peaks restart from the current values
  virtual void empty_cache() = 0;  // return cached blocks to the system
};

Allocator& cpu_allocator();  // the process's allocator (every CPU tensor)
// A separate pool with the same policy (tests, tools that want their own statistics).
std::unique_ptr<Allocator> new_caching_cpu_allocator();

}  // namespace ds

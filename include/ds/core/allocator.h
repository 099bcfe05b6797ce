#pragma once
// The caching allocator. Tensor memory is never returned to the system during training: freed
// blocks go to per-size-class free lists and are handed out again, so after the first training step
// every allocation is a cache hit (a "miss" is a call to the system allocator). Large blocks are
// 2 MiB aligned and advised to use huge pages: first-touching fresh 4 KiB pages costs ~2.4 GB/s on
// our machines, which would otherwise dominate a step (reference/machine.md).
#include <cstddef>
#include <cstdint>

namespace ds {

struct AllocatorStats {
  uint64_t allocations = 0;    // calls to allocate()
  uint64_t misses = 0;         // allocations that went to the system allocator
  uint64_t bytes_in_use = 0;   // handed out and not yet freed (size-class rounded)
  uint64_t peak_bytes_in_use = 0;
  uint64_t bytes_reserved = 0;  // in use + cached
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;  // 64-byte aligned; nbytes may be 0
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  virtual AllocatorStats stats() const = 0;
  virtual void reset_peak() = 0;
  virtual void empty_cache() = 0;  // return cached blocks to the system
};

Allocator& cpu_allocator();

}  // namespace ds

// The host's caching allocator (ds/core/allocator.h): the shared pool (ds/core/block_pool.h) over
// aligned_alloc.
#include "ds/core/allocator.h"

#include <sys/mman.h>

#include <cstdlib>

#include "ds/core/block_pool.h"
#include "ds/core/error.h"

namespace ds {
namespace {

class HostMemory final : public SystemMemory {
 public:
  void* allocate(size_t nbytes, size_t align) override {
    void* p = std::aligned_alloc(align, nbytes);
    // Segments (2 MiB multiples) on huge pages: first-touching 4 KiB pages would dominate a step.
    if (p) madvise(p, nbytes, MADV_HUGEPAGE);
    return p;
  }
  void release(void* p, size_t) override { std::free(p); }
  [[noreturn]] void out_of_memory(size_t nbytes, const AllocatorStats& s) override {
    DS_THROW("[allocator] out of host memory allocating {:.1f} MiB ({:.1f} MiB in use); reduce the "
             "micro-batch size or enable ZeRO / offload",
             nbytes / 1048576.0, s.bytes_in_use / 1048576.0);
  }
};

}  // namespace

std::unique_ptr<Allocator> new_caching_cpu_allocator() {
  return std::make_unique<PooledAllocator>(std::make_unique<HostMemory>(), true);
}

Allocator& cpu_allocator() {
  // Leaked on purpose: tensors in static objects may be destroyed after this would be.
  static auto* a = new PooledAllocator(std::make_unique<HostMemory>(), true);
  return *a;
}

}  // namespace ds

#include "ds/core/allocator.h"

#include <sys/mman.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <vector>

#include "ds/core/error.h"

namespace ds {
namespace {

constexpr size_t kSmallQuantum = 512;            // below 1 MiB, sizes round up to 512 B
constexpr size_t kLargeQuantum = 2u << 20;       // from 1 MiB, to 2 MiB (one huge page)
constexpr size_t kLargeThreshold = 1u << 20;

size_t size_class(size_t n) {
  if (n == 0) n = 1;
  const size_t q = n < kLargeThreshold ? kSmallQuantum : kLargeQuantum;
  return (n + q - 1) / q * q;
}

// Free blocks are kept per exact size class, so a step that allocates the same sizes as the step
// before is served entirely from the cache. Blocks are never split or merged: simple, and training
// steps repeat their allocation pattern exactly.
class CachingCpuAllocator final : public Allocator {
 public:
  ~CachingCpuAllocator() override { empty_cache(); }

  void* allocate(size_t nbytes) override {
    const size_t cls = size_class(nbytes);
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.allocations;
    stats_.bytes_in_use += cls;
    if (stats_.bytes_in_use > stats_.peak_bytes_in_use)
      stats_.peak_bytes_in_use = stats_.bytes_in_use;
    auto it = free_.find(cls);
    if (it != free_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      return p;
    }
    ++stats_.misses;
    const size_t align = cls >= kLargeThreshold ? kLargeQuantum : 64;
    void* p = std::aligned_alloc(align, cls);
    if (!p) {
      // Give cached memory back and retry once before failing.
      release_cached_locked();
      p = std::aligned_alloc(align, cls);
    }
    if (!p) {
      stats_.bytes_in_use -= cls;
      DS_THROW("[allocator] out of host memory allocating {:.1f} MiB ({:.1f} MiB in use); "
               "reduce the micro-batch size or enable ZeRO / offload",
               cls / 1048576.0, stats_.bytes_in_use / 1048576.0);
    }
    if (cls >= kLargeThreshold) madvise(p, cls, MADV_HUGEPAGE);
    stats_.bytes_reserved += cls;
    return p;
  }

  void deallocate(void* p, size_t nbytes) override {
    if (!p) return;
    const size_t cls = size_class(nbytes);
    std::lock_guard<std::mutex> lock(mu_);
    stats_.bytes_in_use -= cls;
    free_[cls].push_back(p);
  }

  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_bytes_in_use = stats_.bytes_in_use;
  }

  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mu_);
    release_cached_locked();
  }

 private:
  void release_cached_locked() {
    for (auto& [cls, blocks] : free_) {
      for (void* p : blocks) std::free(p);
      stats_.bytes_reserved -= cls * blocks.size();
      blocks.clear();
    }
  }

  mutable std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;
  AllocatorStats stats_;
};

}  // namespace

Allocator& cpu_allocator() {
  // Leaked on purpose: tensors in static objects may be destroyed after this would be.
  static auto* a = new CachingCpuAllocator();
  return *a;
}

}  // namespace ds

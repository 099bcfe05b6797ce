// The caching device allocator (cuda_backend.h). cudaMalloc and cudaFree synchronise the device and
// cost tens of microseconds, so freed blocks are kept, keyed by size, and handed out again.
//
// Sizes are rounded up (512 bytes below 1 MiB, 2 MiB above) so that the activations of one step
// land on the blocks the previous step freed. A request takes the smallest cached block that fits
// and is at most twice its size (larger ones stay for larger requests). Blocks are never split;
// PyTorch's allocator splits segments, which saves memory under fragmentation, and is the next step
// if a model's peak shows that waste.
//
// Threading: one mutex; allocate and deallocate are called from any host thread.
#include <map>
#include <mutex>
#include <unordered_map>

#include "backend/cuda/cuda_backend.h"
#include "ds/core/error.h"

namespace ds::backend {
namespace {

constexpr size_t kSmall = size_t{1} << 20;
constexpr size_t kSmallRound = 512;
constexpr size_t kLargeRound = size_t{2} << 20;

size_t round_size(size_t n) {
  if (n == 0) n = 1;
  const size_t r = n < kSmall ? kSmallRound : kLargeRound;
  return (n + r - 1) / r * r;
}

std::string gib(uint64_t bytes) {
  return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
}

class CudaCachingAllocator final : public Allocator {
 public:
  CudaCachingAllocator(int device, const std::atomic<uint64_t>& limit)
      : device_(device), limit_(limit) {}
  ~CudaCachingAllocator() override = default;  // the driver frees device memory at exit

  void* allocate(size_t nbytes) override {
    const size_t size = round_size(nbytes);
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.allocations;
    void* p = nullptr;
    auto it = cached_.lower_bound(size);
    if (it != cached_.end() && it->first <= 2 * size) {
      p = it->second;
      live_[p] = it->first;
      stats_.bytes_in_use += it->first;
      cached_.erase(it);
    } else {
      p = device_malloc(size);
      live_[p] = size;
      stats_.bytes_in_use += size;
      stats_.bytes_reserved += size;
      ++stats_.misses;
    }
    stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
    return p;
  }

  void deallocate(void* p, size_t) override {
    if (!p) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(p);
    if (it == live_.end()) return;  // not ours: nothing to do (never happens for owned storage)
    stats_.bytes_in_use -= it->second;
    cached_.emplace(it->second, p);
    live_.erase(it);
  }

  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peak_bytes_in_use = stats_.bytes_in_use;
  }

  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mutex_);
    release_cached();
  }

 private:
  void release_cached() {
    if (cached_.empty()) return;
    CudaDeviceGuard guard(device_);
    for (auto& [size, p] : cached_) {
      cudaFree(p);
      stats_.bytes_reserved -= size;
    }
    cached_.clear();
  }

  void* device_malloc(size_t size) {
    CudaDeviceGuard guard(device_);
    void* p = nullptr;
    if (const uint64_t limit = limit_.load(); limit > 0 && stats_.bytes_reserved + size > limit) {
      release_cached();  // what the cache holds may be enough
      if (stats_.bytes_reserved + size > limit)
        DS_THROW("[cuda:{}] out of memory allocating {}: the process's device memory limit is {} "
                 "(--device_memory_limit) and {} is in use by tensors, {} reserved. Lower the "
                 "micro-batch size, turn on activation checkpointing, or raise the limit",
                 device_, gib(size), gib(limit), gib(stats_.bytes_in_use),
                 gib(stats_.bytes_reserved));
    }
    cudaError_t err = cudaMalloc(&p, size);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      release_cached();  // what the cache holds may be enough
      err = cudaMalloc(&p, size);
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      DS_THROW("[cuda:{}] out of memory allocating {} ({}): {} in use by tensors, {} reserved by "
               "this process, {} free of {} on the device. Lower the micro-batch size, turn on "
               "activation checkpointing, or offload the optimizer state "
               "(zero_optimization.offload_optimizer.device: cpu)",
               device_, gib(size), cudaGetErrorString(err), gib(stats_.bytes_in_use),
               gib(stats_.bytes_reserved), gib(free_b), gib(total_b));
    }
    return p;
  }

  int device_;
  const std::atomic<uint64_t>& limit_;  // the backend's set_memory_limit(); 0 = none
  mutable std::mutex mutex_;
  std::multimap<size_t, void*> cached_;     // size -> free block
  std::unordered_map<void*, size_t> live_;  // handed-out block -> its (rounded) size
  AllocatorStats stats_;
};

}  // namespace

std::unique_ptr<Allocator> new_cuda_caching_allocator(int device,
                                                      const std::atomic<uint64_t>& limit) {
  return std::make_unique<CudaCachingAllocator>(device, limit);
}

}  // namespace ds::backend

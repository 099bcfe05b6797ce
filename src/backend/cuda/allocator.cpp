// The caching device allocator (cuda_backend.h): the library's pool (ds/core/block_pool.h: small
// blocks cached by size, large ones split out of segments and merged back, as PyTorch's CUDA
// caching allocator) over cudaMalloc, which synchronises the device and costs tens of
// microseconds, so that a training step after the first calls it no more.
//
// The memory limit (--device_memory_limit) caps what the pool reserves: a cudaMalloc that would
// cross it is answered "none left", the pool returns its cache and asks once more, then the
// out-of-memory error names the limit. A real cudaMalloc failure takes the same path.
//
// Threading: the pool's mutex (PooledAllocator); allocate and deallocate from any host thread.
#include "backend/cuda/cuda_backend.h"
#include "ds/core/block_pool.h"
#include "ds/core/error.h"

namespace ds::backend {
namespace {

std::string gib(uint64_t bytes) {
  return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
}

class CudaMemory final : public SystemMemory {
 public:
  CudaMemory(int device, const std::atomic<uint64_t>& limit) : device_(device), limit_(limit) {}

  void* allocate(size_t nbytes, size_t) override {  // cudaMalloc aligns to 256 B at least
    limited_ = false;
    if (const uint64_t limit = limit_.load(); limit > 0 && reserved_ + nbytes > limit) {
      limited_ = true;
      return nullptr;
    }
    CudaDeviceGuard guard(device_);
    void* p = nullptr;
    last_error_ = cudaMalloc(&p, nbytes);
    if (last_error_ != cudaSuccess) {
      cudaGetLastError();  // clear it, so that the next CUDA call does not report it
      return nullptr;
    }
    reserved_ += nbytes;
    return p;
  }

  void release(void* p, size_t nbytes) override {
    CudaDeviceGuard guard(device_);
    cudaFree(p);
    reserved_ -= nbytes;
  }

  [[noreturn]] void out_of_memory(size_t nbytes, const AllocatorStats& s) override {
    if (limited_)
      DS_THROW(
          "[cuda:{}] out of memory allocating {}: the process's device memory limit is {} "
          "(--device_memory_limit) and {} is in use by tensors, {} reserved ({} of it free but "
          "split around blocks in use). Lower the micro-batch size, turn on activation "
          "checkpointing, or raise the limit",
          device_, gib(nbytes), gib(limit_.load()), gib(s.bytes_in_use), gib(s.bytes_reserved),
          gib(s.bytes_inactive_split));
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    DS_THROW("[cuda:{}] out of memory allocating {} ({}): {} in use by tensors, {} reserved by "
             "this process, {} free of {} on the device. Lower the micro-batch size, turn on "
             "activation checkpointing, or offload the optimizer state "
             "(zero_optimization.offload_optimizer.device: cpu)",
             device_, gib(nbytes), cudaGetErrorString(last_error_), gib(s.bytes_in_use),
             gib(s.bytes_reserved), gib(free_b), gib(total_b));
  }

 private:
  int device_;
  const std::atomic<uint64_t>& limit_;  // the backend's set_memory_limit(); 0 = none
  uint64_t reserved_ = 0;               // bytes cudaMalloc'd and not freed (the pool's mutex)
  bool limited_ = false;                // the last refusal was the limit's, not the device's
  cudaError_t last_error_ = cudaSuccess;
};

}  // namespace

std::unique_ptr<Allocator> new_cuda_caching_allocator(int device,
                                                      const std::atomic<uint64_t>& limit) {
  // The driver frees device memory at exit: nothing to return in the destructor.
  return std::make_unique<PooledAllocator>(std::make_unique<CudaMemory>(device, limit), false);
}

}  // namespace ds::backend

#pragma once
// The CUDA backend: one object per GPU (backend::cuda(i)), each with its own stream, cuBLAS handle
// and caching allocator. Internal header; users reach it through ds::backend::get(Device).
//
// Execution model. Every kernel and copy of device i is enqueued on that device's one stream, in
// program order, so a buffer freed by the host (back to the caching allocator) and handed out again
// is never touched before earlier work on it has finished. The host waits only where it reads
// device memory: copies to host memory (Tensor::to_vector, item(), a CPU tensor's copy_from) and
// the few kernels whose arguments must be checked on the host first (ids and targets against the
// vocabulary size; attention's key lengths). Errors are checked after every launch and every CUDA
// call, and reported with the call and the device ("[cuda:0] cudaMalloc of 2.0 GiB: out of memory
// ...").
//
// Threading: each backend serialises its cuBLAS calls; kernels may be enqueued from any host
// thread (the stream orders them).
#include <cuda_runtime.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "backend/cuda/kernels.h"
#include "ds/backend/backend.h"

namespace ds::backend {

// Throws "[cuda:<device>] <what>: <CUDA's error string>" unless err == cudaSuccess.
void cuda_check(cudaError_t err, int device, const char* what);

// Makes device current on the calling thread for its lifetime (restores the previous one).
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int device);
  ~CudaDeviceGuard();
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int previous_ = -1;
  int device_ = 0;
};

// The caching device allocator (allocator.cpp): the library's block pool (ds/core/block_pool.h)
// over cudaMalloc: freed blocks are cached and handed out again, large ones split and merged, so
// a training step after the first calls cudaMalloc no more. On out-of-memory it frees the cache
// and retries once, then throws naming the request, the bytes in use, reserved and split. `limit`
// (bytes, 0 = none; read at each cudaMalloc) caps what it reserves.
std::unique_ptr<Allocator> new_cuda_caching_allocator(int device,
                                                      const std::atomic<uint64_t>& limit);

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device);
  ~CudaBackend() override;

  std::string name() const override { return "cuda:" + std::to_string(device_); }
  Allocator& allocator() override { return *allocator_; }
  std::string gemm_info() override;
  bool supports(const std::string& op, DType dtype) const override;

  std::shared_ptr<Storage> host_staging(size_t nbytes) override;
  std::unique_ptr<TransferQueue> transfer_queue() override;  // transfer.cpp
  void set_memory_limit(uint64_t bytes) override;
  uint64_t available_memory() override;
  void copy(const Tensor& src, const Tensor& dst) override;
  void fill(const Tensor& dst, double value) override;
  void axpy(const Tensor& y, const Tensor& x, float alpha) override;
  double sum_of_squares(const Tensor& x) override;
  void gemm(const Gemm& g) override;
  void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) override;
  void unary(UnaryOp op, const Tensor& x, const Tensor& out, float scalar) override;
  void reduce(ReduceOp op, const Tensor& x, int64_t outer, int64_t reduced, int64_t inner,
              const Tensor& out) override;

  void layer_norm_forward(const Tensor& x, const Tensor& w, const Tensor& b, float eps,
                          const Tensor& y, const Tensor& mean, const Tensor& rstd) override;
  void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                           const Tensor& rstd, const Tensor& dx, const Tensor& dw,
                           const Tensor& db) override;
  void rms_norm_forward(const Tensor& x, const Tensor& w, float eps, const Tensor& y,
                        const Tensor& rstd) override;
  void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                         const Tensor& dx, const Tensor& dw) override;
  void softmax_forward(const Tensor& x, const Tensor& y) override;
  void softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) override;
  void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                         bool causal, std::span<const int64_t> key_lens, int64_t window,
                         float softcap, const Tensor& out, const Tensor& lse) override;
  void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& out, const Tensor& lse, float scale, bool causal,
                          std::span<const int64_t> key_lens, int64_t window, float softcap,
                          const Tensor& dq, const Tensor& dk, const Tensor& dv) override;
  void rope(const Tensor& x, int64_t pos0, const std::vector<double>& inv_freq, float scale,
            bool interleaved, bool inverse, const Tensor& out) override;
  void embedding_forward(const Tensor& weight, const Tensor& ids, const Tensor& out) override;
  void embedding_backward(const Tensor& dout, const Tensor& ids, const Tensor& dweight) override;
  void cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                             const Tensor& losses, const Tensor& lse) override;
  void cross_entropy_backward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                              const Tensor& lse, float scale, const Tensor& dlogits) override;
  void dropout(const Tensor& x, float p, uint64_t seed, uint64_t stream, uint64_t base,
               const Tensor& out) override;
  void adam(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v,
            const AdamStep& step, const Tensor& out16) override;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  void synchronize() override;
  // Throws with the kernel's name when the last launch failed.
  void check_launch(const char* kernel);

 private:
  Tensor scratch(int64_t floats);  // fp32 device buffer from the caching allocator
  // Host copies of small device int tensors (ids, targets) for argument checks.
  std::vector<int64_t> ids_on_host(const Tensor& ids);
  Tensor device_int64(std::span<const int64_t> values);

  int device_;
  cudaStream_t stream_ = nullptr;
  void* cublas_ = nullptr;  // cublasHandle_t
  void* workspace_ = nullptr;  // cuBLAS's workspace (device memory, 32 MiB)
  std::mutex cublas_mutex_;
  std::atomic<uint64_t> memory_limit_{0};  // set_memory_limit(); the allocator reads it
  std::unique_ptr<Allocator> allocator_;
};

CudaBackend& cuda_backend(int index);

}  // namespace ds::backend

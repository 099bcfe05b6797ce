// CudaBackend::transfer_queue(): host <-> device copies on a stream of their own, ordered against
// the device's compute stream by events (ds/backend/backend.h, TransferQueue). Each copy records
// an event after itself; wait(ticket) synchronises on that event, so the host waits for exactly
// the copies it needs while later ones keep running.
#include <cuda_runtime.h>

#include <deque>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "ds/core/error.h"

namespace ds::backend {
namespace {

class CudaTransferQueue final : public TransferQueue {
 public:
  explicit CudaTransferQueue(CudaBackend& backend) : backend_(backend), device_(backend.device()) {
    CudaDeviceGuard guard(device_);
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), device_,
               "cudaStreamCreateWithFlags (transfer queue)");
    ordering_ = new_event();
  }

  ~CudaTransferQueue() override {
    // The copies may still be reading or writing memory their owners are about to free.
    CudaDeviceGuard guard(device_);
    cudaStreamSynchronize(stream_);
    for (auto& [ticket, e] : pending_) cudaEventDestroy(e);
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
    cudaEventDestroy(ordering_);
    cudaStreamDestroy(stream_);
  }

  void after_kernels() override {
    CudaDeviceGuard guard(device_);
    cuda_check(cudaEventRecord(ordering_, backend_.stream()), device_, "cudaEventRecord");
    cuda_check(cudaStreamWaitEvent(stream_, ordering_, 0), device_, "cudaStreamWaitEvent");
  }

  uint64_t copy(const Tensor& src, const Tensor& dst) override {
    DS_CHECK(src.dtype() == dst.dtype() && src.numel() == dst.numel() && src.is_contiguous() &&
                 dst.is_contiguous(),
             "[cuda:{}] transfer of {} {} elements into {} {} elements: the queue copies "
             "contiguous tensors of one dtype and size",
             device_, src.numel(), dtype_name(src.dtype()), dst.numel(), dtype_name(dst.dtype()));
    const bool down = !src.device().is_cpu() && dst.device().is_cpu();
    const bool up = src.device().is_cpu() && !dst.device().is_cpu();
    DS_CHECK(down || up,
             "[cuda:{}] transfer from {} to {}: the queue copies between the GPU and host memory",
             device_, src.device().str(), dst.device().str());
    const Device dev = down ? src.device() : dst.device();
    DS_CHECK(dev.index == device_, "[cuda:{}] transfer queue given a tensor on {}", device_,
             dev.str());
    CudaDeviceGuard guard(device_);
    if (src.nbytes() > 0)
      cuda_check(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), src.nbytes(),
                                 down ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, stream_),
                 device_, down ? "cudaMemcpyAsync (transfer to host)"
                               : "cudaMemcpyAsync (transfer to device)");
    cudaEvent_t done = new_event();
    cuda_check(cudaEventRecord(done, stream_), device_, "cudaEventRecord");
    pending_.emplace_back(++tickets_, done);
    return tickets_;
  }

  void wait(uint64_t ticket) override {
    DS_CHECK(ticket <= tickets_, "[cuda:{}] wait for transfer {} of {} enqueued", device_, ticket,
             tickets_);
    CudaDeviceGuard guard(device_);
    // Events complete in order on one stream: wait for this ticket's, then retire it and the
    // earlier ones.
    for (const auto& [t, e] : pending_)
      if (t == ticket) {
        cuda_check(cudaEventSynchronize(e), device_, "cudaEventSynchronize (transfer)");
        break;
      }
    while (!pending_.empty() && pending_.front().first <= ticket) {
      free_.push_back(pending_.front().second);
      pending_.pop_front();
    }
  }

  void before_kernels() override {
    CudaDeviceGuard guard(device_);
    cuda_check(cudaEventRecord(ordering_, stream_), device_, "cudaEventRecord");
    cuda_check(cudaStreamWaitEvent(backend_.stream(), ordering_, 0), device_,
               "cudaStreamWaitEvent");
  }

 private:
  cudaEvent_t new_event() {
    if (!free_.empty()) {
      cudaEvent_t e = free_.back();
      free_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), device_, "cudaEventCreate");
    return e;
  }

  CudaBackend& backend_;
  int device_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ordering_ = nullptr;  // after_kernels / before_kernels (re-recorded each time)
  uint64_t tickets_ = 0;
  std::deque<std::pair<uint64_t, cudaEvent_t>> pending_;  // copies not yet waited for, in order
  std::vector<cudaEvent_t> free_;                         // retired events, reused
};

}  // namespace

std::unique_ptr<TransferQueue> CudaBackend::transfer_queue() {
  return std::make_unique<CudaTransferQueue>(*this);
}

}  // namespace ds::backend

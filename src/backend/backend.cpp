#include "ds/backend/backend.h"

#include "backend/cpu/cpu_backend.h"
#include "ds/core/error.h"

namespace ds::backend {

namespace {

// Every copy done before copy() returns: nothing to order, nothing to wait for.
class SynchronousTransferQueue final : public TransferQueue {
 public:
  void after_kernels() override {}
  uint64_t copy(const Tensor& src, const Tensor& dst) override {
    DS_CHECK(src.dtype() == dst.dtype() && src.numel() == dst.numel() && src.is_contiguous() &&
                 dst.is_contiguous(),
             "[backend] transfer of {} {} elements into {} {} elements: the queue copies "
             "contiguous tensors of one dtype and size",
             src.numel(), dtype_name(src.dtype()), dst.numel(), dtype_name(dst.dtype()));
    dst.copy_from(src);
    return ++tickets_;
  }
  void wait(uint64_t ticket) override {
    DS_CHECK(ticket <= tickets_, "[backend] wait for transfer {} of {} enqueued", ticket, tickets_);
  }
  void before_kernels() override {}

 private:
  uint64_t tickets_ = 0;
};

}  // namespace

std::unique_ptr<TransferQueue> Backend::transfer_queue() {
  return std::make_unique<SynchronousTransferQueue>();
}

void Backend::set_memory_limit(uint64_t bytes) {
  DS_THROW("[backend] {}: device memory limits apply to GPUs (asked for {} bytes)", name(), bytes);
}

Backend& cpu() {
  static CpuBackend b;
  return b;
}

Backend& get(Device device) {
  if (device.type == DeviceType::cpu) return cpu();
  return cuda(device.index);
}

}  // namespace ds::backend

#pragma once
// The sim backend: a device emulator for tests (PyTorch's privateuse1 test device). Everything
// above the backend sees a GPU-like device ("sim:0": memory the host cannot dereference, see
// sim_memory.h); every kernel runs the CPU backend's on host aliases of its arguments. CI has no
// GPU, so this is what catches a host loop over device memory in ZeRO, the engine, nn or the
// optimizer: on sim it faults at once. Not a performance device (single-threaded Adam, every
// kernel as fast as the CPU's at best). Internal header; users reach it through backend::sim() or
// ds::backend::get(Device{DeviceType::sim, 0}).
//
// Only the pure-virtual kernels are overridden: Backend's composed defaults (bce_with_logits_*,
// max_backward, vocab_ce_*, gelu_erf_*, swiglu_*, linear_rows, decode_attention) run as they do on
// a GPU without a kernel of its own, so CI tests those defaults on a device.
//
// Threading: as the CPU backend's (kernels are synchronous; synchronize() has nothing to wait for).
#include <atomic>
#include <memory>

#include "ds/backend/backend.h"

namespace ds::backend {

class SimBackend final : public Backend {
 public:
  SimBackend();

  std::string name() const override { return "sim:0"; }
  Allocator& allocator() override { return *allocator_; }
  std::string gemm_info() override;
  bool supports(const std::string& op, DType dtype) const override;

  std::shared_ptr<Storage> host_staging(size_t nbytes) override {
    return Storage::allocate(nbytes, kCPU);
  }
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
  // A scalar loop in AdamStep's documented order (std::fma): bitwise optim::adam_update's SIMD.
  void adam(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v,
            const AdamStep& step, const Tensor& out16) override;

 private:
  std::atomic<uint64_t> memory_limit_{0};  // set_memory_limit(); the allocator reads it
  std::unique_ptr<Allocator> allocator_;
};

}  // namespace ds::backend

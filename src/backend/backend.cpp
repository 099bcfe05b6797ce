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

namespace {
Tensor on_host(const Tensor& t) {
  Tensor h = Tensor::empty(t.shape(), t.dtype(), kCPU);
  h.copy_from(t);
  return h;
}
}  // namespace

void Backend::gelu_erf_forward(const Tensor& x, const Tensor& out) {
  Tensor h = Tensor::empty(out.shape(), DType::f32, kCPU);
  cpu().gelu_erf_forward(on_host(x), h);
  out.copy_from(h);
}

void Backend::gelu_erf_backward(const Tensor& dy, const Tensor& x, const Tensor& dx) {
  Tensor h = Tensor::empty(dx.shape(), DType::f32, kCPU);
  cpu().gelu_erf_backward(on_host(dy), on_host(x), h);
  dx.copy_from(h);
}

void Backend::linear_rows(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) {
  const int64_t N = w.size(0), K = w.size(1), R = x.numel() / K;
  DS_CHECK(x.dtype() == DType::f32 && w.dtype() == DType::f32 && y.dtype() == DType::f32 &&
               x.is_contiguous() && w.is_contiguous() && y.is_contiguous() &&
               x.numel() == R * K && y.numel() == R * N && (!b.defined() || b.numel() == N),
           "[{}:linear_rows] x (R, K), w (N, K), y (R, N) contiguous fp32; got x {}, w {}, y {}",
           name(), shape_str(x.shape()), shape_str(w.shape()), shape_str(y.shape()));
  // One GEMM of M = 1 per row: each row's sums are what the row alone gets.
  for (int64_t r = 0; r < R; ++r) {
    Gemm g;
    g.trans_b = true;
    g.m = 1, g.n = N, g.k = K;
    g.a = static_cast<const float*>(x.raw_data()) + r * K, g.lda = K;
    g.b = w.raw_data(), g.ldb = K;
    g.c = static_cast<float*>(y.raw_data()) + r * N, g.ldc = N;
    gemm(g);
    if (b.defined()) axpy(y.flat_range(r * N, N), b, 1.0f);
  }
}

void Backend::decode_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                               int64_t p0, float scale, const Tensor& out) {
  const int64_t NH = q.size(0), n = q.size(1), hd = q.size(2), KV = k_cache.size(1);
  const int64_t T = p0 + n;
  DS_CHECK(KV > 0 && NH % KV == 0 && k_cache.size(0) >= T && k_cache.shape() == v_cache.shape(),
           "[{}:decode_attention] q (NH, n, hd) {} against caches {} at position {}", name(),
           shape_str(q.shape()), shape_str(k_cache.shape()), p0);
  // The cache's first T rows as (1, NH, T, hd): KV head h / group for query head h.
  auto gather = [&](const Tensor& cache) {
    const Tensor rows = Tensor::from_storage(cache.storage(), {1, KV, NH / KV, T, hd},
                                             DType::f32, cache.storage_offset(),
                                             {0, hd, 0, KV * hd, 1});
    Tensor full = Tensor::empty({1, KV, NH / KV, T, hd}, DType::f32, q.device());
    copy(rows, full);
    return Tensor::from_storage(full.storage(), {1, NH, T, hd}, DType::f32);
  };
  const Tensor k = gather(k_cache), v = gather(v_cache);
  const Tensor q4 = Tensor::from_storage(q.storage(), {1, NH, n, hd}, DType::f32,
                                         q.storage_offset());
  const Tensor o4 = Tensor::empty({1, NH, n, hd}, DType::f32, q.device());
  const Tensor lse = Tensor::empty({1, NH, n}, DType::f32, q.device());
  attention_forward(q4, k, v, scale, /*causal=*/true, {}, o4, lse);
  // (1, NH, n, hd) -> out (n, NH, hd)
  copy(Tensor::from_storage(o4.storage(), {n, NH, hd}, DType::f32, 0, {hd, n * hd, 1}), out);
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

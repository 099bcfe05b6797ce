#include "ds/backend/backend.h"

#include <cstdint>
#include <vector>

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
    // A device's queue (sim's) moves data between it and host memory, as a GPU's does.
    DS_CHECK(src.device().is_cpu() || dst.device().is_cpu(),
             "[backend] transfer from {} to {}: the queue copies between the GPU and host memory",
             src.device().str(), dst.device().str());
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

void Backend::swiglu_forward(const Tensor& gate, const Tensor& up, const Tensor& out) {
  Tensor s = Tensor::empty(gate.shape(), DType::f32, gate.device());  // silu(gate)
  unary(UnaryOp::silu, gate, s, 0.0f);
  binary(BinaryOp::mul, s, up, out);
}

void Backend::swiglu_backward(const Tensor& dy, const Tensor& gate, const Tensor& up,
                              const Tensor& dgate, const Tensor& dup) {
  if (dgate.defined()) {  // dgate = (dy * up) * silu'(gate)
    Tensor gu = Tensor::empty(gate.shape(), DType::f32, gate.device());
    binary(BinaryOp::mul, dy, up, gu);
    binary(BinaryOp::silu_backward, gu, gate, dgate);
  }
  if (dup.defined()) {  // dup = dy * silu(gate), recomputed rather than saved
    Tensor s = Tensor::empty(gate.shape(), DType::f32, gate.device());
    unary(UnaryOp::silu, gate, s, 0.0f);
    binary(BinaryOp::mul, dy, s, dup);
  }
}

namespace {

// (N) as an (N, C) view repeating each element along its row (stride 0): a binary kernel operand.
Tensor rows_broadcast(const Tensor& v, int64_t N, int64_t C) {
  return Tensor::from_storage(v.storage(), {N, C}, v.dtype(), v.storage_offset(), {1, 0});
}

// A host tensor copied to `device` (itself on the CPU).
Tensor to_device(const Tensor& h, Device device) {
  if (device.is_cpu()) return h;
  Tensor d = Tensor::empty(h.shape(), h.dtype(), device);
  d.copy_from(h);
  return d;
}

}  // namespace

double Backend::bce_with_logits_sum(const Tensor& x, const Tensor& y) {
  const int64_t n = x.numel();
  const Device dev = x.device();
  // max(x, 0) + log(1 + exp(-|x|)) - x y with |x| = sqrt(x^2) (exact below 1.8e19) and
  // max(x, 0) = (x + |x|) / 2 (exact).
  Tensor ax = Tensor::empty(x.shape(), DType::f32, dev),
         t = Tensor::empty(x.shape(), DType::f32, dev);
  Tensor term = Tensor::empty(x.shape(), DType::f32, dev);
  unary(UnaryOp::square, x, ax);
  unary(UnaryOp::sqrt, ax, ax);
  binary(BinaryOp::add, x, ax, term);
  unary(UnaryOp::mul_scalar, term, term, 0.5f);  // max(x, 0)
  unary(UnaryOp::neg, ax, ax);
  unary(UnaryOp::exp, ax, ax);
  unary(UnaryOp::add_scalar, ax, ax, 1.0f);
  unary(UnaryOp::log, ax, ax);  // log(1 + exp(-|x|))
  binary(BinaryOp::add, term, ax, term);
  binary(BinaryOp::mul, x, y, t);
  binary(BinaryOp::sub, term, t, term);
  Tensor total = Tensor::empty({1}, DType::f32, dev);
  reduce(ReduceOp::sum, term, 1, n, 1, total);
  return static_cast<double>(total.item());
}

void Backend::bce_with_logits_backward(const Tensor& x, const Tensor& y, double scale,
                                       const Tensor& dx) {
  unary(UnaryOp::mul_scalar, x, dx, 0.5f);
  unary(UnaryOp::tanh, dx, dx);
  unary(UnaryOp::mul_scalar, dx, dx, 0.5f);
  unary(UnaryOp::add_scalar, dx, dx, 0.5f);  // sigmoid(x) = (1 + tanh(x / 2)) / 2
  binary(BinaryOp::sub, dx, y, dx);
  unary(UnaryOp::mul_scalar, dx, dx, static_cast<float>(scale));
}

void Backend::max_backward(const Tensor& x, const Tensor& vals, const Tensor& dy, int64_t outer,
                           int64_t reduced, int64_t inner, const Tensor& dx) {
  Tensor h = Tensor::empty(dx.shape(), DType::f32, kCPU);
  cpu().max_backward(on_host(x), on_host(vals), on_host(dy), outer, reduced, inner, h);
  dx.copy_from(h);
}

namespace {

// Where each row's target sits among `Vl` local columns: flat indices n * Vl + column into the
// (N * Vl) logits (column 0 when the target is elsewhere), `here` 1 where it is here and 0
// elsewhere, and `kept` 0 for ignored rows (1 otherwise).
struct TargetColumns {
  std::vector<int64_t> flat;
  std::vector<float> here, kept;
};

TargetColumns target_columns(const Tensor& targets, int64_t vocab_begin, int64_t Vl,
                             int64_t ignore_index) {
  const std::vector<int64_t> t = targets.to_int_vector();
  TargetColumns c;
  for (size_t n = 0; n < t.size(); ++n) {
    const int64_t v = t[n] - vocab_begin;
    const bool mine = t[n] != ignore_index && v >= 0 && v < Vl;
    c.flat.push_back(static_cast<int64_t>(n) * Vl + (mine ? v : 0));
    c.here.push_back(mine ? 1.0f : 0.0f);
    c.kept.push_back(t[n] == ignore_index ? 0.0f : 1.0f);
  }
  return c;
}

}  // namespace

void Backend::vocab_ce_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_begin,
                             const Tensor& row_max, const Tensor& target_logit) {
  const int64_t N = logits.size(0), Vl = logits.size(1);
  const Device dev = logits.device();
  reduce(ReduceOp::max, logits, N, Vl, 1, row_max);
  // The target column gathered as an embedding row of the (N * Vl, 1) logits; rows whose target
  // is elsewhere read column 0, zeroed on the host (N values: a product with a mask would turn a
  // -inf logit there into NaN). The statistics ignore no row: the loss skips ignored ones.
  const TargetColumns c = target_columns(targets, vocab_begin, Vl, /*ignore_index=*/INT64_MIN);
  const Tensor flat =
      Tensor::from_storage(logits.storage(), {N * Vl, 1}, DType::f32, logits.storage_offset());
  const Tensor picked = Tensor::empty({N, 1}, DType::f32, dev);
  embedding_forward(flat, to_device(Tensor::from_ints(c.flat, {N}), dev), picked);
  std::vector<float> p = picked.to_vector();
  for (size_t n = 0; n < p.size(); ++n)
    if (c.here[n] == 0.0f) p[n] = 0.0f;
  target_logit.copy_from(Tensor::from_data(p, target_logit.shape()));
}

void Backend::vocab_ce_sum_exp(const Tensor& logits, const Tensor& row_max, const Tensor& sum_exp) {
  const int64_t N = logits.size(0), Vl = logits.size(1);
  Tensor e = Tensor::empty({N, Vl}, DType::f32, logits.device());
  binary(BinaryOp::sub, logits, rows_broadcast(row_max, N, Vl), e);
  unary(UnaryOp::exp, e, e);
  reduce(ReduceOp::sum, e, N, Vl, 1, sum_exp);
}

void Backend::vocab_ce_backward(const Tensor& logits, const Tensor& targets, int64_t vocab_begin,
                                int64_t ignore_index, const Tensor& row_max, const Tensor& sum_exp,
                                float scale, const Tensor& dlogits) {
  const int64_t N = logits.size(0), Vl = logits.size(1);
  const Device dev = logits.device();
  const Tensor d =
      Tensor::from_storage(dlogits.storage(), {N, Vl}, DType::f32, dlogits.storage_offset());
  binary(BinaryOp::sub, logits, rows_broadcast(row_max, N, Vl), d);
  unary(UnaryOp::exp, d, d);
  binary(BinaryOp::div, d, rows_broadcast(sum_exp, N, Vl), d);
  unary(UnaryOp::mul_scalar, d, d, scale);
  // Minus scale at the target column: an embedding scatter of (N, 1) rows into (N * Vl, 1).
  const TargetColumns c = target_columns(targets, vocab_begin, Vl, ignore_index);
  std::vector<float> minus(c.here.size());
  for (size_t n = 0; n < minus.size(); ++n) minus[n] = -scale * c.here[n];
  embedding_backward(
      to_device(Tensor::from_data(minus, {N, 1}), dev),
      to_device(Tensor::from_ints(c.flat, {N}), dev),
      Tensor::from_storage(dlogits.storage(), {N * Vl, 1}, DType::f32, dlogits.storage_offset()));
  const Tensor kept = to_device(Tensor::from_data(c.kept, {N}), dev);
  binary(BinaryOp::mul, d, rows_broadcast(kept, N, Vl), d);  // ignored rows: zero
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
                               int64_t p0, float scale, float softcap, const Tensor& out) {
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
  attention_forward(q4, k, v, scale, /*causal=*/true, {}, /*window=*/0, softcap, o4, lse);
  // (1, NH, n, hd) -> out (n, NH, hd)
  copy(Tensor::from_storage(o4.storage(), {n, NH, hd}, DType::f32, 0, {hd, n * hd, 1}), out);
}

Backend& cpu() {
  static CpuBackend b;
  return b;
}

Backend& get(Device device) {
  switch (device.type) {
    case DeviceType::cpu:
      return cpu();
    case DeviceType::cuda:
      return cuda(device.index);
    case DeviceType::sim:
      DS_CHECK(device.index == 0, "[sim] device {} requested: the emulator has one device, sim:0",
               device.str());
      return sim();
  }
  DS_THROW("[backend] unknown device type {}", static_cast<int>(device.type));
}

}  // namespace ds::backend

// Inference-only ops of the incremental decoder (models::IncrementalDecoder): no autograd record.
#include "ds/ops/ops.h"
#include "ops/op_util.h"

namespace ds::ops {
using detail::be;

namespace {
Tensor f32_contiguous(const Tensor& t) {
  Tensor c = t.dtype() == DType::f32 ? t : t.to(DType::f32);
  return c.contiguous();
}
}  // namespace

Tensor linear_rows(const Tensor& x, const Tensor& w, const Tensor& b) {
  DS_CHECK(w.dim() == 2 && x.dim() >= 1 && x.size(-1) == w.size(1) &&
               (!b.defined() || (b.dim() == 1 && b.size(0) == w.size(0))),
           "[linear_rows] x (..., K) {}, w (N, K) {}, b (N) {}", shape_str(x.shape()),
           shape_str(w.shape()), b.defined() ? shape_str(b.shape()) : "none");
  DS_CHECK(x.device() == w.device() && (!b.defined() || b.device() == w.device()),
           "[linear_rows] x, w and b must be on one device");
  // The weight is what decode reads: it goes to the kernel as it is or not at all (a copy of it
  // per step would cost more than the GEMM). x and b are a few rows: widened when 16-bit.
  const bool takes_w = w.dtype() == DType::f32 || be(w).supports("linear_rows", w.dtype());
  if (!takes_w || !w.is_contiguous() || !is_floating(x.dtype()) ||
      (b.defined() && !is_floating(b.dtype())))
    return linear(x, w, b);
  const Tensor xc = f32_contiguous(x);
  const Tensor bc = b.defined() ? f32_contiguous(b) : b;
  Shape shape = x.shape();
  shape.back() = w.size(0);
  Tensor y = Tensor::empty(shape, DType::f32, x.device());
  be(x).linear_rows(xc, w, bc, y);
  return x.dtype() == DType::f32 ? y : y.to(x.dtype());
}

Tensor decode_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, int64_t p0,
                        float scale, float softcap) {
  DS_CHECK(q.dim() == 3 && k_cache.dim() == 3 && k_cache.shape() == v_cache.shape() &&
               k_cache.size(2) == q.size(2) && k_cache.size(1) > 0 &&
               q.size(0) % k_cache.size(1) == 0 && p0 >= 0 && p0 + q.size(1) <= k_cache.size(0),
           "[decode_attention] q (NH, n, hd) {} at position {} against caches (P, KV, hd) {}: "
           "NH a multiple of KV, p0 + n <= P",
           shape_str(q.shape()), p0, shape_str(k_cache.shape()));
  DS_CHECK(q.device() == k_cache.device() && q.device() == v_cache.device(),
           "[decode_attention] q and the caches must be on one device");
  const DType cd = k_cache.dtype();
  DS_CHECK((cd == DType::f32 || cd == DType::bf16) && v_cache.dtype() == cd &&
               k_cache.is_contiguous() && v_cache.is_contiguous(),
           "[decode_attention] the caches must be contiguous fp32 or bf16, both alike; got {} and "
           "{}",
           dtype_name(cd), dtype_name(v_cache.dtype()));
  const Tensor qc = f32_contiguous(q);
  Tensor out = Tensor::empty({q.size(1), q.size(0), q.size(2)}, DType::f32, q.device());
  if (cd == DType::f32 || be(q).supports("decode_attention", cd)) {
    be(q).decode_attention(qc, k_cache, v_cache, p0, scale, softcap, out);
  } else {
    // A backend without the 16-bit kernel: the valid rows widened (the same values, exactly).
    const int64_t T = p0 + q.size(1);
    be(q).decode_attention(qc, f32_contiguous(slice(k_cache, 0, 0, T)),
                           f32_contiguous(slice(v_cache, 0, 0, T)), p0, scale, softcap, out);
  }
  return q.dtype() == DType::f32 ? out : out.to(q.dtype());
}

}  // namespace ds::ops

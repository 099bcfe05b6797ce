// The decode kernels of the CPU backend (Backend::linear_rows, Backend::decode_attention): one
// token per sequence and step, bound by reading the weights (linear_rows) and the cache
// (decode_attention) once.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "ds/core/error.h"
#include "ds/core/parallel.h"

namespace ds::backend {

namespace {

// The end of one row's dot product: its two 8-lane accumulators reduced in a fixed order, then the
// tail past the last full 16 floats (from i).
inline float dot_finish(__m256 a0, __m256 a1, const float* w, const float* x, int64_t i,
                        int64_t n) {
  a0 = _mm256_add_ps(a0, a1);
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
  s4 = _mm_hadd_ps(s4, s4);
  s4 = _mm_hadd_ps(s4, s4);
  float acc = _mm_cvtss_f32(s4);
  for (; i < n; ++i) acc = std::fma(w[i], x[i], acc);
  return acc;
}

// w . x over n floats: two accumulators over 16-float chunks, then dot_finish. Every decode row
// gets exactly this sequence of operations, alone (here) or four at a time (dot4), so a row's
// result never depends on the other rows of its batch.
float dot_row(const float* w, const float* x, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
  }
  return dot_finish(a0, a1, w, x, i, n);
}

// w . x_m for four rows x_m = x + m * n: each row's accumulators see dot_row's operations in
// dot_row's order (the same results), the weight chunk is loaded once for the four, and eight
// independent FMA chains hide the FMA latency that bounds one dot product's two chains.
void dot4(const float* w, const float* x, int64_t n, float* out, int64_t out_stride) {
  const float *x0 = x, *x1 = x + n, *x2 = x + 2 * n, *x3 = x + 3 * n;
  __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00,
         a30 = a00, a31 = a00;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 w0 = _mm256_loadu_ps(w + i), w1 = _mm256_loadu_ps(w + i + 8);
    a00 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x0 + i), a00);
    a01 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x0 + i + 8), a01);
    a10 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x1 + i), a10);
    a11 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x1 + i + 8), a11);
    a20 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x2 + i), a20);
    a21 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x2 + i + 8), a21);
    a30 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x3 + i), a30);
    a31 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x3 + i + 8), a31);
  }
  out[0] = dot_finish(a00, a01, w, x0, i, n);
  out[out_stride] = dot_finish(a10, a11, w, x1, i, n);
  out[2 * out_stride] = dot_finish(a20, a21, w, x2, i, n);
  out[3 * out_stride] = dot_finish(a30, a31, w, x3, i, n);
}

// Y (rows, out) = X (rows, in) W^T, row strides ldx / ldw / ldy: each weight row read once and
// dotted with every row of X while it sits in L1 (see linear_rows).
void rows_times_weights(const float* X, int64_t ldx, const float* W, int64_t ldw, float* Y,
                        int64_t ldy, int64_t rows, int64_t out, int64_t in) {
  parallel_for(out, 64, [&](int64_t lo, int64_t hi) {
    std::vector<float> packed;  // rows of X gathered contiguous for dot4 when ldx != in
    const float* x = X;
    if (ldx != in && rows > 1) {
      packed.resize(static_cast<size_t>(rows * in));
      for (int64_t m = 0; m < rows; ++m) std::copy_n(X + m * ldx, in, packed.data() + m * in);
      x = packed.data();
    }
    const int64_t xs = (ldx != in && rows > 1) ? in : ldx;
    for (int64_t r = lo; r < hi; ++r) {
      const float* wr = W + r * ldw;
      int64_t m = 0;
      if (xs == in)
        for (; m + 4 <= rows; m += 4) dot4(wr, x + m * in, in, Y + m * ldy + r, ldy);
      for (; m < rows; ++m) Y[m * ldy + r] = dot_row(wr, x + m * xs, in);
    }
  });
}

}  // namespace

bool gemm_few_rows(const Gemm& g) {
  // Few rows against a weight matrix (x W^T, decode steps and beam search): OpenBLAS packs W on
  // every call and reads it twice; the row kernel reads it once.
  if (g.dtype != DType::f32 || g.batch != 1 || g.trans_a || !g.trans_b || g.m > 8 ||
      g.alpha != 1.0f || g.beta != 0.0f || g.n * g.k < (1 << 16))
    return false;
  rows_times_weights(static_cast<const float*>(g.a), g.lda, static_cast<const float*>(g.b), g.ldb,
                     static_cast<float*>(g.c), g.ldc, g.m, g.n, g.k);
  return true;
}

// A BLAS sgemm with few rows packs W on every call (OpenBLAS 0.3.21 has no GEMV forwarding),
// reading the weights twice, and its sums depend on how many rows it is given. Here each weight
// row is read from memory once and dotted with every row of X while it sits in L1, and each row's
// sum is the dot_row() it would get alone.
void CpuBackend::linear_rows(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) {
  const int64_t out = w.size(0), in = w.size(1), rows = x.numel() / in;
  DS_CHECK(x.dtype() == DType::f32 && w.dtype() == DType::f32 && y.dtype() == DType::f32 &&
               x.is_contiguous() && w.is_contiguous() && y.is_contiguous() &&
               x.numel() == rows * in && y.numel() == rows * out &&
               (!b.defined() || (b.numel() == out && b.dtype() == DType::f32 && b.is_contiguous())),
           "[cpu:linear_rows] x (R, K), w (N, K), b (N), y (R, N) contiguous fp32; got x {}, w {}, "
           "y {}",
           shape_str(x.shape()), shape_str(w.shape()), shape_str(y.shape()));
  const float* W = w.data<float>();
  const float* X = x.data<float>();
  const float* B = b.defined() ? b.data<float>() : nullptr;
  float* Y = y.data<float>();
  parallel_for(out, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* wr = W + r * in;
      int64_t m = 0;
      for (; m + 4 <= rows; m += 4) dot4(wr, X + m * in, in, Y + m * out + r, out);
      for (; m < rows; ++m) Y[m * out + r] = dot_row(wr, X + m * in, in);
      if (B)
        for (m = 0; m < rows; ++m) Y[m * out + r] += B[r];
    }
  });
}

void CpuBackend::decode_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                  int64_t p0, float scale, const Tensor& out) {
  const int64_t NH = q.size(0), n = q.size(1), hd = q.size(2), KV = k_cache.size(1);
  DS_CHECK(q.dim() == 3 && k_cache.dim() == 3 && k_cache.shape() == v_cache.shape() && KV > 0 &&
               NH % KV == 0 && k_cache.size(2) == hd && k_cache.size(0) >= p0 + n &&
               out.numel() == n * NH * hd,
           "[cpu:decode_attention] q (NH, n, hd), caches (P >= p0 + n, KV, hd), out (n, NH, hd); "
           "got q {}, caches {}, position {}",
           shape_str(q.shape()), shape_str(k_cache.shape()), p0);
  for (const Tensor* t : {&q, &k_cache, &v_cache, &out})
    DS_CHECK(t->dtype() == DType::f32 && t->is_contiguous(),
             "[cpu:decode_attention] kernel takes contiguous fp32, got {}",
             dtype_name(t->dtype()));
  const float* qs = q.data<float>();
  const float* kc = k_cache.data<float>();
  const float* vc = v_cache.data<float>();
  float* ys = out.data<float>();
  const int64_t group = NH / KV;
  parallel_for(NH * n, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> s(static_cast<size_t>(p0 + n));
    std::vector<float> acc(static_cast<size_t>(hd));
    for (int64_t job = lo; job < hi; ++job) {
      const int64_t h = job / n, i = job % n, kvh = h / group, last = p0 + i;  // keys 0..last
      const float* qi = qs + (h * n + i) * hd;
      float mx = -INFINITY;
      for (int64_t j = 0; j <= last; ++j) {
        const float* kj = kc + (j * KV + kvh) * hd;
        float d = 0.0f;
        for (int64_t e = 0; e < hd; ++e) d += qi[e] * kj[e];
        s[static_cast<size_t>(j)] = d * scale;
        mx = std::max(mx, d * scale);
      }
      float z = 0.0f;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j <= last; ++j) {
        const float wj = std::exp(s[static_cast<size_t>(j)] - mx);
        z += wj;
        const float* vj = vc + (j * KV + kvh) * hd;
        for (int64_t e = 0; e < hd; ++e) acc[static_cast<size_t>(e)] += wj * vj[e];
      }
      float* yi = ys + (i * NH + h) * hd;
      for (int64_t e = 0; e < hd; ++e) yi[e] = acc[static_cast<size_t>(e)] / z;
    }
  });
}

}  // namespace ds::backend

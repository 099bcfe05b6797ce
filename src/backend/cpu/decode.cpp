// The decode kernels of the CPU backend (Backend::linear_rows, Backend::decode_attention): one
// token per sequence and step, bound by reading the weights (linear_rows) and the cache
// (decode_attention) once.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "ds/core/dtype.h"
#include "ds/core/error.h"
#include "ds/core/parallel.h"

namespace ds::backend {

namespace {

// Eight weights as fp32: fp32 loads as they are; bf16 (the upper half of an fp32) widens exactly
// in registers (zero-extend to 32 bits, shift left 16), so that a bf16 weight matrix is read at
// two bytes a value and the arithmetic after the load is the fp32 kernel's.
inline __m256 load8(const float* w) {
  return _mm256_loadu_ps(w);
}
inline __m256 load8(const uint16_t* w) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline float widen(float w) {
  return w;
}
inline float widen(uint16_t w) {
  return bf16_to_float(w);
}

// The end of one row's dot product: its two 8-lane accumulators reduced in a fixed order, then the
// tail past the last full 16 values (from i).
template <typename W>
inline float dot_finish(__m256 a0, __m256 a1, const W* w, const float* x, int64_t i, int64_t n) {
  a0 = _mm256_add_ps(a0, a1);
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
  s4 = _mm_hadd_ps(s4, s4);
  s4 = _mm_hadd_ps(s4, s4);
  float acc = _mm_cvtss_f32(s4);
  for (; i < n; ++i) acc = std::fma(widen(w[i]), x[i], acc);
  return acc;
}

// w . x over n values: two accumulators over 16-value chunks, then dot_finish. Every decode row
// gets exactly this sequence of operations, alone (here) or four at a time (dot4), so a row's
// result never depends on the other rows of its batch; and a bf16 row gets the operations of the
// fp32 row holding its widened values (the same result, bit for bit).
template <typename W>
float dot_row(const W* w, const float* x, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(load8(w + i), _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(load8(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
  }
  return dot_finish(a0, a1, w, x, i, n);
}

// w . x_m for four rows x_m = x + m * n: each row's accumulators see dot_row's operations in
// dot_row's order (the same results), the weight chunk is loaded once for the four, and eight
// independent FMA chains hide the FMA latency that bounds one dot product's two chains.
template <typename W>
void dot4(const W* w, const float* x, int64_t n, float* out, int64_t out_stride) {
  const float *x0 = x, *x1 = x + n, *x2 = x + 2 * n, *x3 = x + 3 * n;
  __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00,
         a30 = a00, a31 = a00;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 w0 = load8(w + i), w1 = load8(w + i + 8);
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

// linear_rows over weights of type W (float, or uint16_t holding bf16).
template <typename W>
void linear_rows_of(const float* X, const W* Wt, const float* B, float* Y, int64_t rows,
                    int64_t out, int64_t in) {
  parallel_for(out, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const W* wr = Wt + r * in;
      int64_t m = 0;
      for (; m + 4 <= rows; m += 4) dot4(wr, X + m * in, in, Y + m * out + r, out);
      for (; m < rows; ++m) Y[m * out + r] = dot_row(wr, X + m * in, in);
      if (B)
        for (m = 0; m < rows; ++m) Y[m * out + r] += B[r];
    }
  });
}

// q . k over one head (hd values): one 8-lane FMA chain, reduced as dot_finish does, then the
// tail. Written out in intrinsics so that an fp32 and a bf16 cache get the same operations (the
// compiler's own vectorisation and FMA contraction of a scalar loop may differ between the two).
template <typename T>
inline float dot_head(const float* q, const T* k, int64_t hd) {
  __m256 a = _mm256_setzero_ps();
  int64_t e = 0;
  for (; e + 8 <= hd; e += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + e), load8(k + e), a);
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s4 = _mm_hadd_ps(s4, s4);
  s4 = _mm_hadd_ps(s4, s4);
  float d = _mm_cvtss_f32(s4);
  for (; e < hd; ++e) d = std::fma(q[e], widen(k[e]), d);
  return d;
}

// acc (hd) += p * v (hd), one FMA per value.
template <typename T>
inline void axpy_head(float p, const T* v, float* acc, int64_t hd) {
  const __m256 pv = _mm256_set1_ps(p);
  int64_t e = 0;
  for (; e + 8 <= hd; e += 8)
    _mm256_storeu_ps(acc + e, _mm256_fmadd_ps(pv, load8(v + e), _mm256_loadu_ps(acc + e)));
  for (; e < hd; ++e) acc[e] = std::fma(p, widen(v[e]), acc[e]);
}

// decode_attention over caches of type T (float, or uint16_t holding bf16): each cached value
// widened where it is read, so a bf16 cache gives what its fp32 widening gives, bit for bit.
template <typename T>
void decode_attention_of(const float* qs, const T* kc, const T* vc, float* ys, int64_t NH,
                         int64_t n, int64_t hd, int64_t KV, int64_t p0, float scale,
                         float softcap) {
  const int64_t group = NH / KV;
  parallel_for(NH * n, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> s(static_cast<size_t>(p0 + n));
    std::vector<float> acc(static_cast<size_t>(hd));
    for (int64_t job = lo; job < hi; ++job) {
      const int64_t h = job / n, i = job % n, kvh = h / group, last = p0 + i;  // keys 0..last
      const float* qi = qs + (h * n + i) * hd;
      float mx = -INFINITY;
      for (int64_t j = 0; j <= last; ++j) {
        float d = dot_head(qi, kc + (j * KV + kvh) * hd, hd) * scale;
        if (softcap > 0.0f) d = softcap * std::tanh(d / softcap);
        s[static_cast<size_t>(j)] = d;
        mx = std::max(mx, d);
      }
      float z = 0.0f;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j <= last; ++j) {
        const float wj = std::exp(s[static_cast<size_t>(j)] - mx);
        z += wj;
        axpy_head(wj, vc + (j * KV + kvh) * hd, acc.data(), hd);
      }
      float* yi = ys + (i * NH + h) * hd;
      for (int64_t e = 0; e < hd; ++e) yi[e] = acc[static_cast<size_t>(e)] / z;
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
// sum is the dot_row() it would get alone. bf16 weights are read as they are (half the bytes of
// fp32: decode is bound by this read) and widened in registers.
void CpuBackend::linear_rows(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) {
  const int64_t out = w.size(0), in = w.size(1), rows = x.numel() / in;
  DS_CHECK(x.dtype() == DType::f32 && (w.dtype() == DType::f32 || w.dtype() == DType::bf16) &&
               y.dtype() == DType::f32 && x.is_contiguous() && w.is_contiguous() &&
               y.is_contiguous() && x.numel() == rows * in && y.numel() == rows * out &&
               (!b.defined() || (b.numel() == out && b.dtype() == DType::f32 && b.is_contiguous())),
           "[cpu:linear_rows] x (R, K) fp32, w (N, K) fp32 or bf16, b (N) fp32, y (R, N) fp32, "
           "contiguous; got x {} {}, w {} {}, y {} {}",
           shape_str(x.shape()), dtype_name(x.dtype()), shape_str(w.shape()), dtype_name(w.dtype()),
           shape_str(y.shape()), dtype_name(y.dtype()));
  const float* X = x.data<float>();
  const float* B = b.defined() ? b.data<float>() : nullptr;
  float* Y = y.data<float>();
  if (w.dtype() == DType::bf16)
    linear_rows_of(X, w.data<uint16_t>(), B, Y, rows, out, in);
  else
    linear_rows_of(X, w.data<float>(), B, Y, rows, out, in);
}

void CpuBackend::decode_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                  int64_t p0, float scale, float softcap, const Tensor& out) {
  const int64_t NH = q.size(0), n = q.size(1), hd = q.size(2), KV = k_cache.size(1);
  DS_CHECK(q.dim() == 3 && k_cache.dim() == 3 && k_cache.shape() == v_cache.shape() && KV > 0 &&
               NH % KV == 0 && k_cache.size(2) == hd && k_cache.size(0) >= p0 + n &&
               out.numel() == n * NH * hd,
           "[cpu:decode_attention] q (NH, n, hd), caches (P >= p0 + n, KV, hd), out (n, NH, hd); "
           "got q {}, caches {}, position {}",
           shape_str(q.shape()), shape_str(k_cache.shape()), p0);
  const DType cache = k_cache.dtype();
  DS_CHECK((cache == DType::f32 || cache == DType::bf16) && v_cache.dtype() == cache,
           "[cpu:decode_attention] the caches are fp32 or bf16, both alike; got {} and {}",
           dtype_name(cache), dtype_name(v_cache.dtype()));
  for (const Tensor* t : {&q, &k_cache, &v_cache, &out})
    DS_CHECK(t->is_contiguous() && (t->dtype() == DType::f32 || t == &k_cache || t == &v_cache),
             "[cpu:decode_attention] q and out are contiguous fp32, the caches contiguous; got {}",
             dtype_name(t->dtype()));
  if (cache == DType::bf16)
    decode_attention_of(q.data<float>(), k_cache.data<uint16_t>(), v_cache.data<uint16_t>(),
                        out.data<float>(), NH, n, hd, KV, p0, scale, softcap);
  else
    decode_attention_of(q.data<float>(), k_cache.data<float>(), v_cache.data<float>(),
                        out.data<float>(), NH, n, hd, KV, p0, scale, softcap);
}

}  // namespace ds::backend

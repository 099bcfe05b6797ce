// CPU neural-network kernels: layer norm, RMS norm, softmax, rotary embedding, embedding gather and
// scatter, cross-entropy, dropout. Attention lives in attention.cpp.
//
// Every kernel is parallel over rows and keeps each row's arithmetic in one thread in a fixed order,
// so results do not depend on the thread count. Sums across rows (the weight gradients of the norms)
// go through per-chunk partials whose chunking depends only on the row count, then are added in
// chunk order. Rows are short enough (C <= a few thousand) to sit in L1 between the passes of a
// kernel, so memory traffic is one read of each input and one write of each output; the exception
// is cross-entropy, whose 50257-wide rows are processed in L1-sized chunks with an online max.
//
// The per-row work is in plain functions over restrict pointers (the *_row helpers): written
// inline in the parallel lambdas, whose captures are references, GCC left some of these loops
// scalar. Nothing inside a parallel region throws (an exception cannot leave an OpenMP region);
// arguments are checked before it.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/fast_math.h"
#include "backend/cpu/rows16.h"
#include "ds/core/error.h"
#include "ds/core/parallel.h"
#include "ds/core/rng.h"

namespace ds::backend {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr uint32_t kNegInfBits = 0xff800000u;
// Fixed number of row chunks for cross-row reductions: independent of the thread count, so the
// weight gradients are bitwise reproducible on any machine; 64 keeps the partials small
// (64 x C floats) and leaves enough chunks for any realistic core count.
constexpr int64_t kReduceChunks = 64;
// Cross-entropy works on a row in chunks of this many floats (8 KB: stays in L1 between passes).
constexpr int64_t kCeChunk = 2048;

void require_f32(const Tensor& t, const char* op) {
  DS_CHECK(t.dtype() == DType::f32 && t.is_contiguous(),
           "[cpu:{}] kernel takes contiguous fp32, got {}{}", op, dtype_name(t.dtype()),
           t.is_contiguous() ? "" : " (strided)");
}

void check_ids(const Tensor& ids, const char* op) {
  DS_CHECK(ids.dtype() == DType::i32 || ids.dtype() == DType::i64,
           "[cpu:{}] ids must be int32 or int64, got {}", op, dtype_name(ids.dtype()));
  DS_CHECK(ids.is_contiguous(), "[cpu:{}] ids must be contiguous", op);
}

// Checks every id is in [0, V) (or equal to `allowed`, the ignore index, when given).
void check_id_range(const Tensor& ids, int64_t V, const char* op, const char* what,
                    const int64_t* allowed = nullptr) {
  const int64_t n = ids.numel();
  const bool i64 = ids.dtype() == DType::i64;
  const void* p = ids.raw_data();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = i64 ? static_cast<const int64_t*>(p)[i] : static_cast<const int32_t*>(p)[i];
    if (allowed && id == *allowed) continue;
    DS_CHECK(id >= 0 && id < V, "[cpu:{}] {} {} out of range for size {}", op, what, id, V);
  }
}

inline int64_t index_at(const void* ids, bool i64, int64_t n) {
  return i64 ? static_cast<const int64_t*>(ids)[n] : static_cast<const int32_t*>(ids)[n];
}

// Rows per task for a row kernel over (rows, C): at least ~16K elements per task.
int64_t row_grain(int64_t C) { return std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(C, 1)); }

// fn(r, x, y) for every row r of `in` (rows of C), writing row r of `out`: in parallel tasks, a
// block of rows at a time through fp32 scratch (rows16.h; fp32 tensors are read in place, and `in`
// may be `out` when fn allows it).
template <class F>
void map_rows(const Rows& in, const Rows& out, int64_t rows, int64_t C, F fn) {
  const int64_t blk = rows_per_block(C);
  parallel_for(rows, row_grain(C), [&](int64_t r0, int64_t r1) {
    RowReader rd(in, blk);
    RowWriter wr(out, blk);
    for (int64_t b0 = r0; b0 < r1; b0 += blk) {
      const int64_t n = std::min(blk, r1 - b0);
      const float* px = rd.read(b0, n);
      float* py = wr.rows(b0, n);
      for (int64_t i = 0; i < n; ++i) fn(b0 + i, px + i * C, py + i * C);
      wr.commit();
    }
  });
}

// ---- per-row helpers ----

inline float row_sum(const float* __restrict x, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += x[i];
  return s;
}

void ln_forward_row(const float* __restrict x, const float* __restrict w, const float* __restrict b,
                    float eps, int64_t C, float* __restrict y, float* mean, float* rstd) {
  // Two passes over an L1-resident row: the centred variance avoids E[x^2] - E[x]^2 cancellation.
  const float mu = row_sum(x, C) / static_cast<float>(C);
  float var = 0.0f;
#pragma omp simd reduction(+ : var)
  for (int64_t i = 0; i < C; ++i) var += (x[i] - mu) * (x[i] - mu);
  const float rs = 1.0f / std::sqrt(var / static_cast<float>(C) + eps);
  if (b) {
#pragma omp simd
    for (int64_t i = 0; i < C; ++i) y[i] = (x[i] - mu) * rs * w[i] + b[i];
  } else {
#pragma omp simd
    for (int64_t i = 0; i < C; ++i) y[i] = (x[i] - mu) * rs * w[i];
  }
  *mean = mu;
  *rstd = rs;
}

// Adds the row's dw (and db unless null) terms into dwp / dbp.
void ln_backward_row(const float* __restrict g, const float* __restrict x, const float* __restrict w,
                     float mu, float rs, int64_t C, float* __restrict dx, float* __restrict dwp,
                     float* __restrict dbp) {
  // dx = rstd * (g*w - mean(g*w) - xhat * mean(g*w*xhat)), xhat = (x - mu) * rstd.
  float s1 = 0.0f, s2 = 0.0f;
#pragma omp simd reduction(+ : s1, s2)
  for (int64_t i = 0; i < C; ++i) {
    const float xh = (x[i] - mu) * rs;
    const float gw = g[i] * w[i];
    s1 += gw;
    s2 += gw * xh;
    dwp[i] += g[i] * xh;
  }
  if (dbp) {
#pragma omp simd
    for (int64_t i = 0; i < C; ++i) dbp[i] += g[i];
  }
  const float m1 = s1 / static_cast<float>(C), m2 = s2 / static_cast<float>(C);
#pragma omp simd
  for (int64_t i = 0; i < C; ++i) dx[i] = rs * (g[i] * w[i] - m1 - (x[i] - mu) * rs * m2);
}

float rms_forward_row(const float* __restrict x, const float* __restrict w, float eps, int64_t C,
                      float* __restrict y) {
  float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < C; ++i) ss += x[i] * x[i];
  const float rs = 1.0f / std::sqrt(ss / static_cast<float>(C) + eps);
#pragma omp simd
  for (int64_t i = 0; i < C; ++i) y[i] = x[i] * rs * w[i];
  return rs;
}

// Adds the row's dw terms into dwp.
void rms_backward_row(const float* __restrict g, const float* __restrict x, const float* __restrict w,
                      float rs, int64_t C, float* __restrict dx, float* __restrict dwp) {
  // dx = rstd * g*w - x * rstd^3 * mean(g*w*x)
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < C; ++i) {
    s += g[i] * w[i] * x[i];
    dwp[i] += g[i] * x[i] * rs;
  }
  const float c3 = rs * rs * rs * s / static_cast<float>(C);
#pragma omp simd
  for (int64_t i = 0; i < C; ++i) dx[i] = rs * g[i] * w[i] - x[i] * c3;
}

void softmax_forward_row(const float* __restrict x, int64_t C, float* __restrict y) {
  const float m = fm::max_of(x, C);
  if (m == kNegInf) {  // a fully masked row: define as zeros rather than NaN
    std::fill(y, y + C, 0.0f);
    return;
  }
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < C; ++i) {
    // fm::exp clamps its argument, so exp(-inf) would come out as ~1e-38 instead of 0: masked
    // entries are zeroed explicitly (a bit compare: see fast_math.h on float compares).
    const float e = fm::detail::select(fm::detail::mask(fm::detail::bits(x[i]) == kNegInfBits), 0.0f,
                                       fm::exp(x[i] - m));
    y[i] = e;
    s += e;
  }
  const float inv = 1.0f / s;
#pragma omp simd
  for (int64_t i = 0; i < C; ++i) y[i] *= inv;
}

void softmax_backward_row(const float* __restrict y, const float* __restrict g, int64_t C,
                          float* __restrict dx) {
  float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
  for (int64_t i = 0; i < C; ++i) dot += y[i] * g[i];
#pragma omp simd
  for (int64_t i = 0; i < C; ++i) dx[i] = y[i] * (g[i] - dot);
}

// out may alias x: both halves are read before either is written. Not restrict for that reason.
// One row of hd values: the first 2 * half rotate, pairs (i, i + half) (rotate_half) or (2i, 2i+1)
// (interleaved); the rest are copied.
void rope_row(const float* x, const float* __restrict c, const float* __restrict s, int64_t half,
              int64_t hd, bool interleaved, float* out) {
  if (interleaved) {
    for (int64_t i = 0; i < half; ++i) {
      const float a = x[2 * i], b = x[2 * i + 1];
      out[2 * i] = a * c[i] - b * s[i];
      out[2 * i + 1] = b * c[i] + a * s[i];
    }
  } else {
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      const float a = x[i], b = x[i + half];
      out[i] = a * c[i] - b * s[i];
      out[i + half] = b * c[i] + a * s[i];
    }
  }
  for (int64_t i = 2 * half; i < hd; ++i) out[i] = x[i];
}

constexpr int64_t kPrefetchBlock = 256;  // floats of the current chunk per 16 prefetched lines

inline float sum_exp(const float* __restrict x, int64_t n, float m) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += fm::exp(x[i] - m);
  return s;
}

// log(sum(exp(x))) of one row, reading it once from memory: each chunk's max (first read), then
// the chunk's sum of exp from L1, rescaling the running sum when the max grows. One exp per element.
float logsumexp_row(const float* __restrict x, int64_t V) {
  float m = kNegInf, s = 0.0f;
  for (int64_t c0 = 0; c0 < V; c0 += kCeChunk) {
    const int64_t len = std::min(kCeChunk, V - c0);
    const float* xc = x + c0;
    const float cm = fm::max_of(xc, len);
    if (cm == kNegInf) continue;  // every logit of this chunk is -inf: contributes nothing
    if (cm > m) {
      s = m == kNegInf ? 0.0f : s * fm::exp(m - cm);
      m = cm;
    }
    // The exp pass is compute-bound and the max pass memory-bound: prefetching the next chunk
    // during this one overlaps the two instead of alternating between them.
    for (int64_t b0 = 0; b0 < len; b0 += kPrefetchBlock) {
      for (int64_t l = 0; l < kPrefetchBlock; l += 16) __builtin_prefetch(xc + kCeChunk + b0 + l);
      s += sum_exp(xc + b0, std::min(kPrefetchBlock, len - b0), m);
    }
  }
  return m + std::log(s);
}

// out[i] = exp(x[i] - lse) * scale for one chunk.
void softmax_scaled_chunk(const float* __restrict x, int64_t n, float lse, float scale,
                          float* __restrict out) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = fm::exp(x[i] - lse) * scale;
}

// Floats from p to the next 32-byte boundary (p is at least 4-byte aligned).
inline int64_t floats_to_alignment(const float* p) {
  return static_cast<int64_t>(((32 - (reinterpret_cast<uintptr_t>(p) & 31)) & 31) / 4);
}

// dst[0, n) = src[0, n) with streaming (non-temporal) stores; dst must be 32-byte aligned. The
// (N, V) logits gradient is far larger than any cache: ordinary stores would first read every
// line they write (read-for-ownership), streaming stores do not.
inline void stream_copy(float* __restrict dst, const float* __restrict src, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));
  for (; i < n; ++i) dst[i] = src[i];
}

// (softmax(x) - onehot(t)) * scale for one row of V logits, streamed to d; zeros when ignored.
void cross_entropy_grad_row(const float* __restrict x, int64_t V, int64_t t, bool ignored, float lse,
                            float scale, float* __restrict d, float* __restrict buf /* (kCeChunk) */) {
  // A scalar head up to the 32-byte boundary, then chunks computed into buf (vectorised) and
  // streamed out. The one-hot term goes into buf, so no streamed element is ever read back.
  const int64_t head = std::min(V, floats_to_alignment(d));
  for (int64_t i = 0; i < head; ++i)
    d[i] = ignored ? 0.0f : fm::exp(x[i] - lse) * scale - (i == t ? scale : 0.0f);
  for (int64_t c0 = head; c0 < V; c0 += kCeChunk) {
    const int64_t len = std::min(kCeChunk, V - c0);
    if (ignored) {
      std::fill(buf, buf + len, 0.0f);
    } else {
      softmax_scaled_chunk(x + c0, len, lse, scale, buf);
      if (t >= c0 && t < c0 + len) buf[t - c0] -= scale;
    }
    stream_copy(d + c0, buf, len);
  }
}

// The 16-bit forms of the two row helpers above: each chunk of the row is widened into buf (fp32,
// kCeChunk floats, in L1) and the same fp32 passes run on it, so the results equal those of the
// fp32 helpers on the widened row bit for bit (same chunks, same order); the gradient is narrowed
// into d (round to nearest even) as the old path's whole-tensor narrowing did.
float logsumexp_row16(const char* x, DType dt, int64_t V, float* __restrict buf) {
  const int64_t es = static_cast<int64_t>(dtype_size(dt));
  float m = kNegInf, s = 0.0f;
  for (int64_t c0 = 0; c0 < V; c0 += kCeChunk) {
    const int64_t len = std::min(kCeChunk, V - c0);
    convert(x + c0 * es, dt, buf, DType::f32, static_cast<size_t>(len));
    const float cm = fm::max_of(buf, len);
    if (cm == kNegInf) continue;
    if (cm > m) {
      s = m == kNegInf ? 0.0f : s * fm::exp(m - cm);
      m = cm;
    }
    for (int64_t b0 = 0; b0 < len; b0 += kPrefetchBlock)
      s += sum_exp(buf + b0, std::min(kPrefetchBlock, len - b0), m);
  }
  return m + std::log(s);
}

void cross_entropy_grad_row16(const char* x, DType xt, int64_t V, int64_t t, bool ignored,
                              float lse, float scale, char* d, DType dt,
                              float* __restrict xbuf, float* __restrict gbuf /* (kCeChunk) */) {
  const int64_t xs = static_cast<int64_t>(dtype_size(xt)), ds = static_cast<int64_t>(dtype_size(dt));
  for (int64_t c0 = 0; c0 < V; c0 += kCeChunk) {
    const int64_t len = std::min(kCeChunk, V - c0);
    if (ignored) {
      std::fill(gbuf, gbuf + len, 0.0f);
    } else {
      convert(x + c0 * xs, xt, xbuf, DType::f32, static_cast<size_t>(len));
      softmax_scaled_chunk(xbuf, len, lse, scale, gbuf);
      if (t >= c0 && t < c0 + len) gbuf[t - c0] -= scale;
    }
    convert(gbuf, DType::f32, d + c0 * ds, dt, static_cast<size_t>(len));
  }
}

// out[i] = x[i] * keep(index0 + i) / (1 - p) for a chunk.
void dropout_chunk(const float* __restrict x, int64_t n, uint64_t seed, uint64_t stream,
                   uint64_t index0, uint64_t threshold, float keep_scale, float* __restrict out) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = (rng::hash3(seed, stream, index0 + static_cast<uint64_t>(i)) >> 40) >= threshold;
    out[i] = fm::detail::select(fm::detail::mask(keep), x[i] * keep_scale, 0.0f);
  }
}

// dst (C) += src (C) over a column slice.
inline void add_row(float* __restrict dst, const float* __restrict src, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

// out (C) += sum over k of partials (nchunks, C), added in chunk order. Parallel over C.
void add_partials(const float* partials, int64_t nchunks, int64_t C, float* out) {
  parallel_for(C, 256, [&](int64_t c0, int64_t c1) {
    for (int64_t k = 0; k < nchunks; ++k) add_row(out + c0, partials + k * C + c0, c1 - c0);
  });
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Layer norm, RMS norm, softmax and rotary embedding take fp32, bf16 or fp16 activations (x, y,
// dy, dx; each its own dtype) through RowReader / RowWriter (rows16.h): a 16-bit row block is
// widened into L1 scratch, runs the same fp32 row helper as an fp32 tensor, and its outputs are
// narrowed as they are written, so the result is the fp32 kernel's, rounded once. Weights may be
// any float dtype (widened once, C values); statistics (mean, rstd) and weight gradients are fp32.
//
// Layer norm: y = (x - mean) * rstd * w + b over the last dim.

void CpuBackend::layer_norm_forward(const Tensor& x, const Tensor& w, const Tensor& b, float eps,
                                    const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  for (const Tensor* t : {&x, &w, &y}) require_float_rows(*t, "layer_norm");
  if (b.defined()) require_float_rows(b, "layer_norm");
  require_f32(mean, "layer_norm");
  require_f32(rstd, "layer_norm");
  const int64_t C = x.size(-1), rows = x.numel() / std::max<int64_t>(C, 1);
  const Floats fw(w), fb(b);
  const float* pw = fw.get();
  const float* pb = fb.get();  // null without a bias
  float* pm = mean.data<float>();  // (rows)
  float* pr = rstd.data<float>();  // (rows)
  map_rows(Rows(x, C), Rows(y, C), rows, C, [&](int64_t r, const float* px, float* py) {
    ln_forward_row(px, pw, pb, eps, C, py, pm + r, pr + r);
  });
}

void CpuBackend::layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w,
                                     const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                                     const Tensor& dw, const Tensor& db) {
  for (const Tensor* t : {&dy, &x, &w, &dx}) require_float_rows(*t, "layer_norm_backward");
  for (const Tensor* t : {&mean, &rstd, &dw}) require_f32(*t, "layer_norm_backward");
  if (db.defined()) require_f32(db, "layer_norm_backward");
  const int64_t C = x.size(-1), rows = x.numel() / std::max<int64_t>(C, 1);
  if (rows == 0) return;
  const Floats fw(w);
  const float* pw = fw.get();
  const float* pm = mean.data<float>();
  const float* pr = rstd.data<float>();
  const Rows gr(dy, C), xr(x, C), dxr(dx, C);
  const bool has_b = db.defined();
  const int64_t nchunks = std::min(rows, kReduceChunks), blk = rows_per_block(C);
  // (nchunks, C) partial dw, then (nchunks, C) partial db
  std::vector<float> part(static_cast<size_t>(nchunks * C * (has_b ? 2 : 1)), 0.0f);
  parallel_for(nchunks, 1, [&](int64_t k0, int64_t k1) {
    RowReader gin(gr, blk), xin(xr, blk);
    RowWriter out(dxr, blk);
    for (int64_t k = k0; k < k1; ++k) {
      float* dwp = part.data() + k * C;
      float* dbp = has_b ? part.data() + (nchunks + k) * C : nullptr;
      const int64_t e = rows * (k + 1) / nchunks;
      for (int64_t b0 = rows * k / nchunks; b0 < e; b0 += blk) {
        const int64_t n = std::min(blk, e - b0);
        const float* pg = gin.read(b0, n);
        const float* px = xin.read(b0, n);
        float* pd = out.rows(b0, n);
        for (int64_t i = 0; i < n; ++i)
          ln_backward_row(pg + i * C, px + i * C, pw, pm[b0 + i], pr[b0 + i], C, pd + i * C, dwp,
                          dbp);
        out.commit();
      }
    }
  });
  add_partials(part.data(), nchunks, C, dw.data<float>());
  if (has_b) add_partials(part.data() + nchunks * C, nchunks, C, db.data<float>());
}

// ---------------------------------------------------------------------------------------------
// RMS norm: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps).

void CpuBackend::rms_norm_forward(const Tensor& x, const Tensor& w, float eps, const Tensor& y,
                                  const Tensor& rstd) {
  for (const Tensor* t : {&x, &w, &y}) require_float_rows(*t, "rms_norm");
  require_f32(rstd, "rms_norm");
  const int64_t C = x.size(-1), rows = x.numel() / std::max<int64_t>(C, 1);
  const Floats fw(w);
  const float* pw = fw.get();
  float* pr = rstd.data<float>();  // (rows)
  map_rows(Rows(x, C), Rows(y, C), rows, C, [&](int64_t r, const float* px, float* py) {
    pr[r] = rms_forward_row(px, pw, eps, C, py);
  });
}

void CpuBackend::rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w,
                                   const Tensor& rstd, const Tensor& dx, const Tensor& dw) {
  for (const Tensor* t : {&dy, &x, &w, &dx}) require_float_rows(*t, "rms_norm_backward");
  require_f32(rstd, "rms_norm_backward");
  require_f32(dw, "rms_norm_backward");
  const int64_t C = x.size(-1), rows = x.numel() / std::max<int64_t>(C, 1);
  if (rows == 0) return;
  const Floats fw(w);
  const float* pw = fw.get();
  const float* pr = rstd.data<float>();
  const Rows gr(dy, C), xr(x, C), dxr(dx, C);
  const int64_t nchunks = std::min(rows, kReduceChunks), blk = rows_per_block(C);
  std::vector<float> part(static_cast<size_t>(nchunks * C), 0.0f);  // (nchunks, C) partial dw
  parallel_for(nchunks, 1, [&](int64_t k0, int64_t k1) {
    RowReader gin(gr, blk), xin(xr, blk);
    RowWriter out(dxr, blk);
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t e = rows * (k + 1) / nchunks;
      for (int64_t b0 = rows * k / nchunks; b0 < e; b0 += blk) {
        const int64_t n = std::min(blk, e - b0);
        const float* pg = gin.read(b0, n);
        const float* px = xin.read(b0, n);
        float* pd = out.rows(b0, n);
        for (int64_t i = 0; i < n; ++i)
          rms_backward_row(pg + i * C, px + i * C, pw, pr[b0 + i], C, pd + i * C,
                           part.data() + k * C);
        out.commit();
      }
    }
  });
  add_partials(part.data(), nchunks, C, dw.data<float>());
}

// ---------------------------------------------------------------------------------------------
// Softmax over the last dim. The backward reads y in its own dtype: a 16-bit forward's rounded
// output (what autograd saved), as PyTorch's bf16 softmax backward does.

void CpuBackend::softmax_forward(const Tensor& x, const Tensor& y) {
  require_float_rows(x, "softmax");
  require_float_rows(y, "softmax");
  const int64_t C = x.size(-1), rows = x.numel() / std::max<int64_t>(C, 1);
  map_rows(Rows(x, C), Rows(y, C), rows, C,
           [&](int64_t, const float* px, float* py) { softmax_forward_row(px, C, py); });
}

void CpuBackend::softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  for (const Tensor* t : {&y, &dy, &dx}) require_float_rows(*t, "softmax_backward");
  const int64_t C = y.size(-1), rows = y.numel() / std::max<int64_t>(C, 1);
  const Rows yr(y, C), gr(dy, C), dxr(dx, C);
  const int64_t blk = rows_per_block(C);
  parallel_for(rows, row_grain(C), [&](int64_t r0, int64_t r1) {
    RowReader yin(yr, blk), gin(gr, blk);
    RowWriter out(dxr, blk);
    for (int64_t b0 = r0; b0 < r1; b0 += blk) {
      const int64_t n = std::min(blk, r1 - b0);
      const float* py = yin.read(b0, n);
      const float* pg = gin.read(b0, n);
      float* pd = out.rows(b0, n);
      for (int64_t i = 0; i < n; ++i) softmax_backward_row(py + i * C, pg + i * C, C, pd + i * C);
      out.commit();
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Rotary embedding, rotate_half convention: pairs (i, i + hd/2) rotated by angle p * inv_freq[i].

void CpuBackend::rope(const Tensor& x, int64_t pos0, const std::vector<double>& inv_freq,
                      float scale, bool interleaved, bool inverse, const Tensor& out) {
  require_float_rows(x, "rope");
  require_float_rows(out, "rope");
  DS_CHECK(x.dim() == 4, "[cpu:rope] needs (B, NH, T, hd), got {}", shape_str(x.shape()));
  const int64_t T = x.size(2), hd = x.size(3), half = static_cast<int64_t>(inv_freq.size());
  DS_CHECK(half > 0 && 2 * half <= hd,
           "[cpu:rope] {} inverse frequencies for head size {} (need 1 .. hd/2)", inv_freq.size(),
           hd);
  const int64_t rows = x.numel() / std::max<int64_t>(hd, 1);  // B * NH * T
  // (T, half) tables, angles in double so that long positions keep their precision.
  std::vector<float> cos_t(static_cast<size_t>(T * half)), sin_t(static_cast<size_t>(T * half));
  for (int64_t i = 0; i < half; ++i) {
    for (int64_t t = 0; t < T; ++t) {
      const double a = static_cast<double>(pos0 + t) * inv_freq[static_cast<size_t>(i)];
      const double c = std::cos(a) * scale, s = std::sin(a) * scale;
      cos_t[static_cast<size_t>(t * half + i)] = static_cast<float>(c);
      sin_t[static_cast<size_t>(t * half + i)] = static_cast<float>(inverse ? -s : s);
    }
  }
  // px may be po itself (fp32 in place): rope_row allows it.
  map_rows(Rows(x, hd), Rows(out, hd), rows, hd, [&](int64_t r, const float* px, float* po) {
    const int64_t t = r % T;
    rope_row(px, cos_t.data() + t * half, sin_t.data() + t * half, half, hd, interleaved, po);
  });
}

// ---------------------------------------------------------------------------------------------
// Embedding.

// A row copy: any float dtype, out in weight's (a 16-bit table is read as it is: widening all of
// it to gather a few rows cost a decode step 4 bytes of traffic per embedding value).
void CpuBackend::embedding_forward(const Tensor& weight, const Tensor& ids, const Tensor& out) {
  require_float_rows(weight, "embedding");
  require_float_rows(out, "embedding");
  DS_CHECK(weight.dtype() == out.dtype(), "[cpu:embedding] weight {} and out {} dtypes differ",
           dtype_name(weight.dtype()), dtype_name(out.dtype()));
  check_ids(ids, "embedding");
  const int64_t V = weight.size(0), C = weight.size(1), N = ids.numel();
  check_id_range(ids, V, "embedding", "id");
  const bool i64 = ids.dtype() == DType::i64;
  const void* pid = ids.raw_data();
  const size_t row_bytes = static_cast<size_t>(C) * dtype_size(weight.dtype());
  const char* pw = static_cast<const char*>(weight.raw_data());
  char* po = static_cast<char*>(out.raw_data());  // (N, C)
  parallel_for(N, row_grain(C), [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      std::memcpy(po + static_cast<size_t>(n) * row_bytes,
                  pw + static_cast<size_t>(index_at(pid, i64, n)) * row_bytes, row_bytes);
  });
}

namespace {

// embedding_backward with a 16-bit dweight: the positions of each id in input order (a counting
// sort), then one id per task: its row widened, the upstream rows added in input order in fp32,
// the sum narrowed once. The fp32 path adds the same rows in the same order from the same start,
// so the result is its narrowing bit for bit, without a (V, C) fp32 gradient.
void embedding_backward16(const Tensor& dout, const Tensor& ids, const Tensor& dweight) {
  const int64_t V = dweight.size(0), C = dweight.size(1), N = ids.numel();
  const bool i64 = ids.dtype() == DType::i64;
  const void* pid = ids.raw_data();
  std::vector<int64_t> start(static_cast<size_t>(V) + 1, 0), order(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) ++start[static_cast<size_t>(index_at(pid, i64, n)) + 1];
  for (int64_t v = 0; v < V; ++v) start[static_cast<size_t>(v) + 1] += start[static_cast<size_t>(v)];
  std::vector<int64_t> fill(start.begin(), start.end() - 1), touched;
  for (int64_t n = 0; n < N; ++n) order[static_cast<size_t>(fill[static_cast<size_t>(index_at(pid, i64, n))]++)] = n;
  for (int64_t v = 0; v < V; ++v)
    if (start[static_cast<size_t>(v) + 1] > start[static_cast<size_t>(v)]) touched.push_back(v);
  const DType gt = dout.dtype(), wt = dweight.dtype();
  const int64_t gs = static_cast<int64_t>(dtype_size(gt)), ws = static_cast<int64_t>(dtype_size(wt));
  const char* pg = static_cast<const char*>(dout.raw_data());
  char* pw = static_cast<char*>(dweight.raw_data());
  parallel_for(static_cast<int64_t>(touched.size()), 1, [&](int64_t k0, int64_t k1) {
    std::vector<float> acc(static_cast<size_t>(C)), row(static_cast<size_t>(C));
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t v = touched[static_cast<size_t>(k)];
      convert(pw + v * C * ws, wt, acc.data(), DType::f32, acc.size());
      for (int64_t j = start[static_cast<size_t>(v)]; j < start[static_cast<size_t>(v) + 1]; ++j) {
        convert(pg + order[static_cast<size_t>(j)] * C * gs, gt, row.data(), DType::f32, row.size());
        add_row(acc.data(), row.data(), C);
      }
      convert(acc.data(), DType::f32, pw + v * C * ws, wt, acc.size());
    }
  });
}

}  // namespace

void CpuBackend::embedding_backward(const Tensor& dout, const Tensor& ids, const Tensor& dweight) {
  require_float_rows(dout, "embedding_backward");
  require_float_rows(dweight, "embedding_backward");
  check_ids(ids, "embedding_backward");
  const int64_t V = dweight.size(0), C = dweight.size(1), N = ids.numel();
  DS_CHECK(dout.numel() == N * C, "[cpu:embedding_backward] dout has {} values for {} ids x {}",
           dout.numel(), N, C);
  check_id_range(ids, V, "embedding_backward", "id");
  if (dweight.dtype() != DType::f32) return embedding_backward16(dout, ids, dweight);
  const bool i64 = ids.dtype() == DType::i64;
  const void* pid = ids.raw_data();
  float* pw = dweight.data<float>();  // (V, C)
  // Deterministic scatter without atomics: threads own column slices of dweight and add the rows
  // in input order, so a repeated id always accumulates in the same order. A 16-bit dout is
  // widened a column slice at a time.
  constexpr int64_t kCols = 64;
  const int64_t nslices = (C + kCols - 1) / kCols;
  const DType gt = dout.dtype();
  const int64_t gs = static_cast<int64_t>(dtype_size(gt));
  const char* pg = static_cast<const char*>(dout.raw_data());  // (N, C)
  parallel_for(nslices, 1, [&](int64_t s0, int64_t s1) {
    const int64_t c0 = s0 * kCols, c1 = std::min(C, s1 * kCols);
    std::vector<float> buf(gt == DType::f32 ? 0 : static_cast<size_t>(c1 - c0));
    for (int64_t n = 0; n < N; ++n) {
      const char* src = pg + (n * C + c0) * gs;
      const float* g = reinterpret_cast<const float*>(src);
      if (gt != DType::f32) {
        convert(src, gt, buf.data(), DType::f32, buf.size());
        g = buf.data();
      }
      add_row(pw + index_at(pid, i64, n) * C + c0, g, c1 - c0);
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Cross-entropy. Rows are (N, V) logits; V is large (50257 for GPT-2), so one row is ~200 KB and
// the whole (2048, V) tensor is ~400 MB: both kernels make a single pass over the logits (forward:
// one read; backward: one read and one streamed write).

void CpuBackend::cross_entropy_forward(const Tensor& logits, const Tensor& targets,
                                       int64_t ignore_index, const Tensor& losses, const Tensor& lse) {
  require_float_rows(logits, "cross_entropy");
  for (const Tensor* t : {&losses, &lse}) require_f32(*t, "cross_entropy");
  check_ids(targets, "cross_entropy");
  const int64_t V = logits.size(-1), N = logits.numel() / std::max<int64_t>(V, 1);
  DS_CHECK(targets.numel() == N, "[cpu:cross_entropy] {} targets for {} rows", targets.numel(), N);
  check_id_range(targets, V, "cross_entropy", "target", &ignore_index);
  const bool i64 = targets.dtype() == DType::i64;
  const void* pt = targets.raw_data();
  float* pl = losses.data<float>();  // (N)
  float* ps = lse.data<float>();     // (N)
  if (logits.dtype() != DType::f32) {  // 16-bit logits, widened a chunk at a time
    const DType dt = logits.dtype();
    const int64_t es = static_cast<int64_t>(dtype_size(dt));
    const char* px = static_cast<const char*>(logits.raw_data());
    parallel_for(N, 1, [&](int64_t n0, int64_t n1) {
      alignas(64) float buf[kCeChunk];
      for (int64_t n = n0; n < n1; ++n) {
        const char* row = px + n * V * es;
        const float l = logsumexp_row16(row, dt, V, buf);
        const int64_t t = index_at(pt, i64, n);
        ps[n] = l;
        float xt = 0.0f;
        if (t != ignore_index) convert(row + t * es, dt, &xt, DType::f32, 1);
        pl[n] = t == ignore_index ? 0.0f : l - xt;
      }
    });
    return;
  }
  const float* px = logits.data<float>();
  parallel_for(N, 1, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const float* row = px + n * V;
      const float l = logsumexp_row(row, V);
      const int64_t t = index_at(pt, i64, n);
      ps[n] = l;
      pl[n] = t == ignore_index ? 0.0f : l - row[t];
    }
  });
}

void CpuBackend::cross_entropy_backward(const Tensor& logits, const Tensor& targets,
                                        int64_t ignore_index, const Tensor& lse, float scale,
                                        const Tensor& dlogits) {
  require_float_rows(logits, "cross_entropy_backward");
  require_float_rows(dlogits, "cross_entropy_backward");
  require_f32(lse, "cross_entropy_backward");
  check_ids(targets, "cross_entropy_backward");
  const int64_t V = logits.size(-1), N = logits.numel() / std::max<int64_t>(V, 1);
  DS_CHECK(targets.numel() == N, "[cpu:cross_entropy_backward] {} targets for {} rows", targets.numel(), N);
  DS_CHECK(dlogits.numel() == logits.numel(),
           "[cpu:cross_entropy_backward] dlogits has {} values for {} logits", dlogits.numel(),
           logits.numel());
  check_id_range(targets, V, "cross_entropy_backward", "target", &ignore_index);
  const bool i64 = targets.dtype() == DType::i64;
  const void* pt = targets.raw_data();
  const float* ps = lse.data<float>();
  if (logits.dtype() != DType::f32 || dlogits.dtype() != DType::f32) {
    // 16-bit logits or gradient: chunks widened and narrowed in L1. With one dtype the gradient
    // may be written over the logits (the same buffer): each chunk is read before it is written.
    const DType xt = logits.dtype(), dt = dlogits.dtype();
    const int64_t xs = static_cast<int64_t>(dtype_size(xt)), ds = static_cast<int64_t>(dtype_size(dt));
    const char* px = static_cast<const char*>(logits.raw_data());
    char* pd = static_cast<char*>(dlogits.raw_data());
    parallel_for(N, 1, [&](int64_t n0, int64_t n1) {
      alignas(64) float xbuf[kCeChunk], gbuf[kCeChunk];
      for (int64_t n = n0; n < n1; ++n) {
        const int64_t t = index_at(pt, i64, n);
        cross_entropy_grad_row16(px + n * V * xs, xt, V, t, t == ignore_index, ps[n], scale,
                                 pd + n * V * ds, dt, xbuf, gbuf);
      }
    });
    return;
  }
  const float* px = logits.data<float>();
  float* pd = dlogits.data<float>();  // (N, V)
  parallel_for(N, 1, [&](int64_t n0, int64_t n1) {
    alignas(32) float buf[kCeChunk];  // one chunk of a row's gradient, computed in L1
    for (int64_t n = n0; n < n1; ++n) {
      const int64_t t = index_at(pt, i64, n);
      cross_entropy_grad_row(px + n * V, V, t, t == ignore_index, ps[n], scale, pd + n * V, buf);
    }
    _mm_sfence();  // streaming stores are weakly ordered: drain them before the region's barrier
  });
}

// ---------------------------------------------------------------------------------------------
// Dropout: mask[i] = rng::uniform01(hash3(seed, stream, base + i)) >= p, out = x * mask / (1 - p).

void CpuBackend::dropout(const Tensor& x, float p, uint64_t seed, uint64_t stream, uint64_t base,
                         const Tensor& out) {
  DS_CHECK(is_floating(x.dtype()) && is_floating(out.dtype()) && x.is_contiguous() &&
               out.is_contiguous() && x.numel() == out.numel(),
           "[cpu:dropout] needs contiguous floating tensors of equal size");
  DS_CHECK(p >= 0.0f && p < 1.0f, "[cpu:dropout] p = {} must be in [0, 1)", p);
  const int64_t n = x.numel();
  const float keep_scale = 1.0f / (1.0f - p);
  // uniform01(h) = (h >> 40) / 2^24 exactly, so uniform01(h) >= p  <=>  (h >> 40) >= ceil(p 2^24).
  // The integer form keeps the loop vectorised (a float compare would not be; see fast_math.h).
  const uint64_t threshold = static_cast<uint64_t>(std::ceil(static_cast<double>(p) * 16777216.0));
  if (x.dtype() == DType::f32 && out.dtype() == DType::f32) {
    const float* px = x.data<float>();
    float* po = out.data<float>();
    parallel_for(n, 1 << 14, [&](int64_t b, int64_t e) {
      dropout_chunk(px + b, e - b, seed, stream, base + static_cast<uint64_t>(b), threshold, keep_scale, po + b);
    });
    return;
  }
  // 16-bit: convert chunks to fp32 and back.
  const char* px = static_cast<const char*>(x.raw_data());
  char* po = static_cast<char*>(out.raw_data());
  const int64_t xs = static_cast<int64_t>(dtype_size(x.dtype())), os = static_cast<int64_t>(dtype_size(out.dtype()));
  parallel_for(n, 1 << 14, [&](int64_t b, int64_t e) {
    constexpr int64_t kChunk = 2048;
    float fx[kChunk], fo[kChunk];
    for (int64_t i = b; i < e; i += kChunk) {
      const int64_t m = std::min(kChunk, e - i);
      convert(px + i * xs, x.dtype(), fx, DType::f32, static_cast<size_t>(m));
      dropout_chunk(fx, m, seed, stream, base + static_cast<uint64_t>(i), threshold, keep_scale, fo);
      convert(fo, DType::f32, po + i * os, out.dtype(), static_cast<size_t>(m));
    }
  });
}

}  // namespace ds::backend

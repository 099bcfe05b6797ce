// CPU neural-network kernels: layer norm, RMS norm, softmax, rotary embedding, embedding gather and
// scatter, cross-entropy, dropout. Attention lives in attention.cpp.
//
// Every kernel is parallel over rows and keeps each row's arithmetic in one thread in a fixed order,
// so results do not depend on the thread count. Sums across rows (the weight gradients of the norms)
// go through per-chunk partials whose chunking depends only on the row count, then are added in
// chunk order. Rows are short enough (C <= a few thousand) to sit in L1 between the passes of a
// kernel, so memory traffic is one read of each input and one write of each output; the exception
// is cross-entropy, whose 50257-wide rows are processed in L1-sized chunks with an online max.
// Nothing inside a parallel region throws (an exception cannot leave an OpenMP region); arguments
// are checked before it.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/fast_math.h"
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

void require_f32(const Tensor& t, const char* op) {
  DS_CHECK(t.dtype() == DType::f32 && t.is_contiguous(), "[cpu:{}] kernel takes contiguous fp32, got {}{}",
           op, dtype_name(t.dtype()), t.is_contiguous() ? "" : " (strided)");
}

// Rows for a row kernel over x (..., C): grain so that one task is at least ~16K elements.
int64_t row_grain(int64_t C) { return std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(C, 1)); }

inline float row_max(const float* x, int64_t n) { return fm::max_of(x, n); }

inline float row_sum(const float* x, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += x[i];
  return s;
}

// Sums partials (nchunks, C) in chunk order into out (C) (+=). Parallel over C.
void add_partials(const float* partials, int64_t nchunks, int64_t C, float* out) {
  parallel_for(C, 256, [&](int64_t c0, int64_t c1) {
    for (int64_t k = 0; k < nchunks; ++k) {
      const float* p = partials + k * C;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) out[c] += p[c];
    }
  });
}

int64_t index_at(const void* ids, bool i64, int64_t n) {
  return i64 ? static_cast<const int64_t*>(ids)[n] : static_cast<const int32_t*>(ids)[n];
}

void check_ids(const Tensor& ids, const char* op) {
  DS_CHECK(ids.dtype() == DType::i32 || ids.dtype() == DType::i64,
           "[cpu:{}] ids must be int32 or int64, got {}", op, dtype_name(ids.dtype()));
  DS_CHECK(ids.is_contiguous(), "[cpu:{}] ids must be contiguous", op);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Layer norm: y = (x - mean) * rstd * w + b over the last dim.

void CpuBackend::layer_norm_forward(const Tensor& x, const Tensor& w, const Tensor& b, float eps,
                                    const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  require_f32(x, "layer_norm");
  require_f32(w, "layer_norm");
  require_f32(y, "layer_norm");
  if (b.defined()) require_f32(b, "layer_norm");
  const int64_t C = x.size(-1), rows = x.numel() / std::max<int64_t>(C, 1);
  const float* px = x.data<float>();
  const float* pw = w.data<float>();
  const float* pb = b.defined() ? b.data<float>() : nullptr;
  float* py = y.data<float>();
  float* pm = mean.data<float>();  // (rows)
  float* pr = rstd.data<float>();  // (rows)
  parallel_for(rows, row_grain(C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = px + r * C;
      float* yr = py + r * C;
      // Two passes over an L1-resident row: the centred variance avoids E[x^2] - E[x]^2 cancellation.
      const float mu = row_sum(xr, C) / static_cast<float>(C);
      float var = 0.0f;
#pragma omp simd reduction(+ : var)
      for (int64_t i = 0; i < C; ++i) var += (xr[i] - mu) * (xr[i] - mu);
      const float rs = 1.0f / std::sqrt(var / static_cast<float>(C) + eps);
      if (pb) {
#pragma omp simd
        for (int64_t i = 0; i < C; ++i) yr[i] = (xr[i] - mu) * rs * pw[i] + pb[i];
      } else {
#pragma omp simd
        for (int64_t i = 0; i < C; ++i) yr[i] = (xr[i] - mu) * rs * pw[i];
      }
      pm[r] = mu;
      pr[r] = rs;
    }
  });
}

void CpuBackend::layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w,
                                     const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                                     const Tensor& dw, const Tensor& db) {
  require_f32(dy, "layer_norm_backward");
  require_f32(x, "layer_norm_backward");
  require_f32(dx, "layer_norm_backward");
  require_f32(dw, "layer_norm_backward");
  if (db.defined()) require_f32(db, "layer_norm_backward");
  const int64_t C = x.size(-1), rows = x.numel() / std::max<int64_t>(C, 1);
  if (rows == 0) return;
  const float* pdy = dy.data<float>();
  const float* px = x.data<float>();
  const float* pw = w.data<float>();
  const float* pm = mean.data<float>();
  const float* pr = rstd.data<float>();
  float* pdx = dx.data<float>();
  const bool has_b = db.defined();
  // Partials: (nchunks, C) for dw, then (nchunks, C) for db.
  const int64_t nchunks = std::min(rows, kReduceChunks);
  std::vector<float> part(static_cast<size_t>(nchunks * C * (has_b ? 2 : 1)));
  parallel_for(nchunks, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      float* dwp = part.data() + k * C;
      float* dbp = has_b ? part.data() + (nchunks + k) * C : nullptr;
      std::fill(dwp, dwp + C, 0.0f);
      if (dbp) std::fill(dbp, dbp + C, 0.0f);
      for (int64_t r = rows * k / nchunks; r < rows * (k + 1) / nchunks; ++r) {
        const float* g = pdy + r * C;
        const float* xr = px + r * C;
        float* dxr = pdx + r * C;
        const float mu = pm[r], rs = pr[r];
        // dx = rstd * (g*w - mean(g*w) - xhat * mean(g*w*xhat)), xhat = (x - mu) * rstd.
        float s1 = 0.0f, s2 = 0.0f;
        if (dbp) {
#pragma omp simd reduction(+ : s1, s2)
          for (int64_t i = 0; i < C; ++i) {
            const float xh = (xr[i] - mu) * rs;
            const float gw = g[i] * pw[i];
            s1 += gw;
            s2 += gw * xh;
            dwp[i] += g[i] * xh;
            dbp[i] += g[i];
          }
        } else {
#pragma omp simd reduction(+ : s1, s2)
          for (int64_t i = 0; i < C; ++i) {
            const float xh = (xr[i] - mu) * rs;
            const float gw = g[i] * pw[i];
            s1 += gw;
            s2 += gw * xh;
            dwp[i] += g[i] * xh;
          }
        }
        const float m1 = s1 / static_cast<float>(C), m2 = s2 / static_cast<float>(C);
#pragma omp simd
        for (int64_t i = 0; i < C; ++i) {
          const float xh = (xr[i] - mu) * rs;
          dxr[i] = rs * (g[i] * pw[i] - m1 - xh * m2);
        }
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
  require_f32(x, "rms_norm");
  require_f32(w, "rms_norm");
  require_f32(y, "rms_norm");
  const int64_t C = x.size(-1), rows = x.numel() / std::max<int64_t>(C, 1);
  const float* px = x.data<float>();
  const float* pw = w.data<float>();
  float* py = y.data<float>();
  float* pr = rstd.data<float>();  // (rows)
  parallel_for(rows, row_grain(C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = px + r * C;
      float* yr = py + r * C;
      float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < C; ++i) ss += xr[i] * xr[i];
      const float rs = 1.0f / std::sqrt(ss / static_cast<float>(C) + eps);
#pragma omp simd
      for (int64_t i = 0; i < C; ++i) yr[i] = xr[i] * rs * pw[i];
      pr[r] = rs;
    }
  });
}

void CpuBackend::rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w,
                                   const Tensor& rstd, const Tensor& dx, const Tensor& dw) {
  require_f32(dy, "rms_norm_backward");
  require_f32(x, "rms_norm_backward");
  require_f32(dx, "rms_norm_backward");
  require_f32(dw, "rms_norm_backward");
  const int64_t C = x.size(-1), rows = x.numel() / std::max<int64_t>(C, 1);
  if (rows == 0) return;
  const float* pdy = dy.data<float>();
  const float* px = x.data<float>();
  const float* pw = w.data<float>();
  const float* pr = rstd.data<float>();
  float* pdx = dx.data<float>();
  const int64_t nchunks = std::min(rows, kReduceChunks);
  std::vector<float> part(static_cast<size_t>(nchunks * C));  // (nchunks, C) partial dw
  parallel_for(nchunks, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      float* dwp = part.data() + k * C;
      std::fill(dwp, dwp + C, 0.0f);
      for (int64_t r = rows * k / nchunks; r < rows * (k + 1) / nchunks; ++r) {
        const float* g = pdy + r * C;
        const float* xr = px + r * C;
        float* dxr = pdx + r * C;
        const float rs = pr[r];
        // dx = rstd * g*w - x * rstd^3 * mean(g*w*x)
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < C; ++i) {
          s += g[i] * pw[i] * xr[i];
          dwp[i] += g[i] * xr[i] * rs;
        }
        const float c3 = rs * rs * rs * s / static_cast<float>(C);
#pragma omp simd
        for (int64_t i = 0; i < C; ++i) dxr[i] = rs * g[i] * pw[i] - xr[i] * c3;
      }
    }
  });
  add_partials(part.data(), nchunks, C, dw.data<float>());
}

// ---------------------------------------------------------------------------------------------
// Softmax over the last dim.

void CpuBackend::softmax_forward(const Tensor& x, const Tensor& y) {
  require_f32(x, "softmax");
  require_f32(y, "softmax");
  const int64_t C = x.size(-1), rows = x.numel() / std::max<int64_t>(C, 1);
  const float* px = x.data<float>();
  float* py = y.data<float>();
  parallel_for(rows, row_grain(C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = px + r * C;
      float* yr = py + r * C;
      const float m = row_max(xr, C);
      if (m == kNegInf) {  // a fully masked row: define as zeros rather than NaN
        std::fill(yr, yr + C, 0.0f);
        continue;
      }
      float s = 0.0f;
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < C; ++i) {
        // fm::exp clamps its argument, so exp(-inf) would come out as ~1e-38 instead of 0: masked
        // entries are zeroed explicitly (a bit compare: see fast_math.h on float compares).
        const float e = fm::detail::select(fm::detail::mask(fm::detail::bits(xr[i]) == kNegInfBits), 0.0f,
                                           fm::exp(xr[i] - m));
        yr[i] = e;
        s += e;
      }
      const float inv = 1.0f / s;
#pragma omp simd
      for (int64_t i = 0; i < C; ++i) yr[i] *= inv;
    }
  });
}

void CpuBackend::softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  require_f32(y, "softmax_backward");
  require_f32(dy, "softmax_backward");
  require_f32(dx, "softmax_backward");
  const int64_t C = y.size(-1), rows = y.numel() / std::max<int64_t>(C, 1);
  const float* py = y.data<float>();
  const float* pg = dy.data<float>();
  float* pdx = dx.data<float>();
  parallel_for(rows, row_grain(C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* yr = py + r * C;
      const float* g = pg + r * C;
      float* d = pdx + r * C;
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int64_t i = 0; i < C; ++i) dot += yr[i] * g[i];
#pragma omp simd
      for (int64_t i = 0; i < C; ++i) d[i] = yr[i] * (g[i] - dot);
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Rotary embedding, rotate_half convention: pairs (i, i + hd/2) rotated by angle p * theta^(-2i/hd).

void CpuBackend::rope(const Tensor& x, int64_t pos0, float theta, bool inverse, const Tensor& out) {
  require_f32(x, "rope");
  require_f32(out, "rope");
  DS_CHECK(x.dim() == 4, "[cpu:rope] needs (B, NH, T, hd), got {}", shape_str(x.shape()));
  const int64_t T = x.size(2), hd = x.size(3), half = hd / 2;
  DS_CHECK(hd % 2 == 0, "[cpu:rope] head size {} must be even", hd);
  const int64_t rows = x.numel() / std::max<int64_t>(hd, 1);  // B * NH * T
  // (T, hd/2) tables, angles in double so that long positions keep their precision.
  std::vector<float> cos_t(static_cast<size_t>(T * half)), sin_t(static_cast<size_t>(T * half));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double inv_freq = std::pow(static_cast<double>(theta), -2.0 * static_cast<double>(i) / static_cast<double>(hd));
      const double a = static_cast<double>(pos0 + t) * inv_freq;
      cos_t[static_cast<size_t>(t * half + i)] = static_cast<float>(std::cos(a));
      sin_t[static_cast<size_t>(t * half + i)] = static_cast<float>(inverse ? -std::sin(a) : std::sin(a));
    }
  const float* px = x.data<float>();
  float* po = out.data<float>();
  parallel_for(rows, row_grain(hd), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t = r % T;
      const float* c = cos_t.data() + t * half;
      const float* s = sin_t.data() + t * half;
      const float* xr = px + r * hd;
      float* o = po + r * hd;
      // Reads both halves before writing, so out may alias x.
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const float a = xr[i], b = xr[i + half];
        o[i] = a * c[i] - b * s[i];
        o[i + half] = b * c[i] + a * s[i];
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Embedding.

void CpuBackend::embedding_forward(const Tensor& weight, const Tensor& ids, const Tensor& out) {
  require_f32(weight, "embedding");
  require_f32(out, "embedding");
  check_ids(ids, "embedding");
  const int64_t V = weight.size(0), C = weight.size(1), N = ids.numel();
  const bool i64 = ids.dtype() == DType::i64;
  const void* pid = ids.raw_data();
  for (int64_t n = 0; n < N; ++n) {
    const int64_t id = index_at(pid, i64, n);
    DS_CHECK(id >= 0 && id < V, "[cpu:embedding] id {} out of range for vocabulary size {}", id, V);
  }
  const float* pw = weight.data<float>();
  float* po = out.data<float>();
  parallel_for(N, row_grain(C), [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      std::memcpy(po + n * C, pw + index_at(pid, i64, n) * C, static_cast<size_t>(C) * sizeof(float));
  });
}

void CpuBackend::embedding_backward(const Tensor& dout, const Tensor& ids, const Tensor& dweight) {
  require_f32(dout, "embedding_backward");
  require_f32(dweight, "embedding_backward");
  check_ids(ids, "embedding_backward");
  const int64_t V = dweight.size(0), C = dweight.size(1), N = ids.numel();
  const bool i64 = ids.dtype() == DType::i64;
  const void* pid = ids.raw_data();
  for (int64_t n = 0; n < N; ++n) {
    const int64_t id = index_at(pid, i64, n);
    DS_CHECK(id >= 0 && id < V, "[cpu:embedding_backward] id {} out of range for vocabulary size {}", id, V);
  }
  const float* pg = dout.data<float>();
  float* pw = dweight.data<float>();
  // Deterministic scatter without atomics: threads own column slices of dweight and add the rows
  // in input order, so a repeated id always accumulates in the same order.
  constexpr int64_t kCols = 64;
  const int64_t nslices = (C + kCols - 1) / kCols;
  parallel_for(nslices, 1, [&](int64_t s0, int64_t s1) {
    const int64_t c0 = s0 * kCols, c1 = std::min(C, s1 * kCols);
    for (int64_t n = 0; n < N; ++n) {
      float* dst = pw + index_at(pid, i64, n) * C;
      const float* src = pg + n * C;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Cross-entropy. Rows are (N, V) logits; V is large (50257 for GPT-2), so one row is ~200 KB and
// the whole (2048, V) tensor is ~400 MB: these kernels are bound by memory bandwidth and must
// touch each logit once. Forward walks a row in L1-sized chunks: the chunk's max (first read, from
// memory), then the sum of exp over the chunk (second read, from L1), rescaling the running sum
// when the max grows: one exp per logit and one trip to memory.

namespace {
constexpr int64_t kCeChunk = 2048;  // floats: 8 KB, stays in L1 between the two chunk passes

void check_targets(const Tensor& targets, int64_t N, const char* op) {
  check_ids(targets, op);
  DS_CHECK(targets.numel() == N, "[cpu:{}] {} targets for {} rows", op, targets.numel(), N);
}

// Floats from p to the next 32-byte boundary (p is at least 4-byte aligned).
inline int64_t floats_to_alignment(const float* p) {
  return static_cast<int64_t>(((32 - (reinterpret_cast<uintptr_t>(p) & 31)) & 31) / 4);
}

// dst[0, n) = src[0, n) with streaming (non-temporal) stores; dst must be 32-byte aligned. The
// (N, V) logits gradient is far larger than any cache: ordinary stores would first read every
// line they write (read-for-ownership), streaming stores do not.
inline void stream_copy(float* dst, const float* src, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));
  for (; i < n; ++i) dst[i] = src[i];
}
}  // namespace

void CpuBackend::cross_entropy_forward(const Tensor& logits, const Tensor& targets,
                                       int64_t ignore_index, const Tensor& losses, const Tensor& lse) {
  require_f32(logits, "cross_entropy");
  require_f32(losses, "cross_entropy");
  require_f32(lse, "cross_entropy");
  const int64_t V = logits.size(-1), N = logits.numel() / std::max<int64_t>(V, 1);
  check_targets(targets, N, "cross_entropy");
  const bool i64 = targets.dtype() == DType::i64;
  const void* pt = targets.raw_data();
  for (int64_t n = 0; n < N; ++n) {
    const int64_t t = index_at(pt, i64, n);
    DS_CHECK(t == ignore_index || (t >= 0 && t < V),
             "[cpu:cross_entropy] target {} out of range for {} classes", t, V);
  }
  const float* px = logits.data<float>();
  float* pl = losses.data<float>();  // (N)
  float* ps = lse.data<float>();     // (N)
  parallel_for(N, 1, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const float* row = px + n * V;
      float m = kNegInf, s = 0.0f;
      for (int64_t c0 = 0; c0 < V; c0 += kCeChunk) {
        const int64_t len = std::min(kCeChunk, V - c0);
        const float* xc = row + c0;
        const float cm = row_max(xc, len);
        if (cm == kNegInf) continue;  // every logit of this chunk is -inf: contributes nothing
        if (cm > m) {
          s = m == kNegInf ? 0.0f : s * fm::exp(m - cm);
          m = cm;
        }
        float cs = 0.0f;
#pragma omp simd reduction(+ : cs)
        for (int64_t i = 0; i < len; ++i) cs += fm::exp(xc[i] - m);
        s += cs;
      }
      const float l = m + std::log(s);
      ps[n] = l;
      const int64_t t = index_at(pt, i64, n);
      pl[n] = t == ignore_index ? 0.0f : l - row[t];
    }
  });
}

void CpuBackend::cross_entropy_backward(const Tensor& logits, const Tensor& targets,
                                        int64_t ignore_index, const Tensor& lse, float scale,
                                        const Tensor& dlogits) {
  require_f32(logits, "cross_entropy_backward");
  require_f32(lse, "cross_entropy_backward");
  require_f32(dlogits, "cross_entropy_backward");
  const int64_t V = logits.size(-1), N = logits.numel() / std::max<int64_t>(V, 1);
  check_targets(targets, N, "cross_entropy_backward");
  const bool i64 = targets.dtype() == DType::i64;
  const void* pt = targets.raw_data();
  const float* px = logits.data<float>();
  const float* ps = lse.data<float>();
  float* pd = dlogits.data<float>();
  parallel_for(N, 1, [&](int64_t n0, int64_t n1) {
    alignas(32) float buf[kCeChunk];  // one chunk of the row's gradient, computed in L1
    for (int64_t n = n0; n < n1; ++n) {
      const float* row = px + n * V;
      float* d = pd + n * V;  // (V)
      const int64_t t = index_at(pt, i64, n);
      const bool ignored = t == ignore_index;
      const float l = ps[n];
      auto grad = [&](int64_t i) { return ignored ? 0.0f : fm::exp(row[i] - l) * scale - (i == t ? scale : 0.0f); };
      // A scalar head up to the 32-byte boundary, then chunks computed into buf (vectorised) and
      // streamed out. The one-hot term goes into buf, so no streamed element is read back.
      const int64_t head = std::min(V, floats_to_alignment(d));
      for (int64_t i = 0; i < head; ++i) d[i] = grad(i);
      for (int64_t c0 = head; c0 < V; c0 += kCeChunk) {
        const int64_t len = std::min(kCeChunk, V - c0);
        const float* xc = row + c0;
        if (ignored) {
          std::fill(buf, buf + len, 0.0f);
        } else {
#pragma omp simd
          for (int64_t i = 0; i < len; ++i) buf[i] = fm::exp(xc[i] - l) * scale;
          if (t >= c0 && t < c0 + len) buf[t - c0] -= scale;
        }
        stream_copy(d + c0, buf, len);
      }
    }
    _mm_sfence();  // streaming stores are weakly ordered: drain them before the region's barrier
  });
}

// ---------------------------------------------------------------------------------------------
// Dropout: mask[i] = uniform(seed, stream, base + i) >= p, out = x * mask / (1 - p).

void CpuBackend::dropout(const Tensor& x, float p, uint64_t seed, uint64_t stream, uint64_t base,
                         const Tensor& out) {
  DS_CHECK(is_floating(x.dtype()) && is_floating(out.dtype()) && x.is_contiguous() &&
               out.is_contiguous() && x.numel() == out.numel(),
           "[cpu:dropout] needs contiguous floating tensors of equal size");
  DS_CHECK(p >= 0.0f && p < 1.0f, "[cpu:dropout] p = {} must be in [0, 1)", p);
  const int64_t n = x.numel();
  const float keep_scale = 1.0f / (1.0f - p);
  // rng::uniform01(h) = (h >> 40) / 2^24 exactly, so uniform01(h) >= p  <=>  (h >> 40) >= ceil(p 2^24).
  // The integer form keeps the loop vectorised (a float compare would not be; see fast_math.h).
  const uint64_t threshold = static_cast<uint64_t>(std::ceil(static_cast<double>(p) * 16777216.0));
  auto apply = [=](const float* xi, float* o, int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) {
      const bool keep = (rng::hash3(seed, stream, base + static_cast<uint64_t>(i)) >> 40) >= threshold;
      o[i - b] = fm::detail::select(fm::detail::mask(keep), xi[i - b] * keep_scale, 0.0f);
    }
  };
  if (x.dtype() == DType::f32 && out.dtype() == DType::f32) {
    const float* px = x.data<float>();
    float* po = out.data<float>();
    parallel_for(n, 1 << 14, [&](int64_t b, int64_t e) { apply(px + b, po + b, b, e); });
    return;
  }
  // 16-bit: convert chunks to fp32 and back.
  const char* px = static_cast<const char*>(x.raw_data());
  char* po = static_cast<char*>(out.raw_data());
  const size_t xs = dtype_size(x.dtype()), os = dtype_size(out.dtype());
  parallel_for(n, 1 << 14, [&](int64_t b, int64_t e) {
    constexpr int64_t kChunk = 2048;
    float fx[kChunk], fo[kChunk];
    for (int64_t i = b; i < e; i += kChunk) {
      const int64_t m = std::min(kChunk, e - i);
      convert(px + i * static_cast<int64_t>(xs), x.dtype(), fx, DType::f32, static_cast<size_t>(m));
      apply(fx, fo, i, i + m);
      convert(fo, DType::f32, po + i * static_cast<int64_t>(os), out.dtype(), static_cast<size_t>(m));
    }
  });
}

}  // namespace ds::backend

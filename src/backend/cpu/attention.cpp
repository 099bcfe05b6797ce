// Causal self-attention on the CPU. One (batch, head) pair per thread at a time, each computed by
// that thread alone with single-threaded sgemm calls, so the result does not depend on the thread
// count. Scores are never stored: the forward keeps each row's log-sum-exp (lse) and the backward
// recomputes P = exp(S - lse) block by block.
//
// Rows are processed in blocks of kBlock queries. Block [r0, r1) only sees keys [0, r1), so its
// score block is (r1 - r0, r1) rather than (r1 - r0, T): at T = 256 and kBlock = 64 this skips
// 3/8 of the score and P V products that a full (T, T) product would spend on masked entries.
// Per thread the scratch is two (kBlock, T) buffers, less than one (T, T) block.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/fast_math.h"
#include "ds/core/error.h"

namespace ds::backend {
namespace {

constexpr int64_t kBlock = 64;

// Below this many multiply-adds (all heads) a parallel region costs more than it saves; on a busy
// machine a region whose threads are descheduled can cost milliseconds.
bool worth_threads(int64_t BH, int64_t T, int64_t hd) { return BH > 1 && BH * T * T * hd > (1 << 18); }

void require_f32(const Tensor& t, const char* op) {
  DS_CHECK(t.dtype() == DType::f32 && t.is_contiguous(), "[cpu:{}] kernel takes contiguous fp32, got {}{}",
           op, dtype_name(t.dtype()), t.is_contiguous() ? "" : " (strided)");
}

void check_qkv(const Tensor& q, const Tensor& k, const Tensor& v, const char* op) {
  require_f32(q, op);
  require_f32(k, op);
  require_f32(v, op);
  DS_CHECK(q.dim() == 4 && k.shape() == q.shape() && v.shape() == q.shape(),
           "[cpu:{}] q, k, v must all be (B, NH, T, hd), got {}, {}, {}", op, shape_str(q.shape()),
           shape_str(k.shape()), shape_str(v.shape()));
}

}  // namespace

void CpuBackend::attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                                   const Tensor& out, const Tensor& lse) {
  check_qkv(q, k, v, "attention");
  require_f32(out, "attention");
  require_f32(lse, "attention");
  const int64_t BH = q.size(0) * q.size(1), T = q.size(2), hd = q.size(3);
  if (BH == 0 || T == 0) return;
  const float* pq = q.data<float>();
  const float* pk = k.data<float>();
  const float* pv = v.data<float>();
  float* po = out.data<float>();
  float* pl = lse.data<float>();
  const int64_t ldp = T;

#pragma omp parallel if (worth_threads(BH, T, hd))
  {
    std::vector<float> pbuf(static_cast<size_t>(std::min(kBlock, T) * T));  // (kBlock, T) scores / P
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < BH; ++bh) {
      const float* Q = pq + bh * T * hd;  // (T, hd)
      const float* K = pk + bh * T * hd;
      const float* Vh = pv + bh * T * hd;
      float* O = po + bh * T * hd;
      float* L = pl + bh * T;  // (T)
      for (int64_t r0 = 0; r0 < T; r0 += kBlock) {
        const int64_t r1 = std::min(T, r0 + kBlock), m = r1 - r0, n = r1;
        float* P = pbuf.data();  // (m, n) with row stride ldp
        // S = scale * Q[r0:r1] K[0:n]^T
        sgemm(false, true, m, n, hd, scale, Q + r0 * hd, hd, K, hd, 0.0f, P, ldp);
        for (int64_t i = 0; i < m; ++i) {
          float* s = P + i * ldp;
          const int64_t valid = r0 + i + 1;  // keys 0 .. r0 + i
          const float mx = fm::max_of(s, valid);
          float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
          for (int64_t j = 0; j < valid; ++j) {
            s[j] = fm::exp(s[j] - mx);
            sum += s[j];
          }
          const float inv = 1.0f / sum;
#pragma omp simd
          for (int64_t j = 0; j < valid; ++j) s[j] *= inv;
          std::fill(s + valid, s + n, 0.0f);
          L[r0 + i] = mx + std::log(sum);
        }
        // O[r0:r1] = P V[0:n]
        sgemm(false, false, m, hd, n, 1.0f, P, ldp, Vh, hd, 0.0f, O + r0 * hd, hd);
      }
    }
  }
}

void CpuBackend::attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const Tensor& out, const Tensor& lse,
                                    float scale, const Tensor& dq, const Tensor& dk,
                                    const Tensor& dv) {
  check_qkv(q, k, v, "attention_backward");
  require_f32(dout, "attention_backward");
  require_f32(out, "attention_backward");
  require_f32(lse, "attention_backward");
  require_f32(dq, "attention_backward");
  require_f32(dk, "attention_backward");
  require_f32(dv, "attention_backward");
  const int64_t BH = q.size(0) * q.size(1), T = q.size(2), hd = q.size(3);
  if (BH == 0 || T == 0) return;
  const float* pdo = dout.data<float>();
  const float* pq = q.data<float>();
  const float* pk = k.data<float>();
  const float* pv = v.data<float>();
  const float* po = out.data<float>();
  const float* pl = lse.data<float>();
  float* pdq = dq.data<float>();
  float* pdk = dk.data<float>();
  float* pdv = dv.data<float>();
  const int64_t ldp = T;

#pragma omp parallel if (worth_threads(BH, T, hd))
  {
    const size_t blk = static_cast<size_t>(std::min(kBlock, T) * T);
    std::vector<float> pbuf(blk), dpbuf(blk);  // (kBlock, T) each: P and dP / dS
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < BH; ++bh) {
      const float* Q = pq + bh * T * hd;  // (T, hd)
      const float* K = pk + bh * T * hd;
      const float* Vh = pv + bh * T * hd;
      const float* O = po + bh * T * hd;
      const float* dO = pdo + bh * T * hd;
      const float* L = pl + bh * T;
      float* dQ = pdq + bh * T * hd;
      float* dK = pdk + bh * T * hd;
      float* dV = pdv + bh * T * hd;
      // dK and dV accumulate over query blocks.
      std::fill(dK, dK + T * hd, 0.0f);
      std::fill(dV, dV + T * hd, 0.0f);
      for (int64_t r0 = 0; r0 < T; r0 += kBlock) {
        const int64_t r1 = std::min(T, r0 + kBlock), m = r1 - r0, n = r1;
        float* P = pbuf.data();    // (m, n), row stride ldp
        float* dP = dpbuf.data();  // (m, n), row stride ldp
        // Recompute P = exp(scale * Q K^T - lse), zero above the diagonal.
        sgemm(false, true, m, n, hd, scale, Q + r0 * hd, hd, K, hd, 0.0f, P, ldp);
        for (int64_t i = 0; i < m; ++i) {
          float* s = P + i * ldp;
          const int64_t valid = r0 + i + 1;
          const float l = L[r0 + i];
#pragma omp simd
          for (int64_t j = 0; j < valid; ++j) s[j] = fm::exp(s[j] - l);
          std::fill(s + valid, s + n, 0.0f);
        }
        // dV[0:n] += P^T dO[r0:r1]
        sgemm(true, false, n, hd, m, 1.0f, P, ldp, dO + r0 * hd, hd, 1.0f, dV, hd);
        // dP = dO[r0:r1] V[0:n]^T
        sgemm(false, true, m, n, hd, 1.0f, dO + r0 * hd, hd, Vh, hd, 0.0f, dP, ldp);
        // dS = P * (dP - D), D_i = dO_i . O_i (= sum_j P_ij dP_ij)
        for (int64_t i = 0; i < m; ++i) {
          const float* o = O + (r0 + i) * hd;
          const float* g = dO + (r0 + i) * hd;
          float D = 0.0f;
#pragma omp simd reduction(+ : D)
          for (int64_t c = 0; c < hd; ++c) D += g[c] * o[c];
          const float* p = P + i * ldp;
          float* ds = dP + i * ldp;
          const int64_t valid = r0 + i + 1;
#pragma omp simd
          for (int64_t j = 0; j < valid; ++j) ds[j] = p[j] * (ds[j] - D);
          std::fill(ds + valid, ds + n, 0.0f);
        }
        // dQ[r0:r1] = scale dS K[0:n];  dK[0:n] += scale dS^T Q[r0:r1]
        sgemm(false, false, m, hd, n, scale, dP, ldp, K, hd, 0.0f, dQ + r0 * hd, hd);
        sgemm(true, false, n, hd, m, scale, dP, ldp, Q + r0 * hd, hd, 1.0f, dK, hd);
      }
    }
  }
}

}  // namespace ds::backend

// Attention on the CPU: causal or not, right-padded keys, Tq <= Tk queries (cross-attention, or the
// last Tq positions of a causal sequence), causal sliding windows (Gemma's local layers) and
// soft-capped scores (Gemma 2: softcap * tanh(s / softcap), the tanh's slope kept per block in
// the backward). One (batch, head) pair per thread at a time, each computed by
// that thread alone with single-threaded sgemm calls, so the result does not depend on the thread
// count. Scores are never stored: the forward keeps each row's log-sum-exp (lse) and the backward
// recomputes P = exp(S - lse) block by block.
//
// Rows are processed in blocks of kBlock queries. A row sees a prefix of the keys (its visible
// count `valid`: the key length of its batch, and with causal masking its position), so block
// [r0, r1) computes scores only for the keys its last row sees: causally (r1 - r0, r1) rather than
// (r1 - r0, T), which at T = 256 and kBlock = 64 skips 3/8 of the score and P V products a full
// (T, T) product would spend on masked entries. Per thread the scratch is two (kBlock, Tk) buffers,
// less than one (T, T) block.
//
// q, k, v, out and the gradients may be fp32, bf16 or fp16 (each its own dtype): a 16-bit head is
// widened into per-thread fp32 scratch (one head's (T, hd) block per operand, rows16.h), runs the
// same fp32 head functions, and its outputs are narrowed as they are stored. lse stays fp32. The
// backward reads `out` in its dtype: for a 16-bit forward that is the rounded output autograd
// saved, so D = dO . O uses the rounded O (FlashAttention's bf16 backward does the same).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/attention_args.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/fast_math.h"
#include "backend/cpu/rows16.h"
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

void check_qkv(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
               std::span<const int64_t> key_lens, int64_t window, const char* op) {
  check_attention_args(q, k, v, causal, key_lens, window, std::string("cpu:") + op,
                       /*any_float=*/true);
}

// The keys row r (of Tq) sees: [lo, hi) with hi = min(klen, r + 1 + Tk - Tq) causally (klen
// else) and, with a sliding window w > 0, lo = max(0, pos - w + 1) for the row's position
// pos = r + Tk - Tq (transformers' sliding mask: key j visible iff pos - w < j <= pos).
struct KeyRange {
  int64_t lo, hi;
};
inline KeyRange visible(int64_t r, int64_t Tq, int64_t Tk, bool causal, int64_t klen,
                        int64_t window) {
  const int64_t pos = r + Tk - Tq;
  const int64_t hi = causal ? std::min(klen, pos + 1) : klen;
  return {window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0, hi};
}

// ---- one (batch, head) pair; row helpers over restrict pointers so that GCC vectorises them ----

// Soft-capping of one row's visible scores [lo, hi): s -> cap * tanh(s / cap); with `slope` (the
// backward) also d(capped)/ds = 1 - tanh^2 into slope[lo, hi).
void softcap_row(float* __restrict s, int64_t lo, int64_t hi, float cap, float* __restrict slope) {
  for (int64_t j = lo; j < hi; ++j) {
    const float t = std::tanh(s[j] / cap);
    s[j] = cap * t;
    if (slope) slope[j] = 1.0f - t * t;
  }
}

// Row i of a block: s (n) holds scale * q.k for the block's keys, of which [lo, hi) are visible.
// Overwrites s with the softmax (zeros outside [lo, hi)) and returns the log-sum-exp.
float masked_softmax_row(float* __restrict s, int64_t lo, int64_t hi, int64_t n) {
  const float mx = fm::max_of(s + lo, hi - lo);
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = lo; j < hi; ++j) {
    s[j] = fm::exp(s[j] - mx);
    sum += s[j];
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (int64_t j = lo; j < hi; ++j) s[j] *= inv;
  std::fill(s, s + lo, 0.0f);
  std::fill(s + hi, s + n, 0.0f);
  return mx + std::log(sum);
}

// s (n): scores -> P = exp(s - lse), zeros outside [lo, hi).
void recompute_p_row(float* __restrict s, int64_t lo, int64_t hi, int64_t n, float lse) {
#pragma omp simd
  for (int64_t j = lo; j < hi; ++j) s[j] = fm::exp(s[j] - lse);
  std::fill(s, s + lo, 0.0f);
  std::fill(s + hi, s + n, 0.0f);
}

// dp (n): dP -> dS = P * (dP - D) with D = dO_i . O_i (which equals sum_j P_ij dP_ij).
void softmax_grad_row(const float* __restrict p, const float* __restrict o,
                      const float* __restrict g, int64_t hd, int64_t lo, int64_t hi, int64_t n,
                      float* __restrict dp) {
  float D = 0.0f;
#pragma omp simd reduction(+ : D)
  for (int64_t c = 0; c < hd; ++c) D += g[c] * o[c];
#pragma omp simd
  for (int64_t j = lo; j < hi; ++j) dp[j] = p[j] * (dp[j] - D);
  std::fill(dp, dp + lo, 0.0f);
  std::fill(dp + hi, dp + n, 0.0f);
}

// Q, O (Tq, hd); K, V (Tk, hd); L (Tq); P scratch (kBlock, Tk). A block of rows [r0, r1) computes
// scores for keys [k0, n): from the first row's window start to the last row's visible end.
void forward_head(const float* Q, const float* K, const float* V, int64_t Tq, int64_t Tk,
                  int64_t hd, float scale, bool causal, int64_t klen, int64_t window, float softcap,
                  float* O, float* L, float* P) {
  const int64_t ldp = Tk;
  for (int64_t r0 = 0; r0 < Tq; r0 += kBlock) {
    const int64_t r1 = std::min(Tq, r0 + kBlock), m = r1 - r0;
    const int64_t k0 = visible(r0, Tq, Tk, causal, klen, window).lo;
    const int64_t n = visible(r1 - 1, Tq, Tk, causal, klen, window).hi - k0;
    // S (m, n) = scale * Q[r0:r1] K[k0:k0+n]^T
    sgemm(false, true, m, n, hd, scale, Q + r0 * hd, hd, K + k0 * hd, hd, 0.0f, P, ldp);
    for (int64_t i = 0; i < m; ++i) {
      const KeyRange kr = visible(r0 + i, Tq, Tk, causal, klen, window);
      if (softcap > 0.0f) softcap_row(P + i * ldp, kr.lo - k0, kr.hi - k0, softcap, nullptr);
      L[r0 + i] = masked_softmax_row(P + i * ldp, kr.lo - k0, kr.hi - k0, n);
    }
    // O[r0:r1] = P V[k0:k0+n]
    sgemm(false, false, m, hd, n, 1.0f, P, ldp, V + k0 * hd, hd, 0.0f, O + r0 * hd, hd);
  }
}

// dO, Q, O, dQ (Tq, hd); K, V, dK, dV (Tk, hd); L (Tq); P, dP and (soft-capping only) the
// capping's slope S scratch (kBlock, Tk) each.
void backward_head(const float* dO, const float* Q, const float* K, const float* V, const float* O,
                   const float* L, int64_t Tq, int64_t Tk, int64_t hd, float scale, bool causal,
                   int64_t klen, int64_t window, float softcap, float* dQ, float* dK, float* dV,
                   float* P, float* dP, float* S) {
  const int64_t ldp = Tk;
  // dK and dV accumulate over query blocks (keys no row sees keep a zero gradient).
  std::fill(dK, dK + Tk * hd, 0.0f);
  std::fill(dV, dV + Tk * hd, 0.0f);
  for (int64_t r0 = 0; r0 < Tq; r0 += kBlock) {
    const int64_t r1 = std::min(Tq, r0 + kBlock), m = r1 - r0;
    const int64_t k0 = visible(r0, Tq, Tk, causal, klen, window).lo;
    const int64_t n = visible(r1 - 1, Tq, Tk, causal, klen, window).hi - k0;
    const float *Kb = K + k0 * hd, *Vb = V + k0 * hd;
    // Recompute P (m, n) = exp(scale * Q K^T - lse), zero where masked.
    sgemm(false, true, m, n, hd, scale, Q + r0 * hd, hd, Kb, hd, 0.0f, P, ldp);
    for (int64_t i = 0; i < m; ++i) {
      const KeyRange kr = visible(r0 + i, Tq, Tk, causal, klen, window);
      if (softcap > 0.0f) softcap_row(P + i * ldp, kr.lo - k0, kr.hi - k0, softcap, S + i * ldp);
      recompute_p_row(P + i * ldp, kr.lo - k0, kr.hi - k0, n, L[r0 + i]);
    }
    // dV[k0:k0+n] += P^T dO[r0:r1]
    sgemm(true, false, n, hd, m, 1.0f, P, ldp, dO + r0 * hd, hd, 1.0f, dV + k0 * hd, hd);
    // dP (m, n) = dO[r0:r1] V[k0:k0+n]^T, then dS in place
    sgemm(false, true, m, n, hd, 1.0f, dO + r0 * hd, hd, Vb, hd, 0.0f, dP, ldp);
    for (int64_t i = 0; i < m; ++i) {
      const KeyRange kr = visible(r0 + i, Tq, Tk, causal, klen, window);
      softmax_grad_row(P + i * ldp, O + (r0 + i) * hd, dO + (r0 + i) * hd, hd, kr.lo - k0,
                       kr.hi - k0, n, dP + i * ldp);
      if (softcap > 0.0f)  // through the capping: dS_raw = dS * (1 - tanh^2)
        for (int64_t j = kr.lo - k0; j < kr.hi - k0; ++j) dP[i * ldp + j] *= S[i * ldp + j];
    }
    // dQ[r0:r1] = scale dS K[k0:k0+n];  dK[k0:k0+n] += scale dS^T Q[r0:r1]
    sgemm(false, false, m, hd, n, scale, dP, ldp, Kb, hd, 0.0f, dQ + r0 * hd, hd);
    sgemm(true, false, n, hd, m, scale, dP, ldp, Q + r0 * hd, hd, 1.0f, dK + k0 * hd, hd);
  }
}

}  // namespace

void CpuBackend::attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                                   bool causal, std::span<const int64_t> key_lens, int64_t window,
                                   float softcap, const Tensor& out, const Tensor& lse) {
  check_qkv(q, k, v, causal, key_lens, window, "attention");
  require_float_rows(out, "attention");
  require_f32(lse, "attention");
  const int64_t NH = q.size(1), BH = q.size(0) * NH, Tq = q.size(2), Tk = k.size(2),
                hd = q.size(3);
  if (BH == 0 || Tq == 0) return;
  // One row per (batch, head): (BH, T * hd).
  const Rows qr(q, Tq * hd), kr(k, Tk * hd), vr(v, Tk * hd), outr(out, Tq * hd);
  float* pl = lse.data<float>();
#pragma omp parallel if (worth_threads(BH, std::max(Tq, Tk), hd))
  {
    std::vector<float> pbuf(static_cast<size_t>(std::min(kBlock, Tq) * Tk));  // scores / P
    RowReader qin(qr, 1), kin(kr, 1), vin(vr, 1);
    RowWriter oout(outr, 1);
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < BH; ++bh) {
      const int64_t klen = key_lens.empty() ? Tk : key_lens[static_cast<size_t>(bh / NH)];
      forward_head(qin.read(bh, 1), kin.read(bh, 1), vin.read(bh, 1), Tq, Tk, hd, scale, causal,
                   klen, window, softcap, oout.rows(bh, 1), pl + bh * Tq, pbuf.data());
      oout.commit();
    }
  }
}

void CpuBackend::attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const Tensor& out, const Tensor& lse,
                                    float scale, bool causal, std::span<const int64_t> key_lens,
                                    int64_t window, float softcap, const Tensor& dq,
                                    const Tensor& dk, const Tensor& dv) {
  check_qkv(q, k, v, causal, key_lens, window, "attention_backward");
  for (const Tensor* t : {&dout, &out, &dq, &dk, &dv}) require_float_rows(*t, "attention_backward");
  require_f32(lse, "attention_backward");
  const int64_t NH = q.size(1), BH = q.size(0) * NH, Tq = q.size(2), Tk = k.size(2),
                hd = q.size(3);
  if (BH == 0 || Tq == 0) return;
  // One row per (batch, head): (BH, T * hd).
  const Rows dor(dout, Tq * hd), qr(q, Tq * hd), kr(k, Tk * hd), vr(v, Tk * hd), outr(out, Tq * hd);
  const Rows dqr(dq, Tq * hd), dkr(dk, Tk * hd), dvr(dv, Tk * hd);
  const float* pl = lse.data<float>();
#pragma omp parallel if (worth_threads(BH, std::max(Tq, Tk), hd))
  {
    const size_t blk = static_cast<size_t>(std::min(kBlock, Tq) * Tk);
    std::vector<float> pbuf(blk), dpbuf(blk);  // (kBlock, Tk) each: P and dP / dS
    std::vector<float> sbuf(softcap > 0.0f ? blk : 0);  // the capping's slope
    RowReader doin(dor, 1), qin(qr, 1), kin(kr, 1), vin(vr, 1), oin(outr, 1);
    RowWriter dqout(dqr, 1), dkout(dkr, 1), dvout(dvr, 1);
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < BH; ++bh) {
      const int64_t klen = key_lens.empty() ? Tk : key_lens[static_cast<size_t>(bh / NH)];
      backward_head(doin.read(bh, 1), qin.read(bh, 1), kin.read(bh, 1), vin.read(bh, 1),
                    oin.read(bh, 1), pl + bh * Tq, Tq, Tk, hd, scale, causal, klen, window, softcap,
                    dqout.rows(bh, 1), dkout.rows(bh, 1), dvout.rows(bh, 1), pbuf.data(),
                    dpbuf.data(), sbuf.data());
      dqout.commit();
      dkout.commit();
      dvout.commit();
    }
  }
}

}  // namespace ds::backend

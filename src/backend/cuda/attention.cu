// Attention on CUDA, flash-style: the (Tq, Tk) scores are never stored. The forward keeps each
// query row's log-sum-exp; the backward recomputes P = exp(S - lse) as it goes.
//
// One warp per row. A warp holds its row (q and the output accumulator in the forward; q, dout
// and dq in the backward) in registers, hd / 32 values per lane (NPL, a template parameter so the
// register arrays are indexed by constants), and walks the keys (or, for dK and dV, the queries)
// one at a time with an online softmax. Every sum is a fixed shuffle tree and every loop runs in
// order, so results are deterministic, and nothing is accumulated across warps: dQ is written by
// the warp of its query row, dK and dV by the warp of their key row.
//
// Head sizes 32, 64 and 128 go to the tiled kernels of attention_tiled.cu (about 10x faster at
// GPT-2's shape); these warp-per-row kernels serve every other head size.
#include "backend/cuda/attention_tiled.h"
#include "backend/cuda/common.cuh"

namespace ds::backend::cuda_kernels {
namespace {

constexpr int kWarpsPerBlock = 4;

// Keys row i (of Tq) sees: a prefix of length min(klen, i + 1 + Tk - Tq) causally, klen else.
__device__ __forceinline__ int64_t visible(int64_t i, int64_t Tq, int64_t Tk, bool causal,
                                           int64_t klen) {
  return causal ? min(klen, i + 1 + Tk - Tq) : klen;
}

template <int NPL>
__device__ __forceinline__ void load_row(const float* p, int64_t hd, int lane, float (&r)[NPL],
                                         float mul = 1.0f) {
#pragma unroll
  for (int j = 0; j < NPL; ++j) {
    const int64_t d = lane + kWarp * j;
    r[j] = d < hd ? p[d] * mul : 0.0f;
  }
}

template <int NPL>
__device__ __forceinline__ float dot_row(const float (&r)[NPL], const float* p, int64_t hd,
                                         int lane) {
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < NPL; ++j) {
    const int64_t d = lane + kWarp * j;
    if (d < hd) s += r[j] * p[d];
  }
  return warp_sum(s);
}

template <int NPL>
__device__ __forceinline__ void store_row(float* p, int64_t hd, int lane, const float (&r)[NPL],
                                          float mul) {
#pragma unroll
  for (int j = 0; j < NPL; ++j) {
    const int64_t d = lane + kWarp * j;
    if (d < hd) p[d] = r[j] * mul;
  }
}

template <int NPL>
__global__ void attention_forward_kernel(const float* q, const float* k, const float* v,
                                         int64_t rows, int64_t NH, int64_t Tq, int64_t Tk,
                                         int64_t hd, float scale, bool causal,
                                         const int64_t* key_lens, float* out, float* lse) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  if (row >= rows) return;
  const int64_t bh = row / Tq, i = row % Tq, b = bh / NH;
  const int64_t klen = key_lens ? key_lens[b] : Tk;
  const int64_t vis = visible(i, Tq, Tk, causal, klen);
  float qr[NPL], acc[NPL];
  load_row(q + row * hd, hd, lane, qr, scale);
#pragma unroll
  for (int j = 0; j < NPL; ++j) acc[j] = 0.0f;
  const float* kb = k + bh * Tk * hd;
  const float* vb = v + bh * Tk * hd;
  float m = -INFINITY, l = 0.0f;
  for (int64_t t = 0; t < vis; ++t) {
    const float s = dot_row(qr, kb + t * hd, hd, lane);
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new), p = expf(s - m_new);
    l = l * corr + p;
#pragma unroll
    for (int j = 0; j < NPL; ++j) {
      const int64_t d = lane + kWarp * j;
      acc[j] = acc[j] * corr + (d < hd ? p * vb[t * hd + d] : 0.0f);
    }
    m = m_new;
  }
  store_row(out + row * hd, hd, lane, acc, 1.0f / l);
  if (lane == 0) lse[row] = m + logf(l);
}

// D[row] = dout[row] . out[row]
template <int NPL>
__global__ void attention_delta_kernel(const float* dout, const float* out, int64_t rows,
                                       int64_t hd, float* delta) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  if (row >= rows) return;
  float g[NPL];
  load_row(dout + row * hd, hd, lane, g);
  const float d = dot_row(g, out + row * hd, hd, lane);
  if (lane == 0) delta[row] = d;
}

template <int NPL>
__global__ void attention_dq_kernel(const float* dout, const float* q, const float* k,
                                    const float* v, const float* lse, const float* delta,
                                    int64_t rows, int64_t NH, int64_t Tq, int64_t Tk, int64_t hd,
                                    float scale, bool causal, const int64_t* key_lens, float* dq) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  if (row >= rows) return;
  const int64_t bh = row / Tq, i = row % Tq, b = bh / NH;
  const int64_t klen = key_lens ? key_lens[b] : Tk;
  const int64_t vis = visible(i, Tq, Tk, causal, klen);
  float qr[NPL], g[NPL], acc[NPL];
  load_row(q + row * hd, hd, lane, qr, scale);
  load_row(dout + row * hd, hd, lane, g);
#pragma unroll
  for (int j = 0; j < NPL; ++j) acc[j] = 0.0f;
  const float li = lse[row], Di = delta[row];
  const float* kb = k + bh * Tk * hd;
  const float* vb = v + bh * Tk * hd;
  for (int64_t t = 0; t < vis; ++t) {
    const float p = expf(dot_row(qr, kb + t * hd, hd, lane) - li);
    const float ds = p * (dot_row(g, vb + t * hd, hd, lane) - Di);
#pragma unroll
    for (int j = 0; j < NPL; ++j) {
      const int64_t d = lane + kWarp * j;
      if (d < hd) acc[j] += ds * kb[t * hd + d];
    }
  }
  store_row(dq + row * hd, hd, lane, acc, scale);
}

template <int NPL>
__global__ void attention_dkdv_kernel(const float* dout, const float* q, const float* k,
                                      const float* v, const float* lse, const float* delta,
                                      int64_t krows, int64_t NH, int64_t Tq, int64_t Tk,
                                      int64_t hd, float scale, bool causal,
                                      const int64_t* key_lens, float* dk, float* dv) {
  const int lane = threadIdx.x % kWarp;
  const int64_t krow = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  if (krow >= krows) return;
  const int64_t bh = krow / Tk, t = krow % Tk, b = bh / NH;
  const int64_t klen = key_lens ? key_lens[b] : Tk;
  float kr[NPL], vr[NPL], dka[NPL], dva[NPL];
  load_row(k + krow * hd, hd, lane, kr, scale);
  load_row(v + krow * hd, hd, lane, vr);
#pragma unroll
  for (int j = 0; j < NPL; ++j) dka[j] = dva[j] = 0.0f;
  if (t < klen) {
    // Query i sees key t when t < visible(i): causally i >= t - (Tk - Tq).
    int64_t i0 = causal ? t - (Tk - Tq) : 0;
    if (i0 < 0) i0 = 0;
    const float* qb = q + bh * Tq * hd;
    const float* gb = dout + bh * Tq * hd;
    const float* lb = lse + bh * Tq;
    const float* db = delta + bh * Tq;
    for (int64_t i = i0; i < Tq; ++i) {
      const float p = expf(dot_row(kr, qb + i * hd, hd, lane) - lb[i]);
      const float ds = p * (dot_row(vr, gb + i * hd, hd, lane) - db[i]);
#pragma unroll
      for (int j = 0; j < NPL; ++j) {
        const int64_t d = lane + kWarp * j;
        if (d < hd) {
          dva[j] += p * gb[i * hd + d];
          dka[j] += ds * qb[i * hd + d];
        }
      }
    }
  }
  store_row(dk + krow * hd, hd, lane, dka, scale);
  store_row(dv + krow * hd, hd, lane, dva, 1.0f);
}

template <int NPL>
void forward_impl(const float* q, const float* k, const float* v, int64_t B, int64_t NH,
                  int64_t Tq, int64_t Tk, int64_t hd, float scale, bool causal,
                  const int64_t* key_lens, float* out, float* lse, cudaStream_t stream) {
  const int64_t rows = B * NH * Tq;
  attention_forward_kernel<NPL><<<blocks_for(rows, kWarpsPerBlock), kWarpsPerBlock * kWarp, 0,
                                  stream>>>(q, k, v, rows, NH, Tq, Tk, hd, scale, causal, key_lens,
                                            out, lse);
}

template <int NPL>
void backward_impl(const float* dout, const float* q, const float* k, const float* v,
                   const float* out, const float* lse, int64_t B, int64_t NH, int64_t Tq,
                   int64_t Tk, int64_t hd, float scale, bool causal, const int64_t* key_lens,
                   float* dq, float* dk, float* dv, float* delta, cudaStream_t stream) {
  const int64_t rows = B * NH * Tq, krows = B * NH * Tk;
  const int threads = kWarpsPerBlock * kWarp;
  attention_delta_kernel<NPL><<<blocks_for(rows, kWarpsPerBlock), threads, 0, stream>>>(
      dout, out, rows, hd, delta);
  attention_dq_kernel<NPL><<<blocks_for(rows, kWarpsPerBlock), threads, 0, stream>>>(
      dout, q, k, v, lse, delta, rows, NH, Tq, Tk, hd, scale, causal, key_lens, dq);
  attention_dkdv_kernel<NPL><<<blocks_for(krows, kWarpsPerBlock), threads, 0, stream>>>(
      dout, q, k, v, lse, delta, krows, NH, Tq, Tk, hd, scale, causal, key_lens, dk, dv);
}

}  // namespace

void attention_forward(const float* q, const float* k, const float* v, int64_t B, int64_t NH,
                       int64_t Tq, int64_t Tk, int64_t hd, float scale, bool causal,
                       const int64_t* key_lens, float* out, float* lse, cudaStream_t stream) {
  if (B * NH * Tq == 0) return;
  if (tiled_attention_supports(hd, B, NH)) {
    // A failed launch shows in the backend's cudaGetLastError check after this call.
    tiled_attention_forward(q, k, v, B, NH, Tq, Tk, hd, scale, causal, key_lens, out, lse, stream);
    return;
  }
  switch ((hd + kWarp - 1) / kWarp) {
    case 1: return forward_impl<1>(q, k, v, B, NH, Tq, Tk, hd, scale, causal, key_lens, out, lse, stream);
    case 2: return forward_impl<2>(q, k, v, B, NH, Tq, Tk, hd, scale, causal, key_lens, out, lse, stream);
    case 3: return forward_impl<3>(q, k, v, B, NH, Tq, Tk, hd, scale, causal, key_lens, out, lse, stream);
    case 4: return forward_impl<4>(q, k, v, B, NH, Tq, Tk, hd, scale, causal, key_lens, out, lse, stream);
    case 5: case 6: return forward_impl<6>(q, k, v, B, NH, Tq, Tk, hd, scale, causal, key_lens, out, lse, stream);
    default: return forward_impl<8>(q, k, v, B, NH, Tq, Tk, hd, scale, causal, key_lens, out, lse, stream);
  }
}

void attention_backward(const float* dout, const float* q, const float* k, const float* v,
                        const float* out, const float* lse, int64_t B, int64_t NH, int64_t Tq,
                        int64_t Tk, int64_t hd, float scale, bool causal, const int64_t* key_lens,
                        float* dq, float* dk, float* dv, float* scratch, cudaStream_t stream) {
  if (B * NH * (Tq > Tk ? Tq : Tk) == 0) return;
  if (tiled_attention_supports(hd, B, NH)) {
    const int64_t rows = B * NH * Tq;
    if (rows > 0)
      attention_delta_kernel<(kMaxHeadDim + kWarp - 1) / kWarp>
          <<<blocks_for(rows, kWarpsPerBlock), kWarpsPerBlock * kWarp, 0, stream>>>(dout, out, rows,
                                                                                   hd, scratch);
    tiled_attention_backward(dout, q, k, v, lse, scratch, B, NH, Tq, Tk, hd, scale, causal,
                             key_lens, dq, dk, dv, stream);
    return;
  }
#define DS_ATTN_BWD(N)                                                                           \
  return backward_impl<N>(dout, q, k, v, out, lse, B, NH, Tq, Tk, hd, scale, causal, key_lens, dq, \
                          dk, dv, scratch, stream)
  switch ((hd + kWarp - 1) / kWarp) {
    case 1: DS_ATTN_BWD(1);
    case 2: DS_ATTN_BWD(2);
    case 3: DS_ATTN_BWD(3);
    case 4: DS_ATTN_BWD(4);
    case 5: case 6: DS_ATTN_BWD(6);
    default: DS_ATTN_BWD(8);
  }
#undef DS_ATTN_BWD
}

}  // namespace ds::backend::cuda_kernels

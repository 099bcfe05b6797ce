// Tiled flash attention for head sizes 32, 64 and 128 (GPT-2: 64; LLaMA: 128), fp32 on the CUDA
// cores. attention.cu calls these for those head sizes and keeps its warp-per-row kernels for the
// rest.
//
// A block of 256 threads (16 x 16: ty, tx) owns a tile of 64 rows. Thread (ty, tx) computes the
// scores of rows ty + 16 i and columns tx + 16 j (i, j < 4) of a 64 x 64 score tile, so each
// operand element read from shared memory serves four multiply-adds; rows are padded by one float
// so that the 16 threads reading 16 different rows hit 16 different banks. A row's max and sum are
// shuffles within the 16 lanes that share ty.
//
//   forward: a block per (query tile, batch*head); K and V tiles stream through shared memory;
//            online softmax; out and the row's log-sum-exp written once.
//   dK, dV:  a block per (key tile, batch*head); Q and dO tiles stream through; P and dS of the
//            tile go through shared memory so each thread then accumulates whole rows of dK, dV.
//   dQ:      a block per (query tile, batch*head); K and V tiles stream through.
// Nothing is accumulated across blocks (no atomics), every loop runs in a fixed order: results are
// deterministic, run to run. The scores are recomputed in both backward kernels rather than
// exchanged, which costs one more Q K^T but needs no (T, T) buffer.
#include "backend/cuda/attention_tiled.h"
#include "backend/cuda/common.cuh"

namespace ds::backend::cuda_kernels {
namespace {

constexpr int kTile = 64;  // rows of a query tile and of a key tile
constexpr int kThreads = 256;
constexpr int kPer = 4;  // rows (and columns) per thread in a 64 x 64 tile

__device__ __forceinline__ float max16(float v) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float sum16(float v) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Keys query row i sees: a prefix of length min(klen, i + 1 + Tk - Tq) causally, klen else.
__device__ __forceinline__ int64_t visible(int64_t i, int64_t Tq, int64_t Tk, bool causal,
                                           int64_t klen) {
  return causal ? min(klen, i + 1 + Tk - Tq) : klen;
}

// rows [r0, r0 + 64) of a (T, HD) matrix into a (64, HD + 1) shared tile, times mul; zeros past T.
template <int HD>
__device__ __forceinline__ void load_tile(float* s, const float* g, int64_t r0, int64_t T,
                                          float mul = 1.0f) {
  constexpr int LD = HD + 1;
  for (int idx = threadIdx.x; idx < kTile * HD; idx += kThreads) {
    const int r = idx / HD, d = idx % HD;
    const int64_t row = r0 + r;
    s[r * LD + d] = row < T ? g[row * HD + d] * mul : 0.0f;
  }
}

template <int HD>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const float* q, const float* k, const float* v, int64_t NH, int64_t Tq,
                   int64_t Tk, float scale, bool causal, const int64_t* key_lens, float* out,
                   float* lse) {
  constexpr int LD = HD + 1, LDP = kTile + 1, DPT = HD / 16;
  extern __shared__ float smem[];
  float* Qs = smem;              // (64, LD): the query tile, scaled
  float* Ks = Qs + kTile * LD;   // (64, LD)
  float* Vs = Ks + kTile * LD;   // (64, LD)
  float* Ps = Vs + kTile * LD;   // (64, LDP): this key tile's probabilities
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const int64_t bh = blockIdx.y, q0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t klen = key_lens ? key_lens[bh / NH] : Tk;
  const float* kb = k + bh * Tk * HD;
  const float* vb = v + bh * Tk * HD;
  load_tile<HD>(Qs, q + bh * Tq * HD, q0, Tq, scale);

  int64_t vis[kPer];
  float m[kPer], l[kPer], acc[kPer][DPT];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int64_t row = q0 + ty + 16 * i;
    vis[i] = row < Tq ? visible(row, Tq, Tk, causal, klen) : 0;
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int j = 0; j < DPT; ++j) acc[i][j] = 0.0f;
  }
  const int64_t last = min(q0 + kTile, Tq) - 1;
  const int64_t vis_max = visible(last, Tq, Tk, causal, klen);

  for (int64_t t0 = 0; t0 < vis_max; t0 += kTile) {
    __syncthreads();  // the previous tile's readers are done (and Qs is loaded)
    load_tile<HD>(Ks, kb, t0, Tk);
    load_tile<HD>(Vs, vb, t0, Tk);
    __syncthreads();
    float s[kPer][kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i)
#pragma unroll
      for (int j = 0; j < kPer; ++j) s[i][j] = 0.0f;
#pragma unroll 8
    for (int d = 0; d < HD; ++d) {
      float qv[kPer], kv[kPer];
#pragma unroll
      for (int i = 0; i < kPer; ++i) qv[i] = Qs[(ty + 16 * i) * LD + d];
#pragma unroll
      for (int j = 0; j < kPer; ++j) kv[j] = Ks[(tx + 16 * j) * LD + d];
#pragma unroll
      for (int i = 0; i < kPer; ++i)
#pragma unroll
        for (int j = 0; j < kPer; ++j) s[i][j] += qv[i] * kv[j];
    }
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        if (t0 + tx + 16 * j < vis[i]) mx = fmaxf(mx, s[i][j]);
        else s[i][j] = -INFINITY;
      }
      const float mn = fmaxf(m[i], max16(mx));
      float corr = 1.0f, rs = 0.0f;
      if (mn != -INFINITY) corr = expf(m[i] - mn);  // m = -inf: 0, nothing kept so far
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const float p = s[i][j] == -INFINITY ? 0.0f : expf(s[i][j] - mn);
        rs += p;
        Ps[(ty + 16 * i) * LDP + tx + 16 * j] = p;
      }
      l[i] = l[i] * corr + sum16(rs);
      m[i] = mn;
#pragma unroll
      for (int j = 0; j < DPT; ++j) acc[i][j] *= corr;
    }
    __syncthreads();
#pragma unroll 4
    for (int c = 0; c < kTile; ++c) {
      float vv[DPT];
#pragma unroll
      for (int j = 0; j < DPT; ++j) vv[j] = Vs[c * LD + tx + 16 * j];
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const float p = Ps[(ty + 16 * i) * LDP + c];
#pragma unroll
        for (int j = 0; j < DPT; ++j) acc[i][j] += p * vv[j];
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int64_t row = q0 + ty + 16 * i;
    if (row >= Tq) continue;
    float* o = out + (bh * Tq + row) * HD;
    const float inv = 1.0f / l[i];
#pragma unroll
    for (int j = 0; j < DPT; ++j) o[tx + 16 * j] = acc[i][j] * inv;
    if (tx == 0) lse[bh * Tq + row] = m[i] + logf(l[i]);
  }
}

template <int HD>
__global__ void __launch_bounds__(kThreads)
    dkdv_kernel(const float* dout, const float* q, const float* k, const float* v,
                const float* lse, const float* delta, int64_t NH, int64_t Tq, int64_t Tk,
                float scale, bool causal, const int64_t* key_lens, float* dk, float* dv) {
  constexpr int LD = HD + 1, LDT = kTile + 1, DPT = HD / 16;
  extern __shared__ float smem[];
  float* Ks = smem;              // (64, LD): this block's keys
  float* Vs = Ks + kTile * LD;   // (64, LD)
  float* Qs = Vs + kTile * LD;   // (64, LD): a query tile, unscaled
  float* Gs = Qs + kTile * LD;   // (64, LD): its rows of dO
  float* Pt = Gs + kTile * LD;   // (64 keys, LDT): P^T
  float* St = Pt + kTile * LDT;  // (64 keys, LDT): dS^T
  float* Ls = St + kTile * LDT;  // (64): the query tile's lse
  float* Ds = Ls + kTile;        // (64): and its D = rowsum(dO * O)
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const int64_t bh = blockIdx.y, t0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t klen = key_lens ? key_lens[bh / NH] : Tk;
  const int64_t shift = Tk - Tq;  // causal: query i sees key t when t <= i + shift
  load_tile<HD>(Ks, k + bh * Tk * HD, t0, Tk);
  load_tile<HD>(Vs, v + bh * Tk * HD, t0, Tk);
  float dka[kPer][DPT], dva[kPer][DPT];
#pragma unroll
  for (int i = 0; i < kPer; ++i)
#pragma unroll
    for (int j = 0; j < DPT; ++j) dka[i][j] = dva[i][j] = 0.0f;

  if (t0 < klen) {
    int64_t first = causal ? t0 - shift : 0;
    if (first < 0) first = 0;
    const float* qb = q + bh * Tq * HD;
    const float* gb = dout + bh * Tq * HD;
    for (int64_t qq = first / kTile * kTile; qq < Tq; qq += kTile) {
      __syncthreads();
      load_tile<HD>(Qs, qb, qq, Tq);
      load_tile<HD>(Gs, gb, qq, Tq);
      for (int r = threadIdx.x; r < kTile; r += kThreads) {
        const bool in = qq + r < Tq;
        Ls[r] = in ? lse[bh * Tq + qq + r] : 0.0f;
        Ds[r] = in ? delta[bh * Tq + qq + r] : 0.0f;
      }
      __syncthreads();
      // Thread keys c = ty + 16 i, queries r = tx + 16 j.
      float s[kPer][kPer], dp[kPer][kPer];
#pragma unroll
      for (int i = 0; i < kPer; ++i)
#pragma unroll
        for (int j = 0; j < kPer; ++j) s[i][j] = dp[i][j] = 0.0f;
#pragma unroll 4
      for (int d = 0; d < HD; ++d) {
        float kv[kPer], vv[kPer], qv[kPer], gv[kPer];
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
          kv[i] = Ks[(ty + 16 * i) * LD + d];
          vv[i] = Vs[(ty + 16 * i) * LD + d];
        }
#pragma unroll
        for (int j = 0; j < kPer; ++j) {
          qv[j] = Qs[(tx + 16 * j) * LD + d];
          gv[j] = Gs[(tx + 16 * j) * LD + d];
        }
#pragma unroll
        for (int i = 0; i < kPer; ++i)
#pragma unroll
          for (int j = 0; j < kPer; ++j) {
            s[i][j] += kv[i] * qv[j];
            dp[i][j] += vv[i] * gv[j];
          }
      }
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int64_t t = t0 + ty + 16 * i;
#pragma unroll
        for (int j = 0; j < kPer; ++j) {
          const int r = tx + 16 * j;
          const int64_t row = qq + r;
          const bool valid = row < Tq && t < klen && (!causal || t <= row + shift);
          const float p = valid ? expf(s[i][j] * scale - Ls[r]) : 0.0f;
          Pt[(ty + 16 * i) * LDT + r] = p;
          St[(ty + 16 * i) * LDT + r] = p * (dp[i][j] - Ds[r]);
        }
      }
      __syncthreads();
#pragma unroll 4
      for (int r = 0; r < kTile; ++r) {
        float gv[DPT], qv[DPT];
#pragma unroll
        for (int j = 0; j < DPT; ++j) {
          gv[j] = Gs[r * LD + tx + 16 * j];
          qv[j] = Qs[r * LD + tx + 16 * j];
        }
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
          const float p = Pt[(ty + 16 * i) * LDT + r], ds = St[(ty + 16 * i) * LDT + r];
#pragma unroll
          for (int j = 0; j < DPT; ++j) {
            dva[i][j] += p * gv[j];
            dka[i][j] += ds * qv[j];
          }
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int64_t t = t0 + ty + 16 * i;
    if (t >= Tk) continue;
#pragma unroll
    for (int j = 0; j < DPT; ++j) {
      dk[(bh * Tk + t) * HD + tx + 16 * j] = dka[i][j] * scale;
      dv[(bh * Tk + t) * HD + tx + 16 * j] = dva[i][j];
    }
  }
}

template <int HD>
__global__ void __launch_bounds__(kThreads)
    dq_kernel(const float* dout, const float* q, const float* k, const float* v, const float* lse,
              const float* delta, int64_t NH, int64_t Tq, int64_t Tk, float scale, bool causal,
              const int64_t* key_lens, float* dq) {
  constexpr int LD = HD + 1, LDP = kTile + 1, DPT = HD / 16;
  extern __shared__ float smem[];
  float* Qs = smem;              // (64, LD): this block's queries, unscaled
  float* Gs = Qs + kTile * LD;   // (64, LD): their dO
  float* Ks = Gs + kTile * LD;   // (64, LD)
  float* Vs = Ks + kTile * LD;   // (64, LD)
  float* Ss = Vs + kTile * LD;   // (64, LDP): dS of the key tile
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const int64_t bh = blockIdx.y, q0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t klen = key_lens ? key_lens[bh / NH] : Tk;
  load_tile<HD>(Qs, q + bh * Tq * HD, q0, Tq);
  load_tile<HD>(Gs, dout + bh * Tq * HD, q0, Tq);
  const float* kb = k + bh * Tk * HD;
  const float* vb = v + bh * Tk * HD;
  int64_t vis[kPer];
  float li[kPer], Di[kPer], dqa[kPer][DPT];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int64_t row = q0 + ty + 16 * i;
    const bool in = row < Tq;
    vis[i] = in ? visible(row, Tq, Tk, causal, klen) : 0;
    li[i] = in ? lse[bh * Tq + row] : 0.0f;
    Di[i] = in ? delta[bh * Tq + row] : 0.0f;
#pragma unroll
    for (int j = 0; j < DPT; ++j) dqa[i][j] = 0.0f;
  }
  const int64_t last = min(q0 + kTile, Tq) - 1;
  const int64_t vis_max = visible(last, Tq, Tk, causal, klen);
  for (int64_t t0 = 0; t0 < vis_max; t0 += kTile) {
    __syncthreads();
    load_tile<HD>(Ks, kb, t0, Tk);
    load_tile<HD>(Vs, vb, t0, Tk);
    __syncthreads();
    float s[kPer][kPer], dp[kPer][kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i)
#pragma unroll
      for (int j = 0; j < kPer; ++j) s[i][j] = dp[i][j] = 0.0f;
#pragma unroll 4
    for (int d = 0; d < HD; ++d) {
      float qv[kPer], gv[kPer], kv[kPer], vv[kPer];
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        qv[i] = Qs[(ty + 16 * i) * LD + d];
        gv[i] = Gs[(ty + 16 * i) * LD + d];
      }
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        kv[j] = Ks[(tx + 16 * j) * LD + d];
        vv[j] = Vs[(tx + 16 * j) * LD + d];
      }
#pragma unroll
      for (int i = 0; i < kPer; ++i)
#pragma unroll
        for (int j = 0; j < kPer; ++j) {
          s[i][j] += qv[i] * kv[j];
          dp[i][j] += gv[i] * vv[j];
        }
    }
#pragma unroll
    for (int i = 0; i < kPer; ++i)
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const int c = tx + 16 * j;
        const float p = t0 + c < vis[i] ? expf(s[i][j] * scale - li[i]) : 0.0f;
        Ss[(ty + 16 * i) * LDP + c] = p * (dp[i][j] - Di[i]);
      }
    __syncthreads();
#pragma unroll 4
    for (int c = 0; c < kTile; ++c) {
      float kv[DPT];
#pragma unroll
      for (int j = 0; j < DPT; ++j) kv[j] = Ks[c * LD + tx + 16 * j];
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const float ds = Ss[(ty + 16 * i) * LDP + c];
#pragma unroll
        for (int j = 0; j < DPT; ++j) dqa[i][j] += ds * kv[j];
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int64_t row = q0 + ty + 16 * i;
    if (row >= Tq) continue;
#pragma unroll
    for (int j = 0; j < DPT; ++j) dq[(bh * Tq + row) * HD + tx + 16 * j] = dqa[i][j] * scale;
  }
}

template <int HD>
constexpr size_t forward_smem() {
  return sizeof(float) * (3 * kTile * (HD + 1) + kTile * (kTile + 1));
}
template <int HD>
constexpr size_t dkdv_smem() {
  return sizeof(float) * (4 * kTile * (HD + 1) + 2 * kTile * (kTile + 1) + 2 * kTile);
}
template <int HD>
constexpr size_t dq_smem() {
  return sizeof(float) * (4 * kTile * (HD + 1) + kTile * (kTile + 1));
}

// Shared memory above 48 KiB must be asked for, once per kernel.
template <class Kernel>
cudaError_t allow_smem(Kernel kernel, size_t bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(bytes));
}

unsigned tiles(int64_t n) { return static_cast<unsigned>((n + kTile - 1) / kTile); }

template <int HD>
cudaError_t forward_hd(const float* q, const float* k, const float* v, int64_t B, int64_t NH,
                       int64_t Tq, int64_t Tk, float scale, bool causal, const int64_t* key_lens,
                       float* out, float* lse, cudaStream_t stream) {
  static const cudaError_t set = allow_smem(forward_kernel<HD>, forward_smem<HD>());
  if (set != cudaSuccess) return set;
  const dim3 grid(tiles(Tq), static_cast<unsigned>(B * NH));
  forward_kernel<HD><<<grid, kThreads, forward_smem<HD>(), stream>>>(q, k, v, NH, Tq, Tk, scale,
                                                                     causal, key_lens, out, lse);
  return cudaGetLastError();
}

template <int HD>
cudaError_t backward_hd(const float* dout, const float* q, const float* k, const float* v,
                        const float* lse, const float* delta, int64_t B, int64_t NH, int64_t Tq,
                        int64_t Tk, float scale, bool causal, const int64_t* key_lens, float* dq,
                        float* dk, float* dv, cudaStream_t stream) {
  static const cudaError_t set1 = allow_smem(dkdv_kernel<HD>, dkdv_smem<HD>());
  static const cudaError_t set2 = allow_smem(dq_kernel<HD>, dq_smem<HD>());
  if (set1 != cudaSuccess) return set1;
  if (set2 != cudaSuccess) return set2;
  const unsigned bh = static_cast<unsigned>(B * NH);
  if (Tk > 0)
    dkdv_kernel<HD><<<dim3(tiles(Tk), bh), kThreads, dkdv_smem<HD>(), stream>>>(
        dout, q, k, v, lse, delta, NH, Tq, Tk, scale, causal, key_lens, dk, dv);
  if (Tq > 0)
    dq_kernel<HD><<<dim3(tiles(Tq), bh), kThreads, dq_smem<HD>(), stream>>>(
        dout, q, k, v, lse, delta, NH, Tq, Tk, scale, causal, key_lens, dq);
  return cudaGetLastError();
}

}  // namespace

bool tiled_attention_supports(int64_t hd, int64_t B, int64_t NH) {
  return (hd == 32 || hd == 64 || hd == 128) && B * NH <= 65535;
}

cudaError_t tiled_attention_forward(const float* q, const float* k, const float* v, int64_t B,
                                    int64_t NH, int64_t Tq, int64_t Tk, int64_t hd, float scale,
                                    bool causal, const int64_t* key_lens, float* out, float* lse,
                                    cudaStream_t stream) {
  switch (hd) {
    case 32: return forward_hd<32>(q, k, v, B, NH, Tq, Tk, scale, causal, key_lens, out, lse, stream);
    case 64: return forward_hd<64>(q, k, v, B, NH, Tq, Tk, scale, causal, key_lens, out, lse, stream);
    default: return forward_hd<128>(q, k, v, B, NH, Tq, Tk, scale, causal, key_lens, out, lse, stream);
  }
}

cudaError_t tiled_attention_backward(const float* dout, const float* q, const float* k,
                                     const float* v, const float* lse, const float* delta,
                                     int64_t B, int64_t NH, int64_t Tq, int64_t Tk, int64_t hd,
                                     float scale, bool causal, const int64_t* key_lens, float* dq,
                                     float* dk, float* dv, cudaStream_t stream) {
  switch (hd) {
    case 32:
      return backward_hd<32>(dout, q, k, v, lse, delta, B, NH, Tq, Tk, scale, causal, key_lens, dq, dk, dv, stream);
    case 64:
      return backward_hd<64>(dout, q, k, v, lse, delta, B, NH, Tq, Tk, scale, causal, key_lens, dq, dk, dv, stream);
    default:
      return backward_hd<128>(dout, q, k, v, lse, delta, B, NH, Tq, Tk, scale, causal, key_lens, dq, dk, dv, stream);
  }
}

}  // namespace ds::backend::cuda_kernels

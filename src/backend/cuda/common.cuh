#pragma once
// Device helpers shared by the CUDA kernels (*.cu only): element loads and stores for every dtype,
// strided offsets, warp and block reductions, the counter-based hash of ds::rng. Internal header.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace ds::backend::cuda_kernels {

constexpr int kWarp = 32;

inline unsigned blocks_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > (1 << 30) ? (1 << 30) : b));
}

__device__ __forceinline__ double load_elem(const void* p, Elem t, int64_t i) {
  switch (t) {
    case Elem::f32: return static_cast<const float*>(p)[i];
    case Elem::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case Elem::f16: return __half2float(static_cast<const __half*>(p)[i]);
    case Elem::i32: return static_cast<const int32_t*>(p)[i];
    case Elem::i64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
  }
  return 0.0;
}

__device__ __forceinline__ float load_f(const void* p, Elem t, int64_t i) {
  switch (t) {
    case Elem::f32: return static_cast<const float*>(p)[i];
    case Elem::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case Elem::f16: return __half2float(static_cast<const __half*>(p)[i]);
    default: return static_cast<float>(load_elem(p, t, i));
  }
}

// Integers are stored from their exact value (i64 loads are exact below 2^53, as on the host).
__device__ __forceinline__ void store_elem(void* p, Elem t, int64_t i, double v) {
  switch (t) {
    case Elem::f32: static_cast<float*>(p)[i] = static_cast<float>(v); return;
    case Elem::bf16:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(static_cast<float>(v));
      return;
    case Elem::f16: static_cast<__half*>(p)[i] = __float2half_rn(static_cast<float>(v)); return;
    case Elem::i32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); return;
    case Elem::i64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); return;
  }
}

__device__ __forceinline__ void store_f(void* p, Elem t, int64_t i, float v) {
  switch (t) {
    case Elem::f32: static_cast<float*>(p)[i] = v; return;
    case Elem::bf16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); return;
    case Elem::f16: static_cast<__half*>(p)[i] = __float2half_rn(v); return;
    default: store_elem(p, t, i, v);
  }
}

// Element offset of the i-th element (row-major logical order) of a strided view. I is the index
// type: uint32_t where every index and offset fits (32-bit division is several times cheaper than
// 64-bit, and this division is most of a strided copy's cost), int64_t otherwise.
template <class I = int64_t>
__device__ __forceinline__ I view_offset(const View& v, I i) {
  I off = static_cast<I>(v.offset);
  for (int d = v.ndim - 1; d > 0; --d) {
    const I s = static_cast<I>(v.shape[d]);
    const I q = i / s;
    off += (i - q * s) * static_cast<I>(v.strides[d]);
    i = q;
  }
  if (v.ndim > 0) off += i * static_cast<I>(v.strides[0]);
  return off;
}

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024), the same fixed tree every call;
// every thread gets the result. shared: at least 32 T's. Ends with a barrier, so shared can be
// reused right after.
template <class T>
__device__ T block_sum(T v, T* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int nwarps = blockDim.x / kWarp;
  v = warp_sum(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T r = lane < nwarps ? shared[lane] : T(0);
  r = warp_sum(r);
  __syncthreads();
  return r;
}

__device__ __forceinline__ float block_max(float v, float* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int nwarps = blockDim.x / kWarp;
  v = warp_max(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float r = lane < nwarps ? shared[lane] : -INFINITY;
  r = warp_max(r);
  __syncthreads();
  return r;
}

// ds::rng::hash3, bit for bit.
__device__ __forceinline__ uint64_t hash3(uint64_t seed, uint64_t stream, uint64_t index) {
  auto mix = [](uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  return mix(mix(seed * 0x9e3779b97f4a7c15ULL + stream) ^ (index * 0xd6e8feb86659fd93ULL + 1));
}

// GPT-2's tanh-approximated GELU and SiLU, and their derivatives, in fp32.
__device__ __forceinline__ float gelu_f(float x) {
  const float c = 0.7978845608028654f;  // sqrt(2/pi)
  return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}
__device__ __forceinline__ float gelu_grad_f(float x) {
  const float c = 0.7978845608028654f;
  const float u = c * (x + 0.044715f * x * x * x);
  const float t = tanhf(u);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * c * (1.0f + 3.0f * 0.044715f * x * x);
}
__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float silu_grad_f(float x) {
  const float s = 1.0f / (1.0f + expf(-x));
  return s * (1.0f + x * (1.0f - s));
}

}  // namespace ds::backend::cuda_kernels

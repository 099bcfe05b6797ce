// Reduction kernels for the collectives: fixed left-to-right order (deterministic), fp32
// accumulation for 16-bit types with one rounding at the end. Work in blocks that stay in L1.
#include <algorithm>
#include <cstring>

#include "comm/internal.h"

namespace ds::comm::detail {
namespace {

constexpr size_t kBlock = 1024;  // elements; fp32 accumulator of 4 KiB

// NaN-propagating max: a if a > b or a is NaN, else b (b NaN -> b).
inline float max_nan(float a, float b) {
  return (a > b || a != a) ? a : b;
}

void reduce_f32(float* dst, const void* const* srcs, int n_src, size_t n, ReduceOp op) {
  float acc[kBlock];
  for (size_t b0 = 0; b0 < n; b0 += kBlock) {
    const size_t m = std::min(kBlock, n - b0);
    const float* s0 = static_cast<const float*>(srcs[0]) + b0;
    for (size_t i = 0; i < m; ++i) acc[i] = s0[i];
    for (int r = 1; r < n_src; ++r) {
      const float* s = static_cast<const float*>(srcs[r]) + b0;
      if (op == ReduceOp::sum)
        for (size_t i = 0; i < m; ++i) acc[i] += s[i];
      else
        for (size_t i = 0; i < m; ++i) acc[i] = max_nan(acc[i], s[i]);
    }
    std::memcpy(dst + b0, acc, m * sizeof(float));
  }
}

void reduce_16(uint16_t* dst, const void* const* srcs, int n_src, size_t n, DType dt, ReduceOp op) {
  float acc[kBlock], tmp[kBlock];
  for (size_t b0 = 0; b0 < n; b0 += kBlock) {
    const size_t m = std::min(kBlock, n - b0);
    convert(static_cast<const uint16_t*>(srcs[0]) + b0, dt, acc, DType::f32, m);
    for (int r = 1; r < n_src; ++r) {
      convert(static_cast<const uint16_t*>(srcs[r]) + b0, dt, tmp, DType::f32, m);
      if (op == ReduceOp::sum)
        for (size_t i = 0; i < m; ++i) acc[i] += tmp[i];
      else
        for (size_t i = 0; i < m; ++i) acc[i] = max_nan(acc[i], tmp[i]);
    }
    convert(acc, DType::f32, dst + b0, dt, m);
  }
}

template <class T>
void reduce_int(T* dst, const void* const* srcs, int n_src, size_t n, ReduceOp op) {
  using U = std::make_unsigned_t<T>;  // sums wrap around instead of being undefined
  for (size_t b0 = 0; b0 < n; b0 += kBlock) {
    const size_t m = std::min(kBlock, n - b0);
    T acc[kBlock];
    std::memcpy(acc, static_cast<const T*>(srcs[0]) + b0, m * sizeof(T));
    for (int r = 1; r < n_src; ++r) {
      const T* s = static_cast<const T*>(srcs[r]) + b0;
      if (op == ReduceOp::sum)
        for (size_t i = 0; i < m; ++i)
          acc[i] = static_cast<T>(static_cast<U>(acc[i]) + static_cast<U>(s[i]));
      else
        for (size_t i = 0; i < m; ++i) acc[i] = std::max(acc[i], s[i]);
    }
    std::memcpy(dst + b0, acc, m * sizeof(T));
  }
}

}  // namespace

void reduce_n(void* dst, const void* const* srcs, int n_src, size_t n, DType dtype, ReduceOp op) {
  if (n == 0) return;
  if (n_src == 1) {
    if (dst != srcs[0]) std::memmove(dst, srcs[0], n * dtype_size(dtype));
    return;
  }
  switch (dtype) {
    case DType::f32:
      return reduce_f32(static_cast<float*>(dst), srcs, n_src, n, op);
    case DType::bf16:
    case DType::f16:
      return reduce_16(static_cast<uint16_t*>(dst), srcs, n_src, n, dtype, op);
    case DType::i32:
      return reduce_int(static_cast<int32_t*>(dst), srcs, n_src, n, op);
    case DType::i64:
      return reduce_int(static_cast<int64_t*>(dst), srcs, n_src, n, op);
  }
}

}  // namespace ds::comm::detail

#include "ds/core/dtype.h"

#include <immintrin.h>

#include <cmath>
#include <string>

#include "ds/core/error.h"

namespace ds {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "fp32";
    case DType::bf16: return "bf16";
    case DType::f16: return "fp16";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
  }
  return "?";
}

DType dtype_from_name(std::string_view n) {
  if (n == "fp32" || n == "float32" || n == "float" || n == "f32") return DType::f32;
  if (n == "bf16" || n == "bfloat16") return DType::bf16;
  if (n == "fp16" || n == "float16" || n == "half" || n == "f16") return DType::f16;
  if (n == "int32" || n == "i32") return DType::i32;
  if (n == "int64" || n == "i64") return DType::i64;
  DS_THROW("[dtype] unknown dtype '{}'; expected one of fp32, bf16, fp16, int32, int64", n);
}

float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      u = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000u | mant << 13;
  } else {
    u = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t float_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;            // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;           // rounds to >= 65520: inf
  if (abs < 0x38800000u) {                                  // below the smallest normal 2^-14
    // Subnormal or zero: scale so that the result's integer part is the f16 mantissa, then let
    // the FPU's round-to-nearest-even do the rounding.
    float a;
    std::memcpy(&a, &abs, 4);
    const float scaled = a * 16777216.0f;  // 2^24 = 1 / smallest subnormal
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  // Normal: drop 13 mantissa bits with round to nearest even; a carry into the exponent is right.
  uint32_t v = abs - (112u << 23);  // rebias exponent 127 -> 15
  v += 0xfffu + ((v >> 13) & 1u);
  return sign | static_cast<uint16_t>(v >> 13);
}

namespace {

__attribute__((target("avx2,f16c,fma"))) void f32_to_f16_avx2(const float* s, uint16_t* d,
                                                               size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), h);
  }
  for (; i < n; ++i) d[i] = float_to_f16(s[i]);
}

__attribute__((target("avx2,f16c,fma"))) void f16_to_f32_avx2(const uint16_t* s, float* d,
                                                               size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  for (; i < n; ++i) d[i] = f16_to_float(s[i]);
}

__attribute__((target("avx2"))) void f32_to_bf16_avx2(const float* s, uint16_t* d, size_t n) {
  size_t i = 0;
  const __m256i ones = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_loadu_ps(s + i);
    __m256i u = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), ones);
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, bias), lsb), 16);
    // NaN stays NaN (quiet): take the truncated bits with the quiet bit set.
    __m256 isnan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    __m256i qnan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    r = _mm256_blendv_epi8(r, qnan, _mm256_castps_si256(isnan));
    // pack 8 x u32 (values < 2^16) into 8 x u16
    __m128i lo = _mm256_castsi256_si128(r), hi = _mm256_extracti128_si256(r, 1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), _mm_packus_epi32(lo, hi));
  }
  for (; i < n; ++i) d[i] = float_to_bf16(s[i]);
}

__attribute__((target("avx2"))) void bf16_to_f32_avx2(const uint16_t* s, float* d, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
    _mm256_storeu_ps(d + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
  }
  for (; i < n; ++i) d[i] = bf16_to_float(s[i]);
}

const bool kHasAvx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") &&
                      __builtin_cpu_supports("fma");

template <class Get>
void store_from(Get get, void* dst, DType dt, size_t n) {
  switch (dt) {
    case DType::f32: {
      auto* d = static_cast<float*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = static_cast<float>(get(i));
      break;
    }
    case DType::bf16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = float_to_bf16(static_cast<float>(get(i)));
      break;
    }
    case DType::f16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = float_to_f16(static_cast<float>(get(i)));
      break;
    }
    case DType::i32: {
      auto* d = static_cast<int32_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = static_cast<int32_t>(get(i));
      break;
    }
    case DType::i64: {
      auto* d = static_cast<int64_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = static_cast<int64_t>(get(i));
      break;
    }
  }
}

}  // namespace

void convert(const void* src, DType st, void* dst, DType dt, size_t n) {
  if (st == dt) {
    std::memcpy(dst, src, n * dtype_size(st));
    return;
  }
  if (kHasAvx2) {
    if (st == DType::f32 && dt == DType::f16)
      return f32_to_f16_avx2(static_cast<const float*>(src), static_cast<uint16_t*>(dst), n);
    if (st == DType::f16 && dt == DType::f32)
      return f16_to_f32_avx2(static_cast<const uint16_t*>(src), static_cast<float*>(dst), n);
    if (st == DType::f32 && dt == DType::bf16)
      return f32_to_bf16_avx2(static_cast<const float*>(src), static_cast<uint16_t*>(dst), n);
    if (st == DType::bf16 && dt == DType::f32)
      return bf16_to_f32_avx2(static_cast<const uint16_t*>(src), static_cast<float*>(dst), n);
  }
  switch (st) {
    case DType::f32: {
      auto* s = static_cast<const float*>(src);
      return store_from([&](size_t i) { return s[i]; }, dst, dt, n);
    }
    case DType::bf16: {
      auto* s = static_cast<const uint16_t*>(src);
      return store_from([&](size_t i) { return bf16_to_float(s[i]); }, dst, dt, n);
    }
    case DType::f16: {
      auto* s = static_cast<const uint16_t*>(src);
      return store_from([&](size_t i) { return f16_to_float(s[i]); }, dst, dt, n);
    }
    case DType::i32: {
      auto* s = static_cast<const int32_t*>(src);
      if (dt == DType::i64) return store_from([&](size_t i) { return s[i]; }, dst, dt, n);
      return store_from([&](size_t i) { return static_cast<double>(s[i]); }, dst, dt, n);
    }
    case DType::i64: {
      auto* s = static_cast<const int64_t*>(src);
      if (dt == DType::i32) return store_from([&](size_t i) { return s[i]; }, dst, dt, n);
      return store_from([&](size_t i) { return static_cast<double>(s[i]); }, dst, dt, n);
    }
  }
}

}  // namespace ds

#pragma once
// Vectorisable elementary functions for CPU kernels. glibc's expf/tanhf are scalar calls that stop
// the loop from vectorising; GELU and softmax over (B*T, 4C) and (B*T, V) tensors would then
// dominate a training step. These are plain arithmetic that GCC turns into AVX2/AVX-512 code inside
// `#pragma omp simd` loops.
//
// Why the bit tricks: under GCC's default -ftrapping-math a float comparison may raise an FP
// exception, so GCC will not if-convert `x < a ? a : x` and a loop containing one is not vectorised
// at all (GCC 12: every function here compiled to scalar code with branches when written with float
// compares). Clamps and selects are therefore done on the bit patterns with integer compares, which
// cannot trap. tests/test_ops.cpp checks the accuracy claims below.
//
// Accuracy: exp has relative error below 1e-7 wherever the result is a normal float,
// x in [-87.3, 88.72]; larger x gives +inf, smaller x gives exp(-87.3) ~ 1.2e-38 (clamped, never a
// denormal, whose arithmetic is slow: kernels that need exact zeros for masked entries write
// them); NaN gives NaN. tanh has absolute error below 3e-7.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace ds::backend::fm {

namespace detail {
inline uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }
inline float from_bits(uint32_t u) { return std::bit_cast<float>(u); }
// All ones where cond holds: a lane mask for select().
inline uint32_t mask(bool cond) { return 0u - static_cast<uint32_t>(cond); }
inline float select(uint32_t m, float a, float b) { return from_bits((bits(a) & m) | (bits(b) & ~m)); }
}  // namespace detail

#pragma omp declare simd
inline float exp(float x) {
  using namespace detail;
  // exp(x) = 2^n * exp(r), n = round(x / ln2), r = x - n ln2 in [-ln2/2, ln2/2].
  // Clamp x to [-87.3, 89] on the bits: for negative floats the unsigned pattern grows with the
  // magnitude, so an unsigned min clamps each sign's side. That keeps n in [-126, 128].
  const uint32_t u = bits(x);
  const uint32_t c = (u >> 31) ? std::min(u, 0xc2ae999au /* -87.3f */) : std::min(u, 0x42b20000u /* 89.0f */);
  const float xc = from_bits(c);
  const float n = std::nearbyint(xc * 1.44269504088896341f);
  const float r = xc - n * 0.693145751953125f - n * 1.428606765330187e-06f;  // Cody-Waite ln2 split
  // Taylor polynomial of degree 7 on the reduced range (truncation error < 6e-9).
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // 2^n as two normal factors 2^(n/2) 2^(n - n/2): a single 2^128 would be +inf, making results
  // between 2^127.5 and FLT_MAX overflow early; x > 88.72 still overflows to +inf as it should.
  const int32_t ni = static_cast<int32_t>(n);
  const int32_t n1 = ni >> 1, n2 = ni - n1;
  const float y = p * from_bits(static_cast<uint32_t>(n1 + 127) << 23) *
                  from_bits(static_cast<uint32_t>(n2 + 127) << 23);
  // NaN in, NaN out (the clamp turned it into a number).
  return select(mask((u & 0x7fffffffu) > 0x7f800000u), x, y);
}

#pragma omp declare simd
inline float tanh(float x) {
  using namespace detail;
  // tanh(x) = 1 - 2 / (exp(2x) + 1); for small |x| use the odd series to keep relative accuracy.
  // Branch-free: both forms are computed and one is selected.
  const uint32_t u = bits(x);
  const float ax = from_bits(u & 0x7fffffffu);
  const float x2 = x * x;
  const float series =
      x * (1.0f + x2 * (-1.0f / 3.0f + x2 * (2.0f / 15.0f + x2 * (-17.0f / 315.0f))));
  const float t = 1.0f - 2.0f / (exp(2.0f * ax) + 1.0f);  // tanh(|x|) >= 0
  const float signed_t = from_bits(bits(t) | (u & 0x80000000u));
  return select(mask((u & 0x7fffffffu) < 0x3d800000u /* 0.0625f */), series, signed_t);
}

// GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
constexpr float kGeluC = 0.7978845608028654f;
constexpr float kGeluA = 0.044715f;

#pragma omp declare simd
inline float gelu(float x) {
  return 0.5f * x * (1.0f + tanh(kGeluC * (x + kGeluA * x * x * x)));
}

#pragma omp declare simd
inline float gelu_grad(float x) {
  const float u = kGeluC * (x + kGeluA * x * x * x);
  const float t = tanh(u);
  const float du = kGeluC * (1.0f + 3.0f * kGeluA * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

// erfc(x), relative error below 1e-6 wherever erfc(x) > 1e-30 (x < 8.2; tests/test_ops.cpp): the
// Chebyshev fit erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z/2), for z = |x| (fractional error
// 1.2e-7 in exact arithmetic), and erfc(-z) = 2 - erfc(z). Relative accuracy where erfc is tiny is
// what exact GELU needs: x Phi(x) = x erfc(-x / sqrt 2) / 2 for large negative x.
#pragma omp declare simd
inline float erfc(float x) {
  using namespace detail;
  const float z = from_bits(bits(x) & 0x7fffffffu);
  const float t = 1.0f / (1.0f + 0.5f * z);
  const float p =
      -1.26551223f +
      t * (1.00002368f +
           t * (0.37409196f +
                t * (0.09678418f +
                     t * (-0.18628806f +
                          t * (0.27886807f +
                               t * (-1.13520398f +
                                    t * (1.48851587f + t * (-0.82215223f + t * 0.17087277f))))))));
  // exp(-z^2 + p) as exp(-zz) exp(p - e), zz = z^2 rounded and e = z^2 - zz exactly (fma): the
  // rounding of -z^2 + p alone (ulp 4e-6 near 64) would cost that much relative error.
  const float zz = z * z;
  const float e = std::fma(z, z, -zz);
  const float r = t * exp(-zz) * exp(p - e);
  return select(mask((bits(x) >> 31) != 0u), 2.0f - r, r);
}

// Exact GELU x Phi(x) and its derivative Phi(x) + x phi(x) (Phi, phi: the standard normal's
// distribution and density).
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

#pragma omp declare simd
inline float gelu_erf(float x) { return 0.5f * x * erfc(-x * kInvSqrt2); }

#pragma omp declare simd
inline float gelu_erf_grad(float x) {
  return 0.5f * erfc(-x * kInvSqrt2) + x * kInvSqrt2Pi * exp(-0.5f * x * x);
}

#pragma omp declare simd
inline float sigmoid(float x) { return 1.0f / (1.0f + exp(-x)); }

#pragma omp declare simd
inline float silu(float x) { return x * sigmoid(x); }

#pragma omp declare simd
inline float silu_grad(float x) {
  const float s = sigmoid(x);
  return s * (1.0f + x * (1.0f - s));
}

// max(x[0, n)), -inf for n == 0. GCC does not vectorise a float max reduction written in C++
// (`std::max` is a compare and select: see above), and a scalar max is a 4-cycle dependency chain
// per element, as slow as the exp that follows it in a softmax; so this one is written with AVX.
// NaNs are not propagated (callers see them through the exp that follows).
inline float max_of(const float* x, int64_t n) {
  int64_t i = 0;
  float m = -std::numeric_limits<float>::infinity();
#if defined(__AVX__)
  __m256 a0 = _mm256_set1_ps(m), a1 = a0, a2 = a0, a3 = a0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_max_ps(a0, _mm256_loadu_ps(x + i));
    a1 = _mm256_max_ps(a1, _mm256_loadu_ps(x + i + 8));
    a2 = _mm256_max_ps(a2, _mm256_loadu_ps(x + i + 16));
    a3 = _mm256_max_ps(a3, _mm256_loadu_ps(x + i + 24));
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_max_ps(a0, _mm256_loadu_ps(x + i));
  const __m256 a = _mm256_max_ps(_mm256_max_ps(a0, a1), _mm256_max_ps(a2, a3));
  const __m128 h = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 h2 = _mm_max_ps(h, _mm_movehl_ps(h, h));
  m = _mm_cvtss_f32(_mm_max_ss(h2, _mm_shuffle_ps(h2, h2, 1)));
#endif
  for (; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

}  // namespace ds::backend::fm

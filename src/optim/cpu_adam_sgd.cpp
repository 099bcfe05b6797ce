// Adam and SGD: per-ISA inner loops (simd_body.inl instantiated three times), run-time dispatch
// and the threaded tile loop.
#include <immintrin.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string_view>

#include "ds/backend/backend.h"
#include "optim_internal.h"

namespace ds::optim {
namespace detail {

// ---- scalar: the reference path, and the tail of every vector path --------------------------
namespace scalar {
namespace {
// clang-format off
using vf = float;
constexpr int64_t kW = 1;
inline vf vload(const float* p) { return *p; }
inline void vstore(float* p, vf x) { *p = x; }
inline vf vset1(float x) { return x; }
inline vf vmul(vf a, vf b) { return a * b; }
inline vf vfma(vf a, vf b, vf c) { return std::fma(a, b, c); }
inline vf vdiv(vf a, vf b) { return a / b; }
inline vf vsqrt(vf a) { return std::sqrt(a); }
inline void vstore_bf16(uint16_t* d, vf x) { *d = float_to_bf16(x); }
inline void vstore_f16(uint16_t* d, vf x) { *d = float_to_f16(x); }
// clang-format on
#include "simd_body.inl"
}  // namespace
}  // namespace scalar

// ---- AVX2 + FMA + F16C (8 floats) ------------------------------------------------------------
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2 {
namespace {
// clang-format off
using vf = __m256;
constexpr int64_t kW = 8;
inline vf vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, vf x) { _mm256_storeu_ps(p, x); }
inline vf vset1(float x) { return _mm256_set1_ps(x); }
inline vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
inline vf vdiv(vf a, vf b) { return _mm256_div_ps(a, b); }
inline vf vsqrt(vf a) { return _mm256_sqrt_ps(a); }
inline void vstore_bf16(uint16_t* d, vf x) {
  // float_to_bf16 on 8 lanes: add 0x7fff + lsb and truncate; NaN keeps its top bits, made quiet.
  const __m256i u = _mm256_castps_si256(x);
  const __m256i hi = _mm256_srli_epi32(u, 16);
  const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
  __m256i r =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), _mm256_castps_si256(nan));
  const __m128i packed =
      _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(d), packed);
}
inline void vstore_f16(uint16_t* d, vf x) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(d), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
}
// clang-format on
#include "simd_body.inl"
}  // namespace
}  // namespace avx2
#pragma GCC pop_options

// ---- AVX-512F (16 floats). Same vocabulary, wider registers; cannot run on AVX2-only CPUs, so
// it is kept a line-for-line transcription of the AVX2 one and shares its loop code. ----------
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma,f16c")
// GCC 12's avx512fintrin.h trips its own -Wmaybe-uninitialized (_mm512_undefined_* used as the
// pass-through of unmasked builtins; GCC bug 105593, fixed in 13): not our code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
namespace avx512 {
namespace {
// clang-format off
using vf = __m512;
constexpr int64_t kW = 16;
inline vf vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, vf x) { _mm512_storeu_ps(p, x); }
inline vf vset1(float x) { return _mm512_set1_ps(x); }
inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
inline vf vdiv(vf a, vf b) { return _mm512_div_ps(a, b); }
inline vf vsqrt(vf a) { return _mm512_sqrt_ps(a); }
inline void vstore_bf16(uint16_t* d, vf x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i hi = _mm512_srli_epi32(u, 16);
  const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  __m512i r =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  r = _mm512_mask_blend_epi32(nan, r, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(d), _mm512_cvtepi32_epi16(r));  // exact: < 2^16
}
inline void vstore_f16(uint16_t* d, vf x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(d),
                      _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
// clang-format on
#include "simd_body.inl"
}  // namespace
}  // namespace avx512
#pragma GCC diagnostic pop
#pragma GCC pop_options

// ---- dispatch ---------------------------------------------------------------------------------

namespace {

std::atomic<int> g_path{-1};  // SimdPath, or -1 until first use

SimdPath path_from_env_or_best() {
  const char* env = std::getenv("DS_SIMD");
  if (env == nullptr || *env == 0) return best_simd_path();
  const std::string_view s(env);
  SimdPath p;
  if (s == "scalar")
    p = SimdPath::scalar;
  else if (s == "avx2")
    p = SimdPath::avx2;
  else if (s == "avx512")
    p = SimdPath::avx512;
  else
    DS_THROW("[optim] DS_SIMD='{}' is not a SIMD path; use scalar, avx2 or avx512 (or unset it)",
             s);
  DS_CHECK(simd_path_supported(p), "[optim] DS_SIMD={} but this CPU does not support it; use {}", s,
           simd_path_name(best_simd_path()));
  return p;
}

// The tail of a vector kernel goes through the scalar path, which is bitwise identical.
void adam_range(SimdPath path, float* p, const float* g, float* m, float* v, int64_t n,
                const AdamConsts& k, uint16_t* out16, Out16 kind) {
  int64_t done = 0;
  if (path == SimdPath::avx512)
    done = avx512::adam_kernel(p, g, m, v, n, k, out16, kind);
  else if (path == SimdPath::avx2)
    done = avx2::adam_kernel(p, g, m, v, n, k, out16, kind);
  scalar::adam_kernel(p + done, g + done, m + done, v + done, n - done, k,
                      out16 ? out16 + done : nullptr, kind);
}

void sgd_range(SimdPath path, float* p, const float* g, float* buf, int64_t n, const SgdConsts& k,
               uint16_t* out16, Out16 kind) {
  int64_t done = 0;
  if (path == SimdPath::avx512)
    done = avx512::sgd_kernel(p, g, buf, n, k, out16, kind);
  else if (path == SimdPath::avx2)
    done = avx2::sgd_kernel(p, g, buf, n, k, out16, kind);
  scalar::sgd_kernel(p + done, g + done, buf ? buf + done : nullptr, n - done, k,
                     out16 ? out16 + done : nullptr, kind);
}

}  // namespace
}  // namespace detail

const char* simd_path_name(SimdPath p) {
  switch (p) {
    case SimdPath::scalar:
      return "scalar";
    case SimdPath::avx2:
      return "avx2";
    case SimdPath::avx512:
      return "avx512";
  }
  return "?";
}

bool simd_path_supported(SimdPath p) {
  switch (p) {
    case SimdPath::scalar:
      return true;
    case SimdPath::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case SimdPath::avx512:
      // libgcc's check includes the OS saving the zmm state (XGETBV).
      return __builtin_cpu_supports("avx512f") && simd_path_supported(SimdPath::avx2);
  }
  return false;
}

SimdPath best_simd_path() {
  if (simd_path_supported(SimdPath::avx512)) return SimdPath::avx512;
  if (simd_path_supported(SimdPath::avx2)) return SimdPath::avx2;
  return SimdPath::scalar;
}

SimdPath simd_path() {
  int p = detail::g_path.load(std::memory_order_relaxed);
  if (p < 0) {
    p = static_cast<int>(detail::path_from_env_or_best());
    detail::g_path.store(p, std::memory_order_relaxed);
  }
  return static_cast<SimdPath>(p);
}

void set_simd_path(SimdPath p) {
  DS_CHECK(simd_path_supported(p), "[optim] this CPU does not support the {} path; best is {}",
           simd_path_name(p), simd_path_name(best_simd_path()));
  detail::g_path.store(static_cast<int>(p), std::memory_order_relaxed);
}

// ---- Adam -------------------------------------------------------------------------------------

void check_config(const AdamConfig& c) {
  DS_CHECK(std::isfinite(c.lr) && c.lr >= 0, "[optim] Adam: lr must be >= 0, got {}", c.lr);
  DS_CHECK(c.beta1 >= 0 && c.beta1 < 1 && c.beta2 >= 0 && c.beta2 < 1,
           "[optim] Adam: betas must be in [0, 1), got ({}, {})", c.beta1, c.beta2);
  DS_CHECK(c.eps >= 0, "[optim] Adam: eps must be >= 0, got {}", c.eps);
  DS_CHECK(c.weight_decay >= 0, "[optim] Adam: weight_decay must be >= 0, got {}", c.weight_decay);
}

namespace detail {
AdamConsts adam_consts(int64_t step, const AdamConfig& c, float grad_scale) {
  // Constants in double, rounded once: closest to what a float64 reference computes.
  const double t = static_cast<double>(step);
  const double bc1 = c.bias_correction ? 1.0 - std::pow(double{c.beta1}, t) : 1.0;
  const double bc2 = c.bias_correction ? 1.0 - std::pow(double{c.beta2}, t) : 1.0;
  AdamConsts k{};
  k.grad_scale = grad_scale;
  k.beta1 = c.beta1;
  k.one_minus_beta1 = static_cast<float>(1.0 - c.beta1);
  k.beta2 = c.beta2;
  k.one_minus_beta2 = static_cast<float>(1.0 - c.beta2);
  k.eps = c.eps;
  k.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  k.neg_step_size = static_cast<float>(-double{c.lr} / bc1);
  k.weight_decay = c.weight_decay;
  k.neg_lr_wd = static_cast<float>(-double{c.lr} * c.weight_decay);
  k.l2_decay = !c.adam_w_mode && c.weight_decay != 0;
  k.decoupled_decay = c.adam_w_mode && c.weight_decay != 0;
  return k;
}
}  // namespace detail

void adam_update(float* p, const float* g, float* m, float* v, int64_t n, int64_t step,
                 const AdamConfig& c, float grad_scale, void* out16, DType out16_dtype) {
  using namespace detail;
  check_buffers("Adam", n, p, g);
  DS_CHECK(n == 0 || (m != nullptr && v != nullptr), "[optim] Adam: null moment buffer");
  DS_CHECK(step >= 1, "[optim] Adam: step must be >= 1 (1-based count after increment), got {}",
           step);
  check_config(c);
  const Out16 kind = out16_kind(out16, out16_dtype);
  if (n == 0) return;

  const AdamConsts k = adam_consts(step, c, grad_scale);
  const SimdPath path = simd_path();
  auto* o16 = static_cast<uint16_t*>(out16);
  for_each_tile_range(n, [&](int64_t b, int64_t e) {
    adam_range(path, p + b, g + b, m + b, v + b, e - b, k, o16 ? o16 + b : nullptr, kind);
  });
}

// ---- SGD --------------------------------------------------------------------------------------

void check_config(const SgdConfig& c) {
  DS_CHECK(std::isfinite(c.lr) && c.lr >= 0, "[optim] SGD: lr must be >= 0, got {}", c.lr);
  DS_CHECK(c.momentum >= 0, "[optim] SGD: momentum must be >= 0, got {}", c.momentum);
  DS_CHECK(c.weight_decay >= 0, "[optim] SGD: weight_decay must be >= 0, got {}", c.weight_decay);
  DS_CHECK(!c.nesterov || (c.momentum > 0 && c.dampening == 0),
           "[optim] SGD: nesterov needs momentum > 0 and dampening == 0 (got momentum {}, "
           "dampening {})",
           c.momentum, c.dampening);
}

void sgd_update(float* p, const float* g, float* momentum_buf, int64_t n, bool first_momentum_step,
                const SgdConfig& c, float grad_scale, void* out16, DType out16_dtype) {
  using namespace detail;
  check_buffers("SGD", n, p, g);
  check_config(c);
  DS_CHECK(c.momentum == 0 || n == 0 || momentum_buf != nullptr,
           "[optim] SGD: momentum {} needs a momentum buffer", c.momentum);
  const Out16 kind = out16_kind(out16, out16_dtype);
  if (n == 0) return;

  SgdConsts k{};
  k.grad_scale = grad_scale;
  k.weight_decay = c.weight_decay;
  k.momentum = c.momentum;
  k.one_minus_dampening = static_cast<float>(1.0 - c.dampening);
  k.neg_lr = -c.lr;
  k.has_weight_decay = c.weight_decay != 0;
  k.has_momentum = c.momentum != 0;
  k.nesterov = c.nesterov;
  k.first_momentum_step = first_momentum_step;

  const SimdPath path = simd_path();
  auto* o16 = static_cast<uint16_t*>(out16);
  for_each_tile_range(n, [&](int64_t b, int64_t e) {
    sgd_range(path, p + b, g + b, momentum_buf ? momentum_buf + b : nullptr, e - b, k,
              o16 ? o16 + b : nullptr, kind);
  });
}

// ---- over tensors on any device -----------------------------------------------------------------

void adam_update(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, int64_t step,
                 const AdamConfig& c, float grad_scale, const Tensor& out16) {
  const Device dev = p.device();
  for (const Tensor* t : {&g, &m, &v})
    DS_CHECK(t->device() == dev, "[optim] Adam: the parameters are on {} but a gradient or moment "
             "buffer is on {}: keep the optimizer state with the parameters",
             dev.str(), t->device().str());
  for (const Tensor* t : {&p, &g, &m, &v})
    DS_CHECK(t->dtype() == DType::f32 && t->is_contiguous() && t->numel() == p.numel(),
             "[optim] Adam: parameters, gradients and moments must be contiguous fp32 of {} "
             "elements",
             p.numel());
  if (dev.is_cpu()) {
    return adam_update(p.data<float>(), g.data<float>(), m.data<float>(), v.data<float>(),
                       p.numel(), step, c, grad_scale,
                       out16.defined() ? out16.raw_data() : nullptr,
                       out16.defined() ? out16.dtype() : DType::bf16);
  }
  DS_CHECK(step >= 1, "[optim] Adam: step must be >= 1 (1-based count after increment), got {}",
           step);
  check_config(c);
  const detail::AdamConsts k = detail::adam_consts(step, c, grad_scale);
  backend::AdamStep s;
  s.grad_scale = k.grad_scale;
  s.beta1 = k.beta1;
  s.one_minus_beta1 = k.one_minus_beta1;
  s.beta2 = k.beta2;
  s.one_minus_beta2 = k.one_minus_beta2;
  s.eps = k.eps;
  s.inv_sqrt_bc2 = k.inv_sqrt_bc2;
  s.neg_step_size = k.neg_step_size;
  s.weight_decay = k.weight_decay;
  s.neg_lr_wd = k.neg_lr_wd;
  s.l2_decay = k.l2_decay;
  s.decoupled_decay = k.decoupled_decay;
  backend::get(dev).adam(p, g, m, v, s, out16);
}

}  // namespace ds::optim

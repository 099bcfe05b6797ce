// What the 1-bit optimizers share (include/ds/optim/onebit.h; src/optim/onebit_internal.h): the
// Adam constants without bias correction and the elementwise passes after the freeze. The
// optimizers themselves: onebit_adam.cpp, zero_one_adam.cpp, onebit_lamb.cpp.
#include <cmath>

#include "onebit_internal.h"

namespace ds::optim {
namespace detail {

AdamConfig onebit_adam_config(float lr, float beta1, float beta2, float eps, float wd) {
  AdamConfig a;
  a.lr = lr;
  a.beta1 = beta1;
  a.beta2 = beta2;
  a.eps = eps;
  a.weight_decay = wd;
  a.bias_correction = false;
  a.adam_w_mode = true;
  return a;
}

void momentum_update(float* m, const float* g, int64_t n, const AdamConsts& k) {
  parallel_for(n, kTileElems, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      m[i] = std::fma(g[i] * k.grad_scale, k.one_minus_beta1, m[i] * k.beta1);
  });
}

void frozen_variance_apply(float* p, const float* m, const float* v, int64_t n, const AdamConsts& k,
                           void* out16, DType out16_dtype) {
  const Out16 kind = out16_kind(out16, out16_dtype);
  auto* o16 = static_cast<uint16_t*>(out16);
  parallel_for(n, kTileElems, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float denom = std::fma(std::sqrt(v[i]), k.inv_sqrt_bc2, k.eps);
      const float update = m[i] / denom;
      float pi = p[i];
      if (k.decoupled_decay) pi = std::fma(pi, k.neg_lr_wd, pi);
      pi = std::fma(update, k.neg_step_size, pi);
      p[i] = pi;
      if (kind != Out16::none) store16_scalar(o16 + i, kind, pi);
    }
  });
}

void write_out16(const float* p, int64_t n, void* out16, DType out16_dtype) {
  const Out16 kind = out16_kind(out16, out16_dtype);
  if (kind == Out16::none) return;
  auto* o16 = static_cast<uint16_t*>(out16);
  parallel_for(n, kTileElems, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) store16_scalar(o16 + i, kind, p[i]);
  });
}

}  // namespace detail

}  // namespace ds::optim

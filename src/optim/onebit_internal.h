#pragma once
// Shared by the 1-bit optimizers (onebit_adam.cpp, zero_one_adam.cpp): their Adam constants and
// the elementwise passes after the freeze, in adam_update's operation order.
#include <cstdint>

#include "ds/optim/onebit.h"
#include "optim_internal.h"

namespace ds::optim::detail {

// Adam without bias correction, decoupled decay: the update DeepSpeed's 1-bit optimizers apply
// (update = m / (sqrt(v) + eps) + wd * p; p -= lr * update).
AdamConfig onebit_adam_config(float lr, float beta1, float beta2, float eps, float wd);

// m = beta1 * m + (1 - beta1) * (k.grad_scale * g): m, g (n,).
void momentum_update(float* m, const float* g, int64_t n, const AdamConsts& k);

// p -= lr * wd * p; p -= lr * m / (sqrt(v) + eps), v as it is (frozen); out16 as adam_update.
void frozen_variance_apply(float* p, const float* m, const float* v, int64_t n, const AdamConsts& k,
                           void* out16, DType out16_dtype);

// out16 = round(p) as out16_dtype (bf16 or fp16); nothing when out16 is null.
void write_out16(const float* p, int64_t n, void* out16, DType out16_dtype);

}  // namespace ds::optim::detail

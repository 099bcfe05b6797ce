#pragma once
// Shared by the optimizer sources: per-step constants handed to the kernels, and the tile loop.
#include <algorithm>
#include <cstdint>

#include "ds/core/dtype.h"
#include "ds/core/error.h"
#include "ds/core/parallel.h"
#include "ds/optim/kernels.h"

namespace ds::optim::detail {

enum class Out16 : uint8_t { none, bf16, f16 };

inline Out16 out16_kind(const void* out16, DType dt) {
  if (out16 == nullptr) return Out16::none;
  DS_CHECK(dt == DType::bf16 || dt == DType::f16,
           "[optim] the 16-bit parameter copy must be bf16 or fp16, got {}", dtype_name(dt));
  return dt == DType::bf16 ? Out16::bf16 : Out16::f16;
}

inline void store16_scalar(uint16_t* out16, Out16 kind, float x) {
  *out16 = kind == Out16::bf16 ? float_to_bf16(x) : float_to_f16(x);
}

// Everything the Adam inner loop needs, computed once per step (in double, then rounded).
struct AdamConsts {
  float grad_scale, beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
  float inv_sqrt_bc2;   // 1 / sqrt(1 - beta2^t)
  float neg_step_size;  // -lr / (1 - beta1^t)
  float weight_decay;   // used when l2_decay
  float neg_lr_wd;      // -lr * wd, used when decoupled_decay
  bool l2_decay, decoupled_decay;
};

// The step's constants for adam_update's formulas (src/optim/cpu_adam_sgd.cpp).
AdamConsts adam_consts(int64_t step, const AdamConfig& c, float grad_scale);

struct SgdConsts {
  float grad_scale, weight_decay, momentum, one_minus_dampening, neg_lr;
  bool has_weight_decay, has_momentum, nesterov, first_momentum_step;
};

// Runs fn(begin, end) over [0, n) in whole tiles of kTileElems, each thread taking a contiguous
// run of tiles (static schedule). Tile boundaries do not depend on the thread count, so neither
// do per-tile results.
template <class Fn>
void for_each_tile_range(int64_t n, Fn&& fn) {
  if (n <= 0) return;
  const int64_t tiles = (n + kTileElems - 1) / kTileElems;
  parallel_for(tiles, 1,
               [&](int64_t t0, int64_t t1) { fn(t0 * kTileElems, std::min(n, t1 * kTileElems)); });
}

inline void check_buffers(const char* who, int64_t n, const void* p, const void* g) {
  DS_CHECK(n >= 0, "[optim] {}: negative element count {}", who, n);
  DS_CHECK(n == 0 || (p != nullptr && g != nullptr),
           "[optim] {}: null parameter or gradient buffer for {} elements", who, n);
}

}  // namespace ds::optim::detail

#pragma once
// Helpers shared by op implementations (internal).
#include "ds/backend/backend.h"
#include "ds/core/error.h"
#include "ds/core/tensor.h"

namespace ds::ops::detail {

inline backend::Backend& be(const Tensor& t) { return backend::get(t.device()); }

// fp32 contiguous version of a floating tensor (the layout most kernels take).
inline Tensor f32c(const Tensor& t) {
  return t.dtype() == DType::f32 ? t.contiguous() : t.to(DType::f32);
}

inline void check_float(const Tensor& t, const char* op) {
  DS_CHECK(t.defined(), "[{}] undefined input tensor", op);
  DS_CHECK(is_floating(t.dtype()), "[{}] needs a floating tensor, got {}", op, dtype_name(t.dtype()));
}

inline void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  DS_CHECK(a.device() == b.device(), "[{}] tensors on different devices: {} and {}", op,
           a.device().str(), b.device().str());
}

inline int64_t norm_dim(int64_t d, int64_t nd, const char* op) {
  const int64_t r = d < 0 ? d + nd : d;
  DS_CHECK(r >= 0 && r < nd, "[{}] dimension {} out of range for a {}-d tensor", op, d, nd);
  return r;
}

// Result in dtype dt (from an fp32 kernel output).
inline Tensor as_dtype(const Tensor& f32_result, DType dt) {
  return dt == DType::f32 ? f32_result : f32_result.to(dt);
}

}  // namespace ds::ops::detail

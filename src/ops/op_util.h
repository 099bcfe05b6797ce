#pragma once
// Helpers shared by op implementations (internal).
#include <cstdint>
#include <vector>

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

// The targets that count in a cross entropy over `classes` classes: those != ignore_index, each
// checked to be in [0, classes) (the error names the position). targets contiguous int32/int64.
inline int64_t count_targets(const Tensor& targets, int64_t classes, int64_t ignore_index) {
  const std::vector<int64_t> t = targets.to_int_vector();
  int64_t count = 0;
  for (size_t n = 0; n < t.size(); ++n) {
    const int64_t v = t[n];
    if (v == ignore_index) continue;
    DS_CHECK(v >= 0 && v < classes,
             "[cross_entropy] target {} (at position {}) is out of range for {} classes "
             "(ignore_index is {})",
             v, n, classes, ignore_index);
    ++count;
  }
  return count;
}

// Result in dtype dt (from an fp32 kernel output).
inline Tensor as_dtype(const Tensor& f32_result, DType dt) {
  return dt == DType::f32 ? f32_result : f32_result.to(dt);
}

}  // namespace ds::ops::detail

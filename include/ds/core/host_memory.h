#pragma once
// Copy and fill of tensors in host memory: core's own kernels for the CPU device, so that Tensor's
// factories, copies and conversions need nothing above core (the CPU backend's copy/fill are
// these). Parallel over the OpenMP pool; deterministic.
#include "ds/core/tensor.h"

namespace ds {

// dst = src elementwise: same numel; equal shapes with any strides on both sides, or a contiguous
// dst; converts dtype (16-bit rounding to nearest even).
void host_copy(const Tensor& src, const Tensor& dst);
// Every element of a contiguous dst = value, converted to its dtype.
void host_fill(const Tensor& dst, double value);

}  // namespace ds

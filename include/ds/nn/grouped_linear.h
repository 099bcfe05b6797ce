#pragma once
// The experts' GEMMs of a mixture-of-experts layer as one differentiable op (nn/moe.h).
//
//   y = grouped_linear(xs, w, counts)
//   xs (M, in): rows sorted by expert, counts[e] rows for expert e (sum = M)
//   w (E, out, in): the stacked expert weights (a parameter, used as it is)
//   y (M, out): row r of expert e's run is xs[r] @ w[e]^T
//
// One GEMM per expert that has rows (experts without rows do no work). Backward gives dxs (M, in)
// and dw (E, out, in) in one tensor each: no full-size (E, out, in) buffer per expert, as slicing
// w per expert would cost in its backward. FLOPs are reported by the GEMMs it runs (ops::linear,
// ops::matmul). Saves xs and w itself (not a view of it), so ZeRO-3's re-gathered w is what the
// backward reads.
//
// Threading: a plain function; the result and the gradients belong to the caller.
#include <cstdint>
#include <vector>

#include "ds/core/tensor.h"

namespace ds::nn {

Tensor grouped_linear(const Tensor& xs, const Tensor& w, const std::vector<int64_t>& counts);

}  // namespace ds::nn

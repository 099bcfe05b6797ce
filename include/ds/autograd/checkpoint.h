#pragma once
// Activation checkpointing: run fn(x) without keeping its activations; in backward, run it again
// with grad enabled (same dropout masks: the random stream is rewound) and backpropagate through
// the recomputed graph. Gradients are identical to running fn(x) directly; peak memory drops by the
// activations inside fn.
#include <functional>

#include "ds/core/tensor.h"

namespace ds::autograd {

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x);

}  // namespace ds::autograd

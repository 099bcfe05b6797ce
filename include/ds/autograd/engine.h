#pragma once
#include <functional>
#include <vector>

#include "ds/core/tensor.h"

namespace ds::autograd {

// Runs backward from roots (gradient of each root given, or 1 for a scalar root). Re-entrant: a
// node may run a nested backward (activation checkpointing does). Deterministic: ready nodes run in
// a fixed order (latest-created first) on the calling thread.
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots = {},
              bool retain_graph = false);

// Runs fn when the outermost backward currently executing finishes (after every node ran).
void queue_callback(std::function<void()> fn);

// Number of backward passes currently executing on this thread (0 outside backward).
int backward_depth();

}  // namespace ds::autograd

#pragma once
// Activation checkpointing: run fn(x) without keeping its activations; in backward, run it again
// with grad enabled (same dropout masks: the random stream is rewound) and backpropagate through
// the recomputed graph. Gradients are identical to running fn(x) directly; peak memory drops by the
// activations inside fn.
//
// What a segment keeps until backward is its input x. Where x waits is a CheckpointStash's
// choice (DeepSpeed's activation_checkpointing section; the runtime installs one for a run,
// runtime/activation_stash.h): as it is (no stash), this rank's part of it
// (partition_activations), a host copy (cpu_checkpointing). The
// stash's boundary hook runs after each segment's forward (synchronize_checkpoint_boundary).
//
// Threading: the stash is per process and set from the training thread; checkpoint() and the
// backward that recomputes run on that thread.
#include <functional>
#include <memory>

#include "ds/core/tensor.h"

namespace ds::autograd {

class CheckpointStash {
 public:
  virtual ~CheckpointStash() = default;
  // The form a segment's input x (detached) waits in until backward.
  virtual Tensor stash(const Tensor& x) = 0;
  // x again (its `shape`, on `device` in `dtype`) from what stash() returned.
  virtual Tensor unstash(const Tensor& stored, const Shape& shape, Device device, DType dtype) = 0;
  // After each segment's forward.
  virtual void at_boundary(Device device) { (void)device; }
  // Whether segments should be timed (the runtime's activation_checkpointing.profile); then
  // timed() receives each segment's forward ("forward") and recompute-and-backward ("backward")
  // wall time, in seconds.
  virtual bool timing() const { return false; }
  virtual void timed(const char* phase, double seconds) { (void)phase, (void)seconds; }
  // What stash() returned is no longer needed (after the recompute, or when the segment's graph is
  // dropped without a backward).
  virtual void release(const Tensor& stored) { (void)stored; }
};

// The stash checkpoint() uses from now on (nullptr: keep inputs as they are); returns the previous
// one. A segment keeps the stash it was run with until its backward.
std::shared_ptr<CheckpointStash> set_checkpoint_stash(std::shared_ptr<CheckpointStash> stash);
const std::shared_ptr<CheckpointStash>& checkpoint_stash();

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x);

}  // namespace ds::autograd

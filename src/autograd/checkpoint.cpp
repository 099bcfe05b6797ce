#include "ds/autograd/checkpoint.h"

#include <chrono>

#include "ds/autograd/engine.h"
#include "ds/autograd/grad_mode.h"
#include "ds/autograd/node.h"
#include "ds/core/error.h"
#include "ds/core/rng.h"

namespace ds::autograd {
namespace {

class CheckpointNode final : public Node {
 public:
  CheckpointNode(std::function<Tensor(const Tensor&)> fn, const Tensor& input,
                 rng::DropoutState rng)
      : fn_(std::move(fn)),
        stash_(checkpoint_stash()),
        input_(stash_ ? stash_->stash(input) : input),
        shape_(input.shape()),
        device_(input.device()),
        dtype_(input.dtype()),
        rng_(rng) {}
  const char* name() const override { return "CheckpointBackward"; }

  std::vector<Tensor> apply(const Tensor& grad_output) override {
    DS_CHECK(fn_, "[checkpoint] backward through a checkpointed segment a second time");
    const bool timing = stash_ && stash_->timing();
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<Tensor> out = recompute_and_backward(grad_output);
    if (timing)
      stash_->timed("backward", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                                    .count());
    return out;
  }

 private:
  std::vector<Tensor> recompute_and_backward(const Tensor& grad_output) {
    Tensor x = stash_ ? stash_->unstash(input_, shape_, device_, dtype_) : input_.detach();
    if (is_floating(x.dtype())) x.set_requires_grad(true);
    // Replay the random stream so dropout draws the same masks as the first forward.
    const rng::DropoutState now = rng::dropout_state();
    rng::dropout_state() = rng_;
    Tensor y;
    try {
      GradModeGuard grad_on(true);
      y = fn_(x);
    } catch (...) {
      rng::dropout_state() = now;
      throw;
    }
    rng::dropout_state() = now;
    if (y.requires_grad()) backward({y}, {grad_output});
    return {x.requires_grad() ? x.grad() : Tensor()};
  }

 public:
  ~CheckpointNode() override {
    if (stash_ && input_.defined()) stash_->release(input_);
  }
  void release_saved() override {
    fn_ = nullptr;
    if (stash_ && input_.defined()) stash_->release(input_);
    input_ = Tensor();
  }

 private:
  std::function<Tensor(const Tensor&)> fn_;
  std::shared_ptr<CheckpointStash> stash_;  // where input_ waits (null: as it is)
  Tensor input_;
  Shape shape_;
  Device device_;
  DType dtype_;
  rng::DropoutState rng_;
};

std::shared_ptr<CheckpointStash>& stash_slot() {
  static std::shared_ptr<CheckpointStash> stash;
  return stash;
}

}  // namespace

std::shared_ptr<CheckpointStash> set_checkpoint_stash(std::shared_ptr<CheckpointStash> stash) {
  std::swap(stash_slot(), stash);
  return stash;
}

const std::shared_ptr<CheckpointStash>& checkpoint_stash() {
  return stash_slot();
}

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x) {
  if (!is_grad_enabled()) return fn(x);
  const rng::DropoutState rng_before = rng::dropout_state();
  const std::shared_ptr<CheckpointStash>& stash = checkpoint_stash();
  const auto t0 = std::chrono::steady_clock::now();
  Tensor y;
  {
    NoGradGuard no_grad;
    y = fn(x);
  }
  // The output needs a gradient whenever the segment holds parameters, which cannot be seen
  // under no_grad; so it is always recorded, with an edge to x only if x needs one.
  auto node = std::make_shared<CheckpointNode>(fn, x.detach(), rng_before);
  if (stash) {
    stash->at_boundary(x.device());
    if (stash->timing())
      stash->timed("forward",
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  node->next_edges = {gradient_edge(x)};
  Tensor out = y.detach();
  out.impl()->grad_fn = std::move(node);
  out.impl()->requires_grad = true;
  return out;
}

}  // namespace ds::autograd

// The backward engine, gradient accumulation, hooks and activation checkpointing.
#include <gtest/gtest.h>

#include "ds/autograd/checkpoint.h"
#include "ds/autograd/engine.h"
#include "ds/autograd/grad_mode.h"
#include "ds/core/allocator.h"
#include "ds/core/error.h"
#include "ds/backend/backend.h"
#include "ds/config/config.h"
#include "ds/runtime/activation_stash.h"
#include "gradcheck.h"

using namespace ds;
using ds::testing::randn;

TEST(Autograd, ChainRuleAndAccumulation) {
  Tensor x = Tensor::from_data({1, 2, 3}, {3});
  x.set_requires_grad(true);
  Tensor y = ops::sum(ops::mul(x, x));  // dy/dx = 2x
  y.backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{2, 4, 6}));
  ops::sum(ops::mul(x, 3.0f)).backward();  // accumulates: + 3
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{5, 7, 9}));
}

TEST(Autograd, NoGradRecordsNothing) {
  Tensor x = randn({3}, 1);
  x.set_requires_grad(true);
  Tensor y;
  {
    autograd::NoGradGuard ng;
    y = ops::mul(x, 2.0f);
  }
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(y.grad_fn(), nullptr);
  EXPECT_THROW(ops::sum(y).backward(), Error);
}

TEST(Autograd, BackwardNeedsScalarOrGradient) {
  Tensor x = randn({3}, 2);
  x.set_requires_grad(true);
  Tensor y = ops::mul(x, 2.0f);
  EXPECT_THROW(y.backward(), Error);
  y.backward(Tensor::ones({3}));
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{2, 2, 2}));
}

TEST(Autograd, GradientIntoAFlatBufferStaysAView) {
  auto flat = Storage::allocate(8 * sizeof(float));
  Tensor flat_grad = Tensor::from_storage(flat, {8}, DType::f32);
  flat_grad.zero_();
  Tensor w = randn({2, 2}, 3);
  w.set_requires_grad(true);
  w.set_grad(Tensor::from_storage(Storage::view(flat, 4 * sizeof(float), 4 * sizeof(float)), {2, 2}, DType::f32));
  ops::sum(ops::mul(w, 5.0f)).backward();
  auto fv = flat_grad.to_vector();
  EXPECT_EQ(fv, (std::vector<float>{0, 0, 0, 0, 5, 5, 5, 5}));
}

TEST(Autograd, GradReadyHookFiresOnceWhenComplete) {
  // w is used by two branches; the hook must see the sum of both contributions, once.
  Tensor w = Tensor::from_data({1, 1}, {2});
  w.set_requires_grad(true);
  int fired = 0;
  std::vector<float> seen;
  w.add_grad_ready_hook([&](const Tensor& p) {
    ++fired;
    seen = p.grad().to_vector();
  });
  Tensor a = ops::mul(w, 2.0f), b = ops::mul(ops::exp(w), 1.0f);
  ops::sum(ops::add(a, b)).backward();
  EXPECT_EQ(fired, 1);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_NEAR(seen[0], 2.0f + std::exp(1.0f), 1e-5);
}

TEST(Autograd, GradientsBecomeReadyLastLayerFirst) {
  // A chain of three "layers": backward must finish layer 3's weight before layer 1's (the order
  // ZeRO's reduction buckets fill in).
  std::vector<Tensor> ws;
  std::vector<int> order;
  for (int i = 0; i < 3; ++i) {
    ws.push_back(randn({4, 4}, 10 + i, 0.3f));
    ws.back().set_requires_grad(true);
    ws.back().add_grad_ready_hook([&order, i](const Tensor&) { order.push_back(i); });
  }
  Tensor h = randn({2, 4}, 20);
  for (auto& w : ws) h = ops::tanh(ops::linear(h, w));
  ops::sum(h).backward();
  EXPECT_EQ(order, (std::vector<int>{2, 1, 0}));
}

TEST(Autograd, BackwardHookFiresOncePerBackward) {
  Tensor x = randn({3}, 30);
  x.set_requires_grad(true);
  int calls = 0;
  Tensor y = ops::backward_hook(ops::mul(x, 2.0f), [&] { ++calls; });
  ops::sum(ops::add(y, y)).backward();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{4, 4, 4}));
}

TEST(Autograd, QueueCallbackRunsAtTheEnd) {
  Tensor x = randn({3}, 31);
  x.set_requires_grad(true);
  bool done = false;
  Tensor y = ops::backward_hook(x, [&] { autograd::queue_callback([&] { done = x.grad().defined(); }); });
  ops::sum(y).backward();
  EXPECT_TRUE(done);
}

namespace {
// A block whose intermediate activations are large compared with its input and output.
Tensor wide_block(const Tensor& x, const Tensor& w1, const Tensor& w2) {
  Tensor h = ops::tanh(ops::linear(x, w1));  // (N, 4096)
  h = ops::mul(h, h);
  return ops::linear(h, w2);                  // (N, 64)
}
}  // namespace

TEST(Autograd, CheckpointGivesIdenticalGradientsAndLowerPeakMemory) {
  Tensor w1 = randn({4096, 64}, 40, 0.05f), w2 = randn({64, 4096}, 41, 0.05f);
  w1.set_requires_grad(true);
  w2.set_requires_grad(true);
  Tensor x0 = randn({256, 64}, 42);

  auto run = [&](bool ckpt, std::vector<float>* g1, std::vector<float>* g2, std::vector<float>* gx) {
    w1.set_grad({});
    w2.set_grad({});
    Tensor x = x0.detach().clone();
    x.set_requires_grad(true);
    cpu_allocator().reset_peak();
    const uint64_t base = cpu_allocator().stats().bytes_in_use;
    Tensor h = x;
    for (int i = 0; i < 4; ++i) {
      auto f = [&](const Tensor& in) { return wide_block(in, w1, w2); };
      h = ckpt ? autograd::checkpoint(f, h) : f(h);
    }
    Tensor loss = ops::sum(h);
    const uint64_t peak_fwd = cpu_allocator().stats().peak_bytes_in_use - base;
    loss.backward();
    *g1 = w1.grad().to_vector();
    *g2 = w2.grad().to_vector();
    *gx = x.grad().to_vector();
    return peak_fwd;
  };
  std::vector<float> a1, a2, ax, b1, b2, bx;
  const uint64_t plain = run(false, &a1, &a2, &ax);
  const uint64_t ckpt = run(true, &b1, &b2, &bx);
  EXPECT_EQ(a1, b1);  // bitwise: the recomputation runs the same kernels on the same data
  EXPECT_EQ(a2, b2);
  EXPECT_EQ(ax, bx);
  // Without checkpointing the forward keeps 4 blocks x 3 activations of 256 x 4096 floats (12 MiB);
  // with it, none. Demand at least a 4x drop.
  EXPECT_LT(ckpt * 4, plain) << "peak forward memory: plain " << plain << " B, checkpointed " << ckpt << " B";
}

TEST(Autograd, CpuCheckpointingKeepsCheckpointedInputsOffTheDevice) {
  // activation_checkpointing.cpu_checkpointing on the sim device (device memory the host cannot
  // read): each checkpointed segment's input waits in host memory and comes back for the
  // recompute. Gradients are bitwise those of keeping it on the device; the device then holds L - 1
  // fewer inputs after the forward (the first is the caller's own tensor): the formula
  // (L - 1) x B x C x 4 bytes, within the allocator's size-class rounding.
  const Device sim{DeviceType::sim, 0};
  Allocator& alloc = backend::get(sim).allocator();
  const Tensor w1 = randn({256, 256}, 50, 0.05f).to(sim), w2 = randn({256, 256}, 51, 0.05f).to(sim);
  w1.set_requires_grad(true);
  w2.set_requires_grad(true);
  const Tensor x0 = randn({512, 256}, 52).to(sim);
  constexpr int L = 4;
  const int64_t input_bytes = 512 * 256 * 4;
  struct Result {
    std::vector<float> g1, g2, gx;
    uint64_t kept = 0;  // device bytes held after the forward
  };
  auto run = [&](const config::ActivationCheckpointingConfig& section) {
    runtime::ActivationStashScope scope(section);
    w1.set_grad({});
    w2.set_grad({});
    Tensor x = x0.detach().clone();
    x.set_requires_grad(true);
    const uint64_t base = alloc.stats().bytes_in_use;
    Tensor h = x;
    for (int i = 0; i < L; ++i)
      h = autograd::checkpoint([&](const Tensor& in) { return wide_block(in, w1, w2); }, h);
    Tensor loss = ops::sum(h);
    Result r;
    r.kept = alloc.stats().bytes_in_use - base;
    loss.backward();
    r.g1 = w1.grad().to(kCPU).to_vector();
    r.g2 = w2.grad().to(kCPU).to_vector();
    r.gx = x.grad().to(kCPU).to_vector();
    if (section.cpu_checkpointing) {
      EXPECT_EQ(scope.stash()->stats().stashed, L);
      EXPECT_EQ(scope.stash()->stats().host_bytes, L * input_bytes);
    }
    if (section.synchronize_checkpoint_boundary) {
      EXPECT_EQ(scope.stash()->stats().synchronized, L);
    }
    return r;
  };
  const Result plain = run({});
  config::ActivationCheckpointingConfig host;
  host.cpu_checkpointing = true;
  host.synchronize_checkpoint_boundary = true;
  const Result stashed = run(host);
  EXPECT_EQ(plain.g1, stashed.g1);
  EXPECT_EQ(plain.g2, stashed.g2);
  EXPECT_EQ(plain.gx, stashed.gx);
  const int64_t saved = static_cast<int64_t>(plain.kept) - static_cast<int64_t>(stashed.kept);
  EXPECT_GE(saved, (L - 1) * input_bytes) << "plain " << plain.kept << " B, stashed " << stashed.kept;
  EXPECT_LE(saved, (L - 1) * input_bytes * 5 / 4) << "plain " << plain.kept << " B, stashed " << stashed.kept;
  // The scope put the previous (absent) stash back.
  EXPECT_EQ(autograd::checkpoint_stash(), nullptr);
}

TEST(Autograd, ContiguousCheckpointSlotsAreReusedAndBounded) {
  // contiguous_memory_optimization with number_checkpoints = L: the L inputs of a forward go into
  // the slots of one buffer (the same addresses every step), a slot is free again once its layer is
  // recomputed, and gradients are bitwise those without the buffer. L + 1 checkpoints alive at
  // once is an error naming number_checkpoints.
  const Tensor w1 = randn({64, 32}, 60, 0.1f), w2 = randn({32, 64}, 61, 0.1f);
  w1.set_requires_grad(true);
  w2.set_requires_grad(true);
  const Tensor x0 = randn({8, 32}, 62);
  constexpr int L = 3;
  config::ActivationCheckpointingConfig slots;
  slots.partition_activations = true;  // one rank: the whole input is this rank's part
  slots.contiguous_memory_optimization = true;
  slots.number_checkpoints = L;
  auto run = [&](const config::ActivationCheckpointingConfig& section, int layers) {
    runtime::ActivationStashScope scope(section);
    std::vector<float> grads;
    for (int step = 0; step < 2; ++step) {
      w1.set_grad({});
      w2.set_grad({});
      Tensor h = x0;
      for (int i = 0; i < layers; ++i)
        h = autograd::checkpoint([&](const Tensor& in) { return wide_block(in, w1, w2); }, h);
      ops::sum(h).backward();
      grads = w1.grad().to_vector();
    }
    if (scope.stash()) EXPECT_EQ(scope.stash()->stats().most_in_slots, layers);
    return grads;
  };
  EXPECT_EQ(run({}, L), run(slots, L));
  try {
    run(slots, L + 1);
    ADD_FAILURE() << "L + 1 checkpoints in L slots did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("number_checkpoints = 3"), std::string::npos) << e.what();
  }
}

TEST(Autograd, CheckpointProfileTimesEachSegment) {
  // activation_checkpointing.profile: each checkpointed segment's forward and its recompute with
  // backward are logged as DeepSpeed's timers print them ("time (ms) | forward: ..."), L of each.
  const Tensor w1 = randn({64, 32}, 70, 0.1f), w2 = randn({32, 64}, 71, 0.1f);
  w1.set_requires_grad(true);
  w2.set_requires_grad(true);
  config::ActivationCheckpointingConfig section;
  section.profile = true;
  std::vector<std::string> lines;
  runtime::ActivationStashScope scope(section, nullptr,
                                      [&](const std::string& l) { lines.push_back(l); });
  ASSERT_NE(scope.stash(), nullptr);
  Tensor h = randn({8, 32}, 72);
  for (int i = 0; i < 3; ++i)
    h = autograd::checkpoint([&](const Tensor& in) { return wide_block(in, w1, w2); }, h);
  ops::sum(h).backward();
  int forward = 0, backward = 0;
  for (const std::string& l : lines) {
    forward += l.rfind("time (ms) | forward: ", 0) == 0;
    backward += l.rfind("time (ms) | backward: ", 0) == 0;
  }
  EXPECT_EQ(forward, 3);
  EXPECT_EQ(backward, 3);
  EXPECT_EQ(scope.stash()->stats().timed, 6);
  // Without a log the section's profile asks nothing of the stash.
  EXPECT_EQ(runtime::ActivationStashScope(section).stash(), nullptr);
}

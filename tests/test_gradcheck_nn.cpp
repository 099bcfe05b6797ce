// Finite-difference gradient checks of the neural-network ops (src/ops/nn.cpp): every op, every
// differentiable input, on every backend (tests/devices.h).
#include "gradcheck.h"

#include "ds/nn/grouped_linear.h"

using namespace ds;
using ds::testing::gradcheck;
using ds::testing::GradcheckOptions;
using ds::testing::host_vector;
using V = std::vector<Tensor>;

class GradcheckNN : public ds::testing::GradcheckTest {
 protected:
  // Weights near 1 so that normalised outputs are not dominated by a near-zero scale.
  static Tensor leaf_near_one(const Shape& s, uint64_t seed) {
    return uniform_leaf(s, seed, 0.5f, 1.5f);
  }
};

TEST_P(GradcheckNN, LayerNorm) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "layer_norm_forward", "layer_norm_backward");
  gradcheck([](const V& x) { return ops::layer_norm(x[0], x[1], x[2]); },
            {leaf({2, 3, 8}, 1), leaf_near_one({8}, 2), leaf({8}, 3)});
  // No bias.
  gradcheck([](const V& x) { return ops::layer_norm(x[0], x[1], Tensor()); },
            {leaf({5, 7}, 4), leaf_near_one({7}, 5)});
}

TEST_P(GradcheckNN, RmsNorm) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "rms_norm_forward", "rms_norm_backward");
  gradcheck([](const V& x) { return ops::rms_norm(x[0], x[1]); },
            {leaf({3, 4, 6}, 6), leaf_near_one({6}, 7)});
}

TEST_P(GradcheckNN, Activations) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "unary", "binary");
  gradcheck([](const V& x) { return ops::gelu(x[0]); }, {leaf({4, 9}, 8, 2.0f)});
  gradcheck([](const V& x) { return ops::silu(x[0]); }, {leaf({4, 9}, 9, 2.0f)});
  gradcheck([](const V& x) { return ops::swiglu(x[0], x[1]); },
            {leaf({3, 8}, 10, 2.0f), leaf({3, 8}, 11)});
}

TEST_P(GradcheckNN, ExactGelu) {
  // Values against erfc in double (relative: x Phi(x) is tiny for large negative x, where
  // 1 + erf cancels), then the gradient.
  std::vector<float> xs;
  for (float v = -9.0f; v <= 6.0f; v += 0.37f) xs.push_back(v);
  const Tensor host = Tensor::from_data(xs, {static_cast<int64_t>(xs.size())});
  Tensor x = Tensor::empty(host.shape(), DType::f32, device());
  x.copy_from(host);
  const std::vector<float> y = ops::gelu_erf(x).to_vector();
  for (size_t i = 0; i < xs.size(); ++i) {
    const double want = 0.5 * xs[i] * std::erfc(-xs[i] / std::sqrt(2.0));
    // For negative x the float rounding of x / sqrt 2 alone moves erfc by up to x^2 6e-8 relative.
    const double rel = 1e-6 * (1.0 + static_cast<double>(xs[i]) * xs[i] / 4.0);
    EXPECT_NEAR(y[i], want, rel * std::abs(want) + 1e-30) << xs[i];
  }
  gradcheck([](const V& x) { return ops::gelu_erf(x[0]); }, {leaf({4, 9}, 14, 2.0f)});
}

TEST_P(GradcheckNN, BinaryCrossEntropyWithLogits) {
  // Against the formula in double, then the gradient (targets soft and hard, logits both signs).
  const Tensor x = from_data({-30.0f, -1.5f, 0.0f, 0.7f, 4.0f, 40.0f}, {2, 3});
  const Tensor y = from_data({0.0f, 1.0f, 0.5f, 0.25f, 1.0f, 0.0f}, {2, 3});
  double want = 0.0;
  const std::vector<float> xs = x.to_vector(), ys = y.to_vector();
  for (size_t i = 0; i < xs.size(); ++i)
    want += std::max<double>(xs[i], 0.0) - double(xs[i]) * ys[i] +
            std::log1p(std::exp(-std::abs(double(xs[i]))));
  EXPECT_NEAR(ops::bce_with_logits(x, y).item(), want / 6.0, 1e-6);
  gradcheck(
      [](const V& v) {
        const Tensor t = from_data({0.0f, 1.0f, 0.3f, 1.0f, 0.0f, 0.5f, 0.9f, 0.1f}, {2, 4});
        return ops::bce_with_logits(v[0], t);
      },
      {leaf({2, 4}, 15, 2.0f)});
}

TEST_P(GradcheckNN, Softmax) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "softmax_forward", "softmax_backward");
  gradcheck([](const V& x) { return ops::softmax(x[0]); }, {leaf({3, 7}, 12, 2.0f)});
  gradcheck([](const V& x) { return ops::softmax(x[0]); }, {leaf({2, 2, 5}, 13)});
}

TEST_P(GradcheckNN, CausalAttentionTwoHeads) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "attention_forward", "attention_backward");
  // B=2, NH=2, T=6, hd=4: every q, k and v element checked.
  GradcheckOptions opt;
  opt.max_elements = 96;
  gradcheck([](const V& x) { return ops::causal_attention(x[0], x[1], x[2]); },
            {leaf({2, 2, 6, 4}, 14), leaf({2, 2, 6, 4}, 15), leaf({2, 2, 6, 4}, 16)}, opt);
}

TEST_P(GradcheckNN, CausalAttentionSeveralRowBlocks) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "attention_forward", "attention_backward");
  // T=70 crosses the kernel's 64-row block boundary (a full block and a partial one), so the
  // accumulation of dK and dV across query blocks is exercised.
  gradcheck([](const V& x) { return ops::causal_attention(x[0], x[1], x[2]); },
            {leaf({1, 2, 70, 3}, 17), leaf({1, 2, 70, 3}, 18), leaf({1, 2, 70, 3}, 19)});
}

TEST_P(GradcheckNN, AttentionPaddedCrossAndBidirectional) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "attention_forward", "attention_backward");
  // Cross-attention shapes (Tq 3, Tk 5), right padding (row 1 sees 2 keys: the padded keys' K and
  // V get zero gradient), and causal queries that are the last 3 of 5 positions.
  for (bool causal : {false, true}) {
    ops::AttentionMask mask;
    mask.causal = causal;
    mask.key_lengths = {5, 2};
    gradcheck([mask](const V& x) { return ops::attention(x[0], x[1], x[2], mask); },
              {leaf({2, 2, 3, 4}, 27), leaf({2, 2, 5, 4}, 28), leaf({2, 2, 5, 4}, 29)});
  }
  // Bidirectional over a 64-row block boundary, with T5's scale of 1.
  ops::AttentionMask all;
  all.causal = false;
  gradcheck([all](const V& x) { return ops::attention(x[0], x[1], x[2], all, 1.0f); },
            {leaf({1, 1, 66, 2}, 30), leaf({1, 1, 66, 2}, 31), leaf({1, 1, 66, 2}, 32)});
}

TEST_P(GradcheckNN, SlidingWindowAndSoftCappedAttention) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "attention_forward", "attention_backward");
  // Gemma's local layers: window 3 over T 7 (every element checked), and window 5 over T 70,
  // where the second 64-row block's keys start past 0.
  ops::AttentionMask w3;
  w3.window = 3;
  GradcheckOptions opt;
  opt.max_elements = 112;
  gradcheck([w3](const V& x) { return ops::attention(x[0], x[1], x[2], w3, 0.4f); },
            {leaf({2, 2, 7, 4}, 33), leaf({2, 2, 7, 4}, 34), leaf({2, 2, 7, 4}, 35)}, opt);
  ops::AttentionMask w5;
  w5.window = 5;
  gradcheck([w5](const V& x) { return ops::attention(x[0], x[1], x[2], w5); },
            {leaf({1, 1, 70, 3}, 36), leaf({1, 1, 70, 3}, 37), leaf({1, 1, 70, 3}, 38)});
  // Gemma 2's soft-capped scores, with and without a window.
  for (int64_t window : {0, 3}) {
    ops::AttentionMask capped;
    capped.window = window;
    capped.softcap = 0.8f;
    gradcheck([capped](const V& x) { return ops::attention(x[0], x[1], x[2], capped); },
              {leaf({1, 2, 6, 4}, 39, 2.0f), leaf({1, 2, 6, 4}, 40, 2.0f), leaf({1, 2, 6, 4}, 41)});
  }
}

TEST_P(GradcheckNN, CausalAttentionSingleInputNeedsGrad) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "attention_forward", "attention_backward");
  Tensor q = randn({1, 2, 5, 4}, 20), k = leaf({1, 2, 5, 4}, 21), v = randn({1, 2, 5, 4}, 22);
  gradcheck([](const V& x) { return ops::causal_attention(x[0], x[1], x[2]); }, {q, k, v});
}

TEST_P(GradcheckNN, Rope) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "rope");
  gradcheck([](const V& x) { return ops::rope(x[0]); }, {leaf({1, 2, 5, 8}, 23)});
  gradcheck([](const V& x) { return ops::rope(x[0], 500.0f, 7); }, {leaf({2, 1, 3, 6}, 24)});
  // Given frequencies with a cos/sin scale (yarn's attention factor): the map is no longer a
  // rotation, so the backward's scaling is checked too.
  gradcheck(
      [](const V& x) {
        return ops::rope(x[0], {1.0, 0.3, 0.01}, 1.3f, 2);
      },
      {leaf({2, 1, 3, 6}, 25)});
  // GLM's partial interleaved rotary: 4 of 8 dims rotate in pairs (2i, 2i+1), the rest pass.
  gradcheck(
      [](const V& x) {
        return ops::rope(x[0], {0.9, 0.2}, 1.1f, 3, /*interleaved=*/true);
      },
      {leaf({2, 2, 3, 8}, 26)});
}

TEST_P(GradcheckNN, DropoutReusesTheMaskInBackward) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "dropout");
  // Every evaluation starts from the same dropout state, so the forward mask is fixed; the
  // analytic gradient is right only if backward recomputes exactly that mask.
  const rng::DropoutState saved = rng::dropout_state();
  const rng::DropoutState fixed{1234, 17, 0};
  gradcheck(
      [&](const V& x) {
        rng::dropout_state() = fixed;
        return ops::dropout(x[0], 0.3f, true);
      },
      {leaf({4, 16}, 25)});
  // And directly: d(out)/d(x) is mask / (1 - p), zero exactly where the output was dropped.
  rng::dropout_state() = fixed;
  Tensor x = uniform({8, 32}, 26, 1.0f, 2.0f);  // nonzero everywhere
  x.set_requires_grad(true);
  Tensor y = ops::dropout(x, 0.3f, true);
  ops::sum(y).backward();
  const auto yv = host_vector(y), gv = host_vector(x.grad());
  int dropped = 0;
  for (size_t i = 0; i < yv.size(); ++i) {
    if (yv[i] == 0.0f) {
      ++dropped;
      EXPECT_EQ(gv[i], 0.0f) << i;
    } else {
      EXPECT_FLOAT_EQ(gv[i], 1.0f / 0.7f) << i;
    }
  }
  EXPECT_GT(dropped, 0);
  rng::dropout_state() = saved;
}

TEST_P(GradcheckNN, CrossEntropyWithIgnoredTargets) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "cross_entropy_forward", "cross_entropy_backward");
  for (DType idt : {DType::i64, DType::i32}) {
    Tensor targets = from_ints({2, -100, 0, 5, -100, 1}, {6}, idt);
    gradcheck([&](const V& x) { return ops::cross_entropy(x[0], targets); },
              {leaf({6, 6}, 27, 2.0f)});
  }
  // A custom ignore_index and (B, T, V) logits.
  Tensor t2 = from_ints({3, 0, 7, 7, 1, 2}, {2, 3});
  gradcheck([&](const V& x) { return ops::cross_entropy(x[0], t2, 7); }, {leaf({2, 3, 5}, 28)});
}

// The fused head + loss, one block, blocks of 3 rows and blocks of 1 row; the gradcheck's random
// output weight is the upstream gradient the kept dx and dw are scaled by.
TEST_P(GradcheckNN, LinearCrossEntropyInBlocks) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "gemm", "cross_entropy_forward",
                           "cross_entropy_backward");
  Tensor targets = from_ints({2, -100, 0, 5, -100, 1, 4}, {7});
  for (int64_t block : {0, 3, 1})
    gradcheck(
        [&](const V& x) { return ops::linear_cross_entropy(x[0], x[1], targets, -100, block); },
        {leaf({7, 4}, 30), leaf({6, 4}, 31)});
}

TEST_P(GradcheckNN, EmbeddingWithRepeatedIds) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "embedding_forward", "embedding_backward");
  for (DType idt : {DType::i64, DType::i32}) {
    Tensor ids = from_ints({1, 3, 1, 0, 1, 4}, {2, 3}, idt);
    gradcheck([&](const V& x) { return ops::embedding(x[0], ids); }, {leaf({5, 3}, 29)});
  }
}

TEST_P(GradcheckNN, ComposedBlock) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "layer_norm_forward", "layer_norm_backward",
                           "copy", "attention_forward", "attention_backward", "rope", "unary",
                           "binary");
  // A miniature pre-norm attention block wiring several of the ops together.
  // Layer norm over C = 4 followed by two more nonlinear ops is strongly curved: at the default
  // h = 1e-2 the central difference itself is off by ~6% at some elements, so use a smaller step.
  GradcheckOptions opt;
  opt.h = 3e-3f;
  gradcheck(
      [](const V& x) {
        Tensor h = ops::layer_norm(x[0], x[1], x[2]);  // (B, T, C) = (1, 5, 4)
        Tensor q = ops::reshape(h, {1, 5, 2, 2});      // (B, T, NH, hd)
        q = ops::contiguous(ops::transpose(q, 1, 2));  // (B, NH, T, hd)
        Tensor a = ops::causal_attention(ops::rope(q), q, q);
        return ops::gelu(a);
      },
      {leaf({1, 5, 4}, 30), leaf_near_one({4}, 31), leaf({4}, 32)}, opt);
}

// The MoE experts' GEMMs (nn/grouped_linear.h): rows sorted by expert, an expert without rows in
// the middle (its weight's gradient is zero) and one at the end.
TEST_P(GradcheckNN, GroupedLinearOverExperts) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "gemm", "copy");
  const std::vector<int64_t> counts = {2, 0, 3, 0};
  gradcheck([&](const V& x) { return nn::grouped_linear(x[0], x[1], counts); },
            {leaf({5, 4}, 44), leaf({4, 3, 4}, 45)});
}

INSTANTIATE_TEST_SUITE_P(AllDevices, GradcheckNN, ::testing::ValuesIn(ds::testing::test_devices()),
                         ds::testing::device_param_name);

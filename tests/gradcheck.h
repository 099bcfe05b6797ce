#pragma once
// Finite-difference gradient checking for tests.
//
// For an op f and inputs x_i, we form the scalar L = sum(f(x) * R) with a fixed random R (so every
// output element contributes with a different weight), compute dL/dx_i by autograd, and compare
// with central differences (L(x + h e_j) - L(x - h e_j)) / 2h evaluated in fp32 with the loss
// accumulated in double. fp32 central differences with h = 1e-2 carry an error of order
// h^2 * f''' + eps_f32 * |L| / h, so the tolerances below are absolute 2e-3 + relative 2e-2: loose
// enough for fp32 rounding, tight enough that a wrong sign, a missing term or a factor of 2 fails.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "ds/autograd/grad_mode.h"
#include "ds/core/rng.h"
#include "ds/core/tensor.h"
#include "ds/ops/ops.h"

namespace ds::testing {

inline Tensor randn(const Shape& shape, uint64_t seed, float scale = 1.0f, DType dt = DType::f32) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * rng::normal(seed, 77, i);
  return Tensor::from_data(v, shape, dt);
}

inline Tensor uniform(const Shape& shape, uint64_t seed, float lo, float hi) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = lo + (hi - lo) * rng::uniform01(rng::hash3(seed, 5, i));
  return Tensor::from_data(v, shape);
}

// A leaf that requires grad: N(0, scale^2) values, or uniform in [lo, hi).
inline Tensor leaf(const Shape& shape, uint64_t seed, float scale = 1.0f) {
  Tensor t = randn(shape, seed, scale);
  t.set_requires_grad(true);
  return t;
}
inline Tensor uniform_leaf(const Shape& shape, uint64_t seed, float lo, float hi) {
  Tensor t = uniform(shape, seed, lo, hi);
  t.set_requires_grad(true);
  return t;
}

struct GradcheckOptions {
  float h = 1e-2f;
  double atol = 2e-3;
  double rtol = 2e-2;
  int max_elements = 64;  // per input, checked at evenly spread positions
};

// f maps the inputs to one output tensor. Inputs must be fp32 leaves; those that should be checked
// must have requires_grad set.
inline void gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                      std::vector<Tensor> inputs, const GradcheckOptions& opt = {}) {
  Tensor probe;
  {
    autograd::NoGradGuard ng;
    probe = f(inputs);
  }
  const Tensor weights = randn(probe.shape(), 4242);
  const std::vector<float> w = weights.to_vector();
  auto loss_value = [&]() {
    autograd::NoGradGuard ng;
    const std::vector<float> y = f(inputs).to_vector();
    double acc = 0.0;
    for (size_t i = 0; i < y.size(); ++i) acc += static_cast<double>(y[i]) * w[i];
    return acc;
  };
  for (auto& x : inputs)
    if (x.requires_grad()) x.set_grad({});
  Tensor loss = ops::sum(ops::mul(f(inputs), weights));
  loss.backward();

  for (size_t i = 0; i < inputs.size(); ++i) {
    Tensor& x = inputs[i];
    if (!x.requires_grad()) continue;
    ASSERT_TRUE(x.grad().defined()) << "input " << i << " got no gradient";
    const std::vector<float> analytic = x.grad().to_vector();
    float* data = x.data<float>();
    const int64_t n = x.numel();
    const int64_t step = std::max<int64_t>(1, n / opt.max_elements);
    for (int64_t j = 0; j < n; j += step) {
      const float orig = data[j];
      data[j] = orig + opt.h;
      const double lp = loss_value();
      data[j] = orig - opt.h;
      const double lm = loss_value();
      data[j] = orig;
      const double numeric = (lp - lm) / (2.0 * opt.h);
      const double a = analytic[static_cast<size_t>(j)];
      EXPECT_NEAR(a, numeric, opt.atol + opt.rtol * std::abs(numeric))
          << "input " << i << " element " << j << " of shape " << shape_str(x.shape());
    }
  }
}

}  // namespace ds::testing

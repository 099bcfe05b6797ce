#pragma once
// Finite-difference gradient checking for tests.
//
// For an op f and inputs x_i, we form the scalar L = sum(f(x) * R) with a fixed random R (so every
// output element contributes with a different weight), compute dL/dx_i by autograd, and compare
// with central differences (L(x + h e_j) - L(x - h e_j)) / 2h evaluated in fp32 with the loss
// accumulated in double. fp32 central differences with h = 1e-2 carry an error of order
// h^2 * f''' + eps_f32 * |L| / h, so the tolerances below are absolute 2e-3 + relative 2e-2: loose
// enough for fp32 rounding, tight enough that a wrong sign, a missing term or a factor of 2 fails.
//
// Test inputs are made on the host (the same values on every device) and then moved to the device
// asked for; see devices.h for the device list and the supports() skip.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "devices.h"
#include "ds/autograd/grad_mode.h"
#include "ds/core/rng.h"
#include "ds/core/tensor.h"
#include "ds/ops/ops.h"

namespace ds::testing {

inline Tensor randn(const Shape& shape, uint64_t seed, float scale = 1.0f, DType dt = DType::f32,
                    Device device = kCPU) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * rng::normal(seed, 77, i);
  return to_device(Tensor::from_data(v, shape, dt), device);
}

inline Tensor uniform(const Shape& shape, uint64_t seed, float lo, float hi, Device device = kCPU) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = lo + (hi - lo) * rng::uniform01(rng::hash3(seed, 5, i));
  return to_device(Tensor::from_data(v, shape), device);
}

// A leaf that requires grad: N(0, scale^2) values, or uniform in [lo, hi).
inline Tensor leaf(const Shape& shape, uint64_t seed, float scale = 1.0f, Device device = kCPU) {
  Tensor t = randn(shape, seed, scale, DType::f32, device);
  t.set_requires_grad(true);
  return t;
}
inline Tensor uniform_leaf(const Shape& shape, uint64_t seed, float lo, float hi,
                           Device device = kCPU) {
  Tensor t = uniform(shape, seed, lo, hi, device);
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
  const Tensor weights = randn(probe.shape(), 4242, 1.0f, DType::f32, probe.device());
  const std::vector<float> w = host_vector(weights);
  auto loss_value = [&]() {
    autograd::NoGradGuard ng;
    const std::vector<float> y = host_vector(f(inputs));
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
    const std::vector<float> analytic = host_vector(x.grad());
    // Perturbing one element: in place on the CPU; elsewhere on a host copy that is written back
    // whole (slow, but a device backend needs nothing beyond copy).
    const bool on_host = x.device().is_cpu();
    std::vector<float> mirror = on_host ? std::vector<float>() : host_vector(x);
    float* data = on_host ? x.data<float>() : mirror.data();
    auto write_back = [&] {
      if (!on_host) backend::get(x.device()).copy(Tensor::from_data(mirror, x.shape()), x);
    };
    const int64_t n = x.numel();
    const int64_t step = std::max<int64_t>(1, n / opt.max_elements);
    for (int64_t j = 0; j < n; j += step) {
      const float orig = data[j];
      data[j] = orig + opt.h;
      write_back();
      const double lp = loss_value();
      data[j] = orig - opt.h;
      write_back();
      const double lm = loss_value();
      data[j] = orig;
      write_back();
      const double numeric = (lp - lm) / (2.0 * opt.h);
      const double a = analytic[static_cast<size_t>(j)];
      EXPECT_NEAR(a, numeric, opt.atol + opt.rtol * std::abs(numeric))
          << "input " << i << " element " << j << " of shape " << shape_str(x.shape());
    }
  }
}

// Base of the device-parameterised op tests (TEST_P, parameter: the device). The factories make
// their tensors on the parameter device; they are static (GetParam() is), so captureless lambdas
// inside a test body can call them too.
class DeviceTest : public ::testing::TestWithParam<Device> {
 protected:
  static Device device() { return GetParam(); }
  static Tensor randn(const Shape& shape, uint64_t seed, float scale = 1.0f,
                      DType dt = DType::f32) {
    return ds::testing::randn(shape, seed, scale, dt, device());
  }
  static Tensor uniform(const Shape& shape, uint64_t seed, float lo, float hi) {
    return ds::testing::uniform(shape, seed, lo, hi, device());
  }
  static Tensor leaf(const Shape& shape, uint64_t seed, float scale = 1.0f) {
    return ds::testing::leaf(shape, seed, scale, device());
  }
  static Tensor uniform_leaf(const Shape& shape, uint64_t seed, float lo, float hi) {
    return ds::testing::uniform_leaf(shape, seed, lo, hi, device());
  }
  static Tensor from_data(const std::vector<float>& values, const Shape& shape,
                          DType dt = DType::f32) {
    return to_device(Tensor::from_data(values, shape, dt), device());
  }
  static Tensor from_ints(const std::vector<int64_t>& values, const Shape& shape,
                          DType dt = DType::i64) {
    return to_device(Tensor::from_ints(values, shape, dt), device());
  }
};

// Finite-difference tests: also skipped where the backend cannot run the harness itself
// (L = sum(f(x) * R), its backward and the gradient accumulation).
class GradcheckTest : public DeviceTest {
 protected:
  void SetUp() override {
    DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "binary", "reduce", "fill", "axpy", "copy");
  }
};

}  // namespace ds::testing

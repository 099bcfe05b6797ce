// Finite-difference gradient checks of elementwise, reduction, shape and linear-algebra ops, and a
// few forward values, on every backend (tests/devices.h).
#include "gradcheck.h"

using namespace ds;
using ds::testing::gradcheck;
using ds::testing::host_vector;
using V = std::vector<Tensor>;

class Gradcheck : public ds::testing::GradcheckTest {
 protected:
  static Tensor positive(const Shape& s, uint64_t seed) {
    return uniform_leaf(s, seed, 0.5f, 2.0f);
  }
};

class Ops : public ds::testing::DeviceTest {};

TEST_P(Gradcheck, AddSubMulDivWithBroadcast) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "binary", "reduce");  // reduce: broadcast grads
  gradcheck([](const V& x) { return ops::add(x[0], x[1]); }, {leaf({3, 4}, 1), leaf({4}, 2)});
  gradcheck([](const V& x) { return ops::sub(x[0], x[1]); }, {leaf({2, 1, 4}, 3), leaf({3, 1}, 4)});
  gradcheck([](const V& x) { return ops::mul(x[0], x[1]); }, {leaf({3, 4}, 5), leaf({3, 1}, 6)});
  gradcheck([](const V& x) { return ops::div(x[0], x[1]); }, {leaf({3, 4}, 7), positive({4}, 8)});
}

TEST_P(Gradcheck, Unary) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "unary", "binary");
  gradcheck([](const V& x) { return ops::mul(ops::add(x[0], 0.5f), 3.0f); }, {leaf({5}, 9)});
  gradcheck([](const V& x) { return ops::neg(x[0]); }, {leaf({5}, 10)});
  gradcheck([](const V& x) { return ops::exp(x[0]); }, {leaf({6}, 11, 0.5f)});
  gradcheck([](const V& x) { return ops::log(x[0]); }, {positive({6}, 12)});
  gradcheck([](const V& x) { return ops::sqrt(x[0]); }, {positive({6}, 13)});
  gradcheck([](const V& x) { return ops::tanh(x[0]); }, {leaf({6}, 14)});
  gradcheck([](const V& x) { return ops::square(x[0]); }, {leaf({6}, 15)});
  gradcheck([](const V& x) { return ops::pow(x[0], 1.5f); }, {positive({6}, 16)});
}

TEST_P(Gradcheck, Reductions) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "reduce", "unary");  // unary: mean's scaling
  gradcheck([](const V& x) { return ops::sum(x[0]); }, {leaf({3, 4}, 17)});
  gradcheck([](const V& x) { return ops::sum(x[0], {1}); }, {leaf({2, 3, 4}, 18)});
  gradcheck([](const V& x) { return ops::sum(x[0], {0, 2}, true); }, {leaf({2, 3, 4}, 19)});
  gradcheck([](const V& x) { return ops::mean(x[0], {-1}); }, {leaf({3, 5}, 20)});
  gradcheck([](const V& x) { return ops::mean(x[0]); }, {leaf({3, 5}, 21)});
}

// Apart from Reductions because max's backward is not a kernel: the op computes it on host copies
// (src/ops/reduce.cpp) on every device.
TEST_P(Gradcheck, ReductionMax) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "reduce");
  gradcheck([](const V& x) { return ops::max(x[0], 1); }, {leaf({3, 5}, 22)});
}

TEST_P(Gradcheck, ShapeOps) {
  // copy: slice, concat, contiguous; reduce: broadcast_to's gradient.
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "copy", "reduce", "unary");
  gradcheck([](const V& x) { return ops::reshape(x[0], {4, -1}); }, {leaf({2, 6}, 23)});
  gradcheck([](const V& x) { return ops::mul(ops::transpose(x[0], 0, 2), 2.0f); },
            {leaf({2, 3, 4}, 24)});
  gradcheck([](const V& x) { return ops::permute(x[0], {2, 0, 1}); }, {leaf({2, 3, 4}, 25)});
  gradcheck([](const V& x) { return ops::slice(x[0], 1, 1, 3); }, {leaf({2, 4, 3}, 26)});
  gradcheck(
      [](const V& x) {
        return ops::concat({x[0], x[1]}, 1);
      },
      {leaf({2, 3}, 27), leaf({2, 2}, 28)});
  gradcheck([](const V& x) { return ops::contiguous(ops::transpose(x[0], 0, 1)); },
            {leaf({3, 4}, 29)});
  gradcheck([](const V& x) { return ops::broadcast_to(x[0], {3, 2, 4}); }, {leaf({2, 1}, 30)});
}

TEST_P(Gradcheck, MatmulAndLinear) {
  // reduce: gradients of broadcast batch dims and of the bias; copy: the bias broadcast.
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "gemm", "reduce", "copy");
  gradcheck([](const V& x) { return ops::matmul(x[0], x[1]); },
            {leaf({3, 4}, 31), leaf({4, 5}, 32)});
  gradcheck([](const V& x) { return ops::matmul(x[0], x[1]); },
            {leaf({2, 3, 4}, 33), leaf({4, 5}, 34)});
  gradcheck([](const V& x) { return ops::matmul(x[0], x[1]); },
            {leaf({2, 3, 4}, 35), leaf({2, 4, 5}, 36)});
  gradcheck([](const V& x) { return ops::matmul(x[0], x[1]); },
            {leaf({2, 1, 3, 4}, 37), leaf({3, 4, 2}, 38)});
  gradcheck([](const V& x) { return ops::matmul(x[0], ops::transpose(x[1], -1, -2)); },
            {leaf({2, 3, 4}, 39), leaf({2, 5, 4}, 40)});
  gradcheck([](const V& x) { return ops::linear(x[0], x[1], x[2]); },
            {leaf({2, 3, 4}, 41), leaf({5, 4}, 42), leaf({5}, 43)});
  gradcheck([](const V& x) { return ops::linear(x[0], x[1]); },
            {leaf({3, 4}, 44), leaf({2, 4}, 45)});
}

TEST_P(Ops, MatmulMatchesNaive) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "gemm");
  Tensor a = randn({3, 7, 5}, 50), b = randn({3, 5, 6}, 51);
  Tensor c = ops::matmul(a, b);
  auto av = host_vector(a), bv = host_vector(b), cv = host_vector(c);
  for (int bi = 0; bi < 3; ++bi)
    for (int i = 0; i < 7; ++i)
      for (int j = 0; j < 6; ++j) {
        double acc = 0;
        for (int k = 0; k < 5; ++k) acc += av[bi * 35 + i * 5 + k] * bv[bi * 30 + k * 6 + j];
        ASSERT_NEAR(cv[bi * 42 + i * 6 + j], acc, 1e-4);
      }
}

TEST_P(Ops, SixteenBitInputsWork) {
  // linear runs the GEMM in the 16-bit dtype; add upcasts with copy and runs the fp32 kernel.
  for (DType dt : {DType::bf16, DType::f16}) DS_SKIP_UNLESS_SUPPORTED(device(), dt, "gemm", "copy");
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "gemm", "binary");
  for (DType dt : {DType::bf16, DType::f16}) {
    Tensor a = randn({4, 8}, 60, 1.0f, dt), w = randn({3, 8}, 61, 1.0f, dt);
    Tensor y = ops::linear(a, w);
    EXPECT_EQ(y.dtype(), dt);
    Tensor ref = ops::linear(a.to(DType::f32), w.to(DType::f32));
    auto yv = host_vector(y), rv = host_vector(ref);
    for (size_t i = 0; i < yv.size(); ++i) EXPECT_NEAR(yv[i], rv[i], 0.02 * (1 + std::abs(rv[i])));
    Tensor s = ops::add(a, a);
    EXPECT_EQ(s.dtype(), dt);
  }
}

INSTANTIATE_TEST_SUITE_P(AllDevices, Gradcheck, ::testing::ValuesIn(ds::testing::test_devices()),
                         ds::testing::device_param_name);
INSTANTIATE_TEST_SUITE_P(AllDevices, Ops, ::testing::ValuesIn(ds::testing::test_devices()),
                         ds::testing::device_param_name);

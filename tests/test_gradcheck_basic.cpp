// Finite-difference gradient checks of elementwise, reduction, shape and linear-algebra ops.
#include "gradcheck.h"

using namespace ds;
using ds::testing::gradcheck;
using ds::testing::randn;
using V = std::vector<Tensor>;

using ds::testing::leaf;

namespace {
Tensor positive(const Shape& s, uint64_t seed) { return ds::testing::uniform_leaf(s, seed, 0.5f, 2.0f); }
}  // namespace

TEST(Gradcheck, AddSubMulDivWithBroadcast) {
  gradcheck([](const V& x) { return ops::add(x[0], x[1]); }, {leaf({3, 4}, 1), leaf({4}, 2)});
  gradcheck([](const V& x) { return ops::sub(x[0], x[1]); }, {leaf({2, 1, 4}, 3), leaf({3, 1}, 4)});
  gradcheck([](const V& x) { return ops::mul(x[0], x[1]); }, {leaf({3, 4}, 5), leaf({3, 1}, 6)});
  gradcheck([](const V& x) { return ops::div(x[0], x[1]); }, {leaf({3, 4}, 7), positive({4}, 8)});
}

TEST(Gradcheck, Unary) {
  gradcheck([](const V& x) { return ops::mul(ops::add(x[0], 0.5f), 3.0f); }, {leaf({5}, 9)});
  gradcheck([](const V& x) { return ops::neg(x[0]); }, {leaf({5}, 10)});
  gradcheck([](const V& x) { return ops::exp(x[0]); }, {leaf({6}, 11, 0.5f)});
  gradcheck([](const V& x) { return ops::log(x[0]); }, {positive({6}, 12)});
  gradcheck([](const V& x) { return ops::sqrt(x[0]); }, {positive({6}, 13)});
  gradcheck([](const V& x) { return ops::tanh(x[0]); }, {leaf({6}, 14)});
  gradcheck([](const V& x) { return ops::square(x[0]); }, {leaf({6}, 15)});
  gradcheck([](const V& x) { return ops::pow(x[0], 1.5f); }, {positive({6}, 16)});
}

TEST(Gradcheck, Reductions) {
  gradcheck([](const V& x) { return ops::sum(x[0]); }, {leaf({3, 4}, 17)});
  gradcheck([](const V& x) { return ops::sum(x[0], {1}); }, {leaf({2, 3, 4}, 18)});
  gradcheck([](const V& x) { return ops::sum(x[0], {0, 2}, true); }, {leaf({2, 3, 4}, 19)});
  gradcheck([](const V& x) { return ops::mean(x[0], {-1}); }, {leaf({3, 5}, 20)});
  gradcheck([](const V& x) { return ops::mean(x[0]); }, {leaf({3, 5}, 21)});
  gradcheck([](const V& x) { return ops::max(x[0], 1); }, {leaf({3, 5}, 22)});
}

TEST(Gradcheck, ShapeOps) {
  gradcheck([](const V& x) { return ops::reshape(x[0], {4, -1}); }, {leaf({2, 6}, 23)});
  gradcheck([](const V& x) { return ops::mul(ops::transpose(x[0], 0, 2), 2.0f); }, {leaf({2, 3, 4}, 24)});
  gradcheck([](const V& x) { return ops::permute(x[0], {2, 0, 1}); }, {leaf({2, 3, 4}, 25)});
  gradcheck([](const V& x) { return ops::slice(x[0], 1, 1, 3); }, {leaf({2, 4, 3}, 26)});
  gradcheck([](const V& x) { return ops::concat({x[0], x[1]}, 1); }, {leaf({2, 3}, 27), leaf({2, 2}, 28)});
  gradcheck([](const V& x) { return ops::contiguous(ops::transpose(x[0], 0, 1)); }, {leaf({3, 4}, 29)});
  gradcheck([](const V& x) { return ops::broadcast_to(x[0], {3, 2, 4}); }, {leaf({2, 1}, 30)});
}

TEST(Gradcheck, MatmulAndLinear) {
  gradcheck([](const V& x) { return ops::matmul(x[0], x[1]); }, {leaf({3, 4}, 31), leaf({4, 5}, 32)});
  gradcheck([](const V& x) { return ops::matmul(x[0], x[1]); }, {leaf({2, 3, 4}, 33), leaf({4, 5}, 34)});
  gradcheck([](const V& x) { return ops::matmul(x[0], x[1]); }, {leaf({2, 3, 4}, 35), leaf({2, 4, 5}, 36)});
  gradcheck([](const V& x) { return ops::matmul(x[0], x[1]); }, {leaf({2, 1, 3, 4}, 37), leaf({3, 4, 2}, 38)});
  gradcheck([](const V& x) { return ops::matmul(x[0], ops::transpose(x[1], -1, -2)); },
            {leaf({2, 3, 4}, 39), leaf({2, 5, 4}, 40)});
  gradcheck([](const V& x) { return ops::linear(x[0], x[1], x[2]); },
            {leaf({2, 3, 4}, 41), leaf({5, 4}, 42), leaf({5}, 43)});
  gradcheck([](const V& x) { return ops::linear(x[0], x[1]); }, {leaf({3, 4}, 44), leaf({2, 4}, 45)});
}

TEST(Ops, MatmulMatchesNaive) {
  Tensor a = randn({3, 7, 5}, 50), b = randn({3, 5, 6}, 51);
  Tensor c = ops::matmul(a, b);
  auto av = a.to_vector(), bv = b.to_vector(), cv = c.to_vector();
  for (int bi = 0; bi < 3; ++bi)
    for (int i = 0; i < 7; ++i)
      for (int j = 0; j < 6; ++j) {
        double acc = 0;
        for (int k = 0; k < 5; ++k) acc += av[bi * 35 + i * 5 + k] * bv[bi * 30 + k * 6 + j];
        ASSERT_NEAR(cv[bi * 42 + i * 6 + j], acc, 1e-4);
      }
}

TEST(Ops, SixteenBitInputsWork) {
  for (DType dt : {DType::bf16, DType::f16}) {
    Tensor a = randn({4, 8}, 60, 1.0f, dt), w = randn({3, 8}, 61, 1.0f, dt);
    Tensor y = ops::linear(a, w);
    EXPECT_EQ(y.dtype(), dt);
    Tensor ref = ops::linear(a.to(DType::f32), w.to(DType::f32));
    auto yv = y.to_vector(), rv = ref.to_vector();
    for (size_t i = 0; i < yv.size(); ++i) EXPECT_NEAR(yv[i], rv[i], 0.02 * (1 + std::abs(rv[i])));
    Tensor s = ops::add(a, a);
    EXPECT_EQ(s.dtype(), dt);
  }
}

// Tensors, dtypes, storage and the caching allocator.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "ds/backend/backend.h"
#include "ds/core/allocator.h"
#include "ds/core/error.h"
#include "ds/core/tensor.h"
#include "ds/ops/ops.h"

using namespace ds;

TEST(DType, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 is exactly halfway between bf16 neighbours 1 and 1 + 2^-7: ties go to even (1).
  EXPECT_EQ(float_to_bf16(1.0f + 0x1.0p-8f), float_to_bf16(1.0f));
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd mantissa) and 1 + 2^-6: goes up to even.
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3 * 0x1.0p-8f)), 1.0f + 0x1.0p-6f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 0x1.8p-8f)), 1.0f + 0x1.0p-7f);  // above half: up
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bf16_to_float(float_to_bf16(INFINITY)), INFINITY);
}

TEST(DType, Fp16RoundsToNearestEvenIncludingSubnormals) {
  EXPECT_EQ(f16_to_float(float_to_f16(1.0f + 0x1.0p-11f)), 1.0f);              // tie -> even
  EXPECT_EQ(f16_to_float(float_to_f16(1.0f + 3 * 0x1.0p-11f)), 1.0f + 0x1.0p-9f);  // tie -> even (up)
  EXPECT_EQ(f16_to_float(float_to_f16(65504.0f)), 65504.0f);
  EXPECT_EQ(f16_to_float(float_to_f16(65520.0f)), INFINITY);  // halfway to 2^16 rounds to inf
  EXPECT_EQ(f16_to_float(float_to_f16(0x1.0p-24f)), 0x1.0p-24f);  // smallest subnormal
  EXPECT_EQ(f16_to_float(float_to_f16(0x1.0p-25f)), 0.0f);        // tie -> even (0)
  EXPECT_EQ(f16_to_float(float_to_f16(0x1.8p-25f)), 0x1.0p-24f);
  // Every finite f16 value survives a round trip through float.
  for (uint32_t h = 0; h < 0x7c00; ++h) ASSERT_EQ(float_to_f16(f16_to_float(static_cast<uint16_t>(h))), h);
}

TEST(DType, VectorisedConversionMatchesScalar) {
  std::vector<float> v(1001);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::ldexp(std::sin(i * 0.37f), static_cast<int>(i % 40) - 20);
  v[5] = NAN;
  std::vector<uint16_t> h(v.size()), b(v.size());
  convert(v.data(), DType::f32, h.data(), DType::f16, v.size());
  convert(v.data(), DType::f32, b.data(), DType::bf16, v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (i == 5) continue;
    ASSERT_EQ(h[i], float_to_f16(v[i])) << i;
    ASSERT_EQ(b[i], float_to_bf16(v[i])) << i;
  }
  std::vector<float> back(v.size());
  convert(b.data(), DType::bf16, back.data(), DType::f32, v.size());
  for (size_t i = 0; i < v.size(); ++i)
    if (i != 5) ASSERT_EQ(back[i], bf16_to_float(b[i]));
}

TEST(Tensor, ViewsShareStorage) {
  Tensor x = Tensor::from_data({0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor t = ops::transpose(x, 0, 1);
  EXPECT_EQ(t.shape(), (Shape{3, 2}));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.to_vector(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  Tensor s = ops::slice(x, 1, 1, 3);
  EXPECT_EQ(s.to_vector(), (std::vector<float>{1, 2, 4, 5}));
  s.data<float>()[0] = 10;  // writes through to x
  EXPECT_EQ(x.to_vector()[1], 10);
  Tensor r = ops::reshape(x, {3, -1});
  EXPECT_EQ(r.shape(), (Shape{3, 2}));
  EXPECT_EQ(r.storage().get(), x.storage().get());
  Tensor c = ops::contiguous(t);
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.to_vector(), t.to_vector());
}

TEST(Tensor, DtypeConversionsAndErrors) {
  Tensor x = Tensor::from_data({1.5f, -2.25f, 3.0f}, {3});
  Tensor h = x.to(DType::bf16);
  EXPECT_EQ(h.dtype(), DType::bf16);
  EXPECT_EQ(h.to_vector(), x.to_vector());
  Tensor i = Tensor::from_ints({1, 2, 3}, {3}, DType::i32);
  EXPECT_EQ(i.to(DType::i64).to_int_vector(), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_THROW(x.data<int32_t>(), Error);
  EXPECT_THROW(ops::reshape(x, {2, 2}), Error);
  try {
    ops::reshape(x, {2, 2});
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[reshape]"), std::string::npos);
  }
}

TEST(Storage, ViewsIntoFlatBufferAndRelease) {
  auto flat = Storage::allocate(16 * sizeof(float));
  Tensor whole = Tensor::from_storage(flat, {16}, DType::f32);
  whole.zero_();
  Tensor a = Tensor::from_storage(Storage::view(flat, 4 * sizeof(float), 6 * sizeof(float)), {2, 3}, DType::f32);
  ops::fill_(a, 2.0);
  EXPECT_EQ(whole.to_vector()[4], 2.0f);
  EXPECT_EQ(whole.to_vector()[10], 0.0f);
  flat->release();
  EXPECT_FALSE(a.is_materialized());
  EXPECT_THROW(a.data<float>(), Error);  // no reading freed memory
  flat->materialize();
  EXPECT_TRUE(a.is_materialized());
  ops::fill_(a, 1.0);
  EXPECT_EQ(a.to_vector()[0], 1.0f);
}

TEST(Allocator, ReusesFreedBlocks) {
  Allocator& alloc = cpu_allocator();
  { Tensor warm = Tensor::empty({1000, 1000}); }
  const auto before = alloc.stats();
  for (int i = 0; i < 10; ++i) Tensor t = Tensor::empty({1000, 1000});
  const auto after = alloc.stats();
  EXPECT_EQ(after.misses, before.misses);
  EXPECT_EQ(after.allocations, before.allocations + 10);
}

TEST(Backend, CudaStubExplainsItself) {
#ifndef DS_WITH_CUDA
  try {
    backend::get(Device{DeviceType::cuda, 0});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("-DDS_WITH_CUDA=ON"), std::string::npos);
  }
#endif
  EXPECT_FALSE(backend::cpu().gemm_info().empty());
}

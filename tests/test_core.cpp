// Tensors, dtypes, storage and the caching allocator.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

#include <cmath>
#include <limits>

#include "ds/backend/backend.h"
#include "ds/core/allocator.h"
#include "ds/core/block_pool.h"
#include "ds/core/device_registry.h"
#include "ds/core/error.h"
#include "ds/core/tensor.h"
#include "ds/core/text.h"
#include "ds/ops/ops.h"
#include "ds/optim/kernels.h"

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

TEST(Tensor, FlatRangeIsAViewOfTheSameStorage) {
  Tensor t = Tensor::from_data({0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor r = t.flat_range(2, 3);
  EXPECT_EQ(r.shape(), Shape{3});
  EXPECT_EQ(r.to_vector(), (std::vector<float>{2, 3, 4}));
  ops::fill_(r, 9.0);
  EXPECT_EQ(t.to_vector(), (std::vector<float>{0, 1, 9, 9, 9, 5}));
  EXPECT_EQ(t.flat_range(6, 0).numel(), 0);
  EXPECT_THROW(t.flat_range(4, 3), Error);
  EXPECT_THROW(ops::transpose(t, 0, 1).flat_range(0, 1), Error);
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

TEST(Allocator, LargeBlocksSplitAndMerge) {
  auto alloc = new_caching_cpu_allocator();
  constexpr size_t MiB = 1u << 20;
  void* big = alloc->allocate(64 * MiB);
  alloc->deallocate(big, 64 * MiB);
  const uint64_t misses = alloc->stats().misses;
  // Two smaller requests are carved out of the freed 64 MiB block: no new system memory.
  void* a = alloc->allocate(30 * MiB);
  void* b = alloc->allocate(30 * MiB);
  EXPECT_EQ(alloc->stats().misses, misses);
  EXPECT_EQ(alloc->stats().bytes_reserved, 64 * MiB);
  EXPECT_TRUE(static_cast<char*>(b) >= static_cast<char*>(a) + 30 * MiB ||
              static_cast<char*>(a) >= static_cast<char*>(b) + 30 * MiB);
  alloc->deallocate(a, 30 * MiB);
  alloc->deallocate(b, 30 * MiB);
  // Freed neighbours merge back: the whole block serves a 64 MiB request again.
  void* again = alloc->allocate(64 * MiB);
  EXPECT_EQ(again, big);
  EXPECT_EQ(alloc->stats().misses, misses);
  // A request larger than any free block goes to the system.
  void* more = alloc->allocate(80 * MiB);
  EXPECT_EQ(alloc->stats().misses, misses + 1);
  alloc->deallocate(again, 64 * MiB);
  alloc->deallocate(more, 80 * MiB);
  EXPECT_EQ(alloc->stats().bytes_in_use, 0u);
  alloc->empty_cache();
  EXPECT_EQ(alloc->stats().bytes_reserved, 0u);
}

// A system that hands out addresses it never backs (the pool never touches its memory, so a GPU's
// cudaMalloc behaves the same), up to a capacity.
class FakeSystem final : public SystemMemory {
 public:
  explicit FakeSystem(size_t capacity) : capacity_(capacity) {}
  void* allocate(size_t n, size_t align) override {
    if (used_ + n > capacity_) return nullptr;
    next_ = (next_ + align - 1) / align * align;
    void* p = reinterpret_cast<void*>(next_);
    next_ += n;
    used_ += n;
    ++calls_;
    return p;
  }
  void release(void*, size_t n) override { used_ -= n; }
  [[noreturn]] void out_of_memory(size_t n, const AllocatorStats& s) override {
    DS_THROW("fake out of memory: {} bytes, {} in use, {} reserved", n, s.bytes_in_use,
             s.bytes_reserved);
  }
  size_t used_ = 0;
  int calls_ = 0;

 private:
  size_t capacity_;
  uintptr_t next_ = uintptr_t{1} << 44;
};

TEST(BlockPool, SplitMemoryIsReportedAsFragmentation) {
  constexpr size_t MiB = 1u << 20;
  FakeSystem sys(1024 * MiB);
  BlockPool pool(sys);
  void* big = pool.allocate(64 * MiB);
  pool.deallocate(big, 64 * MiB);
  EXPECT_EQ(pool.stats().bytes_inactive_split, 0u);  // whole and free: returnable
  void* a = pool.allocate(30 * MiB);                  // carved out of the free 64 MiB
  EXPECT_EQ(a, big);
  AllocatorStats s = pool.stats();
  EXPECT_EQ(s.segments, 1u);
  EXPECT_EQ(s.bytes_reserved, 64 * MiB);
  EXPECT_EQ(s.bytes_inactive_split, 34 * MiB);  // the rest: free, but held by a's segment
  // The split rest is not returned by empty_cache (a lives in its segment) ...
  pool.release_cached();
  EXPECT_EQ(pool.stats().bytes_reserved, 64 * MiB);
  // ... and serves a request that fits it without a new segment.
  void* b = pool.allocate(34 * MiB);
  EXPECT_EQ(static_cast<char*>(b), static_cast<char*>(a) + 30 * MiB);
  EXPECT_EQ(pool.stats().bytes_inactive_split, 0u);
  EXPECT_EQ(sys.calls_, 1);
  pool.deallocate(a, 30 * MiB);
  pool.deallocate(b, 34 * MiB);
  pool.release_cached();
  s = pool.stats();
  EXPECT_EQ(s.bytes_reserved, 0u);
  EXPECT_EQ(s.segments, 0u);
  EXPECT_EQ(s.peak_bytes_reserved, 64 * MiB);
  EXPECT_EQ(s.peak_bytes_in_use, 64 * MiB);
  pool.reset_peak();
  EXPECT_EQ(pool.stats().peak_bytes_reserved, 0u);
  EXPECT_EQ(sys.used_, 0u);
}

TEST(BlockPool, ReturnsItsCacheBeforeRunningOutOfMemory) {
  constexpr size_t MiB = 1u << 20;
  FakeSystem sys(100 * MiB);
  BlockPool pool(sys);
  // A cached 60 MiB segment and a cached small block hold memory the next request needs.
  void* x = pool.allocate(60 * MiB);
  void* small = pool.allocate(1000);
  pool.deallocate(x, 60 * MiB);
  pool.deallocate(small, 1000);
  void* y = pool.allocate(80 * MiB);  // does not fit beside the cache: the cache goes back first
  EXPECT_NE(y, nullptr);
  AllocatorStats s = pool.stats();
  EXPECT_EQ(s.bytes_reserved, 80 * MiB);
  EXPECT_EQ(s.segments, 1u);
  // Nothing left to return: the system's error, with the pool's numbers.
  try {
    pool.allocate(40 * MiB);
    ADD_FAILURE() << "expected out of memory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fake out of memory: 41943040 bytes, 83886080 in use"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(pool.stats().bytes_in_use, 80 * MiB);  // the failed request changed nothing
  pool.deallocate(y, 80 * MiB);
  pool.release_cached();
  EXPECT_EQ(sys.used_, 0u);
}

TEST(BlockPool, ForwardThenBackwardShapesReuseOneSegment) {
  // Activations freed as 3 x 8 MiB serve gradients of 2 x 12 MiB: merged neighbours, no new
  // memory (an exact-size cache would have reserved 48 MiB for this).
  constexpr size_t MiB = 1u << 20;
  FakeSystem sys(1024 * MiB);
  BlockPool pool(sys);
  void* whole = pool.allocate(24 * MiB);
  pool.deallocate(whole, 24 * MiB);
  for (int step = 0; step < 3; ++step) {
    void* a[3];
    for (auto& p : a) p = pool.allocate(8 * MiB);
    for (auto& p : a) pool.deallocate(p, 8 * MiB);
    void* g0 = pool.allocate(12 * MiB);
    void* g1 = pool.allocate(12 * MiB);
    pool.deallocate(g1, 12 * MiB);
    pool.deallocate(g0, 12 * MiB);
  }
  EXPECT_EQ(sys.calls_, 1);
  EXPECT_EQ(pool.stats().peak_bytes_reserved, 24 * MiB);
  pool.release_cached();
}

TEST(Allocator, RandomLargeTrafficNeverOverlaps) {
  // Live blocks are filled with their own id and checked before they are freed: a block handed out
  // twice, or a split that cuts into a neighbour, shows up as a wrong byte.
  auto alloc = new_caching_cpu_allocator();
  constexpr size_t MiB = 1u << 20;
  struct Live {
    unsigned char* p;
    size_t n;
    unsigned char id;
  };
  std::vector<Live> live;
  uint64_t x = 12345;
  auto next = [&] { return x = x * 6364136223846793005ull + 1442695040888963407ull, x >> 33; };
  auto check_and_free = [&](size_t i) {
    const Live l = live[i];
    for (size_t k = 0; k < l.n; k += 4093) ASSERT_EQ(l.p[k], l.id) << "block " << i;
    ASSERT_EQ(l.p[l.n - 1], l.id);
    alloc->deallocate(l.p, l.n);
    live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
  };
  for (int round = 0; round < 400; ++round) {
    if (!live.empty() && (live.size() > 12 || next() % 3 == 0)) {
      check_and_free(next() % live.size());
      continue;
    }
    const size_t n = (1 + next() % 24) * MiB + next() % 4096;
    auto* p = static_cast<unsigned char*>(alloc->allocate(n));
    ASSERT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
    const auto id = static_cast<unsigned char>(round);
    std::memset(p, id, n);
    live.push_back({p, n, id});
  }
  while (!live.empty()) check_and_free(live.size() - 1);
  const auto st = alloc->stats();
  EXPECT_EQ(st.bytes_in_use, 0u);
  EXPECT_LT(st.misses, 100u) << "freed blocks were not reused";
  alloc->empty_cache();
  EXPECT_EQ(alloc->stats().bytes_reserved, 0u);
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
  // Host memory has no cap to set; synchronize() has nothing to wait for.
  try {
    backend::cpu().set_memory_limit(1 << 20);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("device memory limits apply to GPUs"), std::string::npos)
        << e.what();
  }
  backend::cpu().synchronize();
}

// ---- the sim device (src/backend/sim): memory the host cannot read, the CPU's kernels ----

const Device kSimDevice{DeviceType::sim, 0};

TEST(Sim, HostDereferenceOfItsMemoryFaults) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  const Tensor t = Tensor::zeros({16}, DType::f32, kSimDevice);
  EXPECT_EQ(t.device().str(), "sim:0");
  EXPECT_EQ(backend::get(kSimDevice).name(), "sim:0");
  const volatile float* p = t.data<float>();
  EXPECT_DEATH({ std::printf("%f\n", static_cast<double>(p[3])); }, "");
  volatile float* q = t.data<float>();
  EXPECT_DEATH({ q[0] = 1.0f; }, "");
  EXPECT_THROW(backend::get(Device{DeviceType::sim, 1}), Error);
}

TEST(Sim, RoundTripThroughTheDeviceIsBitwise) {
  std::vector<float> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(static_cast<float>(i) * 1.7f) * 1e3f;
  v[0] = -0.0f, v[1] = INFINITY, v[2] = std::numeric_limits<float>::quiet_NaN();
  v[3] = std::numeric_limits<float>::denorm_min();
  const Tensor h = Tensor::from_data(v, {10, 100});
  const Tensor d = Tensor::empty({10, 100}, DType::f32, kSimDevice);
  d.copy_from(h);               // cpu -> sim
  const Tensor d2 = d.clone();  // sim -> sim
  // A strided sim -> sim copy.
  const Tensor dt = ops::transpose(d2, 0, 1).contiguous();
  Tensor back = Tensor::empty({10, 100}), back_t = Tensor::empty({100, 10});
  back.copy_from(d2);  // sim -> cpu
  back_t.copy_from(dt);
  EXPECT_EQ(d2.device(), kSimDevice);
  EXPECT_EQ(std::memcmp(back.raw_data(), h.raw_data(), h.nbytes()), 0);
  const Tensor want_t = ops::transpose(h, 0, 1).contiguous();
  EXPECT_EQ(std::memcmp(back_t.raw_data(), want_t.raw_data(), h.nbytes()), 0);
  // Conversions and fills on the device.
  const Tensor b16 = d.to(DType::bf16), hb16 = h.to(DType::bf16);
  Tensor back16 = Tensor::empty({10, 100}, DType::bf16);
  back16.copy_from(b16);
  EXPECT_EQ(std::memcmp(back16.raw_data(), hb16.raw_data(), hb16.nbytes()), 0);
  EXPECT_EQ(Tensor::full({3}, 2.5, DType::f32, kSimDevice).to_vector(),
            std::vector<float>(3, 2.5f));
}

TEST(Sim, AdamIsBitwiseTheCpuOptimizer) {
  const int64_t n = 5003;  // every SIMD width's body and a scalar tail
  std::vector<float> p(n), g(n), m(n), v(n);
  for (int64_t i = 0; i < n; ++i) {
    const float x = static_cast<float>(i);
    p[i] = std::sin(x * 0.37f), g[i] = std::cos(x * 1.3f) * 3.0f;
    m[i] = std::sin(x * 2.1f) * 0.1f, v[i] = std::abs(std::cos(x * 0.7f)) * 0.01f;
  }
  auto on_sim = [](const std::vector<float>& x) {
    Tensor t = Tensor::empty({static_cast<int64_t>(x.size())}, DType::f32, kSimDevice);
    t.copy_from(Tensor::from_data(x, {static_cast<int64_t>(x.size())}));
    return t;
  };
  for (const bool adam_w : {true, false}) {
    for (const DType o16 : {DType::bf16, DType::f16}) {
      optim::AdamConfig c;
      c.lr = 3e-3f, c.weight_decay = 0.1f, c.adam_w_mode = adam_w;
      std::vector<float> cp = p, cm = m, cv = v;
      std::vector<uint16_t> c16(n);
      optim::adam_update(cp.data(), g.data(), cm.data(), cv.data(), n, 7, c, 0.25f, c16.data(),
                         o16);
      const Tensor sp = on_sim(p), sg = on_sim(g), sm = on_sim(m), sv = on_sim(v);
      const Tensor s16 = Tensor::empty({n}, o16, kSimDevice);
      optim::adam_update(sp, sg, sm, sv, 7, c, 0.25f, s16);
      Tensor h16 = Tensor::empty({n}, o16);
      h16.copy_from(s16);
      const std::string what = std::string(adam_w ? "AdamW " : "Adam ") + dtype_name(o16);
      EXPECT_EQ(sp.to_vector(), cp) << what;  // operator== on floats: no NaN here
      EXPECT_EQ(sm.to_vector(), cm) << what;
      EXPECT_EQ(sv.to_vector(), cv) << what;
      EXPECT_EQ(std::memcmp(h16.raw_data(), c16.data(), c16.size() * 2), 0) << what;
    }
  }
  EXPECT_TRUE(backend::get(kSimDevice).supports("adam", DType::f32));
  EXPECT_FALSE(backend::cpu().supports("adam", DType::f32));
}

TEST(Sim, AllocatorStatsAndLimitAreTheDevicesOwn) {
  backend::Backend& sim = backend::sim();
  Allocator& a = sim.allocator();
  EXPECT_EQ(device_ops(kSimDevice).allocator, &a);
  EXPECT_NE(&a, &cpu_allocator());
  const uint64_t sim0 = a.stats().bytes_in_use, cpu0 = cpu_allocator().stats().bytes_in_use;
  {
    const Tensor t = Tensor::empty({1 << 18}, DType::f32, kSimDevice);  // 1 MiB
    EXPECT_GE(a.stats().bytes_in_use, sim0 + (1u << 20));
    EXPECT_EQ(cpu_allocator().stats().bytes_in_use, cpu0);
  }
  EXPECT_EQ(a.stats().bytes_in_use, sim0);
  EXPECT_EQ(sim.host_staging(64)->device(), kCPU);
  // A cap, as --device_memory_limit sets on a GPU.
  EXPECT_EQ(sim.available_memory(), 0u);  // no cap: unknown
  sim.set_memory_limit(sim0 + (4u << 20));
  EXPECT_EQ(sim.available_memory(), 4u << 20);
  try {
    Tensor::empty({2 << 20}, DType::f32, kSimDevice);  // 8 MiB
    ADD_FAILURE() << "expected an out-of-memory error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[sim:0] out of memory allocating"), std::string::npos)
        << e.what();
  }
  sim.set_memory_limit(0);
  EXPECT_NO_THROW(Tensor::empty({2 << 20}, DType::f32, kSimDevice));
}

TEST(Text, QuotedExcerptEscapesAndCuts) {
  EXPECT_EQ(quoted_excerpt("abc"), "'abc'");
  EXPECT_EQ(quoted_excerpt(std::string("a\nb\x01\xff'\\", 7)), "'a\\nb\\x01\\xff\\'\\\\'");
  EXPECT_EQ(quoted_excerpt("\xe4\xb8\xad"), "'\xe4\xb8\xad'");        // valid UTF-8 stays
  EXPECT_EQ(quoted_excerpt("\xe4\xb8"), "'\\xe4\\xb8'");              // a cut character is escaped
  const std::string huge(50'000'000, 'x');
  const std::string q = quoted_excerpt(huge, 200);
  EXPECT_LT(q.size(), 260u);
  EXPECT_NE(q.find("(50000000 bytes in all)"), std::string::npos) << q;
}

TEST(Text, BomAndCaseInsensitiveNames) {
  EXPECT_EQ(strip_utf8_bom("\xef\xbb\xbfhost1 slots=2"), "host1 slots=2");
  EXPECT_EQ(strip_utf8_bom("host1"), "host1");
  EXPECT_EQ(strip_utf8_bom("\xef\xbb"), "\xef\xbb");
  EXPECT_TRUE(iequals("localhost", "LOCALHOST"));
  EXPECT_FALSE(iequals("localhost", "localhos"));
  EXPECT_FALSE(iequals("node1", "node2"));
}

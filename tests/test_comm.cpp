// Collectives (ds::comm). The same binary runs three ways (tests/cmake/comm.cmake):
//   plain            the size-1 group, plus the failure drivers (CommFailure.*), which start
//                    mpirun on tests/comm_worker.cpp and check that a late or dead rank ends the
//                    whole job quickly with a message naming it;
//   mpirun -np 2/4   every collective x dtype x size against values computed locally, on the
//                    shared-memory path and (DS_COMM_SHM=0) on MPI's own collectives.
// Inputs are a hash of (rank, index), so every rank can compute every other rank's input.
// Results are compared bitwise, except 16-bit sums over more than 2 ranks on MPI's own path, whose
// summation order is MPI's (within the rounding of N-1 combines).
#include <gtest/gtest.h>

#include <set>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>

#include "ds/backend/backend.h"
#include "ds/comm/group.h"
#include "ds/comm/logger.h"
#include "ds/core/tensor.h"

using namespace ds;
using namespace ds::comm;

namespace {

std::shared_ptr<Group> W;  // the world group

const DType kAllTypes[] = {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64};
// Sizes: empty, tiny, odd, and large enough to stream through several shared-memory pieces
// (1 MiB slots: 262,144 fp32 per piece).
const size_t kCounts[] = {0, 1, 7, 1000, 600001};

uint32_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

// Rank r's input element i (salt separates tests): multiples of 1/64 in [-15.6, 15.6], rounded
// to the dtype, so 16-bit sums need rounding and exercise "accumulate in fp32, round once".
double raw_value(int r, size_t i, uint32_t salt) {
  const uint32_t h = mix((uint64_t(salt) << 40) ^ (uint64_t(r) << 32) ^ i);
  return (static_cast<int>(h % 2001) - 1000) / 64.0;
}

// Elements as doubles <-> buffers of any dtype (16-bit rounding to nearest even).
std::vector<char> make_buffer(DType t, const std::vector<double>& v) {
  std::vector<char> b(v.size() * dtype_size(t));
  for (size_t i = 0; i < v.size(); ++i) {
    char* p = b.data() + i * dtype_size(t);
    switch (t) {
      case DType::f32: {
        float f = float(v[i]);
        std::memcpy(p, &f, 4);
        break;
      }
      case DType::bf16: {
        uint16_t h = float_to_bf16(float(v[i]));
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::f16: {
        uint16_t h = float_to_f16(float(v[i]));
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::i32: {
        int32_t x = int32_t(std::lround(v[i] * 64));
        std::memcpy(p, &x, 4);
        break;
      }
      case DType::i64: {
        int64_t x = int64_t(std::llround(v[i] * 64)) << 20;
        std::memcpy(p, &x, 8);
        break;
      }
    }
  }
  return b;
}

// Element i as float (floats) or exact integer (ints, as double).
double element(DType t, const char* b, size_t i) {
  const char* p = b + i * dtype_size(t);
  switch (t) {
    case DType::f32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::bf16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return bf16_to_float(h);
    }
    case DType::f16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return f16_to_float(h);
    }
    case DType::i32: {
      int32_t x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case DType::i64: {
      int64_t x;
      std::memcpy(&x, p, 8);
      return double(x);
    }
  }
  return 0;
}

std::vector<char> input_of(DType t, int r, size_t n, uint32_t salt) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = raw_value(r, i, salt);
  return make_buffer(t, v);
}

// What the shared-memory path computes: widen, combine in rank order in fp32, round once.
// The expected buffer is built with the same rounding, so comparisons are bitwise.
std::vector<char> expected_reduce(DType t, ReduceOp op, int n, size_t count, uint32_t salt,
                                  size_t first = 0) {
  std::vector<std::vector<char>> in;
  for (int r = 0; r < n; ++r) in.push_back(input_of(t, r, first + count, salt));
  std::vector<char> out(count * dtype_size(t));
  for (size_t i = 0; i < count; ++i) {
    const size_t j = first + i;
    char* p = out.data() + i * dtype_size(t);
    if (t == DType::i32 || t == DType::i64) {
      int64_t acc = int64_t(element(t, in[0].data(), j));
      for (int r = 1; r < n; ++r) {
        const int64_t x = int64_t(element(t, in[r].data(), j));
        acc = op == ReduceOp::sum ? acc + x : std::max(acc, x);
      }
      if (t == DType::i32) {
        int32_t v = int32_t(acc);
        std::memcpy(p, &v, 4);
      } else
        std::memcpy(p, &acc, 8);
      continue;
    }
    float acc = float(element(t, in[0].data(), j));
    for (int r = 1; r < n; ++r) {
      const float x = float(element(t, in[r].data(), j));
      acc = op == ReduceOp::sum ? acc + x : std::max(acc, x);
    }
    if (t == DType::f32)
      std::memcpy(p, &acc, 4);
    else {
      uint16_t h = t == DType::bf16 ? float_to_bf16(acc) : float_to_f16(acc);
      std::memcpy(p, &h, 2);
    }
  }
  return out;
}

// Bitwise where the summation order is ours (shared memory) or cannot matter (2 ranks: one add);
// otherwise (MPI's own order with 16-bit values) within the rounding of N-1 combines.
bool order_is_ours() {
  return W->capabilities().shared_memory || W->size() <= 2;
}

void expect_same(DType t, const std::vector<char>& got, const std::vector<char>& want, size_t count,
                 bool exact, const std::string& what) {
  size_t bad = 0;
  for (size_t i = 0; i < count && bad < 5; ++i) {
    const double g = element(t, got.data(), i), w = element(t, want.data(), i);
    bool ok;
    if (exact || !is_floating(t) || t == DType::f32)
      ok = std::memcmp(got.data() + i * dtype_size(t), want.data() + i * dtype_size(t),
                       dtype_size(t)) == 0;
    else
      // Each of the N-1 combines rounds a partial sum of magnitude < 16 N by half an ulp.
      ok = std::fabs(g - w) <= 16.0 * W->size() * W->size() * (t == DType::bf16 ? 0x1p-9 : 0x1p-12);
    if (!ok) {
      ++bad;
      ADD_FAILURE() << what << " " << dtype_name(t) << " element " << i << " of " << count
                    << ": got " << g << ", expected " << w << " (rank " << W->rank() << ")";
    }
  }
}

std::string label(const char* op, DType t, size_t n) {
  return fmt::format("{} {} n={}", op, dtype_name(t), n);
}

}  // namespace

// ---- every group ----

TEST(Comm, WorldMatchesEnvironment) {
  // mpirun sets OMPI_COMM_WORLD_SIZE; the deepspeed launcher WORLD_SIZE (also under srun).
  const char* s = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (!s) s = std::getenv("WORLD_SIZE");
  EXPECT_EQ(W->size(), s ? std::atoi(s) : 1);
  EXPECT_GE(W->rank(), 0);
  EXPECT_LT(W->rank(), W->size());
  EXPECT_EQ(W->world_rank(W->rank()), W->rank());
  const Capabilities caps = W->capabilities();
  EXPECT_EQ(caps.backend, s ? "mpi" : "single");
  for (DType t : kAllTypes) EXPECT_TRUE(caps.supports(OpKind::all_reduce, t, ReduceOp::max));
  if (W->rank() == 0) std::printf("[comm] world: size %d, %s\n", W->size(), caps.str().c_str());
}

// Under the deepspeed launcher: the rank variables agree with the world MPI built, and
// (CROSS_RANK, LOCAL_RANK) name every rank once, with as many nodes as MPI sees.
TEST(Comm, LauncherVariablesMatchTheWorld) {
  auto env = [](const char* k) {
    const char* v = std::getenv(k);
    return v ? std::atoi(v) : -1;
  };
  if (env("RANK") < 0) GTEST_SKIP() << "not started by the deepspeed launcher";
  EXPECT_EQ(env("RANK"), W->rank());
  EXPECT_EQ(env("WORLD_SIZE"), W->size());
  EXPECT_EQ(env("CROSS_SIZE"), W->capabilities().nodes);
  EXPECT_EQ(W->capabilities().shared_memory, W->capabilities().nodes == 1);
  int64_t mine[2] = {env("CROSS_RANK"), env("LOCAL_RANK")};
  std::vector<int64_t> all(2 * static_cast<size_t>(W->size()));
  W->all_gather(mine, all.data(), 2, DType::i64);
  std::set<std::pair<int64_t, int64_t>> seen;
  for (int r = 0; r < W->size(); ++r) {
    const int64_t node = all[2 * r], local = all[2 * r + 1];
    EXPECT_GE(node, 0);
    EXPECT_LT(node, env("CROSS_SIZE"));
    EXPECT_GE(local, 0);
    EXPECT_TRUE(seen.insert({node, local}).second) << "rank " << r << " repeats node " << node << " local " << local;
  }
}

TEST(Comm, AllReduceSumAndMaxEveryDtype) {
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max})
    for (DType t : kAllTypes)
      for (size_t n : kCounts) {
        const uint32_t salt = 11 + static_cast<uint32_t>(t) * 7 + static_cast<uint32_t>(op);
        std::vector<char> buf = input_of(t, W->rank(), n, salt);
        W->all_reduce(buf.data(), n, t, op, label("all_reduce", t, n));
        const auto want = expected_reduce(t, op, W->size(), n, salt);
        expect_same(t, buf, want, n, order_is_ours() || op == ReduceOp::max,
                    label(op == ReduceOp::sum ? "all_reduce sum" : "all_reduce max", t, n));
      }
}

TEST(Comm, SixteenBitSumRoundsOnce) {
  // 1 + 2^-8 + 2^-8: rounding once gives 1 + 2^-7 (exact in bf16); rounding after every add gives
  // 1 (each 1 + 2^-8 is a tie that goes to even). Needs 3 ranks and our summation.
  if (W->size() < 3 || !W->capabilities().shared_memory)
    GTEST_SKIP() << "needs >= 3 ranks and shared memory";
  const float mine = W->rank() == 0 ? 1.0f : (W->rank() <= 2 ? 0x1p-8f : 0.0f);
  uint16_t b = float_to_bf16(mine);
  W->all_reduce(&b, 1, DType::bf16);
  EXPECT_EQ(bf16_to_float(b), 1.0f + 0x1p-7f);
}

TEST(Comm, MaxPropagatesNaN) {
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    std::vector<double> v(10, W->rank());
    if (W->rank() == W->size() - 1) v[3] = NAN;
    auto buf = make_buffer(t, v);
    W->all_reduce(buf.data(), v.size(), t, ReduceOp::max);
    EXPECT_TRUE(std::isnan(element(t, buf.data(), 3))) << dtype_name(t);
    EXPECT_EQ(element(t, buf.data(), 0), W->size() - 1) << dtype_name(t);
  }
}

TEST(Comm, ReduceScatterEveryDtype) {
  const int n = W->size(), me = W->rank();
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max})
    for (DType t : kAllTypes)
      for (size_t chunk : {size_t(0), size_t(1), size_t(33), size_t(300007)}) {
        const uint32_t salt = 101 + static_cast<uint32_t>(t);
        const auto in = input_of(t, me, chunk * n, salt);
        std::vector<char> out(chunk * dtype_size(t), 0x5a);
        W->reduce_scatter(in.data(), out.data(), chunk, t, op, "rs");
        const auto want = expected_reduce(t, op, n, chunk, salt, chunk * me);
        expect_same(t, out, want, chunk, order_is_ours() || op == ReduceOp::max,
                    label("reduce_scatter", t, chunk));
        // In place: the output is this rank's chunk of the input.
        auto inplace = in;
        W->reduce_scatter(inplace.data(), inplace.data() + chunk * me * dtype_size(t), chunk, t,
                          op);
        std::vector<char> mine(inplace.begin() + chunk * me * dtype_size(t),
                               inplace.begin() + chunk * (me + 1) * dtype_size(t));
        expect_same(t, mine, want, chunk, order_is_ours() || op == ReduceOp::max,
                    label("reduce_scatter in place", t, chunk));
      }
}

TEST(Comm, ReduceToEachRootEveryDtype) {
  const int n = W->size(), me = W->rank();
  for (int root = 0; root < n; ++root)
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max})
      for (DType t : kAllTypes)
        // 4.6M elements: 9 MiB and more, the shared-memory path within a node; the rest MPI's.
        for (size_t count : {size_t(0), size_t(1), size_t(33), size_t(600011), size_t(4600007)}) {
          // The large count (the shared-memory path) for fp32 and bf16 sums only: it is slow to check.
          if (count > 1000000 && !(op == ReduceOp::sum && (t == DType::f32 || t == DType::bf16))) continue;
          const uint32_t salt = 211 + static_cast<uint32_t>(t) + static_cast<uint32_t>(root);
          const auto in = input_of(t, me, count, salt);
          auto buf = in;
          W->reduce(buf.data(), count, t, root, op, label("reduce", t, count));
          if (me == root) {
            // Reduces under 8 MiB run as MPI's (rounding once per pairwise combine).
            const bool ours = W->capabilities().shared_memory && count * dtype_size(t) >= (size_t(8) << 20);
            expect_same(t, buf, expected_reduce(t, op, n, count, salt), count,
                        ours || n <= 2 || op == ReduceOp::max, label("reduce at root", t, count));
          } else {
            EXPECT_EQ(buf, in) << "reduce changed a non-root buffer: " << label("reduce", t, count);
          }
        }
  std::vector<float> v(4, 1.0f);
  EXPECT_THROW(W->reduce(v.data(), v.size(), DType::f32, n), Error);
}

TEST(Comm, AllGatherEveryDtype) {
  const int n = W->size(), me = W->rank();
  for (DType t : kAllTypes)
    for (size_t chunk : {size_t(0), size_t(1), size_t(33), size_t(300007)}) {
      const size_t es = dtype_size(t);
      const auto in = input_of(t, me, chunk, 7);
      std::vector<char> out(chunk * n * es, 0x5a);
      W->all_gather(in.data(), out.data(), chunk, t);
      for (int r = 0; r < n; ++r) {
        const auto want = input_of(t, r, chunk, 7);
        ASSERT_EQ(std::memcmp(out.data() + r * chunk * es, want.data(), chunk * es), 0)
            << label("all_gather", t, chunk) << " chunk of rank " << r;
      }
      // In place: this rank's chunk already sits in the output.
      std::vector<char> buf(chunk * n * es, 0);
      std::memcpy(buf.data() + me * chunk * es, in.data(), chunk * es);
      W->all_gather(buf.data() + me * chunk * es, buf.data(), chunk, t);
      EXPECT_EQ(buf, out) << label("all_gather in place", t, chunk);
    }
}

TEST(Comm, BroadcastFromEveryRoot) {
  for (int root = 0; root < W->size(); ++root)
    for (DType t : {DType::f32, DType::bf16, DType::i64})
      // 4.5M fp32 (18 MB) takes the shared-memory broadcast, the others MPI's.
      for (size_t n : {size_t(1), size_t(1000), size_t(600001), size_t(4500001)}) {
        if (n > 1000000 && t != DType::f32) continue;
        auto buf = input_of(t, W->rank(), n, 3);
        W->broadcast(buf.data(), n, t, root, "bcast");
        EXPECT_EQ(buf, input_of(t, root, n, 3)) << label("broadcast", t, n) << " root " << root;
      }
}

TEST(Comm, BarrierWaitsForTheLastRank) {
  W->barrier();
  const auto t0 = std::chrono::steady_clock::now();
  if (W->rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  W->barrier("after rank 0 slept");
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(ms, 250.0);
}

TEST(Comm, SendRecvRing) {
  const int n = W->size(), me = W->rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  // 4 MiB: beyond OpenMPI's eager limit, so each send waits for its receiver (rendezvous).
  for (size_t count : {size_t(3), size_t(1) << 20}) {
    const auto out = input_of(DType::f32, me, count, 5);
    std::vector<char> in(out.size());
    Work s = W->send_async(out.data(), count, DType::f32, next, 9, "ring");
    Work r = W->recv_async(in.data(), count, DType::f32, prev, 9, "ring");
    r.wait();
    s.wait();
    EXPECT_EQ(in, input_of(DType::f32, prev, count, 5));
  }
  // Tags keep messages apart regardless of issue order.
  int32_t a = me * 10 + 1, b = me * 10 + 2, ga = 0, gb = 0;
  Work s1 = W->send_async(&a, 1, DType::i32, next, 1);
  Work s2 = W->send_async(&b, 1, DType::i32, next, 2);
  W->recv(&gb, 1, DType::i32, prev, 2);
  W->recv(&ga, 1, DType::i32, prev, 1);
  s1.wait();
  s2.wait();
  EXPECT_EQ(ga, prev * 10 + 1);
  EXPECT_EQ(gb, prev * 10 + 2);
}

TEST(Comm, SplitFormsIndependentGroups) {
  const int me = W->rank();
  auto g = W->split(me % 2, -1);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->size(), (W->size() + 1 - me % 2) / 2);
  EXPECT_EQ(g->rank(), me / 2);
  EXPECT_EQ(g->world_rank(g->rank()), me);
  int64_t v = me, sum = 0;
  for (int r = me % 2; r < W->size(); r += 2) sum += r;
  g->all_reduce(&v, 1, DType::i64);
  EXPECT_EQ(v, sum);
  // key reverses the order
  auto rev = W->split(0, W->size() - 1 - me);
  EXPECT_EQ(rev->rank(), W->size() - 1 - me);
  int32_t x = rev->rank() == 0 ? 42 : 0;
  rev->broadcast(&x, 1, DType::i32, 0);
  EXPECT_EQ(x, 42);
  // color < 0: no group
  auto none = W->split(me == 0 ? -1 : 1, -1);
  EXPECT_EQ(none == nullptr, me == 0);
  if (none) {
    EXPECT_EQ(none->size(), W->size() - 1);
    none->barrier();
  }
  // Two groups used at once from two threads: each has its own communication thread.
  auto a = W->split(0, -1), b = W->split(0, -1);
  std::vector<float> va(100000, 1.0f), vb(100000, 2.0f);
  std::thread other([&] { b->all_reduce(vb.data(), vb.size(), DType::f32); });
  a->all_reduce(va.data(), va.size(), DType::f32);
  other.join();
  EXPECT_EQ(va[777], float(W->size()));
  EXPECT_EQ(vb[777], 2.0f * W->size());
}

TEST(Comm, StatusCheckRaisesOnEveryRank) {
  // Nobody failed: no error, and the group stays usable.
  EXPECT_NO_THROW(raise_if_any_failed(*W, "", "test work"));
  // The last rank fails: it gets its own message, every other rank one naming it.
  const int last = W->size() - 1;
  const std::string mine = W->rank() == last ? "[test] disk full on the last rank" : "";
  try {
    raise_if_any_failed(*W, mine, "writing test shards");
    ADD_FAILURE() << "every rank must throw";
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (W->rank() == last) {
      EXPECT_EQ(msg, mine);
    } else {
      EXPECT_NE(msg.find(fmt::format("writing test shards failed on rank {}", last)),
                std::string::npos)
          << msg;
    }
  }
  W->barrier();  // still in step
}

TEST(Comm, AsyncOperationsOverlapAndComplete) {
  const int n = W->size(), me = W->rank();
  const size_t count = 1 << 20;
  auto a = input_of(DType::f32, me, count, 21);
  auto rs_in = input_of(DType::bf16, me, 4096 * n, 22);
  std::vector<char> rs_out(4096 * 2);
  auto ag_in = input_of(DType::i32, me, 1000, 23);
  std::vector<char> ag_out(1000 * 4 * n);
  Work w1 = W->all_reduce_async(a.data(), count, DType::f32, ReduceOp::sum, "async 1");
  Work w2 = W->reduce_scatter_async(rs_in.data(), rs_out.data(), 4096, DType::bf16, ReduceOp::sum,
                                    "async 2");
  Work w3 = W->all_gather_async(ag_in.data(), ag_out.data(), 1000, DType::i32, "async 3");
  Work w4 = W->barrier_async("async 4");
  EXPECT_LT(w1.sequence(), w2.sequence());
  EXPECT_LT(w3.sequence(), w4.sequence());
  // Compute while they run; the handles complete on their own (test() never blocks).
  double x = 0;
  for (int i = 0; i < 2000000; ++i) x += std::sin(i * 1e-3);
  EXPECT_NE(x, 0.0);
  w4.wait();
  w3.wait();
  w2.wait();
  w1.wait();
  EXPECT_TRUE(w1.test() && w2.test() && w3.test() && w4.test());
  expect_same(DType::f32, a, expected_reduce(DType::f32, ReduceOp::sum, n, count, 21), count, true,
              "async all_reduce");
  expect_same(DType::bf16, rs_out,
              expected_reduce(DType::bf16, ReduceOp::sum, n, 4096, 22, 4096 * me), 4096,
              order_is_ours(), "async reduce_scatter");
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(std::memcmp(ag_out.data() + r * 4000, input_of(DType::i32, r, 1000, 23).data(), 4000),
              0);
}

TEST(Comm, TensorOverloads) {
  const int n = W->size(), me = W->rank();
  Tensor t = Tensor::full({4, 5}, me + 1.0, DType::bf16);
  W->all_reduce(t, ReduceOp::sum, "tensor");
  EXPECT_EQ(t.to_vector()[13], n * (n + 1) / 2.0f);

  Tensor in = Tensor::full({n * 6}, 1.0, DType::f32), out = Tensor::zeros({6});
  W->reduce_scatter(in, out);
  EXPECT_EQ(out.to_vector(), std::vector<float>(6, float(n)));

  Tensor part = Tensor::full({3}, me, DType::f16), all = Tensor::zeros({n * 3}, DType::f16);
  Work w = W->all_gather_async(part, all);  // the Work keeps both tensors alive
  part = Tensor();
  w.wait();
  EXPECT_EQ(all.to_vector()[3 * (n - 1)], float(n - 1));

  Tensor b = Tensor::full({2}, me == 0 ? 7.0 : 0.0, DType::i64);
  W->broadcast(b, 0);
  EXPECT_EQ(b.to_int_vector(), (std::vector<int64_t>{7, 7}));

  // Argument errors say what is wrong before anything is sent.
  Tensor wrong = Tensor::zeros({5});
  try {
    W->reduce_scatter(in, wrong);
    ADD_FAILURE() << "size mismatch accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[comm] reduce_scatter"), std::string::npos) << e.what();
  }
  Tensor m = Tensor::zeros({4, 4});
  Tensor view = Tensor::from_storage(m.storage(), {4, 2}, DType::f32, 0, {4, 1});
  EXPECT_THROW(W->all_reduce(view), Error);
  EXPECT_THROW(W->broadcast(t, n), Error);  // root out of range
}

// Tensors on a device (the `sim` emulator: memory the host cannot read) travel through host
// memory: inputs copied down at issue, outputs copied up inside wait() - so a tensor holds its
// result once wait() returns, and an output is untouched before (comm/group.h).
TEST(Comm, DeviceTensorsGoThroughHostMemory) {
  const int n = W->size(), me = W->rank();
  const Device sim{DeviceType::sim, 0};
  backend::get(sim);  // registers the device (core/device_registry.h)
  auto on_sim = [&](const Tensor& host) { return host.to(sim); };
  Tensor t = on_sim(Tensor::full({4, 5}, me + 1.0, DType::bf16));
  Work w = W->all_reduce_async(t, ReduceOp::sum, "device tensor");
  w.wait();
  w.wait();  // a second wait copies nothing again
  EXPECT_EQ(t.device(), sim);
  EXPECT_EQ(t.to_vector()[13], n * (n + 1) / 2.0f);

  Tensor in = on_sim(Tensor::full({n * 6}, 1.0, DType::f32)), out = on_sim(Tensor::zeros({6}));
  W->reduce_scatter(in, out);
  EXPECT_EQ(out.to_vector(), std::vector<float>(6, float(n)));
  Tensor host_out = Tensor::zeros({6});  // a device input into a host output
  W->reduce_scatter(in, host_out);
  EXPECT_EQ(host_out.to_vector(), std::vector<float>(6, float(n)));

  Tensor part = on_sim(Tensor::full({3}, me, DType::f16));
  Tensor all = on_sim(Tensor::zeros({n * 3}, DType::f16));
  Work g = W->all_gather_async(part, all);
  part = Tensor();  // the Work keeps the staging alive
  g.wait();
  EXPECT_EQ(all.to_vector()[3 * (n - 1)], float(n - 1));

  for (int root = 0; root < n; ++root) {
    Tensor r = on_sim(Tensor::full({2}, 1.0));
    W->reduce(r, root);
    EXPECT_EQ(r.to_vector()[1], me == root ? float(n) : 1.0f) << "root " << root;
  }
  Tensor b = on_sim(Tensor::full({2}, me == 0 ? 7.0 : 0.0, DType::i64));
  W->broadcast(b, 0);
  EXPECT_EQ(b.to_int_vector(), (std::vector<int64_t>{7, 7}));

  if (n > 1) {  // a ring of device tensors
    Tensor send = on_sim(Tensor::full({5}, me, DType::f32)), recv = on_sim(Tensor::zeros({5}));
    Work rw = W->recv_async(recv, (me + n - 1) % n, 5, "device ring");
    Work sw = W->send_async(send, (me + 1) % n, 5, "device ring");
    sw.wait();
    rw.wait();
    EXPECT_EQ(recv.to_vector()[4], float((me + n - 1) % n));
  }
}

TEST(Comm, CommsLoggerCountsBytes) {
  CommsLogger& log = comms_logger();
  log.reset();
  log.enable(true);
  std::vector<float> v(1024, 1.0f);
  for (int i = 0; i < 3; ++i) W->all_reduce(v.data(), v.size(), DType::f32);
  std::vector<float> out(1024 * W->size());
  W->all_gather(v.data(), out.data(), v.size(), DType::f32);
  log.enable(false);
  W->all_reduce(v.data(), v.size(), DType::f32);  // not recorded
  const auto totals = log.totals();
  ASSERT_TRUE(totals.count(OpKind::all_reduce));
  EXPECT_EQ(totals.at(OpKind::all_reduce).count, 3u);
  EXPECT_EQ(totals.at(OpKind::all_reduce).bytes, 3u * 4096);
  EXPECT_EQ(totals.at(OpKind::all_gather).bytes, 4096u * W->size());
  const std::string table = log.table();
  EXPECT_NE(table.find("all_reduce"), std::string::npos) << table;
  EXPECT_NE(table.find("4.00 KiB"), std::string::npos) << table;
  if (W->rank() == 0) std::printf("%s", table.c_str());
  log.reset();
}

// ---- the size-1 group (also what world() is without mpirun) ----

TEST(SingleProcess, EveryCollectiveIsACopyOrANoOp) {
  auto g = single_process_group();
  EXPECT_EQ(g->size(), 1);
  EXPECT_EQ(g->capabilities().backend, "single");
  std::vector<float> v = {1, 2, 3};
  g->all_reduce(v.data(), 3, DType::f32, ReduceOp::max);
  EXPECT_EQ(v, (std::vector<float>{1, 2, 3}));
  std::vector<float> out(3);
  g->reduce_scatter(v.data(), out.data(), 3, DType::f32);
  EXPECT_EQ(out, v);
  std::fill(out.begin(), out.end(), 0.0f);
  g->all_gather(v.data(), out.data(), 3, DType::f32);
  EXPECT_EQ(out, v);
  g->broadcast(v.data(), 3, DType::f32, 0);
  EXPECT_THROW(g->broadcast(v.data(), 3, DType::f32, 1), Error);
  g->barrier();
  EXPECT_TRUE(g->all_reduce_async(v.data(), 3, DType::f32).test());
  // Send to self, in either order.
  float s = 5, r = 0;
  g->send(&s, 1, DType::f32, 0, 3);
  g->recv(&r, 1, DType::f32, 0, 3);
  EXPECT_EQ(r, 5.0f);
  Work pending = g->recv_async(&r, 1, DType::f32, 0, 4);
  EXPECT_FALSE(pending.test());
  s = 6;
  g->send(&s, 1, DType::f32, 0, 4);
  pending.wait();
  EXPECT_EQ(r, 6.0f);
  // A receive nobody sends to ends at its deadline with a message.
  g->set_timeout(0.05);
  try {
    g->recv(&r, 1, DType::f32, 0, 99, "lonely");
    ADD_FAILURE() << "no timeout";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("lonely"), std::string::npos) << e.what();
  }
  auto sub = g->split(3, 0);
  ASSERT_TRUE(sub);
  EXPECT_EQ(sub->size(), 1);
  EXPECT_EQ(g->split(-1, 0), nullptr);
  Tensor t = Tensor::ones({2, 2});
  g->all_reduce(t);
  EXPECT_EQ(t.to_vector(), std::vector<float>(4, 1.0f));
}

// ---- failures: a late rank, a dead rank (plain run only: these start mpirun themselves) ----

namespace {

struct RunResult {
  int status = -1;
  double seconds = 0;
  std::string output;
};

RunResult run_job(int np, const std::string& scenario, const std::string& env) {
  const std::string cmd = fmt::format(
      "env OMPI_MCA_rmaps_base_oversubscribe=1 {} {} {} {} --oversubscribe --allow-run-as-root "
      "{} {} 2>&1",
      env, DS_MPIEXEC, DS_MPIEXEC_NUMPROC_FLAG, np, DS_COMM_WORKER, scenario);
  RunResult r;
  const auto t0 = std::chrono::steady_clock::now();
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t got;
  while ((got = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, got);
  r.status = pclose(p);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

bool contains(const std::string& s, const std::string& what) {
  return s.find(what) != std::string::npos;
}

bool failure_tests_apply() {
  return W->size() == 1 && mpi_available();
}

}  // namespace

TEST(CommFailure, LateRankIsNamedAndTheJobEnds) {
  if (!failure_tests_apply()) GTEST_SKIP() << "plain run with MPI only";
  for (int np : {2, 4}) {
    // Rank 1 sleeps 60 s at step 4; the others' deadline is 2 s.
    const RunResult r = run_job(np, "late", "DS_COMM_TIMEOUT=2 DS_COMM_ABORT_GRACE=5");
    SCOPED_TRACE(r.output);
    EXPECT_NE(r.status, 0);
    EXPECT_LT(r.seconds, 30.0) << "the job must end well before the late rank wakes up";
    EXPECT_TRUE(contains(r.output, "rank 1 did not arrive at #4")) << "np " << np;
    EXPECT_TRUE(contains(r.output, "all_reduce #4 [step 4]")) << "np " << np;
    EXPECT_TRUE(contains(r.output, "caught TimeoutError")) << "main sees the exception";
    EXPECT_FALSE(contains(r.output, "rank 1 woke up")) << "the late rank was ended";
  }
}

TEST(CommFailure, LateRankOnMpiPathIsNamedToo) {
  if (!failure_tests_apply()) GTEST_SKIP() << "plain run with MPI only";
  const RunResult r = run_job(2, "late", "DS_COMM_SHM=0 DS_COMM_TIMEOUT=2 DS_COMM_ABORT_GRACE=5");
  SCOPED_TRACE(r.output);
  EXPECT_NE(r.status, 0);
  EXPECT_LT(r.seconds, 30.0);
  EXPECT_TRUE(contains(r.output, "rank 1 did not arrive at #4"));
}

TEST(CommFailure, UncaughtTimeoutStillEndsTheJob) {
  if (!failure_tests_apply()) GTEST_SKIP() << "plain run with MPI only";
  // main() does not catch and keeps computing: the reaper aborts after the grace period.
  const RunResult r = run_job(2, "late_ignore", "DS_COMM_TIMEOUT=2 DS_COMM_ABORT_GRACE=2");
  SCOPED_TRACE(r.output);
  EXPECT_NE(r.status, 0);
  EXPECT_LT(r.seconds, 30.0);
  EXPECT_TRUE(contains(r.output, "rank 1 did not arrive at #4"));
  EXPECT_TRUE(contains(r.output, "aborting the job"));
}

TEST(CommFailure, UnmatchedRecvIsNamed) {
  if (!failure_tests_apply()) GTEST_SKIP() << "plain run with MPI only";
  const RunResult r = run_job(2, "recv", "DS_COMM_TIMEOUT=2 DS_COMM_ABORT_GRACE=5");
  SCOPED_TRACE(r.output);
  EXPECT_NE(r.status, 0);
  EXPECT_LT(r.seconds, 30.0);
  EXPECT_TRUE(contains(r.output, "recv [halo] (4 B int32 from rank 1 tag 7)"));
  EXPECT_TRUE(contains(r.output, "was not matched by a send"));
}

TEST(CommFailure, RankLeavingEarlyIsNamedAtOnce) {
  if (!failure_tests_apply()) GTEST_SKIP() << "plain run with MPI only";
  // Rank 1 returns from main (status 0) at step 4. The deadline is the default 300 s: the others
  // must notice from the arrival board that rank 1 is exiting.
  for (const char* shm : {"DS_COMM_SHM=1", "DS_COMM_SHM=0"}) {
    const RunResult r = run_job(2, "exit", std::string(shm) + " DS_COMM_TIMEOUT=300");
    SCOPED_TRACE(r.output);
    EXPECT_NE(r.status, 0);
    EXPECT_LT(r.seconds, 30.0) << shm;
    EXPECT_TRUE(contains(r.output,
                         "all_reduce #4 [step 4] (256.00 KiB fp32 sum) on group world "
                         "cannot complete: rank 1 is exiting"))
        << shm;
  }
}

TEST(CommFailure, MismatchedCollectivesAreNamed) {
  if (!failure_tests_apply()) GTEST_SKIP() << "plain run with MPI only";
  const RunResult r = run_job(2, "mismatch", "DS_COMM_TIMEOUT=300");
  SCOPED_TRACE(r.output);
  EXPECT_NE(r.status, 0);
  EXPECT_LT(r.seconds, 30.0);
  EXPECT_TRUE(contains(r.output, "collective mismatch at #3 on group world"));
  EXPECT_TRUE(contains(r.output, "all_reduce of 65536 x fp32 sum"));
  EXPECT_TRUE(contains(r.output, "all_reduce of 65535 x fp32 sum"));
}

TEST(CommFailure, KilledRankEndsTheJobWithin60s) {
  if (!failure_tests_apply()) GTEST_SKIP() << "plain run with MPI only";
  for (int np : {2, 4}) {
    // Rank 1 kills itself (SIGKILL) at step 3 while the others are inside the all_reduce. Our
    // deadline stays at its default (300 s): mpirun alone must end the job.
    const RunResult r = run_job(np, "kill", "DS_COMM_TIMEOUT=300");
    SCOPED_TRACE(r.output);
    EXPECT_NE(r.status, 0);
    EXPECT_LT(r.seconds, 60.0);
    EXPECT_TRUE(contains(r.output, "rank 1")) << "mpirun names the dead rank";
    EXPECT_TRUE(contains(r.output, "signal 9")) << "np " << np;
  }
}

// Every rank runs every test; a summary line per rank, failures from every rank, and one exit
// status for all (the worst).
int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  W = init_from_environment();
  if (W->rank() != 0) {
    // Quiet the other ranks' progress output; failures still print, prefixed by the rank.
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    struct FailurePrinter : ::testing::EmptyTestEventListener {
      int rank;
      explicit FailurePrinter(int r) : rank(r) {}
      void OnTestPartResult(const ::testing::TestPartResult& r) override {
        if (r.failed())
          std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank, r.file_name() ? r.file_name() : "?",
                       r.line_number(), r.summary());
      }
    };
    listeners.Append(new FailurePrinter(W->rank()));
  }
  int rc = RUN_ALL_TESTS();
  int32_t worst = rc;
  W->all_reduce(&worst, 1, DType::i32, ReduceOp::max, "test result");
  W.reset();
  return worst;
}

// Optimizers: parity with PyTorch / DeepSpeed formulas (fixture from tests/fixtures/generators/gen_optim_fixture.py),
// SIMD paths against the scalar path, tails and buffer guards, the fused grad scale and 16-bit
// copy, thread-count independence, the Optimizer objects (factory, hyper-parameters, checkpoint
// state and bitwise resume) and argument errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/core/error.h"
#include "ds/core/parallel.h"
#include "ds/optim/optimizer.h"

using namespace ds;
using namespace ds::optim;

namespace {

// ---- helpers ------------------------------------------------------------------------------------

std::vector<SimdPath> supported_paths() {
  std::vector<SimdPath> out;
  for (SimdPath p : {SimdPath::scalar, SimdPath::avx2, SimdPath::avx512})
    if (simd_path_supported(p)) out.push_back(p);
  return out;
}

// Restores the process-wide SIMD path and thread count when a test ends.
struct PathGuard {
  SimdPath saved = simd_path();
  int threads = num_threads();
  ~PathGuard() {
    set_simd_path(saved);
    set_num_threads(threads);
  }
};

std::vector<float> random_vec(int64_t n, uint32_t seed, float scale, float offset = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = offset + scale * d(rng);
  return v;
}

std::vector<float> positive_vec(int64_t n, uint32_t seed, float scale) {
  auto v = random_vec(n, seed, scale);
  for (auto& x : v) x = x * x;
  return v;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

int64_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return static_cast<int64_t>(i);
  return -1;
}

// One optimizer's complete state for the elementwise kernels, with guard values on both sides of
// every buffer: a kernel that writes outside [0, n) changes a guard (ggml's test-backend-ops).
constexpr int64_t kGuard = 40;
constexpr float kGuardValue = -12345.0f;
constexpr uint16_t kGuard16 = 0xBEEF;

struct Buffers {
  int64_t n;
  std::vector<float> p, g, m, v;  // each (kGuard + n + kGuard)
  std::vector<uint16_t> out16;

  Buffers(int64_t n_, uint32_t seed) : n(n_) {
    auto wrap = [&](std::vector<float> x) {
      std::vector<float> w(static_cast<size_t>(n + 2 * kGuard), kGuardValue);
      std::copy(x.begin(), x.end(), w.begin() + kGuard);
      return w;
    };
    p = wrap(random_vec(n, seed, 0.5f));
    g = wrap(random_vec(n, seed + 1, 0.1f));
    m = wrap(random_vec(n, seed + 2, 0.01f));
    v = wrap(positive_vec(n, seed + 3, 0.01f));
    out16.assign(static_cast<size_t>(n + 2 * kGuard), kGuard16);
  }
  float* P() { return p.data() + kGuard; }
  float* G() { return g.data() + kGuard; }
  float* M() { return m.data() + kGuard; }
  float* V() { return v.data() + kGuard; }
  uint16_t* O() { return out16.data() + kGuard; }
  void expect_guards_intact() const {
    for (const auto* buf : {&p, &g, &m, &v})
      for (int64_t i = 0; i < kGuard; ++i) {
        ASSERT_EQ((*buf)[static_cast<size_t>(i)], kGuardValue) << "write before the buffer";
        ASSERT_EQ((*buf)[static_cast<size_t>(n + kGuard + i)], kGuardValue) << "write past the end";
      }
    for (int64_t i = 0; i < kGuard; ++i) {
      ASSERT_EQ(out16[static_cast<size_t>(i)], kGuard16);
      ASSERT_EQ(out16[static_cast<size_t>(n + kGuard + i)], kGuard16);
    }
  }
};

AdamConfig adam_cfg(bool adamw, bool bias_correction = true) {
  AdamConfig c;
  c.lr = 0.01f;
  c.beta1 = 0.85f;
  c.beta2 = 0.995f;
  c.eps = 1e-7f;
  c.weight_decay = 0.05f;
  c.adam_w_mode = adamw;
  c.bias_correction = bias_correction;
  return c;
}

// ---- fixture ------------------------------------------------------------------------------------

nlohmann::json load_fixture() {
  const std::string path = std::string(DS_FIXTURE_DIR) + "/optim/optim_parity.json";
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot open " + path + "; run tests/fixtures/generators/gen_optim_fixture.py");
  return nlohmann::json::parse(f);
}

std::vector<float> to_floats(const nlohmann::json& a) {
  std::vector<float> out;
  out.reserve(a.size());
  for (const auto& x : a) out.push_back(static_cast<float>(x.get<double>()));
  return out;
}

std::unique_ptr<Optimizer> optimizer_for_case(const nlohmann::json& c) {
  const auto& k = c["config"];
  OptimizerParams p;
  p.lr = k["lr"].get<float>();
  p.weight_decay = k["weight_decay"].get<float>();
  if (k.contains("betas")) {
    p.beta1 = k["betas"][0].get<float>();
    p.beta2 = k["betas"][1].get<float>();
  }
  p.eps = k.value("eps", 1e-8f);
  p.bias_correction = k.value("bias_correction", true);
  p.adam_w_mode = k.value("adam_w_mode", true);
  p.max_coeff = k.value("max_coeff", 10.0f);
  p.min_coeff = k.value("min_coeff", 0.01f);
  p.eps_inside_sqrt = k.value("eps_inside_sqrt", false);
  p.lamb_legacy_bias_correction = k.value("legacy_bias_correction", false);
  p.momentum = k.value("momentum", 0.0f);
  p.dampening = k.value("dampening", 0.0f);
  p.nesterov = k.value("nesterov", false);
  return make_optimizer(c["optimizer"].get<std::string>(), p);
}

// Tolerance against the float64 reference: |got - want| <= 1e-5 * |want| + atol. The kernels
// compute in float32 (each operation rounds at 6e-8 relative) and ten steps compound that to
// ~1e-6 relative at worst, so 1e-5 leaves a 10x margin while any formula slip (a missing bias
// correction, decay applied after the update, the wrong eps placement, a float hyper-parameter
// rounded differently) shows as >= 1e-4. atol covers values that cancel to near zero, where the
// relative error is meaningless: it is about one float32 ulp (6e-8 relative) of the terms summed
// into that value: ~0.1 for parameters and Adam's first moment, ~1e-4 for the second moment, ~1
// for SGD's momentum buffer (it sums up to 1 / (1 - momentum) = 10 gradients of ~0.1).
constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-8;
constexpr double kAtolSecondMoment = 1e-11;
constexpr double kAtolMomentumBuffer = 1e-7;

void expect_close(const std::vector<float>& got, const nlohmann::json& want,
                  const std::string& what, double atol = kAtol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  int64_t worst_i = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double w = want[i].get<double>();
    const double err = std::abs(got[i] - w) / (kRtol * std::abs(w) + atol);
    if (err > worst) worst = err, worst_i = static_cast<int64_t>(i);
  }
  // DS_OPTIM_PRINT_ERR=1 prints each comparison's worst error in tolerance units (1.0 = limit):
  // the margins the tolerances leave.
  if (std::getenv("DS_OPTIM_PRINT_ERR")) std::printf("%-50s worst %.3f\n", what.c_str(), worst);
  EXPECT_LE(worst, 1.0) << what << ": element " << worst_i << " got " << got[worst_i] << " want "
                        << want[worst_i].get<double>();
}

void run_fixture_case(const nlohmann::json& fx, const nlohmann::json& c) {
  const std::vector<float> init = to_floats(fx["init_params"]);
  const int64_t n = static_cast<int64_t>(init.size());
  std::vector<Segment> segs;
  for (const auto& s : fx["segments"]) segs.push_back({s[0].get<int64_t>(), s[1].get<int64_t>()});
  auto opt = optimizer_for_case(c);
  opt->set_segments(segs);
  const float base_lr = c["config"]["lr"].get<float>();
  const float grad_scale = c["grad_scale"].get<float>();
  std::vector<float> p = init;
  const std::string name = c["name"].get<std::string>();
  for (int step = 0; step < fx["steps"].get<int>(); ++step) {
    const std::vector<float> g = to_floats(fx["grads"][step]);
    opt->set_lr(static_cast<float>(base_lr * (1.0 - 0.05 * step)));  // the fixture's schedule
    opt->step(p.data(), g.data(), n, grad_scale);
    expect_close(p, c["expected_params"][step],
                 name + " params after step " + std::to_string(step + 1));
    if (c.contains("expected_lamb_coeffs")) {
      const auto& coeffs = static_cast<Lamb&>(*opt).lamb_coeffs();
      expect_close(coeffs, c["expected_lamb_coeffs"][step], name + " trust ratios");
    }
  }
  EXPECT_EQ(opt->step_count(), fx["steps"].get<int64_t>());
  if (c.contains("expected_state")) {
    for (const StateBuffer& b : opt->state_buffers()) {
      ASSERT_TRUE(c["expected_state"].contains(b.name)) << name << " has no " << b.name;
      expect_close(std::vector<float>(b.data, b.data + b.numel), c["expected_state"][b.name],
                   name + " " + b.name,
                   b.name == "exp_avg_sq"        ? kAtolSecondMoment
                   : b.name == "momentum_buffer" ? kAtolMomentumBuffer
                                                 : kAtol);
    }
  }
}

}  // namespace

// ---- parity with the reference ------------------------------------------------------------------

TEST(OptimParity, EveryFixtureCaseOnEverySimdPath) {
  PathGuard guard;
  const nlohmann::json fx = load_fixture();
  ASSERT_GE(fx["cases"].size(), 7u);
  for (SimdPath path : supported_paths()) {
    set_simd_path(path);
    for (const auto& c : fx["cases"]) {
      SCOPED_TRACE(std::string(simd_path_name(path)) + " " + c["name"].get<std::string>());
      run_fixture_case(fx, c);
    }
  }
}

// ---- SIMD paths against the scalar path ---------------------------------------------------------

// Every path performs the same IEEE-rounded operations (mul, fma, sqrt, div) in the same order, so
// the vector paths must equal the scalar path bit for bit; this also covers the vector tails
// (handled by the scalar code) and the guards around each buffer.
TEST(OptimSimd, AdamAndSgdPathsAreBitwiseEqualToScalar) {
  PathGuard guard;
  const std::vector<int64_t> sizes = {1, 7, 8, 9, 15, 16, 17, 31, 33, 100, kTileElems + 5, 1000003};
  for (int64_t n : sizes) {
    for (int variant = 0; variant < 6; ++variant) {
      SCOPED_TRACE("n=" + std::to_string(n) + " variant=" + std::to_string(variant));
      std::vector<Buffers> results;
      for (SimdPath path : supported_paths()) {
        set_simd_path(path);
        Buffers b(n, 42);
        for (int64_t step = 1; step <= 3; ++step) {
          const DType d16 = variant % 2 ? DType::f16 : DType::bf16;
          if (variant < 3) {
            adam_update(b.P(), b.G(), b.M(), b.V(), n, step, adam_cfg(variant != 1, variant != 2),
                        0.75f, b.O(), d16);
          } else {
            SgdConfig c;
            c.lr = 0.05f;
            c.momentum = 0.9f;
            c.weight_decay = 0.01f;
            c.nesterov = variant == 3;
            c.dampening = variant == 4 ? 0.2f : 0.0f;
            if (variant == 5) c.momentum = 0.0f;  // plain SGD: buffer untouched
            sgd_update(b.P(), b.G(), b.M(), n, step == 1, c, 0.75f, b.O(), d16);
          }
        }
        b.expect_guards_intact();
        results.push_back(std::move(b));
      }
      for (size_t r = 1; r < results.size(); ++r) {
        EXPECT_EQ(first_difference(results[r].p, results[0].p), -1) << "params differ";
        EXPECT_EQ(first_difference(results[r].m, results[0].m), -1) << "m / momentum differ";
        EXPECT_EQ(first_difference(results[r].v, results[0].v), -1) << "v differs";
        EXPECT_TRUE(results[r].out16 == results[0].out16) << "16-bit copy differs";
      }
    }
  }
}

TEST(OptimSimd, AvailablePathsAndNames) {
  EXPECT_TRUE(simd_path_supported(SimdPath::scalar));
  EXPECT_STREQ(simd_path_name(SimdPath::avx512), "avx512");
  EXPECT_TRUE(simd_path_supported(best_simd_path()));
  // The library is built for x86-64-v3, so AVX2 is always there where it runs.
  EXPECT_TRUE(simd_path_supported(SimdPath::avx2));
  if (!simd_path_supported(SimdPath::avx512))
    EXPECT_THROW(set_simd_path(SimdPath::avx512), ds::Error);
  std::printf("best SIMD path here: %s\n", simd_path_name(best_simd_path()));
}

// ---- fused gradient scale and 16-bit copy -------------------------------------------------------

TEST(OptimFused, GradScaleEqualsPrescaledGradients) {
  PathGuard guard;
  const int64_t n = 4099;
  for (SimdPath path : supported_paths()) {
    set_simd_path(path);
    for (float scale : {1.0f / 3.0f, 1.0f / 65536.0f, 0.7f}) {
      Buffers a(n, 7), b(n, 7);
      for (int64_t i = 0; i < n; ++i) b.G()[i] = a.G()[i] * scale;  // the same float multiply
      adam_update(a.P(), a.G(), a.M(), a.V(), n, 5, adam_cfg(false), scale);
      adam_update(b.P(), b.G(), b.M(), b.V(), n, 5, adam_cfg(false), 1.0f);
      EXPECT_TRUE(bitwise_equal(a.p, b.p) && bitwise_equal(a.m, b.m) && bitwise_equal(a.v, b.v))
          << simd_path_name(path) << " Adam, scale " << scale;
      SgdConfig sc;
      sc.lr = 0.1f;
      sc.momentum = 0.9f;
      sc.weight_decay = 0.01f;
      sgd_update(a.P(), a.G(), a.M(), n, false, sc, scale);
      sgd_update(b.P(), b.G(), b.M(), n, false, sc, 1.0f);
      EXPECT_TRUE(bitwise_equal(a.p, b.p) && bitwise_equal(a.m, b.m)) << "SGD, scale " << scale;
      LambConfig lc;
      lc.weight_decay = 0.01f;
      lamb_update(a.P(), a.G(), a.M(), a.V(), n, {}, 3, lc, scale);
      lamb_update(b.P(), b.G(), b.M(), b.V(), n, {}, 3, lc, 1.0f);
      EXPECT_TRUE(bitwise_equal(a.p, b.p) && bitwise_equal(a.m, b.m)) << "Lamb, scale " << scale;
    }
  }
}

TEST(OptimFused, Out16IsTheRoundedUpdatedParameter) {
  PathGuard guard;
  const int64_t n = 1037;
  for (SimdPath path : supported_paths()) {
    set_simd_path(path);
    for (DType dt : {DType::bf16, DType::f16}) {
      SCOPED_TRACE(std::string(simd_path_name(path)) + " " + dtype_name(dt));
      auto to16 = [&](float x) { return dt == DType::bf16 ? float_to_bf16(x) : float_to_f16(x); };
      Buffers b(n, 3);
      adam_update(b.P(), b.G(), b.M(), b.V(), n, 1, adam_cfg(true), 1.0f, b.O(), dt);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(b.O()[i], to16(b.P()[i])) << "Adam, element " << i;
      SgdConfig sc;
      sc.lr = 0.1f;
      sgd_update(b.P(), b.G(), nullptr, n, true, sc, 1.0f, b.O(), dt);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(b.O()[i], to16(b.P()[i])) << "SGD, element " << i;
      lamb_update(b.P(), b.G(), b.M(), b.V(), n, {}, 2, LambConfig{}, 1.0f, b.O(), dt);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(b.O()[i], to16(b.P()[i])) << "Lamb, element " << i;
      b.expect_guards_intact();
    }
  }
}

// With lr = 0 and no decay the parameters stay exactly as given, so the 16-bit copy shows the
// vector paths' rounding on hand-picked values: ties to even, fp16 subnormals and overflow, NaN.
TEST(OptimFused, Out16RoundingOfSpecialValues) {
  PathGuard guard;
  std::vector<float> vals = {1.0f + 0x1.0p-8f,
                             1.0f + 3 * 0x1.0p-8f,
                             1.0f + 0x1.8p-8f,
                             -(1.0f + 0x1.0p-8f),
                             1.0f + 0x1.0p-11f,
                             1.0f + 3 * 0x1.0p-11f,
                             65504.0f,
                             65519.0f,
                             65520.0f,
                             1e30f,
                             -1e30f,
                             0x1.0p-24f,
                             0x1.0p-25f,
                             0x1.8p-25f,
                             3e-7f,
                             -3e-7f,
                             0.0f,
                             -0.0f,
                             INFINITY,
                             -INFINITY,
                             std::numeric_limits<float>::quiet_NaN(),
                             3.14159f,
                             -2.71828f,
                             1e-40f};
  while (vals.size() < 64) vals.push_back(std::ldexp(1.2345f, static_cast<int>(vals.size()) - 40));
  const int64_t n = static_cast<int64_t>(vals.size());
  for (SimdPath path : supported_paths()) {
    set_simd_path(path);
    for (DType dt : {DType::bf16, DType::f16}) {
      std::vector<float> p = vals, g(vals.size(), 0.5f), m(vals.size(), 0.0f), v(vals.size(), 0.0f);
      std::vector<uint16_t> out(vals.size());
      AdamConfig c;
      c.lr = 0.0f;
      adam_update(p.data(), g.data(), m.data(), v.data(), n, 1, c, 1.0f, out.data(), dt);
      for (int64_t i = 0; i < n; ++i) {
        const float x = vals[static_cast<size_t>(i)];
        if (std::isnan(x)) {  // fp16 NaN payloads differ between F16C and the scalar code
          EXPECT_TRUE(std::isnan(dt == DType::bf16 ? bf16_to_float(out[i]) : f16_to_float(out[i])));
          continue;
        }
        const uint16_t want = dt == DType::bf16 ? float_to_bf16(x) : float_to_f16(x);
        EXPECT_EQ(out[static_cast<size_t>(i)], want)
            << simd_path_name(path) << " " << dtype_name(dt) << " value " << x;
      }
    }
  }
}

// ---- threads ------------------------------------------------------------------------------------

TEST(OptimThreads, ResultsDoNotDependOnTheThreadCount) {
  PathGuard guard;
  const int64_t n = 7 * kTileElems + 123;
  std::vector<Segment> segs = {{0, 3 * kTileElems + 7},
                               {3 * kTileElems + 7, 100},
                               {3 * kTileElems + 200, n - 3 * kTileElems - 250}};
  std::vector<std::vector<float>> ref;
  for (int threads : {1, 2, 3, 5}) {
    set_num_threads(threads);
    Buffers a(n, 11), s(n, 12), l(n, 13);
    for (int64_t step = 1; step <= 2; ++step) {
      adam_update(a.P(), a.G(), a.M(), a.V(), n, step, adam_cfg(true), 0.5f, a.O(), DType::bf16);
      SgdConfig sc;
      sc.lr = 0.1f;
      sc.momentum = 0.9f;
      sgd_update(s.P(), s.G(), s.M(), n, step == 1, sc);
      LambConfig lc;
      lc.weight_decay = 0.01f;
      lamb_update(l.P(), l.G(), l.M(), l.V(), n, segs, step, lc);
    }
    std::vector<std::vector<float>> got = {a.p, a.m, a.v, s.p, s.m, l.p, l.m, l.v};
    if (ref.empty())
      ref = got;
    else
      for (size_t k = 0; k < got.size(); ++k)
        EXPECT_EQ(first_difference(got[k], ref[k]), -1)
            << "buffer " << k << ", threads " << threads;
  }
}

// ---- Lamb ---------------------------------------------------------------------------------------

// Under ZeRO a tensor can straddle two ranks' partitions: each rank runs phase 1 on its part, the
// per-segment sums are added over ranks, and phase 2 applies the common trust ratio. The result
// must match one process holding everything (up to the order of the norm sums).
TEST(OptimLamb, TwoPartitionsWithSummedNormsMatchOneBuffer) {
  const int64_t n = 5000, half = 2600;
  LambConfig c;
  c.lr = 0.02f;
  c.weight_decay = 0.01f;
  Buffers whole(n, 21), split(n, 21);
  const std::vector<Segment> segs = {{0, 1000}, {1000, 3000}, {4000, 1000}};  // 2nd straddles
  // The same three segments as each rank sees them, relative to its partition.
  const std::vector<Segment> seg_a = {{0, 1000}, {1000, 1600}, {2600, 0}};
  const std::vector<Segment> seg_b = {{0, 0}, {0, 1400}, {1400, 1000}};
  for (int64_t step = 1; step <= 3; ++step) {
    std::vector<float> coeffs(3);
    lamb_update(whole.P(), whole.G(), whole.M(), whole.V(), n, segs, step, c, 1.0f, nullptr,
                DType::bf16, coeffs.data());
    double wa[3], ua[3], wb[3], ub[3];
    lamb_moments(split.P(), split.G(), split.M(), split.V(), half, seg_a, step, c, 1.0f, wa, ua);
    lamb_moments(split.P() + half, split.G() + half, split.M() + half, split.V() + half, n - half,
                 seg_b, step, c, 1.0f, wb, ub);
    float k[3];
    for (int s = 0; s < 3; ++s) {
      k[s] = lamb_trust_ratio(wa[s] + wb[s], ua[s] + ub[s], c);
      EXPECT_NEAR(k[s], coeffs[s], 1e-6 * coeffs[s]);
    }
    lamb_apply(split.P(), split.M(), split.V(), half, seg_a, step, c, k);
    lamb_apply(split.P() + half, split.M() + half, split.V() + half, n - half, seg_b, step, c, k);
  }
  for (int64_t i = 0; i < n; ++i)
    ASSERT_NEAR(split.P()[i], whole.P()[i], 1e-6 * std::abs(whole.P()[i]) + 1e-9) << i;
}

TEST(OptimLamb, UncoveredElementsAreUntouchedAndZeroNormsGiveRatioOne) {
  const int64_t n = 100;
  Buffers b(n, 5);
  const std::vector<float> before(b.P(), b.P() + n);
  const std::vector<Segment> segs = {{10, 20}, {50, 30}};
  lamb_update(b.P(), b.G(), b.M(), b.V(), n, segs, 1, LambConfig{});
  for (int64_t i : {0, 9, 30, 49, 80, 99}) EXPECT_EQ(b.P()[i], before[static_cast<size_t>(i)]) << i;
  EXPECT_NE(b.P()[10], before[10]);
  EXPECT_EQ(lamb_trust_ratio(0.0, 4.0, LambConfig{}), 1.0f);
  EXPECT_EQ(lamb_trust_ratio(4.0, 0.0, LambConfig{}), 1.0f);
  EXPECT_EQ(lamb_trust_ratio(1e6, 1.0, LambConfig{}), 10.0f);
  EXPECT_FLOAT_EQ(lamb_trust_ratio(1e-8, 1.0, LambConfig{}), 0.01f);
  EXPECT_FLOAT_EQ(lamb_trust_ratio(4.0, 1.0, LambConfig{}), 2.0f);
}

// ---- Optimizer objects --------------------------------------------------------------------------

TEST(OptimObject, FactoryNamesAndAdamModes) {
  EXPECT_STREQ(make_optimizer("adam")->name(), "Adam");
  EXPECT_STREQ(make_optimizer("ADAMW")->name(), "AdamW");
  EXPECT_STREQ(make_optimizer("Lamb")->name(), "Lamb");
  EXPECT_STREQ(make_optimizer("sgd")->name(), "SGD");
  try {
    make_optimizer("Lion");
    FAIL() << "expected an error";
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("[optim]"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("AdamW"), std::string::npos);  // lists what exists
  }
  OptimizerParams p;
  p.adam_w_mode = false;
  p.weight_decay = 0.1f;
  auto adam = make_optimizer("Adam", p);
  auto adamw = make_optimizer("AdamW", p);  // AdamW decouples whatever adam_w_mode says
  EXPECT_FALSE(static_cast<Adam&>(*adam).config().adam_w_mode);
  EXPECT_TRUE(static_cast<Adam&>(*adamw).config().adam_w_mode);
  EXPECT_TRUE(
      static_cast<Adam&>(*make_optimizer("Adam")).config().adam_w_mode);  // DeepSpeed default

  // The object's step is adam_update with the object's state.
  Buffers a(300, 9), b(300, 9);
  adam->step(a.P(), a.G(), 300, 0.5f);
  adam->step(a.P(), a.G(), 300, 0.5f);
  AdamConfig c = static_cast<Adam&>(*adam).config();
  std::vector<float> m(300, 0.0f), v(300, 0.0f);
  adam_update(b.P(), b.G(), m.data(), v.data(), 300, 1, c, 0.5f);
  adam_update(b.P(), b.G(), m.data(), v.data(), 300, 2, c, 0.5f);
  EXPECT_TRUE(bitwise_equal(a.p, b.p));
  EXPECT_EQ(adam->step_count(), 2);
}

TEST(OptimObject, StateBuffersAreAlignedZeroedAndNamed) {
  auto adam = make_optimizer("AdamW");
  EXPECT_TRUE(adam->state_buffers().empty());  // nothing before init_state
  adam->init_state(12345);
  adam->init_state(12345);  // idempotent
  EXPECT_THROW(adam->init_state(100), ds::Error);
  auto bufs = adam->state_buffers();
  ASSERT_EQ(bufs.size(), 2u);
  EXPECT_EQ(bufs[0].name, "exp_avg");
  EXPECT_EQ(bufs[1].name, "exp_avg_sq");
  for (const auto& b : bufs) {
    EXPECT_EQ(b.numel, 12345);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data) % 64, 0u);
    for (int64_t i = 0; i < b.numel; ++i) ASSERT_EQ(b.data[i], 0.0f);
  }
  EXPECT_EQ(adam->state_floats_per_param(), 2);

  OptimizerParams sp;
  auto sgd = make_optimizer("SGD", sp);  // momentum 0: no state
  sgd->init_state(10);
  EXPECT_TRUE(sgd->state_buffers().empty());
  EXPECT_EQ(sgd->state_floats_per_param(), 0);
  sgd->set_momentum(0.9f);  // OneCycle turning momentum on: the buffer appears
  ASSERT_EQ(sgd->state_buffers().size(), 1u);
  EXPECT_EQ(sgd->state_buffers()[0].name, "momentum_buffer");
  EXPECT_THROW(sgd->betas(), ds::Error);
}

// What zero::Strategy::step_16bit_gradients relies on: begin_step() and step_slice() over chunks
// of the optimizer's own state buffers, with each chunk's 16-bit gradients widened, give step()
// over the whole widened gradients bit for bit (parameters, moments and the rounded bf16 copy),
// here for AdamW over three steps and a length that is not a multiple of the chunk.
TEST(OptimObject, ChunkedStepsOverItsOwnStateEqualOneWholeStep) {
  const int64_t n = 600001, chunk = int64_t{1} << 18;
  std::vector<float> p0(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p0[static_cast<size_t>(i)] = std::sin(0.001 * i);
  std::vector<float> pa = p0, pb = p0;
  std::vector<uint16_t> out_a(static_cast<size_t>(n)), out_b(static_cast<size_t>(n));
  OptimizerParams hp;
  hp.lr = 1e-2f;
  hp.weight_decay = 0.1f;
  auto a = make_optimizer("AdamW", hp), b = make_optimizer("AdamW", hp);
  a->init_state(n);
  b->init_state(n);
  for (int step = 0; step < 3; ++step) {
    std::vector<uint16_t> g16(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      g16[static_cast<size_t>(i)] =
          float_to_bf16(static_cast<float>(std::cos(0.0007 * i * (step + 1))));
    std::vector<float> g32(static_cast<size_t>(n));
    convert(g16.data(), DType::bf16, g32.data(), DType::f32, g32.size());
    a->step(pa.data(), g32.data(), n, 0.5f, out_a.data(), DType::bf16);
    const auto states = b->state_buffers();
    std::vector<float*> at(states.size());
    std::vector<float> chunk32(static_cast<size_t>(chunk));
    b->begin_step();
    for (int64_t off = 0; off < n; off += chunk) {
      const int64_t len = std::min(chunk, n - off);
      convert(g16.data() + off, DType::bf16, chunk32.data(), DType::f32, static_cast<size_t>(len));
      for (size_t k = 0; k < states.size(); ++k) at[k] = states[k].data + off;
      b->step_slice(pb.data() + off, chunk32.data(), at.data(), len, 0.5f, out_b.data() + off,
                    DType::bf16);
    }
  }
  EXPECT_EQ(a->step_count(), b->step_count());
  EXPECT_EQ(0, std::memcmp(pa.data(), pb.data(), pa.size() * sizeof(float)));
  EXPECT_EQ(out_a, out_b);
  const auto sa = a->state_buffers(), sb = b->state_buffers();
  for (size_t k = 0; k < sa.size(); ++k)
    EXPECT_EQ(0, std::memcmp(sa[k].data, sb[k].data, static_cast<size_t>(n) * sizeof(float)))
        << sa[k].name;
}

TEST(OptimObject, HyperParametersForSchedulers) {
  auto adam = make_optimizer("Adam");
  adam->set_lr(0.5f);
  EXPECT_EQ(adam->lr(), 0.5f);
  adam->set_momentum(0.8f);  // OneCycle's cycle_momentum sets beta1
  EXPECT_EQ(adam->betas().first, 0.8f);
  EXPECT_EQ(adam->betas().second, 0.999f);
  adam->set_betas(0.7f, 0.95f);
  EXPECT_EQ(adam->momentum(), 0.7f);
  EXPECT_THROW(adam->set_lr(-1.0f), ds::Error);
  EXPECT_THROW(adam->set_betas(1.0f, 0.9f), ds::Error);
  EXPECT_EQ(adam->lr(), 0.5f);  // a rejected value changes nothing
  auto sgd = make_optimizer("sgd");
  sgd->set_momentum(0.9f);
  EXPECT_EQ(sgd->momentum(), 0.9f);
}

// llm.c's rule: training continued from a checkpoint is bitwise identical to training that never
// stopped. Save after 4 steps (buffers + scalars), load into a fresh optimizer, run 4 more.
TEST(OptimObject, CheckpointResumeIsBitwise) {
  const int64_t n = 2000;
  for (const char* type : {"AdamW", "Lamb", "SGD"}) {
    SCOPED_TRACE(type);
    OptimizerParams p;
    p.lr = 0.01f;
    p.weight_decay = 0.01f;
    p.momentum = 0.9f;
    const std::vector<Segment> segs = {{0, 1500}, {1500, 500}};
    auto straight = make_optimizer(type, p);
    straight->set_segments(segs);
    Buffers a(n, 31), b(n, 31);
    for (int s = 0; s < 8; ++s) {
      straight->set_lr(0.01f * (1 + s));
      straight->step(a.P(), a.G(), n);
    }
    auto first = make_optimizer(type, p);
    first->set_segments(segs);
    for (int s = 0; s < 4; ++s) {
      first->set_lr(0.01f * (1 + s));
      first->step(b.P(), b.G(), n);
    }
    // "checkpoint"
    std::map<std::string, std::vector<float>> saved;
    for (const auto& sb : first->state_buffers())
      saved[sb.name] = std::vector<float>(sb.data, sb.data + sb.numel);
    const auto scalars = first->scalar_state();
    EXPECT_EQ(scalars.at("step"), 4.0);
    first.reset();
    // "resume"
    auto second = make_optimizer(type, p);
    second->set_segments(segs);
    second->init_state(n);
    for (const auto& sb : second->state_buffers()) {
      ASSERT_TRUE(saved.count(sb.name)) << sb.name;
      std::copy(saved[sb.name].begin(), saved[sb.name].end(), sb.data);
    }
    second->load_scalar_state(scalars);
    EXPECT_EQ(second->step_count(), 4);
    for (int s = 4; s < 8; ++s) {
      second->set_lr(0.01f * (1 + s));
      second->step(b.P(), b.G(), n);
    }
    EXPECT_TRUE(bitwise_equal(a.p, b.p));
  }
  auto adam = make_optimizer("Adam");
  EXPECT_THROW(adam->load_scalar_state({{"stepp", 3.0}}), ds::Error);
  EXPECT_THROW(adam->load_scalar_state({{"step", -1.0}}), ds::Error);
}

TEST(OptimObject, SgdMomentumStartsFromTheFirstGradient) {
  // torch: the first momentum step sets buf = g (no dampening), later steps damp.
  const int64_t n = 3;
  std::vector<float> p = {1, 2, 3}, g = {0.5f, -1.0f, 2.0f};
  OptimizerParams o;
  o.lr = 0.1f;
  o.momentum = 0.9f;
  o.dampening = 0.5f;
  auto sgd = make_optimizer("SGD", o);
  sgd->step(p.data(), g.data(), n);
  EXPECT_FLOAT_EQ(p[0], 1.0f - 0.1f * 0.5f);
  sgd->step(p.data(), g.data(), n);
  EXPECT_FLOAT_EQ(p[0], 0.95f - 0.1f * (0.9f * 0.5f + 0.5f * 0.5f));
}

// ---- argument errors ----------------------------------------------------------------------------

TEST(OptimErrors, BadArgumentsThrowTaggedErrors) {
  Buffers b(10, 1);
  auto expect_optim_error = [](auto&& fn) {
    try {
      fn();
      ADD_FAILURE() << "expected ds::Error";
    } catch (const ds::Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("[optim]", 0), 0u) << e.what();
    }
  };
  expect_optim_error([&] { adam_update(b.P(), b.G(), b.M(), b.V(), 10, 0, AdamConfig{}); });
  expect_optim_error([&] {
    adam_update(b.P(), b.G(), b.M(), b.V(), 10, 1, AdamConfig{}, 1.0f, b.O(), DType::f32);
  });
  expect_optim_error([&] { adam_update(b.P(), nullptr, b.M(), b.V(), 10, 1, AdamConfig{}); });
  expect_optim_error([&] {
    SgdConfig c;
    c.nesterov = true;  // without momentum
    sgd_update(b.P(), b.G(), b.M(), 10, true, c);
  });
  expect_optim_error([&] {
    SgdConfig c;
    c.momentum = 0.9f;
    sgd_update(b.P(), b.G(), nullptr, 10, true, c);
  });
  expect_optim_error([&] {
    const std::vector<Segment> overlapping = {{0, 6}, {5, 5}};
    lamb_update(b.P(), b.G(), b.M(), b.V(), 10, overlapping, 1, LambConfig{});
  });
  expect_optim_error([&] {
    const std::vector<Segment> outside = {{0, 11}};
    lamb_update(b.P(), b.G(), b.M(), b.V(), 10, outside, 1, LambConfig{});
  });
  expect_optim_error([&] {
    LambConfig c;
    c.min_coeff = 2.0f;
    c.max_coeff = 1.0f;
    Lamb l(c);
  });
  // A rejected step leaves the step count alone.
  auto adam = make_optimizer("Adam");
  EXPECT_THROW(adam->step(b.P(), b.G(), 10, 1.0f, b.O(), DType::i32), ds::Error);
  EXPECT_EQ(adam->step_count(), 0);
  // n == 0 is a no-op, not an error.
  adam_update(nullptr, nullptr, nullptr, nullptr, 0, 1, AdamConfig{});
}

// The optimizer's state lives where its StateHome puts it (the seam offload plugs into).
TEST(OptimStateHome, BuffersComeFromTheHome) {
  struct CountingHome final : ds::optim::StateHome {
    int64_t live = 0, allocations = 0;
    float* allocate(int64_t n) override {
      ++allocations;
      live += n;
      return static_cast<float*>(std::calloc(static_cast<size_t>(n), sizeof(float)));
    }
    void release(float* p, int64_t n) override {
      live -= n;
      std::free(p);
    }
  };
  auto home = std::make_shared<CountingHome>();
  {
    auto opt = ds::optim::make_optimizer("AdamW", {.lr = 1e-3f});
    opt->set_state_home(home);
    opt->init_state(1000);
    EXPECT_EQ(home->allocations, 2);  // exp_avg, exp_avg_sq
    EXPECT_EQ(home->live, 2000);
    std::vector<float> p(1000, 1.0f), g(1000, 0.5f);
    opt->step(p.data(), g.data(), 1000);
    for (const auto& sb : opt->state_buffers()) EXPECT_NE(sb.data[0], 0.0f) << sb.name;
    EXPECT_THROW(opt->set_state_home(home), ds::Error);  // too late: the state exists
  }
  EXPECT_EQ(home->live, 0);  // released into the same home
}

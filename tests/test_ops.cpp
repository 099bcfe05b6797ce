// Forward values of the neural-network ops on every backend (tests/devices.h) against
// straightforward double-precision references written here; dropout's reproducibility contract;
// 16-bit inputs. Two groups stay CPU-only because they test the CPU backend itself: the accuracy of
// its fast_math approximations (FastMathCpu) and the thread-count independence of its kernels
// (OpsCpu).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/fast_math.h"
#include "ds/backend/backend.h"
#include "ds/core/allocator.h"
#include "ds/core/error.h"
#include "ds/core/parallel.h"
#include "ds/core/rng.h"
#include "ds/ops/ops.h"
#include "ds/optim/kernels.h"
#include "gradcheck.h"

using namespace ds;
using ds::testing::host_vector;
using ds::testing::to_host;

namespace {

// |got - want| <= atol + rtol |want| for every element.
void expect_close(const std::vector<float>& got, const std::vector<double>& want, double atol,
                  double rtol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], atol + rtol * std::abs(want[i])) << what << " element " << i;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ds::Error& e) {
    return e.what();
  }
  return "";
}

struct ThreadCount {  // restores the thread count on scope exit
  int saved = ds::num_threads();
  explicit ThreadCount(int n) { ds::set_num_threads(n); }
  ~ThreadCount() { ds::set_num_threads(saved); }
};

}  // namespace

// ---- fast_math (CPU backend only) ----

TEST(FastMathCpu, ExpRelativeErrorOverTheFiniteRange) {
  // Dense sweep of [-87.3, 88.72] (the inputs whose exp is a normal float) against exp in double.
  double worst = 0.0;
  float worst_x = 0.0f;
  const int n = 2'000'000;
  for (int i = 0; i <= n; ++i) {
    const float x = -87.3f + (88.72f + 87.3f) * static_cast<float>(i) / n;
    const double want = std::exp(static_cast<double>(x));
    const double rel = std::abs(static_cast<double>(backend::fm::exp(x)) - want) / want;
    if (rel > worst) {
      worst = rel;
      worst_x = x;
    }
  }
  // The claim in fast_math.h (measured: 7.9e-8). A correctly rounded result alone may be 6e-8 off.
  EXPECT_LT(worst, 1e-7) << "at x = " << worst_x;
  std::printf("fm::exp worst relative error %.3g at x = %.6g\n", worst,
              static_cast<double>(worst_x));
  // Small arguments, where softmax spends its time.
  for (float x = -20.0f; x <= 0.0f; x += 1e-3f) {
    const double want = std::exp(static_cast<double>(x));
    ASSERT_LT(std::abs(backend::fm::exp(x) - want) / want, 1e-7) << x;
  }
}

TEST(FastMathCpu, ExpSaturatesInsteadOfOverflowingEarly) {
  // Up to FLT_MAX's logarithm the result must stay finite; beyond it, +inf.
  for (float x = 88.0f; x < 88.72f; x += 1e-3f)
    ASSERT_TRUE(std::isfinite(backend::fm::exp(x))) << x;
  EXPECT_TRUE(std::isinf(backend::fm::exp(100.0f)));
  // Far below the range the result is tiny (clamped), never negative or NaN.
  EXPECT_GE(backend::fm::exp(-1000.0f), 0.0f);
  EXPECT_LT(backend::fm::exp(-1000.0f), 1e-37f);
}

TEST(FastMathCpu, ErfcRelativeErrorAndExactGelu) {
  // Relative error wherever erfc is above 1e-30 (x < 8.2), where exact GELU needs it.
  double worst = 0.0;
  float worst_x = 0.0f;
  for (float x = -6.0f; x <= 8.2f; x += 1e-4f) {
    const double want = std::erfc(static_cast<double>(x));
    const double rel = std::abs(backend::fm::erfc(x) - want) / want;
    if (rel > worst) worst = rel, worst_x = x;
  }
  EXPECT_LT(worst, 1e-6) << "at x = " << worst_x;
  std::printf("fm::erfc worst relative error %.3g at x = %.6g\n", worst,
              static_cast<double>(worst_x));
  for (float x = -12.0f; x <= 12.0f; x += 1e-3f) {
    const double xd = x, cdf = 0.5 * std::erfc(-xd / std::sqrt(2.0));
    const double g = xd * cdf, dg = cdf + xd * std::exp(-0.5 * xd * xd) / std::sqrt(2.0 * M_PI);
    // x / sqrt 2 is rounded to float: for negative x that alone moves erfc by up to x^2 6e-8
    // relative (d log erfc(z) / dz ~ -2z), as in any float GELU; the values there are tiny.
    const double rel = 1e-6 * (1.0 + xd * xd / 4.0);
    ASSERT_NEAR(backend::fm::gelu_erf(x), g, rel * std::abs(g) + 1e-30) << x;
    ASSERT_NEAR(backend::fm::gelu_erf_grad(x), dg, 1e-6 * (1 + std::abs(dg))) << x;
  }
}

TEST(FastMathCpu, TanhGeluSilu) {
  for (float x = -12.0f; x <= 12.0f; x += 1e-3f) {
    ASSERT_NEAR(backend::fm::tanh(x), std::tanh(static_cast<double>(x)), 3e-7) << x;
    const double xd = x;
    const double gelu =
        0.5 * xd * (1.0 + std::tanh(0.7978845608028654 * (xd + 0.044715 * xd * xd * xd)));
    ASSERT_NEAR(backend::fm::gelu(x), gelu, 2e-6 * (1 + std::abs(gelu))) << x;
    const double silu = xd / (1.0 + std::exp(-xd));
    ASSERT_NEAR(backend::fm::silu(x), silu, 2e-6 * (1 + std::abs(silu))) << x;
  }
}

// Few rows against a large weight matrix (decode steps, beam search) take the row kernel instead
// of the BLAS (gemm_few_rows in src/backend/cpu/decode.cpp): 1..8 rows, padded row strides, the
// four-row and one-row paths, against a double loop.
TEST(GemmCpu, FewRowsAgainstAWeightMatrixMatchNaive) {
  const int64_t N = 300, K = 259;  // N * K past the row kernel's threshold; K not a multiple of 16
  std::vector<float> w(static_cast<size_t>(N * K));
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(std::sin(0.37 * i)) * 0.2f;
  for (int64_t m : {1, 3, 4, 5, 8}) {
    const int64_t lda = K + 3, ldc = N + 5;
    std::vector<float> a(static_cast<size_t>(m * lda)), c(static_cast<size_t>(m * ldc), -7.0f);
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(std::cos(0.11 * i + m));
    backend::Gemm g;
    g.trans_b = true;
    g.m = m, g.n = N, g.k = K;
    g.a = a.data(), g.lda = lda, g.b = w.data(), g.ldb = K, g.c = c.data(), g.ldc = ldc;
    backend::cpu().gemm(g);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double want = 0;
        for (int64_t e = 0; e < K; ++e)
          want += static_cast<double>(a[static_cast<size_t>(i * lda + e)]) *
                  w[static_cast<size_t>(j * K + e)];
        ASSERT_NEAR(c[static_cast<size_t>(i * ldc + j)], want, 1e-4 * (1 + std::abs(want)))
            << "m " << m << " row " << i << " col " << j;
      }
    for (int64_t i = 0; i < m; ++i)  // the padding between rows of C is untouched
      for (int64_t j = N; j < ldc; ++j) ASSERT_EQ(c[static_cast<size_t>(i * ldc + j)], -7.0f);
  }
}

// bf16 GEMMs (oneDNN on AVX512-BF16 / AMX CPUs, else cblas_sbgemm or converted operands): every
// transpose, odd sizes (tails of the kernels' blocks), padded leading dimensions, alpha and beta,
// a batch, against a double-precision product of the same bf16 values. Each product is a sum of K
// exact bf16 x bf16 products accumulated in fp32, so the error is fp32 rounding of the partial
// sums: below K * 2^-24 relative to the sum of |terms|.
TEST(GemmCpu, Bf16ProductsMatchDoubleOfTheSameValues) {
  std::printf("%s\n", backend::cpu().gemm_info().c_str());
  auto bf16_bits = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
  };
  auto value = [](uint16_t h) {
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  for (const bool ta : {false, true})
    for (const bool tb : {false, true})
      for (const auto [m, n, k] : {std::tuple{37, 45, 129}, std::tuple{64, 256, 768},
                                   std::tuple{1, 77, 33}, std::tuple{130, 3, 500}}) {
        const int64_t batch = 2, lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 5, ldc = n + 2;
        const int64_t a_rows = ta ? k : m, b_rows = tb ? n : k;
        std::vector<uint16_t> a(static_cast<size_t>(batch * a_rows * lda)),
            b(static_cast<size_t>(batch * b_rows * ldb));
        for (size_t i = 0; i < a.size(); ++i)
          a[i] = bf16_bits(static_cast<float>(std::sin(0.37 * i + m)));
        for (size_t i = 0; i < b.size(); ++i)
          b[i] = bf16_bits(static_cast<float>(std::cos(0.23 * i + n)));
        const float alpha = 0.75f, beta = 0.5f;
        std::vector<float> c(static_cast<size_t>(batch * m * ldc));
        for (size_t i = 0; i < c.size(); ++i) c[i] = static_cast<float>(std::sin(0.5 * i));
        const std::vector<float> c0 = c;
        backend::Gemm g;
        g.dtype = DType::bf16;
        g.trans_a = ta, g.trans_b = tb, g.m = m, g.n = n, g.k = k, g.alpha = alpha, g.beta = beta;
        g.a = a.data(), g.lda = lda, g.b = b.data(), g.ldb = ldb, g.c = c.data(), g.ldc = ldc;
        g.batch = batch, g.stride_a = a_rows * lda, g.stride_b = b_rows * ldb, g.stride_c = m * ldc;
        backend::cpu().gemm(g);
        for (int64_t s = 0; s < batch; ++s)
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
              double want = 0, mag = 0;
              for (int64_t e = 0; e < k; ++e) {
                const double x = value(a[static_cast<size_t>(
                                 s * a_rows * lda + (ta ? e * lda + i : i * lda + e))]),
                             y = value(b[static_cast<size_t>(
                                 s * b_rows * ldb + (tb ? j * ldb + e : e * ldb + j))]);
                want += x * y;
                mag += std::abs(x * y);
              }
              const size_t at = static_cast<size_t>(s * m * ldc + i * ldc + j);
              want = alpha * want + beta * c0[at];
              ASSERT_NEAR(c[at], want, (k * 6e-8 + 1e-6) * (alpha * mag + std::abs(c0[at])))
                  << "ta " << ta << " tb " << tb << " m " << m << " n " << n << " k " << k
                  << " at " << s << "," << i << "," << j;
            }
        for (int64_t s = 0; s < batch; ++s)  // C's padding columns are untouched
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = n; j < ldc; ++j) {
              const size_t at = static_cast<size_t>(s * m * ldc + i * ldc + j);
              ASSERT_EQ(c[at], c0[at]);
            }
      }
}

// Element (i, j) of batch item s of op(A) op(B) in double, from the operands' values as floats
// (A and B laid out as g says), and the sum of |terms|: fp32 accumulation's error scales with it.
std::pair<double, double> reference_dot(const std::vector<float>& a, const std::vector<float>& b,
                                        const backend::Gemm& g, int64_t s, int64_t i, int64_t j) {
  double dot = 0, mag = 0;
  for (int64_t e = 0; e < g.k; ++e) {
    const double x = a[static_cast<size_t>(s * g.stride_a +
                                           (g.trans_a ? e * g.lda + i : i * g.lda + e))],
                 y = b[static_cast<size_t>(s * g.stride_b +
                                           (g.trans_b ? j * g.ldb + e : e * g.ldb + j))];
    dot += x * y;
    mag += std::abs(x * y);
  }
  return {dot, mag};
}

// fp16 GEMMs with an fp32 C (oneDNN's f16 matmul on CPUs with AVX512-FP16 / AMX-FP16, else both
// operands widened to fp32): every transpose, odd and padded shapes, alpha and beta (alpha != 1 or
// beta outside {0, 1} always take the conversion path), a batch, against a double-precision product
// of the same fp16 values. fp16 x fp16 is exact in fp32, so the error is the fp32 sums' rounding.
TEST(GemmCpu, Fp16ProductsMatchDoubleOfTheSameValues) {
  using ds::testing::randn;
  for (const bool ta : {false, true})
    for (const bool tb : {false, true})
      for (const auto [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{1.0f, 1.0f},
                                       std::pair{0.75f, 0.5f}})
        for (const auto [m, n, k] : {std::tuple{37, 45, 129}, std::tuple{64, 256, 768},
                                     std::tuple{1, 77, 33}}) {
          const int64_t batch = 2, lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 5, ldc = n + 2;
          const int64_t a_rows = ta ? k : m, b_rows = tb ? n : k;
          const Tensor a = randn({batch * a_rows * lda}, 4, 1.0f, DType::f16),
                       b = randn({batch * b_rows * ldb}, 5, 1.0f, DType::f16),
                       c0 = randn({batch * m * ldc}, 6, 2.0f, DType::f32);
          const Tensor c = c0.clone();
          backend::Gemm g;
          g.dtype = DType::f16;
          g.trans_a = ta, g.trans_b = tb, g.m = m, g.n = n, g.k = k, g.alpha = alpha, g.beta = beta;
          g.a = a.raw_data(), g.lda = lda, g.b = b.raw_data(), g.ldb = ldb, g.c = c.raw_data(),
          g.ldc = ldc;
          g.batch = batch, g.stride_a = a_rows * lda, g.stride_b = b_rows * ldb,
          g.stride_c = m * ldc;
          backend::cpu().gemm(g);
          const std::vector<float> av = a.to_vector(), bv = b.to_vector(), cv = c.to_vector(),
                                   c0v = c0.to_vector();
          for (int64_t s = 0; s < batch; ++s)
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < ldc; ++j) {
                const size_t at = static_cast<size_t>(s * m * ldc + i * ldc + j);
                if (j >= n) {  // padding
                  ASSERT_EQ(cv[at], c0v[at]);
                  continue;
                }
                const auto [dot, mag] = reference_dot(av, bv, g, s, i, j);
                const double want = alpha * dot + beta * c0v[at];
                ASSERT_NEAR(cv[at], want,
                            (k * 6e-8 + 1e-6) * (alpha * mag + std::abs(beta * c0v[at])))
                    << "ta " << ta << " tb " << tb << " alpha " << alpha << " beta " << beta
                    << " m " << m << " n " << n << " k " << k << " at " << s << "," << i << ","
                    << j;
              }
        }
}

// How fp16 products run is decided once per process and said in the start-up GEMM line: oneDNN's
// f16 matmul where the CPU has fp16 units (checked here against /proc/cpuinfo, independently of
// the cpuid reading in onednn.cpp) and oneDNN a kernel for them that is not a reference loop, else
// "converted to fp32" with the reason. ctest runs GemmCpu again with DS_FP16_GEMM=onednn and
// =convert (tests/cmake/nn_ops.cmake), so on a CPU with fp16 units the product tests above and
// below run on oneDNN's kernel.
TEST(GemmCpu, SaysHowFp16ProductsRun) {
  const std::string info = backend::cpu().gemm_info(), why = backend::onednn_f16_info();
  const char* env = std::getenv("DS_FP16_GEMM");
  const std::string mode = env ? env : "auto";
  std::string flags;
  if (FILE* f = std::fopen("/proc/cpuinfo", "r")) {
    char line[8192];
    while (std::fgets(line, sizeof line, f))
      if (std::strncmp(line, "flags", 5) == 0) {
        flags = line;
        break;
      }
    std::fclose(f);
  }
  const bool units = flags.find(" avx512_fp16") != std::string::npos ||
                     flags.find(" amx_fp16") != std::string::npos;
  std::printf("DS_FP16_GEMM=%s, fp16 units in /proc/cpuinfo: %s\n%s\n", mode.c_str(),
              units ? "yes" : "no", info.c_str());
  if (backend::onednn_f16_available()) {
    EXPECT_NE(info.find("fp16 GEMM: oneDNN"), std::string::npos) << info;
    EXPECT_EQ(why.find("ref"), std::string::npos) << why;
    EXPECT_NE(mode, "convert");
    if (!flags.empty() && mode == "auto") EXPECT_TRUE(units) << flags;
  } else {
    EXPECT_FALSE(why.empty());
    EXPECT_NE(info.find("fp16 GEMM: converted to fp32 (" + why + ")"), std::string::npos) << info;
    if (mode == "convert") EXPECT_EQ(why, "DS_FP16_GEMM=convert");
    if (!flags.empty() && !units && mode == "auto")
      EXPECT_EQ(why, "this CPU has no AVX512-FP16 or AMX-FP16");
  }
}

// A 16-bit C (Gemm::c_dtype): the product rounded once into C (beta 1: added to C's values first),
// on oneDNN's matmul primitive for bf16 and through an fp32 C otherwise (fp16, alpha != 1). Each
// element is within half a 16-bit ulp of the double-precision value plus the fp32 sum's error;
// C's padding columns are untouched; a C that is not fp32, bf16 or fp16 is refused.
TEST(GemmCpu, SixteenBitResultsAreTheProductRoundedOnce) {
  using ds::testing::randn;
  for (const DType dt : {DType::bf16, DType::f16})
    for (const bool ta : {false, true})
      for (const bool tb : {false, true})
        for (const float beta : {0.0f, 1.0f})
          for (const float alpha : {1.0f, 0.5f})
            for (const auto [m, n, k] : {std::tuple{37, 45, 129}, std::tuple{64, 256, 768},
                                         std::tuple{1, 77, 33}}) {
              const int64_t batch = 2, lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 5,
                            ldc = n + 2;
              const int64_t a_rows = ta ? k : m, b_rows = tb ? n : k;
              const Tensor a = randn({batch * a_rows * lda}, 1, 1.0f, dt),
                           b = randn({batch * b_rows * ldb}, 2, 1.0f, dt),
                           c0 = randn({batch * m * ldc}, 3, 4.0f, dt);
              const Tensor c = c0.clone();
              backend::Gemm g;
              g.dtype = dt;
              g.c_dtype = dt;
              g.trans_a = ta, g.trans_b = tb, g.m = m, g.n = n, g.k = k, g.alpha = alpha,
              g.beta = beta;
              g.a = a.raw_data(), g.lda = lda, g.b = b.raw_data(), g.ldb = ldb,
              g.c = c.raw_data(), g.ldc = ldc;
              g.batch = batch, g.stride_a = a_rows * lda, g.stride_b = b_rows * ldb,
              g.stride_c = m * ldc;
              backend::cpu().gemm(g);
              const std::vector<float> av = a.to_vector(), bv = b.to_vector(), cv = c.to_vector(),
                                       c0v = c0.to_vector();
              const double half_ulp = dt == DType::bf16 ? 1.0 / 256 : 1.0 / 2048;
              for (int64_t s = 0; s < batch; ++s)
                for (int64_t i = 0; i < m; ++i)
                  for (int64_t j = 0; j < ldc; ++j) {
                    const size_t at = static_cast<size_t>(s * m * ldc + i * ldc + j);
                    if (j >= n) {  // padding
                      ASSERT_EQ(cv[at], c0v[at]);
                      continue;
                    }
                    const auto [dot, mag] = reference_dot(av, bv, g, s, i, j);
                    const double want = alpha * dot + beta * c0v[at];
                    ASSERT_NEAR(cv[at], want,
                                half_ulp * std::abs(want) +
                                    (k * 6e-8 + 1e-6) * (alpha * mag + std::abs(c0v[at])))
                        << dtype_name(dt) << " ta " << ta << " tb " << tb << " alpha " << alpha
                        << " beta " << beta << " m " << m << " n " << n << " k " << k << " at "
                        << s << "," << i << "," << j;
                  }
            }
  backend::Gemm bad;
  bad.m = bad.n = bad.k = 1;
  bad.c_dtype = DType::i32;
  EXPECT_NE(error_of([&] { backend::cpu().gemm(bad); }).find("C must be fp32, bf16 or fp16"),
            std::string::npos);
}

// ops::linear on bf16: the output and both gradients are written in bf16 by the GEMM (no fp32
// result of the (rows, out) shape is allocated where oneDNN's matmul runs), and they are the fp32
// path's values rounded once (up to the GEMMs' summation order: within one bf16 ulp).
TEST(OpsCpu, Bf16LinearWritesItsResultsInBf16) {
  using ds::testing::randn;
  // output: 2 MiB in bf16, 4 MiB in fp32 (the allocator rounds from 1 MiB up to 2 MiB blocks)
  const int64_t rows = 512, in = 256, out = 2048;
  Tensor x = randn({rows, in}, 1, 1.0f, DType::bf16), w = randn({out, in}, 2, 0.1f, DType::bf16),
         b = randn({out}, 3, 1.0f, DType::bf16), g = randn({rows, out}, 4, 1.0f, DType::bf16);
  for (Tensor* t : {&x, &w, &b}) {
    t->set_requires_grad(true);
    t->set_grad(Tensor::zeros(t->shape(), DType::bf16));
  }
  Allocator& al = cpu_allocator();
  al.reset_peak();
  const int64_t base = static_cast<int64_t>(al.stats().bytes_in_use);
  Tensor y = ops::linear(x, w, b);
  const int64_t fwd = static_cast<int64_t>(al.stats().peak_bytes_in_use) - base;
  EXPECT_EQ(y.dtype(), DType::bf16);
  // With oneDNN's matmul (an AVX512-BF16 / AMX CPU) the GEMM writes bf16 itself; elsewhere an fp32
  // C is made for the product and rounded into the bf16 output.
  const bool direct =
      backend::cpu().gemm_info().find("bf16 results by its matmul primitive") != std::string::npos;
  EXPECT_LT(fwd, (direct ? 2 : 6) * rows * out + 64 * 1024) << "an fp32 output was allocated";
  y.backward(g);
  // The fp32 path on the same values, rounded.
  Tensor x32 = x.detach().to(DType::f32), w32 = w.detach().to(DType::f32),
         b32 = b.detach().to(DType::f32);
  for (Tensor* t : {&x32, &w32, &b32}) t->set_requires_grad(true);
  Tensor y32 = ops::linear(x32, w32, b32);
  y32.backward(g.to(DType::f32));
  // One bf16 ulp of the value, plus the fp32 sums' own order differences (1e-5 of the tensor's
  // scale: entries near zero by cancellation).
  auto within_an_ulp = [](const Tensor& got16, const Tensor& want32, const char* what) {
    const std::vector<float> a = got16.to_vector(), w = want32.to(DType::bf16).to_vector();
    float scale = 0;
    for (float v : w) scale = std::max(scale, std::abs(v));
    for (size_t i = 0; i < a.size(); ++i)
      ASSERT_LE(std::abs(a[i] - w[i]), std::abs(w[i]) / 128 + 1e-5f * scale) << what << " " << i;
  };
  within_an_ulp(y, y32, "y");
  within_an_ulp(x.grad(), x32.grad(), "dx");
  within_an_ulp(w.grad(), w32.grad(), "dw");
  within_an_ulp(b.grad(), b32.grad(), "db");
}

// The device-parameterised tests: one instance per device, skipped where a kernel is missing.
class Ops : public ds::testing::DeviceTest {};

// ---- normalisation ----

TEST_P(Ops, LayerNormMatchesReference) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "layer_norm_forward");
  const int64_t R = 37, C = 129;
  Tensor x = randn({R, C}, 1, 3.0f), w = randn({C}, 2), b = randn({C}, 3);
  // An offset row: the centred variance must not lose precision to a large mean.
  std::vector<float> xv = host_vector(x);
  for (int64_t i = 0; i < C; ++i) xv[static_cast<size_t>(C + i)] += 1000.0f;
  x = from_data(xv, {R, C});
  const auto wv = host_vector(w), bv = host_vector(b);
  std::vector<double> want(xv.size()), want_nb(xv.size());
  for (int64_t r = 0; r < R; ++r) {
    double mu = 0, var = 0;
    for (int64_t i = 0; i < C; ++i) mu += xv[static_cast<size_t>(r * C + i)];
    mu /= C;
    for (int64_t i = 0; i < C; ++i) var += std::pow(xv[static_cast<size_t>(r * C + i)] - mu, 2);
    const double rs = 1.0 / std::sqrt(var / C + 1e-5);
    for (int64_t i = 0; i < C; ++i) {
      const size_t k = static_cast<size_t>(r * C + i);
      want_nb[k] = (xv[k] - mu) * rs * wv[static_cast<size_t>(i)];
      want[k] = want_nb[k] + bv[static_cast<size_t>(i)];
    }
  }
  expect_close(host_vector(ops::layer_norm(x, w, b)), want, 2e-4, 1e-4, "layer_norm");
  expect_close(host_vector(ops::layer_norm(x, w, Tensor())), want_nb, 2e-4, 1e-4,
               "layer_norm no bias");
}

TEST_P(Ops, RmsNormMatchesReference) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "rms_norm_forward");
  const int64_t R = 9, C = 200;
  Tensor x = randn({3, 3, C}, 4, 2.0f), w = randn({C}, 5);
  const auto xv = host_vector(x), wv = host_vector(w);
  std::vector<double> want(xv.size());
  for (int64_t r = 0; r < R; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < C; ++i) ss += std::pow(xv[static_cast<size_t>(r * C + i)], 2);
    const double rs = 1.0 / std::sqrt(ss / C + 1e-6);
    for (int64_t i = 0; i < C; ++i)
      want[static_cast<size_t>(r * C + i)] =
          xv[static_cast<size_t>(r * C + i)] * rs * wv[static_cast<size_t>(i)];
  }
  expect_close(host_vector(ops::rms_norm(x, w)), want, 1e-5, 1e-5, "rms_norm");
}

// ---- softmax, activations ----

TEST_P(Ops, SoftmaxMatchesReferenceIncludingMaskedEntries) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "softmax_forward");
  const int64_t R = 6, C = 300;
  std::vector<float> xv = host_vector(randn({R, C}, 6, 4.0f));
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < C; i += 3) xv[static_cast<size_t>(2 * C + i)] = -inf;  // masked entries
  for (int64_t i = 0; i < C; ++i) xv[static_cast<size_t>(4 * C + i)] = -inf;  // a fully masked row
  xv[5 * C] = 80.0f;                                                          // a large logit
  Tensor x = from_data(xv, {R, C});
  std::vector<double> want(xv.size());
  for (int64_t r = 0; r < R; ++r) {
    if (r == 4) continue;  // fully masked rows are defined as zeros
    double m = -INFINITY, s = 0;
    for (int64_t i = 0; i < C; ++i) m = std::max<double>(m, xv[static_cast<size_t>(r * C + i)]);
    for (int64_t i = 0; i < C; ++i) s += std::exp(xv[static_cast<size_t>(r * C + i)] - m);
    for (int64_t i = 0; i < C; ++i)
      want[static_cast<size_t>(r * C + i)] = std::exp(xv[static_cast<size_t>(r * C + i)] - m) / s;
  }
  const auto got = host_vector(ops::softmax(x));
  expect_close(got, want, 1e-7, 1e-5, "softmax");
  for (int64_t i = 0; i < C; i += 3) EXPECT_EQ(got[static_cast<size_t>(2 * C + i)], 0.0f);
}

// Strided copies (permutes, slices) and broadcasting arithmetic against index arithmetic on the
// host: GPU backends merge dims and switch to 32-bit index math, which this pins down.
TEST_P(Ops, StridedCopiesAndBroadcasts) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "copy", "binary");
  const Tensor x = randn({2, 3, 4, 5}, 70);
  const auto xv = host_vector(x);
  // (2, 3, 4, 5) -> (2, 4, 3, 5): element [a][c][b][d] = x[a][b][c][d]
  const auto pv = host_vector(ops::transpose(x, 1, 2).contiguous());
  for (int a = 0; a < 2; ++a)
    for (int c = 0; c < 4; ++c)
      for (int b = 0; b < 3; ++b)
        for (int d = 0; d < 5; ++d)
          ASSERT_EQ(pv[static_cast<size_t>(((a * 4 + c) * 3 + b) * 5 + d)],
                    xv[static_cast<size_t>(((a * 3 + b) * 4 + c) * 5 + d)]);
  // A slice of a transpose, made contiguous.
  const auto sv =
      host_vector(ops::slice(ops::transpose(x, 2, 3), 3, 1, 3).contiguous());  // (2,3,5,2)
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 3; ++b)
      for (int d = 0; d < 5; ++d)
        for (int c = 0; c < 2; ++c)
          ASSERT_EQ(sv[static_cast<size_t>(((a * 3 + b) * 5 + d) * 2 + c)],
                    xv[static_cast<size_t>(((a * 3 + b) * 4 + (c + 1)) * 5 + d)]);
  // (4, 1, 5) + (1, 3, 1) -> (4, 3, 5)
  const Tensor u = randn({4, 1, 5}, 71), w = randn({1, 3, 1}, 72);
  const auto uv = host_vector(u), wv = host_vector(w), ov = host_vector(ops::add(u, w));
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 5; ++k)
        ASSERT_EQ(ov[static_cast<size_t>((i * 3 + j) * 5 + k)],
                  uv[static_cast<size_t>(i * 5 + k)] + wv[static_cast<size_t>(j)]);
}

// Sum and max over long rows, over many rows of a column, and over very many short rows: GPU
// backends split long reductions into chunks combined in a fixed order, so each path is checked
// against double precision here, and twice for run-to-run equality.
TEST_P(Ops, ReductionsOfEveryShape) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "reduce");
  struct Case {
    Shape shape;
    int64_t dim;
  };
  for (const Case& c : {Case{{2, 300000}, 1}, Case{{3000, 70}, 0}, Case{{4, 5000, 33}, 1},
                        Case{{70000, 3}, 1}, Case{{5, 7}, 1}}) {
    Tensor x = randn(c.shape, 50);
    const auto xv = host_vector(x);
    int64_t outer = 1, inner = 1;
    for (int64_t i = 0; i < c.dim; ++i) outer *= c.shape[static_cast<size_t>(i)];
    for (size_t i = static_cast<size_t>(c.dim) + 1; i < c.shape.size(); ++i) inner *= c.shape[i];
    const int64_t red = c.shape[static_cast<size_t>(c.dim)];
    std::vector<double> sum(static_cast<size_t>(outer * inner), 0.0),
        mx(static_cast<size_t>(outer * inner), -INFINITY);
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t r = 0; r < red; ++r)
        for (int64_t i = 0; i < inner; ++i) {
          const double v = xv[static_cast<size_t>((o * red + r) * inner + i)];
          sum[static_cast<size_t>(o * inner + i)] += v;
          mx[static_cast<size_t>(o * inner + i)] =
              std::max(mx[static_cast<size_t>(o * inner + i)], v);
        }
    const std::string what = shape_str(c.shape) + " over dim " + std::to_string(c.dim);
    const auto s1 = host_vector(ops::sum(x, {c.dim}));
    expect_close(s1, sum, 1e-4, 1e-5, ("sum " + what).c_str());
    EXPECT_EQ(s1, host_vector(ops::sum(x, {c.dim}))) << "sum " << what << " differs run to run";
    expect_close(host_vector(ops::max(x, c.dim)), mx, 0.0, 0.0, ("max " + what).c_str());
  }
}

// The optimizer's step on the parameters' device (optim::adam_update over tensors) is bitwise the
// CPU kernel's, in every mode: AdamW, L2 decay, no bias correction, a gradient scale, a 16-bit
// copy.
TEST_P(Ops, AdamStepIsBitwiseTheCpuOptimizer) {
  const int64_t n = 100003;  // not a multiple of any tile or vector width
  struct Mode {
    bool adamw, bias_correction;
    float wd, grad_scale;
    DType out16;
  };
  for (const Mode md :
       {Mode{true, true, 0.1f, 1.0f, DType::f32}, Mode{false, true, 0.01f, 0.5f, DType::bf16},
        Mode{true, false, 0.0f, 2.0f, DType::f16}}) {
    optim::AdamConfig c;
    c.lr = 3e-3f;
    c.weight_decay = md.wd;
    c.adam_w_mode = md.adamw;
    c.bias_correction = md.bias_correction;
    std::vector<float> p = host_vector(randn({n}, 60)), g = host_vector(randn({n}, 61)),
                       m = host_vector(randn({n}, 62, 0.1f)), v(static_cast<size_t>(n));
    for (size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * std::abs(m[i]) + 1e-6f;
    auto on_device = [&](const std::vector<float>& x) {
      return ds::testing::to_device(Tensor::from_data(x, {n}), device());
    };
    const Tensor dp = on_device(p), dg = on_device(g), dm = on_device(m), dv = on_device(v);
    const bool with16 = md.out16 != DType::f32;
    const Tensor d16 = with16 ? Tensor::empty({n}, md.out16, device()) : Tensor();
    std::vector<uint16_t> h16(static_cast<size_t>(n));
    for (int64_t step = 1; step <= 3; ++step) {
      optim::adam_update(dp, dg, dm, dv, step, c, md.grad_scale, d16);
      optim::adam_update(p.data(), g.data(), m.data(), v.data(), n, step, c, md.grad_scale,
                         with16 ? h16.data() : nullptr, with16 ? md.out16 : DType::bf16);
    }
    const std::string what = std::string(md.adamw ? "adamw" : "adam+l2") +
                             (md.bias_correction ? "" : " no bias correction");
    EXPECT_EQ(host_vector(dp), p) << what;
    EXPECT_EQ(host_vector(dm), m) << what;
    EXPECT_EQ(host_vector(dv), v) << what;
    if (with16) {
      Tensor h = Tensor::empty({n}, md.out16);
      std::memcpy(h.raw_data(), h16.data(), h16.size() * 2);
      EXPECT_EQ(host_vector(d16), h.to_vector()) << what << " 16-bit copy";
    }
  }
  Tensor elsewhere = Tensor::zeros({4});
  if (!device().is_cpu()) {
    const Tensor dp = Tensor::zeros({4}, DType::f32, device());
    optim::AdamConfig c;
    EXPECT_NE(error_of([&] {
                optim::adam_update(dp, elsewhere, dp, dp, 1, c);
              }).find("keep the optimizer state with the parameters"),
              std::string::npos);
  }
}

// The offloaded optimizer step's copies (ds/backend/backend.h TransferQueue): copies enqueued
// after after_kernels() see what earlier kernels wrote; kernels enqueued after before_kernels()
// see what earlier copies brought; a wait covers its ticket and every earlier one.
TEST_P(Ops, TransferQueueOrdersCopiesAgainstKernels) {
  backend::Backend& be = backend::get(device());
  const int64_t n = (int64_t{1} << 21) + 7, chunks = 5;
  Tensor dev = Tensor::zeros({n}, DType::f32, device());
  Tensor host = Tensor::from_storage(be.host_staging(static_cast<size_t>(n) * 4), {n}, DType::f32);
  std::unique_ptr<backend::TransferQueue> q = be.transfer_queue();
  for (int round = 1; round <= 2; ++round) {
    // Down: the copies wait for the kernels enqueued before them.
    ops::fill_(dev, 1.5 * round);
    ops::mul_(dev, 2.0f);
    q->after_kernels();
    const int64_t chunk = (n + chunks - 1) / chunks;
    std::vector<uint64_t> tickets;
    for (int64_t b = 0; b < n; b += chunk) {
      const int64_t len = std::min(chunk, n - b);
      tickets.push_back(q->copy(dev.flat_range(b, len), host.flat_range(b, len)));
    }
    for (size_t i = 1; i < tickets.size(); ++i) EXPECT_EQ(tickets[i], tickets[i - 1] + 1);
    q->wait(tickets.back());
    const float* h = host.data<float>();
    const float want = 3.0f * static_cast<float>(round);
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += h[i] != want;
    EXPECT_EQ(wrong, 0) << "round " << round;
    // Up: kernels enqueued after before_kernels() read the copied values.
    float* hw = host.data<float>();
    for (int64_t i = 0; i < n; ++i) hw[i] = static_cast<float>(i % 1000);
    const uint64_t up = q->copy(host, dev);
    q->before_kernels();
    ops::mul_(dev, 0.5f);
    const std::vector<float> back = host_vector(dev);
    q->wait(up);
    wrong = 0;
    for (int64_t i = 0; i < n; ++i)
      wrong += back[static_cast<size_t>(i)] != 0.5f * static_cast<float>(i % 1000);
    EXPECT_EQ(wrong, 0) << "round " << round;
  }
  EXPECT_NE(error_of([&] {
              q->copy(dev, Tensor::zeros({n}, DType::bf16));
            }).find("contiguous tensors of one dtype and size"),
            std::string::npos);
  if (!device().is_cpu()) {
    EXPECT_NE(error_of([&] {
                q->copy(dev, Tensor::zeros({n}, DType::f32, device()));
              }).find("between the GPU and host memory"),
              std::string::npos);
  }
}

// The fused LM head + cross entropy against linear + cross_entropy: the loss and both gradients,
// fp32 (summation order only) and bf16 (the same roundings), in one block and in several, with
// and without a constant logit bias (BART's final_logits_bias).
TEST_P(Ops, LinearCrossEntropyMatchesLinearThenCrossEntropy) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "gemm", "cross_entropy_forward",
                           "cross_entropy_backward");
  const int64_t N = 37, C = 24, V = 61;
  std::vector<int64_t> tv(N);
  for (int64_t i = 0; i < N; ++i) tv[static_cast<size_t>(i)] = i % 7 == 3 ? -100 : (i * 13) % V;
  const Tensor targets = ds::testing::to_device(Tensor::from_ints(tv, {N}), device());
  for (const DType dt : {DType::f32, DType::bf16}) {
    for (const int64_t block : {int64_t{0}, int64_t{8}})
      for (const bool with_bias : {false, true}) {
        auto make = [&](const Shape& s, uint64_t seed) {
          Tensor t = ds::testing::to_device(randn(s, seed, 0.5f).to(dt), device());
          t.set_requires_grad(true);
          return t;
        };
        const Tensor x1 = make({N, C}, 70), w1 = make({V, C}, 71);
        const Tensor x2 = make({N, C}, 70), w2 = make({V, C}, 71);
        const Tensor bias =
            with_bias ? ds::testing::to_device(randn({1, V}, 72, 2.0f).to(dt), device()) : Tensor();
        Tensor lg = ops::linear(x1, w1);
        if (with_bias) lg = ops::add(lg, bias);
        const Tensor ref = ops::cross_entropy(lg, targets);
        const Tensor fused = ops::linear_cross_entropy(x2, w2, targets, -100, block, bias);
        ops::mul(ref, 3.0f).backward();
        ops::mul(fused, 3.0f).backward();
        const double tol = dt == DType::f32 ? 2e-6 : 2e-2;
        const std::string what = std::string(dtype_name(dt)) + " block " + std::to_string(block) +
                                 (with_bias ? " bias" : "");
        EXPECT_NEAR(fused.item(), ref.item(), tol * std::abs(ref.item())) << what;
        for (const auto& [a, b] : {std::pair{x1, x2}, std::pair{w1, w2}}) {
          const std::vector<float> ga = host_vector(a.grad()), gb = host_vector(b.grad());
          double worst = 0, scale = 0;
          for (size_t i = 0; i < ga.size(); ++i) {
            worst = std::max(worst, static_cast<double>(std::abs(ga[i] - gb[i])));
            scale = std::max(scale, static_cast<double>(std::abs(ga[i])));
          }
          EXPECT_LE(worst, tol * scale) << what;
        }
      }
  }
  EXPECT_NE(error_of([&] {
              ops::linear_cross_entropy(Tensor::zeros({4, 3}, DType::f32, device()),
                                        Tensor::zeros({5, 2}, DType::f32, device()), targets);
            }).find("must be (N, C) and (V, C)"),
            std::string::npos);
  Tensor trained_bias = Tensor::zeros({V}, DType::f32, device());
  trained_bias.set_requires_grad(true);
  EXPECT_NE(error_of([&] {
              ops::linear_cross_entropy(Tensor::zeros({N, C}, DType::f32, device()),
                                        Tensor::zeros({V, C}, DType::f32, device()), targets, -100,
                                        0, trained_bias);
            }).find("logit_bias is a constant"),
            std::string::npos);
}

TEST_P(Ops, GeluSiluSwigluMatchFormulas) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "unary", "binary");  // swiglu: silu(x) * u
  Tensor x = randn({1000}, 7, 3.0f), u = randn({1000}, 8);
  const auto xv = host_vector(x), uv = host_vector(u);
  std::vector<double> g(xv.size()), s(xv.size()), sw(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) {
    const double v = xv[i];
    g[i] = 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
    s[i] = v / (1.0 + std::exp(-v));
    sw[i] = s[i] * uv[i];
  }
  expect_close(host_vector(ops::gelu(x)), g, 1e-6, 1e-5, "gelu");
  expect_close(host_vector(ops::silu(x)), s, 1e-6, 1e-5, "silu");
  expect_close(host_vector(ops::swiglu(x, u)), sw, 1e-6, 1e-5, "swiglu");
}

// ---- attention ----

namespace {
// Naive masked softmax(Q K^T / sqrt(hd)) V in double, (B, NH, T, hd).
std::vector<double> naive_attention(const std::vector<float>& q, const std::vector<float>& k,
                                    const std::vector<float>& v, int64_t BH, int64_t T,
                                    int64_t hd) {
  std::vector<double> out(q.size());
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> p(static_cast<size_t>(T));
  for (int64_t bh = 0; bh < BH; ++bh) {
    const size_t base = static_cast<size_t>(bh * T * hd);
    for (int64_t i = 0; i < T; ++i) {
      double m = -INFINITY;
      for (int64_t j = 0; j <= i; ++j) {
        double s = 0;
        for (int64_t c = 0; c < hd; ++c)
          s += static_cast<double>(q[base + static_cast<size_t>(i * hd + c)]) *
               k[base + static_cast<size_t>(j * hd + c)];
        p[static_cast<size_t>(j)] = s * scale;
        m = std::max(m, p[static_cast<size_t>(j)]);
      }
      double sum = 0;
      for (int64_t j = 0; j <= i; ++j)
        sum += (p[static_cast<size_t>(j)] = std::exp(p[static_cast<size_t>(j)] - m));
      for (int64_t c = 0; c < hd; ++c) {
        double acc = 0;
        for (int64_t j = 0; j <= i; ++j)
          acc += p[static_cast<size_t>(j)] * v[base + static_cast<size_t>(j * hd + c)];
        out[base + static_cast<size_t>(i * hd + c)] = acc / sum;
      }
    }
  }
  return out;
}
}  // namespace

TEST_P(Ops, CausalAttentionMatchesNaive) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "attention_forward");
  // T = 150 spans two full 64-row blocks and a partial one.
  for (Shape s : {Shape{2, 3, 7, 8}, Shape{1, 2, 150, 16}}) {
    Tensor q = randn(s, 9, 1.5f), k = randn(s, 10, 1.5f), v = randn(s, 11);
    const auto want =
        naive_attention(host_vector(q), host_vector(k), host_vector(v), s[0] * s[1], s[2], s[3]);
    expect_close(host_vector(ops::causal_attention(q, k, v)), want, 2e-5, 1e-4, "attention");
  }
}

// The general op against a naive double loop: Tq != Tk, with and without causal masking (queries
// the last Tq positions), right-padded keys per batch row.
TEST_P(Ops, AttentionMaskKindsAndCrossAttention) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "attention_forward");
  const int64_t B = 2, NH = 2, hd = 4;
  for (auto [Tq, Tk] : {std::pair<int64_t, int64_t>{5, 9}, {70, 70}, {3, 3}}) {
    for (bool causal : {false, true}) {
      const std::vector<int64_t> lens = {Tk, std::max<int64_t>(1, Tk - 2)};
      Tensor q = randn({B, NH, Tq, hd}, 30, 1.5f), k = randn({B, NH, Tk, hd}, 31, 1.5f),
             v = randn({B, NH, Tk, hd}, 32);
      const auto qv = host_vector(q), kv = host_vector(k), vv = host_vector(v);
      std::vector<double> want(static_cast<size_t>(B * NH * Tq * hd));
      const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < NH; ++h)
          for (int64_t i = 0; i < Tq; ++i) {
            const int64_t n = causal ? std::min(lens[b], i + 1 + Tk - Tq) : lens[b];
            const size_t qb = static_cast<size_t>(((b * NH + h) * Tq + i) * hd);
            const size_t kb = static_cast<size_t>((b * NH + h) * Tk * hd);
            std::vector<double> p(static_cast<size_t>(n));
            double m = -INFINITY, sum = 0;
            for (int64_t j = 0; j < n; ++j) {
              double sc = 0;
              for (int64_t c = 0; c < hd; ++c)
                sc += static_cast<double>(qv[qb + c]) * kv[kb + static_cast<size_t>(j * hd + c)];
              p[static_cast<size_t>(j)] = sc * scale;
              m = std::max(m, p[static_cast<size_t>(j)]);
            }
            for (auto& x : p) sum += (x = std::exp(x - m));
            for (int64_t c = 0; c < hd; ++c) {
              double acc = 0;
              for (int64_t j = 0; j < n; ++j)
                acc += p[static_cast<size_t>(j)] * vv[kb + static_cast<size_t>(j * hd + c)];
              want[qb + static_cast<size_t>(c)] = acc / sum;
            }
          }
      ops::AttentionMask mask;
      mask.causal = causal;
      mask.key_lengths = lens;
      expect_close(host_vector(ops::attention(q, k, v, mask)), want, 2e-5, 1e-4,
                   causal ? "causal masked attention" : "masked attention");
    }
  }
  // Every row needs a key; a causal query block cannot be longer than the keys.
  Tensor q = randn({1, 1, 4, 2}, 33), k = randn({1, 1, 3, 2}, 34);
  EXPECT_NE(error_of([&] { ops::attention(q, k, k, {}); }).find("at most as many queries"),
            std::string::npos);
  ops::AttentionMask none;
  none.causal = false;
  none.key_lengths = {0};
  EXPECT_NE(error_of([&] { ops::attention(q, k, k, none); }).find("key length 0"),
            std::string::npos);
}

// Forward and every gradient against a double-precision reference at the head sizes real models
// use (GPU backends tile these: 64-row query and key tiles, so 100 and 130 end in partial tiles),
// causal and not, padded keys, Tq != Tk.
TEST_P(Ops, AttentionModelHeadSizesForwardAndBackward) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "attention_forward", "attention_backward");
  const int64_t B = 2, NH = 2;
  struct Case {
    int64_t hd, Tq, Tk;
    bool causal;
  };
  for (const Case c : {Case{64, 100, 100, true}, Case{64, 40, 130, false}, Case{128, 70, 130, true},
                       Case{32, 130, 130, false}, Case{64, 1, 70, true}}) {
    const int64_t hd = c.hd, Tq = c.Tq, Tk = c.Tk;
    const std::vector<int64_t> lens = {Tk, std::max<int64_t>(1, Tk - 45)};
    Tensor q = randn({B, NH, Tq, hd}, 40, 0.5f), k = randn({B, NH, Tk, hd}, 41, 0.5f),
           v = randn({B, NH, Tk, hd}, 42), g = randn({B, NH, Tq, hd}, 43);
    for (Tensor* t : {&q, &k, &v}) t->set_requires_grad(true);
    const auto qv = host_vector(q), kv = host_vector(k), vv = host_vector(v), gv = host_vector(g);
    const size_t nq = qv.size(), nk = kv.size();
    std::vector<double> out(nq), dq(nq, 0.0), dk(nk, 0.0), dv(nk, 0.0);
    const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
    for (int64_t bh = 0; bh < B * NH; ++bh) {
      const int64_t b = bh / NH;
      for (int64_t i = 0; i < Tq; ++i) {
        const int64_t n = c.causal ? std::min(lens[b], i + 1 + Tk - Tq) : lens[b];
        const size_t qi = static_cast<size_t>((bh * Tq + i) * hd);
        auto kr = [&](int64_t j) { return static_cast<size_t>((bh * Tk + j) * hd); };
        std::vector<double> p(static_cast<size_t>(n)), dp(static_cast<size_t>(n));
        double m = -INFINITY, sum = 0;
        for (int64_t j = 0; j < n; ++j) {
          double sc = 0, d = 0;
          for (int64_t e = 0; e < hd; ++e) {
            sc += static_cast<double>(qv[qi + e]) * kv[kr(j) + e];
            d += static_cast<double>(gv[qi + e]) * vv[kr(j) + e];
          }
          p[static_cast<size_t>(j)] = sc * scale;
          dp[static_cast<size_t>(j)] = d;
          m = std::max(m, p[static_cast<size_t>(j)]);
        }
        for (auto& x : p) sum += (x = std::exp(x - m));
        double D = 0;
        for (int64_t j = 0; j < n; ++j) {
          p[static_cast<size_t>(j)] /= sum;
          D += p[static_cast<size_t>(j)] * dp[static_cast<size_t>(j)];
        }
        for (int64_t j = 0; j < n; ++j) {
          const double pj = p[static_cast<size_t>(j)];
          const double ds = pj * (dp[static_cast<size_t>(j)] - D) * scale;
          for (int64_t e = 0; e < hd; ++e) {
            out[qi + e] += pj * vv[kr(j) + e];
            dv[kr(j) + e] += pj * gv[qi + e];
            dq[qi + e] += ds * kv[kr(j) + e];
            dk[kr(j) + e] += ds * qv[qi + e];
          }
        }
      }
    }
    ops::AttentionMask mask;
    mask.causal = c.causal;
    mask.key_lengths = lens;
    Tensor y = ops::attention(q, k, v, mask);
    const std::string what = "hd " + std::to_string(hd) + " Tq " + std::to_string(Tq) + " Tk " +
                             std::to_string(Tk) + (c.causal ? " causal" : "");
    expect_close(host_vector(y), out, 2e-5, 1e-4, ("attention " + what).c_str());
    ops::sum(ops::mul(y, g)).backward();
    expect_close(host_vector(q.grad()), dq, 5e-5, 5e-4, ("dq " + what).c_str());
    expect_close(host_vector(k.grad()), dk, 5e-5, 5e-4, ("dk " + what).c_str());
    expect_close(host_vector(v.grad()), dv, 5e-5, 5e-4, ("dv " + what).c_str());
  }
}

namespace {
// Sliding-window attention by the definition: a masked softmax in doubles, query i (position
// p = i + Tk - Tq) seeing keys p - window < j <= p (window 0: every earlier key), scores
// soft-capped (cap * tanh(s / cap)) when softcap > 0, and the gradients of sum(out * g).
struct WindowedRef {
  std::vector<double> out, dq, dk, dv;
};
WindowedRef windowed_attention_ref(const std::vector<float>& q, const std::vector<float>& k,
                                   const std::vector<float>& v, const std::vector<float>& g,
                                   int64_t BH, int64_t Tq, int64_t Tk, int64_t hd, int64_t window,
                                   double scale, double softcap = 0.0) {
  WindowedRef r{std::vector<double>(q.size()), std::vector<double>(q.size()),
                std::vector<double>(k.size()), std::vector<double>(k.size())};
  for (int64_t bh = 0; bh < BH; ++bh)
    for (int64_t i = 0; i < Tq; ++i) {
      const int64_t pos = i + Tk - Tq, lo = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
      const size_t qi = static_cast<size_t>((bh * Tq + i) * hd);
      auto kr = [&](int64_t j) { return static_cast<size_t>((bh * Tk + j) * hd); };
      std::vector<double> p(static_cast<size_t>(Tk), 0.0), dp(static_cast<size_t>(Tk), 0.0),
          slope(static_cast<size_t>(Tk), 1.0);
      double m = -INFINITY, sum = 0, D = 0;
      for (int64_t j = lo; j <= pos; ++j) {
        double sc = 0;
        for (int64_t e = 0; e < hd; ++e) {
          sc += static_cast<double>(q[qi + e]) * k[kr(j) + e];
          dp[static_cast<size_t>(j)] += static_cast<double>(g[qi + e]) * v[kr(j) + e];
        }
        sc *= scale;
        if (softcap > 0.0) {
          const double t = std::tanh(sc / softcap);
          sc = softcap * t;
          slope[static_cast<size_t>(j)] = 1.0 - t * t;
        }
        p[static_cast<size_t>(j)] = sc;
        m = std::max(m, sc);
      }
      for (int64_t j = lo; j <= pos; ++j)
        sum += (p[static_cast<size_t>(j)] = std::exp(p[static_cast<size_t>(j)] - m));
      for (int64_t j = lo; j <= pos; ++j)
        D += (p[static_cast<size_t>(j)] /= sum) * dp[static_cast<size_t>(j)];
      for (int64_t j = lo; j <= pos; ++j) {
        const double pj = p[static_cast<size_t>(j)], ds = pj * (dp[static_cast<size_t>(j)] - D) *
                                                          slope[static_cast<size_t>(j)] * scale;
        for (int64_t e = 0; e < hd; ++e) {
          r.out[qi + e] += pj * v[kr(j) + e];
          r.dv[kr(j) + e] += pj * g[qi + e];
          r.dq[qi + e] += ds * k[kr(j) + e];
          r.dk[kr(j) + e] += ds * q[qi + e];
        }
      }
    }
  return r;
}
}  // namespace

// Sliding-window attention (Gemma's local layers; transformers' boundary: key j visible to the
// query at position p iff p - window < j <= p), forward and every gradient against the masked
// softmax reference: windows of 1 (each query itself), 4 and 5 over 64-row block boundaries (a
// block's rows then start their keys at different positions), the queries as the last Tq of Tk
// positions, a given scale, and a window holding the whole sequence (equal to causal attention).
TEST_P(Ops, SlidingWindowAndSoftCappedAttentionForwardAndBackward) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "attention_forward", "attention_backward");
  struct Case {
    int64_t Tq, Tk, hd, window;
    float scale;
  };
  for (const Case c :
       {Case{8, 8, 4, 4, 0.0f}, Case{150, 150, 8, 5, 0.0f}, Case{70, 70, 16, 1, 0.3f},
        Case{3, 9, 4, 4, 0.0f}, Case{130, 130, 8, 64, 0.0f}, Case{6, 6, 4, 6, 0.0f}}) {
    const int64_t B = 2, NH = 2;
    Tensor q = randn({B, NH, c.Tq, c.hd}, 50, 1.5f), k = randn({B, NH, c.Tk, c.hd}, 51, 1.5f),
           v = randn({B, NH, c.Tk, c.hd}, 52), g = randn({B, NH, c.Tq, c.hd}, 53);
    for (Tensor* t : {&q, &k, &v}) t->set_requires_grad(true);
    const double scale = c.scale > 0.0f ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.hd));
    const WindowedRef want =
        windowed_attention_ref(host_vector(q), host_vector(k), host_vector(v), host_vector(g),
                               B * NH, c.Tq, c.Tk, c.hd, c.window, scale);
    ops::AttentionMask mask;
    mask.window = c.window;
    Tensor y = ops::attention(q, k, v, mask, c.scale);
    const std::string what = "Tq " + std::to_string(c.Tq) + " Tk " + std::to_string(c.Tk) +
                             " window " + std::to_string(c.window);
    expect_close(host_vector(y), want.out, 2e-5, 1e-4, ("windowed attention " + what).c_str());
    ops::sum(ops::mul(y, g)).backward();
    expect_close(host_vector(q.grad()), want.dq, 5e-5, 5e-4, ("dq " + what).c_str());
    expect_close(host_vector(k.grad()), want.dk, 5e-5, 5e-4, ("dk " + what).c_str());
    expect_close(host_vector(v.grad()), want.dv, 5e-5, 5e-4, ("dv " + what).c_str());
  }
  // Soft-capped scores (Gemma 2), alone and with a window, across a 64-row block boundary.
  for (const Case c :
       {Case{70, 70, 8, 0, 0.0f}, Case{70, 70, 8, 6, 0.0f}, Case{5, 9, 4, 0, 0.0f}}) {
    const int64_t B = 1, NH = 2;
    const float cap = 1.5f;  // scores of O(3) at this scale: tanh well into its bend
    Tensor q = randn({B, NH, c.Tq, c.hd}, 55, 2.0f), k = randn({B, NH, c.Tk, c.hd}, 56, 2.0f),
           v = randn({B, NH, c.Tk, c.hd}, 57), g = randn({B, NH, c.Tq, c.hd}, 58);
    for (Tensor* t : {&q, &k, &v}) t->set_requires_grad(true);
    const WindowedRef want = windowed_attention_ref(
        host_vector(q), host_vector(k), host_vector(v), host_vector(g), B * NH, c.Tq, c.Tk, c.hd,
        c.window, 1.0 / std::sqrt(static_cast<double>(c.hd)), cap);
    ops::AttentionMask mask;
    mask.window = c.window;
    mask.softcap = cap;
    Tensor y = ops::attention(q, k, v, mask);
    const std::string what =
        "softcap, Tq " + std::to_string(c.Tq) + " window " + std::to_string(c.window);
    expect_close(host_vector(y), want.out, 2e-5, 1e-4, ("attention " + what).c_str());
    ops::sum(ops::mul(y, g)).backward();
    expect_close(host_vector(q.grad()), want.dq, 5e-5, 5e-4, ("dq " + what).c_str());
    expect_close(host_vector(k.grad()), want.dk, 5e-5, 5e-4, ("dk " + what).c_str());
    expect_close(host_vector(v.grad()), want.dv, 5e-5, 5e-4, ("dv " + what).c_str());
  }
  // A window is causal and unpadded only.
  Tensor q = randn({1, 1, 4, 2}, 54);
  ops::AttentionMask bad;
  bad.window = 2;
  bad.causal = false;
  EXPECT_NE(error_of([&] { ops::attention(q, q, q, bad); }).find("sliding window (2)"),
            std::string::npos);
  bad.causal = true;
  bad.key_lengths = {3};
  EXPECT_NE(error_of([&] { ops::attention(q, q, q, bad); }).find("without key lengths"),
            std::string::npos);
}

TEST_P(Ops, CausalAttentionAcceptsStridedInputs) {
  // A GPT block hands attention permuted views; the op makes them contiguous for the kernel.
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "attention_forward", "copy");
  Tensor q = randn({2, 2, 5, 4}, 12), k = randn({2, 2, 5, 4}, 13), v = randn({2, 2, 5, 4}, 14);
  Tensor qs = ops::transpose(ops::transpose(q, 2, 3).contiguous(), 2, 3);  // same values, strided
  ASSERT_FALSE(qs.is_contiguous());
  EXPECT_EQ(host_vector(ops::causal_attention(qs, k, v)),
            host_vector(ops::causal_attention(q, k, v)));
}

// ---- decoding kernels (models::IncrementalDecoder) ----

// Backend::decode_attention against a double loop: grouped-query heads (4 query heads on 2 KV
// heads), chunks of 1 and 3 rows after 0, 5 and 70 cached positions, cache rows past p0 + n left
// as garbage the kernel must not read. The base class's default (gather + attention_forward) is
// checked too: it is what a backend without its own kernel runs.
TEST_P(Ops, DecodeAttentionMatchesNaiveWithGroupedHeads) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "decode_attention", "attention_forward", "copy");
  const int64_t NH = 4, KV = 2, hd = 16;
  const float scale = 0.25f;
  for (int64_t p0 : {0, 5, 70})
    for (int64_t n : {1, 3}) {
      const int64_t P = p0 + n + 2;
      const uint64_t seed = static_cast<uint64_t>(p0 * 10 + n);
      Tensor q = randn({NH, n, hd}, seed), kc = randn({P, KV, hd}, seed + 1),
             vc = randn({P, KV, hd}, seed + 2);
      const std::vector<float> qh = host_vector(q), kh = host_vector(kc), vh = host_vector(vc);
      std::vector<double> want(static_cast<size_t>(n * NH * hd));
      for (int64_t h = 0; h < NH; ++h)
        for (int64_t i = 0; i < n; ++i) {
          const int64_t kvh = h / (NH / KV), last = p0 + i;
          std::vector<double> w(static_cast<size_t>(last + 1));
          double mx = -INFINITY, z = 0;
          for (int64_t j = 0; j <= last; ++j) {
            double d = 0;
            for (int64_t e = 0; e < hd; ++e)
              d += static_cast<double>(qh[static_cast<size_t>((h * n + i) * hd + e)]) *
                   kh[static_cast<size_t>((j * KV + kvh) * hd + e)];
            w[static_cast<size_t>(j)] = d * scale;
            mx = std::max(mx, d * scale);
          }
          for (double& x : w) z += (x = std::exp(x - mx));
          for (int64_t e = 0; e < hd; ++e) {
            double acc = 0;
            for (int64_t j = 0; j <= last; ++j)
              acc += w[static_cast<size_t>(j)] * vh[static_cast<size_t>((j * KV + kvh) * hd + e)];
            want[static_cast<size_t>((i * NH + h) * hd + e)] = acc / z;
          }
        }
      const std::string what = "p0 " + std::to_string(p0) + " n " + std::to_string(n);
      expect_close(host_vector(ops::decode_attention(q, kc, vc, p0, scale)), want, 2e-6, 1e-5,
                   what.c_str());
      Tensor out = Tensor::empty({n, NH, hd}, DType::f32, device());
      backend::get(device()).backend::Backend::decode_attention(q, kc, vc, p0, scale, 0.0f, out);
      expect_close(host_vector(out), want, 2e-6, 1e-5, ("default, " + what).c_str());
    }
  EXPECT_NE(error_of([&] {
              ops::decode_attention(randn({3, 1, 16}, 1), randn({8, 2, 16}, 2),
                                    randn({8, 2, 16}, 3), 0, 1.0f);
            }).find("multiple of KV"),
            std::string::npos);
}

// Backend::linear_rows: each row is what it is alone, bit for bit, whatever the row count (the
// CPU kernel's four-row and one-row paths, K not a multiple of the vector width), and close to
// the GEMM path; the base class's default (one GEMM per row) has the same property.
TEST_P(Ops, LinearRowsEachRowIndependentOfTheBatch) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "linear_rows", "gemm", "axpy");
  const int64_t R = 7, K = 45, N = 33;
  Tensor x = randn({R, K}, 21), w = randn({N, K}, 22, 0.3f), b = randn({N}, 23);
  const std::vector<float> all = host_vector(ops::linear_rows(x, w, b));
  std::vector<double> gemm;
  for (float v : host_vector(ops::linear(x, w, b))) gemm.push_back(v);
  expect_close(all, gemm, 1e-5, 1e-5, "linear_rows vs linear");
  Tensor dflt = Tensor::empty({R, N}, DType::f32, device());
  backend::get(device()).backend::Backend::linear_rows(x, w, b, dflt);
  const std::vector<float> dv = host_vector(dflt);
  expect_close(dv, gemm, 1e-5, 1e-5, "default vs linear");
  for (int64_t r = 0; r < R; ++r) {
    const Tensor row = ops::slice(x, 0, r, r + 1).contiguous();
    const std::vector<float> one = host_vector(ops::linear_rows(row, w, b));
    for (int64_t c = 0; c < N; ++c)
      ASSERT_EQ(one[static_cast<size_t>(c)], all[static_cast<size_t>(r * N + c)])
          << "row " << r << " col " << c;
    Tensor one_d = Tensor::empty({1, N}, DType::f32, device());
    backend::get(device()).backend::Backend::linear_rows(row, w, b, one_d);
    const std::vector<float> od = host_vector(one_d);
    for (int64_t c = 0; c < N; ++c)
      ASSERT_EQ(od[static_cast<size_t>(c)], dv[static_cast<size_t>(r * N + c)])
          << "default, row " << r << " col " << c;
  }
}

// bf16 decode (ds_generate / ds_serve --dtype bf16): bf16 weights and bf16 KV caches go to the
// decode kernels as they are where the backend says it takes them (the CPU: widened in registers,
// fp32 accumulation). Reference: the same kernels on the fp32 widening of the same bf16 values.
// Tolerance where the kernel takes bf16: none (bit for bit: the widening is exact and the
// arithmetic after the load is the fp32 kernel's, in its order). Elsewhere (sim: ops::linear for
// a bf16 weight, the caches' rows widened for Backend's default) within fp32 rounding: 1e-5
// absolute and relative on outputs of O(1) (K = 45 or 160 products of O(0.3)).
TEST_P(Ops, Bf16DecodeKernelsEqualFp32OnTheWidenedValues) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "linear_rows", "decode_attention", "gemm", "copy",
                           "attention_forward");
  const bool takes_w = backend::get(device()).supports("linear_rows", DType::bf16);
  const bool takes_kv = backend::get(device()).supports("decode_attention", DType::bf16);
  if (device().is_cpu()) {
    EXPECT_TRUE(takes_w);
    EXPECT_TRUE(takes_kv);
  }
  auto expect_equal = [&](const std::vector<float>& got, const std::vector<float>& want,
                          bool bitwise, const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    if (bitwise) {
      for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << what << " at " << i;
    } else {
      expect_close(got, std::vector<double>(want.begin(), want.end()), 1e-5, 1e-5, what.c_str());
    }
  };
  // linear_rows: K with a tail (45) and a multiple of the 16-value chunk (160); 7 rows take the
  // four-row and the one-row paths; x in fp32 and in bf16 (the bf16 model's activations).
  for (int64_t K : {45, 160}) {
    const int64_t R = 7, N = 33;
    const Tensor w16 = randn({N, K}, 31, 0.3f).to(DType::bf16), b = randn({N}, 32);
    const Tensor w32 = w16.to(DType::f32);
    const Tensor x = randn({R, K}, 33);
    const std::string what = "K " + std::to_string(K);
    const std::vector<float> all = host_vector(ops::linear_rows(x, w16, b));
    expect_equal(all, host_vector(ops::linear_rows(x, w32, b)), takes_w, "linear_rows " + what);
    const Tensor x16 = x.to(DType::bf16);
    const Tensor y16 = ops::linear_rows(x16, w16, b);
    EXPECT_EQ(y16.dtype(), DType::bf16);
    expect_equal(
        host_vector(y16.to(DType::f32)),
        host_vector(ops::linear_rows(x16.to(DType::f32), w32, b).to(DType::bf16).to(DType::f32)),
        takes_w, "bf16 x, " + what);
    if (!takes_w) continue;
    // Each row alone is the batch's row, bit for bit (continuous batching with bf16 weights).
    for (int64_t r = 0; r < R; ++r) {
      const std::vector<float> one =
          host_vector(ops::linear_rows(ops::slice(x, 0, r, r + 1).contiguous(), w16, b));
      for (int64_t c = 0; c < N; ++c)
        ASSERT_EQ(one[static_cast<size_t>(c)], all[static_cast<size_t>(r * N + c)])
            << what << " row " << r << " col " << c;
    }
  }
  // decode_attention with bf16 caches: grouped heads, head sizes with and without a tail past
  // the 8-lane chunks, 1 and 3 new rows after 0, 5 and 70 cached positions, rows past p0 + n
  // unread.
  const int64_t NH = 4, KV = 2;
  for (int64_t hd : {16, 20})
    for (int64_t p0 : {0, 5, 70})
      for (int64_t n : {1, 3}) {
        const int64_t P = p0 + n + 2;
        const uint64_t seed = static_cast<uint64_t>(p0 * 10 + n + hd * 1000);
        const Tensor q = randn({NH, n, hd}, seed);
        const Tensor kc = randn({P, KV, hd}, seed + 1).to(DType::bf16),
                     vc = randn({P, KV, hd}, seed + 2).to(DType::bf16);
        const std::string what =
            "hd " + std::to_string(hd) + " p0 " + std::to_string(p0) + " n " + std::to_string(n);
        expect_equal(
            host_vector(ops::decode_attention(q, kc, vc, p0, 0.25f)),
            host_vector(ops::decode_attention(q, kc.to(DType::f32), vc.to(DType::f32), p0, 0.25f)),
            true, "decode_attention " + what);
      }
  EXPECT_NE(error_of([&] {
              ops::decode_attention(randn({4, 1, 16}, 1), randn({8, 2, 16}, 2).to(DType::bf16),
                                    randn({8, 2, 16}, 3), 0, 1.0f);
            }).find("both alike"),
            std::string::npos);
}

// ---- rope ----

TEST_P(Ops, RopeMatchesRotateHalf) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "rope");
  const int64_t B = 2, NH = 3, T = 5, hd = 8, pos0 = 11;
  const float theta = 10000.0f;
  Tensor x = randn({B, NH, T, hd}, 13);
  const auto xv = host_vector(x);
  std::vector<double> want(xv.size());
  for (int64_t r = 0; r < B * NH * T; ++r) {
    const int64_t p = pos0 + r % T;
    for (int64_t i = 0; i < hd / 2; ++i) {
      const double a = p * std::pow(static_cast<double>(theta), -2.0 * i / hd);
      const double x1 = xv[static_cast<size_t>(r * hd + i)],
                   x2 = xv[static_cast<size_t>(r * hd + i + hd / 2)];
      want[static_cast<size_t>(r * hd + i)] = x1 * std::cos(a) - x2 * std::sin(a);
      want[static_cast<size_t>(r * hd + i + hd / 2)] = x2 * std::cos(a) + x1 * std::sin(a);
    }
  }
  expect_close(host_vector(ops::rope(x, theta, pos0)), want, 1e-6, 1e-6, "rope");
  // Given frequencies (nn::rope_inv_freq): theta's are the same op; scale multiplies cos and sin.
  std::vector<double> inv(hd / 2);
  for (int64_t i = 0; i < hd / 2; ++i) inv[i] = std::pow(static_cast<double>(theta), -2.0 * i / hd);
  EXPECT_EQ(host_vector(ops::rope(x, inv, 1.0f, pos0)), host_vector(ops::rope(x, theta, pos0)));
  std::vector<double> want2(want);
  for (auto& w : want2) w *= 1.5;
  expect_close(host_vector(ops::rope(x, inv, 1.5f, pos0)), want2, 1e-6, 1e-6, "rope scaled");
  // Position 0 is the identity.
  Tensor x0 = randn({1, 1, 1, hd}, 14);
  EXPECT_EQ(host_vector(ops::rope(x0)), host_vector(x0));
  EXPECT_NE(error_of([&] {
              ops::rope(randn({1, 1, 2, 5}, 15));
            }).find("[rope]"),
            std::string::npos);
}

// GLM / ChatGLM: only the first r = 2 * inv_freq.size() dims rotate, pairs (2i, 2i+1); the rest
// pass through unchanged (transformers' glm apply_rotary_pos_emb, written out).
TEST_P(Ops, RopePartialInterleaved) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "rope");
  const int64_t B = 2, NH = 3, T = 5, hd = 8, r = 4, pos0 = 3;
  Tensor x = randn({B, NH, T, hd}, 16);
  const auto xv = host_vector(x);
  const std::vector<double> inv = {1.0, 0.01};
  for (bool interleaved : {true, false}) {
    std::vector<double> want(xv.begin(), xv.end());
    for (int64_t row = 0; row < B * NH * T; ++row) {
      const int64_t p = pos0 + row % T;
      for (int64_t i = 0; i < r / 2; ++i) {
        const int64_t a_i = interleaved ? 2 * i : i, b_i = interleaved ? 2 * i + 1 : i + r / 2;
        const double a = p * inv[static_cast<size_t>(i)];
        const double x1 = xv[static_cast<size_t>(row * hd + a_i)],
                     x2 = xv[static_cast<size_t>(row * hd + b_i)];
        want[static_cast<size_t>(row * hd + a_i)] = x1 * std::cos(a) - x2 * std::sin(a);
        want[static_cast<size_t>(row * hd + b_i)] = x2 * std::cos(a) + x1 * std::sin(a);
      }
    }
    expect_close(host_vector(ops::rope(x, inv, 1.0f, pos0, interleaved)), want, 1e-6, 1e-6,
                 interleaved ? "rope interleaved" : "rope partial");
  }
  EXPECT_NE(error_of([&] { ops::rope(x, std::vector<double>(5, 1.0)); }).find("need 1 .. hd/2"),
            std::string::npos);
}

// ---- cross-entropy ----

TEST_P(Ops, CrossEntropyMatchesReference) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "cross_entropy_forward", "cross_entropy_backward");
  const int64_t N = 7, Vc = 5000;  // several 2048-wide chunks, the last partial
  std::vector<float> lv = host_vector(randn({N, Vc}, 16, 3.0f));
  for (int64_t i = 0; i < Vc; ++i)
    lv[static_cast<size_t>(3 * Vc + i)] += 0.01f * i;  // max in the last chunk
  lv[static_cast<size_t>(5 * Vc + 4999)] = 60.0f;
  Tensor logits = from_data(lv, {N, Vc});
  const std::vector<int64_t> tv = {0, 4999, -100, 2048, 17, 4999, -100};
  Tensor targets = from_ints(tv, {N});
  double total = 0;
  int count = 0;
  for (int64_t n = 0; n < N; ++n) {
    if (tv[static_cast<size_t>(n)] == -100) continue;
    double m = -INFINITY, s = 0;
    for (int64_t i = 0; i < Vc; ++i) m = std::max<double>(m, lv[static_cast<size_t>(n * Vc + i)]);
    for (int64_t i = 0; i < Vc; ++i) s += std::exp(lv[static_cast<size_t>(n * Vc + i)] - m);
    total += m + std::log(s) - lv[static_cast<size_t>(n * Vc + tv[static_cast<size_t>(n)])];
    ++count;
  }
  Tensor loss = ops::cross_entropy(logits, targets);
  EXPECT_EQ(loss.dim(), 0);
  EXPECT_NEAR(to_host(loss).item(), total / count, 1e-5 * (1 + std::abs(total / count)));

  // The gradient: (softmax - onehot) / count per row, zero rows for ignored targets.
  logits.set_requires_grad(true);
  ops::cross_entropy(logits, targets).backward();
  const auto g = host_vector(logits.grad());
  for (int64_t n = 0; n < N; ++n) {
    const int64_t t = tv[static_cast<size_t>(n)];
    double m = -INFINITY, s = 0;
    for (int64_t i = 0; i < Vc; ++i) m = std::max<double>(m, lv[static_cast<size_t>(n * Vc + i)]);
    for (int64_t i = 0; i < Vc; ++i) s += std::exp(lv[static_cast<size_t>(n * Vc + i)] - m);
    for (int64_t i = 0; i < Vc; ++i) {
      const double want =
          t == -100 ? 0.0
                    : (std::exp(lv[static_cast<size_t>(n * Vc + i)] - m) / s - (i == t)) / count;
      ASSERT_NEAR(g[static_cast<size_t>(n * Vc + i)], want, 1e-7 + 1e-5 * std::abs(want))
          << n << "," << i;
    }
  }
}

TEST_P(Ops, CrossEntropyAllIgnoredIsZeroWithZeroGradient) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "cross_entropy_forward", "cross_entropy_backward");
  Tensor logits = randn({3, 4}, 17);
  logits.set_requires_grad(true);
  Tensor loss = ops::cross_entropy(logits, from_ints({-100, -100, -100}, {3}));
  EXPECT_EQ(to_host(loss).item(), 0.0f);
  loss.backward();
  for (float v : host_vector(logits.grad())) EXPECT_EQ(v, 0.0f);
}

TEST_P(Ops, CrossEntropyRejectsOutOfRangeTargets) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "cross_entropy_forward");
  Tensor logits = randn({2, 4}, 18);
  const std::string e = error_of([&] { ops::cross_entropy(logits, from_ints({1, 4}, {2})); });
  EXPECT_NE(e.find("[cross_entropy]"), std::string::npos) << e;
  EXPECT_NE(e.find("target 4"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { ops::cross_entropy(logits, from_ints({-1, 0}, {2})); }), "");
  EXPECT_NE(error_of([&] { ops::cross_entropy(logits, from_ints({0, 0, 0}, {3})); }), "");
}

// ---- the kernels that replaced host loops: bce_with_logits, max's backward, the
// vocabulary-parallel cross entropy. Each against the host loop it replaced (bitwise on the CPU),
// and the base-class default (Backend::..., composed of other kernels: what a device without its
// own kernel runs) against the same loop, called on this device's backend by qualified name. ----

namespace {
// The host loops of src/ops/nn.cpp and src/nn/tensor_parallel.cpp before they became kernels.
double old_bce_sum(const std::vector<float>& x, const std::vector<float>& y) {
  double total = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    total += std::max(v, 0.0) - v * y[i] + std::log1p(std::exp(-std::abs(v)));
  }
  return total;
}
struct OldVocabCe {
  std::vector<float> max, sum_exp, target, grad;
};
OldVocabCe old_vocab_ce(const std::vector<float>& L, const std::vector<int64_t>& t, int64_t N,
                        int64_t Vl, int64_t v0, int64_t ignore, float scale) {
  OldVocabCe r{std::vector<float>(N), std::vector<float>(N), std::vector<float>(N),
               std::vector<float>(static_cast<size_t>(N * Vl))};
  for (int64_t n = 0; n < N; ++n) {
    const float* row = L.data() + n * Vl;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < Vl; ++j) m = std::max(m, row[j]);
    r.max[n] = m;
    const int64_t v = t[n] - v0;
    r.target[n] = (v >= 0 && v < Vl) ? row[v] : 0.0f;
    double s = 0.0;
    for (int64_t j = 0; j < Vl; ++j) s += std::exp(static_cast<double>(row[j] - m));
    r.sum_exp[n] = static_cast<float>(s);
    float* dr = r.grad.data() + n * Vl;
    if (t[n] == ignore) continue;  // zeros
    const float inv = 1.0f / r.sum_exp[n];
    for (int64_t j = 0; j < Vl; ++j) dr[j] = std::exp(row[j] - m) * inv * scale;
    if (v >= 0 && v < Vl) dr[v] -= scale;
  }
  return r;
}
}  // namespace

TEST_P(Ops, BceWithLogitsKernelIsTheHostLoop) {
  backend::Backend& be = backend::get(device());
  for (int64_t n : {int64_t{1000}, int64_t{70000}}) {  // one tile, and two (2^16 each)
    Tensor x = randn({n}, 60, 8.0f), y = uniform({n}, 61, 0.0f, 1.0f);
    const auto xv = host_vector(x), yv = host_vector(y);
    const double want = old_bce_sum(xv, yv);
    const double got = be.bce_with_logits_sum(x, y);
    const bool cpu = device().is_cpu();  // elsewhere the kernel may be the composed default
    if (cpu && n <= 65536) EXPECT_EQ(got, want);  // same terms, same order
    EXPECT_NEAR(got, want, (cpu ? 1e-12 : 1e-5) * std::abs(want)) << n;
    // The composed default sums fp32 terms.
    EXPECT_NEAR(be.backend::Backend::bce_with_logits_sum(x, y), want, 1e-5 * std::abs(want)) << n;
    const double scale = 0.37 / static_cast<double>(n);
    Tensor d = Tensor::empty({n}, DType::f32, device()),
           dd = Tensor::empty({n}, DType::f32, device());
    be.bce_with_logits_backward(x, y, scale, d);
    be.backend::Backend::bce_with_logits_backward(x, y, scale, dd);
    const auto dv = host_vector(d), ddv = host_vector(dd);
    for (int64_t i = 0; i < n; ++i) {
      const float w =
          static_cast<float>((1.0 / (1.0 + std::exp(-static_cast<double>(xv[i]))) - yv[i]) * scale);
      if (cpu) ASSERT_EQ(dv[i], w) << i;
      ASSERT_NEAR(dv[i], w, 1e-6 * scale) << i;
      ASSERT_NEAR(ddv[i], w, 1e-6 * scale) << i;
    }
  }
  // The op: mean and gradient, on this device.
  Tensor x = leaf({3, 5}, 62, 3.0f);
  Tensor y = uniform({3, 5}, 63, 0.0f, 1.0f);
  Tensor loss = ops::bce_with_logits(x, y);
  EXPECT_EQ(loss.device(), device());
  const float want = static_cast<float>(old_bce_sum(host_vector(x), host_vector(y)) / 15.0);
  if (device().is_cpu()) EXPECT_EQ(to_host(loss).item(), want);
  EXPECT_NEAR(to_host(loss).item(), want, 1e-6 * std::abs(want));
  loss.backward();
  EXPECT_EQ(x.grad().device(), device());
}

TEST_P(Ops, MaxBackwardGoesToTheFirstMaximum) {
  backend::Backend& be = backend::get(device());
  // (outer, reduced, inner) = (3, 4, 5) with ties: columns hold each value twice.
  std::vector<float> xv(60);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = static_cast<float>((i * 7) % 11 % 4);
  const int64_t outer = 3, red = 4, inner = 5;
  Tensor x = from_data(xv, {outer, red, inner});
  x.set_requires_grad(true);
  Tensor m = ops::max(x, 1);
  const auto mv = host_vector(m);
  std::vector<float> gv(15);
  for (size_t i = 0; i < gv.size(); ++i) gv[i] = 1.0f + static_cast<float>(i);
  ops::sum(ops::mul(m, from_data(gv, {outer, inner}))).backward();
  std::vector<float> want(60, 0.0f);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i)
      for (int64_t r = 0; r < red; ++r)
        if (xv[(o * red + r) * inner + i] == mv[o * inner + i]) {
          want[(o * red + r) * inner + i] = gv[o * inner + i];
          break;
        }
  EXPECT_EQ(host_vector(x.grad()), want);
  // The default (host copies through the CPU kernel) gives the same.
  Tensor dx = Tensor::empty({outer, red, inner}, DType::f32, device());
  be.backend::Backend::max_backward(x.detach(), m.detach(), from_data(gv, {outer, inner}), outer,
                                    red, inner, dx);
  EXPECT_EQ(host_vector(dx), want);
}

TEST_P(Ops, VocabParallelCrossEntropyKernelsAreTheHostLoops) {
  backend::Backend& be = backend::get(device());
  // This rank holds columns [40, 40 + 300) of a larger vocabulary: targets here, elsewhere, on
  // either edge, and ignored.
  const int64_t N = 6, Vl = 300, v0 = 40, ignore = -100;
  const float scale = 0.25f;
  std::vector<float> lv = host_vector(randn({N, Vl}, 64, 4.0f));
  lv[2 * Vl + 7] = -std::numeric_limits<float>::infinity();  // a masked logit
  const std::vector<int64_t> tv = {40, 339, 5, ignore, 1000, 41 + 100};
  const Tensor logits = from_data(lv, {N, Vl}), targets = from_ints(tv, {N});
  const OldVocabCe want = old_vocab_ce(lv, tv, N, Vl, v0, ignore, scale);
  auto run = [&](bool base) {
    OldVocabCe got;
    Tensor mx = Tensor::empty({N}, DType::f32, device()),
           tl = Tensor::empty({N}, DType::f32, device());
    Tensor se = Tensor::empty({N}, DType::f32, device());
    Tensor d = Tensor::empty({N, Vl}, DType::f32, device());
    if (base) {
      be.backend::Backend::vocab_ce_stats(logits, targets, v0, mx, tl);
      be.backend::Backend::vocab_ce_sum_exp(logits, mx, se);
      be.backend::Backend::vocab_ce_backward(logits, targets, v0, ignore, mx, se, scale, d);
    } else {
      be.vocab_ce_stats(logits, targets, v0, mx, tl);
      be.vocab_ce_sum_exp(logits, mx, se);
      be.vocab_ce_backward(logits, targets, v0, ignore, mx, se, scale, d);
    }
    return OldVocabCe{host_vector(mx), host_vector(se), host_vector(tl), host_vector(d)};
  };
  const OldVocabCe got = run(false), def = run(true);
  EXPECT_EQ(got.max, want.max);
  EXPECT_EQ(got.target, want.target);
  EXPECT_EQ(def.max, want.max);
  EXPECT_EQ(def.target, want.target);
  if (device().is_cpu()) {
    EXPECT_EQ(got.sum_exp, want.sum_exp);
    EXPECT_EQ(got.grad, want.grad);
  }
  for (int64_t n = 0; n < N; ++n) {
    EXPECT_NEAR(got.sum_exp[n], want.sum_exp[n], 1e-6 * want.sum_exp[n]) << n;
    EXPECT_NEAR(def.sum_exp[n], want.sum_exp[n], 1e-5 * want.sum_exp[n]) << n;
  }
  for (size_t i = 0; i < want.grad.size(); ++i) {
    ASSERT_NEAR(got.grad[i], want.grad[i], 1e-6) << i;
    ASSERT_NEAR(def.grad[i], want.grad[i], 1e-6) << i;
  }
}

// ---- embedding ----

TEST_P(Ops, EmbeddingGathersRowsAndRejectsBadIds) {
  // The dtype asked for is the weight's: ids are int32 or int64 on every backend (backend.h).
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "embedding_forward");
  Tensor w = randn({10, 6}, 19);
  const auto wv = host_vector(w);
  for (DType idt : {DType::i32, DType::i64}) {
    Tensor ids = from_ints({3, 0, 9, 3}, {2, 2}, idt);
    Tensor y = ops::embedding(w, ids);
    EXPECT_EQ(y.shape(), (Shape{2, 2, 6}));
    const auto yv = host_vector(y);
    const int64_t idv[] = {3, 0, 9, 3};
    for (int n = 0; n < 4; ++n)
      for (int c = 0; c < 6; ++c)
        ASSERT_EQ(yv[static_cast<size_t>(n * 6 + c)], wv[static_cast<size_t>(idv[n] * 6 + c)]);
    const std::string e = error_of([&] { ops::embedding(w, from_ints({1, 10}, {2}, idt)); });
    EXPECT_NE(e.find("[embedding]"), std::string::npos) << e;
    EXPECT_NE(e.find("id 10"), std::string::npos) << e;
    EXPECT_NE(e.find("vocabulary size 10"), std::string::npos) << e;
    EXPECT_NE(error_of([&] { ops::embedding(w, from_ints({-1}, {1}, idt)); }), "");
  }
  EXPECT_NE(error_of([&] { ops::embedding(w, randn({2}, 20)); }).find("[embedding]"),
            std::string::npos);
}

// ---- dropout ----

TEST_P(Ops, DropoutContract) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "dropout");
  const rng::DropoutState saved = rng::dropout_state();
  const float p = 0.3f;
  Tensor x = uniform({4, 25000}, 21, 1.0f, 2.0f);
  const auto xv = host_vector(x);

  // Identity when not training or p == 0: the input itself comes back.
  EXPECT_TRUE(ops::dropout(x, p, false).same(x));
  EXPECT_TRUE(ops::dropout(x, 0.0f, true).same(x));

  rng::dropout_state() = {42, 5, 0};
  const auto a = host_vector(ops::dropout(x, p, true));
  EXPECT_EQ(rng::dropout_state().offset, 6u) << "one stream per call";
  // Mask fraction and scaling of the kept values.
  size_t zeros = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == 0.0f) {
      ++zeros;
    } else {
      ASSERT_FLOAT_EQ(a[i], xv[i] / (1.0f - p));
    }
  }
  EXPECT_NEAR(static_cast<double>(zeros) / a.size(), p, 0.01);

  // Same state: same mask. Different offset: different mask.
  rng::dropout_state() = {42, 5, 0};
  EXPECT_EQ(host_vector(ops::dropout(x, p, true)), a);
  rng::dropout_state() = {42, 6, 0};
  const auto b = host_vector(ops::dropout(x, p, true));
  size_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += (a[i] == 0.0f) != (b[i] == 0.0f);
  EXPECT_GT(differ, a.size() / 4);

  // Rank equivalence: samples [0, 2) with sample_base 0 and [2, 4) with sample_base 2 draw the
  // mask that one process draws for the batch of 4.
  rng::dropout_state() = {42, 5, 0};
  const auto lo = host_vector(ops::dropout(ops::slice(x, 0, 0, 2), p, true));
  rng::dropout_state() = {42, 5, 2};
  const auto hi = host_vector(ops::dropout(ops::slice(x, 0, 2, 4), p, true));
  std::vector<float> joined = lo;
  joined.insert(joined.end(), hi.begin(), hi.end());
  EXPECT_EQ(joined, a);

  // 16-bit input: same mask, bf16 output. The dropout kernel takes any float dtype (backend.h), but
  // CpuBackend::supports answers only fp32 for it, so on the CPU this part runs without asking
  // (it always has): drop `|| device().is_cpu()` once supports() says yes for bf16 dropout.
  if ((ds::testing::supported(device(), "dropout", DType::bf16) &&
       ds::testing::supported(device(), "copy", DType::bf16)) ||
      device().is_cpu()) {
    rng::dropout_state() = {42, 5, 0};
    Tensor yb = ops::dropout(x.to(DType::bf16), p, true);
    EXPECT_EQ(yb.dtype(), DType::bf16);
    const auto bv = host_vector(yb);
    for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(bv[i] == 0.0f, a[i] == 0.0f) << i;
  }
  rng::dropout_state() = saved;
}

// ---- thread-count independence (CPU backend only: its parallel_for and chunking) ----

TEST(OpsCpu, KernelsAreBitwiseIndependentOfThreadCount) {
  // fp32, and bf16 through the kernels' 16-bit path (row blocks, per-head scratch).
  auto run = [](DType dt) {
    std::vector<std::vector<float>> r;
    auto randn = [dt](const Shape& s, uint64_t seed) {
      return ds::testing::randn(s, seed, 1.0f, dt);
    };
    auto uniform = [dt](const Shape& s, uint64_t seed) {
      return ds::testing::uniform(s, seed, 0.5f, 1.5f).to(dt);
    };
    Tensor x = randn({300, 96}, 22), w = uniform({96}, 23), b = randn({96}, 24);
    for (Tensor* t : {&x, &w, &b}) t->set_requires_grad(true);
    Tensor y = ops::layer_norm(x, w, b);
    ops::sum(ops::mul(y, randn({300, 96}, 25))).backward();
    r.push_back(y.to_vector());
    for (Tensor* t : {&x, &w, &b}) r.push_back(t->grad().to_vector());

    Tensor w2 = uniform({96}, 26);
    w2.set_requires_grad(true);
    ops::sum(ops::mul(ops::rms_norm(x.detach(), w2), randn({300, 96}, 27))).backward();
    r.push_back(w2.grad().to_vector());

    Tensor q = randn({2, 3, 70, 8}, 28), k = randn({2, 3, 70, 8}, 29), v = randn({2, 3, 70, 8}, 30);
    for (Tensor* t : {&q, &k, &v}) t->set_requires_grad(true);
    Tensor o = ops::causal_attention(q, k, v);
    ops::sum(ops::mul(o, randn({2, 3, 70, 8}, 31))).backward();
    r.push_back(o.to_vector());
    for (Tensor* t : {&q, &k, &v}) r.push_back(t->grad().to_vector());

    Tensor e = randn({7, 40}, 32);
    e.set_requires_grad(true);
    ops::sum(ops::mul(ops::embedding(e, Tensor::from_ints({1, 1, 3, 1, 6, 3, 1, 0}, {8})),
                      randn({8, 40}, 33)))
        .backward();
    r.push_back(e.grad().to_vector());

    Tensor s = randn({300, 96}, 34), gate = randn({300, 96}, 35), up = randn({300, 96}, 36);
    for (Tensor* t : {&s, &gate, &up}) t->set_requires_grad(true);
    Tensor z = ops::add(ops::softmax(s), ops::swiglu(gate, up));
    ops::sum(ops::mul(z, randn({300, 96}, 37))).backward();
    r.push_back(z.to_vector());
    for (Tensor* t : {&s, &gate, &up}) r.push_back(t->grad().to_vector());
    return r;
  };
  for (const DType dt : {DType::f32, DType::bf16}) {
    std::vector<std::vector<float>> one, two;
    {
      ThreadCount t(1);
      one = run(dt);
    }
    {
      ThreadCount t(2);
      two = run(dt);
    }
    ASSERT_EQ(one.size(), two.size());
    for (size_t i = 0; i < one.size(); ++i)
      EXPECT_EQ(one[i], two[i]) << "result " << i << " " << dtype_name(dt);
  }
}

// ---- 16-bit inputs ----

TEST_P(Ops, Bf16InputsGiveBf16OutputsCloseToFp32) {
  // On a backend whose kernels take bf16 (supports) the ops pass it through; otherwise they upcast
  // 16-bit inputs with copy and run the fp32 kernels (src/ops/nn.cpp).
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::bf16, "copy");
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::f32, "layer_norm_forward", "layer_norm_backward",
                           "rms_norm_forward", "unary", "binary", "softmax_forward",
                           "attention_forward", "rope", "embedding_forward",
                           "cross_entropy_forward", "reduce");
  // The losses are fp32 scalars for any input dtype (ops.h), everything else bf16.
  auto close = [](const Tensor& y16, const Tensor& y32, const char* what) {
    EXPECT_EQ(y16.dtype(), std::string(what) == "cross_entropy" ? DType::f32 : DType::bf16) << what;
    const auto a = host_vector(y16), b = host_vector(y32);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i)
      ASSERT_NEAR(a[i], b[i], 0.02 * (1 + std::abs(b[i]))) << what << " " << i;
  };
  auto bf = [](const Tensor& t) { return t.to(DType::bf16); };
  // Inputs rounded to bf16 first, so fp32 and bf16 runs see the same values.
  auto r = [&](const Shape& s, uint64_t seed) { return bf(randn(s, seed)).to(DType::f32); };
  Tensor x = r({4, 6, 32}, 40), w = r({32}, 41), b = r({32}, 42);
  close(ops::layer_norm(bf(x), bf(w), bf(b)), ops::layer_norm(x, w, b), "layer_norm");
  close(ops::rms_norm(bf(x), bf(w)), ops::rms_norm(x, w), "rms_norm");
  close(ops::gelu(bf(x)), ops::gelu(x), "gelu");
  close(ops::silu(bf(x)), ops::silu(x), "silu");
  close(ops::swiglu(bf(x), bf(x)), ops::swiglu(x, x), "swiglu");
  close(ops::softmax(bf(x)), ops::softmax(x), "softmax");
  Tensor q = r({1, 2, 9, 8}, 43), k = r({1, 2, 9, 8}, 44), v = r({1, 2, 9, 8}, 45);
  close(ops::causal_attention(bf(q), bf(k), bf(v)), ops::causal_attention(q, k, v), "attention");
  close(ops::rope(bf(q)), ops::rope(q), "rope");
  Tensor e = r({10, 8}, 46);
  Tensor ids = from_ints({1, 2, 9}, {3});
  close(ops::embedding(bf(e), ids), ops::embedding(e, ids), "embedding");
  Tensor logits = r({3, 10}, 47), t = from_ints({1, 0, 9}, {3});
  close(ops::cross_entropy(bf(logits), t), ops::cross_entropy(logits, t), "cross_entropy");

  // Gradients come back in the input dtype too.
  Tensor xb = bf(x);
  xb.set_requires_grad(true);
  ops::sum(ops::layer_norm(xb, bf(w), bf(b))).backward();
  EXPECT_EQ(xb.grad().dtype(), DType::bf16);
}

// ---- 16-bit kernels ----
// The CPU's (and so sim's) norm, activation, softmax, attention and rotary kernels take bf16 and
// fp16 tensors directly (Backend::supports). Before they did, the ops widened 16-bit inputs to fp32
// copies, ran the fp32 kernels and rounded the results: each op on 16-bit tensors is checked
// against exactly that, forward and backward, at sizes with vector-loop tails, several row blocks
// (rows16.h) and several threads' ranges.

namespace {

std::vector<uint32_t> bits_of(const Tensor& t) {
  const std::vector<float> v = host_vector(t);  // widening 16-bit values is exact and one-to-one
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

// Largest |got - want| over the largest |want|, both read as fp32.
double max_rel_diff(const Tensor& got, const Tensor& want) {
  const auto a = host_vector(got), b = host_vector(want);
  double d = 0.0, m = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::abs(static_cast<double>(a[i]) - b[i]));
    m = std::max(m, std::abs(static_cast<double>(b[i])));
  }
  return m > 0.0 ? d / m : d;
}

struct Path16 {
  Tensor out16, out32;                  // the op's output on 16-bit inputs; on their fp32 copies
  std::vector<Tensor> grad16, grad32;   // each input's gradient, likewise
};

// Runs f on leaves made from `inputs` (16-bit, dtype dt) and on their fp32 copies, and back from
// one 16-bit upstream gradient (fed widened to the fp32 run).
Path16 run_both(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                const std::vector<Tensor>& inputs, uint64_t gseed) {
  std::vector<Tensor> a16, a32;
  for (const Tensor& t : inputs) {
    a16.push_back(t.detach());
    a32.push_back(t.to(DType::f32));
  }
  for (std::vector<Tensor>* v : {&a16, &a32})
    for (Tensor& t : *v) t.set_requires_grad(true);
  Path16 r;
  r.out16 = f(a16);
  r.out32 = f(a32);
  const DType dt = inputs[0].dtype();
  const Tensor g = ds::testing::randn(r.out16.shape(), gseed, 1.0f, dt, r.out16.device());
  r.out16.backward(g);
  r.out32.backward(g.to(DType::f32));
  for (size_t i = 0; i < inputs.size(); ++i) {
    r.grad16.push_back(a16[i].grad());
    r.grad32.push_back(a32[i].grad());
  }
  return r;
}

}  // namespace

TEST_P(Ops, Bf16KernelsEqualTheFp32PathBitwise) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::bf16, "copy");
  for (const DType dt : {DType::bf16, DType::f16}) {
    // CPU and sim: their kernels take dt, so this tests the direct path (not the f32c one).
    if (device().type != DeviceType::cuda) {
      for (const char* k : {"layer_norm_forward", "layer_norm_backward", "rms_norm_forward",
                            "rms_norm_backward", "unary", "binary", "gelu_erf_forward",
                            "gelu_erf_backward", "swiglu_forward", "swiglu_backward",
                            "softmax_forward", "attention_forward", "rope",
                            "embedding_forward", "embedding_backward", "cross_entropy_forward",
                            "cross_entropy_backward"})
        EXPECT_TRUE(ds::testing::supported(device(), k, dt)) << k << " " << dtype_name(dt);
    }
    auto in = [&](const Shape& s, uint64_t seed, float scale = 1.0f) {
      return randn(s, seed, scale, dt);
    };
    struct Case {
      const char* what;
      std::function<Tensor(const std::vector<Tensor>&)> f;
      std::vector<Tensor> inputs;
    };
    std::vector<double> inv{1.0, 0.3, 0.05};  // partial rotary: 6 of 10 dims
    // Ids with repeats (each row of the table's gradient sums several upstream rows, in order)
    // and targets with ignored rows; V = 4500: rows longer than one cross-entropy chunk (2048).
    std::vector<int64_t> idv(40), tv(6);
    for (size_t i = 0; i < idv.size(); ++i) idv[i] = static_cast<int64_t>((i * 7) % 13);
    for (size_t i = 0; i < tv.size(); ++i) tv[i] = i == 2 ? -100 : static_cast<int64_t>(i * 797 + 5);
    const Tensor ids = ds::testing::to_device(Tensor::from_ints(idv, {5, 8}), device());
    const Tensor targets = ds::testing::to_device(Tensor::from_ints(tv, {6}), device());
    const std::vector<Case> cases = {
        // C = 37: vector tails; 15 rows in one block.
        {"layer_norm", [](auto& a) { return ops::layer_norm(a[0], a[1], a[2]); },
         {in({3, 5, 37}, 1), in({37}, 2), in({37}, 3)}},
        // C = 2051: one row per block, longer than a block.
        {"layer_norm C=2051 no bias", [](auto& a) { return ops::layer_norm(a[0], a[1], Tensor()); },
         {in({9, 2051}, 4, 3.0f), in({2051}, 5)}},
        // 70 rows of 45: two row blocks (45 rows each) and a remainder.
        {"rms_norm", [](auto& a) { return ops::rms_norm(a[0], a[1]); },
         {in({70, 45}, 6), in({45}, 7)}},
        // 17500 elements: two threads' ranges (kGrain 16384), 2048-element chunks and tails.
        {"gelu", [](auto& a) { return ops::gelu(a[0]); }, {in({7, 2500}, 8, 3.0f)}},
        {"gelu_erf", [](auto& a) { return ops::gelu_erf(a[0]); }, {in({7, 2500}, 9, 3.0f)}},
        {"silu", [](auto& a) { return ops::silu(a[0]); }, {in({7, 2500}, 10, 3.0f)}},
        {"swiglu", [](auto& a) { return ops::swiglu(a[0], a[1]); },
         {in({7, 2500}, 11, 3.0f), in({7, 2500}, 12)}},
        {"rope", [](auto& a) { return ops::rope(a[0], 10000.0f, 3); }, {in({2, 3, 11, 10}, 13)}},
        // 800 rows of 6: several row blocks of 341.
        {"rope interleaved partial",
         [inv](auto& a) { return ops::rope(a[0], inv, 1.5f, 4, /*interleaved=*/true); },
         {in({2, 4, 100, 10}, 14)}},
        {"embedding", [ids](auto& a) { return ops::embedding(a[0], ids); }, {in({16, 37}, 15)}},
        {"cross_entropy", [targets](auto& a) { return ops::cross_entropy(a[0], targets); },
         {in({6, 4500}, 16, 4.0f)}},
    };
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(c.what) + " " + dtype_name(dt));
      const Path16 r = run_both(c.f, c.inputs, 99);
      // A loss is an fp32 scalar for any input dtype (ops.h); then the two paths give its bits.
      const bool loss = r.out16.dtype() == DType::f32 && r.out16.numel() == 1;
      EXPECT_EQ(r.out16.dtype(), loss ? DType::f32 : dt);
      EXPECT_EQ(bits_of(r.out16), bits_of(loss ? r.out32 : r.out32.to(dt)));
      for (size_t i = 0; i < r.grad16.size(); ++i) {
        EXPECT_EQ(r.grad16[i].dtype(), dt) << "input " << i;
        EXPECT_EQ(bits_of(r.grad16[i]), bits_of(r.grad32[i].to(dt))) << "input " << i;
      }
    }
  }
}

// The unary and binary kernels on 16-bit operands (broadcast and strided views, mixed dtypes, in
// place) against the fp32 kernels on widened copies with the same strides, rounded: bitwise.
TEST_P(Ops, Bf16UnaryAndBinaryKernelsEqualFp32) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::bf16, "unary", "binary", "copy");
  using backend::BinaryOp;
  using backend::UnaryOp;
  backend::Backend& be = backend::get(device());
  const Shape shape{3, 4, 37};
  // A view of t's storage as `shape` with the given strides (t fp32 or bf16, same layout).
  auto view = [&](const Tensor& t, const Shape& strides) {
    return Tensor::from_storage(t.storage(), shape, t.dtype(), t.storage_offset(), strides);
  };
  const Tensor a16 = randn(shape, 1, 1.0f, DType::bf16), a32 = a16.to(DType::f32);
  const Tensor r16 = randn({3, 37}, 2, 1.0f, DType::bf16), r32 = r16.to(DType::f32);  // rows
  const Tensor t16 = randn({37, 12}, 3, 1.0f, DType::bf16), t32 = t16.to(DType::f32);  // transposed
  const Tensor c16 = randn({3, 4}, 4, 1.0f, DType::bf16), c32 = c16.to(DType::f32);   // per row
  struct Operand {
    const char* what;
    Tensor v16, v32;
  };
  const std::vector<Operand> others = {
      {"contiguous", a16, a32},
      {"broadcast rows (stride 0 in dim 1)", view(r16, {37, 0, 1}), view(r32, {37, 0, 1})},
      {"strided last dim (12)", view(t16, {4, 1, 12}), view(t32, {4, 1, 12})},
      {"broadcast along the last dim", view(c16, {4, 1, 0}), view(c32, {4, 1, 0})},
  };
  for (const Operand& o : others) {
    for (const BinaryOp op : {BinaryOp::add, BinaryOp::mul, BinaryOp::div,
                              BinaryOp::gelu_backward, BinaryOp::silu_backward}) {
      SCOPED_TRACE(std::string(o.what) + " op " + std::to_string(static_cast<int>(op)));
      Tensor want = Tensor::empty(shape, DType::f32, device());
      be.binary(op, o.v32, a32, want);
      Tensor got = Tensor::empty(shape, DType::bf16, device());
      be.binary(op, o.v16, a16, got);  // 16-bit both
      EXPECT_EQ(bits_of(got), bits_of(want.to(DType::bf16)));
      Tensor mixed = Tensor::empty(shape, DType::f32, device());
      be.binary(op, o.v16, a32, mixed);  // 16-bit and fp32 operands, fp32 out
      EXPECT_EQ(bits_of(mixed), bits_of(want));
    }
  }
  Tensor inplace = a16.clone();  // out is a itself
  be.binary(BinaryOp::sub, inplace, view(r16, {37, 0, 1}), inplace);
  Tensor want = Tensor::empty(shape, DType::f32, device());
  be.binary(BinaryOp::sub, a32, view(r32, {37, 0, 1}), want);
  EXPECT_EQ(bits_of(inplace), bits_of(want.to(DType::bf16)));
  for (const UnaryOp op :
       {UnaryOp::exp, UnaryOp::tanh, UnaryOp::mul_scalar, UnaryOp::gelu, UnaryOp::silu}) {
    for (const DType dt : {DType::bf16, DType::f16}) {
      const Tensor x = randn({7, 2500}, 5, 2.0f, dt);
      Tensor got = Tensor::empty(x.shape(), dt, device());
      Tensor w = Tensor::empty(x.shape(), DType::f32, device());
      be.unary(op, x, got, 0.75f);
      be.unary(op, x.to(DType::f32), w, 0.75f);
      EXPECT_EQ(bits_of(got), bits_of(w.to(dt))) << static_cast<int>(op) << " " << dtype_name(dt);
    }
  }
}

// Softmax and attention: the forward is bitwise the fp32 path's; the backward reads the op's saved
// output, which on the direct path is the rounded 16-bit one (no fp32 copy of it is kept, as in
// PyTorch's bf16 softmax and FlashAttention's bf16 backward), so the gradients differ by what that
// rounding moves: y * (g - sum y g) and D = dO . O see y and O with relative error <= 2^-9 (bf16)
// or 2^-12 (fp16), and the gradient is rounded once more. The bound below is four ulps of the dtype
// relative to the gradient's largest element (measured: about one; the worst case is printed).
TEST_P(Ops, Bf16SoftmaxAndAttentionMatchTheFp32Path) {
  DS_SKIP_UNLESS_SUPPORTED(device(), DType::bf16, "copy");
  for (const DType dt : {DType::bf16, DType::f16}) {
    if (device().type != DeviceType::cuda) {
      for (const char* k : {"softmax_forward", "softmax_backward", "attention_forward",
                            "attention_backward"})
        EXPECT_TRUE(ds::testing::supported(device(), k, dt)) << k << " " << dtype_name(dt);
    }
    const double tol = dt == DType::bf16 ? 1.6e-2 : 2e-3;  // 4 ulps at 1 (2^-8 and 2^-11 each)
    auto in = [&](const Shape& s, uint64_t seed, float scale = 1.0f) {
      return randn(s, seed, scale, dt);
    };
    ops::AttentionMask cross;
    cross.causal = false;
    cross.key_lengths = {13, 7};
    struct Case {
      const char* what;
      std::function<Tensor(const std::vector<Tensor>&)> f;
      std::vector<Tensor> inputs;
    };
    const std::vector<Case> cases = {
        {"softmax", [](auto& a) { return ops::softmax(a[0]); }, {in({33, 75}, 21, 3.0f)}},
        {"causal attention", [](auto& a) { return ops::causal_attention(a[0], a[1], a[2]); },
         {in({2, 3, 13, 20}, 22), in({2, 3, 13, 20}, 23), in({2, 3, 13, 20}, 24)}},
        {"cross attention, padded keys",
         [cross](auto& a) { return ops::attention(a[0], a[1], a[2], cross); },
         {in({2, 3, 5, 20}, 25), in({2, 3, 13, 20}, 26), in({2, 3, 13, 20}, 27)}},
    };
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(c.what) + " " + dtype_name(dt));
      const Path16 r = run_both(c.f, c.inputs, 98);
      // A loss is an fp32 scalar for any input dtype (ops.h); then the two paths give its bits.
      const bool loss = r.out16.dtype() == DType::f32 && r.out16.numel() == 1;
      EXPECT_EQ(r.out16.dtype(), loss ? DType::f32 : dt);
      EXPECT_EQ(bits_of(r.out16), bits_of(loss ? r.out32 : r.out32.to(dt)));
      for (size_t i = 0; i < r.grad16.size(); ++i) {
        EXPECT_EQ(r.grad16[i].dtype(), dt) << "input " << i;
        const double d = max_rel_diff(r.grad16[i], r.grad32[i]);
        std::printf("%s %s: gradient %zu within %.2g of the fp32 path's\n", c.what,
                    dtype_name(dt), i, d);
        EXPECT_LE(d, tol) << "input " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllDevices, Ops, ::testing::ValuesIn(ds::testing::test_devices()),
                         ds::testing::device_param_name);

// ---- no whole-tensor fp32 copies on the 16-bit path (CPU allocator statistics) ----

namespace {
// Bytes the CPU allocator holds at its peak during fn beyond what it held before.
int64_t peak_growth(const std::function<void()>& fn) {
  Allocator& a = cpu_allocator();
  a.reset_peak();
  const int64_t base = static_cast<int64_t>(a.stats().bytes_in_use);
  fn();
  return static_cast<int64_t>(a.stats().peak_bytes_in_use) - base;
}
}  // namespace

// A bf16 decode step reads its weights as they are: the embedding gathers bf16 rows (the old path
// widened the whole table on every call: 4 bytes a value of allocation and traffic per token) and
// linear_rows reads the bf16 weight; neither allocates more than its few rows. Values: those of
// the fp32 table / weight holding the same bf16 values.
TEST(OpsCpu, Bf16DecodeOpsMakeNoFp32CopyOfTheWeights) {
  using ds::testing::randn;
  const int64_t V = 8192, C = 512, f32_copy = 4 * V * C;
  const Tensor table = randn({V, C}, 1, 1.0f, DType::bf16);
  const Tensor ids = Tensor::from_ints({5, 8191, 0}, {1, 3});
  Tensor e;
  EXPECT_LT(peak_growth([&] { e = ops::embedding(table, ids); }), 64 * 1024);
  EXPECT_EQ(e.dtype(), DType::bf16);
  EXPECT_EQ(e.to(DType::f32).to_vector(), ops::embedding(table.to(DType::f32), ids).to_vector());
  const Tensor x = randn({1, C}, 2, 1.0f, DType::bf16);
  Tensor y;
  EXPECT_LT(peak_growth([&] { y = ops::linear_rows(x, table); }), f32_copy / 8);
  EXPECT_EQ(y.dtype(), DType::bf16);
}

TEST(OpsCpu, Bf16NormAndAttentionMakeNoFp32Copies) {
  using ds::testing::randn;
  // (B, T, C) = (4, 128, 512): n = 2^18 elements, 512 KiB in bf16 and 1 MiB as an fp32 copy. The
  // forward may allocate its bf16 output and fp32 row statistics; the backward its bf16 input
  // gradient and fp32 weight gradients. The old path also held fp32 copies of x, y, dy and dx.
  // The leaves' gradients exist beforehand, so that autograd adds into them instead of allocating
  // its own copy of each.
  auto with_grad = [](Tensor& t) {
    t.set_requires_grad(true);
    t.set_grad(Tensor::zeros(t.shape(), t.dtype()));
  };
  const int64_t B = 4, T = 128, C = 512, n = B * T * C, f32_copy = 4 * n, b16 = 2 * n;
  {
    Tensor x = randn({B, T, C}, 1, 1.0f, DType::bf16), w = randn({C}, 2, 1.0f, DType::bf16),
           b = randn({C}, 3, 1.0f, DType::bf16), g = randn({B, T, C}, 4, 1.0f, DType::bf16);
    for (Tensor* t : {&x, &w, &b}) with_grad(*t);
    Tensor y;
    const int64_t fwd = peak_growth([&] { y = ops::layer_norm(x, w, b); });
    const int64_t bwd = peak_growth([&] { y.backward(g); });
    std::printf("layer_norm bf16 (%lld elements): forward +%lld bytes, backward +%lld bytes\n",
                static_cast<long long>(n), static_cast<long long>(fwd),
                static_cast<long long>(bwd));
    EXPECT_LT(fwd, f32_copy);  // the bf16 output and (B*T) fp32 mean, rstd
    EXPECT_LT(fwd, b16 + 64 * 1024);
    EXPECT_LT(bwd, f32_copy);  // the bf16 dx and (C) fp32 dw, db
    EXPECT_LT(bwd, b16 + 64 * 1024);
    EXPECT_EQ(x.grad().dtype(), DType::bf16);
  }
  {
    const int64_t NH = 8, hd = C / NH;
    const Shape s{B, NH, T, hd};  // n elements each
    Tensor q = randn(s, 5, 1.0f, DType::bf16), k = randn(s, 6, 1.0f, DType::bf16),
           v = randn(s, 7, 1.0f, DType::bf16), g = randn(s, 8, 1.0f, DType::bf16);
    for (Tensor* t : {&q, &k, &v}) with_grad(*t);
    Tensor o;
    const int64_t fwd = peak_growth([&] { o = ops::causal_attention(q, k, v); });
    const int64_t bwd = peak_growth([&] { o.backward(g); });
    std::printf("attention bf16 (3 x %lld elements): forward +%lld bytes, backward +%lld bytes\n",
                static_cast<long long>(n), static_cast<long long>(fwd),
                static_cast<long long>(bwd));
    EXPECT_LT(fwd, b16 + 64 * 1024);      // the bf16 output and (B, NH, T) fp32 lse
    EXPECT_LT(bwd, 3 * b16 + 64 * 1024);  // the bf16 dq, dk, dv
    EXPECT_EQ(q.grad().dtype(), DType::bf16);
  }
  {
    // The token embedding: a bf16 table is gathered as it is and its gradient is a bf16 table
    // (fp32 sums per row, rounded once); no (V, C) fp32 table in either direction.
    const int64_t V = 4096, E = 256, tokens = 512;  // (V, E): 1 MiB in bf16, 4 MiB in fp32
    std::vector<int64_t> idv(tokens);
    for (int64_t i = 0; i < tokens; ++i) idv[static_cast<size_t>(i)] = (i * 37) % 300;
    const Tensor ids = Tensor::from_ints(idv, {tokens});
    Tensor w = randn({V, E}, 12, 1.0f, DType::bf16), g = randn({tokens, E}, 13, 1.0f, DType::bf16);
    with_grad(w);
    Tensor y;
    const int64_t fwd = peak_growth([&] { y = ops::embedding(w, ids); });
    const int64_t bwd = peak_growth([&] { y.backward(g); });
    std::printf("embedding bf16 (%lld x %lld table): forward +%lld bytes, backward +%lld bytes\n",
                static_cast<long long>(V), static_cast<long long>(E), static_cast<long long>(fwd),
                static_cast<long long>(bwd));
    EXPECT_LT(fwd, 2 * tokens * E + 64 * 1024);  // the bf16 rows only
    EXPECT_LT(bwd, 2 * V * E + 64 * 1024);       // the bf16 table gradient, not an fp32 one
    EXPECT_EQ(w.grad().dtype(), DType::bf16);
  }
  {
    // Cross entropy on bf16 logits: read as they are (no fp32 copy), gradient in bf16.
    // 2 MiB of bf16 logits, 4 MiB as an fp32 copy (the allocator rounds from 1 MiB to 2 MiB).
    const int64_t N = 128, V = 8192;
    std::vector<int64_t> tv(N);
    for (int64_t i = 0; i < N; ++i) tv[static_cast<size_t>(i)] = (i * 131) % V;
    const Tensor targets = Tensor::from_ints(tv, {N});
    Tensor lg = randn({N, V}, 14, 3.0f, DType::bf16);
    with_grad(lg);
    Tensor loss;
    const int64_t fwd = peak_growth([&] { loss = ops::cross_entropy(lg, targets); });
    const int64_t bwd = peak_growth([&] { loss.backward(); });
    std::printf("cross_entropy bf16 (%lld x %lld): forward +%lld bytes, backward +%lld bytes\n",
                static_cast<long long>(N), static_cast<long long>(V), static_cast<long long>(fwd),
                static_cast<long long>(bwd));
    EXPECT_LT(fwd, 64 * 1024);                // (N) fp32 losses and lse
    EXPECT_LT(bwd, 2 * N * V + 64 * 1024);    // the bf16 gradient
    EXPECT_EQ(lg.grad().dtype(), DType::bf16);
  }
  {
    // Elementwise ops (the residual adds, a bias broadcast, a scale): the bf16 output only, and
    // the same bits as the fp32 path rounded once.
    Tensor x = randn({B, T, C}, 9, 1.0f, DType::bf16), r = randn({B, T, C}, 10, 1.0f, DType::bf16),
           bias = randn({C}, 11, 1.0f, DType::bf16);
    Tensor y;
    EXPECT_LT(peak_growth([&] { y = ops::add(x, r); }), b16 + 64 * 1024);
    EXPECT_EQ(y.dtype(), DType::bf16);
    EXPECT_EQ(y.to(DType::f32).to_vector(),
              ops::add(x.to(DType::f32), r.to(DType::f32)).to(DType::bf16).to(DType::f32).to_vector());
    EXPECT_LT(peak_growth([&] { y = ops::mul(x, bias); }), b16 + 64 * 1024);
    EXPECT_EQ(y.to(DType::f32).to_vector(),
              ops::mul(x.to(DType::f32), bias.to(DType::f32)).to(DType::bf16).to(DType::f32).to_vector());
    EXPECT_LT(peak_growth([&] { y = ops::mul(x, 0.5f); }), b16 + 64 * 1024);
    EXPECT_EQ(y.dtype(), DType::bf16);
  }
}

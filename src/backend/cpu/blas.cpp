// GEMM on the CPU through a BLAS loaded at run time.
//
// Why dlopen: Debian's OpenBLAS (DYNAMIC_ARCH) does not recognise some current CPUs and silently
// falls back to generic kernels five times slower (README.md, "The BLAS trap"). It reads
// OPENBLAS_CORETYPE once, when the library initialises, so a program that links it cannot fix this
// from main(). Loading it ourselves lets us pick the core from cpuid first (unless the user already
// set OPENBLAS_CORETYPE), then report exactly which path is in use.
#include <dlfcn.h>
#include <omp.h>

#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "ds/core/error.h"
#include "ds/core/parallel.h"

namespace ds::backend {
namespace {

// CBLAS enum values (cblas.h), declared here so we do not need the header of one BLAS vendor.
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

using SgemmFn = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int,
                         float, float*, int);
using SbgemmFn = void (*)(int, int, int, int, int, int, float, const uint16_t*, int,
                          const uint16_t*, int, float, float*, int);
using SetThreadsFn = void (*)(int);
using CharFn = char* (*)();

struct Blas {
  SgemmFn sgemm = nullptr;
  SbgemmFn sbgemm = nullptr;
  SetThreadsFn set_threads = nullptr;
  std::string library;
  std::string core;
  std::string core_origin;
  std::string config;
};

const char* core_for_this_cpu(std::string* reason) {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl")) {
    if (__builtin_cpu_supports("avx512bf16")) {
      *reason = "avx512f+avx512bf16";
      return "Cooperlake";
    }
    *reason = "avx512f";
    return "SkylakeX";
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    *reason = "avx2+fma";
    return "Haswell";
  }
  return nullptr;
}

Blas load_blas() {
  Blas b;
  std::string reason;
  if (std::getenv("OPENBLAS_CORETYPE")) {
    b.core_origin = "from OPENBLAS_CORETYPE";
  } else if (const char* core = core_for_this_cpu(&reason)) {
    setenv("OPENBLAS_CORETYPE", core, 0);
    b.core_origin = "chosen by deepspeed.cpp from cpuid: " + reason;
  } else {
    b.core_origin = "detected by OpenBLAS";
  }
  std::vector<std::string> candidates;
  if (const char* lib = std::getenv("DS_BLAS_LIBRARY")) candidates.emplace_back(lib);
  candidates.insert(candidates.end(), {"libopenblas.so.0", "libopenblas.so", "libblas.so.3"});
  for (const auto& name : candidates) {
    void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) continue;
    auto sg = reinterpret_cast<SgemmFn>(dlsym(h, "cblas_sgemm"));
    if (!sg) continue;
    b.sgemm = sg;
    b.sbgemm = reinterpret_cast<SbgemmFn>(dlsym(h, "cblas_sbgemm"));
    b.set_threads = reinterpret_cast<SetThreadsFn>(dlsym(h, "openblas_set_num_threads"));
    if (auto core = reinterpret_cast<CharFn>(dlsym(h, "openblas_get_corename"))) b.core = core();
    if (auto cfg = reinterpret_cast<CharFn>(dlsym(h, "openblas_get_config"))) b.config = cfg();
    b.library = name;
    break;
  }
  return b;
}

const Blas& blas() {
  static const Blas b = [] {
    Blas loaded = load_blas();
    // Follow ds::set_num_threads from now on (and apply a count set before the BLAS loaded).
    if (loaded.set_threads) add_thread_count_listener([fn = loaded.set_threads](int n) { fn(n); });
    return loaded;
  }();
  return b;
}

// Used only when no BLAS could be loaded: correct, cache-blocked, parallel, and much slower.
void fallback_sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                    int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
#pragma omp parallel for schedule(static) if (m * n * k > 32768 && !omp_in_parallel())
  for (int64_t i = 0; i < m; ++i) {
    float* ci = c + i * ldc;
    for (int64_t j = 0; j < n; ++j) ci[j] = beta == 0.0f ? 0.0f : beta * ci[j];
    for (int64_t p = 0; p < k; ++p) {
      const float av = alpha * (ta ? a[p * lda + i] : a[i * lda + p]);
      if (!tb) {
        const float* bp = b + p * ldb;
        for (int64_t j = 0; j < n; ++j) ci[j] += av * bp[j];
      } else {
        for (int64_t j = 0; j < n; ++j) ci[j] += av * b[j * ldb + p];
      }
    }
  }
}

// How a bf16 product runs: oneDNN on the CPU's bf16 units when it loaded (onednn.cpp decides,
// DS_BF16_GEMM=onednn|blas|convert overrides), else the BLAS's cblas_sbgemm when it has one, else
// both operands widened to fp32 for sgemm.
enum class Bf16Path { onednn, sbgemm, convert };
Bf16Path bf16_path() {
  static const Bf16Path p = [] {
    const char* mode = std::getenv("DS_BF16_GEMM");
    const std::string m = mode ? mode : "auto";
    DS_CHECK(m == "auto" || m == "onednn" || m == "blas" || m == "convert",
             "[cpu:gemm] DS_BF16_GEMM={} is not one of auto, onednn, blas, convert", m);
    if (m != "blas" && m != "convert" && onednn_gemm_bf16_available()) return Bf16Path::onednn;
    if (m != "convert" && blas().sbgemm) return Bf16Path::sbgemm;
    return Bf16Path::convert;
  }();
  return p;
}

// How an fp32 product runs: the BLAS, or oneDNN's dnnl_sgemm with DS_FP32_GEMM=onednn. Measured
// on a Zen 5 EPYC (bench_gemm_libs, 2048^3, 2 threads): OpenBLAS 173 GFLOP/s, oneDNN 195 (1.12x);
// but oneDNN's sums depend on the thread count for some shapes (it splits K: M 16..512, N 768,
// K 1024, B transposed), so a run's numbers would change with --threads and a device (sim) would
// not reproduce the host's. The BLAS's do not, so it stays the default (bench/RESULTS.md).
bool fp32_on_onednn() {
  static const bool on = [] {
    const char* mode = std::getenv("DS_FP32_GEMM");
    const std::string m = mode ? mode : "auto";
    DS_CHECK(m == "auto" || m == "onednn" || m == "blas",
             "[cpu:gemm] DS_FP32_GEMM={} is not one of auto, onednn, blas", m);
    return m == "onednn" && onednn_sgemm_available();
  }();
  return on;
}

}  // namespace

void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (fp32_on_onednn() && onednn_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc))
    return;
  const auto& bl = blas();
  if (!bl.sgemm) return fallback_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  bl.sgemm(kRowMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, static_cast<int>(m),
           static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b,
           static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

std::string CpuBackend::gemm_info() {
  const auto& bl = blas();
  std::string s;
  if (fp32_on_onednn())
    s = fmt::format("fp32 GEMM: {}, {} threads; BLAS ", onednn_sgemm_info(), omp_get_max_threads());
  else if (const char* m = std::getenv("DS_FP32_GEMM"); m && std::string(m) == "onednn")
    s = "fp32 GEMM: DS_FP32_GEMM=onednn asked for oneDNN, but no libdnnl loaded, so the BLAS: ";
  if (!bl.sgemm)
    return s + "portable fallback GEMM (no BLAS found; install libopenblas0-openmp: expect ~5-10x "
               "slower training)";
  s += fmt::format("{} ({}), core {} ({}), {} threads", bl.library,
                   bl.config.empty() ? "cblas" : bl.config, bl.core, bl.core_origin,
                   omp_get_max_threads());
  if (bf16_path() == Bf16Path::onednn)
    s += "; bf16 GEMM: " + onednn_gemm_info();
  else if (bf16_path() == Bf16Path::sbgemm)
    s += "; bf16 GEMM: cblas_sbgemm";
  else
    s += "; bf16 GEMM: converted to fp32 (" + onednn_gemm_info() + ")";
  if (onednn_f16_available())
    s += "; fp16 GEMM: " + onednn_f16_info();
  else
    s += "; fp16 GEMM: converted to fp32 (" + onednn_f16_info() + ")";
  return s;
}

namespace {

// A GEMM whose C is 16-bit: bf16 products on oneDNN, and fp16 ones where oneDNN runs fp16, write
// it directly (its matmul primitive rounds the fp32 accumulators in registers); any other goes
// through an fp32 C per batch item, rounded into C once. Same values either way up to the GEMMs'
// own summation order.
void gemm_16bit_c(CpuBackend& be, const Gemm& g) {
  DS_CHECK(g.c_dtype == DType::bf16 || g.c_dtype == DType::f16,
           "[cpu:gemm] C must be fp32, bf16 or fp16, got {}", dtype_name(g.c_dtype));
  const size_t es = dtype_size(g.dtype), cs = dtype_size(g.c_dtype);
  auto a_at = [&](int64_t i) { return static_cast<const char*>(g.a) + i * g.stride_a * es; };
  auto b_at = [&](int64_t i) { return static_cast<const char*>(g.b) + i * g.stride_b * es; };
  auto c_at = [&](int64_t i) { return static_cast<char*>(g.c) + i * g.stride_c * cs; };
  const bool onednn_c = g.dtype == g.c_dtype &&
                        (g.dtype == DType::f16 || bf16_path() == Bf16Path::onednn);
  if (onednn_c && g.alpha == 1.0f && (g.beta == 0.0f || g.beta == 1.0f) &&
      onednn_matmul(g.dtype, g.c_dtype, g.trans_a, g.trans_b, g.batch, g.m, g.n, g.k, g.a, g.lda,
                    g.stride_a, g.b, g.ldb, g.stride_b, g.beta != 0.0f, g.c, g.ldc, g.stride_c))
    return;
  // The fp32 C from the caching allocator: a fresh heap block per GEMM would fault its pages in
  // on every call.
  const Tensor c32t = Tensor::empty({g.m * g.n}, DType::f32);
  float* c32 = c32t.data<float>();
  Gemm f = g;
  f.c_dtype = DType::f32;
  f.batch = 1;
  f.c = c32;
  f.ldc = g.n;
  for (int64_t i = 0; i < g.batch; ++i) {
    f.a = a_at(i);
    f.b = b_at(i);
    char* c = c_at(i);
    if (g.beta != 0.0f)
      for (int64_t r = 0; r < g.m; ++r)
        convert(c + r * g.ldc * cs, g.c_dtype, c32 + r * g.n, DType::f32,
                static_cast<size_t>(g.n));
    be.gemm(f);
    for (int64_t r = 0; r < g.m; ++r)
      convert(c32 + r * g.n, DType::f32, c + r * g.ldc * cs, g.c_dtype,
              static_cast<size_t>(g.n));
  }
}

}  // namespace

void CpuBackend::gemm(const Gemm& g) {
  if (g.c_dtype != DType::f32) return gemm_16bit_c(*this, g);
  const int64_t a_rows = g.trans_a ? g.k : g.m, a_cols = g.trans_a ? g.m : g.k;
  const int64_t b_rows = g.trans_b ? g.n : g.k, b_cols = g.trans_b ? g.k : g.n;
  auto* c = static_cast<float*>(g.c);
  // fp16 on oneDNN's f16 matmul (fp32 C) where it runs on this CPU's fp16 units; alpha and beta
  // other than 1 and {0, 1} take the conversion path below.
  if (g.dtype == DType::f16 && g.alpha == 1.0f && (g.beta == 0.0f || g.beta == 1.0f) &&
      onednn_matmul(DType::f16, DType::f32, g.trans_a, g.trans_b, g.batch, g.m, g.n, g.k, g.a,
                    g.lda, g.stride_a, g.b, g.ldb, g.stride_b, g.beta != 0.0f, c, g.ldc,
                    g.stride_c))
    return;
  const Bf16Path path = g.dtype == DType::bf16 ? bf16_path() : Bf16Path::convert;
  const bool use_onednn = path == Bf16Path::onednn, use_sbgemm = path == Bf16Path::sbgemm;
  if (g.dtype != DType::f32 && !use_sbgemm && !use_onednn) {
    // 16-bit operands without a 16-bit GEMM: convert each batch item to fp32 and run sgemm.
    std::vector<float> a32(static_cast<size_t>((a_rows - 1) * g.lda + a_cols));
    std::vector<float> b32(static_cast<size_t>((b_rows - 1) * g.ldb + b_cols));
    const size_t esz = dtype_size(g.dtype);
    for (int64_t i = 0; i < g.batch; ++i) {
      convert(static_cast<const char*>(g.a) + i * g.stride_a * esz, g.dtype, a32.data(), DType::f32,
              a32.size());
      convert(static_cast<const char*>(g.b) + i * g.stride_b * esz, g.dtype, b32.data(), DType::f32,
              b32.size());
      sgemm(g.trans_a, g.trans_b, g.m, g.n, g.k, g.alpha, a32.data(), g.lda, b32.data(), g.ldb,
            g.beta, c + i * g.stride_c, g.ldc);
    }
    return;
  }
  if (!omp_in_parallel() && gemm_few_rows(g)) return;
  auto one = [&](int64_t i) {
    if (use_onednn) {
      onednn_gemm_bf16(g.trans_a, g.trans_b, g.m, g.n, g.k, g.alpha,
                       static_cast<const uint16_t*>(g.a) + i * g.stride_a, g.lda,
                       static_cast<const uint16_t*>(g.b) + i * g.stride_b, g.ldb, g.beta,
                       c + i * g.stride_c, g.ldc);
    } else if (use_sbgemm) {
      const auto* a = static_cast<const uint16_t*>(g.a) + i * g.stride_a;
      const auto* b = static_cast<const uint16_t*>(g.b) + i * g.stride_b;
      blas().sbgemm(kRowMajor, g.trans_a ? kTrans : kNoTrans, g.trans_b ? kTrans : kNoTrans,
                    static_cast<int>(g.m), static_cast<int>(g.n), static_cast<int>(g.k), g.alpha, a,
                    static_cast<int>(g.lda), b, static_cast<int>(g.ldb), g.beta, c + i * g.stride_c,
                    static_cast<int>(g.ldc));
    } else {
      const auto* a = static_cast<const float*>(g.a) + i * g.stride_a;
      const auto* b = static_cast<const float*>(g.b) + i * g.stride_b;
      sgemm(g.trans_a, g.trans_b, g.m, g.n, g.k, g.alpha, a, g.lda, b, g.ldb, g.beta,
            c + i * g.stride_c, g.ldc);
    }
  };
  // Many small products: one per thread, each single-threaded. Few large ones: BLAS threads.
  const bool small = g.m * g.n * g.k < (1 << 18);
  if (g.batch > 1 && small && !omp_in_parallel()) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < g.batch; ++i) one(i);
  } else {
    for (int64_t i = 0; i < g.batch; ++i) one(i);
  }
}

}  // namespace ds::backend

// The GEMM libraries side by side, 2048^3, called directly (no engine): OpenBLAS's cblas_sgemm
// (the reference: our fp32 path), oneDNN's dnnl_sgemm and dnnl_gemm_bf16bf16f32 (our bf16 path).
// Decides which library each dtype should use on this CPU (bench/RESULTS.md, issue 32).
//
//   OMP_NUM_THREADS=2 build/bench/bench_gemm_libs [--n 2048] [--reps 5]
//
// OPENBLAS_CORETYPE, when unset, is not chosen here: set it as the engine would (Cooperlake on
// AVX512-BF16, SkylakeX on AVX-512, Haswell on AVX2) to compare the kernels the engine uses.
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using CblasSgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*,
                            int, float, float*, int);
using DnnlSgemm = int (*)(char, char, int64_t, int64_t, int64_t, float, const float*, int64_t,
                          const float*, int64_t, float, float*, int64_t);
using DnnlBf16 = int (*)(char, char, int64_t, int64_t, int64_t, float, const uint16_t*, int64_t,
                         const uint16_t*, int64_t, float, float*, int64_t);

template <class F>
double best_gflops(int64_t n, int reps, F f) {
  f();  // warm-up: JIT kernels, thread pool, page faults
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return 2.0 * static_cast<double>(n) * n * n / best / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t n = 2048;
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--n") && i + 1 < argc) n = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
    else {
      std::printf("usage: bench_gemm_libs [--n N] [--reps R]\n");
      return 2;
    }
  }
  void* ob = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
  void* dn = dlopen("libdnnl.so.3", RTLD_NOW | RTLD_LOCAL);
  if (!dn) dn = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!ob || !dn) {
    std::printf("bench_gemm_libs: needs libopenblas.so.0 and libdnnl (scripts/setup.sh)\n");
    return 1;
  }
  auto cblas = reinterpret_cast<CblasSgemm>(dlsym(ob, "cblas_sgemm"));
  auto dsgemm = reinterpret_cast<DnnlSgemm>(dlsym(dn, "dnnl_sgemm"));
  auto dbf16 = reinterpret_cast<DnnlBf16>(dlsym(dn, "dnnl_gemm_bf16bf16f32"));
  const size_t nn = static_cast<size_t>(n * n);
  std::vector<float> a(nn, 0.5f), b(nn, 0.25f), c(nn);
  std::vector<uint16_t> ah(nn, 0x3f00), bh(nn, 0x3e80);  // 0.5 and 0.25 in bf16
  const int in = static_cast<int>(n);
  const double ref = best_gflops(n, reps, [&] {
    cblas(101, 111, 111, in, in, in, 1.0f, a.data(), in, b.data(), in, 0.0f, c.data(), in);
  });
  const double ds = best_gflops(n, reps, [&] {
    dsgemm('N', 'N', n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  });
  const double bf_nn = best_gflops(n, reps, [&] {
    dbf16('N', 'N', n, n, n, 1.0f, ah.data(), n, bh.data(), n, 0.0f, c.data(), n);
  });
  const double bf_nt = best_gflops(n, reps, [&] {
    dbf16('N', 'T', n, n, n, 1.0f, ah.data(), n, bh.data(), n, 0.0f, c.data(), n);
  });
  const char* core = std::getenv("OPENBLAS_CORETYPE");
  std::printf("OpenBLAS cblas_sgemm (core %s)  %7.1f GFLOP/s  1.00x\n", core ? core : "auto", ref);
  std::printf("oneDNN dnnl_sgemm                %7.1f GFLOP/s  %.2fx\n", ds, ds / ref);
  std::printf("oneDNN bf16 NN                   %7.1f GFLOP/s  %.2fx\n", bf_nn, bf_nn / ref);
  std::printf("oneDNN bf16 NT                   %7.1f GFLOP/s  %.2fx\n", bf_nt, bf_nt / ref);
  std::printf("BENCH gemm_libs n=%lld openblas_sgemm=%.1f onednn_sgemm=%.1f onednn_bf16=%.1f\n",
              static_cast<long long>(n), ref, ds, std::max(bf_nn, bf_nt));
  return 0;
}

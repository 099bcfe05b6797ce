// Adam step over a GPT-2-small-sized flat buffer, against this machine's memory bandwidth measured
// in the same run (a STREAM triad), and against two naive implementations:
//   - naive_scalar: the textbook per-element loop, one thread, not vectorised;
//   - torch_style: PyTorch's single-tensor CPU Adam, one elementwise op per pass over memory
//     (mul_, add_, mul_, addcmul_, sqrt, div, add_, addcdiv_, mul_), vectorised, all threads.
// Adam is memory-bound: per element it reads p, g, m, v and writes p, m, v (28 bytes), so the
// figure of merit is the fraction of triad bandwidth it reaches.
//
//   bench_adam [--n 124439808] [--threads 2] [--reps 5] [--adam-only 0|1]
// --adam-only 1 stops after the fused step, its bf16 copy and the triad (skips the scalar-path,
// naive and torch-style comparisons; used by bench/run_cpu_adam.sh).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "ds/core/allocator.h"
#include "ds/core/parallel.h"
#include "ds/optim/kernels.h"

namespace {

using Clock = std::chrono::steady_clock;

double median_ms(int reps, const std::function<void()>& fn) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// A buffer from the library's allocator (2 MiB aligned, huge pages), first-touched in parallel.
struct Buf {
  float* p;
  size_t bytes;
  Buf(int64_t n, float value) : bytes(static_cast<size_t>(n) * sizeof(float)) {
    p = static_cast<float*>(ds::cpu_allocator().allocate(bytes));
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) p[i] = value + 1e-3f * static_cast<float>(i % 1000);
  }
  ~Buf() {
    ds::cpu_allocator().deallocate(p, bytes);
  }
};

// STREAM triad a = b + s*c with non-temporal stores, so the bytes it counts (12 per element) are
// the bytes that move (a plain store would also read a's lines first: 16 bytes moved).
__attribute__((target("avx2,fma"))) void triad(float* a, const float* b, const float* c, int64_t n,
                                               float s) {
  const __m256 vs = _mm256_set1_ps(s);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i += 8)
    _mm256_stream_ps(a + i, _mm256_fmadd_ps(vs, _mm256_load_ps(c + i), _mm256_load_ps(b + i)));
  _mm_sfence();
}

// The same with ordinary stores (STREAM's default build): it counts 12 bytes but moves 16, since
// each store first reads a's line. Printed for comparison only.
void triad_plain(float* a, const float* b, const float* c, int64_t n, float s) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

// The textbook loop, one thread, kept scalar on purpose.
__attribute__((optimize("no-tree-vectorize"))) void adam_naive_scalar(float* p, const float* g,
                                                                      float* m, float* v, int64_t n,
                                                                      int64_t step, float lr,
                                                                      float b1, float b2, float eps,
                                                                      float wd) {
  const float bc1 = 1.0f - std::pow(b1, static_cast<float>(step));
  const float bc2 = 1.0f - std::pow(b2, static_cast<float>(step));
  for (int64_t i = 0; i < n; ++i) {
    m[i] = b1 * m[i] + (1 - b1) * g[i];
    v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
    const float denom = std::sqrt(v[i]) / std::sqrt(bc2) + eps;
    p[i] -= lr * wd * p[i];
    p[i] -= lr / bc1 * m[i] / denom;
  }
}

// PyTorch 1.13's _single_tensor_adam(w) as separate elementwise kernels (one pass each).
void adam_torch_style(float* p, const float* g, float* m, float* v, float* denom, int64_t n,
                      int64_t step, float lr, float b1, float b2, float eps, float wd) {
  const float bc1 = 1.0f - std::pow(b1, static_cast<float>(step));
  const float bc2s = std::sqrt(1.0f - std::pow(b2, static_cast<float>(step)));
  auto pass = [n](auto&& f) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) f(i);
  };
  pass([&](int64_t i) { p[i] *= 1 - lr * wd; });                 // param.mul_
  pass([&](int64_t i) { m[i] *= b1; });                          // exp_avg.mul_
  pass([&](int64_t i) { m[i] += (1 - b1) * g[i]; });             // .add_
  pass([&](int64_t i) { v[i] *= b2; });                          // exp_avg_sq.mul_
  pass([&](int64_t i) { v[i] += (1 - b2) * g[i] * g[i]; });      // .addcmul_
  pass([&](int64_t i) { denom[i] = std::sqrt(v[i]); });          // sqrt()
  pass([&](int64_t i) { denom[i] /= bc2s; });                    // / bias_correction2_sqrt
  pass([&](int64_t i) { denom[i] += eps; });                     // .add_(eps)
  pass([&](int64_t i) { p[i] -= lr / bc1 * m[i] / denom[i]; });  // param.addcdiv_
}

}  // namespace

static int run(int argc, char** argv) {
  int64_t n = 124439808;  // GPT-2 small (124M parameters)
  int threads = 2, reps = 5;
  bool adam_only = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--n")
      n = std::atoll(argv[i + 1]);
    else if (a == "--threads")
      threads = std::atoi(argv[i + 1]);
    else if (a == "--reps")
      reps = std::atoi(argv[i + 1]);
    else if (a == "--adam-only")
      adam_only = std::atoi(argv[i + 1]) != 0;
    else {
      std::fprintf(stderr,
                   "usage: bench_adam [--n N] [--threads T] [--reps R] [--adam-only 0|1]\n");
      return 2;
    }
  }
  n = (n + 7) / 8 * 8;  // the triad works in whole vectors
  ds::set_num_threads(threads);
  std::printf("# bench_adam: n=%lld threads=%d reps=%d simd=%s (median of reps)\n",
              static_cast<long long>(n), threads, reps,
              ds::optim::simd_path_name(ds::optim::simd_path()));

  Buf p(n, 0.5f), g(n, 0.01f), m(n, 0.0f), v(n, 0.0f);
  std::vector<uint16_t> out16(static_cast<size_t>(n));
  ds::optim::AdamConfig c;
  c.lr = 1e-4f;  // small, so repeated steps keep the values in a normal range
  c.weight_decay = 0.01f;
  int64_t step = 0;
  const double gb = 1e-9;

  // Warm up (page tables, caches, the OpenMP team).
  ds::optim::adam_update(p.p, g.p, m.p, v.p, n, ++step, c);
  const double adam_ms =
      median_ms(reps, [&] { ds::optim::adam_update(p.p, g.p, m.p, v.p, n, ++step, c); });
  const double adam16_ms = median_ms(reps, [&] {
    ds::optim::adam_update(p.p, g.p, m.p, v.p, n, ++step, c, 1.0f, out16.data(), ds::DType::bf16);
  });

  // Triad over three of the same buffers (values are irrelevant to the timing).
  triad(m.p, p.p, g.p, n, 0.5f);
  const double triad_ms = median_ms(reps, [&] { triad(m.p, p.p, g.p, n, 0.5f); });
  const double triad_plain_ms = median_ms(reps, [&] { triad_plain(m.p, p.p, g.p, n, 0.5f); });

  const double adam_gbs = 28.0 * n / (adam_ms * 1e-3) * gb;
  const double adam16_gbs = 30.0 * n / (adam16_ms * 1e-3) * gb;
  const double triad_gbs = 12.0 * n / (triad_ms * 1e-3) * gb;
  std::printf("# triad, plain stores: %.2f GB/s counted (12 B/elem), %.2f GB/s moved (16 B/elem)\n",
              12.0 * n / (triad_plain_ms * 1e-3) * gb, 16.0 * n / (triad_plain_ms * 1e-3) * gb);
  std::printf("BENCH adam n=%lld ms=%.2f gbytes_per_s=%.2f triad_gbytes_per_s=%.2f fraction=%.3f\n",
              static_cast<long long>(n), adam_ms, adam_gbs, triad_gbs, adam_gbs / triad_gbs);
  std::printf(
      "BENCH adam_out16_bf16 n=%lld ms=%.2f gbytes_per_s=%.2f triad_gbytes_per_s=%.2f "
      "fraction=%.3f\n",
      static_cast<long long>(n), adam16_ms, adam16_gbs, triad_gbs, adam16_gbs / triad_gbs);
  if (adam_only) return 0;

  // The same kernel on the scalar path (the compiler may still vectorise parts of it).
  const ds::optim::SimdPath path = ds::optim::simd_path();
  ds::optim::set_simd_path(ds::optim::SimdPath::scalar);
  const double scalar_path_ms =
      median_ms(reps, [&] { ds::optim::adam_update(p.p, g.p, m.p, v.p, n, ++step, c); });
  ds::optim::set_simd_path(path);
  std::printf("BENCH adam_scalar_path n=%lld ms=%.2f speedup_of_simd=%.2f\n",
              static_cast<long long>(n), scalar_path_ms, scalar_path_ms / adam_ms);

  const int naive_reps = std::max(1, reps / 2);
  const double naive_ms = median_ms(naive_reps, [&] {
    adam_naive_scalar(p.p, g.p, m.p, v.p, n, ++step, c.lr, c.beta1, c.beta2, c.eps, c.weight_decay);
  });
  std::printf("BENCH adam_naive_scalar_1thread n=%lld ms=%.2f speedup=%.2f\n",
              static_cast<long long>(n), naive_ms, naive_ms / adam_ms);

  Buf denom(n, 0.0f);
  const double torch_ms = median_ms(naive_reps, [&] {
    adam_torch_style(p.p, g.p, m.p, v.p, denom.p, n, ++step, c.lr, c.beta1, c.beta2, c.eps,
                     c.weight_decay);
  });
  std::printf("BENCH adam_torch_style_passes n=%lld ms=%.2f speedup=%.2f\n",
              static_cast<long long>(n), torch_ms, torch_ms / adam_ms);
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_adam: %s\n", e.what());
    return 1;
  }
}

// Micro-benchmark of the big non-GEMM kernels at GPT-2 124M training shapes (B=8, T=256, C=768,
// NH=12, V=50257), each against a reference measured in the same run:
//   memory-bound kernels (cross-entropy, layer norm, softmax) against a STREAM-style triad,
//   attention against a plain sgemm of the same useful FLOPs.
//
//   bench_kernels [--threads N] [--reps 5] [--cpu-time] [--bf16-only] [--no-ce]
//
// --no-ce skips the cross-entropy and LM-head sections (minutes on a loaded machine).
//
// The bf16 section times the ops (ops::layer_norm, ...) on bf16 tensors, forward alone and
// forward + backward, at the same shapes: the ops layer is where 16-bit tensors used to be widened
// to whole fp32 copies, so that is the level at which native bf16 kernels are compared.
//
// --cpu-time times with the process CPU clock instead of the wall clock: on a shared machine it
// discounts the time the process was descheduled (meaningful with --threads 1).
//
// Bytes counted are compulsory traffic (each input read once, each output written once); ratio
// = achieved GB/s / triad GB/s. Inputs are rotated over enough copies to exceed the last-level
// cache, so the numbers are DRAM numbers, as in a training step.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "ds/autograd/grad_mode.h"
#include "ds/backend/backend.h"
#include "ds/core/allocator.h"
#include "ds/core/parallel.h"
#include "ds/ops/ops.h"

using namespace ds;
using Clock = std::chrono::steady_clock;

namespace {

int g_reps = 5;
bool g_cpu_time = false;
bool g_bf16_only = false;
bool g_no_ce = false;

double now_seconds() {
  if (!g_cpu_time) return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Median seconds of fn(1..g_reps) after warm-up calls fn(0..kWarm-1), which also first-touch every
// rotating buffer (page faults are not what we measure).
constexpr int kWarm = 8;
double time_it(const std::function<void(int)>& fn) {
  for (int r = 0; r < kWarm; ++r) fn(r);
  std::vector<double> t;
  for (int r = 0; r < g_reps; ++r) {
    const double t0 = now_seconds();
    fn(r + 1);
    t.push_back(now_seconds() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

Tensor rand_tensor(const Shape& s, uint32_t seed, float scale = 1.0f) {
  Tensor t = Tensor::empty(s);
  float* p = t.data<float>();
  uint32_t x = seed * 2654435761u + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    x = x * 1664525u + 1013904223u;
    p[i] = scale * (static_cast<float>(x >> 8) / 16777216.0f - 0.5f);
  }
  return t;
}

double triad_gbps() {
  const int64_t n = 1 << 24;  // 3 x 64 MiB
  Tensor a = Tensor::zeros({n}), b = rand_tensor({n}, 1), c = rand_tensor({n}, 2);
  float* pa = a.data<float>();
  const float* pb = b.data<float>();
  const float* pc = c.data<float>();
  const double s = time_it([&](int) {
    parallel_for(n, 1 << 16, [&](int64_t i0, int64_t i1) {
#pragma omp simd
      for (int64_t i = i0; i < i1; ++i) pa[i] = pb[i] + 0.5f * pc[i];
    });
  });
  return 3.0 * n * 4 / s / 1e9;
}

double sgemm_gflops() {
  const int64_t n = 1024;
  Tensor a = rand_tensor({n, n}, 3), b = rand_tensor({n, n}, 4);
  const double s = time_it([&](int) { ops::matmul(a, b); });
  return 2.0 * n * n * n / s / 1e9;
}

void report(const char* name, double sec, double bytes, double triad) {
  const double gbps = bytes / sec / 1e9;
  std::printf("%-44s %9.2f ms  %7.1f GB/s  %5.2fx triad\n", name, sec * 1e3, gbps, gbps / triad);
}

void bench_fp32(backend::Backend& be, double triad, double peak);
void bench_bf16(double triad);

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) set_num_threads(std::atoi(argv[++i]));
    else if (a == "--reps" && i + 1 < argc) g_reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--cpu-time") g_cpu_time = true;
    else if (a == "--bf16-only") g_bf16_only = true;
    else if (a == "--no-ce") g_no_ce = true;
    else {
      std::printf(
          "usage: bench_kernels [--threads N] [--reps N] [--cpu-time] [--bf16-only] [--no-ce]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  autograd::NoGradGuard no_grad;
  auto& be = backend::cpu();
  std::printf("threads %d, %s\n", num_threads(), be.gemm_info().c_str());
  const double triad = triad_gbps(), peak = sgemm_gflops();
  std::printf("reference: triad %.1f GB/s, sgemm 1024^3 %.1f GFLOP/s\n\n", triad, peak);
  if (!g_bf16_only) bench_fp32(be, triad, peak);
  bench_bf16(triad);
  return 0;
}

namespace {

void bench_fp32(backend::Backend& be, double triad, double peak) {
  const int64_t B = 8, T = 256, C = 768, NH = 12, hd = C / NH, V = 50257, N = B * T;
  if (!g_no_ce) {  // cross-entropy (N, V): ~412 MB of logits, larger than any cache by itself
    Tensor logits = rand_tensor({N, V}, 5, 8.0f), dlogits = Tensor::empty({N, V});
    std::vector<int64_t> tv(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) tv[static_cast<size_t>(i)] = (i * 7919) % V;
    Tensor targets = Tensor::from_ints(tv, {N}, DType::i32);
    Tensor losses = Tensor::empty({N}), lse = Tensor::empty({N});
    const double bytes = static_cast<double>(N) * V * 4;
    const double f = time_it([&](int) { be.cross_entropy_forward(logits, targets, -100, losses, lse); });
    report("cross_entropy fwd (2048, 50257)", f, bytes, triad);
    const double b = time_it([&](int) { be.cross_entropy_backward(logits, targets, -100, lse, 1.0f / N, dlogits); });
    report("cross_entropy bwd (2048, 50257)", b, 2 * bytes, triad);
    std::printf("%-44s %9.2f ms\n", "cross_entropy fwd+bwd", (f + b) * 1e3);
  }
  {  // exact GELU over BERT-base's FFN activations (8 x 128, 3072), against the scalar libm loop
     // it replaced (std::erfc per element, 2 threads)
    const int64_t n = 8 * 128 * 3072;
    Tensor x = rand_tensor({n}, 7, 8.0f), y = Tensor::empty({n}), dx = Tensor::empty({n});
    const float* px = x.data<float>();
    float* py = y.data<float>();
    const double libm = time_it([&](int) {
      parallel_for(n, 1 << 14, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i)
          py[i] = 0.5f * px[i] * std::erfc(-px[i] * static_cast<float>(M_SQRT1_2));
      });
    });
    const double f = time_it([&](int) { be.gelu_erf_forward(x, y); });
    const double b = time_it([&](int) { be.gelu_erf_backward(x, x, dx); });
    report("gelu_erf fwd (3.1M)", f, 2.0 * n * 4, triad);
    report("gelu_erf bwd (3.1M)", b, 3.0 * n * 4, triad);
    std::printf("%-44s %9.2f ms  %5.2fx the libm loop\n", "gelu_erf fwd, scalar std::erfc loop",
                libm * 1e3, libm / f);
  }
  {  // layer norm (N, C), 8 rotating copies (~100 MB) to defeat the last-level cache
    constexpr int kCopies = 8;
    std::vector<Tensor> xs, ys, dys, dxs;
    for (int i = 0; i < kCopies; ++i) {
      xs.push_back(rand_tensor({N, C}, 10 + i));
      ys.push_back(Tensor::empty({N, C}));
      dys.push_back(rand_tensor({N, C}, 20 + i));
      dxs.push_back(Tensor::empty({N, C}));
    }
    Tensor w = rand_tensor({C}, 6), bias = rand_tensor({C}, 7), dw = Tensor::zeros({C}), db = Tensor::zeros({C});
    Tensor mean = Tensor::empty({N}), rstd = Tensor::empty({N});
    const double bytes = static_cast<double>(N) * C * 4;
    const double f = time_it([&](int r) {
      be.layer_norm_forward(xs[r % kCopies], w, bias, 1e-5f, ys[r % kCopies], mean, rstd);
    });
    report("layer_norm fwd (2048, 768)", f, 2 * bytes, triad);
    const double b = time_it([&](int r) {
      be.layer_norm_backward(dys[r % kCopies], xs[r % kCopies], w, mean, rstd, dxs[r % kCopies], dw, db);
    });
    report("layer_norm bwd (2048, 768)", b, 3 * bytes, triad);
  }
  {  // softmax over (B*NH*T, T): the shape of materialised attention scores, 25 MB x 4 copies
    constexpr int kCopies = 4;
    std::vector<Tensor> xs, ys;
    for (int i = 0; i < kCopies; ++i) {
      xs.push_back(rand_tensor({B * NH * T, T}, 30 + i, 8.0f));
      ys.push_back(Tensor::empty({B * NH * T, T}));
    }
    const double bytes = static_cast<double>(B * NH * T) * T * 4;
    const double f = time_it([&](int r) { be.softmax_forward(xs[r % kCopies], ys[r % kCopies]); });
    report("softmax fwd (24576, 256)", f, 2 * bytes, triad);
  }
  {  // attention (B, NH, T, hd)
    Tensor q = rand_tensor({B, NH, T, hd}, 40, 2.0f), k = rand_tensor({B, NH, T, hd}, 41, 2.0f);
    Tensor v = rand_tensor({B, NH, T, hd}, 42), dout = rand_tensor({B, NH, T, hd}, 43);
    Tensor out = Tensor::empty({B, NH, T, hd}), lse = Tensor::empty({B, NH, T});
    Tensor dq = Tensor::empty({B, NH, T, hd}), dk = Tensor::empty({B, NH, T, hd}), dv = Tensor::empty({B, NH, T, hd});
    const float scale = 1.0f / 8.0f;
    const double f =
        time_it([&](int) { be.attention_forward(q, k, v, scale, true, {}, 0, 0.0f, out, lse); });
    const double b = time_it([&](int) {
      be.attention_backward(dout, q, k, v, out, lse, scale, true, {}, 0, 0.0f, dq, dk, dv);
    });
    // Useful (causal, lower-triangle) FLOPs: forward 2 products, backward 5 (with the recompute).
    const double tri = static_cast<double>(B * NH) * T * (T + 1) / 2.0 * hd * 2.0;
    const double ff = 2 * tri, bf = 5 * tri;
    std::printf("%-44s %9.2f ms  %7.1f GFLOP/s  %5.2fx sgemm\n", "attention fwd (8, 12, 256, 64)", f * 1e3,
                ff / f / 1e9, ff / f / 1e9 / peak);
    std::printf("%-44s %9.2f ms  %7.1f GFLOP/s  %5.2fx sgemm\n", "attention bwd (8, 12, 256, 64)", b * 1e3,
                bf / b / 1e9, bf / b / 1e9 / peak);
    std::printf("%-44s %9.2f ms\n", "attention fwd+bwd", (f + b) * 1e3);
  }
  if (!g_no_ce) {  // the LM head + loss, forward and backward: linear then cross_entropy, against the fused
     // linear_cross_entropy (the logits a block of rows at a time); time and peak tensor memory
    autograd::GradModeGuard grad_on(true);
    Tensor x = rand_tensor({N, C}, 50), w = rand_tensor({V, C}, 51, 0.1f);
    x.set_requires_grad(true);
    w.set_requires_grad(true);
    std::vector<int64_t> tv(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) tv[static_cast<size_t>(i)] = (i * 7919) % V;
    const Tensor targets = Tensor::from_ints(tv, {N}, DType::i32);
    auto run = [&](bool fused) {
      x.set_grad(Tensor());
      w.set_grad(Tensor());
      Tensor loss = fused ? ops::linear_cross_entropy(x, w, targets)
                          : ops::cross_entropy(ops::linear(x, w), targets);
      loss.backward();
    };
    double sec[2], peak[2];
    for (int fused = 0; fused < 2; ++fused) {
      run(fused);
      cpu_allocator().reset_peak();
      const int64_t base = static_cast<int64_t>(cpu_allocator().stats().bytes_in_use);
      sec[fused] = time_it([&](int) { run(fused); });
      peak[fused] = static_cast<double>(
          static_cast<int64_t>(cpu_allocator().stats().peak_bytes_in_use) - base);
    }
    std::printf("%-44s %9.2f ms  peak +%7.1f MiB\n", "lm head + loss fwd+bwd (2048x768 @ 50257)",
                sec[0] * 1e3, peak[0] / 1048576.0);
    std::printf("%-44s %9.2f ms  peak +%7.1f MiB  %5.2fx the unfused time\n",
                "  fused (linear_cross_entropy)", sec[1] * 1e3, peak[1] / 1048576.0,
                sec[1] / sec[0]);
  }
}

Tensor bf16_tensor(const Shape& s, uint32_t seed, float scale = 1.0f) {
  return rand_tensor(s, seed, scale).to(DType::bf16);
}

// One op on bf16 tensors: forward alone (no grad) and forward + backward from a bf16 upstream
// gradient, over `copies` rotating input sets. fwd(r) returns the output of input set r; the
// leaves' gradients are cleared before each backward, so no accumulation is timed.
void bench_op16(const char* name, int copies, double bytes, const std::function<Tensor(int)>& fwd,
                const Shape& out_shape, const std::vector<Tensor>& leaves, double triad) {
  const Tensor g = bf16_tensor(out_shape, 99);
  const double f = time_it([&](int r) { fwd(r % copies); });
  const double fb = time_it([&](int r) {
    for (const Tensor& t : leaves) t.set_grad(Tensor());
    autograd::GradModeGuard grad_on(true);
    fwd(r % copies).backward(g);
  });
  char label[96];
  std::snprintf(label, sizeof label, "%s bf16 fwd", name);
  report(label, f, bytes, triad);
  std::snprintf(label, sizeof label, "%s bf16 fwd+bwd", name);
  std::printf("%-44s %9.2f ms\n", label, fb * 1e3);
}

void bench_bf16(double triad) {
  const int64_t B = 8, T = 256, C = 768, NH = 12, hd = C / NH, N = B * T;
  std::printf("\nbf16 ops (GB/s counts 2-byte elements: one read of each input, one write)\n");
  // Leaves that require grad: the backward computes every input's gradient, as in training.
  auto leaf = [](Tensor t) {
    t.set_requires_grad(true);
    return t;
  };
  auto all = [](std::vector<Tensor> a, const std::vector<Tensor>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  {
    constexpr int kCopies = 8;
    std::vector<Tensor> xs;
    for (int i = 0; i < kCopies; ++i) xs.push_back(leaf(bf16_tensor({N, C}, 10 + i)));
    const Tensor w = leaf(bf16_tensor({C}, 6)), b = leaf(bf16_tensor({C}, 7));
    bench_op16("layer_norm (2048, 768)", kCopies, 2.0 * N * C * 2,
               [&](int r) { return ops::layer_norm(xs[r], w, b); }, {N, C}, all(xs, {w, b}), triad);
    bench_op16("rms_norm (2048, 768)", kCopies, 2.0 * N * C * 2,
               [&](int r) { return ops::rms_norm(xs[r], w); }, {N, C}, all(xs, {w, b}), triad);
  }
  {
    constexpr int kCopies = 4;
    std::vector<Tensor> xs, us;
    for (int i = 0; i < kCopies; ++i) {
      xs.push_back(leaf(bf16_tensor({N, 4 * C}, 60 + i, 8.0f)));
      us.push_back(leaf(bf16_tensor({N, 4 * C}, 70 + i)));
    }
    bench_op16("gelu (2048, 3072)", kCopies, 2.0 * N * 4 * C * 2,
               [&](int r) { return ops::gelu(xs[r]); }, {N, 4 * C}, xs, triad);
    bench_op16("gelu_erf (2048, 3072)", kCopies, 2.0 * N * 4 * C * 2,
               [&](int r) { return ops::gelu_erf(xs[r]); }, {N, 4 * C}, xs, triad);
    bench_op16("swiglu (2048, 3072)", kCopies, 3.0 * N * 4 * C * 2,
               [&](int r) { return ops::swiglu(xs[r], us[r]); }, {N, 4 * C}, all(xs, us), triad);
  }
  {
    constexpr int kCopies = 4;
    std::vector<Tensor> xs;
    for (int i = 0; i < kCopies; ++i) xs.push_back(leaf(bf16_tensor({B * NH * T, T}, 30 + i, 8.0f)));
    bench_op16("softmax (24576, 256)", kCopies, 2.0 * B * NH * T * T * 2,
               [&](int r) { return ops::softmax(xs[r]); }, {B * NH * T, T}, xs, triad);
  }
  {
    const Tensor q = leaf(bf16_tensor({B, NH, T, hd}, 40, 2.0f)), k = leaf(bf16_tensor({B, NH, T, hd}, 41, 2.0f));
    const Tensor v = leaf(bf16_tensor({B, NH, T, hd}, 42));
    bench_op16("attention (8, 12, 256, 64)", 1, 4.0 * B * NH * T * hd * 2,
               [&](int) { return ops::causal_attention(q, k, v); }, {B, NH, T, hd}, {q, k, v}, triad);
    bench_op16("rope (8, 12, 256, 64)", 1, 2.0 * B * NH * T * hd * 2,
               [&](int) { return ops::rope(q); }, {B, NH, T, hd}, {q}, triad);
  }
}

}  // namespace

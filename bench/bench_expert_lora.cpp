// The cost of LoRA on a mixture of experts' stacked weights (nn/expert_lora.h): one MoEExperts
// forward + backward (a SwiGLU expert layer, rows spread evenly over the experts) with LoRA on
// gate_up_proj and down_proj against the same layer without, in the same run.
//
//   bench_expert_lora [--experts 8] [--embd 512] [--hidden 1024] [--rows 4096] [--r 8]
//                     [--iters 5] [--threads 2]
//
// Without LoRA the backward still computes the dense dW (E, out, in) (grouped_linear); with it,
// each forward also builds W_eff = W + scaling * delta per adapted weight and the backward reduces
// dW_eff to dA, dB: the ratio printed is that overhead.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include <CLI/CLI.hpp>

#include "ds/core/parallel.h"
#include "ds/core/rng.h"
#include "ds/core/tensor.h"
#include "ds/nn/expert_lora.h"
#include "ds/nn/moe.h"
#include "ds/ops/ops.h"

using namespace ds;
using Clock = std::chrono::steady_clock;

namespace {

Tensor randn(const Shape& shape, float scale) {
  static uint64_t stream = 0;
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  ++stream;
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * rng::normal(1, stream, i);
  return Tensor::from_data(v, shape);
}

// Seconds of one forward + backward of `ex` on xs.
double time_step(nn::MoEExperts& ex, const Tensor& xs, const std::vector<int64_t>& counts) {
  const auto t0 = Clock::now();
  ex.set_counts(counts);
  Tensor y = ex(xs);
  ops::sum(y).backward();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  int64_t E = 8, C = 512, I = 1024, M = 4096, r = 8;
  int iters = 5, threads = 2;
  CLI::App app{"LoRA on stacked experts: forward + backward against the plain experts"};
  app.add_option("--experts", E);
  app.add_option("--embd", C);
  app.add_option("--hidden", I);
  app.add_option("--rows", M, "rows (token choices) through the layer");
  app.add_option("--r", r);
  app.add_option("--iters", iters);
  app.add_option("--threads", threads);
  CLI11_PARSE(app, argc, argv);
  set_num_threads(threads);
  std::vector<int64_t> counts(static_cast<size_t>(E), M / E);
  counts.back() += M - (M / E) * E;
  Tensor xs = randn({M, C}, 1.0f);
  xs.set_requires_grad(true);

  nn::MoEExperts plain(E, C, I), adapted(E, C, I);
  for (nn::MoEExperts* ex : {&plain, &adapted}) {
    ex->gate_up_proj().copy_from(randn({E, 2 * I, C}, 0.02f));
    ex->down_proj().copy_from(randn({E, C, I}, 0.02f));
  }
  for (const char* w : {"gate_up_proj", "down_proj"}) {
    auto l = adapted.add_lora(w, r, 2.0f);
    l->lora_A().copy_from(randn(l->lora_A().shape(), 0.02f));
    l->lora_B().copy_from(randn(l->lora_B().shape(), 0.02f));
  }
  adapted.gate_up_proj().set_requires_grad(false);
  adapted.down_proj().set_requires_grad(false);

  // Interleaved, best of `iters` each after one warm-up: a busy machine slows both alike.
  double base = 1e30, lora = 1e30;
  for (int i = 0; i <= iters; ++i) {
    const double b = time_step(plain, xs, counts), l = time_step(adapted, xs, counts);
    if (i > 0) base = std::min(base, b), lora = std::min(lora, l);
  }
  std::printf(
      "experts E %lld, C %lld, I %lld, rows %lld, r %lld, %d threads: forward+backward plain "
      "%.2f ms, with expert LoRA %.2f ms: ratio %.3f\n",
      static_cast<long long>(E), static_cast<long long>(C), static_cast<long long>(I),
      static_cast<long long>(M), static_cast<long long>(r), threads, base * 1e3, lora * 1e3,
      lora / base);
  return 0;
}

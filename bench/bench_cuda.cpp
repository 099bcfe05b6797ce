// The CUDA backend on one GPU: matrix-multiply rates through ops::matmul, attention forward and
// backward, and a GPT forward + backward step, each printed as a BENCH line that
// bench/run_cuda.sh puts beside PyTorch's numbers for the same work on the same GPU
// (bench/torch_cuda_step.py, same run).
//
//   bench_cuda [--model gpt2-124m] [--batch 8] [--seq 1024] [--steps 5]
//
// Timing: every timed region ends by reading a value back to the host (loss.item() or a one-element
// slice), which waits for the GPU; the first iteration of everything is a warm-up (cuBLAS handles,
// the caching allocator's first cudaMallocs).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "ds/autograd/grad_mode.h"
#include "ds/backend/backend.h"
#include "ds/core/rng.h"
#include "ds/models/gpt.h"
#include "ds/nn/flat.h"
#include "ds/ops/ops.h"
#include "ds/optim/kernels.h"

using namespace ds;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

const Device kGpu{DeviceType::cuda, 0};

Tensor on_gpu(const Tensor& t) {
  Tensor out = Tensor::empty(t.shape(), t.dtype(), kGpu);
  out.copy_from(t);
  return out;
}

Tensor random_normal(const Shape& shape, uint64_t seed, DType dt) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = rng::normal(seed, 3, i);
  return on_gpu(Tensor::from_data(v, shape, dt));
}

void wait(const Tensor& t) { (void)ops::slice(ops::reshape(t, {-1}), 0, 0, 1).to_vector(); }

// TFLOP/s of an (n, n) x (n, n) product through ops::matmul, median of `reps`.
double matmul_tflops(int64_t n, DType dt, int reps) {
  autograd::NoGradGuard ng;
  const Tensor a = random_normal({n, n}, 1, dt), b = random_normal({n, n}, 2, dt);
  wait(ops::matmul(a, b));
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    Tensor c;
    for (int j = 0; j < 10; ++j) c = ops::matmul(a, b);
    wait(c);
    t.push_back(seconds_since(t0) / 10);
  }
  return 2.0 * n * n * n / median(t) / 1e12;
}

Tensor random_tokens(int64_t b, int64_t t, int64_t vocab, uint64_t stream) {
  std::vector<int64_t> ids(static_cast<size_t>(b * t));
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<int64_t>(rng::hash3(1234, stream, i) % static_cast<uint64_t>(vocab));
  return on_gpu(Tensor::from_ints(ids, {b, t}, DType::i64));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The CUDA backend: GEMM, attention and a GPT training step on cuda:0"};
  std::string model_name = "gpt2-124m";
  int64_t batch = 8, seq = 1024;
  int steps = 5;
  app.add_option("--model", model_name, "model preset")->capture_default_str();
  app.add_option("--batch", batch, "micro-batch size B")->capture_default_str();
  app.add_option("--seq", seq, "sequence length T")->capture_default_str();
  app.add_option("--steps", steps, "timed steps (after one warm-up step)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  try {
    std::printf("GEMM path: %s\n", backend::cuda(0).gemm_info().c_str());
    for (const DType dt : {DType::f32, DType::bf16})
      std::printf("BENCH cuda_matmul dtype=%s n=4096 tflops=%.1f\n", dtype_name(dt),
                  matmul_tflops(4096, dt, 5));

    // Attention at the model's shape: (B, NH, T, hd) fp32, causal, forward and backward.
    models::GPTConfig cfg = models::GPTConfig::preset(model_name);
    cfg.block_size = std::max<int64_t>(cfg.block_size, seq);
    {
      const int64_t nh = cfg.n_head, hd = cfg.n_embd / cfg.n_head;
      Tensor q = random_normal({batch, nh, seq, hd}, 4, DType::f32);
      Tensor k = random_normal({batch, nh, seq, hd}, 5, DType::f32);
      Tensor v = random_normal({batch, nh, seq, hd}, 6, DType::f32);
      const Tensor dy = random_normal({batch, nh, seq, hd}, 7, DType::f32);  // as a model's: dense
      for (Tensor* t : {&q, &k, &v}) t->set_requires_grad(true);
      std::vector<double> tf, tb;
      for (int i = 0; i <= steps; ++i) {
        auto t0 = Clock::now();
        Tensor y = ops::causal_attention(q, k, v);
        wait(y);
        const double f = seconds_since(t0);
        t0 = Clock::now();
        y.backward(dy);
        wait(q.grad());
        const double b = seconds_since(t0);
        if (i > 0) {
          tf.push_back(f);
          tb.push_back(b);
        }
        for (Tensor* t : {&q, &k, &v}) t->set_grad({});
      }
      std::printf("BENCH cuda_attention B=%lld NH=%lld T=%lld hd=%lld forward_ms=%.3f "
                  "backward_ms=%.3f\n",
                  static_cast<long long>(batch), static_cast<long long>(nh),
                  static_cast<long long>(seq), static_cast<long long>(hd), median(tf) * 1e3,
                  median(tb) * 1e3);
    }

    models::GPT model(cfg);
    model.to(kGpu);
    nn::FlatParameters flat = nn::flatten_parameters(model);  // on the GPU, like the model
    const Tensor m = Tensor::zeros({flat.padded_numel}, DType::f32, kGpu);
    const Tensor v = Tensor::zeros({flat.padded_numel}, DType::f32, kGpu);
    optim::AdamConfig adam;
    adam.lr = 1e-4f;
    adam.weight_decay = 0.1f;
    const int64_t params = model.num_parameters();
    const Tensor ids = random_tokens(batch, seq, cfg.vocab_size, 1);
    const Tensor targets = random_tokens(batch, seq, cfg.vocab_size, 2);
    std::printf("model %s: %.1fM parameters on %s, batch %lld x %lld tokens, fp32, AdamW on the "
                "GPU\n",
                model_name.c_str(), params / 1e6, kGpu.str().c_str(), static_cast<long long>(batch),
                static_cast<long long>(seq));
    std::vector<double> fwd, fwd_bwd, total;
    for (int s = 0; s <= steps; ++s) {
      flat.grads.zero_();
      const auto t0 = Clock::now();
      Tensor loss = model.loss(ids, targets);
      const float lv = loss.item();
      const double tf = seconds_since(t0);
      loss.backward();
      wait(flat.grads);
      const double tb = seconds_since(t0);
      optim::adam_update(flat.params, flat.grads, m, v, s + 1, adam);
      wait(flat.params);
      const double tt = seconds_since(t0);
      std::printf("step %d: loss %.4f  forward %.1f ms  +backward %.1f ms  +AdamW %.1f ms\n", s, lv,
                  tf * 1e3, tb * 1e3, tt * 1e3);
      if (s > 0) {
        fwd.push_back(tf);
        fwd_bwd.push_back(tb);
        total.push_back(tt);
      }
    }
    const double tokens = static_cast<double>(batch * seq);
    const double step_s = median(total), fb_s = median(fwd_bwd);
    std::printf("BENCH cuda_fwd_bwd model=%s dtype=fp32 tokens_per_s=%.0f step_ms=%.1f "
                "forward_ms=%.1f model_tflops=%.1f\n",
                model_name.c_str(), tokens / fb_s, fb_s * 1e3, median(fwd) * 1e3,
                6.0 * params * tokens / fb_s / 1e12);
    std::printf("BENCH cuda_train_step model=%s dtype=fp32 optimizer=AdamW tokens_per_s=%.0f "
                "step_ms=%.1f model_tflops=%.1f\n",
                model_name.c_str(), tokens / step_s, step_s * 1e3,
                6.0 * params * tokens / step_s / 1e12);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}

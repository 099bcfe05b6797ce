// One full training step (forward, backward, AdamW on the flat fp32 buffer) of a GPT model, timed
// against the machine's sgemm peak measured in the same run.
//
//   bench_train_step [--model gpt2-124m] [--batch 8] [--seq 256] [--steps 3] [--threads 2]
//   bench_train_step --dtype bf16 ...   # ds_train's bf16 step: the engine with "bf16" enabled
//                                       # (bf16 parameters and activations, fp32 master weights and
//                                       # AdamW), against the bf16 GEMM peak of the same backend
//   bench_train_step --peak_only [--dtype bf16]
//                                       # the sgemm peak line only; with --dtype bf16 also
//                                       # "bf16 GEMM peak (2048^3, N threads): X GFLOP/s"
//                                       # (bench/run_families.sh's reference in either dtype)
//
// achieved_gflops = 6 * params * tokens / step time (the convention of machine.md; attention FLOPs
// are not counted, so the fraction is a slight underestimate of the hardware's utilisation).
#include <algorithm>
#include <memory>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "ds/autograd/grad_mode.h"
#include "ds/backend/backend.h"
#include "ds/core/allocator.h"
#include "ds/core/parallel.h"
#include "ds/core/rng.h"
#include "ds/models/gpt.h"
#include "ds/nn/flat.h"
#include "ds/ops/ops.h"
#include "ds/optim/optimizer.h"
#include "ds/runtime/engine.h"
#include "ds/train/train_util.h"

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

// Best of several 2048^3 GEMMs (fp32, or bf16 operands with fp32 accumulation) through the same
// backend the model uses.
double gemm_peak_gflops(DType dtype = DType::f32) {
  autograd::NoGradGuard no_grad;
  const int64_t n = 2048;
  Tensor a = Tensor::full({n, n}, 0.5).to(dtype), b = Tensor::full({n, n}, 0.25).to(dtype);
  ops::matmul(a, b);  // warm-up: thread pool, page faults, BLAS buffers
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    auto t0 = Clock::now();
    ops::matmul(a, b);
    best = std::min(best, seconds_since(t0));
  }
  return 2.0 * n * n * n / best / 1e9;
}

Tensor random_tokens(int64_t b, int64_t t, int64_t vocab, uint64_t stream) {
  std::vector<int64_t> ids(static_cast<size_t>(b * t));
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<int64_t>(rng::hash3(1234, stream, i) % static_cast<uint64_t>(vocab));
  return Tensor::from_ints(ids, {b, t}, DType::i32);
}

// ds_train's bf16 step on the engine: forward, backward, the fp32 AdamW on the master weights and
// the copy back to bf16, timed against the bf16 GEMM peak of the same backend.
int bf16_engine_steps(const std::string& model_name, int64_t batch, int64_t seq, int steps,
                      int threads) {
  const double peak = gemm_peak_gflops(DType::bf16);
  std::printf("bf16 GEMM peak (2048^3, %d threads): %.1f GFLOP/s\n", threads, peak);
  models::GPTConfig cfg = models::GPTConfig::preset(model_name);
  auto model = std::make_shared<models::GPT>(cfg);
  const int64_t params = model->num_parameters();
  const std::string config = fmt::format(
      R"({{"train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": 1,
  "bf16": {{"enabled": true}},
  "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-4, "weight_decay": 0.1}}}},
  "zero_optimization": {{"stage": 0}}}})",
      batch);
  runtime::InitOptions opt;
  opt.ctx.source_name = "bench_train_step bf16 config";
  opt.log = [](const std::string&) {};
  auto engine = runtime::initialize(model, config, opt);
  std::printf("model %s: %.1fM parameters, batch %lld x %lld tokens, bf16 (engine, ZeRO 0)\n",
              model_name.c_str(), params / 1e6, static_cast<long long>(batch),
              static_cast<long long>(seq));
  Tensor ids = random_tokens(batch, seq, cfg.vocab_size, 1);
  Tensor targets = random_tokens(batch, seq, cfg.vocab_size, 2);
  std::vector<double> fwd, bwd, opt_s, total;
  for (int s = 0; s <= steps; ++s) {
    auto t0 = Clock::now();
    Tensor loss = engine->forward(ids, targets);
    const double tf = seconds_since(t0);
    auto t1 = Clock::now();
    engine->backward(loss);
    const double tb = seconds_since(t1);
    auto t2 = Clock::now();
    engine->step();
    const double to = seconds_since(t2), tt = seconds_since(t0);
    std::printf("step %d: loss %.4f  forward %.2f s  backward %.2f s  step %.2f s  total %.2f s\n",
                s, loss.item(), tf, tb, to, tt);
    if (s == 0) continue;
    fwd.push_back(tf);
    bwd.push_back(tb);
    opt_s.push_back(to);
    total.push_back(tt);
  }
  const double step_s = median(total), tokens = static_cast<double>(batch * seq);
  const double achieved = 6.0 * params * tokens / step_s / 1e9;
  std::printf("median: forward %.2f s, backward %.2f s, optimizer step %.2f s\n", median(fwd),
              median(bwd), median(opt_s));
  std::printf(
      "BENCH train_step model=%s dtype=bf16 tokens_per_s=%.1f achieved_gflops=%.1f "
      "peak_gflops=%.1f fraction=%.3f peak_rss_mib=%.1f\n",
      model_name.c_str(), tokens / step_s, achieved, peak, achieved / peak,
      static_cast<double>(train::peak_rss_bytes()) / (1 << 20));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Time one GPT training step against the sgemm peak measured in the same run"};
  std::string model_name = "gpt2-124m";
  int64_t batch = 8, seq = 256;
  int steps = 3, threads = 2;
  bool checkpointing = false;
  app.add_option("--model", model_name, "model preset")->capture_default_str();
  app.add_option("--batch", batch, "micro-batch size B")->capture_default_str();
  app.add_option("--seq", seq, "sequence length T")->capture_default_str();
  app.add_option("--steps", steps, "timed steps (after one warm-up step)")->capture_default_str();
  app.add_option("--threads", threads, "threads for BLAS and kernels")->capture_default_str();
  app.add_flag("--gradient_checkpointing", checkpointing, "recompute blocks in backward");
  std::string dtype_name = "fp32";
  app.add_option("--dtype", dtype_name,
                 "fp32 (the model and AdamW on flat fp32 buffers) or bf16 (the engine as ds_train "
                 "runs it with \"bf16\": {\"enabled\": true}, ZeRO stage 0)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  bool peak_only = false;
  app.add_flag(
      "--peak_only", peak_only,
      "print the sgemm peak line only (other benchmarks' reference, e.g. run_families.sh); with "
      "--dtype bf16 the bf16 GEMM peak line after it");
  CLI11_PARSE(app, argc, argv);

  try {
    set_num_threads(threads);
    std::printf("GEMM path: %s\n", backend::cpu().gemm_info().c_str());
    const double peak = gemm_peak_gflops();
    std::printf("sgemm peak (2048^3, %d threads): %.1f GFLOP/s\n", threads, peak);
    if (peak_only) {
      if (dtype_name == "bf16")
        std::printf("bf16 GEMM peak (2048^3, %d threads): %.1f GFLOP/s\n", threads,
                    gemm_peak_gflops(DType::bf16));
      return 0;
    }
    if (dtype_name == "bf16") return bf16_engine_steps(model_name, batch, seq, steps, threads);

    models::GPTConfig cfg = models::GPTConfig::preset(model_name);
    models::GPT model(cfg);
    model.set_gradient_checkpointing(checkpointing);
    nn::FlatParameters flat = nn::flatten_parameters(model);
    const int64_t params = model.num_parameters();
    Tensor m = Tensor::zeros({flat.padded_numel}), v = Tensor::zeros({flat.padded_numel});
    optim::AdamConfig adam;
    adam.lr = 1e-4f;
    adam.weight_decay = 0.1f;
    std::printf("model %s: %.1fM parameters, batch %lld x %lld tokens\n", model_name.c_str(),
                params / 1e6, static_cast<long long>(batch), static_cast<long long>(seq));

    Tensor ids = random_tokens(batch, seq, cfg.vocab_size, 1);
    Tensor targets = random_tokens(batch, seq, cfg.vocab_size, 2);
    std::vector<double> fwd, bwd, opt, total;
    uint64_t misses_after_warmup = 0;
    for (int s = 0; s <= steps; ++s) {
      auto t0 = Clock::now();
      Tensor loss = model.loss(ids, targets);
      const double tf = seconds_since(t0);
      auto t1 = Clock::now();
      loss.backward();
      const double tb = seconds_since(t1);
      auto t2 = Clock::now();
      optim::adam_update(flat.params.data<float>(), flat.grads.data<float>(), m.data<float>(),
                         v.data<float>(), flat.padded_numel, s + 1, adam);
      flat.grads.zero_();
      const double to = seconds_since(t2);
      const double tt = seconds_since(t0);
      std::printf(
          "step %d: loss %.4f  forward %.2f s  backward %.2f s  adamw %.2f s  total %.2f s\n", s,
          loss.item(), tf, tb, to, tt);
      if (s == 0) {
        misses_after_warmup = cpu_allocator().stats().misses;
        continue;
      }
      fwd.push_back(tf);
      bwd.push_back(tb);
      opt.push_back(to);
      total.push_back(tt);
    }
    const double step_s = median(total);
    const double tokens = static_cast<double>(batch * seq);
    const double achieved = 6.0 * params * tokens / step_s / 1e9;
    std::printf(
        "median: forward %.2f s, backward %.2f s, adamw %.2f s; allocator misses after "
        "warm-up: %llu\n",
        median(fwd), median(bwd), median(opt),
        static_cast<unsigned long long>(cpu_allocator().stats().misses - misses_after_warmup));
    std::printf(
        "BENCH train_step model=%s tokens_per_s=%.1f achieved_gflops=%.1f peak_gflops=%.1f "
        "fraction=%.3f\n",
        model_name.c_str(), tokens / step_s, achieved, peak, achieved / peak);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}

// 1-bit Adam against AdamW on N ranks (run under mpirun): bytes each rank sends per step after
// the freeze (comms_logger: bus bytes, and message sizes) and step time, both optimizers measured
// in the same run on the same synthetic tokens.
//
//   mpirun -np 2 --oversubscribe -x OMP_NUM_THREADS=1 build/bench/bench_onebit \
//       [--model tiny] [--batch 4] [--seq 128] [--steps 5] [--freeze 3] [--optimizer OneBitAdam]
//
// fp32, ZeRO stage 0, gradient_accumulation_steps 1. Each optimizer first runs --freeze untimed
// steps (1-bit Adam's warm-up: plain Adam with the gradient all-reduce), then --steps timed ones
// (1-bit Adam: local gradients, the compressed momentum all-reduce; ZeroOneAdam: --freeze is its
// var_freeze_step, so the timed steps are local steps). A step's time is the slowest
// rank's (forward + backward + step). Rank 0 prints, last,
//   BENCH onebit optimizer=<o> bus_bytes=<b> adamw_bus_bytes=<a> bytes_ratio=<b/a>
//         step_ms=<t> adamw_step_ms=<u> time_ratio=<t/u>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "ds/comm/group.h"
#include "ds/comm/logger.h"
#include "ds/core/parallel.h"
#include "ds/core/rng.h"
#include "ds/models/gpt.h"
#include "ds/runtime/engine.h"

using namespace ds;
using Clock = std::chrono::steady_clock;

namespace {

Tensor tokens(int64_t b, int64_t t, int64_t vocab, uint64_t stream) {
  Tensor ids = Tensor::empty({b, t}, DType::i32);
  auto* p = ids.data<int32_t>();
  for (int64_t i = 0; i < b * t; ++i)
    p[i] = static_cast<int32_t>(rng::hash3(4243, stream, static_cast<uint64_t>(i)) %
                                static_cast<uint64_t>(vocab));
  return ids;
}

struct Measured {
  double bus_bytes = 0, message_bytes = 0, step_ms = 0;  // per timed step
};

Measured run(const std::string& optimizer, const std::string& model_name, int64_t batch,
             int64_t seq, int steps, int freeze) {
  auto world = comm::world();
  const int n = world->size(), rank = world->rank();
  models::GPTConfig cfg = models::GPTConfig::preset(model_name);
  auto model = std::make_shared<models::GPT>(cfg);
  const std::string config = fmt::format(
      R"({{"train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": 1,
  "optimizer": {{"type": "{}", "params": {{"lr": 1e-4, "weight_decay": 0.1{}}}}}}})",
      batch, optimizer,
      optimizer == "AdamW"         ? std::string(R"(, "bias_correction": false)")
      : optimizer == "ZeroOneAdam" ? fmt::format(R"(, "var_freeze_step": {})", freeze)
                                   : fmt::format(R"(, "freeze_step": {})", freeze));
  runtime::InitOptions opt;
  opt.group = world;
  opt.log = [](const std::string&) {};
  auto engine = runtime::initialize(model, config, opt);
  auto& log = comm::comms_logger();
  std::vector<double> ms;
  for (int s = 0; s < freeze + 1 + steps; ++s) {
    const bool timed = s > freeze;  // step freeze + 1 is the first compressed one
    const uint64_t stream = static_cast<uint64_t>(s * n + rank);
    Tensor x = tokens(batch, seq, cfg.vocab_size, 2 * stream);
    Tensor y = tokens(batch, seq, cfg.vocab_size, 2 * stream + 1);
    world->barrier();
    if (timed) {
      log.enable(true);
      if (s == freeze + 1) log.reset();
    }
    const auto t0 = Clock::now();
    Tensor loss = engine->forward(x, y);
    engine->backward(loss);
    engine->step();
    auto t =
        static_cast<float>(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    log.enable(false);
    world->all_reduce(&t, 1, DType::f32, comm::ReduceOp::max, "step time");  // the slowest rank's
    if (timed) ms.push_back(t);
  }
  Measured m;
  for (const auto& [op, e] : log.totals()) {
    m.bus_bytes += static_cast<double>(e.bytes) * comm::bus_factor(op, n) / steps;
    m.message_bytes += static_cast<double>(e.bytes) / steps;
  }
  std::sort(ms.begin(), ms.end());
  m.step_ms = ms[ms.size() / 2];
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"1-bit optimizers against AdamW: bytes and step time per step (under mpirun)"};
  std::string model_name = "tiny", optimizer = "OneBitAdam";
  int steps = 5, freeze = 3, threads = 1;
  int64_t batch = 4, seq = 128;
  app.add_option("--model", model_name, "model preset")->capture_default_str();
  app.add_option("--optimizer", optimizer, "OneBitAdam, ZeroOneAdam or OneBitLamb")
      ->capture_default_str();
  app.add_option("--batch", batch, "micro-batch per rank")->capture_default_str();
  app.add_option("--seq", seq, "sequence length")->capture_default_str();
  app.add_option("--steps", steps, "timed steps after the freeze")->capture_default_str();
  app.add_option("--freeze", freeze, "freeze_step (untimed warm-up steps)")->capture_default_str();
  app.add_option("--threads", threads, "threads per rank")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    set_num_threads(threads);
    auto world = comm::world();
    const Measured a = run("AdamW", model_name, batch, seq, steps, freeze);
    const Measured o = run(optimizer, model_name, batch, seq, steps, freeze);
    if (world->rank() == 0) {
      std::printf(
          "bench_onebit: model %s (%.1fM parameters), %d ranks x %d threads, micro-batch "
          "%lld x %lld\n",
          model_name.c_str(), models::GPTConfig::preset(model_name).num_parameters() / 1e6,
          world->size(), threads, static_cast<long long>(batch), static_cast<long long>(seq));
      std::printf("  AdamW      bus %.0f B/step, message %.0f B/step, step %.1f ms\n", a.bus_bytes,
                  a.message_bytes, a.step_ms);
      std::printf("  %-10s bus %.0f B/step, message %.0f B/step, step %.1f ms\n", optimizer.c_str(),
                  o.bus_bytes, o.message_bytes, o.step_ms);
      std::printf(
          "BENCH onebit optimizer=%s bus_bytes=%.0f adamw_bus_bytes=%.0f bytes_ratio=%.5f "
          "step_ms=%.2f adamw_step_ms=%.2f time_ratio=%.3f\n",
          optimizer.c_str(), o.bus_bytes, a.bus_bytes, o.bus_bytes / a.bus_bytes, o.step_ms,
          a.step_ms, o.step_ms / a.step_ms);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_onebit: %s\n", e.what());
    comm::abort_job(1, "");
  }
  return 0;
}

// Tensor parallelism on N ranks (run under mpirun): the bytes the tensor-parallel collectives move
// per step, from the comms logger, against the formula for the model shape, and the step time
// against the same model trained whole by one process in the same run (rank 0 trains it first,
// with one thread, while the others wait; then all N train the cut model, one thread each).
//
//   mpirun -np 2 --oversubscribe -x OMP_NUM_THREADS=1 build/bench/bench_tensor_parallel \
//       [--layers 4] [--embd 512] [--heads 8] [--vocab 50257] [--batch 4] [--seq 256] [--steps 5]
//
// GPT-2 layout, fp32, AdamW, ZeRO-0, tp = N, dp = 1. Formula, per micro-step, for the all-reduces
// of nn/tensor_parallel.h (Megatron's f and g): forward 2 per block (attention and MLP outputs) + 1
// (the embedding), backward 2 per block (their inputs' gradients) + 1 (the LM head's input), each
// of B*T*C values; the vocabulary-parallel loss 3 of B*T values; the gradient norm 1 value per
// step. Bytes are message sizes (what each rank hands to the all-reduce), as DeepSpeed's comms
// logger counts them. Prints, last:
//   BENCH tensor_parallel tp=<N> allreduce_bytes_per_step=<x> formula=<y> ratio=<x/y>
//     step_s=<t> whole_step_s=<t1> speedup=<t1/t>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "ds/comm/group.h"
#include "ds/comm/logger.h"
#include "ds/comm/topology.h"
#include "ds/core/parallel.h"
#include "ds/models/gpt.h"
#include "ds/nn/tensor_parallel.h"
#include "ds/runtime/engine.h"

using namespace ds;
using Clock = std::chrono::steady_clock;

namespace {

Tensor tokens(int64_t b, int64_t t, int64_t vocab, uint64_t stream) {
  std::vector<int64_t> v(static_cast<size_t>(b * t));
  uint64_t x = 0x9E3779B97F4A7C15ull * (stream + 1);
  for (auto& e : v) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    e = static_cast<int64_t>(x % static_cast<uint64_t>(vocab));
  }
  return Tensor::from_ints(v, {b, t}, DType::i32);
}

std::string ds_config(int64_t batch, int tp) {
  return fmt::format(R"({{"train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": 1,
    "gradient_clipping": 1.0, "zero_optimization": {{"stage": 0}},
    "tensor_parallel": {{"autotp_size": {}}},
    "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-4}}}}}})",
                     batch, tp);
}

// Median seconds per step over `steps` after one warm-up step.
double train(runtime::Engine& e, int64_t B, int64_t T, int64_t V, int steps, comm::Group* sync) {
  std::vector<double> times;
  for (int s = 0; s <= steps; ++s) {
    if (s == 1) comm::comms_logger().reset();
    Tensor x = tokens(B, T, V, 2 * s), y = tokens(B, T, V, 2 * s + 1);
    if (sync) sync->barrier();
    const auto t0 = Clock::now();
    Tensor loss = e.forward(x, y);
    e.backward(loss);
    e.step();
    if (sync) sync->barrier();
    if (s > 0) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tensor-parallel bytes and step time"};
  int64_t L = 4, C = 512, NH = 8, V = 50257, B = 4, T = 256;
  int steps = 5;
  app.add_option("--layers", L);
  app.add_option("--embd", C);
  app.add_option("--heads", NH);
  app.add_option("--vocab", V);
  app.add_option("--batch", B);
  app.add_option("--seq", T);
  app.add_option("--steps", steps);
  CLI11_PARSE(app, argc, argv);
  set_num_threads(1);
  auto w = comm::world();
  const int n = w->size(), rank = w->rank();
  models::GPTConfig c = models::GPTConfig::preset("gpt2");
  c.n_layer = L, c.n_embd = C, c.n_head = NH, c.vocab_size = V, c.block_size = T;
  runtime::InitOptions quiet;
  quiet.log = [](const std::string&) {};

  double whole = 0;
  if (rank == 0) {
    runtime::InitOptions one = quiet;
    one.group = comm::single_process_group();
    auto e = runtime::initialize(std::make_shared<models::GPT>(c), ds_config(B, 1), one);
    whole = train(*e, B, T, V, steps, nullptr);
  }
  w->barrier();

  auto topo = std::make_shared<comm::Topology>(w, n, 1);
  runtime::InitOptions opt = quiet;
  opt.topology = topo;
  auto model = std::make_shared<models::GPT>(
      c, std::make_shared<nn::TensorParallel>(topo->tensor_parallel()));
  auto e = runtime::initialize(model, ds_config(B, n), opt);
  comm::comms_logger().enable(true);
  const double step = train(*e, B, T, V, steps, w.get());
  comm::comms_logger().enable(false);
  const auto totals = comm::comms_logger().totals();
  const auto it = totals.find(comm::OpKind::all_reduce);
  const double measured =
      it == totals.end() ? 0.0 : static_cast<double>(it->second.bytes) / steps;
  const double act = static_cast<double>(B * T * C) * 4.0;
  const double formula = (4.0 * L + 2.0) * act + 3.0 * static_cast<double>(B * T) * 4.0 + 4.0;
  if (rank == 0) {
    std::printf("%s", comm::comms_logger().table().c_str());
    std::printf(
        "model gpt2 L %lld C %lld NH %lld V %lld, B %lld T %lld, fp32, tp %d, one thread per rank\n",
        static_cast<long long>(L), static_cast<long long>(C), static_cast<long long>(NH),
        static_cast<long long>(V), static_cast<long long>(B), static_cast<long long>(T), n);
    std::printf(
        "BENCH tensor_parallel tp=%d allreduce_bytes_per_step=%.0f formula=%.0f ratio=%.4f "
        "step_s=%.3f whole_step_s=%.3f speedup=%.2f\n",
        n, measured, formula, measured / formula, step, whole, whole / step);
  }
  return 0;
}

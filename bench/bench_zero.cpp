// ZeRO stages 0-3 on N ranks (run under mpirun): training throughput, model-state bytes and peak
// RSS per rank of a GPT-2-layout model, against PyTorch DDP measured in the same run by
// bench/torch_ddp.py (its tokens/s is passed in). bench/run_zero_bench.sh drives it.
//
//   mpirun -np 2 --oversubscribe -x OMP_NUM_THREADS=1 build/bench/bench_zero \
//       [--model tiny] [--stage 0..3] [--batch 8] [--seq 256] [--steps 5] [--warmup 1]
//       [--bucket 5000000] [--threads 1] [--torch_tokens_per_s X] [--gradient_checkpointing]
//       [--zero_json '"stage3_max_reuse_distance": 0, ...'] [--comm_bytes]
//
// fp32, AdamW, gradient_accumulation_steps 1, micro-batch --batch per rank; each rank trains on its
// own synthetic tokens. Stage 3 builds the model under nn::PartitionedInit (no rank ever holds the
// whole model). tokens/s = global tokens per step (batch * seq * N) / median step time, where a
// step's time is the slowest rank's (forward + backward + step). Peak RSS is VmHWM from
// /proc/self/status: everything the process ever had resident (binary, MPI, the shared-memory
// window of the collectives, model states, activations, the caching allocator's free lists).
//
// Rank 0 prints a table of every rank, a MEM line (largest rank's model states, the caching
// allocator's peak in use and reserved bytes, peak RSS) and, last,
//   BENCH zero stage=<s> tokens_per_s=<x> torch_ddp_tokens_per_s=<y> ratio=<x/y> peak_rss_mib=<m>
// with peak_rss_mib the largest rank's VmHWM (the number a per-rank memory cap constrains).
// --comm_bytes: comms_logger over the timed steps; rank 0 adds, per collective kind,
//   COMM op=<all_gather|reduce_scatter|all_to_all|...> bytes_per_step=<b> count_per_step=<c>
// (rank 0's message bytes, comm/logger.h). bench/run_zeropp.sh compares ZeRO++ and MiCS this way.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "ds/backend/backend.h"
#include "ds/comm/group.h"
#include "ds/comm/logger.h"
#include "ds/core/allocator.h"
#include "ds/core/parallel.h"
#include "ds/core/rng.h"
#include "ds/models/gpt.h"
#include "ds/nn/module.h"
#include "ds/runtime/engine.h"

using namespace ds;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A field of /proc/self/status in KiB ("VmHWM", "VmRSS", "RssShmem"); -1 if absent.
int64_t proc_status_kib(const std::string& field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1));
  return -1;
}

// Rank `rank`'s micro-batch of step `step`: its own slice of the global batch.
Tensor tokens(int64_t b, int64_t t, int64_t vocab, uint64_t stream) {
  Tensor ids = Tensor::empty({b, t}, DType::i32);
  auto* p = ids.data<int32_t>();
  for (int64_t i = 0; i < b * t; ++i)
    p[i] = static_cast<int32_t>(rng::hash3(4242, stream, static_cast<uint64_t>(i)) % static_cast<uint64_t>(vocab));
  return ids;
}

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ZeRO stage 0-3 training throughput and memory per rank (run under mpirun)"};
  std::string model_name = "tiny";
  int stage = 0, steps = 5, warmup = 1, threads = 1;
  int64_t batch = 8, seq = 256, bucket = 5000000;
  double torch_tps = 0.0;
  bool checkpointing = false, comm_bytes = false;
  app.add_option("--model", model_name, "model preset (tiny, gpt2-124m, ...)")->capture_default_str();
  app.add_option("--stage", stage, "ZeRO stage 0-3")->check(CLI::Range(0, 3))->capture_default_str();
  app.add_option("--batch", batch, "micro-batch per rank")->capture_default_str();
  app.add_option("--seq", seq, "sequence length")->capture_default_str();
  app.add_option("--steps", steps, "timed steps (after --warmup untimed ones)")->capture_default_str();
  app.add_option("--warmup", warmup, "untimed warm-up steps")->capture_default_str();
  app.add_option("--bucket", bucket, "reduce_bucket_size and allgather_bucket_size (elements)")
      ->capture_default_str();
  app.add_option("--threads", threads, "threads per rank")->capture_default_str();
  app.add_option("--torch_tokens_per_s", torch_tps, "PyTorch DDP tokens/s measured by the driver")
      ->capture_default_str();
  app.add_flag("--gradient_checkpointing", checkpointing, "recompute blocks in backward");
  app.add_flag("--comm_bytes", comm_bytes, "print each collective's bytes per timed step");
  std::string zero_extra;
  app.add_option("--zero_json", zero_extra,
                 "extra zero_optimization keys, e.g. '\"stage3_max_reuse_distance\": 0'");
  CLI11_PARSE(app, argc, argv);

  try {
    set_num_threads(threads);
    auto world = comm::world();
    const int n = world->size(), rank = world->rank();
    const auto gemm = backend::cpu().gemm_info();

    models::GPTConfig cfg = models::GPTConfig::preset(model_name);
    DS_CHECK(seq <= cfg.block_size, "--seq {} exceeds the model's block size {}", seq, cfg.block_size);
    std::shared_ptr<models::GPT> model;
    if (stage == 3) {
      nn::PartitionedInit no_full_model;  // every parameter's storage is dropped as it is built
      model = std::make_shared<models::GPT>(cfg);
    } else {
      model = std::make_shared<models::GPT>(cfg);
    }
    if (checkpointing) model->set_gradient_checkpointing(true);
    const int64_t params = cfg.num_parameters();

    const std::string config = fmt::format(
        R"({{"train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": 1,
  "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-4, "weight_decay": 0.1}}}},
  "zero_optimization": {{"stage": {}, "overlap_comm": true, "contiguous_gradients": true,
    "reduce_bucket_size": {}, "allgather_bucket_size": {}{}{}}}}})",
        batch, stage, bucket, bucket, zero_extra.empty() ? "" : ", ", zero_extra);
    runtime::InitOptions opt;
    opt.group = world;
    opt.ctx.source_name = "bench_zero config";
    auto engine = runtime::initialize(model, config, opt);
    const runtime::MemoryBudget mem = engine->memory_budget();
    const int64_t rss_after_init_kib = proc_status_kib("VmRSS");

    if (rank == 0)
      std::printf("bench_zero: model %s (%.1fM parameters), stage %d, %d ranks x %d threads, "
                  "micro-batch %lld x %lld tokens, bucket %lld, gradient checkpointing %s%s%s\nGEMM: %s\n",
                  model_name.c_str(), params / 1e6, stage, n, threads, static_cast<long long>(batch),
                  static_cast<long long>(seq), static_cast<long long>(bucket), checkpointing ? "on" : "off",
                  zero_extra.empty() ? "" : ", zero_optimization += ", zero_extra.c_str(), gemm.c_str());

    std::vector<int64_t> step_us;  // this rank's timed steps
    float first_loss = 0.0f, last_loss = 0.0f;
    for (int s = 0; s < warmup + steps; ++s) {
      const uint64_t stream = static_cast<uint64_t>(s) * static_cast<uint64_t>(n) + static_cast<uint64_t>(rank);
      Tensor x = tokens(batch, seq, cfg.vocab_size, 2 * stream);
      Tensor y = tokens(batch, seq, cfg.vocab_size, 2 * stream + 1);
      if (comm_bytes && s == warmup) {
        comm::comms_logger().enable(true);
        comm::comms_logger().reset();
      }
      auto t0 = Clock::now();
      Tensor loss = engine->forward(x, y);
      engine->backward(loss);
      engine->step();
      const double dt = seconds_since(t0);
      last_loss = loss.item();
      if (s == 0) first_loss = last_loss;
      if (s >= warmup) step_us.push_back(static_cast<int64_t>(dt * 1e6));
      if (rank == 0)
        std::printf("step %d%s: %.3f s  loss %.4f\n", s, s < warmup ? " (warm-up)" : "", dt, last_loss);
    }

    // A step takes as long as its slowest rank: the per-step maximum over ranks, then the median.
    std::vector<int64_t> slowest = step_us;
    if (!slowest.empty()) world->all_reduce(slowest.data(), slowest.size(), DType::i64, comm::ReduceOp::max, "step times");
    std::vector<int64_t> own = step_us;
    std::sort(slowest.begin(), slowest.end());
    std::sort(own.begin(), own.end());
    const double step_s = slowest.empty() ? 0.0 : slowest[slowest.size() / 2] / 1e6;
    const double own_step_s = own.empty() ? 0.0 : own[own.size() / 2] / 1e6;
    const double global_tokens = static_cast<double>(batch * seq * n);

    // Every rank's numbers to rank 0.
    const AllocatorStats as = cpu_allocator().stats();
    constexpr int kF = 11;
    std::vector<int64_t> mine = {static_cast<int64_t>(own_step_s * 1e6), mem.params, mem.grads,
                                 mem.master_weights, mem.optimizer_states, mem.total(),
                                 rss_after_init_kib, proc_status_kib("VmHWM"), proc_status_kib("RssShmem"),
                                 static_cast<int64_t>(as.peak_bytes_in_use), static_cast<int64_t>(as.bytes_reserved)};
    std::vector<int64_t> all(static_cast<size_t>(kF * n));
    world->all_gather(mine.data(), all.data(), kF, DType::i64, "per-rank stats");

    if (rank == 0) {
      std::printf("\nrank  tokens/s  model states MiB (params+grads+master+moments)  rss@init  peak RSS  "
                  "shmem  alloc peak  alloc reserved   [MiB]\n");
      int64_t peak_kib = 0, states = 0, in_use = 0, reserved = 0;
      for (int r = 0; r < n; ++r) {
        const int64_t* v = all.data() + static_cast<size_t>(kF * r);
        peak_kib = std::max(peak_kib, v[7]);
        states = std::max(states, v[5]);
        in_use = std::max(in_use, v[9]);
        reserved = std::max(reserved, v[10]);
        std::printf("%4d  %8.1f  %7.1f = %.1f + %.1f + %.1f + %.1f  %8.1f  %8.1f  %5.1f  %10.1f  %14.1f\n", r,
                    v[0] > 0 ? global_tokens / (v[0] / 1e6) : 0.0, mib(v[5]), mib(v[1]), mib(v[2]), mib(v[3]),
                    mib(v[4]), v[6] / 1024.0, v[7] / 1024.0, v[8] / 1024.0, mib(v[9]), mib(v[10]));
      }
      const double tps = step_s > 0 ? global_tokens / step_s : 0.0;
      std::printf("median step %.3f s (slowest rank per step), loss %.4f -> %.4f\n", step_s, first_loss, last_loss);
      // The caching allocator never returns memory and keeps freed blocks per exact size class,
      // so peak RSS follows what it reserved, not the peak of what was in use.
      std::printf("MEM zero stage=%d model_states_mib=%.1f alloc_peak_in_use_mib=%.1f "
                  "alloc_reserved_mib=%.1f peak_rss_mib=%.1f\n",
                  stage, mib(states), mib(in_use), mib(reserved), peak_kib / 1024.0);
      if (comm_bytes && steps > 0)
        for (const auto& [op, e] : comm::comms_logger().totals())
          std::printf("COMM op=%s bytes_per_step=%.0f count_per_step=%.1f\n", comm::op_name(op),
                      static_cast<double>(e.bytes) / steps, static_cast<double>(e.count) / steps);
      std::printf("BENCH zero stage=%d tokens_per_s=%.1f torch_ddp_tokens_per_s=%.1f ratio=%.3f peak_rss_mib=%.1f\n",
                  stage, tps, torch_tps, torch_tps > 0 ? tps / torch_tps : 0.0, peak_kib / 1024.0);
      std::fflush(stdout);
    }
    world->barrier("end");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_zero: %s\n", e.what());
    return 1;
  }
  return 0;
}

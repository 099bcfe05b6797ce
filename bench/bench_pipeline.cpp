// The pipeline bubble (run under mpirun, one rank per stage): for m = 1, 4, 8, 16 micro-batches per
// step, each stage's idle fraction measured by the engine (PipelineEngine::last_times: time blocked
// in receives, in the completion of sends and at the end of the schedule, against the time in
// forward and backward passes; the optimizer step is left out) against the 1F1B formula
// (p - 1) / (m + p - 1) of reference/parallelism.md §3. A balanced model: the blocks cut evenly
// (partition "type:transformer"), a small vocabulary so that embedding and head are light.
//
//   mpirun -np 2 --oversubscribe -x OMP_NUM_THREADS=1 build/bench/bench_pipeline \
//       [--layers 8] [--embd 256] [--heads 4] [--vocab 512] [--batch 2] [--seq 128] [--steps 3]
//
// Prints per m the stages' fractions (median over steps after a warm-up) and, last, one line each:
//   BENCH pipeline_bubble p=<p> m=<m> measured=<mean over stages> formula=<(p-1)/(m+p-1)>
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "ds/comm/group.h"
#include "ds/comm/topology.h"
#include "ds/models/gpt.h"
#include "ds/runtime/pipeline_engine.h"
#include "ds/runtime/pipeline_partition.h"

using namespace ds;

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

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Pipeline bubble against (p - 1) / (m + p - 1)"};
  int64_t layers = 8, embd = 256, heads = 4, vocab = 512, batch = 2, seq = 128;
  int steps = 3;
  app.add_option("--layers", layers);
  app.add_option("--embd", embd);
  app.add_option("--heads", heads);
  app.add_option("--vocab", vocab);
  app.add_option("--batch", batch);
  app.add_option("--seq", seq);
  app.add_option("--steps", steps);
  CLI11_PARSE(app, argc, argv);

  auto world = comm::world();
  const int p = world->size(), rank = world->rank();
  auto topo = std::make_shared<comm::Topology>(world, 1, p);
  models::GPTConfig c = models::GPTConfig::preset("tiny");
  c.n_layer = layers, c.n_embd = embd, c.n_head = heads, c.vocab_size = vocab, c.block_size = seq;
  std::vector<runtime::PipeLayer> pl;
  for (const auto& l : models::GPT::pipe_layers(c)) pl.push_back({l.type_name, l.num_parameters});
  const auto bounds = runtime::partition_layers(pl, p, "type:transformer");
  const int s = topo->stage();
  std::vector<std::string> lines;
  std::string peer_line;  // m = 8, the DeepSpeed peer's setting (bench/ds_pipeline_peer.py)
  for (int m : {1, 4, 8, 16}) {
    auto stage = std::make_shared<models::GPT>(c, nullptr, models::PipeRange{bounds[s], bounds[s + 1]});
    runtime::InitOptions opt;
    opt.topology = topo;
    opt.log = [](const std::string&) {};
    const std::string cfg = fmt::format(
        R"({{"train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": {},
            "zero_optimization": {{"stage": 0}}, "pipeline": {{"stages": {}}},
            "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-4}}}}}})",
        batch, m, p);
    runtime::PipelineEngine pipe(stage, config::parse_config(cfg, {.world_size = 1}), opt);
    std::vector<double> idle, busy, total;
    for (int k = 0; k <= steps; ++k) {
      int64_t mb = 0;
      pipe.train_batch([&] {
        Tensor x = tokens(batch, seq, vocab, static_cast<uint64_t>(k * 64 + mb));
        Tensor y = tokens(batch, seq, vocab, static_cast<uint64_t>(k * 64 + mb++ + 1000));
        return runtime::PipeBatch{{.input_ids = x, .labels = y}};
      });
      if (k == 0) continue;  // warm-up
      const runtime::PipelineTimes& t = pipe.last_times();
      idle.push_back(t.wait_s / (t.wait_s + t.compute_s));
      busy.push_back(t.compute_s);
      total.push_back(t.total_s);
    }
    double mine[3] = {median(idle), median(busy), median(total)};
    std::vector<double> all(3 * static_cast<size_t>(p));
    world->all_gather(mine, all.data(), 3, DType::i64, "bench results");  // 8-byte words
    if (rank == 0) {
      double mean = 0;
      std::string per;
      for (int r = 0; r < p; ++r) {
        mean += all[3 * r] / p;
        per += fmt::format(" stage{}: idle {:.3f} compute {:.3f}s", r, all[3 * r], all[3 * r + 1]);
      }
      const double formula = static_cast<double>(p - 1) / static_cast<double>(m + p - 1);
      std::printf("m=%d step %.3fs %.0f tokens/s%s\n", m, all[2],
                  static_cast<double>(batch * m * seq) / all[2], per.c_str());
      if (m == 8)
        peer_line = fmt::format("BENCH ds_pipeline impl=deepspeed.cpp p={} m=8 step_s={:.3f} "
                                "tokens_per_s={:.0f}",
                                p, all[2], static_cast<double>(batch * 8 * seq) / all[2]);
      lines.push_back(fmt::format("BENCH pipeline_bubble p={} m={} measured={:.3f} formula={:.3f}",
                                  p, m, mean, formula));
    }
  }
  // Peak RSS of every rank (VmHWM), for the comparison with DeepSpeed's PipelineModule.
  double rss = 0;
  if (FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    while (std::fgets(line, sizeof line, f))
      if (std::sscanf(line, "VmHWM: %lf", &rss) == 1) break;
    std::fclose(f);
  }
  std::vector<double> rss_all(static_cast<size_t>(p));
  world->all_gather(&rss, rss_all.data(), 1, DType::i64, "bench rss");
  if (rank == 0) {
    for (const auto& l : lines) std::printf("%s\n", l.c_str());
    std::string per;
    for (int r = 0; r < p; ++r) per += fmt::format(" rank{}_peak_rss_mib={:.0f}", r, rss_all[r] / 1024);
    std::printf("%s%s\n", peer_line.c_str(), per.c_str());
  }
  return 0;
}

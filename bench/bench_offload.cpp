// ZeRO-3 with NVMe offload (ZeRO-Infinity) on one process: a GPT-layout model whose model states
// need not fit in RAM trains a few optimizer steps; per step the time, the bytes read and written
// on the swap path, the time the training thread waited for I/O, and peak RSS. bench/run_offload.sh
// drives it and passes the disk bandwidth it measured in the same run (fio), so that
//
//   io_s          = read_bytes / read_bandwidth + write_bytes / write_bandwidth
//   compute_s     = step_s - io_wait_s          (the training thread's busy time)
//   overlap_ratio = step_s / max(compute_s, io_s)   (1.0: I/O hidden entirely behind the
//                                                    compute, or the disk never idle)
//
//   bench_offload --name gpt-2b --layers 24 --embd 2560 --heads 20 --nvme /path [--offload both]
//       [--stage 3] [--seq 128] [--batch 1] [--steps 3] [--read_gbps R --write_gbps W]
//       [--sub_group_size 20000000] [--buffer_count 4] [--param_buffer_size 20000000]
//       [--fp32_grads] [--threads 2] [--max_live 100000000]
//
// bf16 training (--fp32: fp32), AdamW, gradients accumulated in bf16 (--fp32_grads: DeepSpeed's
// default fp32),
// synthetic tokens. Stage 3 builds the model piecewise (nn::PartitionedInit). Peak RSS is VmHWM:
// `init_peak_rss_mib` up to the first step (building the model; the initial master weights
// stream into the swap file), then the counter is reset (/proc/self/clear_refs) and
// `peak_rss_mib` covers the training steps (reported per phase too). Under stage 3 the optimizer
// step runs in the background during the next forward (zero/strategy.h): a step's time is then
// its forward (overlapped with the previous step's optimizer), backward and the step's start;
// `opt_phase_s` is only that start, and the last step's background work is waited for and
// reported after the loop. Last line:
//   BENCH offload model=<name> params=<n> peak_rss_mib=<m> step_s=<t> read_gb=<r> write_gb=<w>
//         overlap_ratio=<x> ...
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "ds/core/allocator.h"
#include "ds/core/parallel.h"
#include "ds/core/rng.h"
#include "ds/models/gpt.h"
#include "ds/nn/module.h"
#include "ds/runtime/engine.h"

using namespace ds;
using Clock = std::chrono::steady_clock;

namespace {

int64_t status_kib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string key = std::string(field) + ":";
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(key.size()));
  return -1;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ZeRO-3 + NVMe offload: step time, bytes moved, overlap and peak RSS"};
  std::string name = "gpt", nvme, offload = "both";
  int64_t layers = 24, embd = 2560, heads = 20, vocab = 50257, seq = 128, batch = 1;
  int steps = 3, stage = 3, threads = 2, buffer_count = 4;
  int64_t sub_group_size = 20000000, param_buffer = 20000000;
  // stage3_max_live_parameters and stage3_max_reuse_distance (DeepSpeed's defaults: 1e9, which
  // would keep up to 1e9 gathered elements resident between a layer's forward and backward).
  int64_t max_live = 100000000;
  double read_gbps = 0, write_gbps = 0;
  bool fp32_grads = false, fp32 = false;
  app.add_option("--name", name);
  app.add_option("--layers", layers);
  app.add_option("--embd", embd);
  app.add_option("--heads", heads);
  app.add_option("--vocab", vocab);
  app.add_option("--seq", seq);
  app.add_option("--batch", batch);
  app.add_option("--steps", steps);
  app.add_option("--stage", stage);
  app.add_option("--nvme", nvme, "swap folder (needed unless --offload none)");
  app.add_option("--offload", offload)
      ->check(CLI::IsMember({"none", "optimizer", "params", "both"}));
  app.add_option("--sub_group_size", sub_group_size);
  app.add_option("--buffer_count", buffer_count);
  app.add_option("--param_buffer_size", param_buffer);
  app.add_option("--max_live", max_live,
                 "stage3_max_live_parameters = stage3_max_reuse_distance (elements)");
  app.add_option("--read_gbps", read_gbps, "disk read bandwidth measured in the same run");
  app.add_option("--write_gbps", write_gbps, "disk write bandwidth measured in the same run");
  app.add_flag("--fp32_grads", fp32_grads);
  app.add_flag("--fp32", fp32, "fp32 training (default bf16)");
  app.add_option("--threads", threads);
  CLI11_PARSE(app, argc, argv);
  set_num_threads(threads);

  models::GPTConfig mc = models::GPTConfig::defaults(nn::Layout::gpt2);
  mc.n_layer = layers;
  mc.n_embd = embd;
  mc.n_head = heads;
  mc.vocab_size = vocab;
  mc.block_size = seq;
  std::string zero = fmt::format(R"("stage": {}, "sub_group_size": {},
      "stage3_param_persistence_threshold": 100000, "stage3_prefetch_bucket_size": 50000000,
      "stage3_max_live_parameters": {}, "stage3_max_reuse_distance": {})",
                                 stage, sub_group_size, max_live, max_live);
  if (offload == "optimizer" || offload == "both")
    zero += fmt::format(
        R"(, "offload_optimizer": {{"device": "nvme", "nvme_path": "{}", "buffer_count": {}}})",
        nvme, buffer_count);
  if (offload == "params" || offload == "both")
    zero += fmt::format(
        R"(, "offload_param": {{"device": "nvme", "nvme_path": "{}", "buffer_count": 5,
        "buffer_size": {}, "max_in_cpu": 0}})",
        nvme, param_buffer);
  const std::string cfg = fmt::format(
      R"({{"train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": 1,
      {}
      "aio": {{"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1}},
      "zero_optimization": {{{}}},
      "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-4, "weight_decay": 0.01}}}}}})",
      batch,
      fp32         ? ""
      : fp32_grads ? R"("bf16": {"enabled": true},)"
                   : R"("bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "bf16"},)",
      zero);

  const auto t_init = Clock::now();
  std::shared_ptr<models::GPT> model;
  {
    std::optional<nn::PartitionedInit> pieces;
    if (stage == 3) pieces.emplace();
    model = std::make_shared<models::GPT>(mc);
  }
  const int64_t params = model->num_parameters();
  std::printf("model %s: L %lld, C %lld, NH %lld, V %lld, T %lld: %.3fB parameters; offload %s\n",
              name.c_str(), static_cast<long long>(layers), static_cast<long long>(embd),
              static_cast<long long>(heads), static_cast<long long>(vocab),
              static_cast<long long>(seq), static_cast<double>(params) / 1e9, offload.c_str());
  runtime::InitOptions init;
  init.log = [](const std::string& m) { std::printf("%s\n", m.c_str()); };
  auto engine = runtime::initialize(model, cfg, init);
  const double init_s = std::chrono::duration<double>(Clock::now() - t_init).count();
  const int64_t init_peak = status_kib("VmHWM");
  std::ofstream("/proc/self/clear_refs") << "5";  // reset VmHWM: the training steps' own peak
  std::printf("init %.1f s, peak RSS %.0f MiB\n", init_s, static_cast<double>(init_peak) / 1024);
  std::fflush(stdout);

  std::vector<double> step_s, wait_s, read_b, write_b, opt_s, opt_read, opt_write;
  double peak_rss_mib = 0;
  for (int s = 0; s < steps; ++s) {
    Tensor x = Tensor::empty({batch, seq}, DType::i32), y = Tensor::empty({batch, seq}, DType::i32);
    for (int64_t i = 0; i < batch * seq; ++i) {
      x.data<int32_t>()[i] = static_cast<int32_t>((i * 7919 + s * 104729) % vocab);
      y.data<int32_t>()[i] = static_cast<int32_t>((i * 6271 + s * 15485863 + 1) % vocab);
    }
    const auto before = engine->strategy().offload_stats();
    // Peak RSS per phase (VmHWM, reset after each): where the memory goes.
    auto phase_peak = [] {
      const int64_t kib = status_kib("VmHWM");
      std::ofstream("/proc/self/clear_refs") << "5";
      return static_cast<double>(kib) / 1024;
    };
    const auto t0 = Clock::now();
    Tensor loss = engine->forward(x, y);
    const double peak_fwd = phase_peak();
    const auto t1 = Clock::now();
    engine->backward(loss);
    const double peak_bwd = phase_peak();
    const auto t2 = Clock::now();
    const auto before_opt = engine->strategy().offload_stats();
    engine->step();
    const double peak_opt = phase_peak();
    peak_rss_mib = std::max({peak_rss_mib, peak_fwd, peak_bwd, peak_opt});
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    const double fwd = std::chrono::duration<double>(t1 - t0).count(),
                 bwd = std::chrono::duration<double>(t2 - t1).count();
    const auto after = engine->strategy().offload_stats();
    step_s.push_back(dt);
    opt_s.push_back(dt - fwd - bwd);
    opt_read.push_back(static_cast<double>(after.bytes_read - before_opt.bytes_read));
    opt_write.push_back(static_cast<double>(after.bytes_written - before_opt.bytes_written));
    wait_s.push_back(after.wait_seconds - before.wait_seconds);
    read_b.push_back(static_cast<double>(after.bytes_read - before.bytes_read));
    write_b.push_back(static_cast<double>(after.bytes_written - before.bytes_written));
    std::printf(
        "step %d: %.1f s (forward %.1f, backward %.1f, optimizer %.1f), loss %.4f, read %.2f GB, "
        "written %.2f GB, waited for I/O %.1f s, %lld sub-groups stepped during backward, RSS %.0f "
        "MiB (peak: forward %.0f, backward %.0f, step %.0f; tensors: peak %.0f MiB in use, %.0f MiB "
        "reserved)\n",
        s + 1, dt, fwd, bwd, dt - fwd - bwd, loss.item(), read_b.back() / 1e9, write_b.back() / 1e9,
        wait_s.back(),
        static_cast<long long>(after.stepped_in_backward - before.stepped_in_backward), static_cast<double>(status_kib("VmRSS")) / 1024, peak_fwd, peak_bwd,
        peak_opt, static_cast<double>(cpu_allocator().stats().peak_bytes_in_use) / (1 << 20),
        static_cast<double>(cpu_allocator().stats().bytes_reserved) / (1 << 20));
    cpu_allocator().reset_peak();
    std::fflush(stdout);
  }
  // Stage 3 steps the optimizer in the background: the last step's sub-groups may still stream.
  const auto t_drain = Clock::now();
  engine->synchronize();
  const double drain_s = std::chrono::duration<double>(Clock::now() - t_drain).count();
  peak_rss_mib = std::max(peak_rss_mib, static_cast<double>(status_kib("VmHWM")) / 1024);
  std::printf("after the last step: %.1f s until its background optimizer step ended\n", drain_s);
  const double t = median(step_s), w = median(wait_s), r = median(read_b), wr = median(write_b);
  const double compute = t - w;
  const double io =
      (read_gbps > 0 ? r / 1e9 / read_gbps : 0) + (write_gbps > 0 ? wr / 1e9 / write_gbps : 0);
  const double overlap = t / std::max(compute, io);
  // The optimizer phase alone: its bytes (the whole optimizer state, and the new parameters) at the
  // disk's bandwidth, against its time. The state cannot be read before backward ends (the step
  // needs every gradient and the global norm), so this is the part of the I/O that can only
  // overlap with the Adam compute; ~1 means the phase runs at disk speed.
  const double os = median(opt_s), orb = median(opt_read), owb = median(opt_write);
  const double opt_io =
      (read_gbps > 0 ? orb / 1e9 / read_gbps : 0) + (write_gbps > 0 ? owb / 1e9 / write_gbps : 0);
  std::printf(
      "optimizer phase: %.1f s for %.2f GB read + %.2f GB written (%.2f GB/s; the disk "
      "needs %.1f s for them): ratio %.2f\n",
      os, orb / 1e9, owb / 1e9, (orb + owb) / 1e9 / std::max(os, 1e-9), opt_io,
      opt_io > 0 ? os / opt_io : 0.0);
  const auto st = engine->strategy().offload_stats();
  std::printf(
      "median step %.1f s: compute %.1f s, I/O wait %.1f s; %.2f GB read + %.2f GB written "
      "= %.1f s at %.2f/%.2f GB/s; on disk %.2f GB\n",
      t, compute, w, r / 1e9, wr / 1e9, io, read_gbps, write_gbps,
      static_cast<double>(st.disk_bytes) / 1e9);
  std::printf(
      "BENCH offload model=%s params=%lld peak_rss_mib=%.0f step_s=%.1f read_gb=%.2f write_gb=%.2f "
      "overlap_ratio=%.2f compute_s=%.1f io_s=%.1f opt_phase_s=%.1f opt_phase_ratio=%.2f "
      "init_peak_rss_mib=%.0f offload=%s\n",
      name.c_str(), static_cast<long long>(params), peak_rss_mib,
      t, r / 1e9, wr / 1e9, overlap, compute, io, os, opt_io > 0 ? os / opt_io : 0.0,
      static_cast<double>(init_peak) / 1024, offload.c_str());
  return 0;
}

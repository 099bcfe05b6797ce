// A BART-shaped encoder-decoder (models::Seq2Seq) loaded from a Hugging Face folder: training steps
// through runtime::Engine, or beam-search generation. bench/run_families.sh runs it beside
// transformers (bench/families_peer.py) on the same folder; results in bench/RESULTS.md.
//
//   bench_seq2seq --model DIR train [--batch 8] [--src 128] [--tgt 64] [--steps 4] [--warmup 1]
//                 [--stage 2] [--dtype fp32|bf16] [--threads 2]
//     AdamW (lr 2e-5, weight decay 0, betas 0.9 / 0.999, eps 1e-8), gradient clipping 1.0, the
//     given ZeRO stage (one process), fp32 or, with --dtype bf16, the engine with "bf16" enabled
//     as ds_train runs it (bf16 parameters and activations, fp32 master weights and AdamW), the
//     folder's dropout (training mode); random source ids (B, S) ending in eos and random labels
//     (B, T), no padding. Per step: forward, backward and step times. Prints
//     BENCH seq2seq_train batch=B src=S tgt=T stage=Z dtype=D step_s=<median of the timed steps>
//       steps=<the timed steps> tokens_per_s=.. peak_rss_mib=<VmHWM> forward_s=.. backward_s=..
//       optimizer_s=..   (medians)
//     after a line with the model-state bytes and the caching allocator's peak in use / reserved.
//     tokens = B * (S + T) per step, as bench/families_peer.py counts them.
//
//   bench_seq2seq --model DIR beam [--batch 4] [--src 64] [--beams 4] [--new_tokens 32] [--reps 3]
//                 [--ids_out FILE] [--out FILE] [--threads 2]
//     generate_beam (early_stopping false, length penalty 1, no n-gram rules, the config's eos and
//     forced eos, KV cache), eval mode, no autograd. The random source ids are written to
//     --ids_out (one row a line) for the peer, the generated ids to --out. Prints
//     BENCH seq2seq_beam batch=B beams=K new_tokens=N gen_s=<median> all=<each rep> out_len=..
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "ds/autograd/grad_mode.h"
#include "ds/core/allocator.h"
#include "ds/core/parallel.h"
#include "ds/core/rng.h"
#include "ds/models/seq2seq.h"
#include "ds/models/seq2seq_io.h"
#include "ds/runtime/engine.h"

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

long status_kib(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string k = std::string(key) + ":";
  while (std::getline(f, line))
    if (line.rfind(k, 0) == 0) return std::stol(line.substr(k.size()));
  return 0;
}

// (b, t) random ids in [3, vocab) with eos (2) last; stream picks the draw.
Tensor random_ids(int64_t b, int64_t t, int64_t vocab, uint64_t stream) {
  std::vector<int64_t> ids(static_cast<size_t>(b * t));
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] =
        3 + static_cast<int64_t>(rng::hash3(4321, stream, i) % static_cast<uint64_t>(vocab - 3));
  for (int64_t r = 0; r < b; ++r) ids[static_cast<size_t>(r * t + t - 1)] = 2;
  return Tensor::from_ints(ids, {b, t}, DType::i64);
}

std::string join(const std::vector<double>& v) {
  std::string s;
  for (double x : v) s += fmt::format("{}{:.3f}", s.empty() ? "" : " ", x);
  return s;
}

void write_rows(const std::string& path, const Tensor& t) {
  const std::vector<int64_t> v = t.to_int_vector();
  const int64_t rows = t.size(0), cols = t.size(1);
  std::ofstream f(path);
  DS_CHECK(f.good(), "[bench_seq2seq] cannot write {}", path);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) f << (c ? " " : "") << v[static_cast<size_t>(r * cols + c)];
    f << "\n";
  }
}

std::shared_ptr<models::Seq2Seq> load(const std::string& dir) {
  auto cfg = models::read_hf_seq2seq_config(dir);
  DS_CHECK(cfg.has_value(), "[bench_seq2seq] {}: no config.json of a bart / blenderbot model", dir);
  auto m = std::make_shared<models::Seq2Seq>(*cfg, /*init=*/false);
  models::load_hf_seq2seq_weights(*m, dir);
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Seq2Seq (BART) training steps or beam search, timed"};
  std::string model_dir;
  int64_t batch = 0, src = 0, tgt = 64, beams = 4, new_tokens = 32;
  int steps = 4, warmup = 1, stage = 2, threads = 2, reps = 3;
  std::string ids_out, out, dtype_name = "fp32";
  app.add_option("--model", model_dir, "Hugging Face BART folder")->required();
  app.add_option("--threads", threads, "threads for BLAS and kernels")->capture_default_str();
  app.require_subcommand(1);
  auto* train = app.add_subcommand("train", "time training steps");
  train->add_option("--batch", batch, "micro-batch B (default 8)");
  train->add_option("--src", src, "source length S (default 128)");
  train->add_option("--tgt", tgt, "target length T")->capture_default_str();
  train->add_option("--steps", steps, "steps in all")->capture_default_str();
  train->add_option("--warmup", warmup, "first steps not timed")->capture_default_str();
  train->add_option("--stage", stage, "ZeRO stage")->capture_default_str();
  train
      ->add_option("--dtype", dtype_name,
                   "fp32, or bf16 (the engine config's \"bf16\": {\"enabled\": true}: bf16 "
                   "parameters and activations, fp32 master weights and AdamW)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  auto* beam = app.add_subcommand("beam", "time beam-search generation");
  beam->add_option("--batch", batch, "source rows (default 4)");
  beam->add_option("--src", src, "source length (default 64)");
  beam->add_option("--beams", beams, "num_beams")->capture_default_str();
  beam->add_option("--new_tokens", new_tokens, "max_new_tokens")->capture_default_str();
  beam->add_option("--reps", reps, "timed generations")->capture_default_str();
  beam->add_option("--ids_out", ids_out, "write the source ids here");
  beam->add_option("--out", out, "write the generated ids here");
  CLI11_PARSE(app, argc, argv);

  try {
    set_num_threads(threads);
    auto model = load(model_dir);
    const int64_t V = model->config().vocab_size;
    if (train->parsed()) {
      if (batch == 0) batch = 8;
      if (src == 0) src = 128;
      runtime::InitOptions opt;
      opt.log = [](const std::string&) {};
      auto engine = runtime::initialize(
          model,
          fmt::format(R"({{
        "train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,{}
        "optimizer": {{"type": "AdamW", "params": {{"lr": 2e-5, "weight_decay": 0.0,
                       "betas": [0.9, 0.999], "eps": 1e-8}}}},
        "zero_optimization": {{"stage": {}}}}})",
                      batch, dtype_name == "bf16" ? R"( "bf16": {"enabled": true},)" : "", stage),
          opt);
      std::vector<double> total, fwd, bwd, upd;
      for (int s = 0; s < steps; ++s) {
        const Tensor ids = random_ids(batch, src, V, 2 * s);
        const Tensor labels = random_ids(batch, tgt, V, 2 * s + 1);
        const auto t0 = Clock::now();
        Tensor loss = engine->forward(ids, labels);
        const double f = seconds_since(t0);
        const auto t1 = Clock::now();
        engine->backward(loss);
        const double b = seconds_since(t1);
        const auto t2 = Clock::now();
        engine->step();
        const double u = seconds_since(t2);
        const double all = seconds_since(t0);
        std::printf("step %d: loss %.4f %.3f s (forward %.3f, backward %.3f, step %.3f)\n", s,
                    loss.item(), all, f, b, u);
        std::fflush(stdout);
        if (s < warmup) continue;
        total.push_back(all);
        fwd.push_back(f);
        bwd.push_back(b);
        upd.push_back(u);
      }
      DS_CHECK(!total.empty(), "[bench_seq2seq] --steps {} leaves no timed step after --warmup {}",
               steps, warmup);
      const double med = median(total);
      const runtime::MemoryBudget mem = engine->memory_budget();
      const AllocatorStats as = cpu_allocator().stats();
      std::printf(
          "memory: model states %.1f MiB (params %.1f, grads %.1f, master weights %.1f, optimizer "
          "%.1f); allocator peak in use %.1f MiB, reserved %.1f MiB\n",
          mem.total() / 1048576.0, mem.params / 1048576.0, mem.grads / 1048576.0,
          mem.master_weights / 1048576.0, mem.optimizer_states / 1048576.0,
          as.peak_bytes_in_use / 1048576.0, as.bytes_reserved / 1048576.0);
      std::printf(
          "BENCH seq2seq_train batch=%lld src=%lld tgt=%lld stage=%d dtype=%s step_s=%.3f "
          "steps=%s "
          "tokens_per_s=%.1f peak_rss_mib=%.0f forward_s=%.3f backward_s=%.3f optimizer_s=%.3f\n",
          static_cast<long long>(batch), static_cast<long long>(src), static_cast<long long>(tgt),
          stage, dtype_name.c_str(), med, join(total).c_str(),
          static_cast<double>(batch * (src + tgt)) / med, status_kib("VmHWM") / 1024.0, median(fwd),
          median(bwd), median(upd));
    } else {
      if (batch == 0) batch = 4;
      if (src == 0) src = 64;
      model->train(false);
      autograd::NoGradGuard no_grad;
      const Tensor ids = random_ids(batch, src, V, 999);
      if (!ids_out.empty()) write_rows(ids_out, ids);
      const Tensor mask = Tensor::from_ints(
          std::vector<int64_t>(static_cast<size_t>(batch * src), 1), {batch, src}, DType::i64);
      models::BeamOptions bo;
      bo.num_beams = beams;
      bo.max_new_tokens = new_tokens;
      bo.early_stopping = "false";
      std::vector<double> times;
      Tensor got;
      for (int r = 0; r < reps; ++r) {
        const auto t0 = Clock::now();
        got = model->generate_beam(ids, mask, bo);
        times.push_back(seconds_since(t0));
      }
      if (!out.empty()) write_rows(out, got);
      std::printf(
          "BENCH seq2seq_beam batch=%lld beams=%lld new_tokens=%lld src=%lld gen_s=%.3f all=%s "
          "out_len=%lld peak_rss_mib=%.0f\n",
          static_cast<long long>(batch), static_cast<long long>(beams),
          static_cast<long long>(new_tokens), static_cast<long long>(src), median(times),
          join(times).c_str(), static_cast<long long>(got.size(1)), status_kib("VmHWM") / 1024.0);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_seq2seq: %s\n", e.what());
    return 1;
  }
  return 0;
}

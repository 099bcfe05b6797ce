// Fragmentation of the device caching allocator on a training run's own allocations.
//
//   build/bench/bench_allocator [--model gpt2-124m] [--batch 4] [--seq 256] [--steps 3]
//       [--precision bf16|fp32] [--stage 2] [--checkpointing]
//
// Trains --steps steps of a GPT preset with the model on the sim device (the device code path a
// GPU runs: the same allocations of the same sizes in the same order, with the CPU's kernels;
// ZeRO-Offload's layout, the optimizer state in host memory), records every allocation and free
// of device memory, then replays the trace through two policies over fake memory (addresses never
// touched, so the replay costs nothing):
//   exact  the CUDA allocator before block splitting: freed blocks cached by rounded size and
//          reused whole (the smallest cached block within twice the request), never split;
//   pool   ds::BlockPool (ds/core/block_pool.h): large blocks split and merged with free
//          neighbours; the CUDA, sim and host allocators today.
// The reference is the trace's own peak of requested bytes (what the tensors asked for, before
// any rounding), so each policy's waste = its peak reserved / that peak: rounding, blocks reused
// whole for smaller requests, and free memory split between blocks in use all count.
//
// The device's empty_cache calls (the engine's, after start-up) are replayed too.
//
//   BENCH allocator policy=<exact|pool> peak_requested_mib=<q> peak_reserved_mib=<r>
//       waste=<r/q> misses_after_first_step=<m>
//
// misses_after_first_step: system allocations (cudaMalloc calls on a GPU) after the first step.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "ds/backend/backend.h"
#include "ds/core/block_pool.h"
#include "ds/core/device_registry.h"
#include "ds/core/error.h"
#include "ds/core/rng.h"
#include "ds/models/gpt.h"
#include "ds/runtime/engine.h"

using namespace ds;

namespace {

struct Event {
  enum Kind : char { alloc = 'a', free = 'f', empty_cache = 'e' } kind;
  uint64_t id;  // the block's number in allocation order
  size_t nbytes;
};

// Forwards to the device's allocator and records the trace.
class TracingAllocator final : public Allocator {
 public:
  explicit TracingAllocator(Allocator& inner) : inner_(inner) {}
  void* allocate(size_t nbytes) override {
    void* p = inner_.allocate(nbytes);
    ids_[p] = next_;
    trace.push_back({Event::alloc, next_++, nbytes});
    return p;
  }
  void deallocate(void* p, size_t nbytes) override {
    if (!p) return;
    auto it = ids_.find(p);
    DS_CHECK(it != ids_.end(), "bench_allocator: free of an untraced block");
    trace.push_back({Event::free, it->second, nbytes});
    ids_.erase(it);
    inner_.deallocate(p, nbytes);
  }
  AllocatorStats stats() const override { return inner_.stats(); }
  void reset_peak() override { inner_.reset_peak(); }
  void empty_cache() override {
    trace.push_back({Event::empty_cache, 0, 0});
    inner_.empty_cache();
  }

  std::vector<Event> trace;

 private:
  Allocator& inner_;
  std::unordered_map<void*, uint64_t> ids_;
  uint64_t next_ = 0;
};

// Memory that is never backed: the policies only do arithmetic on addresses.
class FakeMemory final : public SystemMemory {
 public:
  void* allocate(size_t nbytes, size_t align) override {
    next_ = (next_ + align - 1) / align * align;
    void* p = reinterpret_cast<void*>(next_);
    next_ += nbytes;
    return p;
  }
  void release(void*, size_t) override {}
  [[noreturn]] void out_of_memory(size_t, const AllocatorStats&) override {
    DS_THROW("bench_allocator: fake memory never runs out");
  }

 private:
  uintptr_t next_ = uintptr_t{1} << 44;
};

// The CUDA allocator's policy before block splitting (kept here as the baseline): sizes rounded to
// 512 B below 1 MiB and to 2 MiB from there, each block its own cudaMalloc.
class ExactSizeCache {
 public:
  static size_t round_size(size_t n) {
    const size_t q = n < (size_t{1} << 20) ? 512 : size_t{2} << 20;
    return (std::max<size_t>(n, 1) + q - 1) / q * q;
  }
  void* allocate(size_t nbytes) {
    const size_t size = round_size(nbytes);
    ++stats.allocations;
    void* p = nullptr;
    auto it = cached_.lower_bound(size);
    if (it != cached_.end() && it->first <= 2 * size) {
      p = it->second;
      live_[p] = it->first;
      stats.bytes_in_use += it->first;
      cached_.erase(it);
    } else {
      p = memory_.allocate(size, 256);
      live_[p] = size;
      stats.bytes_in_use += size;
      stats.bytes_reserved += size;
      stats.peak_bytes_reserved = std::max(stats.peak_bytes_reserved, stats.bytes_reserved);
      ++stats.misses;
    }
    stats.peak_bytes_in_use = std::max(stats.peak_bytes_in_use, stats.bytes_in_use);
    return p;
  }
  void deallocate(void* p, size_t) {
    auto it = live_.find(p);
    stats.bytes_in_use -= it->second;
    cached_.emplace(it->second, p);
    live_.erase(it);
  }
  void release_cached() {
    for (const auto& [size, p] : cached_) stats.bytes_reserved -= size;
    cached_.clear();
  }
  AllocatorStats stats;

 private:
  FakeMemory memory_;
  std::multimap<size_t, void*> cached_;
  std::unordered_map<void*, size_t> live_;
};

// Replays the trace; returns the stats at the end and the misses after the first step's events.
template <class Policy>
std::pair<AllocatorStats, uint64_t> replay(Policy& policy, const std::vector<Event>& trace,
                                           size_t first_step_end,
                                           AllocatorStats (*stats)(const Policy&)) {
  std::unordered_map<uint64_t, void*> at;
  uint64_t misses_first = 0;
  for (size_t i = 0; i < trace.size(); ++i) {
    const Event& e = trace[i];
    if (e.kind == Event::alloc) {
      at[e.id] = policy.allocate(e.nbytes);
    } else if (e.kind == Event::free) {
      policy.deallocate(at[e.id], e.nbytes);
      at.erase(e.id);
    } else {
      policy.release_cached();
    }
    if (i + 1 == first_step_end) misses_first = stats(policy).misses;
  }
  const AllocatorStats s = stats(policy);
  return {s, s.misses - misses_first};
}

double mib(uint64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

// The most bytes the trace's live blocks ever asked for at once.
uint64_t peak_requested(const std::vector<Event>& trace) {
  uint64_t now = 0, peak = 0;
  for (const Event& e : trace) {
    if (e.kind == Event::empty_cache) continue;
    now = e.kind == Event::alloc ? now + e.nbytes : now - e.nbytes;
    peak = std::max(peak, now);
  }
  return peak;
}

void report(const char* name, const AllocatorStats& s, uint64_t requested, uint64_t later_misses) {
  const double waste = static_cast<double>(s.peak_bytes_reserved) /
                       static_cast<double>(std::max<uint64_t>(1, requested));
  std::printf("BENCH allocator policy=%s peak_requested_mib=%.1f peak_in_use_mib=%.1f "
              "peak_reserved_mib=%.1f waste=%.3f misses_after_first_step=%llu\n",
              name, mib(requested), mib(s.peak_bytes_in_use), mib(s.peak_bytes_reserved), waste,
              static_cast<unsigned long long>(later_misses));
}

Tensor tokens(int64_t b, int64_t t, int64_t vocab, uint64_t stream) {
  Tensor ids = Tensor::empty({b, t}, DType::i32);
  auto* p = ids.data<int32_t>();
  for (int64_t i = 0; i < b * t; ++i)
    p[i] = static_cast<int32_t>(rng::hash3(77, stream, static_cast<uint64_t>(i)) %
                                static_cast<uint64_t>(vocab));
  return ids;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Fragmentation of the device caching allocator on a training run's allocations"};
  std::string model_name = "gpt2-124m", precision = "bf16";
  int64_t batch = 4, seq = 256;
  int steps = 3, stage = 2;
  bool checkpointing = false;
  app.add_option("--model", model_name, "GPT preset")->capture_default_str();
  app.add_option("--batch", batch, "micro-batch")->capture_default_str();
  app.add_option("--seq", seq, "sequence length")->capture_default_str();
  app.add_option("--steps", steps, "optimizer steps (>= 2)")->check(CLI::Range(2, 100));
  app.add_option("--precision", precision, "bf16 or fp32")->check(CLI::IsMember({"bf16", "fp32"}));
  app.add_option("--stage", stage, "ZeRO stage 0-2")->check(CLI::Range(0, 2))->capture_default_str();
  app.add_flag("--checkpointing", checkpointing, "gradient checkpointing");
  std::string trace_out;
  app.add_option("--trace_out", trace_out,
                 "also write the trace: one 'a|f|e id bytes' line per allocation, free, empty_cache");
  CLI11_PARSE(app, argc, argv);
  try {
    const Device sim{DeviceType::sim, 0};
    Allocator& device_alloc = backend::get(sim).allocator();
    TracingAllocator tracer(device_alloc);
    DeviceOps ops = device_ops(sim);
    ops.allocator = &tracer;
    register_device(DeviceType::sim, ops);  // before the first sim tensor: every block is traced

    const models::GPTConfig cfg = models::GPTConfig::preset(model_name);
    auto model = std::make_shared<models::GPT>(cfg);
    if (checkpointing) model->set_gradient_checkpointing(true);
    model->to(sim);
    const std::string config = fmt::format(
        R"({{"train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": 1,
  "{}": {{"enabled": {}}},
  "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-4, "weight_decay": 0.1}}}},
  "zero_optimization": {{"stage": {}, "offload_optimizer": {{"device": "cpu"}}}}}})",
        batch, "bf16", precision == "bf16" ? "true" : "false", stage);
    runtime::InitOptions opt;
    opt.log = [](const std::string&) {};
    auto engine = runtime::initialize(model, config, opt);
    std::printf("bench_allocator: %s on sim, %s, ZeRO %d + CPU offload, micro-batch %lld x %lld, "
                "checkpointing %s, %d steps\n",
                model_name.c_str(), precision.c_str(), stage, static_cast<long long>(batch),
                static_cast<long long>(seq), checkpointing ? "on" : "off", steps);
    size_t first_step_end = 0;
    std::printf("initialisation: %zu allocator events\n", tracer.trace.size());
    for (int s = 0; s < steps; ++s) {
      Tensor x = tokens(batch, seq, cfg.vocab_size, 2 * s).to(sim);
      Tensor y = tokens(batch, seq, cfg.vocab_size, 2 * s + 1).to(sim);
      Tensor loss = engine->forward(x, y);
      engine->backward(loss);
      engine->step();
      std::printf("step %d: loss %.4f, %zu allocator events\n", s, loss.item(),
                  tracer.trace.size());
      if (s == 0) first_step_end = tracer.trace.size();
    }
    const std::vector<Event> trace = tracer.trace;  // the steps' events (later frees are not)
    if (!trace_out.empty()) {
      std::FILE* f = std::fopen(trace_out.c_str(), "w");
      DS_CHECK(f, "bench_allocator: cannot write {}", trace_out);
      for (const Event& e : trace)
        std::fprintf(f, "%c %llu %zu\n", static_cast<char>(e.kind),
                     static_cast<unsigned long long>(e.id), e.nbytes);
      std::fclose(f);
    }

    ExactSizeCache exact;
    const auto [es, emiss] = replay<ExactSizeCache>(
        exact, trace, first_step_end, [](const ExactSizeCache& p) { return p.stats; });
    FakeMemory fake;
    BlockPool pool(fake);
    const auto [ps, pmiss] = replay<BlockPool>(pool, trace, first_step_end,
                                               [](const BlockPool& p) { return p.stats(); });
    const uint64_t requested = peak_requested(trace);
    report("exact", es, requested, emiss);
    report("pool", ps, requested, pmiss);
    std::printf("BENCH allocator_pool_vs_exact reserved_ratio=%.3f\n",
                static_cast<double>(ps.peak_bytes_reserved) /
                    static_cast<double>(std::max<uint64_t>(1, es.peak_bytes_reserved)));
    engine.reset();
    model.reset();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_allocator: %s\n", e.what());
    return 1;
  }
}

// ZeRO stages 0-3 across ranks: the same losses as one process with the same global batch, memory
// per rank as the ZeRO paper predicts, fp16 overflow skipped everywhere, checkpoints that resume
// bitwise at the same world size and load at another. Run under mpirun with 2 and 4 ranks
// (tests/cmake/zero.cmake); every rank also runs the single-process reference itself.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <limits>

#include "ds/ops/ops.h"

#include "ds/comm/group.h"
#include "ds/comm/topology.h"
#include "ds/comm/logger.h"
#include "ds/core/allocator.h"
#include "ds/core/rng.h"
#include "ds/models/gpt.h"
#include "ds/nn/module.h"
#include "ds/runtime/engine.h"
#include "ds/zero/memory_model.h"
#include "ds/zero/partition.h"
#include "../src/zero/prefetch.h"
#include "devices.h"

using namespace ds;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kB = 2, kT = 16, kGas = 2;

std::shared_ptr<comm::Group> world() { return comm::world(); }

// Global sample s: a deterministic, learnable token sequence.
void sample_tokens(int64_t s, int64_t vocab, int32_t* x, int32_t* y) {
  for (int64_t t = 0; t <= kT; ++t) {
    const int32_t v = static_cast<int32_t>((s * 5 + t * 3 + (t / 4) * 7) % vocab);
    if (t < kT) x[t] = v;
    if (t > 0) y[t - 1] = v;
  }
}

// Samples [first, first + count) as a (count, T) batch.
std::pair<Tensor, Tensor> batch(int64_t first, int64_t count, int64_t vocab) {
  Tensor x = Tensor::empty({count, kT}, DType::i32), y = Tensor::empty({count, kT}, DType::i32);
  for (int64_t i = 0; i < count; ++i) sample_tokens(first + i, vocab, x.data<int32_t>() + i * kT, y.data<int32_t>() + i * kT);
  return {x, y};
}

// `zero_extra`: more zero_optimization keys (", ..."); `top_extra`: more top-level keys ("..., ").
std::string zero_config(int stage, const std::string& precision, int64_t micro, double clip = 0.0,
                   int64_t bucket = 4000, const std::string& zero_extra = R"(, "overlap_comm": true)",
                   const std::string& top_extra = "", int64_t gas = kGas) {
  const std::string prec = precision == "bf16"   ? R"("bf16": {"enabled": true},)"
                           : precision == "fp16" ? R"("fp16": {"enabled": true, "initial_scale_power": 10, "hysteresis": 1},)"
                                                 : "";
  // Small prefetch and reuse windows so that stage 3 exercises prefetching and releasing.
  return fmt::format(R"({{"train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": {},
    "gradient_clipping": {}, {} {}
    "zero_optimization": {{"stage": {}, "reduce_bucket_size": {}, "stage3_param_persistence_threshold": 100,
      "stage3_prefetch_bucket_size": 3000, "stage3_max_reuse_distance": 1000{}}},
    "optimizer": {{"type": "AdamW", "params": {{"lr": 5e-3, "weight_decay": 0.1}}}}}})",
                     micro, gas, clip, prec, top_extra, stage, bucket, zero_extra);
}

std::unique_ptr<runtime::Engine> make_engine(const std::string& cfg, std::shared_ptr<comm::Group> g,
                                             bool partitioned_init = false, Device device = kCPU) {
  std::shared_ptr<models::GPT> model;
  if (partitioned_init) {
    nn::PartitionedInit no_full_model;
    model = std::make_shared<models::GPT>(models::GPTConfig::preset("test-gpt2"));
  } else {
    model = std::make_shared<models::GPT>(models::GPTConfig::preset("test-gpt2"));
  }
  model->to(device);
  runtime::InitOptions opt;
  opt.group = g;
  opt.log = [](const std::string&) {};
  return runtime::initialize(model, cfg, opt);
}

// Runs `steps` optimizer steps; returns the global mean loss of every micro-step. Rank r of N
// takes samples [base + r*B_local, +B_local) of each micro-batch of the global batch.
std::vector<double> train(runtime::Engine& e, int steps, int64_t first_step = 0) {
  const int n = e.world_size(), r = e.rank();
  const int64_t b_local = e.config().batch.train_micro_batch_size_per_gpu;
  const int64_t vocab = 64;
  const int64_t gas = e.config().batch.gradient_accumulation_steps;
  std::vector<double> losses;
  for (int64_t s = first_step; s < first_step + steps; ++s)
    for (int64_t m = 0; m < gas; ++m) {
      const int64_t base = (s * gas + m) * b_local * n;
      auto [x, y] = batch(base + r * b_local, b_local, vocab);
      Tensor loss = e.forward(x, y);
      e.backward(loss);
      e.step();
      float l = loss.item();
      e.group().all_reduce(&l, 1, DType::f32);
      losses.push_back(static_cast<double>(l) / n);
    }
  return losses;
}

double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-12); }

}  // namespace

class Zero : public ::testing::TestWithParam<int> {};

TEST_P(Zero, SameLossesAsOneProcess) {
  const int stage = GetParam();
  auto g = world();
  const int n = g->size();
  for (double clip : {0.0, 0.05}) {
    rng::dropout_state() = {};
    auto ref = make_engine(zero_config(0, "fp32", kB * n, clip), comm::single_process_group());
    const auto want = train(*ref, 10);
    rng::dropout_state() = {};
    // Stage 3 builds the model already partitioned: no rank ever holds it whole.
    auto dist = make_engine(zero_config(stage, "fp32", kB, clip), g, stage == 3);
    const auto got = train(*dist, 10);
    ASSERT_EQ(want.size(), got.size());
    // fp32: the per-rank means average exactly to the full-batch mean up to summation order, and
    // gradients differ only by the order of the cross-rank sums: a relative 1e-5 over 20 steps.
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_LT(rel(got[i], want[i]), 1e-5) << "stage " << stage << " clip " << clip << " micro-step " << i
                                            << ": " << got[i] << " vs " << want[i];
    if (stage == 3) {
      EXPECT_GT(dist->prefetched_gathers(), 0) << "stage 3 never prefetched along the trace";
      continue;  // no replicas: every rank holds different pieces
    }
    // Replicas agree bitwise on the weights.
    auto p = dist->flat().params.to_vector();
    double h = 0;
    for (size_t i = 0; i < p.size(); i += 97) h += p[i] * static_cast<double>(i % 13 + 1);
    double hmax = h, hmin = h;
    float fmax = static_cast<float>(h), fmin = static_cast<float>(-h);
    g->all_reduce(&fmax, 1, DType::f32, comm::ReduceOp::max);
    g->all_reduce(&fmin, 1, DType::f32, comm::ReduceOp::max);
    hmax = fmax;
    hmin = -fmin;
    EXPECT_EQ(hmax, hmin) << "replicas diverged";
  }
}

// Bytes of the reductions issued while `fn` runs (all_reduce, reduce_scatter, reduce), and how
// many of them were reduces to one rank.
struct Reductions {
  uint64_t bytes = 0, reduces = 0;
};
template <class F>
Reductions reductions_during(F&& fn) {
  auto& log = comm::comms_logger();
  log.enable(true);
  log.reset();
  fn();
  Reductions out;
  for (const auto& [op, e] : log.totals()) {
    if (op == comm::OpKind::all_reduce || op == comm::OpKind::reduce_scatter || op == comm::OpKind::reduce)
      out.bytes += e.bytes;
    if (op == comm::OpKind::reduce) out.reduces += e.count;
  }
  log.reset();
  log.enable(false);
  return out;
}

// communication_data_type: fp32 training reducing in bf16 moves half the bytes and stays within
// bf16 rounding of the single-process losses; stage 2 without overlap_comm and with all-reduce
// instead of reduce-to-owner (reduce_scatter: false) gives the same losses as one process.
TEST_P(Zero, CommunicationDtypeOverlapAndReduceModes) {
  const int stage = GetParam();
  auto g = world();
  const int n = g->size();
  rng::dropout_state() = {};
  auto ref = make_engine(zero_config(0, "fp32", kB * n), comm::single_process_group());
  const auto want = train(*ref, 4);

  struct Variant {
    std::string name, zero_extra, top_extra;
    double tol;
  };
  const std::vector<Variant> variants = {
      {"fp32 reductions", R"(, "overlap_comm": true)", R"("communication_data_type": "fp32",)", 1e-5},
      {"bf16 reductions", R"(, "overlap_comm": true)", R"("communication_data_type": "bf16",)", 2e-2},
      {"no overlap_comm", R"(, "overlap_comm": false)", "", 1e-5},
      {"all-reduce buckets", R"(, "overlap_comm": true, "reduce_scatter": false)", "", 1e-5},
  };
  std::vector<Reductions> seen;
  for (const auto& v : variants) {
    rng::dropout_state() = {};
    auto dist = make_engine(zero_config(stage, "fp32", kB, 0.0, 4000, v.zero_extra, v.top_extra), g, stage == 3);
    std::vector<double> got;
    seen.push_back(reductions_during([&] { got = train(*dist, 4); }));
    ASSERT_EQ(got.size(), want.size());
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, rel(got[i], want[i]));
    EXPECT_LT(worst, v.tol) << "stage " << stage << ", " << v.name;
    if (v.name == "bf16 reductions" && n > 1) EXPECT_GT(worst, 0.0) << "bf16 reductions changed nothing";
  }
  if (n > 1) {
    // Gradients are most of the traffic (the loss and norm scalars are a few bytes): bf16 halves it.
    const double ratio = double(seen[1].bytes) / double(seen[0].bytes);
    EXPECT_NEAR(ratio, 0.5, 0.02) << "stage " << stage << ": " << seen[1].bytes << " vs " << seen[0].bytes << " bytes";
    // Stage 2 reduces each bucket piece to its owner unless reduce_scatter is false.
    EXPECT_EQ(seen[0].reduces > 0, stage == 2) << "stage " << stage;
    EXPECT_EQ(seen[3].reduces, 0u) << "stage " << stage;
  }
}

// Lamb's trust ratio is per tensor; under ZeRO a tensor cut by a partition boundary has pieces on
// several ranks, whose norms are summed across ranks: the same losses as one process.
TEST_P(Zero, LambMatchesOneProcess) {
  const int stage = GetParam();
  auto g = world();
  const int n = g->size();
  // As DeepSpeed, ZeRO runs Lamb only with zero_allow_untested_optimizer.
  auto lamb = [](std::string c) {
    auto swap = [&](const std::string& from, const std::string& to) { c.replace(c.find(from), from.size(), to); };
    swap(R"("type": "AdamW")", R"("type": "Lamb")");
    swap(R"("lr": 5e-3)", R"("lr": 5e-2)");
    swap(R"("zero_optimization")", R"("zero_allow_untested_optimizer": true, "zero_optimization")");
    return c;
  };
  rng::dropout_state() = {};
  auto ref = make_engine(lamb(zero_config(0, "fp32", kB * n)), comm::single_process_group());
  const auto want = train(*ref, 6);
  rng::dropout_state() = {};
  auto dist = make_engine(lamb(zero_config(stage, "fp32", kB)), g, stage == 3);
  ASSERT_STREQ(dist->optimizer().name(), "Lamb");
  const auto got = train(*dist, 6);
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_LT(rel(got[i], want[i]), 1e-5) << "stage " << stage << " micro-step " << i << ": " << got[i]
                                          << " vs " << want[i];
}

TEST(ZeroStage3, MaxLiveParametersBoundsPrefetch) {
  auto g = world();
  std::string cfg = zero_config(3, "fp32", kB);
  auto free_run = make_engine(cfg, g, true);
  const auto want = train(*free_run, 3);
  // With a live limit below any parameter's size nothing can be gathered ahead; results are equal.
  const std::string limited = cfg.substr(0, cfg.find("\"stage3_max_reuse_distance\"")) +
                              "\"stage3_max_live_parameters\": 1, " + cfg.substr(cfg.find("\"stage3_max_reuse_distance\""));
  auto tight = make_engine(limited, g, true);
  const auto got = train(*tight, 3);
  EXPECT_GT(free_run->prefetched_gathers(), 0);
  EXPECT_EQ(tight->prefetched_gathers(), 0);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "micro-step " << i;
}

TEST_P(Zero, GradientCheckpointingGivesTheSameLosses) {
  // Checkpointed blocks re-run their forward (and, under stage 3, their gathers) inside backward.
  const int stage = GetParam();
  auto g = world();
  auto plain = make_engine(zero_config(stage, "fp32", kB), g);
  const auto want = train(*plain, 4);
  auto ckpt = make_engine(zero_config(stage, "fp32", kB), g, stage == 3);
  dynamic_cast<models::GPT&>(ckpt->module()).set_gradient_checkpointing(true);
  const auto got = train(*ckpt, 4);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_LT(rel(got[i], want[i]), 1e-6) << "micro-step " << i;
}

// The model on a device trains as on the host at every stage and world size: the gathered
// parameters, gradients and reduction staging live on the device, collectives go through host
// memory, the optimizer steps the host shards (docs/cuda.md). On `sim` (memory the host cannot
// read, the CPU's kernels) bit for bit, and any host loop left over device memory crashes here; on
// a GPU (cuda:0 when present) within rounding of its own kernels (not yet run on one).
TEST_P(Zero, ModelOnADeviceTrainsAsOnTheHost) {
  const int stage = GetParam();
  auto g = world();
  // Stage 3 also with its parameters and optimizer state on NVMe (the background step).
  const fs::path swap =
      fs::temp_directory_path() / fmt::format("ds_zero_dev_{}_{}", ::getpid(), g->rank());
  fs::create_directories(swap);
  const std::string nvme = fmt::format(
      R"(, "offload_optimizer": {{"device": "nvme", "nvme_path": "{0}"}},
      "offload_param": {{"device": "nvme", "nvme_path": "{0}"}})", swap.string());
  for (const Device device : ds::testing::test_devices()) {
    if (device.is_cpu()) continue;
    const bool exact = device.type == DeviceType::sim;
    for (const std::string precision : {"fp32", "bf16", "bf16 nvme"}) {
      SCOPED_TRACE(device.str() + " " + precision);
      const bool on_nvme = precision.find("nvme") != std::string::npos;
      if (on_nvme && stage != 3) continue;
      const std::string cfg = zero_config(stage, precision.substr(0, 4), kB, 0.05, 4000,
                                          on_nvme ? nvme : std::string());
      const double tol = exact ? 0.0 : precision == "fp32" ? 1e-4 : 1e-2;
      rng::dropout_state() = {};
      auto host = make_engine(cfg, g);
      const auto want = train(*host, 3);
      rng::dropout_state() = {};
      auto dev = make_engine(cfg, g, false, device);
      const auto got = train(*dev, 3);
      for (const auto& [name, p] : dev->module().named_parameters())
        EXPECT_EQ(p.device(), device) << name << " left the device";
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_LE(std::abs(got[i] - want[i]), tol * std::abs(want[i])) << "micro-step " << i;
      const auto a = dev->full_weights(), b = host->full_weights();
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_TRUE(a[i].second.device().is_cpu()) << a[i].first << ": exports read host memory";
        const auto va = a[i].second.to_vector(), vb = b[i].second.to_vector();
        ASSERT_EQ(va.size(), vb.size()) << a[i].first;
        size_t off = 0;
        for (size_t k = 0; k < va.size(); ++k)
          off += std::abs(va[k] - vb[k]) > tol * std::max(1.0f, std::abs(vb[k]));
        EXPECT_EQ(off, 0u) << a[i].first << ": " << off << " of " << va.size() << " differ";
      }
    }
  }
  fs::remove_all(swap);
}

// The boundary micro-step's backward sends each range of the gradients to host memory as soon as
// it is final (offload_optimizer.download_in_backward, on by default; docs/cuda.md): on `sim`,
// whose copies happen when enqueued, a gradient changed on the device after its range was sent
// would change the step. The parameters are bitwise those of the run that downloads after backward, and
// those of the host run, with clipping on (a grad_scale factor, never applied on the device), for
// fp32, bf16 and fp16 training (the loss scale's unscaling is a grad_scale factor too), fp32 and
// bf16 accumulation, with and without accumulation steps.
// sub_group_size 1000 cuts the optimizer range into many pieces, not aligned with the parameters.
TEST_P(Zero, GradientsGoDownDuringBackwardBitwise) {
  const int stage = GetParam();
  if (stage == 3) GTEST_SKIP() << "stage 3 has its own step (not HostStep::run_for_device)";
  auto g = world();
  const Device sim{DeviceType::sim, 0};
  // Stage 1 with several ranks reduce-scatters at the step, writing the device gradients: off.
  const bool expected_on = g->size() == 1 || stage != 1;
  auto weights = [](runtime::Engine& e) {
    std::vector<std::vector<float>> out;
    for (const auto& [name, t] : e.full_weights()) out.push_back(t.to_vector());
    return out;
  };
  // "fp16 skips": a loss scale of 2^20 overflows the fp16 gradients of the first steps, which
  // are skipped (zero_grads() then drops the downloads of that backward) until the scale fits.
  for (const std::string precision : {"fp32", "bf16", "fp16", "fp16 skips"})
    for (const std::string accum : {"fp32", "bf16"})
      for (const int64_t gas : {int64_t{1}, kGas}) {
        SCOPED_TRACE(fmt::format("{} training, {} accumulation, {} micro-steps", precision, accum,
                                 gas));
        const bool skips = precision == "fp16 skips";
        const std::string top =
            fmt::format(R"("data_types": {{"grad_accum_dtype": "{}"}}, {})", accum,
                        skips ? R"("fp16": {"enabled": true, "initial_scale_power": 20,
                                   "hysteresis": 1},)"
                              : "");
        auto cfg = [&](bool on) {
          return zero_config(
              stage, skips ? "fp32" : precision, kB, 0.05, 4000,
              fmt::format(R"(, "overlap_comm": true, "sub_group_size": 1000,
                "offload_optimizer": {{"download_in_backward": {}}})",
                          on ? "true" : "false"),
              top, gas);
        };
        rng::dropout_state() = {};
        auto host = make_engine(cfg(true), g);
        train(*host, 3);
        rng::dropout_state() = {};
        auto late = make_engine(cfg(false), g, false, sim);
        train(*late, 3);
        rng::dropout_state() = {};
        auto early = make_engine(cfg(true), g, false, sim);
        train(*early, 3);
        const auto want = weights(*late);
        EXPECT_EQ(weights(*early), want) << "downloads during backward changed the step";
        EXPECT_EQ(weights(*host), want) << "the device run differs from the host run";
        if (skips) {
          EXPECT_GT(early->skipped_steps(), 0);
          EXPECT_EQ(early->skipped_steps(), late->skipped_steps());
        }
        EXPECT_EQ(late->strategy().offload_stats().grad_bytes_in_backward, 0);
        // Every parameter gets a gradient: the whole optimizer range went down during each of the
        // 3 boundary backwards.
        const int64_t range = early->strategy().optimizer_numel() *
                              static_cast<int64_t>(dtype_size(early->grad_dtype()));
        EXPECT_EQ(early->strategy().offload_stats().grad_bytes_in_backward,
                  expected_on ? 3 * range : 0);
      }
}

// gradient_predivide_factor f divides the gradients by f before the reduction and multiplies the
// sum by f / N after it: the average is unchanged at any N, also N = 1 (where there is no
// reduction, so neither scale applies). With clipping on, a gradient left f times too large would
// be clipped differently.
TEST_P(Zero, GradientPredivideFactorLeavesTheAverage) {
  const int stage = GetParam();
  auto g = world();
  auto plain = make_engine(zero_config(stage, "fp32", kB, 0.05), g, stage == 3);
  const auto want = train(*plain, 3);
  auto divided = make_engine(
      zero_config(stage, "fp32", kB, 0.05, 4000, R"(, "overlap_comm": true)",
                  R"("gradient_predivide_factor": 4.0,)"),
      g, stage == 3);
  const auto got = train(*divided, 3);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_LT(rel(got[i], want[i]), 1e-5) << "micro-step " << i;
  // Adam hardly sees a uniform scale; the gradient norm does.
  EXPECT_LT(rel(divided->last_grad_norm(), plain->last_grad_norm()), 1e-5)
      << divided->last_grad_norm() << " vs " << plain->last_grad_norm();
}

TEST_P(Zero, Bf16MatchesOneProcessWithinRounding) {
  const int stage = GetParam();
  auto g = world();
  const int n = g->size();
  auto ref = make_engine(zero_config(0, "bf16", kB * n), comm::single_process_group());
  const auto want = train(*ref, 6);
  auto dist = make_engine(zero_config(stage, "bf16", kB), g);
  const auto got = train(*dist, 6);
  // bf16 activations carry 8 bits of mantissa (relative 2^-9 per rounding); different summation
  // orders flip individual roundings, which then propagate through 12 micro-steps: 1e-2 relative.
  for (size_t i = 0; i < want.size(); ++i) EXPECT_LT(rel(got[i], want[i]), 1e-2) << "micro-step " << i;
}

TEST_P(Zero, ModelStateMemoryAsThePaperPredicts) {
  const int stage = GetParam();
  auto g = world();
  const int n = g->size();
  for (const std::string prec : {"fp32", "bf16"}) {
    auto e = make_engine(zero_config(stage, prec, kB), g);
    const auto mem = e->memory_budget();
    if (stage < 3) {
      const auto want = zero::expected_model_state_bytes(stage, e->partition_plan(), e->training_dtype(), e->grad_dtype(), 2);
      EXPECT_EQ(mem.params, want.params);
      EXPECT_EQ(mem.grads, want.grads);
      EXPECT_EQ(mem.master_weights, want.master_weights);
      EXPECT_EQ(mem.optimizer_states, want.optimizer_states);
    }
    // The paper's formula on the unpadded P (reference §6): fp32 stage 0 16P, 1 8P + 8P/N,
    // 2 4P + 12P/N; bf16 (grads accumulated in fp32 here, so 2 + 4 + 12 per element):
    // 0 18P, 1 6P + 12P/N, 2 2P + 16P/N. Padding adds at most 16N elements.
    const double P = static_cast<double>(e->flat().numel);
    double paper = 0;
    // Stage 3: 16P/N (fp32), 2P/N + 16P/N (bf16), plus the persistent parameters every rank keeps
    // whole (numel <= 100 here: the biases and norm weights) and up to N-1 padding elements per
    // parameter.
    if (prec == "fp32") paper = stage == 0 ? 16 * P : stage == 1 ? 8 * P + 8 * P / n : stage == 2 ? 4 * P + 12 * P / n : 16 * P / n;
    else paper = stage == 0 ? 18 * P : stage == 1 ? 6 * P + 12 * P / n : stage == 2 ? 2 * P + 16 * P / n : 18 * P / n;
    double slack = 18.0 * 16 * n;
    if (stage == 3) {
      double persistent = 0;
      for (const auto& en : e->flat().entries)
        if (en.numel <= 100) persistent += en.numel;
      paper += persistent * static_cast<double>(dtype_size(e->training_dtype()));
      slack = 18.0 * (static_cast<double>(e->flat().entries.size()) * n + 16);
    }
    EXPECT_NEAR(static_cast<double>(mem.total()), paper, slack) << prec << " stage " << stage;
  }
}

TEST_P(Zero, Fp16OverflowOnOneRankSkipsEverywhere) {
  const int stage = GetParam();
  auto g = world();
  const int n = g->size(), r = g->rank();
  auto e = make_engine(zero_config(stage, "fp16", kB), g);
  // Only the last rank overflows, on the second step's first micro-step: its loss (and so every
  // gradient) becomes inf.
  for (int64_t s = 0; s < 3; ++s)
    for (int64_t m = 0; m < kGas; ++m) {
      auto [x, y] = batch(((s * kGas + m) * n + r) * kB, kB, 64);
      Tensor loss = e->forward(x, y);
      if (s == 1 && m == 0 && r == n - 1) loss = ops::mul(loss, std::numeric_limits<float>::infinity());
      e->backward(loss);
      e->step();
    }
  EXPECT_EQ(e->skipped_steps(), 1);
  EXPECT_EQ(e->global_steps(), 3);
  EXPECT_EQ(e->loss_scale(), 512.0);  // 2^10 halved once (hysteresis 1)
}

TEST_P(Zero, CheckpointResumesBitwiseAndLoadsAtAnotherWorldSize) {
  const int stage = GetParam();
  auto g = world();
  const int n = g->size();
  // Rank 0's pid names the folder: runs of this test side by side (two checkouts on one machine)
  // must not share it.
  int64_t id = ::getpid();
  g->broadcast(&id, 1, DType::i64, 0, "test folder");
  fs::path dir = fs::temp_directory_path() / fmt::format("ds_zero_ck_{}_{}_{}", stage, n, id);
  if (g->rank() == 0) fs::remove_all(dir);
  g->barrier();
  std::vector<double> continuous;
  {
    auto e = make_engine(zero_config(stage, "fp32", kB), g);
    continuous = train(*e, 6);
  }
  {
    auto e = make_engine(zero_config(stage, "fp32", kB), g);
    train(*e, 3);
    e->save_checkpoint(dir.string());
  }
  auto e = make_engine(zero_config(stage, "fp32", kB), g);
  e->load_checkpoint(dir.string());
  EXPECT_EQ(e->global_steps(), 3);
  const auto resumed = train(*e, 3, 3);
  for (size_t i = 0; i < resumed.size(); ++i) EXPECT_EQ(resumed[i], continuous[6 + i]) << "micro-step " << i;

  // The same checkpoint in one process (another world size, and stage 0).
  auto single = make_engine(zero_config(0, "fp32", kB * n), comm::single_process_group());
  single->load_checkpoint(dir.string());
  const auto one = train(*single, 3, 3);
  for (size_t i = 0; i < one.size(); ++i) EXPECT_LT(rel(one[i], continuous[6 + i]), 1e-5) << "micro-step " << i;
  g->barrier();
  if (g->rank() == 0) fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Stages, Zero, ::testing::Values(0, 1, 2, 3));

// Stage 2 on one rank has nothing to reduce: each gradient is added into the partition directly
// (as stage 0 accumulates into its flat buffer), so a micro-step's allocator peak above what is
// resident before it is stage 0's, not one bucket (here the whole model) more.
TEST(ZeroStage2, OneRankAddsGradientsWithoutAStagingBucket) {
  int64_t above[3] = {0, 0, 0}, model_bytes = 0;
  for (int stage : {0, 2}) {
    auto e = make_engine(zero_config(stage, "fp32", kB, 0.0, /*bucket=*/int64_t{1} << 22),
                         comm::single_process_group());
    model_bytes = e->flat().params.numel() * 4;
    train(*e, 1);  // the first step allocates the optimizer state
    auto [x, y] = batch(0, kB, 64);
    const uint64_t before = cpu_allocator().stats().bytes_in_use;
    cpu_allocator().reset_peak();
    Tensor loss = e->forward(x, y);
    e->backward(loss);
    e->step();
    above[stage] = static_cast<int64_t>(cpu_allocator().stats().peak_bytes_in_use - before);
  }
  EXPECT_LT(above[2], above[0] + model_bytes / 2)
      << "stage 2 peaked " << above[2] << " bytes above the resident state, stage 0 " << above[0]
      << "; the model is " << model_bytes << " bytes";
}

TEST(ZeroPlan, PartitionsAndBuckets) {
  // Pure arithmetic, constructing ranks 0..N-1 in one process.
  for (int n : {1, 2, 3, 4, 8}) {
    const auto p = zero::plan_partitions(1001, n);
    EXPECT_EQ(p.padded_numel % (2 * n), 0);
    EXPECT_GE(p.padded_numel, 1001);
    EXPECT_LT(p.padded_numel - 1001, 16 * n);
    for (int r = 0; r < n; ++r) EXPECT_EQ(p.end(r) - p.begin(r), p.partition_numel);
    EXPECT_EQ(p.end(n - 1), p.padded_numel);
  }
  std::vector<nn::FlatEntry> entries = {{"a", {10}, 0, 10}, {"b", {25}, 10, 25}, {"c", {5}, 35, 5}};
  const auto buckets = zero::plan_buckets(entries, 48, 16);
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0].begin, 32);  // laid from the end
  EXPECT_EQ(buckets[0].params, (std::vector<int>{1, 2}));
  EXPECT_EQ(buckets[2].params, (std::vector<int>{0, 1}));
}

// ZeRO-3's prefetch planner (src/zero/prefetch.h) as pure functions.
TEST(ZeroPrefetch, PlanStopsAtBudgetAndLiveLimit) {
  // Events: {0}, {1, 2}, {3}; sizes 10, 20, 30, 40.
  const std::vector<std::vector<int>> trace = {{0}, {1, 2}, {3}};
  const std::vector<int64_t> numel = {10, 20, 30, 40};
  const std::vector<bool> none(4, false);
  // Budget counted per element; an event already started is finished (as DeepSpeed's buckets).
  EXPECT_EQ(zero::detail::plan_prefetch(trace, numel, none, 25, 1000, 0), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(zero::detail::plan_prefetch(trace, numel, none, 1000, 1000, 0), (std::vector<int>{0, 1, 2, 3}));
  // Available (gathered or in flight) parameters are skipped.
  std::vector<bool> some = none;
  some[1] = true;
  EXPECT_EQ(zero::detail::plan_prefetch(trace, numel, some, 1000, 1000, 0), (std::vector<int>{0, 2, 3}));
  // The live limit stops the plan at the first parameter that would exceed it.
  EXPECT_EQ(zero::detail::plan_prefetch(trace, numel, none, 1000, 35, 0), (std::vector<int>{0, 1}));
  EXPECT_TRUE(zero::detail::plan_prefetch(trace, numel, none, 1000, 35, 30).empty());
  // Reuse: parameter 3 comes back within 60 elements, parameter 0 never.
  const std::vector<std::vector<int>> later = {{1}, {3}};
  EXPECT_EQ(zero::detail::reused_soon(later, {3, 0}, numel, 60), (std::vector<bool>{true, false}));
  EXPECT_EQ(zero::detail::reused_soon(later, {3}, numel, 20), (std::vector<bool>{false}));
}

TEST(ZeroPrefetch, TraceIsRecordedOnceThenFollowed) {
  zero::detail::Trace t;
  t.begin_micro_step(true);
  EXPECT_FALSE(t.following());
  t.on_gather({0});
  t.on_gather({1});
  t.end_micro_step();
  t.begin_micro_step(true);
  EXPECT_TRUE(t.following());
  EXPECT_EQ(t.upcoming().size(), 2u);
  t.on_gather({0});
  EXPECT_EQ(t.upcoming().size(), 1u);
  t.on_gather({2});  // departs from the trace: stop guessing
  EXPECT_FALSE(t.following());
  t.end_micro_step();
  t.begin_micro_step(false);  // evaluation never follows
  EXPECT_FALSE(t.following());
}

// ZeRO takes its group from the topology: with every rank on the pipeline axis (pp = N; no
// pipeline engine uses it here), the data-parallel group has one rank, so ZeRO-2 over it shards
// nothing and each rank trains alone, exactly as one process does. (A tensor axis needs a model
// with tensor-parallel layers: test_tensor_parallel.)
TEST(ZeroTopology, ShardsOverTheDataParallelGroup) {
  auto w = world();
  auto topo = std::make_shared<comm::Topology>(w, /*tp=*/1, /*pp=*/w->size());
  ASSERT_EQ(topo->data_parallel()->size(), 1);
  auto model = std::make_shared<models::GPT>(models::GPTConfig::preset("test-gpt2"));
  runtime::InitOptions opt;
  opt.topology = topo;
  opt.log = [](const std::string&) {};
  auto e = runtime::initialize(model, zero_config(2, "fp32", kB), opt);
  EXPECT_EQ(e->world_size(), 1);
  EXPECT_EQ(e->partition_plan().world_size, 1);
  auto single = make_engine(zero_config(2, "fp32", kB), comm::single_process_group());
  const auto a = train(*e, 2), b = train(*single, 2);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << i;
  // group and topology together are refused.
  opt.group = w;
  EXPECT_THROW(runtime::initialize(std::make_shared<models::GPT>(models::GPTConfig::preset("test-gpt2")),
                                   zero_config(2, "fp32", kB), opt),
               Error);
}

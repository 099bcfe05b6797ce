// Tensor parallelism (ds/nn/tensor_parallel.h): a model cut over tp ranks is the whole model.
// Run plainly (tp = 1) and under mpirun with 2 and 4 ranks (tests/cmake/parallel3d.cmake): every
// rank also builds the whole model itself and compares.
//   - gradients of every part equal the matching slice of the whole model's gradients, and the
//     loss equals the whole model's (GPT-2 with an odd vocabulary and a tied head; LLaMA with
//     grouped-query attention, q/k/v biases and an untied head);
//   - training with the engine (ZeRO 0-3 on the data axis, gradient clipping on so that the norm
//     over the cut and whole parameters is used) gives one process's losses for tp = N and for
//     tp = 2 x dp = 2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "ds/comm/group.h"
#include "ds/comm/topology.h"
#include "ds/core/checksum.h"
#include "ds/core/error.h"
#include "ds/core/safetensors.h"
#include "ds/models/gpt.h"
#include "ds/nn/tensor_parallel.h"
#include "ds/ops/ops.h"
#include "ds/config/config.h"
#include "ds/runtime/consolidate.h"
#include "ds/runtime/activation_stash.h"
#include "ds/runtime/engine.h"
#include "devices.h"

#include <nlohmann/json.hpp>

#include "runtime/checkpoint_parts.h"  // internal: slices of whole parameters

using namespace ds;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kT = 16, kGas = 2;

// "gpt2", "llama" (grouped-query attention with K/V heads cut over the ranks) or "llama_kv1"
// (one K/V head, shared by every tensor-parallel rank).
models::GPTConfig model_config(const std::string& layout, int tp) {
  models::GPTConfig c = models::GPTConfig::preset(layout == "gpt2" ? "test-gpt2" : "test-llama");
  c.seed = 7;
  if (layout == "gpt2") {
    c.vocab_size = 97;  // odd: the vocabulary's last part is shorter
  } else {
    c.vocab_size = 101;
    c.n_kv_head = layout == "llama_kv1" ? 1 : tp <= 2 ? 2 : 4;
    c.qkv_bias = true;
  }
  return c;
}

void tokens(int64_t s, int64_t vocab, int32_t* x, int32_t* y) {
  for (int64_t t = 0; t <= kT; ++t) {
    const int32_t v = static_cast<int32_t>((s * 5 + t * 3 + (t / 4) * 7) % vocab);
    if (t < kT) x[t] = v;
    if (t > 0) y[t - 1] = v;
  }
}

std::pair<Tensor, Tensor> batch(int64_t first, int64_t count, int64_t vocab) {
  Tensor x = Tensor::empty({count, kT}, DType::i32), y = Tensor::empty({count, kT}, DType::i32);
  for (int64_t i = 0; i < count; ++i)
    tokens(first + i, vocab, x.data<int32_t>() + i * kT, y.data<int32_t>() + i * kT);
  return {x, y};
}

// This rank's part of a whole tensor, as TPSplit describes it.
Tensor part_of(const Tensor& full, const nn::TPSplit& s) {
  if (s.replicated()) return full;
  const int64_t per_block = s.full / s.blocks;
  std::vector<Tensor> pieces;
  for (int64_t j = 0; j < s.blocks; ++j)
    pieces.push_back(
        ops::slice(full, s.dim, j * per_block + s.begin, j * per_block + s.end));
  return ops::contiguous(pieces.size() == 1 ? pieces[0] : ops::concat(pieces, s.dim));
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (float v : t.contiguous().to_vector()) m = std::max(m, static_cast<double>(std::abs(v)));
  return m;
}

double max_diff(const Tensor& a, const Tensor& b) {
  const auto va = a.contiguous().to_vector(), vb = b.contiguous().to_vector();
  EXPECT_EQ(va.size(), vb.size());
  double m = 0;
  for (size_t i = 0; i < std::min(va.size(), vb.size()); ++i)
    m = std::max(m, static_cast<double>(std::abs(va[i] - vb[i])));
  return m;
}

}  // namespace

class TensorParallelModel : public ::testing::TestWithParam<std::string> {};

TEST_P(TensorParallelModel, PartsAndGradientsAreTheWholeModels) {
  auto w = comm::world();
  const int n = w->size();
  const models::GPTConfig c = model_config(GetParam(), n);
  auto tp = std::make_shared<nn::TensorParallel>(w);
  models::GPT whole(c);
  models::GPT cut(c, tp);
  const auto splits = nn::tp_splits(cut);
  if (n > 1) EXPECT_FALSE(splits.empty());

  // Initialisation: every part holds exactly the whole model's values.
  std::map<std::string, Tensor> full;
  for (const auto& [name, p] : whole.named_parameters()) full[name] = p;
  const auto parts = cut.named_parameters();
  ASSERT_EQ(parts.size(), full.size());
  for (const auto& [name, p] : parts) {
    ASSERT_TRUE(full.count(name)) << name;
    const auto it = splits.find(name);
    const Tensor want = part_of(full[name], it == splits.end() ? nn::TPSplit{} : it->second);
    ASSERT_EQ(p.shape(), want.shape()) << name;
    EXPECT_EQ(max_diff(p, want), 0.0) << name;
    // --init_from's slicing and the export's gathering (shared K/V heads: taken once) agree.
    if (it != splits.end()) {
      EXPECT_EQ(max_diff(nn::local_part(full[name], it->second), p), 0.0) << name;
      EXPECT_EQ(max_diff(nn::gather_full(p, it->second, *tp), full[name]), 0.0) << name;
    }
  }

  auto [x, y] = batch(3, 2, c.vocab_size);
  Tensor lw = whole.loss(x, y), lc = cut.loss(x, y);
  EXPECT_NEAR(lc.item(), lw.item(), 1e-5 * std::abs(lw.item()));
  lw.backward();
  lc.backward();
  for (const auto& [name, p] : parts) {
    const auto it = splits.find(name);
    const Tensor want = part_of(full[name].grad(), it == splits.end() ? nn::TPSplit{} : it->second);
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_LE(max_diff(p.grad(), want), 1e-5 * std::max(1e-3, max_abs(want))) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, TensorParallelModel,
                         ::testing::Values("gpt2", "llama", "llama_kv1"));

namespace {

// Under ZeRO-3 the parameters above 100 elements (all but norms and biases) are gathered around
// each use, not kept.
std::string engine_config(int stage, int64_t micro, double clip, int tp = 1, bool bf16 = false) {
  return fmt::format(R"({{"train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": {},{}
    "gradient_clipping": {}, "zero_optimization": {{"stage": {}, "reduce_bucket_size": 4000,
      "stage3_param_persistence_threshold": 100}},
    "tensor_parallel": {{"autotp_size": {}}},
    "optimizer": {{"type": "AdamW", "params": {{"lr": 5e-3, "weight_decay": 0.1}}}}}})",
                     micro, kGas, bf16 ? R"( "bf16": {"enabled": true},)" : "", clip, stage, tp);
}

// `steps` optimizer steps; the mean loss of every micro-step over the data-parallel group. Data
// rank d of D takes samples [base + d*B, +B) of each global micro-batch; tp ranks share theirs.
// `first`: the step to start at (a resumed run continues the same sample order).
std::vector<double> train(runtime::Engine& e, int steps, int64_t vocab, int64_t first = 0) {
  const int dp = e.world_size(), d = e.rank();
  const int64_t b = e.config().batch.train_micro_batch_size_per_gpu;
  std::vector<double> losses;
  for (int64_t s = first; s < first + steps; ++s)
    for (int64_t m = 0; m < kGas; ++m) {
      auto [x, y] = batch((s * kGas + m) * b * dp + d * b, b, vocab);
      Tensor loss = e.forward(x, y);
      e.backward(loss);
      e.step();
      float l = loss.item();
      e.group().all_reduce(&l, 1, DType::f32);
      losses.push_back(static_cast<double>(l) / dp);
    }
  return losses;
}

}  // namespace

class TensorParallelTraining : public ::testing::TestWithParam<int> {};

// tp = N (every rank on the tensor axis), and with 4 ranks also tp = 2 x dp = 2.
TEST_P(TensorParallelTraining, SameLossesAsOneProcess) {
  const int stage = GetParam();
  auto w = comm::world();
  const int n = w->size();
  std::vector<int> tps = {n};
  if (n == 4) tps.push_back(2);
  for (const std::string layout : {"gpt2", "llama", "llama_kv1"}) {
    for (int t : tps) {
      SCOPED_TRACE(fmt::format("{} stage {} tp {} of {}", layout, stage, t, n));
      auto topo = std::make_shared<comm::Topology>(w, t, /*pp=*/1);
      const int dp = topo->data_parallel()->size();
      const models::GPTConfig c = model_config(layout, t);
      const int64_t b = 2;
      runtime::InitOptions opt;
      opt.topology = topo;
      opt.log = [](const std::string&) {};
      auto model = std::make_shared<models::GPT>(
          c, std::make_shared<nn::TensorParallel>(topo->tensor_parallel()));
      auto e = runtime::initialize(model, engine_config(stage, b, 0.05, t), opt);

      runtime::InitOptions one;
      one.group = comm::single_process_group();
      one.log = opt.log;
      auto ref = runtime::initialize(std::make_shared<models::GPT>(c),
                                     engine_config(stage, b * dp, 0.05), one);
      const auto got = train(*e, 20, c.vocab_size), want = train(*ref, 20, c.vocab_size);
      ASSERT_EQ(got.size(), want.size());
      double worst = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i])) << "micro-step " << i;
        worst = std::max(worst, std::abs(got[i] - want[i]) / std::abs(want[i]));
      }
      if (w->rank() == 0)
        fmt::print("{} ZeRO-{} tp {} x dp {}: largest relative loss difference {:.1e}\n", layout,
                   stage, t, dp, worst);
      EXPECT_NEAR(e->last_grad_norm(), ref->last_grad_norm(),
                  1e-4 * ref->last_grad_norm());
      // A K/V head shared by several tensor-parallel ranks stays the same on each of them
      // (stages 0-2: under ZeRO-3 the parameters are released pieces).
      const auto splits = nn::tp_splits(*model);
      for (const auto& [name, p] :
           stage < 3 ? model->named_parameters() : std::vector<std::pair<std::string, Tensor>>{}) {
        const auto it = splits.find(name);
        if (it == splits.end() || it->second.copies == 1) continue;
        const std::vector<float> mine = p.contiguous().to_vector();
        comm::Group& g = *topo->tensor_parallel();
        std::vector<float> all(mine.size() * static_cast<size_t>(g.size()));
        g.all_gather(mine.data(), all.data(), mine.size(), DType::f32, "test: shared K/V heads");
        const size_t first = static_cast<size_t>(g.rank() / it->second.copies * it->second.copies);
        EXPECT_TRUE(std::equal(mine.begin(), mine.end(), all.begin() + first * mine.size()))
            << name << " on tensor rank " << g.rank();
      }
      // The gathered weights (for export) are the one-process model's, with the whole shapes
      // (under ZeRO-3 on the first data rank's tensor-parallel ranks only).
      const auto gathered = e->full_weights(), whole = ref->full_weights();
      if (stage == 3 && e->rank() != 0) {
        EXPECT_TRUE(gathered.empty());
        continue;
      }
      ASSERT_EQ(gathered.size(), whole.size());
      for (size_t i = 0; i < whole.size(); ++i) {
        ASSERT_EQ(gathered[i].first, whole[i].first);
        ASSERT_EQ(gathered[i].second.shape(), whole[i].second.shape()) << whole[i].first;
        EXPECT_LE(max_diff(gathered[i].second, whole[i].second),
                  1e-4 * std::max(1.0, max_abs(whole[i].second)))
            << whole[i].first;
      }
    }
  }
}

// The model on a device (`sim`, the emulator whose memory the host cannot read; a GPU when present,
// not yet run on one) trains as on the host with tensor parallelism: the layers' all-reduces, the vocabulary-parallel loss
// (its statistics and the shared K/V heads' gradients) and the gathers for export go through host
// memory. The vocabulary-parallel loss runs the Backend's default kernels on a device (composed in
// fp32, the CPU's own kernels accumulate in double), hence a tolerance instead of equality.
TEST_P(TensorParallelTraining, ModelOnADeviceTrainsAsOnTheHost) {
  const int stage = GetParam();
  auto w = comm::world();
  const int n = w->size();
  for (const std::string layout : {"gpt2", "llama_kv1"}) {
    SCOPED_TRACE(fmt::format("{} stage {} tp {}", layout, stage, n));
    const models::GPTConfig c = model_config(layout, n);
    auto run = [&](Device device) {
      auto topo = std::make_shared<comm::Topology>(w, n, /*pp=*/1);
      runtime::InitOptions opt;
      opt.topology = topo;
      opt.log = [](const std::string&) {};
      auto model = std::make_shared<models::GPT>(
          c, std::make_shared<nn::TensorParallel>(topo->tensor_parallel()));
      model->to(device);
      auto e = runtime::initialize(model, engine_config(stage, 2, 0.05, n), opt);
      const auto losses = train(*e, 3, c.vocab_size);
      return std::make_pair(losses, e->full_weights());
    };
    const auto [want, host_weights] = run(kCPU);
    for (const Device device : ds::testing::test_devices()) {
      if (device.is_cpu()) continue;
      SCOPED_TRACE(device.str());
      const double tol = device.type == DeviceType::sim ? 1e-6 : 1e-4;
      const auto [got, dev_weights] = run(device);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_NEAR(got[i], want[i], tol * std::abs(want[i])) << "micro-step " << i;
      ASSERT_EQ(dev_weights.size(), host_weights.size());
      for (size_t i = 0; i < dev_weights.size(); ++i)
        EXPECT_LE(max_diff(dev_weights[i].second, host_weights[i].second),
                  10 * tol * std::max(1.0, max_abs(host_weights[i].second)))
            << host_weights[i].first;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, TensorParallelTraining, ::testing::Values(0, 1, 2, 3));

// The config's tensor_parallel.autotp_size and the topology must agree.
TEST(TensorParallelTraining, PartitionedActivationCheckpointsTrainAsWholeOnes) {
  // activation_checkpointing.partition_activations with every layer checkpointed: each
  // tensor-parallel rank keeps 1/tp of a layer's input and the group gathers it for the recompute.
  // The recompute sees the same input, so the losses are bitwise those of keeping it whole, and
  // each rank keeps ceil(B x T x C / tp) of every checkpointed input, in the slots of one buffer.
  auto w = comm::world();
  const int n = w->size();
  if (n == 1) GTEST_SKIP() << "needs several ranks (the np tests)";
  auto topo = std::make_shared<comm::Topology>(w, n, /*pp=*/1);
  const models::GPTConfig c = model_config("llama", n);
  const int64_t b = 2;
  auto run = [&](bool partition, runtime::ActivationStash::Stats* stats) {
    auto model = std::make_shared<models::GPT>(
        c, std::make_shared<nn::TensorParallel>(topo->tensor_parallel()));
    model->set_gradient_checkpointing(true);
    nlohmann::json cfg = nlohmann::json::parse(engine_config(1, b, 0.05, n));
    // With the partitions in one buffer of n_layer slots (contiguous_memory_optimization).
    if (partition)
      cfg["activation_checkpointing"] = {{"partition_activations", true},
                                         {"contiguous_memory_optimization", true},
                                         {"number_checkpoints", c.n_layer}};
    runtime::InitOptions opt;
    opt.topology = topo;
    opt.log = [](const std::string&) {};
    auto e = runtime::initialize(model, cfg.dump(), opt);
    EXPECT_EQ(e->activation_stash() != nullptr, partition);
    const auto losses = train(*e, 4, c.vocab_size);
    if (partition) *stats = e->activation_stash()->stats();
    return losses;
  };
  runtime::ActivationStash::Stats stats;
  const auto whole = run(false, nullptr), parted = run(true, &stats);
  EXPECT_EQ(whole, parted);
  EXPECT_EQ(stats.stashed, 4 * kGas * c.n_layer);
  EXPECT_EQ(stats.kept_bytes, stats.stashed * ((b * kT * c.n_embd + n - 1) / n) * 4);
  EXPECT_EQ(stats.host_bytes, 0);
  EXPECT_EQ(stats.most_in_slots, c.n_layer);  // a forward's inputs, the slots reused every step
}

TEST(TensorParallelTraining, ConfigAndTopologyMustAgree) {
  auto w = comm::world();
  auto topo = std::make_shared<comm::Topology>(w, w->size(), 1);
  runtime::InitOptions opt;
  opt.topology = topo;
  opt.log = [](const std::string&) {};
  auto tp = std::make_shared<nn::TensorParallel>(topo->tensor_parallel());
  try {
    runtime::initialize(std::make_shared<models::GPT>(model_config("gpt2", w->size()), tp),
                        engine_config(0, 2, 0.0, w->size() + 1), opt);
    ADD_FAILURE() << "not refused";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("tensor_parallel.autotp_size"), std::string::npos)
        << err.what();
  }
  // tp.tp_size must be 1 or autotp_size (DeepSpeed's rule).
  EXPECT_THROW(config::parse_config_json(nlohmann::json::parse(
                   R"({"train_micro_batch_size_per_gpu": 1,
                       "tensor_parallel": {"autotp_size": 2, "tp": {"tp_size": 3}}})"),
                                          {}),
               Error);
}

// A model without tensor-parallel layers on a topology with tp > 1 would train each rank alone.
TEST(TensorParallelTraining, WholeModelOnATensorAxisIsRefused) {
  auto w = comm::world();
  if (w->size() == 1) GTEST_SKIP() << "needs 2 or more ranks";
  auto topo = std::make_shared<comm::Topology>(w, w->size(), 1);
  runtime::InitOptions opt;
  opt.topology = topo;
  opt.log = [](const std::string&) {};
  try {
    runtime::initialize(std::make_shared<models::GPT>(model_config("gpt2", w->size())),
                        engine_config(0, 2, 0.0, w->size()), opt);
    ADD_FAILURE() << "not refused";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("no tensor-parallel layers"), std::string::npos)
        << err.what();
  }
}

// ---- checkpoints: written at one (dp, tp), loaded at another ----

namespace {

// An engine at tensor-parallel size `tp` over `world` (the rest data-parallel), for a global
// micro-batch of `global_micro` samples.
std::unique_ptr<runtime::Engine> tp_engine(const models::GPTConfig& c, int stage, int tp,
                                           std::shared_ptr<comm::Group> world, int64_t global_micro,
                                           bool bf16) {
  auto topo = std::make_shared<comm::Topology>(world, tp, /*pp=*/1);
  const int dp = topo->data_parallel()->size();
  runtime::InitOptions opt;
  opt.topology = topo;
  opt.log = [](const std::string&) {};
  auto model = tp > 1 ? std::make_shared<models::GPT>(
                            c, std::make_shared<nn::TensorParallel>(topo->tensor_parallel()))
                      : std::make_shared<models::GPT>(c);
  return runtime::initialize(model, engine_config(stage, global_micro / dp, 0.05, tp, bf16), opt);
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Rewrites one JSON metadata entry of a checkpoint file and its checksum.
void rewrite_metadata(const fs::path& file, const std::string& key,
                      const std::function<void(nlohmann::json&)>& mutate) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::map<std::string, std::string> meta;
  {
    safetensors::Reader r(file.string());
    for (const auto& n : r.names()) tensors.emplace_back(n, r.get(n));
    meta = r.metadata();
  }
  nlohmann::json j = nlohmann::json::parse(meta.at(key));
  mutate(j);
  meta[key] = j.dump();
  safetensors::save(file.string(), tensors, meta);
  const fs::path sums_path = file.parent_path() / "checksums.json";
  nlohmann::json sums = nlohmann::json::parse(std::ifstream(sums_path));
  std::ifstream in(file, std::ios::binary);
  const std::string bytes{std::istreambuf_iterator<char>(in), {}};
  sums[file.filename().string()] = {
      {"bytes", bytes.size()},
      {"xxh64", fmt::format("{:016x}", xxh64(bytes.data(), bytes.size()))}};
  std::ofstream(sums_path) << sums.dump(2);
}

}  // namespace

class TensorParallelCheckpoint : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

// Saved at tp = 2 (x dp = 2 with 4 ranks) after 3 steps; 3 more steps continued in the same run
// are the reference. Resumed at the same layout: bitwise equal. At tp = 1 on every rank (ZeRO
// stage as written, and 3), at tp = 4 (4 ranks) and in one process: equal within fp32 tolerance,
// not bitwise: the state is restored exactly, but the matrix products and the loss are then
// summed in another order (a row-parallel product adds tp partial sums; the data-parallel mean
// adds dp partial gradients). Every layout's loaded weights, gathered, are the saved ones bit for
// bit. bf16: the same, with losses within 1e-2 at other layouts (a weight updated from a
// differently rounded gradient can land one bf16 step, 2^-8 relative, away).
TEST_P(TensorParallelCheckpoint, ResumesAtAnyLayout) {
  const int stage = std::get<0>(GetParam());
  const bool bf16 = std::get<1>(GetParam()) == "bf16";
  auto w = comm::world();
  const int n = w->size();
  if (n == 1) GTEST_SKIP() << "writes a tp = 2 checkpoint: runs under mpirun with 2 and 4 ranks";
  const models::GPTConfig c = model_config("gpt2", 2);
  const int64_t global_micro = 2 * (n / 2);  // 2 samples per data rank at tp = 2
  const fs::path dir = fs::temp_directory_path() /
                       fmt::format("ds_tp_ckpt_{}_{}_{}", stage, std::get<1>(GetParam()), n);
  if (w->rank() == 0) fs::remove_all(dir);
  w->barrier();
  constexpr int kBefore = 3, kAfter = 3;
  std::vector<double> continued;
  std::vector<std::pair<std::string, Tensor>> saved;  // gathered whole weights at the save
  {
    auto e = tp_engine(c, stage, 2, w, global_micro, bf16);
    train(*e, kBefore, c.vocab_size);
    e->save_checkpoint(dir.string(), "", {{"note", "tp2"}});
    for (auto& [name, t] : e->full_weights()) saved.emplace_back(name, t.clone());  // not views
    continued = train(*e, kAfter, c.vocab_size, kBefore);
  }
  const fs::path ck = dir / fmt::format("global_step{}", kBefore);
  // Every model-parallel rank wrote its part; each data rank its optimizer shard.
  EXPECT_TRUE(fs::exists(ck / "mp_rank_00_model_states.safetensors"));
  EXPECT_TRUE(fs::exists(ck / "mp_rank_01_model_states.safetensors"));
  const std::string prefix = bf16 ? "bf16_" : "";
  EXPECT_TRUE(fs::exists(ck / (prefix + "zero_pp_rank_0_mp_rank_01_optim_states.safetensors")));
  if (n == 4 && stage > 0)
    EXPECT_TRUE(fs::exists(ck / (prefix + "zero_pp_rank_1_mp_rank_01_optim_states.safetensors")));

  auto resume = [&](const std::string& what, runtime::Engine& e, bool bitwise) {
    SCOPED_TRACE(fmt::format("stage {}, {} ranks, resumed at {}", stage, n, what));
    const nlohmann::json client = e.load_checkpoint(dir.string());
    EXPECT_EQ(client.value("note", ""), "tp2");
    EXPECT_EQ(e.global_steps(), kBefore);
    // The weights as loaded (gathered; under ZeRO-3 on the first data rank only, at the save and
    // at the load) are the saved ones exactly.
    const auto loaded = e.full_weights();
    if (!loaded.empty() && !saved.empty()) {
      ASSERT_EQ(loaded.size(), saved.size());
      for (size_t i = 0; i < saved.size(); ++i) {
        ASSERT_EQ(loaded[i].first, saved[i].first);
        EXPECT_EQ(max_diff(loaded[i].second, saved[i].second), 0.0) << saved[i].first;
      }
    }
    const auto got = train(e, kAfter, c.vocab_size, kBefore);
    ASSERT_EQ(got.size(), continued.size());
    for (size_t i = 0; i < got.size(); ++i) {
      if (bitwise) {
        EXPECT_EQ(got[i], continued[i]) << "micro-step " << i;
      } else {
        EXPECT_NEAR(got[i], continued[i], (bf16 ? 1e-2 : 1e-5) * std::abs(continued[i]))
            << "micro-step " << i;
      }
    }
  };
  resume("the same layout", *tp_engine(c, stage, 2, w, global_micro, bf16), true);
  resume(fmt::format("tp 1 x dp {}", n), *tp_engine(c, stage, 1, w, global_micro, bf16), false);
  if (n == 4) resume("tp 4", *tp_engine(c, stage, 4, w, global_micro, bf16), false);
  // ZeRO-3 (tp = 1 only): every parameter cut into pieces over the data ranks.
  resume(fmt::format("tp 1 x dp {}, ZeRO-3", n), *tp_engine(c, 3, 1, w, global_micro, bf16), false);

  if (w->rank() == 0) {
    resume("one process", *tp_engine(c, stage, 1, comm::single_process_group(), global_micro, bf16),
           false);

    // ds_to_fp32: the whole model, equal to the weights gathered at the save (fp32 training: the
    // master weights are the weights; bf16: their rounding).
    runtime::CheckpointShards shards(dir);
    EXPECT_EQ(shards.tensor_parallel(), 2);
    const auto whole = shards.weights(bf16 ? DType::bf16 : DType::f32);
    ASSERT_EQ(whole.size(), saved.size());
    for (size_t i = 0; i < saved.size(); ++i) {
      ASSERT_EQ(whole[i].first, saved[i].first);
      ASSERT_EQ(whole[i].second.shape(), saved[i].second.shape()) << saved[i].first;
      EXPECT_EQ(max_diff(whole[i].second, saved[i].second), 0.0) << saved[i].first;
    }

    // Damaged checkpoints: each error names the file and the parameter or part.
    auto broken = [&](const std::string& name) {
      const fs::path b = dir / name;
      fs::copy(ck, b, fs::copy_options::recursive);
      return b;
    };
    auto load_error = [&](const fs::path& folder) {
      auto e = tp_engine(c, stage, 1, comm::single_process_group(), global_micro, bf16);
      return error_of(
          [&] { e->load_checkpoint(folder.parent_path().string(), folder.filename().string()); });
    };
    {  // part 1 says it holds rows that part 0 holds (shifted by one in each q, k, v block)
      const fs::path b = broken("overlap");
      rewrite_metadata(b / "mp_rank_01_model_states.safetensors", "ds_slices",
                       [](nlohmann::json& j) {
                         auto& s = j["h.0.attn.c_attn.weight"];
                         s["begin"] = s["begin"].get<int64_t>() - 1;
                         s["end"] = s["end"].get<int64_t>() - 1;
                       });
      const std::string err = load_error(b);
      EXPECT_NE(err.find("h.0.attn.c_attn.weight"), std::string::npos) << err;
      EXPECT_NE(err.find("mp_rank_01_model_states.safetensors"), std::string::npos) << err;
      EXPECT_NE(err.find("overlap"), std::string::npos) << err;
    }
    {  // the optimizer shard of part 1 (the last data rank's) is gone
      const fs::path b = broken("no_shard");
      const int last = stage > 0 ? n / 2 - 1 : 0;
      const std::string f =
          fmt::format("{}zero_pp_rank_{}_mp_rank_01_optim_states.safetensors", prefix, last);
      fs::remove(b / f);
      std::string err = load_error(b);
      EXPECT_NE(err.find(f + " is missing"), std::string::npos) << err;
      err = error_of([&] { runtime::CheckpointShards bad(b); });
      EXPECT_NE(err.find(f), std::string::npos) << err;
    }
    {  // a model part is gone
      const fs::path b = broken("no_part");
      fs::remove(b / "mp_rank_01_model_states.safetensors");
      const std::string err = load_error(b);
      EXPECT_NE(err.find("mp_rank_01_model_states.safetensors is missing"), std::string::npos)
          << err;
    }
    {  // a cut parameter whose part says it holds less than its tensor
      const fs::path b = broken("short");
      rewrite_metadata(b / (prefix + "zero_pp_rank_0_mp_rank_01_optim_states.safetensors"),
                       "ds_optimizer", [](nlohmann::json& j) {
                         for (size_t i = 0; i < j["param_names"].size(); ++i)
                           if (j["param_names"][i] == "h.0.mlp.c_fc.weight")
                             j["param_slices"][i]["end"] =
                                 j["param_slices"][i]["end"].get<int64_t>() - 1;
                       });
      const std::string err = load_error(b);
      EXPECT_NE(err.find("h.0.mlp.c_fc.weight"), std::string::npos) << err;
      EXPECT_NE(err.find("zero_pp_rank_0_mp_rank_01_optim_states.safetensors"), std::string::npos)
          << err;
    }
  }
  w->barrier();
  if (w->rank() == 0) fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(StagesAndPrecisions, TensorParallelCheckpoint,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3),
                                            ::testing::Values("fp32", "bf16")),
                         [](const auto& info) {
                           return fmt::format("stage{}_{}", std::get<0>(info.param),
                                              std::get<1>(info.param));
                         });

// One K/V head shared by every tensor-parallel rank (tp = N, N = 2 or 4, each data rank ZeRO-1,
// and tp = 2 x dp = 2 under ZeRO-3 with 4 ranks): each part file holds the head, the loaders take
// it once. Loaded in one process, at tp = 1 x dp = N under ZeRO-3 and (4 ranks) at tp = 2 the
// weights are the saved ones bit for bit and the next losses continue the run within 1e-5.
TEST(TensorParallelCheckpoint, SharedKVHeadsLoadAtAnyLayout) {
  auto w = comm::world();
  const int n = w->size();
  if (n == 1)
    GTEST_SKIP() << "shares a K/V head over tp ranks: runs under mpirun with 2 and 4 ranks";
  const models::GPTConfig c = model_config("llama_kv1", n);
  const int64_t global_micro = 4;
  std::vector<std::pair<int, int>> saves = {{1, n}};  // (ZeRO stage, tp)
  if (n == 4) saves.emplace_back(3, 2);
  for (const auto& [stage, tp] : saves) {
    const fs::path dir =
        fs::temp_directory_path() / fmt::format("ds_tp_kv1_{}_{}_{}", stage, tp, n);
    if (w->rank() == 0) fs::remove_all(dir);
    w->barrier();
    std::vector<std::pair<std::string, Tensor>> saved;
    std::vector<double> continued;
    {
      auto e = tp_engine(c, stage, tp, w, global_micro, false);
      train(*e, 2, c.vocab_size);
      e->save_checkpoint(dir.string());
      for (auto& [name, t] : e->full_weights()) saved.emplace_back(name, t.clone());
      continued = train(*e, 2, c.vocab_size, 2);
    }
    auto resume = [&](const std::string& what, runtime::Engine& e) {
      SCOPED_TRACE(fmt::format("saved at ZeRO {} tp {} of {}, loaded at {}", stage, tp, n, what));
      e.load_checkpoint(dir.string());
      const auto loaded = e.full_weights();
      if (!loaded.empty() && !saved.empty()) {
        ASSERT_EQ(loaded.size(), saved.size());
        for (size_t i = 0; i < saved.size(); ++i) {
          ASSERT_EQ(loaded[i].second.shape(), saved[i].second.shape()) << saved[i].first;
          EXPECT_EQ(max_diff(loaded[i].second, saved[i].second), 0.0) << saved[i].first;
        }
      }
      const auto got = train(e, 2, c.vocab_size, 2);
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_NEAR(got[i], continued[i], 1e-5 * std::abs(continued[i])) << "micro-step " << i;
    };
    resume("the same layout", *tp_engine(c, stage, tp, w, global_micro, false));
    resume(fmt::format("tp 1 x dp {}, ZeRO-3", n), *tp_engine(c, 3, 1, w, global_micro, false));
    if (n == 4) resume("tp 2, ZeRO-1", *tp_engine(c, 1, 2, w, global_micro, false));
    if (w->rank() == 0) {
      resume("one process", *tp_engine(c, 1, 1, comm::single_process_group(), global_micro, false));
      // ds_to_fp32 takes the shared head once.
      const auto whole = runtime::CheckpointShards(dir).weights(DType::f32);
      ASSERT_EQ(whole.size(), saved.size());
      for (size_t i = 0; i < saved.size(); ++i) {
        ASSERT_EQ(whole[i].second.shape(), saved[i].second.shape()) << saved[i].first;
        EXPECT_EQ(max_diff(whole[i].second, saved[i].second), 0.0) << saved[i].first;
      }
    }
    w->barrier();
    if (w->rank() == 0) fs::remove_all(dir);
  }
}

// The slice arithmetic alone (one process): tensor-parallel parts and pipeline-stage parts of the
// same whole parameters, keyed by name.
TEST(CheckpointSlices, RunsAndSourcesForAnyLayout) {
  using runtime::detail::Slice;
  // GPT-2's fused q, k, v (3 blocks of 4 rows, 2 columns) cut over 2 ranks: rank 1 holds rows
  // [2, 4) of each block, i.e. whole rows 2-3, 6-7 and 10-11.
  const Slice whole = Slice::whole({12, 2});
  const Slice r1{{12, 2}, 0, 3, 2, 4};
  EXPECT_EQ(r1.local_shape(), (Shape{6, 2}));
  auto runs = runtime::detail::overlap_runs(r1, whole);
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[1].src, 4);
  EXPECT_EQ(runs[1].dst, 12);
  EXPECT_EQ(runs[1].len, 4);
  // A column cut (row-parallel weight) read by a rank of another tp: one run per row.
  const Slice cols2{{3, 8}, 1, 1, 4, 8}, cols4{{3, 8}, 1, 1, 2, 4};
  runs = runtime::detail::overlap_runs(cols2, cols4);
  EXPECT_TRUE(runs.empty());
  const Slice cols4b{{3, 8}, 1, 1, 4, 6};
  runs = runtime::detail::overlap_runs(cols2, cols4b);
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[2].src, 8);
  EXPECT_EQ(runs[2].dst, 4);
  EXPECT_EQ(runs[2].len, 2);

  // Pipeline stages x tp = 2: stage 0 holds the embedding and block 0, stage 1 block 1 and the
  // tied embedding again (DeepSpeed's tied module on both ends); norms whole on each tp rank.
  auto part = [](const std::string& file, std::map<std::string, Slice> s) {
    return runtime::detail::PartIndex{file, std::move(s)};
  };
  const Slice wte0{{10, 4}, 0, 1, 0, 5}, wte1{{10, 4}, 0, 1, 5, 10};
  const Slice ln = Slice::whole({4});
  std::vector<runtime::detail::PartIndex> parts = {
      part("mp_rank_00", {{"wte", wte0}, {"h.0.ln", ln}}),
      part("mp_rank_01", {{"wte", wte1}, {"h.0.ln", ln}}),
      part("mp_rank_02", {{"wte", wte0}, {"h.1.ln", ln}}),
      part("mp_rank_03", {{"wte", wte1}, {"h.1.ln", ln}}),
  };
  auto sources = runtime::detail::plan_sources(parts, "ck", "[checkpoint]");
  ASSERT_EQ(sources.at("wte").size(), 2u);  // one copy of each distinct slice
  EXPECT_EQ(sources.at("wte")[1].part, 1u);
  ASSERT_EQ(sources.at("h.1.ln").size(), 1u);
  EXPECT_EQ(sources.at("h.1.ln")[0].part, 2u);
  // A missing slice names the parameter and what is there.
  parts[1].slices.erase("wte");
  parts[3].slices.erase("wte");
  const std::string err =
      error_of([&] { runtime::detail::plan_sources(parts, "ck", "[checkpoint]"); });
  EXPECT_NE(err.find("parameter wte"), std::string::npos) << err;
  EXPECT_NE(err.find("mp_rank_00"), std::string::npos) << err;
  EXPECT_NE(err.find("20 of its 40 elements"), std::string::npos) << err;
}

// Tensor parallelism (ds/nn/tensor_parallel.h): a model cut over tp ranks is the whole model.
// Run plainly (tp = 1) and under mpirun with 2 and 4 ranks (tests/cmake/parallel3d.cmake): every
// rank also builds the whole model itself and compares.
//   - gradients of every part equal the matching slice of the whole model's gradients, and the
//     loss equals the whole model's (GPT-2 with an odd vocabulary and a tied head; LLaMA with
//     grouped-query attention, q/k/v biases and an untied head);
//   - training with the engine (ZeRO 0-2 on the data axis, gradient clipping on so that the norm
//     over the cut and whole parameters is used) gives one process's losses for tp = N and for
//     tp = 2 x dp = 2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "ds/comm/group.h"
#include "ds/comm/topology.h"
#include "ds/core/error.h"
#include "ds/models/gpt.h"
#include "ds/nn/tensor_parallel.h"
#include "ds/ops/ops.h"
#include "ds/runtime/config.h"
#include "ds/runtime/engine.h"

#include <nlohmann/json.hpp>

using namespace ds;

namespace {

constexpr int64_t kT = 16, kGas = 2;

models::GPTConfig model_config(const std::string& layout, int tp) {
  models::GPTConfig c = models::GPTConfig::preset(layout == "gpt2" ? "test-gpt2" : "test-llama");
  c.seed = 7;
  if (layout == "gpt2") {
    c.vocab_size = 97;  // odd: the vocabulary's last part is shorter
  } else {
    c.vocab_size = 101;
    c.n_kv_head = tp <= 2 ? 2 : 4;  // grouped-query attention where the KV heads can be cut
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

INSTANTIATE_TEST_SUITE_P(Layouts, TensorParallelModel, ::testing::Values("gpt2", "llama"));

namespace {

std::string engine_config(int stage, int64_t micro, double clip, int tp = 1) {
  return fmt::format(R"({{"train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": {},
    "gradient_clipping": {}, "zero_optimization": {{"stage": {}, "reduce_bucket_size": 4000}},
    "tensor_parallel": {{"autotp_size": {}}},
    "optimizer": {{"type": "AdamW", "params": {{"lr": 5e-3, "weight_decay": 0.1}}}}}})",
                     micro, kGas, clip, stage, tp);
}

// `steps` optimizer steps; the mean loss of every micro-step over the data-parallel group. Data
// rank d of D takes samples [base + d*B, +B) of each global micro-batch; tp ranks share theirs.
std::vector<double> train(runtime::Engine& e, int steps, int64_t vocab) {
  const int dp = e.world_size(), d = e.rank();
  const int64_t b = e.config().batch.train_micro_batch_size_per_gpu;
  std::vector<double> losses;
  for (int64_t s = 0; s < steps; ++s)
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
  for (const std::string layout : {"gpt2", "llama"}) {
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
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i])) << "micro-step " << i;
      EXPECT_NEAR(e->last_grad_norm(), ref->last_grad_norm(),
                  1e-4 * ref->last_grad_norm());
      // The gathered weights (for export) are the one-process model's, with the whole shapes.
      const auto gathered = e->full_weights(), whole = ref->full_weights();
      ASSERT_EQ(gathered.size(), whole.size());
      for (size_t i = 0; i < whole.size(); ++i) {
        ASSERT_EQ(gathered[i].first, whole[i].first);
        ASSERT_EQ(gathered[i].second.shape(), whole[i].second.shape()) << whole[i].first;
        EXPECT_LE(max_diff(gathered[i].second, whole[i].second),
                  1e-4 * std::max(1.0, max_abs(whole[i].second)))
            << whole[i].first;
      }
      if (t > 1) {
        try {
          e->save_checkpoint("/nonexistent", "x");
          ADD_FAILURE() << "a tensor-parallel checkpoint was not refused";
        } catch (const Error& err) {
          EXPECT_NE(std::string(err.what()).find("not implemented yet"), std::string::npos);
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, TensorParallelTraining, ::testing::Values(0, 1, 2));

// The config's tensor_parallel.autotp_size and the topology must agree.
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
  EXPECT_THROW(runtime::parse_config_json(nlohmann::json::parse(
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

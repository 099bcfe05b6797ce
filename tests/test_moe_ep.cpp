// Expert parallelism (nn/expert_parallel.h; docs/parallelism.md, "Expert parallelism"): run
// plainly (a size-1 world: only the one-process checks) and under mpirun with 2 and 4 ranks
// (tests/cmake/models.cmake). A random 2-layer MoE decoder (4 experts, top-2) trains on a global
// batch of 4 rows, each rank taking its rows; every run must equal one process taking the whole
// batch (every row has the same number of targets, so the mean of the ranks' mean losses is the
// batch's mean): losses and every weight after 10 steps, at each expert-parallel size that divides
// the world and each ZeRO stage. A router that sends every token to experts 0 and 1 leaves the
// ranks holding experts 2 and 3 without a row: nothing may stall (ZeRO-3's gathers and
// reductions of their weights included). Checkpoints written at one expert-parallel size load at
// another and in one process, and ds_to_fp32 assembles the whole experts.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <numeric>
#include <random>

#include <unistd.h>

#include "ds/comm/group.h"
#include "ds/models/gpt.h"
#include "ds/nn/batch.h"
#include "ds/nn/expert_parallel.h"
#include "ds/nn/moe.h"
#include "ds/ops/ops.h"
#include "ds/runtime/consolidate.h"
#include "ds/runtime/engine.h"
#include "ds/runtime/pipeline_engine.h"
#include "ds/runtime/pipeline_partition.h"
#include "ds/comm/topology.h"
#include "ds/config/config.h"

using namespace ds;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kRows = 4, kT = 8, kV = 64;

models::GPTConfig moe_config() {
  models::GPTConfig c;
  c.layout = nn::Layout::llama;
  c.vocab_size = kV;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  c.bias = false;
  c.tie_embeddings = false;
  c.norm_eps = 1e-6f;
  c.num_experts = 4;
  c.experts_per_tok = 2;
  c.ffn_hidden = 48;  // Mixtral's experts are ffn_hidden wide
  c.seed = 7;
  c.family = "mixtral";
  return c;
}

// The global batch: kRows rows of kT random ids, targets the next id (all counted).
std::pair<Tensor, Tensor> global_batch() {
  std::mt19937 rng(123);
  std::vector<int64_t> ids(kRows * (kT + 1));
  for (auto& v : ids) v = static_cast<int64_t>(rng() % kV);
  std::vector<int64_t> in, out;
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t t = 0; t < kT; ++t) {
      in.push_back(ids[static_cast<size_t>(r * (kT + 1) + t)]);
      out.push_back(ids[static_cast<size_t>(r * (kT + 1) + t + 1)]);
    }
  return {Tensor::from_ints(in, {kRows, kT}), Tensor::from_ints(out, {kRows, kT})};
}

// A copy of t in fp32 (stages 0-2 hand out the model's own tensors, which later steps change).
Tensor owned(const Tensor& t) {
  Tensor out = Tensor::empty(t.shape(), DType::f32);
  out.copy_from(t.to(DType::f32));
  return out;
}

struct RunSpec {
  int stage = 0;
  int ep = 1;
  bool uniform_router = false;  // every token to experts 0 and 1
  int steps = 10;
};

std::shared_ptr<models::GPT> make_model(bool uniform_router) {
  auto m = std::make_shared<models::GPT>(moe_config());
  if (uniform_router)
    for (const auto& [name, p] : m->named_parameters())
      if (name.find("mlp.gate.weight") != std::string::npos) p.zero_();
  return m;
}

std::unique_ptr<runtime::Engine> make_engine(std::shared_ptr<comm::Group> g, const RunSpec& s) {
  runtime::InitOptions opt;
  opt.group = g;
  opt.log = [](const std::string&) {};
  const int64_t b = kRows / g->size();
  return runtime::initialize(
      make_model(s.uniform_router),
      fmt::format(R"({{"train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": 1,
        "optimizer": {{"type": "AdamW", "params": {{"lr": {}, "weight_decay": 0.1}}}},
        "zero_optimization": {{"stage": {}, "stage3_param_persistence_threshold": 0,
                               "reduce_bucket_size": 1000}},
        "expert_parallel": {{"enabled": {}, "autoep_size": {}}}}})",
                  b, s.uniform_router ? 1e-4 : 1e-3, s.stage, s.ep > 1 ? "true" : "false", s.ep),
      opt);
}

nn::Batch rank_batch(const comm::Group& g) {
  const auto [ids, targets] = global_batch();
  const int64_t b = kRows / g.size(), r = g.rank();
  return nn::Batch{.input_ids = ops::slice(ids, 0, r * b, (r + 1) * b).contiguous(),
                   .labels = ops::slice(targets, 0, r * b, (r + 1) * b).contiguous()};
}

// The world's mean loss of one step.
double train_step(runtime::Engine& e, comm::Group& g, const nn::Batch& batch) {
  Tensor loss = e.forward(batch);
  e.backward(loss);
  e.step();
  float l = loss.item();
  g.all_reduce(&l, 1, DType::f32);
  return static_cast<double>(l) / g.size();
}

struct Trained {
  std::vector<double> losses;
  std::map<std::string, Tensor> weights;  // whole, fp32 (rank 0 only under ZeRO-3)
};

Trained train(std::shared_ptr<comm::Group> g, const RunSpec& s) {
  auto e = make_engine(g, s);
  if (s.ep > 1) {
    // The experts are split: each rank holds E / ep rows of every stacked expert weight.
    const auto splits = nn::expert_splits(*e->module_ptr());
    EXPECT_EQ(splits.size(), 4u);  // gate_up_proj and down_proj of 2 layers
    const int r = e->rank() % s.ep;
    for (const auto& [name, sp] : splits) {
      EXPECT_EQ(sp.full, 4);
      EXPECT_EQ(sp.begin, r * 4 / s.ep) << name;
      EXPECT_EQ(sp.end, (r + 1) * 4 / s.ep) << name;
    }
  }
  const nn::Batch batch = rank_batch(*g);
  Trained run;
  for (int i = 0; i < s.steps; ++i) run.losses.push_back(train_step(*e, *g, batch));
  for (auto& [name, t] : e->full_weights()) run.weights[name] = owned(t);
  return run;
}

double max_diff(const Tensor& a, const Tensor& b) {
  const Tensor x = a.contiguous(), y = b.contiguous();
  double d = 0;
  for (int64_t i = 0; i < x.numel(); ++i)
    d = std::max(d, std::abs(static_cast<double>(x.data<float>()[i] - y.data<float>()[i])));
  return d;
}

// Returns the largest weight difference (0 when got holds no weights).
double expect_equal(const Trained& got, const Trained& want, double tol, const std::string& what) {
  EXPECT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t i = 0; i < std::min(got.losses.size(), want.losses.size()); ++i)
    EXPECT_NEAR(got.losses[i], want.losses[i], tol * std::max(1.0, std::abs(want.losses[i])))
        << what << " step " << i;
  if (got.weights.empty()) return 0;  // ZeRO-3 gives the whole weights to data rank 0 only
  EXPECT_EQ(got.weights.size(), want.weights.size()) << what;
  double worst = 0;
  std::string where;
  for (const auto& [name, w] : want.weights) {
    if (!got.weights.count(name) || got.weights.at(name).shape() != w.shape()) {
      ADD_FAILURE() << what << ": " << name << " missing or of another shape";
      continue;
    }
    const double d = max_diff(got.weights.at(name), w);
    if (d > worst) worst = d, where = name;
  }
  EXPECT_LE(worst, tol) << what << ": worst weight " << where;
  return worst;
}

std::vector<int> ep_sizes(int world) {
  std::vector<int> out;
  for (int ep : {1, 2, 4})
    if (ep <= world && world % ep == 0) out.push_back(ep);
  return out;
}

fs::path shared_dir(comm::Group& g, const std::string& name) {
  // Every rank uses the same folder (rank 0's pid names it).
  int64_t pid = g.rank() == 0 ? static_cast<int64_t>(::getpid()) : 0;
  g.broadcast(&pid, 1, DType::i64, 0);
  return fs::temp_directory_path() / fmt::format("ds_moe_ep_{}_{}", name, pid);
}

}  // namespace

TEST(ExpertParallel, AllToAllRowsRoundTripsAndItsGradientGoesBack) {
  auto world = comm::world();
  const int n = world->size(), r = world->rank();
  // Rank r sends j + r + 1 rows to rank j (each row r * 100 + j); recv from s: r + s + 1.
  std::vector<int64_t> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
  std::vector<float> rows;
  for (int j = 0; j < n; ++j) {
    send[static_cast<size_t>(j)] = j + r + 1;
    recv[static_cast<size_t>(j)] = r + j + 1;
    for (int k = 0; k < j + r + 1; ++k) rows.insert(rows.end(), {float(r * 100 + j), float(k)});
  }
  const int64_t M = static_cast<int64_t>(rows.size() / 2);
  Tensor x = Tensor::from_data(rows, {M, 2});
  x.set_requires_grad(true);
  Tensor y = nn::all_to_all_rows(x, send, recv, world, "test");
  int64_t at = 0;
  for (int s = 0; s < n; ++s)
    for (int k = 0; k < r + s + 1; ++k, ++at) {
      EXPECT_EQ(y.data<float>()[at * 2], float(s * 100 + r));
      EXPECT_EQ(y.data<float>()[at * 2 + 1], float(k));
    }
  // The gradient of sum(y * y) comes back to the rows it came from: 2 x.
  ops::sum(ops::mul(y, y)).backward();
  for (int64_t i = 0; i < M * 2; ++i) EXPECT_EQ(x.grad().data<float>()[i], 2 * rows[static_cast<size_t>(i)]);
}

TEST(ExpertParallel, EqualsOneProcessAtEveryZeroStage) {
  auto world = comm::world();
  const auto sizes = ep_sizes(world->size());
  if (sizes.empty()) GTEST_SKIP() << "run with 2 or 4 ranks (mpirun)";
  for (int stage : {0, 1, 2, 3}) {
    const Trained want = train(comm::single_process_group(), {.stage = stage});
    for (int ep : sizes) {
      const Trained got = train(world, {.stage = stage, .ep = ep});
      const double worst = expect_equal(got, want, 2e-6, fmt::format("ZeRO {} ep {}", stage, ep));
      if (world->rank() == 0)
        std::printf("ZeRO %d, %d ranks, ep %d: loss %.6f -> %.6f (one process %.6f -> %.6f), "
                    "largest weight difference after %zu steps %.2e\n",
                    stage, world->size(), ep, got.losses.front(), got.losses.back(),
                    want.losses.front(), want.losses.back(), got.losses.size(), worst);
    }
  }
}

TEST(ExpertParallel, ExpertsWithoutTokensNeverStall) {
  auto world = comm::world();
  const auto sizes = ep_sizes(world->size());
  if (sizes.empty()) GTEST_SKIP() << "run with 2 or 4 ranks (mpirun)";
  {
    // The premise: a zero router sends every token to experts 0 and 1 (equal probabilities go to
    // the lower index, as torch.topk), so the expert-parallel ranks holding 2 and 3 get nothing.
    nn::BlockConfig bc;
    bc.layout = nn::Layout::llama;
    bc.n_embd = 32;
    bc.n_head = 2;
    bc.bias = false;
    bc.num_experts = 4;
    bc.experts_per_tok = 2;
    bc.moe_ffn_hidden = 48;
    bc.router_log = std::make_shared<nn::RouterLog>();
    bc.router_log->enabled = true;
    nn::MoEMLP mlp(bc);
    for (const auto& [name, p] : mlp.named_parameters())
      if (name == "gate.weight") p.zero_();
    std::mt19937 rng(5);
    std::normal_distribution<float> normal;
    std::vector<float> x(2 * kT * 32);
    for (auto& v : x) v = normal(rng);
    (void)mlp(Tensor::from_data(x, {2, kT, 32}));
    ASSERT_EQ(bc.router_log->counts.size(), 4u);
    EXPECT_EQ(bc.router_log->counts[0], 2 * kT);
    EXPECT_EQ(bc.router_log->counts[1], 2 * kT);
    EXPECT_EQ(bc.router_log->counts[2] + bc.router_log->counts[3], 0);
  }
  for (int stage : {0, 3}) {
    const RunSpec s{.stage = stage, .uniform_router = true, .steps = 3};
    RunSpec one = s;
    const Trained want = train(comm::single_process_group(), one);
    for (int ep : sizes) {
      RunSpec e = s;
      e.ep = ep;
      expect_equal(train(world, e), want, 2e-6, fmt::format("empty experts, ZeRO {} ep {}", stage, ep));
    }
  }
}

TEST(ExpertParallel, CheckpointsLoadAtAnyExpertParallelSize) {
  auto world = comm::world();
  if (world->size() < 2) GTEST_SKIP() << "run with 2 or 4 ranks (mpirun)";
  const int N = world->size();
  for (int stage : {1, 3}) {
    const fs::path dir = shared_dir(*world, fmt::format("ckpt{}", stage));
    // Save after 3 steps at ep 2, then 3 more steps: the reference.
    const RunSpec s{.stage = stage, .ep = 2};
    auto e = make_engine(world, s);
    const nn::Batch batch = rank_batch(*world);
    for (int i = 0; i < 3; ++i) train_step(*e, *world, batch);
    e->save_checkpoint(dir.string());
    std::map<std::string, Tensor> saved;
    for (auto& [name, t] : e->full_weights()) saved[name] = owned(t);
    std::vector<double> after;
    for (int i = 0; i < 3; ++i) after.push_back(train_step(*e, *world, batch));
    e.reset();
    if (world->rank() == 0) {
      const fs::path tag = dir / "global_step3";
      EXPECT_TRUE(fs::exists(tag / "mp_rank_00_model_states.safetensors"));
      EXPECT_TRUE(fs::exists(tag / "expp_rank_1_mp_rank_00_model_states.safetensors"));
      // ds_to_fp32's whole weights are the run's (fp32 master = weights in fp32 training).
      runtime::CheckpointShards shards(tag);
      EXPECT_EQ(shards.expert_parallel(), 2);
      for (auto& [name, t] : shards.weights(DType::f32)) {
        ASSERT_TRUE(saved.count(name)) << name;
        ASSERT_EQ(t.shape(), saved.at(name).shape()) << name;
        EXPECT_EQ(max_diff(t, saved.at(name)), 0.0) << name;
      }
    }
    // Resume at every other layout: ep 1 over the world, ep 4 (4 ranks), one process.
    std::vector<std::pair<std::shared_ptr<comm::Group>, int>> layouts = {{world, 1}};
    if (N % 4 == 0) layouts.push_back({world, 4});
    for (auto [g, ep] : layouts) {
      auto r = make_engine(g, {.stage = stage, .ep = ep});
      r->load_checkpoint(dir.string());
      const nn::Batch b = rank_batch(*g);
      for (int i = 0; i < 3; ++i)
        EXPECT_NEAR(train_step(*r, *g, b), after[static_cast<size_t>(i)], 2e-6)
            << "ZeRO " << stage << " resumed at ep " << ep << " step " << i;
    }
    if (world->rank() == 0) {
      // One process takes the whole batch.
      auto one = comm::single_process_group();
      auto r = make_engine(one, {.stage = stage});
      r->load_checkpoint(dir.string());
      const auto [ids, targets] = global_batch();
      const nn::Batch b{.input_ids = ids, .labels = targets};
      for (int i = 0; i < 3; ++i)
        EXPECT_NEAR(train_step(*r, *one, b), after[static_cast<size_t>(i)], 2e-6)
            << "ZeRO " << stage << " resumed in one process, step " << i;
    }
    world->barrier();
    if (world->rank() == 0) fs::remove_all(dir);
  }
}

TEST(ExpertParallel, RefusesWhatItCannotDo) {
  auto world = comm::world();
  if (world->size() < 2) GTEST_SKIP() << "run with 2 or 4 ranks (mpirun)";
  runtime::InitOptions opt;
  opt.group = world;
  opt.log = [](const std::string&) {};
  const int b = static_cast<int>(kRows / world->size());
  // 3 does not divide the ranks (or 4 experts).
  EXPECT_THROW(
      {
        try {
          runtime::initialize(make_model(false),
                              fmt::format(R"({{"train_micro_batch_size_per_gpu": {},
            "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-3}}}},
            "expert_parallel": {{"enabled": true, "autoep_size": 3}}}})",
                                          b),
                              opt);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("autoep_size 3"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  // A dense model has nothing to split.
  models::GPTConfig dense = moe_config();
  dense.num_experts = 0;
  dense.family = "llama";
  EXPECT_THROW(runtime::initialize(std::make_shared<models::GPT>(dense),
                                   fmt::format(R"({{"train_micro_batch_size_per_gpu": {},
            "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-3}}}},
            "expert_parallel": {{"enabled": true, "autoep_size": 2}}}})",
                                               b),
                                   opt),
               Error);
}

// DeepSpeed MoE's token dropping (GPTConfig::moe_drop_tokens): each expert keeps at most
// max(min_capacity, ceil(k N / E x factor)) choices, first choices before second ones, each in
// token order; a dropped choice adds nothing and the kept weights are renormalised. Against a
// per-token evaluation of that rule.
TEST(TokenDropping, FollowsDeepSpeedsCapacityRule) {
  constexpr int64_t C = 8, I = 6, E = 4, K = 2, N = 10;
  nn::BlockConfig bc;
  bc.layout = nn::Layout::llama;
  bc.n_embd = C;
  bc.n_head = 2;
  bc.bias = false;
  bc.num_experts = E;
  bc.experts_per_tok = K;
  bc.moe_ffn_hidden = I;
  bc.drop_tokens = true;
  bc.capacity_factor = 0.5f;       // ceil(2 * 10 / 4 * 0.5) = 3 per expert in training
  bc.eval_capacity_factor = 10.0f;  // nothing dropped in evaluation
  bc.min_capacity = 0;
  nn::MoEMLP mlp(bc);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  std::map<std::string, std::vector<float>> w;
  for (const auto& [name, p] : mlp.named_parameters()) {
    std::vector<float> v(static_cast<size_t>(p.numel()));
    for (auto& x : v) x = normal(rng) * 0.5f;
    p.copy_from(Tensor::from_data(v, p.shape()));
    w[name] = v;
  }
  std::vector<float> x(N * C);
  for (auto& v : x) v = normal(rng);
  auto reference = [&](int64_t capacity) {
    std::vector<std::array<int64_t, K>> pick(N);
    std::vector<std::array<float, K>> prob(N);
    for (int64_t n = 0; n < N; ++n) {
      std::vector<float> logit(E);
      float mx = -1e30f, z = 0;
      for (int64_t e = 0; e < E; ++e) {
        for (int64_t c = 0; c < C; ++c) logit[e] += w["gate.weight"][e * C + c] * x[n * C + c];
        mx = std::max(mx, logit[e]);
      }
      for (auto& l : logit) z += (l = std::exp(l - mx));
      std::vector<int64_t> idx(E);
      std::iota(idx.begin(), idx.end(), 0);
      std::sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return logit[a] > logit[b]; });
      for (int64_t j = 0; j < K; ++j) pick[n][j] = idx[j], prob[n][j] = logit[idx[j]] / z;
    }
    std::vector<std::array<float, K>> keep(N);
    std::vector<int64_t> taken(E, 0);
    for (int64_t j = 0; j < K; ++j)
      for (int64_t n = 0; n < N; ++n) keep[n][j] = taken[pick[n][j]]++ < capacity ? 1.0f : 0.0f;
    std::vector<float> y(N * C, 0.0f);
    const auto& gu = w["experts.gate_up_proj"];
    const auto& dn = w["experts.down_proj"];
    for (int64_t n = 0; n < N; ++n) {
      const float denom = prob[n][0] * keep[n][0] + prob[n][1] * keep[n][1] + 1e-30f;
      for (int64_t j = 0; j < K; ++j) {
        if (!keep[n][j]) continue;
        const int64_t e = pick[n][j];
        std::vector<float> a(I);
        for (int64_t i = 0; i < I; ++i) {
          float g = 0, u = 0;
          for (int64_t c = 0; c < C; ++c) {
            g += gu[(e * 2 * I + i) * C + c] * x[n * C + c];
            u += gu[(e * 2 * I + I + i) * C + c] * x[n * C + c];
          }
          a[i] = g / (1.0f + std::exp(-g)) * u;
        }
        for (int64_t c = 0; c < C; ++c) {
          float o = 0;
          for (int64_t i = 0; i < I; ++i) o += dn[(e * C + c) * I + i] * a[i];
          y[n * C + c] += prob[n][j] * keep[n][j] / denom * o;
        }
      }
    }
    return y;
  };
  const Tensor in = Tensor::from_data(x, {1, N, C});
  for (bool training : {true, false}) {
    mlp.train(training);
    const Tensor got = mlp(in).contiguous();
    const auto want = reference(training ? 3 : 1000);
    double worst = 0;
    for (int64_t i = 0; i < N * C; ++i)
      worst = std::max(worst, std::abs(double(got.data<float>()[i]) - want[static_cast<size_t>(i)]));
    EXPECT_LE(worst, 1e-5) << (training ? "training (capacity 3)" : "evaluation (no drop)");
  }
  // Something was dropped in training: the outputs differ from the dropless evaluation.
  mlp.train(true);
  const Tensor a = mlp(in).contiguous();
  mlp.train(false);
  const Tensor b = mlp(in).contiguous();
  EXPECT_GT(max_diff(a, b), 1e-3);
}

// Expert parallelism inside pipeline stages: pp = 2 x dp = 2, each stage's experts split over its
// two data-parallel ranks (ep = 2), 2 micro-batches per step: the losses of one process taking
// the whole batch, at ZeRO 1 and 3.
TEST(ExpertParallel, InsidePipelineStages) {
  auto w = comm::world();
  if (w->size() != 4) GTEST_SKIP() << "needs mpirun with 4 ranks";
  const models::GPTConfig c = moe_config();
  constexpr int64_t kGas = 2, b = 1;  // per data rank and micro-batch; 2 data ranks
  std::vector<runtime::PipeLayer> layers;
  for (const auto& l : models::GPT::pipe_layers(c)) layers.push_back({l.type_name, l.num_parameters});
  const auto bounds = runtime::partition_layers(layers, 2, "uniform");
  const auto [ids, targets] = global_batch();  // 4 rows: kGas micro-batches x 2 data ranks
  auto config = [&](int stage, int64_t micro, int pp, int ep) {
    return fmt::format(R"({{"train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": {},
      "zero_optimization": {{"stage": {}, "stage3_param_persistence_threshold": 0}},
      "pipeline": {{"stages": {}}},
      "expert_parallel": {{"enabled": {}, "autoep_size": {}}},
      "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-3, "weight_decay": 0.1}}}}}})",
                       micro, kGas, stage, pp, ep > 1 ? "true" : "false", ep);
  };
  for (int zero : {1, 3}) {
    // One process: micro-step m takes rows [2m, 2m + 2).
    std::vector<double> want;
    {
      runtime::InitOptions one;
      one.group = comm::single_process_group();
      one.log = [](const std::string&) {};
      auto e = runtime::initialize(std::make_shared<models::GPT>(c), config(zero, 2, 1, 1), one);
      for (int s = 0; s < 5; ++s) {
        int64_t m = 0;
        want.push_back(e->train_batch([&] {
          const int64_t r0 = 2 * m++;
          return runtime::MicroBatch{
              {.input_ids = ops::slice(ids, 0, r0, r0 + 2).contiguous(),
               .labels = ops::slice(targets, 0, r0, r0 + 2).contiguous()}};
        }));
      }
    }
    auto topo = std::make_shared<comm::Topology>(w, 1, 2);
    const int st = topo->stage(), d = topo->dp_rank();
    auto stage = std::make_shared<models::GPT>(c, nullptr, models::PipeRange{bounds[st], bounds[st + 1]});
    runtime::InitOptions opt;
    opt.topology = topo;
    opt.log = [](const std::string&) {};
    runtime::PipelineEngine pipe(stage, config::parse_config(config(zero, b, 2, 2), {.world_size = 2}),
                                 opt);
    for (int s = 0; s < 5; ++s) {
      int64_t m = 0;
      const float got = pipe.train_batch([&] {
        const int64_t r0 = 2 * m++ + d;
        return runtime::PipeBatch{{.input_ids = ops::slice(ids, 0, r0, r0 + 1).contiguous(),
                                   .labels = ops::slice(targets, 0, r0, r0 + 1).contiguous()}};
      });
      EXPECT_NEAR(got, want[static_cast<size_t>(s)], 2e-6 * std::abs(want[static_cast<size_t>(s)]))
          << "ZeRO " << zero << " step " << s;
    }
  }
}

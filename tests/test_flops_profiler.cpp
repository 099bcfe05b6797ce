// The flops profiler (ds/runtime/flops_profiler.h) and the ops' FLOP counts (ds/ops/flop_count.h):
// each op's rule against its formula; a GPT's forward against 6·N·T (GPT::flops_per_token); the
// GEMM FLOPs and MACs of six Hugging Face families' forward against torch.utils.flop_counter and
// DeepSpeed's own profiler (tests/fixtures/flops/reference.json, written by tests/fixtures/generators/gen_flops_fixture.py
// from the committed hf_families models); the engine's profile step, DeepSpeed's printout and its
// output_file.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ds/autograd/grad_mode.h"
#include "ds/core/rng.h"
#include "ds/core/tensor.h"
#include "ds/models/gpt.h"
#include "ds/models/hf_io.h"
#include "ds/ops/flop_count.h"
#include "ds/ops/ops.h"
#include "ds/runtime/engine.h"
#include "ds/runtime/flops_profiler.h"

using namespace ds;
namespace fs = std::filesystem;

namespace {

// Records every report.
struct Recorder final : ops::FlopSink {
  std::map<std::string, ops::OpCost> ops;
  int calls = 0;
  void add(const char* op, const ops::OpCost& c) override {
    ops[op].flops += c.flops;
    ops[op].macs += c.macs;
    ops[op].gemm_flops += c.gemm_flops;
    ++calls;
  }
};

Tensor randn(const Shape& s, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(shape_numel(s)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = rng::normal(seed, 0, i);
  return Tensor::from_data(v, s);
}

std::string read(const fs::path& p) {
  std::ifstream f(p);
  return {std::istreambuf_iterator<char>(f), {}};
}

}  // namespace

TEST(FlopCount, EachOpCountsItsFormulaOnce) {
  Recorder r;
  {
    const ops::FlopCounting counting(&r);
    ops::linear(randn({2, 3, 8}, 1), randn({5, 8}, 2), randn({5}, 3));  // 6 rows x 8 x 5
    ops::matmul(randn({4, 6, 7}, 4), randn({7, 3}, 5));                 // 4*6*7 x 3
    const Tensor q = randn({2, 3, 5, 4}, 6), kv = randn({2, 3, 9, 4}, 7);
    ops::attention(q, kv, kv, {.causal = false});  // 2 products of 2*3*5*9*4 MACs
    ops::layer_norm(randn({3, 8}, 8), randn({8}, 9), randn({8}, 10));
    ops::add(randn({2, 1, 4}, 11), randn({3, 4}, 12));  // broadcast result (2, 3, 4)
    // linear_cross_entropy runs linears and softmaxes of its own: counted once, as its linear.
    ops::linear_cross_entropy(randn({6, 8}, 13), randn({11, 8}, 14),
                              Tensor::from_ints({1, 2, 3, 4, 5, 6}, {6}, DType::i32));
  }
  EXPECT_EQ(r.ops["linear"].macs, 6.0 * 8 * 5);
  EXPECT_EQ(r.ops["linear"].flops, 2.0 * 6 * 8 * 5);  // the bias is not counted (DeepSpeed's rule)
  EXPECT_EQ(r.ops["matmul"].macs, 4.0 * 6 * 7 * 3);
  EXPECT_EQ(r.ops["attention"].macs, 2.0 * (2 * 3 * 5 * 9 * 4));
  EXPECT_EQ(r.ops["attention"].gemm_flops, 4.0 * (2 * 3 * 5 * 9 * 4));
  EXPECT_EQ(r.ops["layer_norm"].flops, 5.0 * 24);
  EXPECT_EQ(r.ops["layer_norm"].macs, 0.0);
  EXPECT_EQ(r.ops["add"].flops, 24.0);
  EXPECT_EQ(r.ops["linear_cross_entropy"].macs, 6.0 * 8 * 11);
  EXPECT_EQ(r.calls, 6);  // nothing nested was reported
  // Nothing listens outside the scope.
  const int before = r.calls;
  ops::linear(randn({2, 8}, 1), randn({5, 8}, 2));
  EXPECT_EQ(r.calls, before);
}

TEST(FlopsProfiler, GptForwardMatchesSixNT) {
  models::GPTConfig c = models::GPTConfig::preset("test-gpt2");
  c.n_layer = 2, c.n_embd = 64, c.n_head = 4, c.vocab_size = 96, c.block_size = 32;
  c.dropout = 0;
  auto model = std::make_shared<models::GPT>(c);
  const int64_t B = 2, T = 32;
  std::vector<int64_t> ids(static_cast<size_t>(B * T));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 5) % 96);
  const Tensor x = Tensor::from_ints(ids, {B, T}, DType::i32);

  runtime::FlopsProfiler p(*model);
  p.start();
  model->loss(x, x);
  p.stop();
  const ops::OpCost total = p.total();

  // The GEMMs: every weight matrix once per token (the tied head's too), and the attention's
  // two T x T products per layer, both at 2 FLOPs per MAC.
  double matrix_params = 0;
  for (const auto& [name, t] : model->named_parameters())
    if (t.dim() == 2 && name.find("wpe") == std::string::npos) matrix_params += t.numel();
  const double attention = 2.0 * 2.0 * B * c.n_layer * T * T * c.n_embd;
  EXPECT_DOUBLE_EQ(total.gemm_flops, 2.0 * matrix_params * B * T + attention);
  // Forward + backward = 3 x forward (DeepSpeed's bwd factor 2) against 6·N·T + 12·L·C·T², the
  // formula the benchmarks use: they differ by the parameters that are not in a product (wpe,
  // norms, biases) and the elementwise ops, here within 3%.
  const double six_nt = model->flops_per_token(T) * B * T;
  EXPECT_NEAR(3.0 * total.flops / six_nt, 1.0, 0.03) << 3.0 * total.flops << " vs " << six_nt;

  // The tree: the root holds everything, each block's share is equal.
  const auto& mods = p.modules();
  ASSERT_FALSE(mods.empty());
  EXPECT_EQ(mods[0].params, model->num_parameters());
  double by_op = 0;
  for (const auto& [op, cost] : p.by_op()) by_op += cost.flops;
  EXPECT_DOUBLE_EQ(by_op, total.flops);
  std::vector<double> block_macs;
  for (size_t i = 0; i < mods.size(); ++i)
    if (mods[i].type == "GPT2Block")
      block_macs.push_back(p.subtree_cost(i).macs);
  ASSERT_EQ(block_macs.size(), static_cast<size_t>(c.n_layer));
  EXPECT_GT(block_macs[0], 0);
  EXPECT_EQ(block_macs[0], block_macs[1]);
}

TEST(FlopsProfiler, HfFamiliesMatchTorchFlopCounter) {
  const fs::path fixtures = DS_FIXTURE_DIR;
  const auto ref = nlohmann::json::parse(read(fixtures / "flops" / "reference.json"));
  ASSERT_GE(ref["cases"].size(), 6u);
  for (const auto& [name, want] : ref["cases"].items()) {
    SCOPED_TRACE(name);
    const fs::path dir = fixtures / "hf_families" / name;
    auto cfg = models::read_hf_config(dir);
    ASSERT_TRUE(cfg.has_value());
    auto model = std::make_shared<models::GPT>(*cfg, /*init=*/false);
    models::load_hf_weights(*model, dir);
    const int64_t B = want["B"], T = want["T"];
    std::vector<int64_t> ids(static_cast<size_t>(B * T));
    for (size_t i = 0; i < ids.size(); ++i)
      ids[i] = static_cast<int64_t>(i) % cfg->vocab_size;  // the script's ids
    const Tensor x = Tensor::from_ints(ids, {B, T}, DType::i32);
    autograd::NoGradGuard no_grad;
    runtime::FlopsProfiler p(*model);
    p.start();
    model->loss(x, x);
    p.stop();
    EXPECT_EQ(p.total().gemm_flops, want["flops"].get<double>());
    // DeepSpeed's own profiler on the same transformers forward: the same MACs.
    EXPECT_EQ(p.total().macs, want["deepspeed_macs"].get<double>());
  }
}

TEST(FlopsProfiler, ReportHasDeepSpeedsSections) {
  models::GPTConfig c = models::GPTConfig::preset("test-gpt2");
  auto model = std::make_shared<models::GPT>(c);
  const Tensor x = Tensor::from_ints(std::vector<int64_t>(16, 3), {2, 8}, DType::i32);
  runtime::FlopsProfiler p(*model);
  p.start();
  model->loss(x, x);
  p.stop();
  config::FlopsProfilerConfig cfg;
  cfg.module_depth = 2;
  cfg.top_modules = 2;
  runtime::ProfileRun run;
  run.fwd_seconds = p.seconds();
  run.micro_batch = 2;
  const std::string text = p.report(run, cfg);
  EXPECT_NE(text.find("Profile Summary at step 1:"), std::string::npos) << text;
  EXPECT_NE(text.find("fwd MACs per GPU:"), std::string::npos);
  EXPECT_NE(text.find("Top 2 modules in terms of params, MACs or fwd latency"), std::string::npos);
  EXPECT_NE(text.find("depth 1:"), std::string::npos);
  EXPECT_EQ(text.find("depth 2:"), std::string::npos);  // module_depth 2: depths 0 and 1
  EXPECT_NE(text.find("Detailed Profile per GPU"), std::string::npos);
  EXPECT_NE(text.find("= 100% Params"), std::string::npos);
  EXPECT_EQ(text.find("bwd latency: "), std::string::npos);  // only with wall_clock_breakdown
  // DeepSpeed's number format.
  EXPECT_EQ(runtime::profile_number(124439808), "124.44 M");
  EXPECT_EQ(runtime::profile_number(2.5e9, "MACs"), "2.5 GMACs");
  EXPECT_EQ(runtime::profile_number(0.0365, "s"), "36.5 ms");
  EXPECT_EQ(runtime::profile_number(0, "s"), "0 s");
}

TEST(FlopsProfiler, EngineProfilesTheConfiguredStepIntoOutputFile) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("ds_flops_{}", ::getpid());
  fs::remove_all(dir);
  const fs::path out = dir / "sub" / "profile.txt";
  const std::string cfg = fmt::format(R"({{
    "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
    "wall_clock_breakdown": true,
    "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-3}}}},
    "flops_profiler": {{"enabled": true, "profile_step": 2, "module_depth": -1,
                        "top_modules": 1, "detailed": true, "output_file": "{}",
                        "recompute_fwd_factor": 1.0}}
  }})",
                                      out.string());
  auto model = std::make_shared<models::GPT>(models::GPTConfig::preset("test-gpt2"));
  std::vector<std::string> log;
  runtime::InitOptions opt;
  opt.log = [&log](const std::string& s) { log.push_back(s); };
  auto engine = runtime::initialize(model, cfg, opt);
  ASSERT_NE(engine->flops_profile(), nullptr);
  const Tensor x = Tensor::from_ints(std::vector<int64_t>(16, 3), {2, 8}, DType::i32);
  for (int micro = 0; micro < 4; ++micro) {  // steps 0 and 1: nothing yet
    engine->backward(engine->forward(x, x));
    engine->step();
  }
  EXPECT_FALSE(fs::exists(out));
  engine->backward(engine->forward(x, x));  // the first micro-step at global step 2
  engine->step();
  ASSERT_TRUE(fs::exists(out));
  const std::string text = read(out);
  EXPECT_NE(text.find("Profile Summary at step 2:"), std::string::npos) << text;
  EXPECT_NE(text.find("batch size per GPU:"), std::string::npos);
  EXPECT_NE(text.find("bwd FLOPS per GPU = 3 * fwd flops per GPU / bwd latency:"),
            std::string::npos);  // 2 + recompute_fwd_factor
  EXPECT_NE(text.find("samples/second:"), std::string::npos);
  EXPECT_NE(text.find("(0): GPT2Block("), std::string::npos) << text;
  // Printed once: later steps add nothing.
  fs::remove(out);
  for (int micro = 0; micro < 4; ++micro) {
    engine->backward(engine->forward(x, x));
    engine->step();
  }
  EXPECT_FALSE(fs::exists(out));
  bool said = false;
  for (const auto& l : log) said |= l.find("profile of step 2 written to") != std::string::npos;
  EXPECT_TRUE(said);
  fs::remove_all(dir);
}

// Only rank 0 profiles: an output_file it cannot write is said and the profile printed, never an
// exception that would stop rank 0 while the others wait in the next collective.
TEST(FlopsProfiler, UnwritableOutputFileIsSaidNotThrown) {
  const std::string cfg = R"({"train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    "flops_profiler": {"enabled": true, "profile_step": 1,
                       "output_file": "/proc/self/no_such_dir/profile.txt"}})";
  auto model = std::make_shared<models::GPT>(models::GPTConfig::preset("test-gpt2"));
  std::vector<std::string> log;
  runtime::InitOptions opt;
  opt.log = [&log](const std::string& s) { log.push_back(s); };
  auto engine = runtime::initialize(model, cfg, opt);
  const Tensor x = Tensor::from_ints(std::vector<int64_t>(16, 3), {2, 8}, DType::i32);
  for (int step = 0; step < 2; ++step) {  // global step 1 is profiled
    engine->backward(engine->forward(x, x));
    EXPECT_NO_THROW(engine->step());
  }
  bool said = false;
  for (const auto& l : log)
    said |= l.find("could not write output_file") != std::string::npos &&
            l.find("fwd MACs per GPU") != std::string::npos;
  EXPECT_TRUE(said);
}

// LoRA on the stacked experts of a mixture of experts (nn/expert_lora.h), checked against peft
// 0.21's target_parameters (ParamWrapper):
//   - the delta's layout element by element, and its gradient by finite differences;
//   - tests/fixtures/lora_moe (tests/fixtures/generators/gen_moe_lora_fixture.py): peft adapters
//     on the tiny Mixtral (attention + both expert weights) and Qwen3-MoE (down_proj only) load
//     into our model and give peft's logits; our merge gives peft's merge_and_unload weights;
//   - our adapter written and read back (names, adapter_config.json's target_parameters), for
//     tests/fixtures/generators/check_moe_lora_adapter.py to load into peft by hand;
//   - training under ZeRO stages 0 and 3: only the LoRA factors change, the stages agree;
//   - the refusals (dropout, expert parallelism).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "ds/autograd/grad_mode.h"
#include "ds/comm/group.h"
#include "ds/core/error.h"
#include "ds/core/safetensors.h"
#include "ds/models/gpt.h"
#include "ds/models/hf_io.h"
#include "ds/models/peft_io.h"
#include "ds/nn/expert_lora.h"
#include "ds/nn/lora.h"
#include "ds/nn/moe.h"
#include "ds/ops/ops.h"
#include "ds/runtime/engine.h"
#include "gradcheck.h"

using namespace ds;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const fs::path kFixtures = fs::path(DS_FIXTURE_DIR) / "lora_moe";
const fs::path kBases = fs::path(DS_FIXTURE_DIR) / "hf_families";

// max |a - b| / max |b|: one scale for the whole tensor.
double max_rel(const Tensor& a, const Tensor& b) {
  const auto va = ds::testing::host_vector(a.to(DType::f32).contiguous());
  const auto vb = ds::testing::host_vector(b.to(DType::f32).contiguous());
  EXPECT_EQ(va.size(), vb.size());
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < va.size() && i < vb.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(va[i]) - vb[i]));
    scale = std::max(scale, std::abs(static_cast<double>(vb[i])));
  }
  return diff / scale;
}

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

std::shared_ptr<models::GPT> load_base(const std::string& name) {
  auto m = std::make_shared<models::GPT>(*models::read_hf_config(kBases / name), false);
  models::load_hf_weights(*m, kBases / name);
  return m;
}

// An adapter_config.json's LoRA: target_modules and target_parameters in one list, as
// --lora_module_name takes them.
nn::LoraConfig lora_from_peft(const fs::path& adapter) {
  const json j = read_json(adapter / "adapter_config.json");
  nn::LoraConfig c;
  c.r = j.at("r").get<int64_t>();
  c.alpha = j.at("lora_alpha").get<float>();
  c.only_optimize_lora = true;
  if (j.at("target_modules").is_array())
    c.targets = j["target_modules"].get<std::vector<std::string>>();
  for (const auto& t : j.value("target_parameters", json::array())) c.targets.push_back(t);
  return c;
}

std::string base_of(const std::string& fixture) {
  return fixture.substr(0, fixture.rfind('_'));  // mixtral_experts -> mixtral
}

fs::path scratch_dir(const std::string& what) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("ds_lora_experts_{}_{}_{}", what,
                                                               comm::world()->rank(), ::getpid());
  fs::remove_all(dir);
  return dir;
}

}  // namespace

// ---- the delta ----

TEST(ExpertLora, DeltaIsPeftsLayoutAndGradientsCheck) {
  const int64_t E = 3, out = 4, in = 5, r = 2;
  nn::ExpertLora lora(E, out, in, r, /*scaling=*/1.5f);
  lora.lora_A().copy_from(ds::testing::randn({r * E, in}, 1, 0.5f));
  lora.lora_B().copy_from(ds::testing::randn({out, r * E}, 2, 0.5f));
  const Tensor w = ds::testing::randn({E, out, in}, 3);
  {
    autograd::NoGradGuard ng;
    const auto eff = ds::testing::host_vector(lora(w));
    const auto W = ds::testing::host_vector(w), A = ds::testing::host_vector(lora.lora_A()),
               B = ds::testing::host_vector(lora.lora_B());
    // peft: A.reshape(E, r, in)[e, k, i] = A[e r + k, i]; B.reshape(out, r, E)[o, k, e] =
    // B[o, k E + e]; delta[e, o, i] = sum_k B[o, k E + e] A[e r + k, i].
    for (int64_t e = 0; e < E; ++e)
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i) {
          double d = 0;
          for (int64_t k = 0; k < r; ++k) d += B[o * r * E + k * E + e] * A[(e * r + k) * in + i];
          const size_t at = static_cast<size_t>((e * out + o) * in + i);
          EXPECT_NEAR(eff[at], W[at] + 1.5 * d, 1e-5) << e << " " << o << " " << i;
        }
  }
  ds::testing::gradcheck([&](const std::vector<Tensor>&) { return lora(w); },
                         {lora.lora_A(), lora.lora_B()});
}

// ---- against peft ----

class ExpertLoraPeft : public ::testing::TestWithParam<std::string> {};

TEST_P(ExpertLoraPeft, AdapterGivesPeftLogitsAndMergedWeights) {
  const std::string name = GetParam();
  auto m = load_base(base_of(name));
  const nn::LoraConfig c = lora_from_peft(kFixtures / name / "adapter");
  const nn::LoraReport rep = nn::apply_lora(*m, c);
  const int64_t read = models::load_peft_adapter(*m, kFixtures / name / "adapter");
  safetensors::Reader adapter(
      (kFixtures / name / "adapter" / "adapter_model.safetensors").string());
  EXPECT_EQ(read, static_cast<int64_t>(adapter.names().size()));
  safetensors::Reader ref((kFixtures / name / "reference.safetensors").string());
  m->train(false);
  autograd::NoGradGuard ng;
  const Tensor logits = m->logits(ref.get("input_ids").to(DType::i32));
  const double err = max_rel(logits, ref.get("logits"));
  std::printf("%s: %zu adapted (%s, ...), logits vs peft max rel diff %.2e\n", name.c_str(),
              rep.modules.size(), rep.modules[0].c_str(), err);
  EXPECT_LT(err, 1e-5) << name;  // fp32 against peft's float64

  // Our merge, exported as a Hugging Face folder, against merge_and_unload.
  const fs::path dir = scratch_dir(name);
  models::export_hf(m->config(), nn::merge_lora_weights(m->named_parameters(), c.scaling()), dir);
  safetensors::Reader merged((dir / "model.safetensors").string());
  int checked = 0;
  for (const auto& n : ref.names()) {
    if (n.rfind("merged.", 0) != 0) continue;
    const std::string hf = n.substr(7);
    ASSERT_TRUE(merged.contains(hf)) << hf;
    EXPECT_LT(max_rel(merged.get(hf), ref.get(n)), 1e-6) << hf;
    ++checked;
  }
  EXPECT_GT(checked, 0);
  fs::remove_all(dir);
}

TEST_P(ExpertLoraPeft, OurAdapterRoundTripsWithPeftNames) {
  const std::string name = GetParam();
  auto m = load_base(base_of(name));
  nn::LoraConfig c = lora_from_peft(kFixtures / name / "adapter");
  c.seed = 11;
  nn::apply_lora(*m, c);
  {  // B is zero after apply_lora: give the adapter an effect
    autograd::NoGradGuard ng;
    uint64_t seed = 20;
    for (const auto& [pname, p] : m->named_parameters())
      if (pname.find("lora_B") != std::string::npos)
        p.copy_from(ds::testing::randn(p.shape(), seed++, 0.1f));
  }
  const char* keep = std::getenv("DS_MOE_LORA_EXPORT_DIR");
  const fs::path dir = keep ? fs::path(keep) / name : scratch_dir(name + "_adapter");
  models::export_peft_adapter(*m, m->named_parameters(), c, dir,
                              fs::absolute(kBases / base_of(name)).string());
  // The same file names and config as peft's own adapter for these targets.
  const json ours = read_json(dir / "adapter_config.json");
  const json peft = read_json(kFixtures / name / "adapter" / "adapter_config.json");
  EXPECT_EQ(ours["r"], peft["r"]);
  EXPECT_EQ(ours["lora_alpha"], peft["lora_alpha"]);
  ASSERT_TRUE(ours.contains("target_parameters")) << ours.dump(2);
  EXPECT_EQ(ours["target_parameters"].size(), peft["target_parameters"].size()) << ours.dump(2);
  EXPECT_EQ(ours["target_modules"].size(), peft["target_modules"].size()) << ours.dump(2);
  safetensors::Reader mine((dir / "adapter_model.safetensors").string());
  safetensors::Reader theirs((kFixtures / name / "adapter" / "adapter_model.safetensors").string());
  auto sorted = [](std::vector<std::string> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  EXPECT_EQ(sorted(mine.names()), sorted(theirs.names()));
  for (const auto& n : mine.names()) EXPECT_EQ(mine.entry(n).shape, theirs.entry(n).shape) << n;

  // Read back into a fresh model: the same logits.
  auto fresh = load_base(base_of(name));
  nn::apply_lora(*fresh, c);
  models::load_peft_adapter(*fresh, dir);
  m->train(false);
  fresh->train(false);
  autograd::NoGradGuard ng;
  const Tensor ids = Tensor::from_ints({1, 5, 9, 2, 7, 3, 30, 41}, {1, 8});
  const Tensor want = m->logits(ids);
  EXPECT_EQ(ds::testing::host_vector(fresh->logits(ids)), ds::testing::host_vector(want));
  EXPECT_GT(max_rel(want, load_base(base_of(name))->logits(ids)), 1e-3)
      << "the adapter should move the logits";
  // For check_moe_lora_adapter.py: our logits of the same ids, to compare with peft's.
  if (keep)
    safetensors::save((dir / "ds_logits.safetensors").string(),
                      {{"input_ids", ids.to(DType::i64)}, {"logits", want}}, {{"format", "pt"}});
  if (!keep) fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ExpertLoraPeft,
                         ::testing::Values("mixtral_experts", "qwen3_moe_down"));

// ---- targeting ----

TEST(ExpertLoraTargets, NamesSelectTheStackedWeights) {
  struct Case {
    std::vector<std::string> targets;
    std::vector<std::string> want;  // of layer 0
  };
  const std::vector<Case> cases = {
      {{"mlp.experts.gate_up_proj", "mlp.experts.down_proj"},
       {"layers.0.mlp.experts.gate_up_proj", "layers.0.mlp.experts.down_proj"}},
      {{"down_proj"}, {"layers.0.mlp.experts.down_proj"}},
      {{"experts"}, {"layers.0.mlp.experts.gate_up_proj", "layers.0.mlp.experts.down_proj"}},
      {{"q_proj", "experts.gate_up_proj"},
       {"layers.0.self_attn.q_proj", "layers.0.mlp.experts.gate_up_proj"}},
      // The router only: "gate" is no expert weight's name nor in the experts module's.
      {{"gate"}, {"layers.0.mlp.gate"}},
  };
  for (const auto& cs : cases) {
    auto m = load_base("mixtral");
    nn::LoraConfig c;
    c.r = 2;
    c.targets = cs.targets;
    const auto rep = nn::apply_lora(*m, c);
    std::vector<std::string> layer0;
    for (const auto& n : rep.modules)
      if (n.rfind("layers.0.", 0) == 0) layer0.push_back(n);
    EXPECT_EQ(layer0, cs.want) << fmt::format("{}", fmt::join(cs.targets, ","));
    EXPECT_EQ(rep.modules.size(), 2 * cs.want.size());
  }
}

TEST(ExpertLoraTargets, DropoutAndExpertParallelismAreRefused) {
  auto m = load_base("mixtral");
  nn::LoraConfig c;
  c.r = 2;
  c.dropout = 0.1f;
  c.targets = {"q_proj", "down_proj"};
  try {
    nn::apply_lora(*m, c);
    ADD_FAILURE() << "dropout on expert LoRA accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no dropout"), std::string::npos) << e.what();
  }
  nn::MoEExperts ex(4, 8, 6);
  ex.add_lora("down_proj", 2, 1.0f);
  try {
    ex.keep(0, 2);
    ADD_FAILURE() << "expert parallelism with expert LoRA accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expert parallelism with LoRA on the experts"),
              std::string::npos)
        << e.what();
  }
}

// ---- training ----

namespace {

constexpr int64_t kB = 2, kT = 8;

std::unique_ptr<runtime::Engine> make_engine(std::shared_ptr<nn::Module> m, int stage) {
  runtime::InitOptions opt;
  opt.group = comm::world();
  opt.log = [](const std::string&) {};
  const std::string cfg = fmt::format(
      R"({{"train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": 1,
    "gradient_clipping": 0.0,
    "zero_optimization": {{"stage": {}, "reduce_bucket_size": 500,
      "stage3_param_persistence_threshold": 50, "stage3_prefetch_bucket_size": 3000}},
    "optimizer": {{"type": "AdamW", "params": {{"lr": 2e-2, "weight_decay": 0.0}}}}}})",
      kB, stage);
  return runtime::initialize(m, cfg, opt);
}

}  // namespace

TEST(ExpertLoraTrain, OnlyFactorsChangeAndZeroStagesAgree) {
  auto g = comm::world();
  std::vector<double> stage0;
  for (int stage : {0, 3}) {
    SCOPED_TRACE(fmt::format("stage {} on {} ranks", stage, g->size()));
    auto m = load_base("mixtral");
    nn::LoraConfig c;
    c.r = 2;
    c.alpha = 4;
    c.seed = 3;
    c.only_optimize_lora = true;
    c.targets = {"q_proj", "v_proj", "mlp.experts.gate_up_proj", "mlp.experts.down_proj"};
    nn::apply_lora(*m, c);
    std::map<std::string, std::vector<float>> before;
    for (const auto& [name, p] : m->named_parameters()) before[name] = ds::testing::host_vector(p);
    auto e = make_engine(m, stage);
    std::vector<double> losses;
    for (int s = 0; s < 6; ++s) {
      Tensor x = Tensor::empty({kB, kT}, DType::i32), y = Tensor::empty({kB, kT}, DType::i32);
      for (int64_t i = 0; i < kB * kT; ++i) {  // the same batch on every rank, every step
        x.data<int32_t>()[i] = static_cast<int32_t>((i * 7 + 3) % 48);
        y.data<int32_t>()[i] = static_cast<int32_t>((i * 5 + 1) % 48);
      }
      Tensor loss = e->forward(x, y);
      e->backward(loss);
      e->step();
      losses.push_back(loss.item());
    }
    EXPECT_LT(losses.back(), 0.9 * losses.front());
    const auto weights = e->full_weights();  // under ZeRO-3 rank 0's only
    if (weights.empty() && g->rank() != 0) continue;
    int changed = 0;
    for (const auto& [name, t] : weights) {
      const bool lora = nn::is_lora_parameter(name);
      const auto now = ds::testing::host_vector(t);
      if (!lora) {
        EXPECT_EQ(now, before.at(name)) << name << " changed";  // bitwise
      } else if (name.find("lora_A") != std::string::npos || now != before.at(name)) {
        changed += now != before.at(name);
      }
    }
    // Every factor moved (B from zero), the experts' included.
    EXPECT_EQ(changed, 2 * 2 * 4) << "layers x (A, B) x targets";
    if (stage == 0) {
      stage0 = losses;
    } else {
      for (size_t i = 0; i < losses.size(); ++i)
        EXPECT_NEAR(losses[i], stage0[i], 1e-5 * std::abs(stage0[i])) << "step " << i;
    }
  }
}

// The engine's expert-parallel split (2 ranks: test_lora_experts_np2) refuses experts with LoRA.
TEST(ExpertLoraTrain, ExpertParallelEngineIsRefused) {
  auto g = comm::world();
  if (g->size() != 2) GTEST_SKIP() << "needs 2 ranks (test_lora_experts_np2)";
  auto m = load_base("mixtral");
  nn::LoraConfig c;
  c.r = 2;
  c.only_optimize_lora = true;
  c.targets = {"q_proj", "experts"};
  nn::apply_lora(*m, c);
  runtime::InitOptions opt;
  opt.group = g;
  opt.log = [](const std::string&) {};
  try {
    runtime::initialize(m,
                        fmt::format(R"({{"train_micro_batch_size_per_gpu": {},
      "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-3}}}},
      "expert_parallel": {{"enabled": true, "autoep_size": 2}}}})",
                                    kB),
                        opt);
    ADD_FAILURE() << "expert parallelism with LoRA on the experts accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expert parallelism with LoRA on the experts"),
              std::string::npos)
        << e.what();
  }
}

// LoRA (nn/lora.h, models/peft_io.h) and frozen parameters under ZeRO (zero/strategy.h):
//   - the LoRA Linear's gradients by finite differences, its frozen base without gradient;
//   - forward, loss and every LoRA gradient against peft for a tiny LLaMA and a tiny GPT-2
//     (tests/fixtures/lora, written by tests/fixtures/generators/gen_lora_fixture.py, which also checks that our
//     exported adapter loads in peft: DS_LORA_EXPORT_DIR);
//   - the adapter export round trip, and merged weights giving the unmerged model's logits;
//   - under ZeRO stages 0-3 (plainly and under mpirun with 2 ranks): frozen parameters get no
//     gradient, no optimizer state and no change; the LoRA losses of every stage agree with
//     stage 0's (stage 1 bitwise, 2 and 3 within 1e-6); a checkpoint resumes bitwise;
//   - encoder sequence classifiers (BERT, RoBERTa, DeBERTa-v2) with PEFT's SEQ_CLS semantics:
//     default targets, trainable set, logits, loss and gradients against peft
//     (tests/fixtures/lora_classifier, tests/fixtures/generators/gen_lora_classifier_fixture.py), the adapter (peft's
//     names incl. modules_to_save) and merged exports round trip;
//   - encoder-decoders (BART, BlenderBot, T5) with PEFT's SEQ_2_SEQ_LM semantics: default
//     targets, only the adapters trainable, logits, loss and gradients against peft
//     (tests/fixtures/lora_seq2seq, tests/fixtures/generators/gen_lora_classifier_fixture.py --task seq2seq), the
//     adapter and merged exports round trip, greedy generation merged = unmerged = peft's, and
//     ZeRO-3 steps equal ZeRO-0's.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "ds/autograd/grad_mode.h"
#include "ds/comm/group.h"
#include "ds/core/error.h"
#include "ds/core/safetensors.h"
#include "ds/models/family.h"
#include "ds/models/encoder_io.h"
#include "ds/models/gpt.h"
#include "ds/models/hf_io.h"
#include "ds/models/peft_io.h"
#include "ds/models/seq2seq.h"
#include "ds/models/seq2seq_io.h"
#include "ds/nn/layers.h"
#include "ds/nn/lora.h"
#include "ds/ops/ops.h"
#include "ds/runtime/engine.h"
#include "ds/train/lora.h"
#include "ds/train/options.h"
#include "gradcheck.h"

using namespace ds;
namespace fs = std::filesystem;

namespace {

const fs::path kFixtures = fs::path(DS_FIXTURE_DIR) / "lora";

// max |a - b| / max |b| over all elements: one scale for the whole tensor, so that elements near
// zero do not dominate.
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

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

// The LoRA settings of a PEFT adapter_config.json (target_modules as name substrings).
nn::LoraConfig lora_from_peft(const fs::path& adapter_dir) {
  const auto j = read_json(adapter_dir / "adapter_config.json");
  nn::LoraConfig c;
  c.r = j.at("r").get<int64_t>();
  c.alpha = j.at("lora_alpha").get<float>();
  c.dropout = j.at("lora_dropout").get<float>();
  c.targets = j.at("target_modules").get<std::vector<std::string>>();
  c.only_optimize_lora = true;  // peft trains the LoRA matrices only
  return c;
}

struct PeftCase {
  std::shared_ptr<models::GPT> model;
  nn::LoraConfig lora;
  std::map<std::string, Tensor> ref;
};

PeftCase load_case(const std::string& name) {
  const fs::path dir = kFixtures / name;
  PeftCase c;
  auto cfg = models::read_hf_config(dir / "base");
  EXPECT_TRUE(cfg.has_value());
  c.model = std::make_shared<models::GPT>(*cfg, /*init=*/false);
  models::load_hf_weights(*c.model, dir / "base");
  c.lora = lora_from_peft(dir / "adapter");
  nn::apply_lora(*c.model, c.lora);
  models::load_peft_adapter(*c.model, dir / "adapter");
  c.model->train(false);  // GPT-2's config has dropout 0.1; the reference ran in eval mode
  safetensors::Reader r((dir / "reference.safetensors").string());
  for (const auto& n : r.names()) c.ref.emplace(n, r.get(n));
  return c;
}

}  // namespace

// ---- the LoRA Linear ----

TEST(LoraLinear, GradientByFiniteDifferences) {
  nn::Linear lin(6, 5, /*bias=*/true);
  lin.add_lora(3, /*scaling=*/2.0f, /*dropout=*/0.0f);
  Tensor w = lin.weight();
  w.set_requires_grad(false);
  // Non-zero values everywhere (B is zero-initialised: its gradient alone would flow).
  w.copy_from(ds::testing::randn({5, 6}, 1, 0.5f));
  lin.bias().copy_from(ds::testing::randn({5}, 2, 0.5f));
  lin.lora_A()->weight().copy_from(ds::testing::randn({3, 6}, 3, 0.5f));
  lin.lora_B()->weight().copy_from(ds::testing::randn({5, 3}, 4, 0.5f));
  Tensor x = ds::testing::leaf({2, 4, 6}, 5);
  ds::testing::gradcheck([&](const std::vector<Tensor>& in) { return lin(in[0]); },
                         {x, lin.lora_A()->weight(), lin.lora_B()->weight(), lin.bias()});
  EXPECT_FALSE(lin.weight().grad().defined()) << "the frozen base weight got a gradient";

  // y = W x + b + s B A x, element by element.
  autograd::NoGradGuard ng;
  Tensor xs = ds::testing::randn({1, 6}, 9);
  Tensor y = lin(xs);
  const auto W = ds::testing::host_vector(w), b = ds::testing::host_vector(lin.bias()),
             A = ds::testing::host_vector(lin.lora_A()->weight()),
             Bm = ds::testing::host_vector(lin.lora_B()->weight()),
             xv = ds::testing::host_vector(xs), yv = ds::testing::host_vector(y);
  for (int o = 0; o < 5; ++o) {
    double want = b[o];
    for (int i = 0; i < 6; ++i) want += W[o * 6 + i] * xv[i];
    for (int k = 0; k < 3; ++k) {
      double ax = 0;
      for (int i = 0; i < 6; ++i) ax += A[k * 6 + i] * xv[i];
      want += 2.0 * Bm[o * 3 + k] * ax;
    }
    EXPECT_NEAR(yv[o], want, 1e-5 * (1 + std::abs(want)));
  }
}

TEST(LoraApply, NamesFreezingInitAndErrors) {
  models::GPT model(models::GPTConfig::preset("test-llama"));
  nn::LoraConfig c;
  c.r = 4;
  c.alpha = 8;
  c.targets = {"q_proj", "v_proj"};
  const auto rep = nn::apply_lora(model, c);
  EXPECT_EQ(rep.modules.size(), 2u * static_cast<size_t>(model.config().n_layer));
  EXPECT_EQ(rep.modules.front(), "layers.0.self_attn.q_proj");
  bool saw_a = false;
  int64_t trainable = 0;
  for (const auto& [name, p] : model.named_parameters()) {
    if (p.requires_grad()) trainable += p.numel();
    if (name == "layers.0.self_attn.q_proj.lora_A.weight") {
      saw_a = true;
      EXPECT_EQ(p.shape(), (Shape{4, model.config().n_embd}));
      // Kaiming-uniform (a = sqrt(5)): inside +-1/sqrt(in), and not all zero.
      const float bound = 1.0f / std::sqrt(static_cast<float>(model.config().n_embd));
      double sq = 0;
      for (float v : ds::testing::host_vector(p)) {
        EXPECT_LE(std::abs(v), bound);
        sq += v * v;
      }
      EXPECT_GT(sq, 0.0);
    }
    if (name == "layers.0.self_attn.q_proj.lora_B.weight") {
      for (float v : ds::testing::host_vector(p)) EXPECT_EQ(v, 0.0f);
    }
    if (name == "layers.0.self_attn.q_proj.weight") {
      EXPECT_FALSE(p.requires_grad());
    }
    if (name == "layers.0.self_attn.k_proj.weight") {
      EXPECT_TRUE(p.requires_grad());  // not adapted
    }
  }
  EXPECT_TRUE(saw_a);
  EXPECT_EQ(rep.trainable_params, trainable);
  EXPECT_EQ(rep.total_params, model.num_parameters());

  // No match: the message names the flag and some Linear modules.
  models::GPT other(models::GPTConfig::preset("test-llama"));
  c.targets = {"qproj"};
  try {
    nn::apply_lora(other, c);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lora_module_name"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("layers.0.self_attn.q_proj"), std::string::npos)
        << e.what();
  }
  // GPT-2's LM head is tied to wte: refused.
  models::GPT gpt2(models::GPTConfig::preset("test-gpt2"));
  c.targets = {"lm_head"};
  try {
    nn::apply_lora(gpt2, c);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tied"), std::string::npos) << e.what();
  }
  c.targets = {"c_attn"};
  c.r = 0;
  EXPECT_THROW(nn::apply_lora(gpt2, c), Error);
}

// ---- parity with peft ----

class LoraPeft : public ::testing::TestWithParam<std::string> {};

TEST_P(LoraPeft, ForwardLossAndGradientsMatchPeft) {
  PeftCase c = load_case(GetParam());
  models::GPT& m = *c.model;
  const Tensor ids = c.ref.at("input_ids"), targets = c.ref.at("targets");
  Tensor logits;
  {
    autograd::NoGradGuard ng;
    logits = m.logits(ids);
  }
  // The reference is float64; ours fp32 through a 2-layer model: rounding of order 1e-7.
  EXPECT_LT(max_rel(logits, c.ref.at("logits")), 1e-5);
  Tensor loss = m.loss(ids, targets);
  EXPECT_LT(max_rel(loss, c.ref.at("loss")), 1e-5);
  loss.backward();
  int lora = 0;
  double worst = 0;
  for (const auto& [name, p] : m.named_parameters()) {
    if (!nn::is_lora_parameter(name)) {
      EXPECT_FALSE(p.grad().defined()) << name << ": a frozen parameter got a gradient";
      continue;
    }
    ++lora;
    const std::string key = "grad." + models::peft_name(m.config().layout, name);
    ASSERT_TRUE(c.ref.count(key)) << key;
    ASSERT_TRUE(p.grad().defined()) << name;
    const double err = max_rel(p.grad(), c.ref.at(key));
    EXPECT_LT(err, 1e-5) << name;
    worst = std::max(worst, err);
  }
  std::printf("%s vs peft: logits %.2e, loss %.2e, worst LoRA gradient %.2e (max rel diff)\n",
              GetParam().c_str(), max_rel(logits, c.ref.at("logits")),
              max_rel(loss, c.ref.at("loss")), worst);
  int ref_grads = 0;
  for (const auto& [k, v] : c.ref) ref_grads += k.rfind("grad.", 0) == 0;
  EXPECT_EQ(lora, ref_grads);

  // For tests/fixtures/generators/gen_lora_fixture.py --check-export: our adapter and our merged model.
  if (const char* out = std::getenv("DS_LORA_EXPORT_DIR")) {
    const fs::path dir = fs::path(out) / GetParam();
    models::export_peft_adapter(m, m.named_parameters(), c.lora, dir / "adapter");
    models::export_hf(m.config(), nn::merge_lora_weights(m.named_parameters(), c.lora.scaling()),
                      dir / "merged");
  }
}

TEST_P(LoraPeft, AdapterRoundTripsWithPeftNamesAndConfig) {
  PeftCase c = load_case(GetParam());
  const fs::path dir =
      fs::temp_directory_path() /
      fmt::format("ds_lora_adapter_{}_{}_{}", GetParam(), comm::world()->rank(), ::getpid());
  fs::remove_all(dir);
  models::export_peft_adapter(*c.model, c.model->named_parameters(), c.lora, dir, "/base");
  // The same tensor names and shapes as peft's own file.
  safetensors::Reader ours((dir / "adapter_model.safetensors").string());
  safetensors::Reader theirs(
      (kFixtures / GetParam() / "adapter" / "adapter_model.safetensors").string());
  auto names = ours.names(), want = theirs.names();
  std::sort(names.begin(), names.end());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(names, want);
  for (const auto& n : want) EXPECT_EQ(max_rel(ours.get(n), theirs.get(n)), 0.0) << n;
  const auto cfg = read_json(dir / "adapter_config.json");
  const auto peft = read_json(kFixtures / GetParam() / "adapter" / "adapter_config.json");
  for (const char* k : {"peft_type", "task_type", "r", "lora_alpha", "fan_in_fan_out", "bias"})
    EXPECT_EQ(cfg.at(k), peft.at(k)) << k;
  auto t1 = cfg.at("target_modules").get<std::vector<std::string>>(),
       t2 = peft.at("target_modules").get<std::vector<std::string>>();
  std::sort(t1.begin(), t1.end());
  std::sort(t2.begin(), t2.end());
  EXPECT_EQ(t1, t2);
  EXPECT_EQ(cfg.at("base_model_name_or_path"), "/base");

  // Loading it back into a fresh LoRA model gives the same matrices.
  auto fresh = std::make_shared<models::GPT>(c.model->config());
  nn::apply_lora(*fresh, c.lora);
  EXPECT_EQ(models::load_peft_adapter(*fresh, dir), static_cast<int64_t>(want.size()));
  auto a = c.model->named_parameters(), b = fresh->named_parameters();
  for (size_t i = 0; i < a.size(); ++i)
    if (nn::is_lora_parameter(a[i].first)) {
      EXPECT_EQ(max_rel(b[i].second, a[i].second), 0.0) << a[i].first;
    }
  fs::remove_all(dir);
}

TEST_P(LoraPeft, MergedWeightsGiveTheUnmergedLogits) {
  PeftCase c = load_case(GetParam());
  const fs::path dir =
      fs::temp_directory_path() /
      fmt::format("ds_lora_merged_{}_{}_{}", GetParam(), comm::world()->rank(), ::getpid());
  fs::remove_all(dir);
  const auto merged = nn::merge_lora_weights(c.model->named_parameters(), c.lora.scaling());
  for (const auto& [n, t] : merged) EXPECT_FALSE(nn::is_lora_parameter(n)) << n;
  models::export_hf(c.model->config(), merged, dir);
  auto plain = std::make_shared<models::GPT>(*models::read_hf_config(dir), false);
  models::load_hf_weights(*plain, dir);
  plain->train(false);
  autograd::NoGradGuard ng;
  const Tensor ids = c.ref.at("input_ids");
  // W + s B A rounded to fp32 once, against two fp32 matmuls: rounding of order 1e-7.
  EXPECT_LT(max_rel(plain->logits(ids), c.model->logits(ids)), 1e-5);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Families, LoraPeft, ::testing::Values("llama", "gpt2"));

namespace {

// A model imported from tests/fixtures/hf_families/<name>.
std::shared_ptr<models::GPT> load_family_fixture(const std::string& name) {
  const fs::path fixture = fs::path(DS_FIXTURE_DIR) / "hf_families" / name;
  auto m = std::make_shared<models::GPT>(*models::read_hf_config(fixture), false);
  models::load_hf_weights(*m, fixture);
  return m;
}

// The fixture `name` with LoRA (r 4, alpha 8) on every projection and B set so that the adapter has
// an effect; checks that its merged export (written under `dir`) gives the adapted model's logits.
// Returns the adapted model and its LoRA config.
std::pair<std::shared_ptr<models::GPT>, nn::LoraConfig> merged_export_matches(
    const std::string& name, const fs::path& dir) {
  auto m = load_family_fixture(name);
  nn::LoraConfig c;
  c.r = 4;
  c.alpha = 8;
  c.targets = {"layers."};
  c.seed = 5;
  nn::apply_lora(*m, c);
  {  // B is zero after apply_lora: give the adapter an effect
    autograd::NoGradGuard ng;
    for (const auto& [pname, p] : m->named_parameters())
      if (pname.find("lora_B") != std::string::npos)
        p.copy_from(ops::mul(Tensor::ones(p.shape()), 0.05f));
  }
  const auto merged = nn::merge_lora_weights(m->named_parameters(), c.scaling());
  models::export_hf(m->config(), merged, dir / "merged");
  auto plain = std::make_shared<models::GPT>(*models::read_hf_config(dir / "merged"), false);
  models::load_hf_weights(*plain, dir / "merged");
  m->train(false);
  plain->train(false);
  autograd::NoGradGuard ng;
  const Tensor ids = Tensor::from_ints({1, 5, 9, 2, 7, 3}, {1, 6});
  EXPECT_LT(max_rel(plain->logits(ids), m->logits(ids)), 1e-5) << name;
  return {m, c};
}

// The error of writing m's adapter as a PEFT adapter into dir/adapter ("(no error)" if none).
std::string peft_adapter_error(models::GPT& m, const nn::LoraConfig& c, const fs::path& dir) {
  try {
    models::export_peft_adapter(m, m.named_parameters(), c, dir / "adapter");
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

fs::path scratch_dir(const std::string& what) {
  const fs::path dir = fs::temp_directory_path() /
                       fmt::format("ds_lora_{}_{}_{}", what, comm::world()->rank(), ::getpid());
  fs::remove_all(dir);
  return dir;
}

}  // namespace

// GLM-4 from its Hugging Face fixture with LoRA on every projection, the MLP's gate and up among
// them: the merged export (stacked again into gate_up_proj) gives the adapted model's logits; a
// PEFT adapter on q/v names GlmForCausalLM's modules, and one on gate_proj (no module of its own
// in that class) is refused, saying what to do.
TEST(LoraFamilies, Glm4MergedExportAndAdapterTargets) {
  const fs::path dir = scratch_dir("glm4");
  auto [m, c] = merged_export_matches("glm4", dir);
  const std::string msg = peft_adapter_error(*m, c, dir);
  EXPECT_NE(msg.find("'layers.0.mlp.gate_proj' cannot be written as a PEFT adapter for "
                     "Glm4ForCausalLM"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("--merge_lora"), std::string::npos) << msg;

  auto qv = load_family_fixture("glm4");
  c.targets = {"q_proj", "v_proj"};
  nn::apply_lora(*qv, c);
  models::export_peft_adapter(*qv, qv->named_parameters(), c, dir / "adapter");
  safetensors::Reader r((dir / "adapter" / "adapter_model.safetensors").string());
  EXPECT_TRUE(r.contains("base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"));
  fs::remove_all(dir);
}

// Phi-3 from its Hugging Face fixture with LoRA on every projection: the merged export (q, k, v
// stacked again into qkv_proj, of their own sizes under GQA) gives the adapted model's logits; a
// PEFT adapter on q_proj (part of Phi3ForCausalLM's qkv_proj, no module of its own) is refused,
// one on o_proj and down_proj names the class's modules.
TEST(LoraFamilies, Phi3MergedExportAndAdapterTargets) {
  const fs::path dir = scratch_dir("phi3");
  auto [m, c] = merged_export_matches("phi3", dir);
  const std::string msg = peft_adapter_error(*m, c, dir);
  EXPECT_NE(msg.find("cannot be written as a PEFT adapter for Phi3ForCausalLM: that class holds "
                     "it as part of 'model.layers.0.self_attn.qkv_proj.weight'"),
            std::string::npos)
      << msg;

  auto od = load_family_fixture("phi3");
  c.targets = {"o_proj", "down_proj"};
  nn::apply_lora(*od, c);
  models::export_peft_adapter(*od, od->named_parameters(), c, dir / "adapter");
  safetensors::Reader r((dir / "adapter" / "adapter_model.safetensors").string());
  EXPECT_TRUE(r.contains("base_model.model.model.layers.1.self_attn.o_proj.lora_B.weight"));
  EXPECT_TRUE(r.contains("base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"));
  fs::remove_all(dir);
}

// ---- frozen parameters under ZeRO ----

namespace {

constexpr int64_t kB = 2, kT = 16;

std::string zero_config(int stage, const std::string& precision = "fp32") {
  const std::string prec = precision == "bf16" ? R"("bf16": {"enabled": true},)" : "";
  // Gradient clipping off: the clipping factor would carry the global norm's summation order,
  // which differs between stages (fixed tiles over different buffers).
  return fmt::format(R"({{"train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": 2,
    "gradient_clipping": 0.0, {}
    "zero_optimization": {{"stage": {}, "reduce_bucket_size": 500, "overlap_comm": true,
      "stage3_param_persistence_threshold": 50, "stage3_prefetch_bucket_size": 3000}},
    "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-2, "weight_decay": 0.1}}}}}})",
                     kB, prec, stage);
}

std::shared_ptr<models::GPT> lora_model(const std::string& preset, bool only_lora) {
  auto m = std::make_shared<models::GPT>(models::GPTConfig::preset(preset));
  nn::LoraConfig c;
  c.r = 4;
  c.alpha = 8;
  c.targets = preset == "test-gpt2" ? std::vector<std::string>{"c_attn", "c_fc"}
                                    : std::vector<std::string>{"q_proj", "v_proj"};
  c.only_optimize_lora = only_lora;
  c.seed = 7;
  nn::apply_lora(*m, c);
  return m;
}

std::unique_ptr<runtime::Engine> make_engine(std::shared_ptr<nn::Module> m, int stage,
                                             const std::string& precision = "fp32") {
  runtime::InitOptions opt;
  opt.group = comm::world();
  opt.log = [](const std::string&) {};
  return runtime::initialize(m, zero_config(stage, precision), opt);
}

// Global micro-batch losses of `steps` optimizer steps (2 micro-steps each); rank r takes its own
// samples of each global batch. `check` runs after every backward.
std::vector<double> train_steps(runtime::Engine& e, int steps, int first_step = 0,
                                const std::function<void()>& check = {}) {
  const int n = e.world_size(), r = e.rank();
  std::vector<double> losses;
  for (int s = first_step; s < first_step + steps; ++s)
    for (int m = 0; m < 2; ++m) {
      Tensor x = Tensor::empty({kB, kT}, DType::i32), y = Tensor::empty({kB, kT}, DType::i32);
      for (int64_t i = 0; i < kB * kT; ++i) {
        const int64_t sample = (s * 2 + m) * kB * n + r * kB + i / kT, t = i % kT;
        const int64_t v = (sample * 5 + t * 3 + (t / 4) * 7) % 64;
        x.data<int32_t>()[i] = static_cast<int32_t>(v);
        y.data<int32_t>()[i] = static_cast<int32_t>((v * 3 + 1) % 64);
      }
      Tensor loss = e.forward(x, y);
      e.backward(loss);
      if (check) check();
      e.step();
      float l = loss.item();
      e.group().all_reduce(&l, 1, DType::f32);
      losses.push_back(static_cast<double>(l) / n);
    }
  return losses;
}

}  // namespace

class LoraZero : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(LoraZero, FrozenParametersHaveNoGradientStateOrChangeAndStagesAgree) {
  const auto& [preset, only_lora] = GetParam();
  auto g = comm::world();
  const int n = g->size();
  std::vector<double> stage0;
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE(
        fmt::format("{} stage {} on {} ranks, only_optimize_lora {}", preset, stage, n, only_lora));
    auto model = lora_model(preset, only_lora);
    int64_t trainable = 0, frozen = 0;
    std::map<std::string, std::vector<float>> frozen_before;
    for (const auto& [name, p] : model->named_parameters()) {
      (p.requires_grad() ? trainable : frozen) += p.numel();
      if (!p.requires_grad()) frozen_before[name] = ds::testing::host_vector(p);
    }
    ASSERT_GT(frozen, 0);
    auto e = make_engine(model, stage);
    zero::Strategy& z = e->strategy();
    // Only trainable parameters in the flat space (and so in the gradient buffers, the buckets,
    // the reduce-scatter and the optimizer's range); frozen ones kept whole, apart.
    EXPECT_EQ(z.flat().numel, trainable);
    EXPECT_EQ(z.frozen().numel, frozen);
    for (const auto& en : z.flat().entries)
      EXPECT_TRUE(frozen_before.count(en.name) == 0)
          << en.name << " is frozen but in the flat space";
    float opt_f = static_cast<float>(z.optimizer_numel());  // exact: < 2^24
    if (z.partitioned()) g->all_reduce(&opt_f, 1, DType::f32);
    const int64_t opt = static_cast<int64_t>(opt_f);
    // The optimizer holds the trainable elements plus partition padding, nothing frozen.
    EXPECT_GE(opt, trainable);
    EXPECT_LT(opt, trainable + frozen / 4);
    const auto mem = z.memory();
    EXPECT_LE(mem.grads, static_cast<int64_t>((trainable + 64 * n) * sizeof(float)));
    const auto losses = train_steps(*e, 3, 0, [&] {
      for (const auto& [name, p] : model->named_parameters())
        if (!p.requires_grad()) {
          EXPECT_FALSE(p.grad().defined()) << name;
        }
    });
    // Frozen parameters never change (read whole: stage 3 keeps them resident).
    for (const auto& [name, p] : model->named_parameters())
      if (!p.requires_grad()) {
        ASSERT_TRUE(p.is_materialized()) << name;
        EXPECT_EQ(ds::testing::host_vector(p), frozen_before[name]) << name;
      }
    EXPECT_LT(losses.back(), losses.front());
    if (stage == 0) {
      stage0 = losses;
    } else {
      // Stage 1 adds the same numbers in the same order as stage 0 (each rank accumulates its 2
      // micro-steps, then 2 ranks' sums are added, the same in either order): bitwise. Stages 2
      // and 3 reduce every micro-step, (a1 + b1) + (a2 + b2) instead of (a1 + a2) + (b1 + b2):
      // one rounding apart per gradient element, which 3 Adam steps carry into the loss at the
      // 1e-7 level (6.9e-8 measured in the sanitizer build, 0 in Release). Clipping is off: the
      // norm's tiles differ between stages.
      double worst = 0;
      for (size_t i = 0; i < losses.size(); ++i) {
        if (stage == 1)
          EXPECT_EQ(losses[i], stage0[i]) << "micro-step " << i;
        else
          EXPECT_NEAR(losses[i], stage0[i], 1e-6 * std::abs(stage0[i])) << "micro-step " << i;
        worst = std::max(worst, std::abs(losses[i] - stage0[i]) / std::abs(stage0[i]));
      }
      if (g->rank() == 0)
        std::printf("%s only_lora %d, %d ranks: stage %d vs stage 0 losses, max rel diff %.2e\n",
                    preset.c_str(), only_lora ? 1 : 0, n, stage, worst);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, LoraZero,
                         ::testing::Combine(::testing::Values("test-llama", "test-gpt2"),
                                            ::testing::Bool()));

// Gradient checkpointing recomputes each block in backward: with a frozen base the block's input
// needs no gradient, yet the LoRA matrices inside must get the same gradients as without it.
TEST(LoraGradientCheckpointing, SameGradients) {
  std::vector<std::vector<float>> grads[2];
  for (int ckpt = 0; ckpt < 2; ++ckpt) {
    auto m = lora_model("test-llama", true);
    m->train(false);
    if (ckpt) m->set_gradient_checkpointing(true);
    Tensor x = Tensor::empty({kB, kT}, DType::i32), y = Tensor::empty({kB, kT}, DType::i32);
    for (int64_t i = 0; i < kB * kT; ++i) {
      x.data<int32_t>()[i] = static_cast<int32_t>((i * 7 + 3) % 64);
      y.data<int32_t>()[i] = static_cast<int32_t>((i * 5 + 1) % 64);
    }
    // B starts at zero: give it values so that A's gradient is not zero too.
    for (const auto& [name, p] : m->named_parameters())
      if (name.find("lora_B") != std::string::npos)
        p.copy_from(ds::testing::randn(p.shape(), 3, 0.1f));
    m->loss(x, y).backward();
    for (const auto& [name, p] : m->named_parameters()) {
      if (!p.requires_grad()) continue;
      ASSERT_TRUE(p.grad().defined()) << name << (ckpt ? " (checkpointed)" : "");
      grads[ckpt].push_back(ds::testing::host_vector(p.grad()));
    }
  }
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i) EXPECT_EQ(grads[0][i], grads[1][i]) << i;
}

class LoraCheckpoint : public ::testing::TestWithParam<int> {};

TEST_P(LoraCheckpoint, ResumesBitwise) {
  const int stage = GetParam();
  auto g = comm::world();
  int64_t id = ::getpid();  // rank 0's: side-by-side runs must not share the folder
  g->broadcast(&id, 1, DType::i64, 0, "test folder");
  const fs::path dir =
      fs::temp_directory_path() / fmt::format("ds_lora_ck_{}_{}_{}", stage, g->size(), id);
  if (g->rank() == 0) fs::remove_all(dir);
  g->barrier();
  std::vector<double> continuous;
  {
    auto e = make_engine(lora_model("test-llama", true), stage, "bf16");
    continuous = train_steps(*e, 4);
  }
  {
    auto e = make_engine(lora_model("test-llama", true), stage, "bf16");
    train_steps(*e, 2);
    e->save_checkpoint(dir.string());
  }
  auto e = make_engine(lora_model("test-llama", true), stage, "bf16");
  e->load_checkpoint(dir.string());
  const auto resumed = train_steps(*e, 2, 2);
  for (size_t i = 0; i < resumed.size(); ++i)
    EXPECT_EQ(resumed[i], continuous[4 + i]) << "micro-step " << i;
  // Without LoRA the checkpoint does not fit, and the message says what to do.
  auto plain = std::make_shared<models::GPT>(models::GPTConfig::preset("test-llama"));
  runtime::InitOptions po;
  po.group = g;
  po.log = [](const std::string&) {};
  auto pe = runtime::initialize(plain, zero_config(stage, "bf16"), po);
  try {
    pe->load_checkpoint(dir.string());
    ADD_FAILURE() << "no error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("--lora_dim"), std::string::npos) << err.what();
  }
  g->barrier();
  if (g->rank() == 0) fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Stages, LoraCheckpoint, ::testing::Values(0, 2, 3));

TEST(LoraZeroErrors, EverythingFrozenIsRefused) {
  auto m = std::make_shared<models::GPT>(models::GPTConfig::preset("test-gpt2"));
  for (auto& p : m->parameters()) p.set_requires_grad(false);
  try {
    make_engine(m, 2);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("frozen"), std::string::npos) << e.what();
  }
}

// ---- encoder sequence classifiers: PEFT's TaskType.SEQ_CLS ----
// tests/fixtures/lora_classifier (tests/fixtures/generators/gen_lora_classifier_fixture.py): a tiny BERT, RoBERTa and
// DeBERTa-v2 (separate position projections: pos_query_proj must stay unadapted, as in PEFT) with
// a SEQ_CLS adapter of peft's default targets and the head as modules_to_save.

namespace {

const fs::path kClsFixtures = fs::path(DS_FIXTURE_DIR) / "lora_classifier";

struct ClsCase {
  std::shared_ptr<models::SequenceClassifier> model;
  nn::LoraConfig lora;
  std::map<std::string, Tensor> ref;
  models::EncoderInputs in;
};

// ds_train's LoRA flags as a SEQ_CLS run gets them: --lora_dim 4 --lora_alpha 8
// --only_optimize_lora, default targets.
nn::LoraConfig cls_lora(const models::EncoderConfig& cfg) {
  train::Options o;
  o.lora_dim = 4;
  o.lora_alpha = 8;
  o.only_optimize_lora = true;
  train::Given g;
  g.lora_alpha = true;
  return *train::encoder_lora_config(o, g, cfg);
}

ClsCase load_cls_case(const std::string& name) {
  const fs::path dir = kClsFixtures / name;
  ClsCase c;
  const auto cfg = models::read_hf_encoder_config(dir / "base");
  EXPECT_TRUE(cfg.has_value());
  c.model = models::make_encoder_classifier(*cfg, /*init=*/false);
  models::load_hf_encoder_weights(*c.model, dir / "base");
  c.lora = cls_lora(*cfg);
  nn::apply_lora(*c.model, c.lora);
  models::load_peft_classifier_adapter(*c.model, c.lora, dir / "adapter");
  c.model->train(false);
  safetensors::Reader r((dir / "reference.safetensors").string());
  for (const auto& n : r.names()) c.ref.emplace(n, r.get(n));
  c.in = {c.ref.at("input_ids").to(DType::i32), c.ref.at("attention_mask").to(DType::i32),
          c.ref.at("token_type_ids").to(DType::i32)};
  return c;
}

}  // namespace

class LoraClassifierPeft : public ::testing::TestWithParam<std::string> {};

TEST_P(LoraClassifierPeft, DefaultsLogitsLossAndGradientsMatchPeft) {
  ClsCase c = load_cls_case(GetParam());
  models::SequenceClassifier& m = *c.model;
  // The family's default targets and the head to save are peft's.
  const auto peft = read_json(kClsFixtures / GetParam() / "adapter" / "adapter_config.json");
  auto want = peft.at("target_modules").get<std::vector<std::string>>(), got = c.lora.targets;
  std::sort(want.begin(), want.end());
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, want);
  EXPECT_EQ(c.lora.modules_to_save, peft.at("modules_to_save").get<std::vector<std::string>>());
  EXPECT_EQ(peft.at("task_type"), "SEQ_CLS");

  Tensor logits;
  {
    autograd::NoGradGuard ng;
    logits = m.logits(c.in);
  }
  EXPECT_LT(max_rel(logits, c.ref.at("logits")), 1e-5);
  Tensor loss = ops::cross_entropy(m.logits(c.in), c.ref.at("labels").to(DType::i32), -100);
  EXPECT_LT(max_rel(loss, c.ref.at("loss")), 1e-5);
  loss.backward();
  // Trainable: exactly what peft trains (the LoRA matrices and the head), every gradient equal.
  int trainable = 0;
  double worst = 0;
  for (const auto& [name, p] : m.named_parameters()) {
    if (!p.requires_grad()) {
      EXPECT_FALSE(p.grad().defined()) << name << ": a frozen parameter got a gradient";
      continue;
    }
    ++trainable;
    const std::string key = "grad." + models::peft_classifier_name(m.config(), name);
    ASSERT_TRUE(c.ref.count(key)) << name << " trains, peft's " << key << " does not";
    ASSERT_TRUE(p.grad().defined()) << name;
    const double err = max_rel(p.grad(), c.ref.at(key));
    EXPECT_LT(err, 1e-5) << name;
    worst = std::max(worst, err);
  }
  int ref_grads = 0;
  for (const auto& [k, v] : c.ref) ref_grads += k.rfind("grad.", 0) == 0;
  EXPECT_EQ(trainable, ref_grads);
  std::printf("%s SEQ_CLS vs peft: logits %.2e, loss %.2e, worst gradient %.2e of %d trainable\n",
              GetParam().c_str(), max_rel(logits, c.ref.at("logits")),
              max_rel(loss, c.ref.at("loss")), worst, trainable);

  // For tests/fixtures/generators/gen_lora_classifier_fixture.py --check-export: our adapter and merged folder.
  if (const char* out = std::getenv("DS_LORA_EXPORT_DIR")) {
    const fs::path dir = fs::path(out) / GetParam();
    models::export_peft_classifier_adapter(m, m.named_parameters(), c.lora, dir / "adapter");
    const auto plain = models::make_encoder_classifier(m.config(), /*init=*/false);
    std::map<std::string, Tensor> merged;
    for (auto& [n, t] : nn::merge_lora_weights(m.named_parameters(), c.lora.scaling()))
      merged.emplace(n, t);
    for (auto& [n, t] : plain->named_parameters()) t.copy_from(merged.at(n));
    models::export_hf_encoder(*plain, dir / "merged");
  }
}

TEST_P(LoraClassifierPeft, AdapterAndMergedExportsRoundTrip) {
  ClsCase c = load_cls_case(GetParam());
  const fs::path dir = fs::temp_directory_path() / fmt::format("ds_lora_cls_{}_{}_{}", GetParam(),
                                                               comm::world()->rank(), ::getpid());
  fs::remove_all(dir);
  models::export_peft_classifier_adapter(*c.model, c.model->named_parameters(), c.lora,
                                         dir / "adapter", "/base");
  // peft's tensor names (LoRA and modules_to_save), values and config fields.
  safetensors::Reader ours((dir / "adapter" / "adapter_model.safetensors").string());
  safetensors::Reader theirs(
      (kClsFixtures / GetParam() / "adapter" / "adapter_model.safetensors").string());
  auto names = ours.names(), want = theirs.names();
  std::sort(names.begin(), names.end());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(names, want);
  for (const auto& n : want) EXPECT_EQ(max_rel(ours.get(n), theirs.get(n)), 0.0) << n;
  const auto cfg = read_json(dir / "adapter" / "adapter_config.json");
  const auto peft = read_json(kClsFixtures / GetParam() / "adapter" / "adapter_config.json");
  for (const char* k :
       {"peft_type", "task_type", "r", "lora_alpha", "fan_in_fan_out", "bias", "modules_to_save"})
    EXPECT_EQ(cfg.at(k), peft.at(k)) << k;
  auto t1 = cfg.at("target_modules").get<std::vector<std::string>>(),
       t2 = peft.at("target_modules").get<std::vector<std::string>>();
  std::sort(t1.begin(), t1.end());
  std::sort(t2.begin(), t2.end());
  EXPECT_EQ(t1, t2);
  EXPECT_EQ(cfg.at("base_model_name_or_path"), "/base");

  autograd::NoGradGuard ng;
  const Tensor logits = c.model->logits(c.in);
  // Our reload: the base from the fixture, the adapter from our folder: the same logits.
  const auto base_cfg = *models::read_hf_encoder_config(kClsFixtures / GetParam() / "base");
  auto fresh = models::make_encoder_classifier(base_cfg, /*init=*/false);
  models::load_hf_encoder_weights(*fresh, kClsFixtures / GetParam() / "base");
  nn::apply_lora(*fresh, c.lora);
  EXPECT_EQ(models::load_peft_classifier_adapter(*fresh, c.lora, dir / "adapter"),
            static_cast<int64_t>(want.size()));
  fresh->train(false);
  EXPECT_EQ(max_rel(fresh->logits(c.in), logits), 0.0);

  // Merged: a plain classifier folder with the same logits (W + s B A rounded once).
  const auto plain = models::make_encoder_classifier(base_cfg, /*init=*/false);
  std::map<std::string, Tensor> merged;
  for (auto& [n, t] : nn::merge_lora_weights(c.model->named_parameters(), c.lora.scaling()))
    merged.emplace(n, t);
  for (auto& [n, t] : plain->named_parameters()) t.copy_from(merged.at(n));
  models::export_hf_encoder(*plain, dir / "merged");
  auto reread = models::make_encoder_classifier(*models::read_hf_encoder_config(dir / "merged"),
                                                /*init=*/false);
  models::load_hf_encoder_weights(*reread, dir / "merged");
  reread->train(false);
  EXPECT_LT(max_rel(reread->logits(c.in), logits), 1e-5);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Families, LoraClassifierPeft,
                         ::testing::Values("bert", "roberta", "deberta-v2"), [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

TEST(LoraClassifier, PeftTargetRuleAndErrors) {
  // PEFT's rule: "query_proj" selects ...self.query_proj, not ...self.pos_query_proj.
  nn::LoraConfig c;
  c.peft_match = true;
  EXPECT_TRUE(
      nn::lora_target_matches(c, "encoder.layer.0.attention.self.query_proj", "query_proj"));
  EXPECT_FALSE(
      nn::lora_target_matches(c, "encoder.layer.0.attention.self.pos_query_proj", "query_proj"));
  c.peft_match = false;  // DeepSpeed-Chat's substring rule for decoders
  EXPECT_TRUE(
      nn::lora_target_matches(c, "encoder.layer.0.attention.self.pos_query_proj", "query_proj"));
  c.modules_to_save = {"classifier"};
  EXPECT_TRUE(nn::in_modules_to_save(c, "classifier.out_proj.weight"));
  EXPECT_TRUE(nn::in_modules_to_save(c, "classifier.bias"));
  EXPECT_FALSE(nn::in_modules_to_save(c, "pooler.dense.weight"));
  // A LoRA flag without --lora_dim names the flag.
  train::Options o;
  o.merge_lora = true;
  const auto cfg = *models::read_hf_encoder_config(kClsFixtures / "bert" / "base");
  try {
    train::encoder_lora_config(o, train::Given{}, cfg);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--merge_lora needs LoRA"), std::string::npos) << e.what();
  }
}

// ---- encoder-decoders: PEFT's TaskType.SEQ_2_SEQ_LM ----
// tests/fixtures/lora_seq2seq (tests/fixtures/generators/gen_lora_classifier_fixture.py --task seq2seq): adapters of
// peft's default targets over the seq2seq fixtures tests/fixtures/hf_families/{bart_s2s,
// blenderbot_s2s, t5_relu_tied}, with peft's logits, loss, gradients and greedy generation.

namespace {

const fs::path kS2sFixtures = fs::path(DS_FIXTURE_DIR) / "lora_seq2seq";
const fs::path kS2sBases = fs::path(DS_FIXTURE_DIR) / "hf_families";

// ds_train's LoRA flags as a seq2seq run gets them: --lora_dim 4 --lora_alpha 8
// [--only_optimize_lora], default targets.
nn::LoraConfig s2s_lora(const models::Seq2SeqConfig& cfg, bool only_lora = true) {
  train::Options o;
  o.lora_dim = 4;
  o.lora_alpha = 8;
  o.only_optimize_lora = only_lora;
  o.seed = 7;
  train::Given g;
  g.lora_alpha = true;
  return *train::seq2seq_lora_config(o, g, cfg);
}

// The base fixture `name`, its dropout optionally off (training steps then compare exactly).
std::shared_ptr<models::Seq2Seq> load_s2s_base(const std::string& name, bool no_dropout = false) {
  auto cfg = models::read_hf_seq2seq_config(kS2sBases / name);
  EXPECT_TRUE(cfg.has_value());
  if (no_dropout) cfg->dropout = cfg->attention_dropout = cfg->activation_dropout = 0.0f;
  auto m = std::make_shared<models::Seq2Seq>(*cfg, /*init=*/false);
  models::load_hf_seq2seq_weights(*m, kS2sBases / name);
  return m;
}

struct S2sCase {
  std::shared_ptr<models::Seq2Seq> model;
  nn::LoraConfig lora;
  nn::LoraReport report;
  std::map<std::string, Tensor> ref;
  models::Seq2SeqInputs in;
};

S2sCase load_s2s_case(const std::string& name) {
  S2sCase c;
  c.model = load_s2s_base(name);
  c.lora = s2s_lora(c.model->config());
  c.report = nn::apply_lora(*c.model, c.lora);
  models::load_peft_seq2seq_adapter(*c.model, kS2sFixtures / name / "adapter");
  c.model->train(false);
  safetensors::Reader r((kS2sFixtures / name / "reference.safetensors").string());
  for (const auto& n : r.names()) c.ref.emplace(n, r.get(n));
  c.in = {c.ref.at("input_ids").to(DType::i32),
          c.ref.at("attention_mask").to(DType::i32),
          {},
          c.ref.at("labels").to(DType::i32)};
  return c;
}

// A plain model of `m`'s config holding `m`'s weights with LoRA merged (W + s B A) and its
// buffers (final_logits_bias).
std::unique_ptr<models::Seq2Seq> merged_s2s(models::Seq2Seq& m, const nn::LoraConfig& lora) {
  auto plain = std::make_unique<models::Seq2Seq>(m.config(), /*init=*/false);
  std::map<std::string, Tensor> merged, buffers;
  for (auto& [n, t] : nn::merge_lora_weights(m.named_parameters(), lora.scaling()))
    merged.emplace(n, t);
  for (auto& [n, t] : m.named_buffers()) buffers.emplace(n, t);
  autograd::NoGradGuard ng;
  for (auto& [n, t] : plain->named_parameters()) t.copy_from(merged.at(n));
  for (auto& [n, t] : plain->named_buffers()) t.copy_from(buffers.at(n));
  plain->train(false);
  return plain;
}

std::vector<int64_t> greedy(models::Seq2Seq& m, const S2sCase& c) {
  models::GreedyOptions opt;
  opt.max_new_tokens = c.ref.at("generated").size(1) - 1;
  return m.generate_greedy(c.in.input_ids, c.in.attention_mask, opt).to_int_vector();
}

}  // namespace

class LoraSeq2SeqPeft : public ::testing::TestWithParam<std::string> {};

TEST_P(LoraSeq2SeqPeft, DefaultsLogitsLossAndGradientsMatchPeft) {
  S2sCase c = load_s2s_case(GetParam());
  models::Seq2Seq& m = *c.model;
  // The family's default targets are peft's (blenderbot: the fixture names BART's, which peft's
  // table lacks); nothing besides LoRA to save.
  const auto peft = read_json(kS2sFixtures / GetParam() / "adapter" / "adapter_config.json");
  auto want = peft.at("target_modules").get<std::vector<std::string>>(), got = c.lora.targets;
  std::sort(want.begin(), want.end());
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, want);
  EXPECT_TRUE(peft.at("modules_to_save").is_null());
  EXPECT_TRUE(c.lora.modules_to_save.empty());
  EXPECT_EQ(peft.at("task_type"), "SEQ_2_SEQ_LM");
  // q and v of every attention: encoder self, decoder self and cross.
  const auto& cfg = m.config();
  EXPECT_EQ(c.report.modules.size(),
            static_cast<size_t>(2 * (cfg.encoder_layers + 2 * cfg.decoder_layers)));

  Tensor logits;
  {
    autograd::NoGradGuard ng;
    logits = m.logits(c.in);
  }
  EXPECT_LT(max_rel(logits, c.ref.at("logits")), 1e-5);
  Tensor loss = m.loss(c.in);
  EXPECT_LT(max_rel(loss, c.ref.at("loss")), 1e-5);
  loss.backward();
  // Trainable: exactly what peft trains (the LoRA matrices; the tied shared embedding frozen),
  // every gradient equal.
  int trainable = 0;
  int64_t elements = 0;
  double worst = 0;
  for (const auto& [name, p] : m.named_parameters()) {
    if (!p.requires_grad()) {
      EXPECT_FALSE(p.grad().defined()) << name << ": a frozen parameter got a gradient";
      continue;
    }
    ++trainable;
    elements += p.numel();
    EXPECT_TRUE(nn::is_lora_parameter(name)) << name;
    const std::string key = "grad." + models::peft_seq2seq_name(name);
    ASSERT_TRUE(c.ref.count(key)) << name << " trains, peft's " << key << " does not";
    ASSERT_TRUE(p.grad().defined()) << name;
    const double err = max_rel(p.grad(), c.ref.at(key));
    EXPECT_LT(err, 1e-5) << name;
    worst = std::max(worst, err);
  }
  int ref_grads = 0;
  for (const auto& [k, v] : c.ref) ref_grads += k.rfind("grad.", 0) == 0;
  EXPECT_EQ(trainable, ref_grads);
  EXPECT_EQ(elements, c.report.lora_params);
  EXPECT_EQ(c.report.trainable_params, c.report.lora_params);
  std::printf(
      "%s SEQ_2_SEQ_LM vs peft: logits %.2e, loss %.2e, worst gradient %.2e of %d "
      "trainable (%lld elements of %lld)\n",
      GetParam().c_str(), max_rel(logits, c.ref.at("logits")), max_rel(loss, c.ref.at("loss")),
      worst, trainable, static_cast<long long>(elements),
      static_cast<long long>(c.report.total_params));

  // For tests/fixtures/generators/gen_lora_classifier_fixture.py --task seq2seq --check-export.
  if (const char* out = std::getenv("DS_LORA_EXPORT_DIR")) {
    const fs::path dir = fs::path(out) / GetParam();
    models::export_peft_seq2seq_adapter(m, m.named_parameters(), c.lora, dir / "adapter");
    models::export_hf_seq2seq(*merged_s2s(m, c.lora), dir / "merged");
  }
}

TEST_P(LoraSeq2SeqPeft, AdapterAndMergedExportsRoundTripAndGenerateAlike) {
  S2sCase c = load_s2s_case(GetParam());
  const fs::path dir = fs::temp_directory_path() / fmt::format("ds_lora_s2s_{}_{}_{}", GetParam(),
                                                               comm::world()->rank(), ::getpid());
  fs::remove_all(dir);
  models::export_peft_seq2seq_adapter(*c.model, c.model->named_parameters(), c.lora,
                                      dir / "adapter", "/base");
  // peft's tensor names, values and config fields.
  safetensors::Reader ours((dir / "adapter" / "adapter_model.safetensors").string());
  safetensors::Reader theirs(
      (kS2sFixtures / GetParam() / "adapter" / "adapter_model.safetensors").string());
  auto names = ours.names(), want = theirs.names();
  std::sort(names.begin(), names.end());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(names, want);
  for (const auto& n : want) EXPECT_EQ(max_rel(ours.get(n), theirs.get(n)), 0.0) << n;
  const auto cfg = read_json(dir / "adapter" / "adapter_config.json");
  const auto peft = read_json(kS2sFixtures / GetParam() / "adapter" / "adapter_config.json");
  for (const char* k :
       {"peft_type", "task_type", "r", "lora_alpha", "fan_in_fan_out", "bias", "modules_to_save"})
    EXPECT_EQ(cfg.at(k), peft.at(k)) << k;
  auto t1 = cfg.at("target_modules").get<std::vector<std::string>>(),
       t2 = peft.at("target_modules").get<std::vector<std::string>>();
  std::sort(t1.begin(), t1.end());
  std::sort(t2.begin(), t2.end());
  EXPECT_EQ(t1, t2);
  EXPECT_EQ(cfg.at("base_model_name_or_path"), "/base");

  autograd::NoGradGuard ng;
  const Tensor logits = c.model->logits(c.in);
  // Our reload: the base fixture, LoRA, the adapter from our folder: the same logits.
  auto fresh = load_s2s_base(GetParam());
  nn::apply_lora(*fresh, c.lora);
  EXPECT_EQ(models::load_peft_seq2seq_adapter(*fresh, dir / "adapter"),
            static_cast<int64_t>(want.size()));
  fresh->train(false);
  EXPECT_EQ(max_rel(fresh->logits(c.in), logits), 0.0);

  // Merged: a plain folder (as --merge_lora writes it) with the same logits (W + s B A rounded
  // once), and the same greedy generation as the unmerged adapters and as peft.
  models::export_hf_seq2seq(*merged_s2s(*c.model, c.lora), dir / "merged");
  auto reread = std::make_shared<models::Seq2Seq>(*models::read_hf_seq2seq_config(dir / "merged"),
                                                  /*init=*/false);
  models::load_hf_seq2seq_weights(*reread, dir / "merged");
  reread->train(false);
  EXPECT_LT(max_rel(reread->logits(c.in), logits), 1e-5);
  const auto unmerged = greedy(*c.model, c), merged = greedy(*reread, c);
  EXPECT_EQ(merged, unmerged);
  EXPECT_EQ(unmerged, c.ref.at("generated").to_int_vector());
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Families, LoraSeq2SeqPeft,
                         ::testing::Values("bart_s2s", "blenderbot_s2s", "t5_relu_tied"));

// ZeRO-3 with LoRA on an encoder-decoder takes the steps of ZeRO-0: the same losses, LoRA
// matrices and untouched frozen weights (one and two ranks, as LoraZero).
class LoraSeq2SeqZero : public ::testing::TestWithParam<std::string> {};

TEST_P(LoraSeq2SeqZero, Stage3StepsEqualStage0) {
  std::vector<double> losses0;
  std::map<std::string, Tensor> lora0;
  for (int stage : {0, 3}) {
    SCOPED_TRACE(fmt::format("{} stage {}", GetParam(), stage));
    auto model = load_s2s_base(GetParam(), /*no_dropout=*/true);
    const auto rep = nn::apply_lora(*model, s2s_lora(model->config()));
    std::map<std::string, std::vector<float>> frozen_before;
    for (const auto& [name, p] : model->named_parameters())
      if (!p.requires_grad()) frozen_before[name] = ds::testing::host_vector(p);
    auto e = make_engine(model, stage);
    EXPECT_EQ(e->strategy().flat().numel, rep.lora_params);  // only the adapters train
    const auto losses = train_steps(*e, 3);
    for (const auto& [name, p] : model->named_parameters())
      if (name.ends_with("lora_B.weight") && p.is_materialized()) {  // B trained away from zero
        double sum = 0;
        for (float v : ds::testing::host_vector(p)) sum += std::abs(v);
        EXPECT_GT(sum, 0.0) << name;
      } else if (!p.requires_grad()) {
        ASSERT_TRUE(p.is_materialized()) << name;
        EXPECT_EQ(ds::testing::host_vector(p), frozen_before[name]) << name;
      }
    std::map<std::string, Tensor> lora;
    for (const auto& [name, t] : e->full_weights())
      if (nn::is_lora_parameter(name)) lora.emplace(name, t);
    if (stage == 0) {
      losses0 = losses;
      lora0 = lora;
      continue;
    }
    double worst = 0;
    for (size_t i = 0; i < losses.size(); ++i) {
      EXPECT_NEAR(losses[i], losses0[i], 1e-6 * std::abs(losses0[i])) << "micro-step " << i;
      worst = std::max(worst, std::abs(losses[i] - losses0[i]) / std::abs(losses0[i]));
    }
    if (comm::world()->rank() == 0) {
      ASSERT_EQ(lora.size(), lora0.size());
      // lora_B starts at zero, and Adam turns the summation-order noise of a near-zero gradient
      // into a visible step: 1e-5 held at -O2 but not in the sanitizer build (-O1: 1.4e-5).
      for (const auto& [name, t] : lora) EXPECT_LT(max_rel(t, lora0.at(name)), 1e-4) << name;
      std::printf("%s LoRA, %d ranks: stage 3 vs stage 0 losses, max rel diff %.2e\n",
                  GetParam().c_str(), comm::world()->size(), worst);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, LoraSeq2SeqZero, ::testing::Values("bart_s2s", "t5_relu_tied"));

TEST(LoraSeq2Seq, FamilyTargetsAndErrors) {
  models::Seq2SeqConfig bart, t5;
  t5.family = "t5";
  EXPECT_EQ(train::seq2seq_lora_targets(bart), (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(train::seq2seq_lora_targets(t5), (std::vector<std::string>{"q", "v"}));
  train::Options o;
  EXPECT_FALSE(train::seq2seq_lora_config(o, train::Given{}, bart).has_value());
  o.only_optimize_lora = true;  // a LoRA flag without --lora_dim names the flag
  try {
    train::seq2seq_lora_config(o, train::Given{}, bart);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--only_optimize_lora needs LoRA"), std::string::npos)
        << e.what();
  }
  // PEFT's rule: "q" adapts T5's SelfAttention.q and EncDecAttention.q, nothing else.
  o.lora_dim = 2;
  auto m = load_s2s_base("t5_relu_tied");
  const auto rep = nn::apply_lora(*m, *train::seq2seq_lora_config(o, train::Given{}, m->config()));
  for (const auto& name : rep.modules)
    EXPECT_TRUE(name.ends_with(".q") || name.ends_with(".v")) << name;
  // A seq2seq adapter saves nothing besides LoRA.
  nn::LoraConfig bad = s2s_lora(m->config());
  bad.modules_to_save = {"lm_head"};
  try {
    models::export_peft_seq2seq_adapter(*m, m->named_parameters(), bad,
                                        fs::temp_directory_path() / "ds_lora_s2s_never");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("modules_to_save"), std::string::npos) << e.what();
  }
}

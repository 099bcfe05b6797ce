// Parity with PyTorch: logits, loss, every parameter gradient and ten AdamW steps of both layouts
// against a float64 PyTorch reference (tests/fixtures/parity, written by
// tests/fixtures/generators/gen_parity_fixture.py).
//
// Error measure, per tensor: rel = max|ours - ref| / max(max|ref|, 1e-30), i.e. the worst absolute
// error relative to the tensor's scale (an elementwise relative error would blow up on entries
// that are ~0 by cancellation).
//
// Tolerances. We compute in fp32 (unit roundoff 6e-8); the reference in float64 from the same
// fp32 parameters, so the difference is our rounding alone. Through ~20 ops of depth, each
// summing at most a few hundred terms, that grows to ~1e-6 of the tensor's scale; 1e-5 leaves a
// 10x margin while any real mistake (a missing term, a wrong scale, a transposed weight) shows up
// at 1e-2 or more. The AdamW losses get 1e-4: Adam divides by sqrt(v) + 1e-8, which amplifies
// rounding in gradients near zero over the steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "devices.h"
#include "ds/core/safetensors.h"
#include "ds/models/gpt.h"
#include "ds/nn/flat.h"
#include "ds/optim/kernels.h"
#include "ds/optim/optimizer.h"
#include "hf_fixture.h"

using namespace ds;
using ds::testing::rel_err;
using models::GPT;
using models::GPTConfig;

namespace {

constexpr double kTol = 1e-5;      // logits, loss, gradients (see above)
constexpr double kAdamTol = 1e-4;  // AdamW losses (see above)


std::string fixture_path(const std::string& layout) {
  return std::string(DS_FIXTURE_DIR) + "/parity/" + layout + ".safetensors";
}

// The model of the fixture's config with the fixture's parameters, copied by name. Every model
// parameter must be in the fixture and every fixture parameter in the model.
std::unique_ptr<GPT> load_model(const safetensors::Reader& r) {
  auto model =
      std::make_unique<GPT>(GPTConfig::from_json_string(r.metadata("config")), /*init=*/false);
  size_t in_file = 0;
  for (const auto& e : r.entries()) in_file += e.name.rfind("param.", 0) == 0;
  const auto named = model->named_parameters();
  EXPECT_EQ(named.size(), in_file) << "the model and the fixture differ in their parameter sets";
  for (const auto& [name, p] : named) r.read_into("param." + name, p);
  return model;
}

class Parity : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    reader_ = std::make_unique<safetensors::Reader>(fixture_path(GetParam()));
  }
  const safetensors::Reader& r() const { return *reader_; }
  Tensor ids() const { return r().get("input_ids"); }
  Tensor targets() const { return r().get("targets"); }

  std::unique_ptr<safetensors::Reader> reader_;
};

}  // namespace

TEST_P(Parity, FixtureUsesTheTestPreset) {
  // The fixture generator copies the test presets; keep the two from drifting apart.
  const GPTConfig cfg = GPTConfig::from_json_string(r().metadata("config"));
  EXPECT_EQ(cfg.to_json_string(), GPTConfig::preset("test-" + GetParam()).to_json_string());
}

TEST_P(Parity, LogitsLossAndEveryGradient) {
  auto model = load_model(r());
  Tensor logits = model->logits(ids());
  const double e_logits = rel_err(logits.to_vector(), r().get("logits").to_vector());
  EXPECT_LE(e_logits, kTol) << "logits";

  Tensor loss = model->loss(ids(), targets());
  const double ref_loss = r().get("loss").item();
  const double e_loss = std::abs(loss.item() - ref_loss) / std::abs(ref_loss);
  EXPECT_LE(e_loss, kTol) << "loss " << loss.item() << " vs " << ref_loss;

  loss.backward();
  double worst = 0.0;
  std::string worst_name;
  for (const auto& [name, p] : model->named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name << " got no gradient";
    const double e = rel_err(p.grad().to_vector(), r().get("grad." + name).to_vector());
    EXPECT_LE(e, kTol) << "gradient of " << name;
    if (e > worst) {
      worst = e;
      worst_name = name;
    }
  }
  std::printf("[parity] %s: logits %.2e, loss %.2e, worst gradient %.2e (%s)\n", GetParam().c_str(),
              e_logits, e_loss, worst, worst_name.c_str());
}

TEST_P(Parity, CheckpointedGradientsAreIdentical) {
  auto model = load_model(r());
  model->loss(ids(), targets()).backward();
  std::vector<std::vector<float>> plain;
  for (const auto& [name, p] : model->named_parameters()) plain.push_back(p.grad().to_vector());

  model->zero_grad();
  model->set_gradient_checkpointing(true);
  Tensor loss = model->loss(ids(), targets());
  EXPECT_LE(std::abs(loss.item() - r().get("loss").item()) / std::abs(r().get("loss").item()),
            kTol);
  loss.backward();
  size_t i = 0;
  for (const auto& [name, p] : model->named_parameters()) {
    // Bitwise: the recomputation runs the same kernels on the same data.
    EXPECT_EQ(p.grad().to_vector(), plain[i++]) << "checkpointed gradient of " << name;
    EXPECT_LE(rel_err(p.grad().to_vector(), r().get("grad." + name).to_vector()), kTol) << name;
  }
}

TEST_P(Parity, TenAdamWSteps) {
  auto model = load_model(r());
  nn::FlatParameters flat = nn::flatten_parameters(*model);
  optim::OptimizerParams hp;
  hp.lr = 1e-3f;
  hp.beta1 = 0.9f;
  hp.beta2 = 0.999f;
  hp.eps = 1e-8f;
  hp.weight_decay = 0.1f;
  auto opt = optim::make_optimizer("AdamW", hp);
  const std::vector<float> ref = r().get("adamw_losses").to_vector();
  ASSERT_EQ(ref.size(), 10u);
  const Tensor x = ids(), y = targets();
  double worst = 0.0;
  for (size_t step = 0; step < ref.size(); ++step) {
    flat.grads.zero_();
    Tensor loss = model->loss(x, y);
    loss.backward();
    opt->step(flat.params.data<float>(), flat.grads.data<float>(), flat.numel);
    const double e = std::abs(loss.item() - ref[step]) / std::abs(ref[step]);
    EXPECT_LE(e, kAdamTol) << "step " << step << ": loss " << loss.item() << " vs " << ref[step];
    worst = std::max(worst, e);
  }
  std::printf("[parity] %s: 10 AdamW steps, worst loss error %.2e\n", GetParam().c_str(), worst);
}

// The same checks with the model on each device (tests/devices.h: sim, and a GPU): logits, loss
// and every gradient within the same tolerance of the float64 reference, and checkpointed
// gradients bitwise equal to the plain ones (the CUDA kernels are deterministic too).
TEST_P(Parity, LogitsLossAndEveryGradientOnGpu) {
  bool ran = false;
  for (const Device dev : ds::testing::test_devices()) {
    if (dev.is_cpu()) continue;
    ran = true;
    auto model = load_model(r());
    model->to(dev);
    const Tensor x = ds::testing::to_device(ids(), dev), y = ds::testing::to_device(targets(), dev);
    Tensor logits = model->logits(x);
    EXPECT_EQ(logits.device(), dev);
    const double e_logits = rel_err(logits.to_vector(), r().get("logits").to_vector());
    EXPECT_LE(e_logits, kTol) << "logits on " << dev.str();
    Tensor loss = model->loss(x, y);
    const double ref_loss = r().get("loss").item();
    const double e_loss = std::abs(loss.item() - ref_loss) / std::abs(ref_loss);
    EXPECT_LE(e_loss, kTol) << "loss " << loss.item() << " vs " << ref_loss << " on " << dev.str();
    loss.backward();
    double worst = 0.0;
    std::string worst_name;
    std::vector<std::vector<float>> plain;
    for (const auto& [name, p] : model->named_parameters()) {
      ASSERT_TRUE(p.grad().defined()) << name << " got no gradient on " << dev.str();
      EXPECT_EQ(p.grad().device(), dev) << name;
      plain.push_back(p.grad().to_vector());
      const double e = rel_err(plain.back(), r().get("grad." + name).to_vector());
      EXPECT_LE(e, kTol) << "gradient of " << name << " on " << dev.str();
      if (e > worst) {
        worst = e;
        worst_name = name;
      }
    }
    std::printf("[parity] %s on %s: logits %.2e, loss %.2e, worst gradient %.2e (%s)\n",
                GetParam().c_str(), dev.str().c_str(), e_logits, e_loss, worst,
                worst_name.c_str());
    model->zero_grad();
    model->set_gradient_checkpointing(true);
    model->loss(x, y).backward();
    size_t i = 0;
    for (const auto& [name, p] : model->named_parameters())
      EXPECT_EQ(p.grad().to_vector(), plain[i++]) << "checkpointed gradient of " << name;
  }
  if (!ran) GTEST_SKIP() << "no GPU in this build or on this machine";
}

// Ten AdamW steps trained on each device (sim, and a GPU): flat parameters, gradients and moments
// in device memory, the step on the device (optim::adam_update over tensors), losses against
// PyTorch's.
TEST_P(Parity, TenAdamWStepsOnGpu) {
  bool ran = false;
  for (const Device dev : ds::testing::test_devices()) {
    if (dev.is_cpu()) continue;
    ran = true;
    auto model = load_model(r());
    model->to(dev);
    nn::FlatParameters flat = nn::flatten_parameters(*model);
    ASSERT_EQ(flat.params.device(), dev);
    const Tensor m = Tensor::zeros({flat.padded_numel}, DType::f32, dev);
    const Tensor v = Tensor::zeros({flat.padded_numel}, DType::f32, dev);
    optim::AdamConfig c;  // AdamW as torch.optim.AdamW in the fixture generator
    c.lr = 1e-3f;
    c.weight_decay = 0.1f;
    const std::vector<float> ref = r().get("adamw_losses").to_vector();
    const Tensor x = ds::testing::to_device(ids(), dev), y = ds::testing::to_device(targets(), dev);
    double worst = 0.0;
    for (size_t step = 0; step < ref.size(); ++step) {
      flat.grads.zero_();
      Tensor loss = model->loss(x, y);
      loss.backward();
      optim::adam_update(flat.params, flat.grads, m, v, static_cast<int64_t>(step) + 1, c);
      const double e = std::abs(loss.item() - ref[step]) / std::abs(ref[step]);
      EXPECT_LE(e, kAdamTol) << "step " << step << " on " << dev.str();
      worst = std::max(worst, e);
    }
    std::printf("[parity] %s on %s: 10 AdamW steps, worst loss error %.2e\n", GetParam().c_str(),
                dev.str().c_str(), worst);
  }
  if (!ran) GTEST_SKIP() << "no GPU in this build or on this machine";
}

INSTANTIATE_TEST_SUITE_P(Layouts, Parity, ::testing::Values("gpt2", "llama"),
                         [](const auto& info) { return info.param; });

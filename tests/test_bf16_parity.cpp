// bf16 numerics against PyTorch's own bf16 (tests/fixtures/parity/<layout>_bf16.safetensors,
// written by tests/fixtures/generators/gen_bf16_parity_fixture.py from the fp32 parity fixture's model, parameters and
// batch), and 100 steps of bf16 training against the same run in fp32.
//
// Our bf16 mode is DeepSpeed's (docs/precision.md): bf16 parameters and
// activations, fp32 master weights, optimizer and gradient accumulation. Its PyTorch analogue is
// the module in bf16 (model.to(torch.bfloat16)), the fixture's "torch_bf16" run; the fixture also
// holds torch.autocast("cpu", bfloat16) (fp32 parameters and residual stream, bf16 matmuls),
// printed for comparison, and a float64 reference. All three start from the same bf16-rounded
// parameters, so each run's distance to the reference is its own arithmetic, not the parameter
// rounding.
//
// Error measure, per tensor: rel = max|x - ref| / max|ref| (as test_parity.cpp).
//
// Tolerances. bf16's unit roundoff is u = 2^-9 (8 significant bits, 2^-8 between neighbours
// in [1, 2)); every bf16 output is rounded, so even a perfect bf16 implementation is ~u off, and
// through the model's ~20 rounded op outputs the errors reach ~1e-2 of the tensor's scale
// (measured: PyTorch-bf16 logits 1.0e-2, its worst gradient 1.8e-2 (gpt2) / 2.8e-2 (llama)).
// Any fixed tolerance at that level would not tell a careful implementation from a sloppy one, so
// the test is relative to PyTorch:
//   ours <= max(kRatio * torch, kFloor)   and   ours <= kCap (logits, gradients)
// kRatio = 2: our kernels round no more often than PyTorch's (fused attention rounds its output
// once where PyTorch rounds q k^T, the scaled scores, the softmax and p v; the head's cross-entropy
// runs in fp32 on the rounded logits as PyTorch's does; norms and activations compute in fp32 and
// round their output once, as PyTorch's CPU kernels do), so there is no reason to be worse at all;
// 2 leaves room for the scatter of a per-tensor maximum, which is one element's error (measured
// ours / PyTorch: 0.3 to 1.5). kFloor = 2^-8: one bf16 ulp at the tensor's scale, below which a
// tensor can be off by the final rounding alone (a lucky PyTorch result on a small tensor must not
// make the ratio meaningless). kCap = 5e-2: an absolute bound, ~2x PyTorch's worst gradient.
// Averaged over all gradients that luck evens out, and there we demand
// kMeanRatio = 1.1, no worse than PyTorch (measured 0.68 gpt2, 0.85 llama) with 10% for other
// machines' GEMM kernels (oneDNN picks AMX, AVX-512 bf16 or its fp32 fallback by CPU).
// The loss: PyTorch's bf16 module returns a bf16 loss (its final rounding is <= 2^-9 relative);
// ours is computed in fp32 from the bf16 logits and returned in fp32 (ops.h), as autocast's, so
// it carries only the logits' error, whose mean over the batch largely cancels: loss error within
// 2 * 2^-8 relative of the reference (measured 6.7e-4 gpt2, 2.6e-4 llama; PyTorch bf16 2.2e-3,
// 2.0e-3). Checked to fail: with float -> bf16 conversion truncating instead
// of rounding to nearest even (src/core/dtype.cpp's vectorised path), our mean gradient error
// is 2.5-3.3x PyTorch's (3.1e-2 vs 1.2e-2 gpt2, 4.9e-2 vs 1.5e-2 llama) and the logits' 2.8-3.3x:
// both checks fail.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <numeric>
#include <string>

#include "ds/core/safetensors.h"
#include "ds/models/gpt.h"
#include "ds/nn/flat.h"
#include "ds/runtime/engine.h"
#include "hf_fixture.h"

using namespace ds;
using ds::testing::rel_err;
using models::GPT;
using models::GPTConfig;

namespace {

constexpr double kRatio = 2.0;          // ours / PyTorch-bf16 (see above)
constexpr double kFloor = 1.0 / 256;    // 2^-8: one bf16 ulp at the tensor's scale
constexpr double kCap = 5e-2;           // absolute, logits and gradients
constexpr double kLossTol = 2.0 / 256;  // loss, relative to the reference
constexpr double kMeanRatio = 1.1;      // mean over all gradients, ours / PyTorch-bf16


std::string fixture_path(const std::string& name) {
  return std::string(DS_FIXTURE_DIR) + "/parity/" + name + ".safetensors";
}

class Bf16Parity : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    fp32_ = std::make_unique<safetensors::Reader>(fixture_path(GetParam()));
    bf16_ = std::make_unique<safetensors::Reader>(fixture_path(GetParam() + "_bf16"));
  }
  // The model of the fp32 fixture with its parameters, flattened into a bf16 buffer with fp32
  // gradients, as the engine holds a model in bf16 mode (zero/flat_strategy.cpp: round to nearest
  // even, gradients accumulated in fp32).
  std::unique_ptr<GPT> load_bf16_model(nn::FlatParameters& flat) const {
    auto model = std::make_unique<GPT>(GPTConfig::from_json_string(fp32_->metadata("config")),
                                       /*init=*/false);
    for (const auto& [name, p] : model->named_parameters()) fp32_->read_into("param." + name, p);
    flat = nn::flatten_parameters(*model, DType::bf16, DType::f32, 1, /*with_grads=*/true);
    return model;
  }
  std::unique_ptr<safetensors::Reader> fp32_, bf16_;
};

}  // namespace

TEST_P(Bf16Parity, FixtureMatchesTheFp32Fixture) {
  // Same batch and config as the fp32 fixture the parameters are read from.
  EXPECT_EQ(bf16_->get("input_ids").to_vector(), fp32_->get("input_ids").to_vector());
  EXPECT_EQ(bf16_->get("targets").to_vector(), fp32_->get("targets").to_vector());
  EXPECT_EQ(GPTConfig::from_json_string(bf16_->metadata("config")).to_json_string(),
            GPTConfig::from_json_string(fp32_->metadata("config")).to_json_string());
}

TEST_P(Bf16Parity, NoWorseThanPyTorchBf16) {
  nn::FlatParameters flat;
  auto model = load_bf16_model(flat);
  ASSERT_EQ(flat.params.dtype(), DType::bf16);
  const Tensor ids = fp32_->get("input_ids"), targets = fp32_->get("targets");
  const safetensors::Reader& r = *bf16_;

  // Checks one tensor; prints ours / PyTorch-bf16 / autocast, all against the float64 reference.
  struct Row {
    std::string name;
    double ours, torch, autocast;
  };
  std::vector<Row> rows;
  auto check = [&](const std::string& name, const std::vector<float>& ours,
                   const std::string& key) {
    const std::vector<float> ref = r.get("ref." + key).to_vector();
    const Row row{name, rel_err(ours, ref), rel_err(r.get("torch_bf16." + key).to_vector(), ref),
                  rel_err(r.get("autocast." + key).to_vector(), ref)};
    EXPECT_LE(row.ours, std::max(kRatio * row.torch, kFloor))
        << name << ": ours " << row.ours << " vs PyTorch bf16 " << row.torch;
    EXPECT_LE(row.ours, kCap) << name;
    rows.push_back(row);
  };

  Tensor logits = model->logits(ids);
  EXPECT_EQ(logits.dtype(), DType::bf16);
  check("logits", logits.to_vector(), "logits");

  Tensor loss = model->loss(ids, targets);
  const double ref_loss = r.get("ref.loss").item();
  const double e_loss = std::abs(loss.item() - ref_loss) / std::abs(ref_loss);
  const double e_loss_torch =
      std::abs(r.get("torch_bf16.loss").item() - ref_loss) / std::abs(ref_loss);
  const double e_loss_ac = std::abs(r.get("autocast.loss").item() - ref_loss) / std::abs(ref_loss);
  EXPECT_LE(e_loss, kLossTol) << "loss " << loss.item() << " vs " << ref_loss;

  loss.backward();
  for (const auto& [name, p] : model->named_parameters()) {
    ASSERT_TRUE(p.grad().defined() && p.grad().dtype() == DType::f32) << name;
    check("grad " + name, p.grad().to_vector(), "grad." + name);
  }

  std::printf("[bf16 parity] %s, error vs float64 (max|x - ref| / max|ref|):\n",
              GetParam().c_str());
  std::printf("  %-40s %10s %10s %10s\n", "tensor", "ours", "torch bf16", "autocast");
  std::printf("  %-40s %10.2e %10.2e %10.2e   (%.4f / %.4f / %.4f vs %.4f)\n", "loss", e_loss,
              e_loss_torch, e_loss_ac, loss.item(), r.get("torch_bf16.loss").item(),
              r.get("autocast.loss").item(), ref_loss);
  double worst[3] = {0, 0, 0}, sum[3] = {0, 0, 0};
  for (const Row& row : rows) {
    std::printf("  %-40s %10.2e %10.2e %10.2e\n", row.name.c_str(), row.ours, row.torch,
                row.autocast);
    if (row.name == "logits") continue;
    worst[0] = std::max(worst[0], row.ours);
    worst[1] = std::max(worst[1], row.torch);
    worst[2] = std::max(worst[2], row.autocast);
    sum[0] += row.ours;
    sum[1] += row.torch;
    sum[2] += row.autocast;
  }
  const double n = static_cast<double>(rows.size() - 1);
  std::printf("  %-40s %10.2e %10.2e %10.2e\n", "worst gradient", worst[0], worst[1], worst[2]);
  std::printf("  %-40s %10.2e %10.2e %10.2e\n", "mean gradient", sum[0] / n, sum[1] / n,
              sum[2] / n);
  // Over all gradients the single-element luck averages out: no worse than PyTorch on the mean.
  EXPECT_LE(sum[0], kMeanRatio * sum[1]) << "mean gradient error above PyTorch-bf16's";
}

INSTANTIATE_TEST_SUITE_P(Layouts, Bf16Parity, ::testing::Values("gpt2", "llama"),
                         [](const auto& info) { return info.param; });

// ---- 100 steps of bf16 training track fp32 ----
//
// The demo's corpus (State of the Union addresses, .cache/data/sotu from scripts/fetch_data.sh),
// as three of its files committed at tests/fixtures/data/sotu_1790_1792.txt (35 KB, ASCII) so the
// test needs no download; tokens are bytes (vocab 128: the GPT-2 tokenizer's 50257 would make a
// test-sized model all embedding). test-gpt2 with that vocabulary and T = 32, micro-batch 4,
// AdamW through runtime::Engine, warmup to 3e-3 over 10 steps then linear decay over 100: once in
// fp32, once with "bf16": {"enabled": true}, same initial weights and batches.
//
// Band. The two runs differ by bf16's rounding of the forward and backward (~2^-8 relative per
// op, ~1e-2 of the logits' scale after the model; the loss, a mean over 128 tokens, is ~1e-3
// off, see the parity test above, and fp32 like fp32's) and by the drift this causes in the weights
// (the fp32 master weights keep the updates, so the drift stays at the rounding level rather than
// compounding). Demanded:
//   - every 10-step mean of the bf16 losses within kWindowTol = 0.1% (relative) of fp32's,
//   - the last 10-step mean within kFinalTol = 0.1% of fp32's,
//   - no drift to one side: the mean over steps 11-100 of (bf16 - fp32) / fp32 within
//     kBiasTol = 0.05%; rounding errors of a correct implementation have no sign, so this mean is
//     far smaller than any single window's difference,
//   - each run's loss falls by more than 30% (the runs learn; tracking a flat curve proves
//   nothing).
// Measured (Release, 2 cores, AVX512-BF16 EPYC): loss 4.874 -> 2.925 in fp32; worst window
// difference 9.4e-5, final 5.8e-5, signed mean 2.1e-5, worst single step 4.0e-4. The bounds are
// 10-25x the measured values, so other machines' GEMM kernels pass. (When the loss was returned
// in bf16 the per-step rounding of the loss alone made the window differences ~1e-3.)
// Checked to fail: with the master weights rounded to bf16 after each step (DeepSpeed bf16
// without its fp32 master copy: the LayerNorm weights' updates fall below half an ulp of 1.0 and
// are lost) the bf16 curve lies above fp32's in every window (worst 9.6e-3, mean 3.8e-3).
namespace {

constexpr double kWindowTol = 0.001;
constexpr double kBiasTol = 0.0005;
constexpr double kFinalTol = 0.001;
constexpr int kSteps = 100;
constexpr int64_t kB = 4, kT = 32, kVocab = 128;

std::vector<int32_t> corpus_tokens() {
  const std::string path = std::string(DS_FIXTURE_DIR) + "/data/sotu_1790_1792.txt";
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing " << path;
  const std::string text{std::istreambuf_iterator<char>(in), {}};
  std::vector<int32_t> toks;
  toks.reserve(text.size());
  for (unsigned char c : text) toks.push_back(static_cast<int32_t>(c & 0x7f));
  return toks;
}

std::vector<float> train_curve(bool bf16, const std::vector<int32_t>& toks) {
  GPTConfig cfg = GPTConfig::preset("test-gpt2");
  cfg.vocab_size = kVocab;
  cfg.block_size = kT;
  auto model = std::make_shared<GPT>(cfg);  // seeded init: the same weights in both runs
  const std::string json = fmt::format(R"({{
    "train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": 1, {}
    "optimizer": {{"type": "AdamW", "params": {{"lr": 3e-3, "weight_decay": 0.01}}}},
    "scheduler": {{"type": "WarmupDecayLR", "params": {{"warmup_max_lr": 3e-3,
      "warmup_num_steps": 10, "total_num_steps": {}, "warmup_type": "linear"}}}}
  }})",
                                       kB, bf16 ? R"("bf16": {"enabled": true},)" : "", kSteps);
  runtime::InitOptions opt;
  opt.log = [](const std::string&) {};
  auto engine = runtime::initialize(model, json, opt);
  uint64_t x = 12345;  // the same batches in both runs
  const uint64_t span = toks.size() - kT - 1;
  std::vector<float> losses;
  for (int s = 0; s < kSteps; ++s) {
    std::vector<int64_t> in(kB * kT), tg(kB * kT);
    for (int64_t b = 0; b < kB; ++b) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      const uint64_t at = (x >> 33) % span;
      for (int64_t t = 0; t < kT; ++t) {
        in[b * kT + t] = toks[at + t];
        tg[b * kT + t] = toks[at + t + 1];
      }
    }
    Tensor loss = engine->forward(Tensor::from_ints(in, {kB, kT}, DType::i32),
                                  Tensor::from_ints(tg, {kB, kT}, DType::i32));
    EXPECT_EQ(loss.dtype(), DType::f32);  // the loss is fp32 in either mode (ops.h)
    engine->backward(loss);
    engine->step();
    losses.push_back(loss.item());
  }
  return losses;
}

double mean(const std::vector<float>& v, size_t from, size_t n) {
  return std::accumulate(v.begin() + static_cast<std::ptrdiff_t>(from),
                         v.begin() + static_cast<std::ptrdiff_t>(from + n), 0.0) /
         static_cast<double>(n);
}

}  // namespace

TEST(Bf16Training, HundredStepsTrackFp32) {
  const std::vector<int32_t> toks = corpus_tokens();
  ASSERT_GT(toks.size(), 30000u);
  const std::vector<float> f32 = train_curve(false, toks), b16 = train_curve(true, toks);
  ASSERT_EQ(f32.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(b16.size(), static_cast<size_t>(kSteps));
  double worst_window = 0.0, worst_step = 0.0;
  for (int s = 0; s < kSteps; ++s)
    worst_step = std::max(worst_step, std::abs(static_cast<double>(b16[s]) - f32[s]) / f32[s]);
  std::printf("[bf16 training] 10-step means, fp32 / bf16 / relative difference:\n");
  for (int w = 0; w + 10 <= kSteps; w += 10) {
    const double a = mean(f32, w, 10), b = mean(b16, w, 10);
    const double d = std::abs(b - a) / a;
    worst_window = std::max(worst_window, d);
    std::printf("  steps %3d-%3d  %.4f  %.4f  %.2e\n", w + 1, w + 10, a, b, d);
    EXPECT_LE(d, kWindowTol) << "steps " << w + 1 << "-" << w + 10;
  }
  const double fa = mean(f32, kSteps - 10, 10), fb = mean(b16, kSteps - 10, 10);
  const double final_d = std::abs(fb - fa) / fa;
  std::printf("  worst window %.2e, final %.2e, worst single step %.2e; loss %.3f -> %.3f (fp32)\n",
              worst_window, final_d, worst_step, f32.front(), fa);
  EXPECT_LE(final_d, kFinalTol);
  double bias = 0.0;
  for (int s = 10; s < kSteps; ++s) bias += (static_cast<double>(b16[s]) - f32[s]) / f32[s];
  bias /= kSteps - 10;
  std::printf("  mean signed difference over steps 11-%d: %.2e\n", kSteps, bias);
  EXPECT_LE(std::abs(bias), kBiasTol) << "the bf16 curve drifts to one side of fp32's";
  EXPECT_LT(fa, 0.7 * mean(f32, 0, 10)) << "fp32 did not learn";
  EXPECT_LT(fb, 0.7 * mean(b16, 0, 10)) << "bf16 did not learn";
}

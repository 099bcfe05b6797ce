// muP optimizers (optim/mup.h): mup's width multipliers (InfShape rules) and MuAdam / MuAdamW /
// MuSGD as Adam / AdamW / SGD with per-tensor lr and weight decay scaled by them; the engine with
// a base model's shapes, and without (the plain optimizer, bitwise).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "ds/comm/group.h"
#include "ds/models/gpt.h"
#include "ds/optim/mup.h"
#include "ds/runtime/engine.h"

using namespace ds;
using optim::MupKind;

namespace {

using Shape = std::vector<int64_t>;

optim::MupScale scale(MupKind k, Shape s, Shape b) {
  return optim::mup_scale(k, s, b);
}

}  // namespace

TEST(MupScale, InfShapeRules) {
  // A matrix twice as wide in both dimensions: width_mult = fan-in's = 2.
  auto a = scale(MupKind::adamw, {128, 64}, {64, 32});
  EXPECT_FLOAT_EQ(a.lr, 0.5f);
  EXPECT_FLOAT_EQ(a.weight_decay, 2.0f);
  // Vector-like (one width dimension: a bias, an embedding (V, C)): Adam keeps it.
  a = scale(MupKind::adam, {128}, {64});
  EXPECT_FLOAT_EQ(a.lr, 1.0f);
  a = scale(MupKind::adam, {50257, 64}, {50257, 32});
  EXPECT_FLOAT_EQ(a.lr, 1.0f);
  // SGD: vector-like lr * width_mult, wd / width_mult.
  a = scale(MupKind::sgd, {50257, 64}, {50257, 32});
  EXPECT_FLOAT_EQ(a.lr, 2.0f);
  EXPECT_FLOAT_EQ(a.weight_decay, 0.5f);
  // SGD matrix: lr / (fan-in mult / fan-out mult).
  a = scale(MupKind::sgd, {256, 64}, {64, 32});  // fan-out x4, fan-in x2: r = 0.5
  EXPECT_FLOAT_EQ(a.lr, 2.0f);
  EXPECT_FLOAT_EQ(a.weight_decay, 0.5f);
  a = scale(MupKind::sgd, {128, 64}, {64, 32});
  EXPECT_FLOAT_EQ(a.lr, 1.0f);
  // Finite everywhere: unchanged.
  a = scale(MupKind::sgd, {8, 8}, {8, 8});
  EXPECT_FLOAT_EQ(a.lr, 1.0f);
  EXPECT_THROW(scale(MupKind::adam, {8, 8, 8}, {4, 4, 4}), Error);
  EXPECT_THROW(scale(MupKind::adam, {8, 8}, {8}), Error);
}

// MuAdamW over two segments = AdamW on each with its scaled lr and weight decay, bitwise.
TEST(MupOptimizer, IsThePlainOptimizerWithScaledGroups) {
  for (const char* type : {"MuAdam", "MuAdamW", "MuSGD"}) {
    optim::OptimizerParams p;
    p.lr = 1e-2f;
    p.weight_decay = 0.1f;
    p.momentum = 0.9f;
    auto mu = optim::make_optimizer(type, p);
    EXPECT_STREQ(mu->name(), type);
    const std::vector<optim::Segment> segs = {{0, 40}, {40, 24}};
    mu->set_segments(segs);
    auto& m = static_cast<optim::Mup&>(*mu);
    const std::vector<optim::MupScale> sc = {{0.5f, 2.0f}, {2.0f, 0.25f}};
    m.set_scales(sc);
    std::vector<float> w(64), g(64);
    for (int i = 0; i < 64; ++i) w[i] = 0.01f * static_cast<float>(i % 7 - 3);
    std::vector<float> want = w;
    const std::string plain = std::string(type) == "MuSGD" ? "SGD" : "Adam";
    std::vector<std::unique_ptr<optim::Optimizer>> ref;
    for (size_t s = 0; s < 2; ++s) {
      optim::OptimizerParams q = p;
      q.lr *= sc[s].lr;
      q.weight_decay *= sc[s].weight_decay;
      q.adam_w_mode = std::string(type) == "MuAdamW";  // MuAdam is torch Adam: L2 decay
      ref.push_back(optim::make_optimizer(plain, q));
    }
    for (int step = 0; step < 3; ++step) {
      for (int i = 0; i < 64; ++i) g[i] = 0.1f * static_cast<float>((i * 5 + step) % 9 - 4);
      mu->step(w.data(), g.data(), 64);
      for (size_t s = 0; s < 2; ++s)
        ref[s]->step(want.data() + segs[s].offset, g.data() + segs[s].offset, segs[s].numel);
    }
    for (int i = 0; i < 64; ++i) ASSERT_EQ(w[i], want[i]) << type << " element " << i;
  }
}

namespace {

std::unique_ptr<runtime::Engine> engine(const std::string& type, int64_t n_embd,
                                        std::map<std::string, Shape> base = {}) {
  auto c = models::GPTConfig::preset("test-gpt2");
  c.n_embd = n_embd;
  auto model = std::make_shared<models::GPT>(c);
  runtime::InitOptions opt;
  opt.group = comm::single_process_group();
  opt.log = [](const std::string&) {};
  opt.mup_base_shapes = std::move(base);
  return runtime::initialize(model,
                             fmt::format(R"({{"train_batch_size": 2,
      "optimizer": {{"type": "{}", "params": {{"lr": 3e-3, "weight_decay": 0.01}}}}}})",
                                         type),
                             opt);
}

std::vector<float> losses(runtime::Engine& e, int steps) {
  std::vector<float> out;
  for (int s = 0; s < steps; ++s) {
    Tensor x = Tensor::empty({2, 16}, DType::i32), y = Tensor::empty({2, 16}, DType::i32);
    for (int64_t i = 0; i < 32; ++i) {
      x.data<int32_t>()[i] = static_cast<int32_t>((s * 7 + i * 3) % 64);
      y.data<int32_t>()[i] = static_cast<int32_t>((s * 7 + i * 3 + 3) % 64);
    }
    Tensor loss = e.forward(x, y);
    e.backward(loss);
    e.step();
    out.push_back(loss.item());
  }
  return out;
}

}  // namespace

TEST(MupEngine, BaseShapesScaleTheHiddenMatrices) {
  const int64_t C = models::GPTConfig::preset("test-gpt2").n_embd;
  // The base model: half the width (mup's base shapes, by name).
  std::map<std::string, Shape> base;
  {
    auto half = engine("AdamW", C / 2);
    for (const auto& e : half->strategy().flat().entries) base[e.name] = e.shape;
  }
  auto e = engine("MuAdamW", C, base);
  auto& mu = static_cast<optim::Mup&>(e->optimizer());
  const auto& entries = e->strategy().flat().entries;
  ASSERT_EQ(mu.scales().size(), entries.size());
  int halved = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const bool matrix = entries[i].shape.size() == 2 && entries[i].name.rfind("h.", 0) == 0;
    if (matrix) {
      EXPECT_FLOAT_EQ(mu.scales()[i].lr, 0.5f) << entries[i].name;
      ++halved;
    } else {
      EXPECT_FLOAT_EQ(mu.scales()[i].lr, 1.0f) << entries[i].name;
    }
  }
  EXPECT_GT(halved, 0);
  const auto l = losses(*e, 20);
  EXPECT_LT(l.back(), l.front());
  // Base shapes that do not name the model's parameters are an error (mup asserts it).
  base.erase(base.begin());
  EXPECT_THROW(engine("MuAdamW", C, base), Error);
}

TEST(MupEngine, WithoutBaseShapesIsThePlainOptimizer) {
  const int64_t C = models::GPTConfig::preset("test-gpt2").n_embd;
  auto a = engine("AdamW", C), m = engine("MuAdamW", C);
  EXPECT_EQ(losses(*a, 5), losses(*m, 5));
}

// mup's .bsh (YAML as save_base_shapes writes it) and the JSON form read to the same shapes;
// null is a finite dimension (0).
TEST(MupBaseShapes, BshAndJsonFiles) {
  const auto dir = std::filesystem::temp_directory_path();
  const auto bsh = dir / ("mup_" + std::to_string(::getpid()) + ".bsh");
  const auto js = dir / ("mup_" + std::to_string(::getpid()) + ".json");
  std::ofstream(bsh) << "# This is a base shape file encoded in yaml\n"
                        "# - `null` indicates a dimension is \"finite\"\n"
                        "h.0.attn.c_attn.weight:\n- 48\n- 16\nwte.weight:\n- null\n- 16\n"
                        "h.0.ln_1.bias:\n    - 16\n";
  std::ofstream(js) << R"({"h.0.attn.c_attn.weight": [48, 16], "wte.weight": [null, 16],
                           "h.0.ln_1.bias": [16]})";
  const auto a = optim::load_mup_base_shapes(bsh.string());
  const auto b = optim::load_mup_base_shapes(js.string());
  EXPECT_EQ(a, b);
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a.at("wte.weight"), (Shape{0, 16}));
  // (V, C) with V finite: vector-like, SGD's lr x width_mult.
  EXPECT_FLOAT_EQ(optim::mup_scale(MupKind::sgd, Shape{64, 32}, a.at("wte.weight")).lr, 2.0f);
  std::ofstream(bsh) << "wte.weight:\n- wide\n";
  EXPECT_THROW(optim::load_mup_base_shapes(bsh.string()), Error);
  std::filesystem::remove(bsh);
  std::filesystem::remove(js);
}

// Layers and models: names and counts, configs, initialisation, module hooks on a real model,
// checkpointing, flat parameters, sampling, and the caching-allocator contract of a training step.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "ds/autograd/grad_mode.h"
#include "ds/core/allocator.h"
#include "ds/core/error.h"
#include "ds/core/rng.h"
#include "ds/models/gpt.h"
#include "ds/nn/flat.h"
#include "ds/nn/layers.h"
#include "ds/optim/optimizer.h"
#include "gradcheck.h"

using namespace ds;
using models::GPT;
using models::GPTConfig;

namespace {

// Random token ids (B, T) in [0, V).
Tensor random_ids(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  std::vector<int64_t> v(static_cast<size_t>(B * T));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<int64_t>(rng::hash3(seed, 3, i) % static_cast<uint64_t>(V));
  return Tensor::from_ints(v, {B, T});
}

std::vector<std::string> names_of(const nn::Module& m) {
  std::vector<std::string> out;
  for (const auto& [n, p] : m.named_parameters()) out.push_back(n);
  return out;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ds::Error";
  return "";
}

std::vector<std::vector<float>> grads_of(const nn::Module& m) {
  std::vector<std::vector<float>> out;
  for (const auto& [n, p] : m.named_parameters()) out.push_back(p.grad().to_vector());
  return out;
}

}  // namespace

// ---- names and counts ----

TEST(Models, Gpt2ParameterNamesFollowHuggingFace) {
  GPT model(GPTConfig::preset("test-gpt2"));
  const std::vector<std::string> block = {
      "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
      "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
      "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
  std::vector<std::string> want = {"wte.weight", "wpe.weight"};
  for (int i = 0; i < 2; ++i)
    for (const auto& b : block) want.push_back("h." + std::to_string(i) + "." + b);
  want.push_back("ln_f.weight");
  want.push_back("ln_f.bias");
  EXPECT_EQ(names_of(model), want);  // no lm_head.weight: tied to wte
  // Linear weights are (out, in) like torch.nn.Linear (HF's Conv1D is the transpose).
  auto params = model.named_parameters();
  std::map<std::string, Tensor> by_name(params.begin(), params.end());
  EXPECT_EQ(by_name.at("h.0.attn.c_attn.weight").shape(), (Shape{96, 32}));
  EXPECT_EQ(by_name.at("h.0.mlp.c_fc.weight").shape(), (Shape{128, 32}));
  EXPECT_EQ(by_name.at("wpe.weight").shape(), (Shape{16, 32}));
}

TEST(Models, LlamaParameterNamesFollowHuggingFace) {
  GPT model(GPTConfig::preset("test-llama"));
  const std::vector<std::string> block = {
      "input_layernorm.weight",  "self_attn.q_proj.weight", "self_attn.k_proj.weight",
      "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
      "mlp.gate_proj.weight",    "mlp.up_proj.weight",      "mlp.down_proj.weight"};
  std::vector<std::string> want = {"embed_tokens.weight"};
  for (int i = 0; i < 2; ++i)
    for (const auto& b : block) want.push_back("layers." + std::to_string(i) + "." + b);
  want.push_back("norm.weight");
  want.push_back("lm_head.weight");
  EXPECT_EQ(names_of(model), want);
  EXPECT_EQ(model.config().resolved_ffn_hidden(), 96);  // 2/3 * 128 = 85, up to a multiple of 16
}

TEST(Models, ParameterCountsMatchKnownNumbers) {
  // GPT-2 124M with tied embeddings: the number every GPT-2 reimplementation prints.
  EXPECT_EQ(GPTConfig::preset("gpt2-124m").num_parameters(), 124439808);
  EXPECT_EQ(GPTConfig::preset("gpt2").num_parameters(), 124439808);
  EXPECT_EQ(GPTConfig::preset("gpt2-350m").num_parameters(), 354823168);
  EXPECT_EQ(GPTConfig::preset("gpt2-774m").num_parameters(), 774030080);
  EXPECT_EQ(GPTConfig::preset("gpt2-1.5b").num_parameters(), 1557611200);
  EXPECT_EQ(GPTConfig::preset("tiny").num_parameters(), 16090880);  // machine.md's 16.1M
  // The analytic count agrees with the built model.
  for (const char* name : {"test-gpt2", "test-llama", "tiny", "llama-tiny"}) {
    GPT m(GPTConfig::preset(name), /*init=*/false);
    EXPECT_EQ(m.num_parameters(), m.config().num_parameters()) << name;
  }
  GPT gpt2(GPTConfig::preset("gpt2-124m"), /*init=*/false);  // built for real, not initialised
  EXPECT_EQ(gpt2.num_parameters(), 124439808);
  EXPECT_EQ(gpt2.named_parameters().size(), 2u + 12u * 12u + 2u);
  auto bias_off = GPTConfig::preset("test-gpt2");
  bias_off.bias = false;
  bias_off.tie_embeddings = false;
  EXPECT_EQ(GPT(bias_off).num_parameters(), bias_off.num_parameters());
}

// ---- configuration ----

TEST(GPTConfigTest, PresetsJsonAndValidation) {
  const GPTConfig llama = GPTConfig::preset("llama-tiny");
  EXPECT_EQ(llama.layout, nn::Layout::llama);
  EXPECT_FALSE(llama.bias);
  EXPECT_FALSE(llama.tie_embeddings);
  EXPECT_FLOAT_EQ(llama.norm_eps, 1e-6f);
  EXPECT_EQ(llama.resolved_ffn_hidden(), 768);  // 2/3 * 1024 = 682 -> 768
  GPTConfig big = GPTConfig::defaults(nn::Layout::llama);
  big.n_embd = 4096;
  big.n_head = 32;
  EXPECT_EQ(big.resolved_ffn_hidden(), 11008);  // LLaMA-7B
  EXPECT_EQ(GPTConfig::preset("gpt2-xl").n_embd, 1600);
  EXPECT_EQ(GPTConfig::preset("gpt2-medium").n_layer, 24);

  for (const auto& name : GPTConfig::preset_names()) {
    const GPTConfig c = GPTConfig::preset(name);
    EXPECT_EQ(GPTConfig::from_json_string(c.to_json_string()).to_json_string(), c.to_json_string())
        << name;
  }
  // A preset with overrides; a layout alone takes that layout's defaults.
  GPTConfig c = GPTConfig::from_json_string(R"({"preset": "tiny", "dropout": 0.1, "n_layer": 2})");
  EXPECT_EQ(c.n_embd, 256);
  EXPECT_EQ(c.n_layer, 2);
  EXPECT_FLOAT_EQ(c.dropout, 0.1f);
  c = GPTConfig::from_json_string(R"({"layout": "llama", "n_layer": 2, "n_head": 2, "n_embd": 64,
                                      "vocab_size": 100, "block_size": 32})");
  EXPECT_FALSE(c.tie_embeddings);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-6f);

  EXPECT_EQ(error_of([] { GPTConfig::from_json_string(R"({"n_embd": 100, "n_head": 3})"); }),
            "[model] n_embd 100 not divisible by n_head 3");
  EXPECT_NE(error_of([] {
              GPTConfig::from_json_string(R"({"n_embed": 100})");
            }).find("unknown key 'n_embed'"),
            std::string::npos);
  EXPECT_NE(error_of([] { GPTConfig::preset("gpt5"); }).find("tiny"), std::string::npos);
  EXPECT_NE(error_of([] { GPTConfig::from_json_string(R"({"n_layer": "two"})"); }).find("[model]"),
            std::string::npos);
  EXPECT_NE(error_of([] { GPTConfig::from_json_string(R"({"layout": "bert"})"); }).find("bert"),
            std::string::npos);
  EXPECT_NE(error_of([] { GPTConfig::from_json_string(R"({"dropout": 1.0})"); }).find("dropout"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              GPTConfig::from_json_string(R"({"layout": "llama", "n_embd": 36, "n_head": 4})");
            }).find("even"),
            std::string::npos);

  // A model JSON file (comments allowed), and errors naming it.
  const std::string path = ::testing::TempDir() + "model_" + std::to_string(::getpid()) + ".json";
  {
    std::ofstream f(path);
    f << "// a small model\n{\"preset\": \"test-gpt2\", \"seed\": 7}\n";
  }
  EXPECT_EQ(GPTConfig::load(path).seed, 7u);
  {
    std::ofstream f(path);
    f << "{\"n_layer\": 0}";
  }
  EXPECT_NE(error_of([&] { GPTConfig::load(path); }).find(path), std::string::npos);
  std::filesystem::remove(path);
}

// ---- initialisation ----

TEST(Models, InitIsDeterministicAndFollowsGpt2) {
  GPTConfig cfg = GPTConfig::preset("tiny");
  cfg.vocab_size = 4096;  // keep the test light
  GPT a(cfg), b(cfg);
  cfg.seed = 1;
  GPT c(cfg);
  auto pa = a.named_parameters(), pb = b.named_parameters(), pc = c.named_parameters();
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_EQ(pa[i].second.to_vector(), pb[i].second.to_vector());
  EXPECT_NE(pa[0].second.to_vector(), pc[0].second.to_vector());

  auto stats = [](const Tensor& t) {
    const auto v = t.to_vector();
    double s = 0, s2 = 0;
    for (float x : v) {
      s += x;
      s2 += static_cast<double>(x) * x;
    }
    const double n = static_cast<double>(v.size());
    return std::pair<double, double>{s / n, std::sqrt(s2 / n - (s / n) * (s / n))};
  };
  const double resid = 0.02 / std::sqrt(2.0 * 4);
  for (const auto& [name, p] : pa) {
    auto [mean, sd] = stats(p);
    const bool is_bias = name.ends_with(".bias");
    if (name.starts_with("ln_") || name.find(".ln_") != std::string::npos) {
      EXPECT_EQ(sd, 0.0) << name;
      EXPECT_EQ(mean, is_bias ? 0.0 : 1.0) << name;
    } else if (is_bias) {
      EXPECT_EQ(mean, 0.0) << name;
      EXPECT_EQ(sd, 0.0) << name;
    } else {
      const double want = name.ends_with("c_proj.weight") ? resid : 0.02;
      EXPECT_NEAR(sd, want, 0.03 * want) << name;
      EXPECT_NEAR(mean, 0.0, 0.05 * want) << name;
    }
  }
  // A shard initialises to exactly the full tensor's slice (ZeRO-3 builds models partitioned).
  const auto plan = a.init_plan();
  const size_t qkv = 4;  // h.0.attn.c_attn.weight
  ASSERT_EQ(pa[qkv].first, "h.0.attn.c_attn.weight");
  std::vector<float> shard(1000);
  GPT::init_values(plan[qkv], 0, qkv, 5000, 1000, shard.data());
  const auto full = pa[qkv].second.to_vector();
  EXPECT_EQ(shard, std::vector<float>(full.begin() + 5000, full.begin() + 6000));

  GPT l(GPTConfig::preset("test-llama"));
  for (const auto& [name, p] : l.named_parameters()) {
    auto [mean, sd] = stats(p);
    if (name.find("norm") != std::string::npos) {
      EXPECT_EQ(mean, 1.0) << name;
    } else {
      EXPECT_NEAR(sd, 0.02, 0.004) << name;  // all matrices, no depth scaling
    }
  }
}

// ---- forward ----

TEST(Models, ForwardShapesAndErrors) {
  GPT model(GPTConfig::preset("test-gpt2"));
  Tensor ids = random_ids(3, 10, 64, 1);
  EXPECT_EQ(model.logits(ids).shape(), (Shape{3, 10, 64}));
  EXPECT_EQ(model.logits(ids.to(DType::i32)).to_vector(), model.logits(ids).to_vector());
  Tensor loss = model.loss(ids, random_ids(3, 10, 64, 2));
  EXPECT_EQ(loss.shape(), Shape{});
  EXPECT_NEAR(loss.item(), std::log(64.0), 0.1);  // near-uniform predictions at init
  EXPECT_NE(error_of([&] { model.logits(random_ids(1, 17, 64, 3)); }).find("block_size 16"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              model.logits(Tensor::zeros({2, 4}));
            }).find("[model]"),
            std::string::npos);
  // Without biases (nanoGPT's bias=False: LayerNorms too) and untied; and LLaMA with biases.
  GPTConfig nb = GPTConfig::preset("test-gpt2");
  nb.bias = false;
  nb.tie_embeddings = false;
  GPTConfig lb = GPTConfig::preset("test-llama");
  lb.bias = true;
  lb.tie_embeddings = true;
  for (const GPTConfig& cfg : {nb, lb}) {
    GPT m(cfg);
    m.loss(ids, random_ids(3, 10, 64, 2)).backward();
    for (const auto& [name, p] : m.named_parameters()) EXPECT_TRUE(p.grad().defined()) << name;
  }
  // Causality: changing a later token leaves earlier logits unchanged.
  for (const char* preset : {"test-gpt2", "test-llama"}) {
    GPT m(GPTConfig::preset(preset));
    std::vector<int64_t> a = {1, 2, 3, 4, 5, 6}, b = a;
    b[4] = 9;
    auto la = m.logits(Tensor::from_ints(a, {1, 6})).to_vector();
    auto lb = m.logits(Tensor::from_ints(b, {1, 6})).to_vector();
    EXPECT_EQ(std::vector<float>(la.begin(), la.begin() + 4 * 64),
              std::vector<float>(lb.begin(), lb.begin() + 4 * 64))
        << preset;
    EXPECT_NE(la, lb) << preset;
  }
}

TEST(Layers, LinearEmbeddingAndTiedWeights) {
  nn::Linear lin(5, 3);
  EXPECT_EQ(names_of(lin), (std::vector<std::string>{"weight", "bias"}));
  EXPECT_EQ(lin.weight().shape(), (Shape{3, 5}));
  lin.weight().copy_from(ds::testing::randn({3, 5}, 1));
  lin.bias().copy_from(ds::testing::randn({3}, 2));
  Tensor x = ds::testing::randn({2, 4, 5}, 3);
  EXPECT_EQ(lin(x).to_vector(), ops::linear(x, lin.weight(), lin.bias()).to_vector());
  nn::Linear nobias(5, 3, false);
  EXPECT_FALSE(nobias.bias().defined());
  EXPECT_EQ(nobias.named_parameters().size(), 1u);

  // A tied head shares the embedding's TensorImpl: one parameter, gradients from both uses.
  GPT model(GPTConfig::preset("test-gpt2"));
  auto modules = model.named_modules();
  std::map<std::string, nn::Module*> by_name(modules.begin(), modules.end());
  auto* head = dynamic_cast<nn::Linear*>(by_name.at("lm_head"));
  auto* wte = dynamic_cast<nn::Embedding*>(by_name.at("wte"));
  ASSERT_TRUE(head && wte);
  EXPECT_TRUE(head->weight().same(wte->weight()));
}

TEST(Models, DropoutOnlyInTrainingAndReplayedByCheckpointing) {
  GPTConfig cfg = GPTConfig::preset("test-gpt2");
  GPT plain(cfg);
  cfg.dropout = 0.2f;
  GPT drop(cfg);
  Tensor ids = random_ids(2, 16, 64, 4), tg = random_ids(2, 16, 64, 5);
  drop.train(false);
  EXPECT_EQ(drop.logits(ids).to_vector(), plain.logits(ids).to_vector());
  drop.train(true);
  EXPECT_NE(drop.logits(ids).to_vector(), plain.logits(ids).to_vector());
  EXPECT_NE(drop.logits(ids).to_vector(), drop.logits(ids).to_vector());  // the stream advances

  // Same dropout stream position: checkpointed blocks redraw the same masks.
  const rng::DropoutState start = rng::dropout_state();
  drop.loss(ids, tg).backward();
  auto g1 = grads_of(drop);
  drop.zero_grad();
  drop.set_gradient_checkpointing(true);
  rng::dropout_state() = start;
  drop.loss(ids, tg).backward();
  EXPECT_EQ(grads_of(drop), g1);
}

// ---- hooks ----

TEST(Hooks, ForwardHooksNestInModuleOrder) {
  GPT model(GPTConfig::preset("test-gpt2"));
  std::vector<std::string> events;
  for (auto& [name, m] : model.named_modules()) {
    const std::string n = name.empty() ? "<model>" : name;
    m->register_forward_pre_hook(
        [&events, n](nn::Module&, const Tensor&) { events.push_back("pre " + n); });
    m->register_forward_hook(
        [&events, n](nn::Module&, const Tensor&, const Tensor&) { events.push_back("post " + n); });
  }
  model.logits(random_ids(1, 4, 64, 6));
  auto pos = [&](const std::string& e) {
    auto it = std::find(events.begin(), events.end(), e);
    EXPECT_NE(it, events.end()) << e;
    return it - events.begin();
  };
  EXPECT_EQ(events.front(), "pre <model>");
  EXPECT_EQ(events.back(), "post <model>");
  const std::vector<std::string> seq = {"pre wte",
                                        "post wte",
                                        "pre wpe",
                                        "post wpe",
                                        "pre h.0",
                                        "pre h.0.ln_1",
                                        "post h.0.ln_1",
                                        "pre h.0.attn",
                                        "pre h.0.attn.c_attn",
                                        "post h.0.attn.c_attn",
                                        "pre h.0.attn.c_proj",
                                        "post h.0.attn.c_proj",
                                        "post h.0.attn",
                                        "pre h.0.ln_2",
                                        "post h.0.ln_2",
                                        "pre h.0.mlp",
                                        "post h.0.mlp",
                                        "post h.0",
                                        "pre h.1",
                                        "post h.1",
                                        "pre ln_f",
                                        "post ln_f",
                                        "pre lm_head",
                                        "post lm_head"};
  for (size_t i = 0; i + 1 < seq.size(); ++i)
    EXPECT_LT(pos(seq[i]), pos(seq[i + 1])) << seq[i] << " < " << seq[i + 1];
  // Each module ran exactly once (h is a container, never called).
  EXPECT_EQ(events.size(), 2 * (model.named_modules().size() - 1));
}

TEST(Hooks, BackwardHooksFireOncePerBackwardInReverseBlockOrder) {
  for (bool ckpt : {false, true}) {
    GPTConfig cfg = GPTConfig::preset("test-gpt2");
    cfg.n_layer = 3;
    GPT model(cfg);
    model.set_gradient_checkpointing(ckpt);
    std::vector<std::string> events;
    auto modules = model.named_modules();
    std::map<std::string, nn::Module*> by_name(modules.begin(), modules.end());
    for (const std::string n : {"h.0", "h.1", "h.2", "wte", "wpe", "ln_f", "h.1.mlp"}) {
      by_name.at(n)->register_backward_pre_hook(
          [&events, n](nn::Module&) { events.push_back("pre " + n); });
      by_name.at(n)->register_backward_hook(
          [&events, n](nn::Module&) { events.push_back("post " + n); });
    }
    Tensor ids = random_ids(2, 8, 64, 7), tg = random_ids(2, 8, 64, 8);
    for (int pass = 0; pass < 2; ++pass) {
      events.clear();
      model.loss(ids, tg).backward();
      std::map<std::string, int> count;
      for (auto& e : events) ++count[e];
      for (auto& [e, c] : count) EXPECT_EQ(c, 1) << e << " (checkpointing " << ckpt << ")";
      EXPECT_EQ(events.size(), 14u) << "checkpointing " << ckpt;
      auto pos = [&](const std::string& e) {
        return std::find(events.begin(), events.end(), e) - events.begin();
      };
      const std::vector<std::string> seq = {"pre ln_f", "post ln_f",   "pre h.2",      "post h.2",
                                            "pre h.1",  "pre h.1.mlp", "post h.1.mlp", "post h.1",
                                            "pre h.0",  "post h.0"};
      for (size_t i = 0; i + 1 < seq.size(); ++i)
        EXPECT_LT(pos(seq[i]), pos(seq[i + 1]))
            << seq[i] << " < " << seq[i + 1] << " (checkpointing " << ckpt << ")";
      // The embeddings' inputs need no gradient: their backward hooks still fire (at the end).
      EXPECT_GT(pos("post wte"), pos("post h.0"));
      EXPECT_GT(pos("post wpe"), pos("post h.0"));
      EXPECT_LT(pos("pre wte"), pos("post wte"));
    }
  }
}

TEST(Hooks, GradReadyFiresOncePerParameterPerBackward) {
  GPT model(GPTConfig::preset("test-gpt2"));
  std::map<std::string, int> fired;
  std::map<std::string, std::vector<float>> seen;
  for (auto& [name, p] : model.named_parameters()) {
    const std::string n = name;
    p.add_grad_ready_hook([&fired, &seen, n](const Tensor& t) {
      ++fired[n];
      seen[n] = t.grad().to_vector();
    });
  }
  Tensor ids = random_ids(2, 8, 64, 9), tg = random_ids(2, 8, 64, 10);
  for (int pass = 1; pass <= 2; ++pass) {
    model.zero_grad();
    model.loss(ids, tg).backward();
    for (auto& [name, p] : model.named_parameters()) {
      EXPECT_EQ(fired[name], pass) << name;
      // Complete when fired: wte's hook sees both the embedding's and the head's contribution.
      EXPECT_EQ(seen[name], p.grad().to_vector()) << name;
    }
  }
}

// ---- checkpointing and memory ----

TEST(Models, CheckpointingGivesIdenticalGradsAndLowerPeak) {
  GPTConfig cfg = GPTConfig::preset("test-gpt2");
  cfg.n_layer = 4;
  cfg.n_embd = 64;
  cfg.block_size = 64;
  GPT model(cfg);
  Tensor ids = random_ids(8, 64, 64, 11), tg = random_ids(8, 64, 64, 12);
  auto run = [&](bool ckpt, uint64_t* fwd_peak, uint64_t* total_peak) {
    model.zero_grad();
    model.set_gradient_checkpointing(ckpt);
    cpu_allocator().reset_peak();
    const uint64_t base = cpu_allocator().stats().bytes_in_use;
    Tensor loss = model.loss(ids, tg);
    *fwd_peak = cpu_allocator().stats().peak_bytes_in_use - base;
    loss.backward();
    *total_peak = cpu_allocator().stats().peak_bytes_in_use - base;
    return grads_of(model);
  };
  uint64_t fwd_plain, tot_plain, fwd_ckpt, tot_ckpt;
  const auto g_plain = run(false, &fwd_plain, &tot_plain);
  const auto g_ckpt = run(true, &fwd_ckpt, &tot_ckpt);
  EXPECT_EQ(g_plain, g_ckpt);
  // Without checkpointing each block keeps ~20 (B, T, C) activations; with it, only its input.
  EXPECT_LT(fwd_ckpt * 3, fwd_plain)
      << "forward peak: plain " << fwd_plain << " B, checkpointed " << fwd_ckpt;
  EXPECT_LT(tot_ckpt, tot_plain) << "total peak: plain " << tot_plain << " B, checkpointed "
                                 << tot_ckpt;
  std::printf("[checkpointing] forward peak %llu -> %llu KiB, step peak %llu -> %llu KiB\n",
              static_cast<unsigned long long>(fwd_plain >> 10),
              static_cast<unsigned long long>(fwd_ckpt >> 10),
              static_cast<unsigned long long>(tot_plain >> 10),
              static_cast<unsigned long long>(tot_ckpt >> 10));
}

TEST(Models, FlattenKeepsOutputsAndGradsAreViews) {
  for (const char* preset : {"test-gpt2", "test-llama"}) {
    GPT model(GPTConfig::preset(preset));
    Tensor ids = random_ids(2, 16, 64, 13), tg = random_ids(2, 16, 64, 14);
    const auto before = model.logits(ids).to_vector();
    model.loss(ids, tg).backward();
    const auto grads_before = grads_of(model);
    model.zero_grad();

    nn::FlatParameters flat = nn::flatten_parameters(model);
    EXPECT_EQ(flat.numel, model.num_parameters());
    EXPECT_EQ(model.logits(ids).to_vector(), before) << preset;
    model.loss(ids, tg).backward();
    EXPECT_EQ(grads_of(model), grads_before) << preset;
    const auto named = model.named_parameters();
    ASSERT_EQ(named.size(), flat.entries.size());
    for (size_t i = 0; i < named.size(); ++i) {
      const auto& [name, p] = named[i];
      const nn::FlatEntry& e = flat.entries[i];
      EXPECT_EQ(e.name, name);
      // Parameter and gradient are views at the entry's offset of the flat buffers.
      EXPECT_EQ(p.data<float>(), flat.params.data<float>() + e.offset) << name;
      EXPECT_EQ(p.grad().data<float>(), flat.grads.data<float>() + e.offset) << name;
      EXPECT_EQ(p.grad().storage()->base(), flat.grads.storage()) << name;
    }
    // Zeroing the flat buffer zeroes every .grad.
    flat.grads.zero_();
    for (const auto& [name, p] : named) {
      const auto g = p.grad().to_vector();
      EXPECT_TRUE(std::all_of(g.begin(), g.end(), [](float v) { return v == 0.0f; })) << name;
    }
  }
}

TEST(Models, TrainingStepAllocatesNoNewTensorMemoryAfterTheFirst) {
  // The caching allocator's contract: after step 1 every tensor allocation is a cache hit.
  for (const char* preset : {"test-gpt2", "test-llama"}) {
    for (bool ckpt : {false, true}) {
      GPT model(GPTConfig::preset(preset));
      model.set_gradient_checkpointing(ckpt);
      nn::FlatParameters flat = nn::flatten_parameters(model);
      optim::OptimizerParams hp;
      hp.weight_decay = 0.1f;
      auto opt = optim::make_optimizer("AdamW", hp);
      const Tensor ids = random_ids(4, 16, 64, 15), tg = random_ids(4, 16, 64, 16);
      std::vector<uint64_t> misses;
      std::vector<float> losses;
      for (int step = 0; step < 3; ++step) {
        Tensor loss = model.loss(ids, tg);
        loss.backward();
        opt->step(flat.params.data<float>(), flat.grads.data<float>(), flat.numel);
        flat.grads.zero_();
        losses.push_back(loss.item());
        misses.push_back(cpu_allocator().stats().misses);
      }
      EXPECT_EQ(misses[1], misses[0]) << preset << " checkpointing " << ckpt;
      EXPECT_EQ(misses[2], misses[1]) << preset << " checkpointing " << ckpt;
      EXPECT_LT(losses[2], losses[0]) << preset;  // and it learns
    }
  }
}

// ---- sampling and FLOPs ----

TEST(Models, GenerateIsDeterministicAndCropsContext) {
  GPT model(GPTConfig::preset("test-llama"));
  Tensor prompt = Tensor::from_ints({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor g1 = model.generate(prompt, 20, /*top_k=*/1);  // beyond block_size 16: crops
  EXPECT_EQ(g1.shape(), (Shape{2, 23}));
  EXPECT_EQ(g1.dtype(), DType::i64);
  auto v = g1.to_int_vector();
  EXPECT_EQ(std::vector<int64_t>(v.begin(), v.begin() + 3), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(std::vector<int64_t>(v.begin() + 23, v.begin() + 26), (std::vector<int64_t>{4, 5, 6}));
  for (int64_t t : v) EXPECT_TRUE(t >= 0 && t < 64);
  EXPECT_EQ(model.generate(prompt, 20, 1).to_int_vector(), v);
  // Greedy agrees with the argmax of the logits.
  auto lg = model.logits(Tensor::from_ints({1, 2, 3}, {1, 3})).to_vector();
  const int64_t arg =
      std::max_element(lg.begin() + 2 * 64, lg.begin() + 3 * 64) - (lg.begin() + 2 * 64);
  EXPECT_EQ(v[3], arg);
  // Sampling: the same seed gives the same tokens, another seed (almost surely) others.
  auto s1 = model.generate(prompt, 12, 10, 42).to_int_vector();
  EXPECT_EQ(model.generate(prompt, 12, 10, 42).to_int_vector(), s1);
  EXPECT_NE(model.generate(prompt, 12, 0, 43).to_int_vector(), s1);
  EXPECT_TRUE(model.is_training());  // restored
  EXPECT_TRUE(autograd::is_grad_enabled());
}

TEST(Models, FlopsPerToken) {
  GPT model(GPTConfig::preset("test-gpt2"));
  const double n = static_cast<double>(model.num_parameters());
  EXPECT_DOUBLE_EQ(model.flops_per_token(), 6 * n + 12.0 * 2 * 32 * 16);
  EXPECT_DOUBLE_EQ(model.flops_per_token(8), 6 * n + 12.0 * 2 * 32 * 8);
}

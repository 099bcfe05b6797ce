// Hugging Face style import/export of GPT weights (ds/models/hf_io.h): export -> import gives
// bitwise identical logits; the file layout is transformers' (prefixes, Conv1D (in, out) weights,
// format metadata); every missing, extra and mis-shaped tensor is named in one error, and a failed
// load leaves the model untouched.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "ds/core/error.h"
#include "ds/core/safetensors.h"
#include "ds/models/gpt.h"
#include "ds/models/hf_io.h"
#include "ds/ops/ops.h"

using namespace ds;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

class HFIO : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ds_hf_io_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A model with non-default weights (seed 7), so that zero-initialised parameters of a model
  // that failed to load cannot pass for loaded ones.
  static std::shared_ptr<models::GPT> make(const std::string& preset) {
    models::GPTConfig c = models::GPTConfig::preset(preset);
    c.seed = 7;
    return std::make_shared<models::GPT>(c);
  }
  // Logits of a fixed (2, 16) batch.
  static std::vector<float> logits(models::GPT& m) {
    std::vector<int64_t> ids(32);
    for (size_t i = 0; i < ids.size(); ++i)
      ids[i] = static_cast<int64_t>((i * 7 + 3) % static_cast<size_t>(m.config().vocab_size));
    return m.logits(Tensor::from_ints(ids, {2, 16})).to_vector();
  }
  template <class F>
  static std::string error_of(F&& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    ADD_FAILURE() << "expected a ds::Error";
    return "";
  }
  // The tensors of an exported model by Hugging Face name, to rewrite into broken files.
  static std::vector<std::pair<std::string, Tensor>> hf_tensors(const models::GPT& m) {
    std::vector<std::pair<std::string, Tensor>> out;
    const auto layout = m.config().layout;
    for (const auto& [name, p] : m.named_parameters()) {
      Tensor t = p.detach();
      if (models::hf_transposed(layout, name)) t = ops::transpose(t, 0, 1).contiguous();
      out.emplace_back(models::hf_name(layout, name), t);
    }
    return out;
  }

  void expect_round_trip(const std::string& preset) {
    auto a = make(preset);
    models::export_hf(*a, dir_);
    ASSERT_TRUE(fs::exists(dir_ / "config.json"));
    ASSERT_TRUE(fs::exists(dir_ / "model.safetensors"));

    auto cfg = models::read_hf_config(dir_);
    ASSERT_TRUE(cfg.has_value());
    EXPECT_EQ(cfg->to_json(), a->config().to_json());
    models::GPT b(*cfg, /*init=*/false);
    const auto rep = models::load_hf_weights(b, dir_);
    EXPECT_EQ(rep.tensors, static_cast<int64_t>(a->named_parameters().size()));
    EXPECT_TRUE(rep.ignored.empty());
    // Identical weights give bitwise identical logits: the transposes are exact inverses.
    EXPECT_EQ(logits(*a), logits(b));
  }

  fs::path dir_;
};

TEST_F(HFIO, RoundTripGpt2) {
  expect_round_trip("test-gpt2");
}

TEST_F(HFIO, RoundTripLlama) {
  expect_round_trip("test-llama");
}

TEST_F(HFIO, ExportUsesTransformersLayout) {
  auto m = make("test-gpt2");  // C 32, ffn 128, V 64, T 16, 2 layers, tied head
  models::export_hf(*m, dir_);
  safetensors::Reader r((dir_ / "model.safetensors").string());
  EXPECT_EQ(r.metadata("format"), "pt");  // transformers refuses files without it
  // Conv1D weights are (in, out); biases and embeddings as they are.
  EXPECT_EQ(r.entry("transformer.h.0.attn.c_attn.weight").shape, (Shape{32, 96}));
  EXPECT_EQ(r.entry("transformer.h.1.mlp.c_fc.weight").shape, (Shape{32, 128}));
  EXPECT_EQ(r.entry("transformer.h.1.mlp.c_proj.weight").shape, (Shape{128, 32}));
  EXPECT_EQ(r.entry("transformer.h.0.attn.c_attn.bias").shape, (Shape{96}));
  EXPECT_EQ(r.entry("transformer.wte.weight").shape, (Shape{64, 32}));
  EXPECT_FALSE(r.contains("lm_head.weight"));  // tied: transformers re-ties it
  // The transpose is of the values, not only of the shape.
  for (const auto& [name, p] : m->named_parameters()) {
    if (name != "h.0.attn.c_attn.weight") continue;
    const std::vector<float> mine = p.to_vector();  // (96, 32)
    const std::vector<float> file = r.get("transformer.h.0.attn.c_attn.weight").to_vector();
    for (int64_t o = 0; o < 96; ++o)
      for (int64_t i = 0; i < 32; ++i) ASSERT_EQ(mine[o * 32 + i], file[i * 96 + o]);
  }

  std::ifstream in(dir_ / "config.json");
  const json j = json::parse(in);
  EXPECT_EQ(j["model_type"], "gpt2");
  EXPECT_EQ(j["architectures"][0], "GPT2LMHeadModel");
  EXPECT_EQ(j["n_embd"], 32);
  EXPECT_EQ(j["n_positions"], 16);
  EXPECT_EQ(j["activation_function"], "gelu_new");
}

// A file as Hugging Face's own GPT2Model writes it: no prefix, plus the causal-mask buffers of
// older transformers versions, and a config.json with only Hugging Face's fields.
TEST_F(HFIO, LoadsPlainHuggingFaceGpt2Folder) {
  auto m = make("test-gpt2");
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (auto& [name, t] : hf_tensors(*m))
    tensors.emplace_back(name.substr(12), t);  // "transformer."
  for (int l = 0; l < 2; ++l) {
    tensors.emplace_back(fmt::format("h.{}.attn.bias", l), Tensor::ones({1, 1, 16, 16}));
    tensors.emplace_back(fmt::format("h.{}.attn.masked_bias", l), Tensor::full({}, -1e4));
  }
  safetensors::save((dir_ / "model.safetensors").string(), tensors, {{"format", "pt"}});
  json cfg = {{"model_type", "gpt2"}, {"vocab_size", 64},   {"n_positions", 16},
              {"n_embd", 32},         {"n_layer", 2},       {"n_head", 4},
              {"n_inner", nullptr},   {"resid_pdrop", 0.0}, {"layer_norm_epsilon", 1e-5}};
  std::ofstream(dir_ / "config.json") << cfg.dump();

  auto c = models::read_hf_config(dir_);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->n_embd, 32);
  EXPECT_EQ(c->resolved_ffn_hidden(), 128);
  EXPECT_TRUE(c->tie_embeddings);
  models::GPT b(*c, /*init=*/false);
  const auto rep = models::load_hf_weights(b, dir_);
  EXPECT_EQ(rep.ignored.size(), 4u);
  EXPECT_EQ(logits(*m), logits(b));
}

TEST_F(HFIO, LoadsSingleSafetensorsFile) {
  auto m = make("test-gpt2");
  const fs::path file = dir_ / "weights.safetensors";
  safetensors::save(file.string(), hf_tensors(*m));
  models::GPT b(m->config(), /*init=*/false);
  models::load_hf_weights(b, file);
  EXPECT_EQ(logits(*m), logits(b));
}

TEST_F(HFIO, EveryProblemIsListedAndNothingIsWritten) {
  auto m = make("test-gpt2");
  auto tensors = hf_tensors(*m);
  std::vector<std::pair<std::string, Tensor>> bad;
  for (auto& [name, t] : tensors) {
    if (name == "transformer.h.1.attn.c_proj.bias") continue;  // missing
    if (name == "transformer.h.0.mlp.c_fc.weight") {
      bad.emplace_back(name, ops::transpose(t, 0, 1).contiguous());  // (out, in): mis-shaped
      continue;
    }
    if (name == "transformer.wpe.weight") {
      bad.emplace_back(name, Tensor::zeros({8, 32}));  // wrong context length
      continue;
    }
    bad.emplace_back(name, t);
  }
  bad.emplace_back("transformer.h.2.ln_1.weight", Tensor::ones({32}));  // a third layer: extra
  const fs::path file = dir_ / "bad.safetensors";
  safetensors::save(file.string(), bad);

  auto target = make("test-gpt2");
  const std::vector<float> before = logits(*target);
  const std::string msg = error_of([&] { models::load_hf_weights(*target, file); });
  EXPECT_NE(msg.find("[hf_io]"), std::string::npos) << msg;
  EXPECT_NE(msg.find(file.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("4 problems"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing: 'transformer.h.1.attn.c_proj.bias' (32,)"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("mis-shaped: 'transformer.h.0.mlp.c_fc.weight' is (128, 32) in the file, the "
                     "model needs (32, 128)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("mis-shaped: 'transformer.wpe.weight' is (8, 32)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("extra: 'transformer.h.2.ln_1.weight'"), std::string::npos) << msg;
  EXPECT_EQ(logits(*target), before);  // untouched
}

TEST_F(HFIO, WrongModelIsRefused) {
  auto m = make("test-llama");
  models::export_hf(*m, dir_);
  models::GPT gpt2(models::GPTConfig::preset("test-gpt2"), /*init=*/false);
  const std::string msg = error_of([&] { models::load_hf_weights(gpt2, dir_); });
  EXPECT_NE(msg.find("missing: 'transformer.wte.weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("extra: 'model.layers.0.self_attn.q_proj.weight'"), std::string::npos) << msg;
}

TEST_F(HFIO, FolderErrors) {
  models::GPT m(models::GPTConfig::preset("test-gpt2"), /*init=*/false);
  std::string msg = error_of([&] { models::load_hf_weights(m, dir_ / "nope"); });
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;
  std::ofstream(dir_ / "pytorch_model.bin") << "pickle";
  msg = error_of([&] { models::load_hf_weights(m, dir_); });
  EXPECT_NE(msg.find("no model.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("safe_serialization"), std::string::npos) << msg;
}

TEST_F(HFIO, ShardedFolderViaIndex) {
  auto m = make("test-gpt2");
  auto tensors = hf_tensors(*m);
  const size_t half = tensors.size() / 2;
  std::vector<std::pair<std::string, Tensor>> a(tensors.begin(), tensors.begin() + half);
  std::vector<std::pair<std::string, Tensor>> b(tensors.begin() + half, tensors.end());
  safetensors::save((dir_ / "model-00001-of-00002.safetensors").string(), a);
  safetensors::save((dir_ / "model-00002-of-00002.safetensors").string(), b);
  json index = {{"metadata", json::object()}, {"weight_map", json::object()}};
  for (const auto& [n, t] : a) index["weight_map"][n] = "model-00001-of-00002.safetensors";
  for (const auto& [n, t] : b) index["weight_map"][n] = "model-00002-of-00002.safetensors";
  std::ofstream(dir_ / "model.safetensors.index.json") << index.dump();
  models::GPT c(m->config(), /*init=*/false);
  const auto rep = models::load_hf_weights(c, dir_);
  EXPECT_EQ(rep.files.size(), 2u);
  EXPECT_EQ(logits(*m), logits(c));
}

// An index entry with a path in it would read a file outside the model folder.
TEST_F(HFIO, IndexEntriesMustBeFilesOfTheFolder) {
  auto m = make("test-gpt2");
  const auto tensors = hf_tensors(*m);
  const fs::path outside = dir_.parent_path() / (dir_.filename().string() + "_outside.safetensors");
  safetensors::save(outside.string(), tensors);
  for (const std::string bad : {"../" + outside.filename().string(), outside.string(),
                                std::string("sub/model.safetensors"), std::string("..")}) {
    json index = {{"metadata", json::object()}, {"weight_map", json::object()}};
    for (const auto& [n, t] : tensors) index["weight_map"][n] = bad;
    std::ofstream(dir_ / "model.safetensors.index.json") << index.dump();
    models::GPT c(m->config(), /*init=*/false);
    const std::string msg = error_of([&] { models::load_hf_weights(c, dir_); });
    EXPECT_NE(msg.find("is not a file name in the model folder"), std::string::npos) << msg;
    EXPECT_NE(msg.find("model.safetensors.index.json"), std::string::npos) << msg;
  }
  // Through a symbolic link to a folder outside: refused like any other path.
  const fs::path outside_dir = dir_.parent_path() / (dir_.filename().string() + "_outside_dir");
  fs::create_directories(outside_dir);
  fs::copy_file(outside, outside_dir / "model.safetensors");
  fs::create_directory_symlink(outside_dir, dir_ / "link");
  json index = {{"metadata", json::object()}, {"weight_map", json::object()}};
  for (const auto& [n, t] : tensors) index["weight_map"][n] = "link/model.safetensors";
  std::ofstream(dir_ / "model.safetensors.index.json") << index.dump();
  models::GPT c(m->config(), /*init=*/false);
  const std::string msg = error_of([&] { models::load_hf_weights(c, dir_); });
  EXPECT_NE(msg.find("weight_map[\"transformer."), std::string::npos) << msg;
  EXPECT_NE(msg.find("link/model.safetensors"), std::string::npos) << msg;
  // A shard that is itself a symbolic link (the Hugging Face cache: snapshots/<rev>/x.safetensors
  // -> ../../blobs/<sha>) still loads.
  fs::remove(dir_ / "link");
  fs::create_symlink(outside_dir / "model.safetensors", dir_ / "model-00001-of-00001.safetensors");
  for (const auto& [n, t] : tensors) index["weight_map"][n] = "model-00001-of-00001.safetensors";
  std::ofstream(dir_ / "model.safetensors.index.json") << index.dump();
  models::GPT d(m->config(), /*init=*/false);
  models::load_hf_weights(d, dir_);
  EXPECT_EQ(logits(*m), logits(d));
  fs::remove_all(outside_dir);
  fs::remove(outside);
}

// NaN or Inf weights are refused at load, naming the file and the tensor (ds_generate printed
// "!!!!!!" and exited 0; ds_train blamed the learning rate at the end).
TEST_F(HFIO, NonFiniteWeightsAreRefusedNamingTheTensor) {
  auto m = make("test-gpt2");
  for (const float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    auto tensors = hf_tensors(*m);
    auto& [name, t] = tensors[tensors.size() / 2];
    Tensor copy = t.clone();
    copy.data<float>()[3] = bad;
    t = copy;
    const std::string bad_name = name;
    safetensors::save((dir_ / "model.safetensors").string(), tensors);
    models::GPT c(m->config(), /*init=*/false);
    const std::string msg = error_of([&] { models::load_hf_weights(c, dir_); });
    EXPECT_NE(msg.find("'" + bad_name + "' holds a non-finite value"), std::string::npos) << msg;
    EXPECT_NE(msg.find("at element 3 of"), std::string::npos) << msg;
    EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
  }
  // Finite weights load as before.
  safetensors::save((dir_ / "model.safetensors").string(), hf_tensors(*m));
  models::GPT ok(m->config(), /*init=*/false);
  EXPECT_NO_THROW(models::load_hf_weights(ok, dir_));
}

// A config.json of 1e9 layers (or sizes past 64 bits) is refused before anything is allocated;
// ds_generate and ds_serve were OOM-killed or aborted with std::bad_alloc.
TEST_F(HFIO, AbsurdConfigsAreRefusedBeforeAllocation) {
  auto cfg = models::hf_config_from_json({{"model_type", "llama"},
                                          {"hidden_size", 64},
                                          {"intermediate_size", 128},
                                          {"num_attention_heads", 4},
                                          {"num_hidden_layers", 1000000000},
                                          {"vocab_size", 256}});
  const std::string msg = error_of(
      [&] { models::check_model_fits(cfg, DType::f32, int64_t(16) << 30, "m/config.json"); });
  EXPECT_NE(msg.find("m/config.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("n_layer 1000000000"), std::string::npos) << msg;
  EXPECT_NE(msg.find("nothing was allocated"), std::string::npos) << msg;
  cfg.n_layer = 2;
  EXPECT_NO_THROW(models::check_model_fits(cfg, DType::f32, int64_t(16) << 30, "m/config.json"));
  // A llama's max_position_embeddings adds no weights, but the model keeps block_size position
  // ids: 1e12 of them were a std::bad_alloc.
  cfg.block_size = 1000000000000;
  EXPECT_NE(error_of([&] {
              models::check_model_fits(cfg, DType::f32, int64_t(16) << 30, "m/config.json");
            }).find("block_size 1000000000000"),
            std::string::npos);
  cfg.block_size = 64;
  cfg.n_embd = int64_t(1) << 40;
  cfg.n_layer = int64_t(1) << 40;
  EXPECT_NE(error_of([&] { (void)cfg.num_parameters(); }).find("more than 9.2e18 parameters"),
            std::string::npos);
}

// Sizes the JSON library would cast with wrap-around (1e30 layers read as -9.2e18, 2^64 as -1) or
// truncate (2.5 heads as 2) are refused naming config.json and the field; 1e5 written with an
// exponent is still the whole number it is.
TEST_F(HFIO, ConfigSizesMustBeWholeNumbersInRange) {
  const json base = {{"model_type", "llama"},    {"hidden_size", 64},
                     {"intermediate_size", 128}, {"num_attention_heads", 4},
                     {"num_hidden_layers", 2},   {"vocab_size", 256}};
  auto with = [&](const char* key, const json& v) {
    json j = base;
    j[key] = v;
    return error_of([&] { models::hf_config_from_json(j, "m/config.json"); });
  };
  std::string msg = with("num_hidden_layers", 1e30);
  EXPECT_NE(msg.find("[hf_io] m/config.json: \"num_hidden_layers\" = 1e+30 is out of range"),
            std::string::npos)
      << msg;
  msg = with("vocab_size", json::parse("18446744073709551615"));
  EXPECT_NE(msg.find("\"vocab_size\" = 18446744073709551615 is out of range"), std::string::npos)
      << msg;
  msg = with("num_attention_heads", 2.5);
  EXPECT_NE(msg.find("\"num_attention_heads\" = 2.5 is not a whole number"), std::string::npos)
      << msg;
  json j = base;
  j["num_hidden_layers"] = 1e5;
  EXPECT_EQ(models::hf_config_from_json(j).n_layer, 100000);
  // Our own model config (ds_train/ds_estimate --model, an export's "ds_cpp") the same way.
  msg = error_of(
      [] { models::GPTConfig::from_json_string(R"({"preset": "tiny", "n_layer": 1e30})"); });
  EXPECT_NE(msg.find("'n_layer' = 1e+30 in the model config is out of range"), std::string::npos)
      << msg;
  msg =
      error_of([] { models::GPTConfig::from_json_string(R"({"preset": "tiny", "n_head": 2.5})"); });
  EXPECT_NE(msg.find("'n_head' = 2.5 in the model config is not a whole number"), std::string::npos)
      << msg;
  EXPECT_EQ(models::GPTConfig::from_json_string(R"({"preset": "tiny", "n_layer": 3e0})").n_layer,
            3);
}

TEST_F(HFIO, ConfigErrors) {
  EXPECT_NE(error_of([] {
              models::hf_config_from_json({{"model_type", "bert"}});
            }).find("model_type \"bert\" is not supported"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              models::hf_config_from_json({{"model_type", "llama"},
                                           {"hidden_size", 64},
                                           {"num_attention_heads", 8},
                                           {"num_key_value_heads", 3}});
            }).find("num_key_value_heads 3 must divide num_attention_heads 8"),
            std::string::npos);
  EXPECT_NE(
      error_of([] {
        models::hf_config_from_json({{"model_type", "gpt2"}, {"activation_function", "relu"}});
      }).find("activation_function \"relu\""),
      std::string::npos);
  EXPECT_NE(error_of([] {
              models::hf_config_from_json({{"model_type", "gpt2"}, {"quantization_config", 1}});
            }).find("field \"quantization_config\" is not understood for model_type gpt2"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              models::hf_config_from_json({{"model_type", "gpt2"}, {"n_embd", "wide"}});
            }).find("bad value for \"n_embd\""),
            std::string::npos);
}

}  // namespace

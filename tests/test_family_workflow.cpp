// A model family's workflow end to end, as a user runs it: ChatGLM-style JSONL records ->
// `ds_prepare --sft chatglm` -> `ds_train --init_from <Hugging Face folder of the family>` -> the
// export loaded by ds_serve's code and asked through the guide's POST / (the server in process on
// an ephemeral port). The tokenizer is the small qwen2_bpe fixture; the model a tiny GLM-4 built
// and exported here (no downloads, no Python).
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "ds/core/safetensors.h"
#include "ds/data/text_tokenizer.h"
#include "ds/models/gpt.h"
#include "ds/models/hf_io.h"
#include "ds/serve/generate.h"
#include "serve/server.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
namespace models = ds::models;
namespace nn = ds::nn;

namespace {

const fs::path kQwen = fs::path(DS_FIXTURE_DIR) / "tokenizers" / "qwen2_bpe";

const ds::data::TextTokenizer& qwen() {
  static const auto tok = ds::data::load_tokenizer(kQwen);
  return *tok;
}

std::string read(const fs::path& p) {
  std::ifstream f(p);
  return {std::istreambuf_iterator<char>(f), {}};
}

// Runs `cmd` with its output in dir/log.txt, read into *log; the exit status (-1: killed).
int shell(const fs::path& dir, const std::string& cmd, std::string* log) {
  const fs::path out = dir / "log.txt";
  const int status = std::system((cmd + " > " + out.string() + " 2>&1").c_str());
  *log = read(out);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class FamilyWorkflow : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ds_family_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!std::getenv("DS_KEEP_TEST_DIR")) fs::remove_all(dir_);
  }
  fs::path write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p;
  }
  fs::path dir_;
};

}  // namespace

// The Chinese guide's workflow with a GLM model: ChatGLM-style records -> ds_prepare --sft chatglm
// -> ds_train --init_from a GLM Hugging Face folder -> the export served, answering the guide's
// POST / (in process, as ds_serve runs it).
TEST_F(FamilyWorkflow, GlmModelFromPrepareThroughTrainToTheGuideRoute) {
  std::string records;
  for (int i = 0; i < 24; ++i)
    records += json({{"prompt", "Count " + std::to_string(i)},
                     {"response", std::to_string(i) + " " + std::to_string(i + 1)},
                     {"history", json::array()}})
                   .dump() +
               "\n";
  write("in/glm.jsonl", records);
  auto sh = [&](const std::string& cmd, std::string* log) {
    const fs::path out = dir_ / "log.txt";
    const int status = std::system((cmd + " > " + out.string() + " 2>&1").c_str());
    *log = read(out);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  std::string log;
  ASSERT_EQ(sh(std::string(DS_PREPARE_BIN) + " --sft chatglm --template chatglm --tokenizer " +
                   kQwen.string() + " --seq_len 32 --val_fraction 0.125 --output " +
                   (dir_ / "sft").string() + " " + (dir_ / "in").string(),
               &log),
            0)
      << log;
  // A GLM-4 model (GQA, q/k/v biases, half of each head rotating in pairs, sandwich norms) as a
  // Hugging Face folder, with the tokenizer beside it.
  models::GPTConfig c = models::GPTConfig::defaults(nn::Layout::llama);
  c.family = "glm4";
  c.vocab_size = static_cast<int64_t>(qwen().vocab_size());
  c.block_size = 64;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = 32;
  c.head_size = 16;
  c.ffn_hidden = 64;
  c.qkv_bias = true;
  c.partial_rotary_factor = 0.5f;
  c.rope_interleaved = true;
  c.sandwich_norm = true;
  c.seed = 3;
  {
    models::GPT base(c);
    models::export_hf(base, dir_ / "glm_base");
  }
  for (const auto& e : fs::directory_iterator(kQwen))
    fs::copy_file(e.path(), dir_ / "glm_base" / e.path().filename());
  {
    const json cfg = json::parse(read(dir_ / "glm_base" / "config.json"));
    EXPECT_EQ(cfg["architectures"][0], "Glm4ForCausalLM");
  }
  const std::string train = std::string(DS_TRAIN_BIN) + " --train_data " + (dir_ / "sft").string() +
                            " --init_from " + (dir_ / "glm_base").string() +
                            " --per_device_train_batch_size 2 --gradient_accumulation_steps 1"
                            " --learning_rate 0.01 --warmup_steps 1 --eval_batches 1 "
                            "--sample_tokens 0 --threads 1 --max_steps 12 --eval_steps 6 "
                            "--export_hf " +
                            (dir_ / "hf").string() + " --output_dir " + (dir_ / "run").string();
  ASSERT_EQ(sh(train, &log), 0) << log;
  std::ifstream csv(dir_ / "run" / "metrics" / "Train_Samples_train_loss.csv");
  std::string header, row;
  std::getline(csv, header);
  std::vector<double> losses;
  while (std::getline(csv, row)) losses.push_back(std::stod(row.substr(row.find(',') + 1)));
  ASSERT_EQ(losses.size(), 12u);
  EXPECT_LT(losses.back(), losses.front()) << log;
  {
    const json cfg = json::parse(read(dir_ / "hf" / "config.json"));
    EXPECT_EQ(cfg["model_type"], "glm4");
    EXPECT_EQ(cfg["rope_parameters"]["partial_rotary_factor"], 0.5);
  }

  ds::serve::ServerOptions o;
  o.port = 0;
  o.log_requests = false;
  auto lm = ds::serve::load_model(dir_ / "hf");
  EXPECT_EQ(lm.model->config().family, "glm4");
  ds::serve::Server server(std::move(lm), o);
  const int port = server.bind();
  std::thread t([&] { server.run(); });
  httplib::Client cl("127.0.0.1", port);
  cl.set_read_timeout(60, 0);
  for (int i = 0; i < 200; ++i) {  // until the listener answers
    if (auto h = cl.Get("/health"); h && h->status == 200) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  auto r =
      cl.Post("/", R"({"prompt": "Count 3", "history": [], "max_length": 40})", "application/json");
  server.stop();
  t.join();
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["status"], 200);
  ASSERT_TRUE(j["response"].is_string());
  EXPECT_EQ(j["history"], json::array({json::array({"Count 3", j["response"]})}));
}

namespace {

// One family of MoeLoraSftToPeftAdapter below: `hf` (a transformers config) saved as a Hugging Face
// folder with the Qwen tokenizer beside it, trained with LoRA on the attention projections, the
// routers and the stacked experts (peft's target_parameters) on dir/sft; its adapter, checkpoint
// and merged exports checked, the refusals (dropout, expert parallelism) too.
void train_moe_lora(const fs::path& dir, const json& hf) {
  std::string log;
  auto sh = [&](const std::string& cmd, std::string* out) { return shell(dir, cmd, out); };
  const std::string type = hf["model_type"];
  const fs::path base = dir / (type + "_base"), run = dir / (type + "_run");
  models::GPTConfig c = models::hf_config_from_json(hf);
  c.seed = 3;
  models::GPT m(c);
  models::export_hf(m, base);
  for (const auto& e : fs::directory_iterator(kQwen))
    fs::copy_file(e.path(), base / e.path().filename());
  const std::string train =
      std::string(DS_TRAIN_BIN) + " --train_data " + (dir / "sft").string() + " --init_from " +
      base.string() +
      " --per_device_train_batch_size 2 --gradient_accumulation_steps 1"
      " --learning_rate 0.02 --warmup_steps 1 --eval_batches 1 --sample_tokens 0 --threads 1"
      " --max_steps 12 --eval_steps 0 --lora_dim 4 --lora_alpha 8 --only_optimize_lora"
      " --output_dir " +
      run.string();
  // The experts as PEFT users name them in target_parameters, beside the Linear targets.
  ASSERT_EQ(sh(train + " --lora_module_name q_proj,k_proj,v_proj,o_proj,gate,"
                       "mlp.experts.gate_up_proj,mlp.experts.down_proj",
               &log),
            0)
      << log;
  EXPECT_NE(log.find("active per token: 2 of 4 experts"), std::string::npos) << log;
  EXPECT_NE(log.find("14 modules matching"), std::string::npos) << log;  // 2 x (5 + 2)
  std::ifstream csv(run / "metrics" / "Train_Samples_train_loss.csv");
  std::string header, row;
  std::getline(csv, header);
  std::vector<double> losses;
  while (std::getline(csv, row)) losses.push_back(std::stod(row.substr(row.find(',') + 1)));
  ASSERT_EQ(losses.size(), 12u) << type;
  EXPECT_LT(losses.back(), losses.front()) << type << "\n" << log;
  // Only the LoRA factors trained: every other parameter in the last checkpoint is bitwise the
  // base model's, and every factor moved (B from zero), the experts' included.
  ds::safetensors::Reader ck(
      (run / "global_step12" / "mp_rank_00_model_states.safetensors").string());
  int lora_moved = 0;
  for (const auto& [name, p] : m.named_parameters()) {
    ASSERT_TRUE(ck.contains(name)) << name;
    const ds::Tensor t = ck.get(name);
    EXPECT_EQ(std::memcmp(t.raw_data(), p.raw_data(), p.numel() * sizeof(float)), 0)
        << type << ": " << name << " changed";
  }
  for (const auto& n : ck.names())
    if (n.find(".lora_B.") != std::string::npos) {
      const ds::Tensor b = ck.get(n);
      const float* v = b.data<float>();
      lora_moved += std::any_of(v, v + b.numel(), [](float x) { return x != 0.0f; });
    }
  EXPECT_EQ(lora_moved, 14) << type;
  // The adapter: PEFT's names under the Hugging Face module paths; the experts' factors on the
  // experts module, gate_up_proj's under base_layer (peft nests one wrapper per parameter).
  const json ac = json::parse(read(run / "hf_model" / "adapter_config.json"));
  EXPECT_EQ(ac["peft_type"], "LORA") << type;
  EXPECT_EQ(ac["r"], 4) << type;
  EXPECT_EQ(ac["target_parameters"], json({"down_proj", "gate_up_proj"})) << ac.dump(2);
  ds::safetensors::Reader adapter((run / "hf_model" / "adapter_model.safetensors").string());
  EXPECT_EQ(adapter.names().size(), 2u * 2 * 7) << type;  // layers x (A, B) x targets
  const std::string ex = "base_model.model.model.layers.1.mlp.experts.";
  EXPECT_EQ(adapter.entry(ex + "base_layer.lora_A.weight").shape,
            ds::Shape({4 * 4, c.n_embd}))  // gate_up_proj: A (r E, C)
      << type;
  EXPECT_EQ(adapter.entry(ex + "lora_B.weight").shape,
            ds::Shape({c.n_embd, 4 * 4}))  // down: (C, r E)
      << type;
  EXPECT_TRUE(adapter.contains("base_model.model.model.layers.0.mlp.gate.lora_A.weight")) << type;
  EXPECT_FALSE(fs::exists(run / "hf_model" / "model.safetensors")) << type;

  // --merge_lora with the experts adapted (the substring "experts" selects both): a plain Hugging
  // Face folder whose stacked experts moved, which ds_serve loads as the same family.
  ASSERT_EQ(sh(train + "_m --lora_module_name q_proj,gate,experts --merge_lora", &log), 0) << log;
  ds::safetensors::Reader merged(
      (dir / (type + "_run_m") / "hf_model" / "model.safetensors").string());
  ASSERT_TRUE(merged.contains("model.layers.0.mlp.experts.gate_up_proj")) << type;
  for (const auto& n : merged.names()) EXPECT_EQ(n.find("lora_"), std::string::npos) << n;
  ds::safetensors::Reader base_file((base / "model.safetensors").string());
  for (const std::string n :
       {"model.layers.0.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj"}) {
    const ds::Tensor a = merged.get(n), b = base_file.get(n);
    EXPECT_NE(std::memcmp(a.raw_data(), b.raw_data(), a.numel() * sizeof(float)), 0)
        << n << ": the merge left the experts as they were";
  }
  EXPECT_EQ(ds::serve::load_model(dir / (type + "_run_m") / "hf_model").model->config().family,
            type);

  // Refused at start-up: a dropout (peft's ParamWrapper has none) with expert targets.
  EXPECT_EQ(sh(train + "_x --lora_module_name q_proj,down_proj --lora_dropout 0.1", &log), 1)
      << log;
  EXPECT_NE(log.find("target_parameters (ParamWrapper) have no dropout"), std::string::npos) << log;
}

}  // namespace

// LoRA on a mixture of experts (docs/finetuning.md): SFT records -> ds_prepare --sft -> ds_train
// --init_from a Mixtral / Qwen3-MoE Hugging Face folder with LoRA on the attention projections,
// the routers and the stacked experts (only the LoRA matrices trained) -> a PEFT adapter with the
// Hugging Face module names and peft's target_parameters layout for the experts
// (tests/fixtures/generators/check_moe_lora_adapter.py checks that peft loads it as we apply it).
TEST_F(FamilyWorkflow, MoeLoraSftToPeftAdapter) {
  std::string records;
  for (int i = 0; i < 24; ++i)
    records += json({{"messages",
                      {{{"role", "user"}, {"content", "Count " + std::to_string(i)}},
                       {{"role", "assistant"}, {"content", std::to_string(i + 1)}}}}})
                   .dump() +
               "\n";
  write("in/msgs.jsonl", records);
  std::string log;
  ASSERT_EQ(shell(dir_,
                  std::string(DS_PREPARE_BIN) + " --sft auto --tokenizer " + kQwen.string() +
                      " --seq_len 48 --val_fraction 0.125 --output " + (dir_ / "sft").string() +
                      " " + (dir_ / "in").string(),
                  &log),
            0)
      << log;
  const json shape = {{"hidden_size", 32},        {"num_attention_heads", 4},
                      {"num_key_value_heads", 2}, {"num_hidden_layers", 2},
                      {"intermediate_size", 48},  {"max_position_embeddings", 64},
                      {"num_experts_per_tok", 2}, {"vocab_size", qwen().vocab_size()}};
  json mixtral = shape, qwen3_moe = shape;
  mixtral["model_type"] = "mixtral";
  mixtral["num_local_experts"] = 4;
  qwen3_moe["model_type"] = "qwen3_moe";
  qwen3_moe["num_experts"] = 4;
  qwen3_moe["moe_intermediate_size"] = 24;
  qwen3_moe["head_dim"] = 16;
  for (const json& hf : {mixtral, qwen3_moe}) {
    train_moe_lora(dir_, hf);
    if (HasFatalFailure()) return;
  }
}

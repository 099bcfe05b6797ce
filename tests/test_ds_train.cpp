// ds_train end to end on a synthetic corpus and the test-gpt2 model (seconds per run): the outputs
// of docs/training.md exist in their documented layout, a resumed run reproduces the metrics of an
// uninterrupted one bit for bit, rotation keeps the newest checkpoint, and errors end the program
// with exit code 1 and a message that says what to do.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ds/data/text_tokenizer.h"
#include "ds/core/safetensors.h"
#include "ds/data/shard.h"
#include "ds/models/gpt.h"
#include "ds/runtime/tensorboard_monitor.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

class DsTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ds_train_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_ / "data");
    // A learnable stream over 64 ids: a few repeated phrases with noise, so the loss falls.
    auto stream = [](size_t n, uint64_t seed) {
      std::vector<int32_t> t;
      uint64_t x = seed;
      while (t.size() < n) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        const int phrase = static_cast<int>((x >> 33) % 4);
        for (int k = 0; k < 5; ++k) t.push_back(static_cast<int32_t>(phrase * 10 + k));
        t.push_back(static_cast<int32_t>(40 + (x >> 40) % 24));
      }
      t.resize(n);
      return t;
    };
    const auto train = stream(4000, 1), val = stream(600, 2);
    ds::data::write_shard(dir_ / "data" / "train.bin", train, 64);
    ds::data::write_shard(dir_ / "data" / "val.bin", val, 64);
    const json meta = {{"splits",
                        {{"train", {{"files", {"train.bin"}}, {"tokens", train.size()}}},
                         {"val", {{"files", {"val.bin"}}, {"tokens", val.size()}}}}}};
    std::ofstream(dir_ / "data" / "meta.json") << meta.dump();
    std::ofstream(dir_ / "model.json") << R"({"preset": "test-gpt2", "dropout": 0.1})";
  }
  void TearDown() override {
    if (!std::getenv("DS_KEEP_TEST_DIR")) fs::remove_all(dir_);
  }

  // Runs ds_train with the common flags plus `args`; returns the exit code, output in log_.
  // `launcher`: a command put in front (the deepspeed launcher for several ranks).
  int run(const std::string& args, bool common = true, const std::string& launcher = "") {
    const fs::path log = dir_ / "log.txt";
    // The common flags come first: a later flag wins (TakeLast), so `args` can override them.
    std::string cmd = launcher.empty() ? DS_TRAIN_BIN : launcher + " " + DS_TRAIN_BIN;
    if (common)
      cmd +=
          " --train_data " + (dir_ / "data").string() + " --model " +
          (dir_ / "model.json").string() +
          " --block_size 16 --per_device_train_batch_size 2 --gradient_accumulation_steps 2"
          " --learning_rate 0.01 --warmup_steps 2 --eval_batches 2 --sample_tokens 0 --threads 1";
    cmd += " " + args;
    const int status = std::system((cmd + " > " + log.string() + " 2>&1").c_str());
    log_ = read(log);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  // The values column of a metrics CSV (header skipped).
  static std::vector<double> values(const fs::path& f) {
    std::vector<double> v;
    std::istringstream in(read(f));
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) v.push_back(std::stod(line.substr(line.rfind(',') + 1)));
    return v;
  }
  // Run b's metrics `names` (CSV files under metrics/) equal run a's within 1e-4 relative (fp32
  // summation order: another layout of the same training).
  static void expect_same_metrics(const fs::path& a_dir, const fs::path& b_dir,
                                  const std::vector<std::string>& names) {
    for (const std::string& f : names) {
      const auto a = values(a_dir / "metrics" / (f + ".csv")),
                 b = values(b_dir / "metrics" / (f + ".csv"));
      ASSERT_EQ(a.size(), b.size()) << f;
      ASSERT_FALSE(a.empty()) << f;
      for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-4 * std::abs(a[i])) << f;
    }
  }
  static std::string read(const fs::path& p) {
    std::ifstream f(p);
    return {std::istreambuf_iterator<char>(f), {}};
  }

  fs::path dir_;
  std::string log_;
};

TEST_F(DsTrain, OutputsAndExactResume) {
  const fs::path a = dir_ / "a";
  ASSERT_EQ(run("--max_steps 6 --save_steps 3 --eval_steps 3 --output_dir " + a.string()), 0)
      << log_;
  EXPECT_NE(log_.find("optimizer.params.lr"), std::string::npos);
  EXPECT_NE(log_.find("auto: trainer learning_rate"), std::string::npos) << log_;
  EXPECT_NE(log_.find("GEMM:"), std::string::npos);
  EXPECT_NE(log_.find("unigram entropy"), std::string::npos);

  // DeepSpeed's csv_monitor layout: step = samples (G = 2 x 2 = 4 per step).
  const std::string loss = read(a / "metrics" / "Train_Samples_train_loss.csv");
  EXPECT_EQ(loss.rfind("step,train_loss\n4,", 0), 0u) << loss;
  EXPECT_NE(loss.find("\n24,"), std::string::npos) << loss;
  for (const char* f : {"Train_Samples_lr", "Train_Samples_grad_norm",
                        "Train_Samples_tokens_per_second", "Eval_Samples_eval_loss",
                        "Eval_Samples_eval_perplexity"})
    EXPECT_TRUE(fs::exists(a / "metrics" / (std::string(f) + ".csv"))) << f;
  // The loss scale is fp16's (DeepSpeed writes it only then); this run is fp32.
  EXPECT_FALSE(fs::exists(a / "metrics" / "Train_Samples_loss_scale.csv"));
  EXPECT_EQ(read(a / "loss.svg").rfind("<svg", 0), 0u);
  const json mem = json::parse(read(a / "memory.json"));
  EXPECT_EQ(mem["world_size"], 1);
  EXPECT_EQ(mem["zero_stage"], 0);
  ASSERT_EQ(mem["ranks"].size(), 1u) << mem.dump();
  for (const char* k : {"params_bytes", "grads_bytes", "master_weights_bytes",
                        "optimizer_states_bytes", "model_state_bytes", "peak_rss_bytes"})
    EXPECT_TRUE(mem["ranks"][0].contains(k)) << k;
  EXPECT_GT(mem["ranks"][0]["peak_rss_bytes"].get<int64_t>(), 0);
  EXPECT_EQ(mem["ranks"][0]["model_state_bytes"],
            mem["paper_model_state_bytes_per_rank"]["model_state_bytes"]);
  EXPECT_EQ(read(a / "latest"), "global_step6\n");
  EXPECT_TRUE(fs::is_directory(a / "global_step3"));
  EXPECT_TRUE(fs::exists(a / "hf_model" / "model.safetensors"));

  // Stop after step 3 (as if the run died there) and resume: every metric row is identical.
  const fs::path b = dir_ / "b";
  fs::copy(a, b, fs::copy_options::recursive);
  fs::remove_all(b / "global_step6");
  std::ofstream(b / "latest") << "global_step3\n";
  ASSERT_EQ(run("--max_steps 6 --save_steps 3 --eval_steps 3 --output_dir " + b.string() +
                " --resume_from_checkpoint latest"),
            0)
      << log_;
  EXPECT_NE(log_.find("resumed from"), std::string::npos) << log_;
  for (const char* f : {"Train_Samples_train_loss", "Train_Samples_lr", "Train_Samples_grad_norm",
                        "Eval_Samples_eval_loss"})
    EXPECT_EQ(read(b / "metrics" / (std::string(f) + ".csv")),
              read(a / "metrics" / (std::string(f) + ".csv")))
        << f;

  // The export is a valid --init_from source.
  ASSERT_EQ(run("--max_steps 1 --output_dir " + (dir_ / "c").string() + " --init_from " +
                (a / "hf_model").string()),
            0)
      << log_;
  EXPECT_NE(log_.find("initialised from"), std::string::npos) << log_;
}

// The HF export carries the tokenizer (AutoTokenizer.from_pretrained(export) then loads), with
// config.json's special-token ids from it; one larger than the model's vocabulary is not written.
// --report_to tensorboard: DeepSpeed's TensorBoard folder (<output_dir>/DeepSpeedJobName) beside
// the CSV files, with the same values; a run resumed from an earlier checkpoint adds a file that
// starts a session there, so that TensorBoard drops the steps trained again, as the CSV files do.
// --report_to wandb stops before any work and names the alternative.
TEST_F(DsTrain, ReportToTensorBoard) {
  const fs::path a = dir_ / "a";
  const std::string flags =
      "--max_steps 4 --save_steps 2 --eval_steps 2 --report_to tensorboard --output_dir " +
      a.string();
  ASSERT_EQ(run(flags), 0) << log_;
  const std::string events_line = "TensorBoard events: " + (a / "DeepSpeedJobName").string();
  EXPECT_NE(log_.find(events_line), std::string::npos) << log_;
  EXPECT_EQ(log_.find("not implemented"), std::string::npos) << log_;
  ASSERT_EQ(run(flags + " --resume_from_checkpoint " + (a / "global_step2").string()), 0) << log_;

  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(a / "DeepSpeedJobName")) files.push_back(e.path());
  std::sort(files.begin(), files.end());  // TensorBoard's order: by name, that is by time
  ASSERT_EQ(files.size(), 2u);
  // What TensorBoard shows: each file's scalars, a session start dropping steps >= its step.
  std::map<std::string, std::vector<std::pair<int64_t, float>>> shown;
  for (const fs::path& f : files) {
    const auto events = ds::runtime::read_tensorboard_events(f);
    ASSERT_FALSE(events.empty());
    EXPECT_EQ(events[0].file_version, "brain.Event:2");
    for (const auto& e : events) {
      if (e.session_start) {
        EXPECT_EQ(e.step, 9);  // resumed at 2 steps x 4 samples
        for (auto& [tag, rows] : shown)
          std::erase_if(rows, [&](const auto& r) { return r.first >= e.step; });
      }
      for (const auto& [tag, v] : e.scalars) shown[tag].emplace_back(e.step, v);
    }
  }
  for (const char* tag : {"Train/Samples/train_loss", "Train/Samples/lr", "Train/Samples/grad_norm",
                          "Eval/Samples/eval_loss"}) {
    std::string stem = tag;
    std::replace(stem.begin(), stem.end(), '/', '_');
    const auto csv = values(a / "metrics" / (stem + ".csv"));
    const auto& tb = shown[tag];
    ASSERT_EQ(tb.size(), csv.size()) << tag;
    ASSERT_FALSE(csv.empty()) << tag;
    for (size_t i = 0; i < csv.size(); ++i)
      EXPECT_NEAR(tb[i].second, csv[i], 1e-6 * std::abs(csv[i]) + 1e-12) << tag << " " << i;
  }
  EXPECT_EQ(shown["Train/Samples/train_loss"].back().first, 16);

  ASSERT_NE(run("--max_steps 4 --report_to wandb --output_dir " + (dir_ / "w").string()), 0);
  EXPECT_NE(log_.find("wandb sync --sync-tensorboard"), std::string::npos) << log_;
  EXPECT_FALSE(fs::exists(dir_ / "w"));
}

TEST_F(DsTrain, ExportCarriesTheTokenizer) {
  const fs::path tok = fs::path(DS_FIXTURE_DIR) / "tokenizers" / "gpt2_bpe";
  std::ofstream(dir_ / "model_v.json") << R"({"preset": "test-gpt2", "vocab_size": 768})";
  const fs::path a = dir_ / "a";
  ASSERT_EQ(run("--max_steps 2 --eval_steps 0 --model " + (dir_ / "model_v.json").string() +
                " --tokenizer " + tok.string() + " --output_dir " + a.string()),
            0)
      << log_;
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"})
    EXPECT_TRUE(fs::exists(a / "hf_model" / f)) << f << "\n" << log_;
  const auto loaded = ds::data::load_tokenizer(a / "hf_model");
  const auto original = ds::data::load_tokenizer(tok);
  EXPECT_EQ(loaded->vocab_size(), original->vocab_size());
  const json cfg = json::parse(read(a / "hf_model" / "config.json"));
  if (original->config().eos_id >= 0) EXPECT_EQ(cfg["eos_token_id"], original->config().eos_id);
  EXPECT_NE(log_.find("written beside the export"), std::string::npos) << log_;

  const fs::path b = dir_ / "b";  // model.json: vocab_size 64, smaller than the tokenizer's
  ASSERT_EQ(run("--max_steps 2 --eval_steps 0 --tokenizer " + tok.string() + " --output_dir " +
                b.string()),
            0)
      << log_;
  EXPECT_FALSE(fs::exists(b / "hf_model" / "tokenizer.json"));
  EXPECT_NE(log_.find("do not fit the model's vocab_size 64"), std::string::npos) << log_;
}

// --eval_only evaluates the model as loaded (here the export of a finished run: the same eval loss
// that run printed last) and trains nothing; --no_shuffle reaches the sampler (a checkpoint taken
// with shuffling refuses to resume without it).
TEST_F(DsTrain, EvalOnlyAndNoShuffle) {
  const fs::path a = dir_ / "a";
  ASSERT_EQ(run("--max_steps 4 --eval_steps 0 --save_steps 2 --output_dir " + a.string()), 0)
      << log_;
  const auto at = log_.find("step 4: eval loss ");
  ASSERT_NE(at, std::string::npos) << log_;
  const std::string trained_eval = log_.substr(at + 18, 6);  // "x.xxxx"
  const fs::path e = dir_ / "e";
  ASSERT_EQ(run("--eval_only --init_from " + (a / "hf_model").string() + " --output_dir " +
                e.string()),
            0)
      << log_;
  const auto got = log_.find("eval only: loss ");
  ASSERT_NE(got, std::string::npos) << log_;
  // The same model and batches: printed to 4 and 6 decimals.
  EXPECT_NEAR(std::stod(log_.substr(got + 16, 8)), std::stod(trained_eval), 5.1e-5) << log_;
  EXPECT_EQ(log_.find("step 1/"), std::string::npos) << "trained:\n" << log_;
  EXPECT_FALSE(fs::exists(e / "hf_model"));

  EXPECT_EQ(run("--max_steps 6 --eval_steps 0 --no_shuffle --output_dir " + a.string() +
                " --resume_from_checkpoint latest"),
            1);
  EXPECT_NE(log_.find("shuffle"), std::string::npos) << log_;
  const fs::path c = dir_ / "c";
  ASSERT_EQ(run("--max_steps 2 --eval_steps 0 --no_shuffle --output_dir " + c.string()), 0)
      << log_;
}

TEST_F(DsTrain, RotationKeepsTheNewest) {
  const fs::path a = dir_ / "a";
  ASSERT_EQ(run("--max_steps 6 --save_steps 2 --save_total_limit 1 --eval_steps 0 --export_hf none "
                "--output_dir " +
                a.string()),
            0)
      << log_;
  EXPECT_FALSE(fs::exists(a / "global_step2"));
  EXPECT_FALSE(fs::exists(a / "global_step4"));
  EXPECT_TRUE(fs::is_directory(a / "global_step6"));
  EXPECT_FALSE(fs::exists(a / "hf_model"));
}

#ifdef DS_LAUNCHER_EXE
// Two ranks through the deepspeed launcher: ZeRO-2 with "auto" batch values trains, writes one
// memory.json with both ranks' model-state bytes as the ZeRO paper predicts, one optimizer shard
// per rank, and resumes bit for bit; ZeRO-3 then continues from that ZeRO-2 checkpoint.
TEST_F(DsTrain, SeveralRanksThroughTheLauncher) {
  const std::string launcher = std::string(DS_LAUNCHER_EXE) + " --num_procs 2";
  auto write_config = [&](int stage) {
    const fs::path f = dir_ / fmt::format("zero{}.json", stage);
    std::ofstream(f) << R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
      "gradient_accumulation_steps": "auto", "bf16": {"enabled": true},
      "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": 0.1}},
      "zero_optimization": {"stage": )"
                     << stage << R"(, "overlap_comm": true, "reduce_bucket_size": 2000,
        "stage3_param_persistence_threshold": 0}})";
    return f.string();
  };
  const fs::path a = dir_ / "a";
  const std::string flags =
      " --max_steps 4 --save_steps 2 --eval_steps 2 --deepspeed " + write_config(2);
  ASSERT_EQ(run(flags + " --output_dir " + a.string(), true, launcher), 0) << log_;
  EXPECT_NE(log_.find("model-state memory per rank, ZeRO stage 2"), std::string::npos) << log_;

  const json mem = json::parse(read(a / "memory.json"));
  EXPECT_EQ(mem["world_size"], 2);
  EXPECT_EQ(mem["zero_stage"], 2);
  ASSERT_EQ(mem["ranks"].size(), 2u) << mem.dump();
  const json& paper = mem["paper_model_state_bytes_per_rank"];
  for (int r = 0; r < 2; ++r) {
    const json& m = mem["ranks"][r];
    EXPECT_EQ(m["rank"], r);
    for (const char* k :
         {"params_bytes", "grads_bytes", "master_weights_bytes", "optimizer_states_bytes"})
      EXPECT_EQ(m[k], paper[k]) << "rank " << r << " " << k;
    EXPECT_GT(m["peak_rss_bytes"].get<int64_t>(), 0);
  }
  // Stage 2, bf16: 2-byte parameters whole, fp32 gradients/master/moments only for the partition.
  EXPECT_EQ(paper["params_bytes"].get<int64_t>(),
            2 * (paper["grads_bytes"].get<int64_t>() / 4) * 2);
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(
        fs::exists(a / "global_step4" /
                   fmt::format("bf16_zero_pp_rank_{}_mp_rank_00_optim_states.safetensors", r)))
        << r;
  EXPECT_FALSE(fs::exists(a / "memory_rank1.json"));

  // Resume at step 2 on 2 ranks: every metric row as in the uninterrupted run.
  const fs::path b = dir_ / "b";
  fs::copy(a, b, fs::copy_options::recursive);
  fs::remove_all(b / "global_step4");
  std::ofstream(b / "latest") << "global_step2\n";
  ASSERT_EQ(run(flags + " --output_dir " + b.string() + " --resume_from_checkpoint latest", true,
                launcher),
            0)
      << log_;
  for (const char* f :
       {"Train_Samples_train_loss", "Train_Samples_grad_norm", "Eval_Samples_eval_loss"})
    EXPECT_EQ(read(b / "metrics" / (std::string(f) + ".csv")),
              read(a / "metrics" / (std::string(f) + ".csv")))
        << f;

  // ZeRO-3 continues from the ZeRO-2 checkpoint; its parameters are partitioned too, and the HF
  // export is gathered from both ranks.
  fs::remove_all(b / "hf_model");
  ASSERT_EQ(run(" --max_steps 6 --eval_steps 0 --deepspeed " + write_config(3) + " --output_dir " +
                    b.string() + " --resume_from_checkpoint latest",
                true, launcher),
            0)
      << log_;
  EXPECT_NE(log_.find("resumed from"), std::string::npos) << log_;
  const json mem3 = json::parse(read(b / "memory.json"));
  EXPECT_EQ(mem3["zero_stage"], 3);
  EXPECT_LT(mem3["ranks"][1]["params_bytes"].get<int64_t>(),
            mem["ranks"][1]["params_bytes"].get<int64_t>());
  ASSERT_TRUE(fs::exists(b / "hf_model" / "model.safetensors")) << log_;
  ds::safetensors::Reader exported((b / "hf_model" / "model.safetensors").string());
  ds::safetensors::Reader ck((b / "global_step6" / "mp_rank_00_model_states.safetensors").string());
  int64_t exported_numel = 0, ck_numel = 0;
  for (const auto& e : exported.entries())
    exported_numel += ds::Tensor(exported.get(e.name)).numel();
  for (const auto& e : ck.entries()) ck_numel += ds::Tensor(ck.get(e.name)).numel();
  EXPECT_EQ(exported_numel, ck_numel);
}

// Tensor parallelism on 2 ranks (tp = 2, dp = 1): the same losses and gradient norms as one
// process (within fp32 summation order; also under ZeRO-3), the HF export whole, a checkpoint that
// one process resumes, and --init_from an HF folder giving one process's losses from it. A flag
// that disagrees with the config's autotp_size is refused naming both.
TEST_F(DsTrain, TensorParallelTrainsAsOneProcess) {
  const std::string launcher = std::string(DS_LAUNCHER_EXE) + " --num_procs 2";
  const fs::path one = dir_ / "one", two = dir_ / "two";
  const std::string flags = " --max_steps 4 --eval_steps 2 --sample_tokens 0";
  ASSERT_EQ(run(flags + " --output_dir " + one.string()), 0) << log_;
  ASSERT_EQ(run(flags + " --tensor_parallel_size 2 --output_dir " + two.string(), true, launcher),
            0)
      << log_;
  EXPECT_NE(log_.find("tp=2"), std::string::npos) << log_;
  EXPECT_TRUE(fs::exists(two / "global_step4" / "mp_rank_01_model_states.safetensors")) << log_;
  expect_same_metrics(
      one, two, {"Train_Samples_train_loss", "Train_Samples_grad_norm", "Eval_Samples_eval_loss"});
  EXPECT_TRUE(fs::exists(two / "hf_model" / "model.safetensors"));
  EXPECT_EQ(fs::file_size(two / "hf_model" / "model.safetensors"),
            fs::file_size(one / "hf_model" / "model.safetensors"));

  // ZeRO-3 with tp = 2: one process's losses under the same config, and the export whole.
  const std::string zero3 =
      " --deepspeed '{\"train_batch_size\": \"auto\", \"train_micro_batch_size_per_gpu\": "
      "\"auto\", \"gradient_accumulation_steps\": \"auto\", \"zero_optimization\": "
      "{\"stage\": 3, \"stage3_param_persistence_threshold\": 0}}'";
  const fs::path z3one = dir_ / "z3one", z3 = dir_ / "z3";
  ASSERT_EQ(run(flags + zero3 + " --output_dir " + z3one.string()), 0) << log_;
  ASSERT_EQ(run(flags + zero3 + " --tensor_parallel_size 2 --output_dir " + z3.string(), true,
                launcher),
            0)
      << log_;
  expect_same_metrics(z3one, z3, {"Train_Samples_train_loss", "Train_Samples_grad_norm"});
  EXPECT_EQ(fs::file_size(z3 / "hf_model" / "model.safetensors"),
            fs::file_size(one / "hf_model" / "model.safetensors"));

  // The tp = 2 checkpoint resumes in one process (no conversion step).
  fs::remove_all(two / "hf_model");
  ASSERT_EQ(run(" --max_steps 6 --eval_steps 0 --sample_tokens 0 --output_dir " + two.string() +
                " --resume_from_checkpoint latest"),
            0)
      << log_;
  EXPECT_NE(log_.find("resumed from"), std::string::npos) << log_;
  EXPECT_TRUE(fs::exists(two / "global_step6"));

  // --init_from at tp = 2: each rank keeps its slices of the HF model; same losses as one process.
  const fs::path i1 = dir_ / "init1", i2 = dir_ / "init2";
  const std::string init =
      " --max_steps 2 --eval_steps 0 --sample_tokens 0 --init_from " + (one / "hf_model").string();
  ASSERT_EQ(run(init + " --output_dir " + i1.string()), 0) << log_;
  ASSERT_EQ(run(init + " --tensor_parallel_size 2 --output_dir " + i2.string(), true, launcher), 0)
      << log_;
  expect_same_metrics(i1, i2, {"Train_Samples_train_loss"});

  const fs::path cfg2 = dir_ / "tp2.json";
  std::ofstream(cfg2) << R"({"train_micro_batch_size_per_gpu": 2, "tensor_parallel": {"autotp_size": 2},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})";
  EXPECT_NE(run(flags + " --tensor_parallel_size 4 --deepspeed " + cfg2.string() +
                    " --output_dir " + (dir_ / "bad").string()),
            0);
  EXPECT_NE(log_.find("disagrees with tensor_parallel.autotp_size 2"), std::string::npos) << log_;
}
#endif

#if defined(DS_LAUNCHER_EXE)
// Expert parallelism on 2 ranks (each holds 2 of the 4 experts of every MoE layer): the losses
// and gradient norms of plain data parallelism on those ranks (every expert on each; the same
// global batch), ZeRO-2 and ZeRO-3, a checkpoint written at ep = 2 that one process resumes with
// the same global batch, an HF export with the whole experts (the size of the plain run's), and
// the flag against the config. (Equality with one process taking the whole batch:
// tests/test_moe_ep.cpp.)
TEST_F(DsTrain, ExpertParallelTrainsAsDataParallel) {
  std::ofstream(dir_ / "moe.json") << R"({"preset": "test-llama", "family": "mixtral",
    "num_experts": 4, "experts_per_tok": 2, "ffn_hidden": 48})";
  const std::string launcher = std::string(DS_LAUNCHER_EXE) + " --num_procs 2";
  const std::string flags = " --max_steps 4 --eval_steps 2 --sample_tokens 0 --model " +
                            (dir_ / "moe.json").string();
  for (int stage : {2, 3}) {
    const std::string zero =
        " --deepspeed '{\"train_batch_size\": \"auto\", \"train_micro_batch_size_per_gpu\": "
        "\"auto\", \"gradient_accumulation_steps\": \"auto\", \"zero_optimization\": "
        "{\"stage\": " + std::to_string(stage) + ", \"stage3_param_persistence_threshold\": 0}}'";
    const fs::path one = dir_ / ("dp" + std::to_string(stage)),
                   two = dir_ / ("ep" + std::to_string(stage));
    ASSERT_EQ(run(flags + zero + " --output_dir " + one.string(), true, launcher), 0) << log_;
    ASSERT_EQ(run(flags + zero + " --expert_parallel_size 2 --output_dir " + two.string(), true,
                  launcher),
              0)
        << log_;
    EXPECT_NE(log_.find("expert parallelism: the experts of 2 MoE layers split over 2 ranks"),
              std::string::npos)
        << log_;
    EXPECT_TRUE(fs::exists(two / "global_step4" / "expp_rank_1_mp_rank_00_model_states.safetensors"))
        << log_;
    expect_same_metrics(one, two, {"Train_Samples_train_loss", "Train_Samples_grad_norm"});
    EXPECT_EQ(fs::file_size(two / "hf_model" / "model.safetensors"),
              fs::file_size(one / "hf_model" / "model.safetensors"));
    if (stage == 2) {
      // The ep = 2 checkpoint resumes in one process (no conversion step), the global batch
      // kept: micro-batch 4 x accumulation 2.
      fs::remove_all(two / "hf_model");
      ASSERT_EQ(run(" --max_steps 6 --eval_steps 0 --sample_tokens 0 --model " +
                    (dir_ / "moe.json").string() + zero + " --output_dir " + two.string() +
                    " --per_device_train_batch_size 4 --resume_from_checkpoint latest"),
                0)
          << log_;
      EXPECT_NE(log_.find("resumed from"), std::string::npos) << log_;
      EXPECT_TRUE(fs::exists(two / "global_step6"));
    }
  }
  const fs::path cfg = dir_ / "ep2.json";
  std::ofstream(cfg) << R"({"train_micro_batch_size_per_gpu": 2,
    "expert_parallel": {"enabled": true, "autoep_size": 2}})";
  EXPECT_NE(run(flags + " --expert_parallel_size 4 --deepspeed " + cfg.string() +
                    " --output_dir " + (dir_ / "bad").string()),
            0);
  EXPECT_NE(log_.find("disagrees with expert_parallel.autoep_size 2"), std::string::npos) << log_;
  // AutoEP's preset must name the model's family.
  const fs::path preset = dir_ / "preset.json";
  std::ofstream(preset) << R"({"train_micro_batch_size_per_gpu": 2,
    "expert_parallel": {"enabled": false, "preset_model": "qwen3_moe"}})";
  EXPECT_NE(run(flags + " --deepspeed " + preset.string() + " --output_dir " +
                    (dir_ / "bad2").string()),
            0);
  EXPECT_NE(log_.find("preset_model is 'qwen3_moe' but the model is family 'mixtral'"),
            std::string::npos)
      << log_;
}
#endif

#if defined(DS_LAUNCHER_EXE)
// Pipeline parallelism on 2 ranks (pp = 2, two micro-batches per step through 1F1B): the partition
// and every rank's coordinates at start-up, the same losses, gradient norms and eval losses as one
// process, and one HF export holding both stages' weights (the tied wte once).
// --device sim (the device emulator: GPU-like memory on the CPU's kernels) runs what a GPU run
// does - the model moved after the HF/tp/pp build, collectives through host memory, ZeRO-3's
// device buffers around host shards, checkpoints and the export from host copies - and gives the
// host's metrics under ZeRO-3 with a pipeline and with tensor parallelism on 2 ranks.
TEST_F(DsTrain, DeviceRunsPipelineAndTensorParallelZero3AsTheHost) {
  const std::string launcher = std::string(DS_LAUNCHER_EXE) + " --num_procs 2";
  const std::string flags =
      " --max_steps 2 --eval_steps 2 --sample_tokens 0 --deepspeed '{\"train_batch_size\": "
      "\"auto\", \"train_micro_batch_size_per_gpu\": \"auto\", "
      "\"gradient_accumulation_steps\": \"auto\", \"zero_optimization\": {\"stage\": 3, "
      "\"stage3_param_persistence_threshold\": 0}}'";
  for (const std::string layout : {"--pipeline_parallel_size 2", "--tensor_parallel_size 2"}) {
    SCOPED_TRACE(layout);
    const fs::path host = dir_ / ("host_" + layout.substr(2, 4)),
                   dev = dir_ / ("sim_" + layout.substr(2, 4));
    ASSERT_EQ(run(flags + " " + layout + " --output_dir " + host.string(), true, launcher), 0)
        << log_;
    ASSERT_EQ(run(flags + " " + layout + " --device sim --output_dir " + dev.string(), true,
                  launcher),
              0)
        << log_;
    EXPECT_NE(log_.find("device: sim:0"), std::string::npos) << log_;
    expect_same_metrics(host, dev,
                        {"Train_Samples_train_loss", "Train_Samples_grad_norm",
                         "Eval_Samples_eval_loss"});
    // The pipeline's export is bitwise the host's; with tensor parallelism the vocabulary-parallel
    // loss runs the Backend's default kernels on a device (fp32, where the CPU's accumulate in
    // double), so only the metrics' tolerance holds there.
    const fs::path exported = dev / "hf_model" / "model.safetensors";
    EXPECT_EQ(fs::file_size(exported), fs::file_size(host / "hf_model" / "model.safetensors"));
    if (layout.find("pipeline") != std::string::npos)
      EXPECT_TRUE(read(exported) == read(host / "hf_model" / "model.safetensors"));
  }
}

TEST_F(DsTrain, PipelineTrainsAsOneProcess) {
  const std::string launcher = std::string(DS_LAUNCHER_EXE) + " --num_procs 2";
  const fs::path one = dir_ / "one", two = dir_ / "two";
  const std::string flags =
      " --max_steps 4 --eval_steps 2 --sample_tokens 0 --gradient_accumulation_steps 2";
  ASSERT_EQ(run(flags + " --output_dir " + one.string()), 0) << log_;
  ASSERT_EQ(run(flags + " --pipeline_parallel_size 2 --output_dir " + two.string(), true, launcher),
            0)
      << log_;
  EXPECT_NE(log_.find("pipeline: 2 stages, partition \"parameters\""), std::string::npos) << log_;
  EXPECT_NE(log_.find("stage 1: layers ["), std::string::npos) << log_;
  EXPECT_NE(log_.find("rank:(pipe,data,tensor) 0:(0,0,0) 1:(1,0,0)"), std::string::npos) << log_;
  EXPECT_EQ(read(two / "latest"), "global_step4\n");
  expect_same_metrics(
      one, two, {"Train_Samples_train_loss", "Train_Samples_grad_norm", "Eval_Samples_eval_loss"});
  EXPECT_EQ(fs::file_size(two / "hf_model" / "model.safetensors"),
            fs::file_size(one / "hf_model" / "model.safetensors"));

  // The pipeline's checkpoint resumes in one process (the whole model from both stages' parts)
  // and under the pipeline again; both then train on to step 6 with the same losses.
  for (const auto& [sub, l] : {std::pair{"resumed_one", std::string()},
                               std::pair{"resumed_pp", launcher}}) {
    const fs::path r = dir_ / sub;
    fs::create_directories(r);
    fs::copy(two / "global_step4", r / "global_step4", fs::copy_options::recursive);
    std::ofstream(r / "latest") << "global_step4\n";
    ASSERT_EQ(run(" --max_steps 6 --eval_steps 2 --sample_tokens 0 --gradient_accumulation_steps 2"
                  " --resume_from_checkpoint latest --output_dir " + r.string() +
                      (l.empty() ? "" : " --pipeline_parallel_size 2"),
                  true, l),
              0)
        << log_;
  }
  {
    const auto a6 = values(dir_ / "resumed_one" / "metrics" / "Train_Samples_train_loss.csv"),
               b6 = values(dir_ / "resumed_pp" / "metrics" / "Train_Samples_train_loss.csv");
    ASSERT_EQ(a6.size(), 2u);
    ASSERT_EQ(b6.size(), 2u);
    for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(b6[i], a6[i], 1e-4 * std::abs(a6[i]));
  }

  // --init_from into the stages: each loads its part of the one-process run's export; the first
  // step's loss is then the same as a one-process run from that export.
  const fs::path a = dir_ / "from_one", b = dir_ / "from_two";
  const std::string init = " --init_from " + (one / "hf_model").string() + " --max_steps 1";
  ASSERT_EQ(run(flags + init + " --output_dir " + a.string()), 0) << log_;
  ASSERT_EQ(run(flags + init + " --pipeline_parallel_size 2 --output_dir " + b.string(), true,
                launcher),
            0)
      << log_;
  const auto la = values(a / "metrics" / "Train_Samples_train_loss.csv"),
             lb = values(b / "metrics" / "Train_Samples_train_loss.csv");
  ASSERT_EQ(la.size(), 1u);
  ASSERT_EQ(lb.size(), 1u);
  EXPECT_NEAR(lb[0], la[0], 1e-5 * std::abs(la[0]));
  // The same into pipeline stages cut by tensor parallelism (pp 2 x tp 2): each rank slices its
  // stage's layers.
  const fs::path c = dir_ / "from_four";
  ASSERT_EQ(run(flags + init + " --pipeline_parallel_size 2 --tensor_parallel_size 2 --output_dir " +
                    c.string(),
                true, std::string(DS_LAUNCHER_EXE) + " --num_procs 4"),
            0)
      << log_;
  const auto lc = values(c / "metrics" / "Train_Samples_train_loss.csv");
  ASSERT_EQ(lc.size(), 1u);
  EXPECT_NEAR(lc[0], la[0], 1e-5 * std::abs(la[0]));

  // The flag and the config's pipeline.stages must agree.
  const fs::path cfg2 = dir_ / "pp2.json";
  std::ofstream(cfg2) << R"({"train_micro_batch_size_per_gpu": 2, "pipeline": {"stages": 2},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})";
  EXPECT_NE(run(flags + " --pipeline_parallel_size 4 --deepspeed " + cfg2.string() +
                    " --output_dir " + (dir_ / "bad").string()),
            0);
  EXPECT_NE(log_.find("disagrees with pipeline.stages 2"), std::string::npos) << log_;
}
#endif

// LoRA (docs/finetuning.md): a PEFT adapter from --only_optimize_lora over an --init_from base, with
// the base's absolute path; optimizer state for the LoRA matrices only; exact resume; --merge_lora
// exports a plain folder; LoRA flags without --lora_dim and unmatched names are errors. With the
// launcher, the same on 2 ranks under ZeRO-3 (the adapter gathered from both ranks).
TEST_F(DsTrain, LoraAdapterResumeAndMerge) {
  const fs::path base = dir_ / "base";
  ASSERT_EQ(run("--max_steps 1 --eval_steps 0 --save_steps 0 --output_dir " + base.string()), 0)
      << log_;
  const std::string lora = " --init_from " + (base / "hf_model").string() +
                           " --lora_dim 4 --lora_alpha 8 --lora_module_name c_attn,c_fc"
                           " --only_optimize_lora --lora_dropout 0.1";
  const fs::path a = dir_ / "a";
  ASSERT_EQ(run(lora + " --max_steps 4 --save_steps 2 --eval_steps 2 --output_dir " + a.string()),
            0)
      << log_;
  EXPECT_NE(log_.find("LoRA: r 4, alpha 8 (scaling 2)"), std::string::npos) << log_;
  EXPECT_NE(log_.find("PEFT adapter"), std::string::npos) << log_;
  const json cfg = json::parse(read(a / "hf_model" / "adapter_config.json"));
  EXPECT_EQ(cfg["peft_type"], "LORA");
  EXPECT_EQ(cfg["r"], 4);
  EXPECT_EQ(cfg["fan_in_fan_out"], true);
  EXPECT_EQ(cfg["base_model_name_or_path"],
            fs::absolute(base / "hf_model").lexically_normal().string());
  ds::safetensors::Reader adapter((a / "hf_model" / "adapter_model.safetensors").string());
  EXPECT_TRUE(adapter.contains("base_model.model.transformer.h.0.attn.c_attn.lora_A.weight"));
  EXPECT_TRUE(adapter.contains("base_model.model.transformer.h.1.mlp.c_fc.lora_B.weight"));
  EXPECT_FALSE(fs::exists(a / "hf_model" / "model.safetensors"));
  // Gradients, master weights and moments exist for the LoRA matrices only.
  const json mem = json::parse(read(a / "memory.json"));
  const auto& r0 = mem["ranks"][0];
  EXPECT_LT(r0["grads_bytes"].get<int64_t>() * 5, r0["params_bytes"].get<int64_t>()) << mem.dump();
  EXPECT_EQ(r0["model_state_bytes"], mem["paper_model_state_bytes_per_rank"]["model_state_bytes"])
      << mem.dump();

  const fs::path b = dir_ / "b";
  fs::copy(a, b, fs::copy_options::recursive);
  fs::remove_all(b / "global_step4");
  std::ofstream(b / "latest") << "global_step2\n";
  ASSERT_EQ(run(lora + " --max_steps 4 --save_steps 2 --eval_steps 2 --output_dir " + b.string() +
                " --resume_from_checkpoint latest"),
            0)
      << log_;
  for (const char* f : {"Train_Samples_train_loss", "Train_Samples_grad_norm",
                        "Eval_Samples_eval_loss"})
    EXPECT_EQ(read(b / "metrics" / (std::string(f) + ".csv")),
              read(a / "metrics" / (std::string(f) + ".csv")))
        << f;

  // Merged: a plain Hugging Face folder, itself a valid --init_from.
  const fs::path c = dir_ / "c";
  ASSERT_EQ(run(lora + " --merge_lora --max_steps 2 --eval_steps 0 --output_dir " + c.string()), 0)
      << log_;
  ds::safetensors::Reader merged((c / "hf_model" / "model.safetensors").string());
  for (const auto& n : merged.names()) EXPECT_EQ(n.find("lora_"), std::string::npos) << n;
  ASSERT_EQ(run("--max_steps 1 --eval_steps 0 --output_dir " + (dir_ / "d").string() +
                " --init_from " + (c / "hf_model").string()),
            0)
      << log_;

  EXPECT_EQ(run("--only_optimize_lora --max_steps 1 --output_dir " + (dir_ / "e").string()), 1);
  EXPECT_NE(log_.find("--only_optimize_lora needs LoRA: give --lora_dim"), std::string::npos)
      << log_;
  EXPECT_EQ(run("--lora_dim 4 --lora_module_name q_proj --max_steps 1 --output_dir " +
                (dir_ / "e").string()),
            1);
  EXPECT_NE(log_.find("no Linear module name contains"), std::string::npos) << log_;
  EXPECT_NE(log_.find("h.0.attn.c_attn"), std::string::npos) << log_;
  EXPECT_EQ(run("--lora_dim 4 --lora_module_name c_attn, --max_steps 1 --output_dir " +
                (dir_ / "e").string()),
            1);
  EXPECT_NE(log_.find("stray comma"), std::string::npos) << log_;

#ifdef DS_LAUNCHER_EXE
  const fs::path z = dir_ / "z3";
  ASSERT_EQ(run(lora + " --max_steps 2 --eval_steps 0 --output_dir " + z.string() +
                    " --deepspeed '{\"train_batch_size\": \"auto\", "
                    "\"train_micro_batch_size_per_gpu\": \"auto\", \"gradient_accumulation_steps\":"
                    " \"auto\", \"zero_optimization\": {\"stage\": 3, "
                    "\"stage3_param_persistence_threshold\": 0}}'",
                true, std::string(DS_LAUNCHER_EXE) + " --num_procs 2"),
            0)
      << log_;
  ds::safetensors::Reader z_adapter((z / "hf_model" / "adapter_model.safetensors").string());
  EXPECT_EQ(z_adapter.names().size(), adapter.names().size());
  const ds::Tensor b0 = z_adapter.get("base_model.model.transformer.h.0.attn.c_attn.lora_B.weight");
  double sq = 0;
  for (int64_t i = 0; i < b0.numel(); ++i) sq += b0.data<float>()[i] * b0.data<float>()[i];
  EXPECT_GT(sq, 0.0) << "B was not gathered (or did not train) under ZeRO-3";
#endif
}

TEST_F(DsTrain, ErrorsExitWithOne) {
  EXPECT_EQ(run("--train_data " + (dir_ / "nothing").string(), /*common=*/false), 1);
  EXPECT_NE(log_.find("ds_prepare --tokenizer"), std::string::npos) << log_;

  // An explicit config value that contradicts a flag the user typed.
  EXPECT_EQ(run("--max_steps 2 --output_dir " + (dir_ / "x").string() +
                " --deepspeed '{\"train_batch_size\": 4, \"optimizer\": {\"type\": \"AdamW\", "
                "\"params\": {\"lr\": 0.001}}}'"),
            1);
  EXPECT_NE(log_.find("contradicts the trainer's arguments"), std::string::npos) << log_;
  EXPECT_NE(log_.find("optimizer.params.lr=0.001 vs trainer learning_rate=0.01"), std::string::npos)
      << log_;

  EXPECT_EQ(run("--max_steps 2 --resume_from_checkpoint latest --output_dir " +
                (dir_ / "empty").string()),
            1);
  EXPECT_NE(log_.find("holds no checkpoint"), std::string::npos) << log_;

  EXPECT_EQ(run("--max_steps 2 --block_size 64 --output_dir " + (dir_ / "y").string()), 1);
  EXPECT_NE(log_.find("exceeds the model's block_size 16"), std::string::npos) << log_;
}

// Issue 12: a bad flag or input file is refused before the first step, not after the whole run.
TEST_F(DsTrain, BadFlagsAndInputsFailBeforeTraining) {
  const std::string out = " --max_steps 2 --output_dir " + (dir_ / "x").string();
  EXPECT_EQ(run(out + " --sample_top_k -3"), 2);
  EXPECT_NE(log_.find("--sample_top_k: '-3' is out of range: allowed is an integer in [1, "),
            std::string::npos)
      << log_;
  EXPECT_EQ(run(out + " --max_steps 99999999999999999999"), 2);
  EXPECT_NE(log_.find("--max_steps: '99999999999999999999' is out of range"), std::string::npos)
      << log_;
  for (const char* bad : {"--block_size 0", "--threads -1", "--logging_steps 0", "--save_steps -5",
                          "--save_total_limit -1", "--seed -1", "--sample_tokens -2",
                          "--learning_rate abc", "--adam_beta2 1.5", "--eval_steps -3"}) {
    EXPECT_EQ(run(out + " " + bad), 2) << bad << "\n" << log_;
    EXPECT_NE(log_.find("allowed is"), std::string::npos) << bad << "\n" << log_;
    EXPECT_EQ(log_.find("e+308"), std::string::npos) << log_;  // no DBL_MAX spelled out
  }

  // A damaged tokenizer (used only for the sample at the end) fails at start-up.
  fs::create_directories(dir_ / "tok");
  std::ofstream(dir_ / "tok" / "encoder.json") << "{not json";
  std::ofstream(dir_ / "tok" / "vocab.bpe") << "#version: 0.2\n";
  EXPECT_EQ(run(out + " --sample_tokens 4 --tokenizer " + (dir_ / "tok").string()), 1);
  EXPECT_NE(log_.find("encoder.json"), std::string::npos) << log_;
  EXPECT_EQ(log_.find("step 1/"), std::string::npos) << "trained before failing:\n" << log_;
  EXPECT_EQ(run(out + " --sample_tokens 4 --tokenizer " + (dir_ / "no_tok").string()), 1);
  EXPECT_NE(log_.find("no encoder.json there"), std::string::npos) << log_;
  EXPECT_EQ(log_.find("step 1/"), std::string::npos) << log_;

  // WORLD_SIZE > 1 without mpirun: the message, exit 1, no abort.
  EXPECT_EQ(run(out, true, "WORLD_SIZE=2"), 1);
  EXPECT_NE(log_.find("WORLD_SIZE=2 but this process was not started by mpirun"), std::string::npos)
      << log_;
  EXPECT_EQ(log_.find("terminate called"), std::string::npos) << log_;
}

TEST_F(DsTrain, RunWhoseEveryStepIsSkippedFails) {
  // A static fp16 scale this large overflows every step: nothing is trained, so nothing is
  // reported as done.
  const fs::path a = dir_ / "a";
  EXPECT_EQ(run("--max_steps 3 --eval_steps 0 --output_dir " + a.string() +
                " --deepspeed '{\"train_batch_size\": 4, \"fp16\": {\"enabled\": true, "
                "\"loss_scale\": 1e38}}'"),
            1)
      << log_;
  EXPECT_NE(log_.find("every one of the 3 steps of this run was skipped"), std::string::npos)
      << log_;
  EXPECT_FALSE(fs::exists(a / "hf_model"));
}

TEST_F(DsTrain, StaleTemporariesAreRemovedAtStart) {
  const fs::path a = dir_ / "a";
  fs::create_directories(a / ".global_step8.tmp");
  std::ofstream(a / ".global_step8.tmp" / "mp_rank_00_model_states.safetensors") << "half";
  fs::create_directories(a / ".global_step4.deleting");
  std::ofstream(a / "latest.tmp-999999") << "global_step8\n";
  std::ofstream(a / "loss.svg.tmp.999999") << "<svg";
  std::ofstream(a / "memory.json.tmp") << "{";
  std::ofstream(a / "notes.txt") << "the user's own file";
  ASSERT_EQ(
      run("--max_steps 2 --eval_steps 0 --threads 64 --export_hf none --output_dir " + a.string()),
      0)
      << log_;
  EXPECT_NE(log_.find("removed 5 temporaries left by an interrupted earlier run"),
            std::string::npos)
      << log_;
  for (const char* gone : {".global_step8.tmp", ".global_step4.deleting", "latest.tmp-999999",
                           "loss.svg.tmp.999999", "memory.json.tmp"})
    EXPECT_FALSE(fs::exists(a / gone)) << gone;
  EXPECT_TRUE(fs::exists(a / "notes.txt"));
  EXPECT_TRUE(fs::exists(a / "global_step2"));
  // --threads above the core count is said, not silently oversubscribed.
  EXPECT_NE(log_.find("--threads 64 is more than the"), std::string::npos) << log_;
}

TEST_F(DsTrain, RunThatCannotFitStopsBeforeAllocating) {
  // GPT-3's shape: ~2.8 TB of fp32 model states. Refused at start-up, before the model is built,
  // with the shortfall and what would fit; no machine this runs on has that much memory.
  std::ofstream(dir_ / "huge.json")
      << R"({"preset": "test-gpt2", "n_layer": 96, "n_embd": 12288, "n_head": 96, "block_size": 16})";
  EXPECT_EQ(run("--max_steps 1 --output_dir " + (dir_ / "x").string() + " --model " +
                (dir_ / "huge.json").string()),
            1);
  EXPECT_NE(log_.find("this run does not fit in memory"), std::string::npos) << log_;
  EXPECT_NE(log_.find("model states"), std::string::npos) << log_;
  EXPECT_EQ(log_.find("GEMM:"), std::string::npos) << "stopped after start-up:\n" << log_;
}

TEST_F(DsTrain, SuggestsNvmeOffloadWhenRamIsShortThenTrainsWithIt) {
  // ~3.3M parameters: ~53 MB of fp32 model states. DS_MEMORY_LIMIT pretends the machine has 60 MB.
  std::ofstream(dir_ / "big.json")
      << R"({"preset": "test-gpt2", "n_layer": 4, "n_embd": 256, "n_head": 4, "block_size": 16})";
  const std::string limited = "env DS_MEMORY_LIMIT=60M";
  const std::string common =
      " --max_steps 2 --eval_steps 0 --export_hf none --model " + (dir_ / "big.json").string();
  EXPECT_EQ(run("--output_dir " + (dir_ / "x").string() + common, true, limited), 1) << log_;
  EXPECT_NE(log_.find("this run does not fit in memory"), std::string::npos) << log_;
  EXPECT_NE(log_.find("enable offload_optimizer.device=nvme with sub_group_size"),
            std::string::npos)
      << log_;
  // The suggestion, applied: fits, trains, swaps, cleans up.
  const fs::path nvme = dir_ / "nvme";
  fs::create_directories(nvme);
  const std::string cfg = fmt::format(
      R"('{{"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
      "gradient_accumulation_steps": "auto", "zero_optimization": {{"stage": 2,
      "sub_group_size": 100000, "offload_optimizer": {{"device": "nvme", "nvme_path": "{}"}}}}}}')",
      nvme.string());
  ASSERT_EQ(
      run("--output_dir " + (dir_ / "y").string() + common + " --deepspeed " + cfg, true, limited),
      0)
      << log_;
  EXPECT_NE(log_.find("[offload] optimizer state (exp_avg, exp_avg_sq) on NVMe"), std::string::npos)
      << log_;
  EXPECT_NE(log_.find("on NVMe  "), std::string::npos) << log_;
  EXPECT_TRUE(fs::is_empty(nvme / "ds_swap")) << "swap files left after a clean exit";
}

TEST_F(DsTrain, Zero3WithEverythingOnNvmeResumesExactly) {
  const fs::path nvme = dir_ / "nvme", a = dir_ / "a", b = dir_ / "b";
  fs::create_directories(nvme);
  const std::string cfg = fmt::format(
      R"('{{"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
      "gradient_accumulation_steps": "auto", "bf16": {{"enabled": true}},
      "zero_optimization": {{"stage": 3, "sub_group_size": 5000, "stage3_param_persistence_threshold": 0,
      "offload_optimizer": {{"device": "nvme", "nvme_path": "{0}", "buffer_count": 4}},
      "offload_param": {{"device": "nvme", "nvme_path": "{0}", "buffer_size": 2000, "max_in_cpu": 0}}}}}}')",
      nvme.string());
  // Straight through 4 steps, and 2 + 2 from the checkpoint: every metric row identical.
  const std::string flags =
      "--max_steps 4 --eval_steps 0 --save_steps 2 --export_hf none --deepspeed " + cfg;
  ASSERT_EQ(run(flags + " --output_dir " + a.string()), 0) << log_;
  EXPECT_NE(log_.find("[offload] parameters (bf16) on NVMe"), std::string::npos) << log_;
  fs::copy(a, b, fs::copy_options::recursive);
  fs::remove_all(b / "global_step4");
  std::ofstream(b / "latest") << "global_step2\n";
  ASSERT_EQ(run(flags + " --output_dir " + b.string() + " --resume_from_checkpoint latest"), 0)
      << log_;
  EXPECT_NE(log_.find("resumed from"), std::string::npos) << log_;
  for (const char* f : {"Train_Samples_train_loss", "Train_Samples_grad_norm"})
    EXPECT_EQ(read(b / "metrics" / (std::string(f) + ".csv")),
              read(a / "metrics" / (std::string(f) + ".csv")))
        << f;
  EXPECT_TRUE(fs::is_empty(nvme / "ds_swap"));
}

TEST_F(DsTrain, Zero3ExportsTheGatheredModel) {
  const fs::path a = dir_ / "a";
  ASSERT_EQ(
      run("--max_steps 2 --eval_steps 0 --output_dir " + a.string() +
          " --deepspeed '{\"train_batch_size\": \"auto\", \"train_micro_batch_size_per_gpu\": "
          "\"auto\", \"gradient_accumulation_steps\": \"auto\", \"zero_optimization\": "
          "{\"stage\": 3, \"stage3_param_persistence_threshold\": 0}}'"),
      0)
      << log_;
  ASSERT_TRUE(fs::exists(a / "hf_model" / "model.safetensors")) << log_;
  EXPECT_NE(log_.find("HF export:"), std::string::npos) << log_;
  // The export holds every weight whole, equal to the checkpoint's gathered model file.
  ds::safetensors::Reader exported((a / "hf_model" / "model.safetensors").string());
  ds::safetensors::Reader ck((a / "global_step2" / "mp_rank_00_model_states.safetensors").string());
  ASSERT_FALSE(ck.names().empty());
  for (const auto& name : ck.names()) {
    const std::string hf = "transformer." + name;
    const std::string key = exported.contains(hf) ? hf : name;
    ASSERT_TRUE(exported.contains(key)) << name;
    ds::Tensor x = exported.get(key), y = ck.get(name);
    ASSERT_EQ(x.numel(), y.numel()) << name;
  }
}

}  // namespace

// The Muon optimizer from a DeepSpeed config, under ZeRO-2: it trains, and the start-up budget
// counts one state float per Muon element (less than AdamW's two per element).
TEST_F(DsTrain, MuonOptimizerTrains) {
  const std::string cfg =
      " --deepspeed '{\"train_batch_size\": \"auto\", \"train_micro_batch_size_per_gpu\": "
      "\"auto\", \"gradient_accumulation_steps\": \"auto\", \"zero_optimization\": {\"stage\": 2}, "
      "\"optimizer\": {\"type\": \"Muon\", \"params\": {\"lr\": \"auto\", \"adam_lr\": 0.003}}}'";
  ASSERT_EQ(run("--max_steps 6 --eval_steps 0 --output_dir " + (dir_ / "muon").string() + cfg), 0)
      << log_;
  EXPECT_NE(log_.find("[muon] 8 matrices"), std::string::npos) << log_;
  EXPECT_NE(log_.find("step with Muon"), std::string::npos) << log_;
}

// muP from ds_train: MuAdamW with --mup_base_shapes (a base model at half the width, as JSON).
TEST_F(DsTrain, MuAdamWWithBaseShapes) {
  auto c = ds::models::GPTConfig::preset("test-gpt2");
  c.n_embd /= 2;
  ds::models::GPT half(c);
  json base = json::object();
  for (const auto& [name, p] : half.named_parameters()) base[name] = p.shape();
  std::ofstream(dir_ / "base.json") << base.dump();
  const std::string cfg =
      " --deepspeed '{\"train_batch_size\": \"auto\", \"train_micro_batch_size_per_gpu\": "
      "\"auto\", \"gradient_accumulation_steps\": \"auto\", "
      "\"optimizer\": {\"type\": \"MuAdamW\", \"params\": {\"lr\": \"auto\"}}}'";
  ASSERT_EQ(run("--max_steps 4 --eval_steps 0 --output_dir " + (dir_ / "mup").string() + cfg +
                " --mup_base_shapes " + (dir_ / "base.json").string()),
            0)
      << log_;
  EXPECT_EQ(log_.find("no base shapes"), std::string::npos) << log_;
  // Names that are not the model's are an error.
  std::ofstream(dir_ / "bad.json") << R"({"nothing.weight": [4, 4]})";
  EXPECT_EQ(run("--max_steps 1 --output_dir " + (dir_ / "bad").string() + cfg +
                " --mup_base_shapes " + (dir_ / "bad.json").string()),
            1);
  EXPECT_NE(log_.find("[mup] the base shapes must name exactly"), std::string::npos) << log_;
}

// The library's trainer called directly, in one process (tests/test_ds_train.cpp runs the
// program): train::plan_run's decisions and errors, a resumed Trainer reproducing an uninterrupted
// one bit for bit (losses, evaluations, weights), rotation keeping the newest checkpoints, and
// the observer seeing every step, evaluation and checkpoint.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/backend/backend.h"
#include "ds/core/error.h"
#include "ds/data/shard.h"
#include "ds/train/plan.h"
#include "ds/train/train_util.h"
#include "ds/train/trainer.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace ds;

namespace {

// What a run reported, in order.
struct Recorder : train::TrainerObserver {
  std::vector<train::StepReport> steps;
  std::vector<train::EvalReport> evals;
  std::vector<train::SaveReport> saves;
  std::vector<std::string> messages;
  void message(const std::string& s) override { messages.push_back(s); }
  void on_step(const train::StepReport& r) override { steps.push_back(r); }
  void on_eval(const train::EvalReport& r) override { evals.push_back(r); }
  void on_save(const train::SaveReport& r) override { saves.push_back(r); }
  bool said(const std::string& part) const {
    for (const auto& m : messages)
      if (m.find(part) != std::string::npos) return true;
    return false;
  }
};

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("trainer_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "data");
    // The corpus of test_ds_train: a few repeated phrases over 64 ids with noise.
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
    data::write_shard(dir_ / "data" / "train.bin", train, 64);
    data::write_shard(dir_ / "data" / "val.bin", val, 64);
    const json meta = {{"splits",
                        {{"train", {{"files", {"train.bin"}}, {"tokens", train.size()}}},
                         {"val", {{"files", {"val.bin"}}, {"tokens", val.size()}}}}}};
    std::ofstream(dir_ / "data" / "meta.json") << meta.dump();
    // Dropout on: a resume must position the masks where the uninterrupted run drew them.
    std::ofstream(dir_ / "model.json") << R"({"preset": "test-gpt2", "dropout": 0.1})";
    std::ifstream cfg(fs::path(DS_SOURCE_DIR) / "configs" / "ds_demo.json");
    builtin_ = {std::istreambuf_iterator<char>(cfg), {}};
  }
  void TearDown() override { fs::remove_all(dir_); }

  // ds_train's test flags (tests/test_ds_train.cpp), given explicitly, plus max_steps.
  void spec(train::Options& o, train::Given& g, int64_t max_steps, const fs::path& out) const {
    o.train_data = (dir_ / "data").string();
    o.model = (dir_ / "model.json").string();
    o.output_dir = out.string();
    o.block_size = 16;
    o.per_device_train_batch_size = 2;
    o.gradient_accumulation_steps = 2;
    o.learning_rate = 0.01;
    o.warmup_steps = 2;
    o.eval_batches = 2;
    o.sample_tokens = 0;
    o.max_steps = max_steps;
    o.export_hf = "none";
    g.model = g.per_device_train_batch_size = g.gradient_accumulation_steps = g.learning_rate =
        g.warmup_steps = g.max_steps = true;
  }
  train::RunPlan plan(int64_t max_steps, const fs::path& out,
                      const std::function<void(train::Options&)>& edit = {}) const {
    train::Options o;
    train::Given g;
    spec(o, g, max_steps, out);
    if (edit) edit(o);
    return train::plan_run(o, g, builtin_.c_str());
  }
  static std::vector<std::vector<float>> weights(train::Trainer& t) {
    std::vector<std::vector<float>> w;
    for (const auto& p : t.model().parameters()) w.push_back(p.to_vector());
    return w;
  }

  fs::path dir_;
  std::string builtin_;
};

}  // namespace

TEST_F(TrainerTest, PlanResolvesDataModelConfigAndSizesOnce) {
  const train::RunPlan p = plan(6, dir_ / "out");
  EXPECT_EQ(p.seq_len, 16);
  EXPECT_EQ(p.samples, 249u);  // 4000 tokens in windows of 17
  EXPECT_EQ(p.micro_batch(), 2);
  EXPECT_EQ(p.grad_accum(), 2);
  EXPECT_EQ(p.global_batch(), 4);
  EXPECT_EQ(p.total_steps(), 6);
  EXPECT_EQ(p.run.total_why, "--max_steps");
  EXPECT_EQ(p.run.steps_per_epoch, 62);
  EXPECT_EQ(p.world_size, 1);
  EXPECT_EQ(p.data_parallel, 1);
  EXPECT_EQ(p.tensor_parallel(), 1);
  EXPECT_EQ(p.pipeline_parallel(), 1);
  EXPECT_EQ(p.config().tensor_parallel.size, 1);
  EXPECT_EQ(p.config().pipeline.stages, 0);  // "auto": from the job
  EXPECT_NEAR(p.config().optimizer.lr, 0.01, 0);
  EXPECT_TRUE(p.val);
  EXPECT_EQ(p.model_name, "model");
  EXPECT_EQ(p.model.n_embd, models::GPTConfig::preset("test-gpt2").n_embd);
  EXPECT_GT(p.activation_bytes, 0);
  EXPECT_FALSE(p.lora);

  // Without --max_steps the length is epochs x steps per epoch.
  train::Options o;
  train::Given g;
  spec(o, g, -1, dir_ / "out");
  g.max_steps = false;
  o.num_train_epochs = 0.5;
  g.num_train_epochs = true;
  const train::RunPlan e = train::plan_run(o, g, builtin_.c_str());
  EXPECT_EQ(e.total_steps(), 31);
  EXPECT_EQ(e.run.total_why, "0.5 epochs x 62 steps");
}

TEST_F(TrainerTest, PlanErrorsSayWhatToChange) {
  auto message = [&](const std::function<void(train::Options&)>& edit) -> std::string {
    try {
      plan(6, dir_ / "out", edit);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message([&](train::Options& o) {
              o.train_data = (dir_ / "nothing").string();
            }).find("no prepared corpus there"),
            std::string::npos);
  EXPECT_NE(message([](train::Options& o) { o.block_size = 4096; }).find("exceeds the model"),
            std::string::npos);
  // --device: a name that is no device, a GPU other than cuda:0, and (without a GPU) cuda itself.
  EXPECT_NE(message([](train::Options& o) { o.device = "tpu"; }).find("'tpu' is not a device"),
            std::string::npos);
  EXPECT_NE(message([](train::Options& o) { o.device = "cuda:1"; }).find("CUDA_VISIBLE_DEVICES"),
            std::string::npos);
  // --device_memory_limit caps GPU memory: on the CPU it is refused, not ignored.
  EXPECT_NE(message([](train::Options& o) { o.device_memory_limit_gib = 24; })
                .find("--device_memory_limit 24 caps GPU memory: it needs --device cuda"),
            std::string::npos);
  if (backend::cuda_device_count() == 0) {
    const std::string gpu = message([](train::Options& o) { o.device = "cuda"; });
    EXPECT_TRUE(gpu.find("-DDS_WITH_CUDA=ON") != std::string::npos ||
                gpu.find("no CUDA device is visible") != std::string::npos)
        << gpu;
  }
  // A malformed tokenizer.json in --init_from fails at start-up, not after the run ("no tokenizer
  // exported"); the weights need not be read for that.
  const fs::path init = dir_ / "init";
  fs::create_directories(init);
  std::ofstream(init / "config.json") << R"({"model_type": "gpt2"})";
  std::ofstream(init / "tokenizer.json") << R"({"model": {"type": "BPE", "vocab": )";
  const std::string tok = message([&](train::Options& o) {
    o.init_from = init.string();
    o.export_hf = "";
  });
  EXPECT_NE(tok.find("its tokenizer cannot be read"), std::string::npos) << tok;
  EXPECT_NE(tok.find("--export_hf none"), std::string::npos) << tok;
  // So does one in a --tokenizer folder (the export's other source; no sample asks for it), and
  // GPT-2's OpenAI file names count as tokenizer files too.
  for (const char* file : {"tokenizer.json", "encoder.json"}) {
    const fs::path t = dir_ / (std::string("tok_") + file);
    fs::create_directories(t);
    std::ofstream(t / file) << R"({"model": )";
    std::ofstream(t / "vocab.bpe") << "#version: 0.2\n";
    const std::string msg = message([&](train::Options& o) {
      o.tokenizer = t.string();
      o.sample_tokens = 0;
      o.export_hf = "";
    });
    EXPECT_NE(msg.find("--tokenizer " + t.string() + ": its tokenizer cannot be read"),
              std::string::npos)
        << file << ": " << msg;
    EXPECT_NE(msg.find(file), std::string::npos) << msg;
  }
  // tp x pp must divide the ranks of the job (one here).
  EXPECT_NE(message([](train::Options& o) {
              o.tensor_parallel_size = 2;
            }).find("does not divide the 1 ranks"),
            std::string::npos);
}

TEST_F(TrainerTest, ResumedRunReproducesTheUninterruptedOne) {
  // Uninterrupted: 6 steps, a checkpoint and an evaluation every 3.
  Recorder a;
  std::vector<std::vector<float>> wa;
  {
    train::Trainer t(plan(6, dir_ / "a",
                          [](train::Options& o) {
                            o.save_steps = 3;
                            o.eval_steps = 3;
                          }),
                     a);
    EXPECT_FALSE(t.resume());
    EXPECT_EQ(t.fit(), 6);
    wa = weights(t);
  }
  ASSERT_EQ(a.steps.size(), 6u);
  ASSERT_EQ(a.evals.size(), 2u);  // steps 3 and 6
  ASSERT_EQ(a.saves.size(), 2u);
  EXPECT_EQ(a.saves[0].step, 3);
  EXPECT_EQ(train::latest_tag(dir_ / "a"), "global_step6");

  // Interrupted after step 3 (its checkpoint), then resumed from "latest" to step 6.
  Recorder b1, b2;
  {
    train::Trainer t(plan(6, dir_ / "b",
                          [](train::Options& o) {
                            o.save_steps = 3;
                            o.eval_steps = 3;
                          }),
                     b1);
    for (int i = 0; i < 3; ++i) t.step();
    t.save();
  }
  std::vector<std::vector<float>> wb;
  {
    train::Trainer t(plan(6, dir_ / "b",
                          [](train::Options& o) {
                            o.save_steps = 3;
                            o.eval_steps = 3;
                            o.resume_from_checkpoint = "latest";
                          }),
                     b2);
    const auto r = t.resume();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->step, 3);
    EXPECT_EQ(r->samples, 12);
    EXPECT_EQ(r->tag, "global_step3");
    EXPECT_TRUE(t.resumed());
    EXPECT_EQ(t.fit(), 3);
    wb = weights(t);
  }
  ASSERT_EQ(b1.steps.size() + b2.steps.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    const auto& s = i < 3 ? b1.steps[i] : b2.steps[i - 3];
    EXPECT_EQ(s.step, a.steps[i].step);
    EXPECT_EQ(s.loss, a.steps[i].loss) << "step " << s.step;  // bitwise
    EXPECT_EQ(s.lr, a.steps[i].lr);
    EXPECT_EQ(s.grad_norm, a.steps[i].grad_norm);
  }
  ASSERT_EQ(b2.evals.size(), 1u);
  EXPECT_EQ(b2.evals[0].loss, a.evals[1].loss);
  EXPECT_EQ(wb, wa);
  // The step-3 checkpoint of the resumed run exists already: only step 6 is written.
  ASSERT_EQ(b2.saves.size(), 1u);
  EXPECT_EQ(b2.saves[0].step, 6);
}

// ds_train --device cuda through the library: the run follows the CPU run's losses, resumes bit
// for bit on the GPU, and exports (weights read back to the host). Skipped without a GPU.
TEST_F(TrainerTest, OnGpuFollowsTheCpuRunResumesAndExports) {
  if (backend::cuda_device_count() == 0) GTEST_SKIP() << "no GPU in this build or on this machine";
  auto edit = [](const std::string& device, const std::string& resume) {
    return [=](train::Options& o) {
      o.save_steps = 3;
      o.eval_steps = 3;
      o.device = device;
      o.resume_from_checkpoint = resume;
    };
  };
  Recorder cpu, gpu, b1, b2;
  {
    train::Trainer t(plan(6, dir_ / "cpu", edit("cpu", "")), cpu);
    EXPECT_EQ(t.fit(), 6);
  }
  {
    train::Trainer t(plan(6, dir_ / "gpu", edit("cuda", "")), gpu);
    EXPECT_EQ(t.fit(), 6);
    EXPECT_TRUE(gpu.said("device: cuda:0"));
    t.export_model((dir_ / "gpu_hf").string());
  }
  EXPECT_TRUE(fs::exists(dir_ / "gpu_hf" / "model.safetensors"));
  ASSERT_EQ(gpu.steps.size(), 6u);
  for (size_t i = 0; i < 6; ++i)  // dropout masks are the same; sums differ in order only
    EXPECT_NEAR(gpu.steps[i].loss, cpu.steps[i].loss, 1e-4 * std::abs(cpu.steps[i].loss)) << i;
  {
    train::Trainer t(plan(6, dir_ / "b", edit("cuda", "")), b1);
    for (int i = 0; i < 3; ++i) t.step();
    t.save();
  }
  {
    train::Trainer t(plan(6, dir_ / "b", edit("cuda", "latest")), b2);
    ASSERT_TRUE(t.resume());
    EXPECT_EQ(t.fit(), 3);
  }
  ASSERT_EQ(b1.steps.size() + b2.steps.size(), 6u);
  for (size_t i = 0; i < 6; ++i)
    EXPECT_EQ((i < 3 ? b1.steps[i] : b2.steps[i - 3]).loss, gpu.steps[i].loss) << i;  // bitwise
}

TEST_F(TrainerTest, ResumeErrorsNameTheFolder) {
  Recorder r;
  train::Trainer t(plan(2, dir_ / "empty"), r);
  try {
    t.resume_from("latest");
    FAIL() << "resumed from nothing";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds no checkpoint"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(t.resumed());
}

TEST_F(TrainerTest, RotationKeepsTheNewestCheckpoints) {
  Recorder r;
  {
    train::Trainer t(plan(5, dir_ / "out",
                          [](train::Options& o) {
                            o.save_steps = 1;
                            o.save_total_limit = 2;
                            o.eval_steps = 0;
                          }),
                     r);
    t.fit();
  }
  ASSERT_EQ(r.saves.size(), 5u);
  EXPECT_TRUE(r.saves[0].deleted.empty());
  EXPECT_TRUE(r.saves[1].deleted.empty());
  ASSERT_EQ(r.saves[2].deleted.size(), 1u);
  EXPECT_EQ(r.saves[2].deleted[0].filename(), "global_step1");
  const auto left = train::checkpoint_folders(dir_ / "out");
  ASSERT_EQ(left.size(), 2u);
  EXPECT_EQ(left[0].filename(), "global_step4");
  EXPECT_EQ(left[1].filename(), "global_step5");
  EXPECT_EQ(train::latest_tag(dir_ / "out"), "global_step5");
  // eval_steps 0: evaluated at the end only.
  EXPECT_EQ(r.evals.size(), 1u);

  // A new run in the same folder without resume notes the earlier checkpoints.
  Recorder again;
  train::Trainer t(plan(1, dir_ / "out"), again);
  EXPECT_FALSE(t.resume());
  EXPECT_TRUE(again.said(
      "holds checkpoints of an earlier run (global_step4, global_step5; latest: global_step5)"));
}

// The way DeepSpeed users lose runs: `latest` is gone (a crash, a cleanup), resume says "no
// checkpoint", the user starts afresh with save_total_limit, and rotation deletes the old run.
TEST_F(TrainerTest, AnEarlierRunsCheckpointsAreNamedAndNeverRotatedAway) {
  {
    Recorder r;
    train::Trainer t(plan(3, dir_ / "out", [](train::Options& o) {
      o.save_steps = 1;
      o.eval_steps = 0;
    }), r);
    t.fit();
  }
  fs::remove(dir_ / "out" / "latest");
  {
    Recorder r;
    train::Trainer t(plan(3, dir_ / "out"), r);
    try {
      t.resume_from("latest");
      FAIL() << "resumed without a latest file";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("global_step1, global_step2, global_step3"), std::string::npos) << m;
      EXPECT_NE(m.find("--resume_from_checkpoint " + (dir_ / "out" / "global_step3").string()),
                std::string::npos)
          << m;
    }
    // Resuming from the folder it names works.
    EXPECT_TRUE(t.resume_from((dir_ / "out" / "global_step3").string()));
  }
  // A fresh run with save_total_limit 1 keeps the earlier run's three folders.
  Recorder r;
  train::Trainer t(plan(2, dir_ / "out", [](train::Options& o) {
    o.save_steps = 1;
    o.save_total_limit = 1;
    o.eval_steps = 0;
    o.seed = 7;
  }), r);
  EXPECT_FALSE(t.resume());
  EXPECT_TRUE(r.said("rotates only this run's checkpoints and keeps the earlier ones"));
  t.fit();
  for (const auto& s : r.saves)
    for (const auto& d : s.deleted) EXPECT_NE(d.filename(), "global_step3") << "deleted the old run";
  // Steps 1 and 2 of this run replaced the old run's folders of those steps (the start-up note
  // says so); rotation then deleted this run's step 1 and kept the old run's step 3.
  const auto left = train::checkpoint_folders(dir_ / "out");
  ASSERT_EQ(left.size(), 2u);
  EXPECT_EQ(left[0].filename(), "global_step2");
  EXPECT_EQ(left[1].filename(), "global_step3");
  EXPECT_EQ(train::latest_tag(dir_ / "out"), "global_step2");
}

// The training engine: precision modes, the loss-scaler integration, skipping, checkpoints and
// bitwise resume.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>

#include "ds/core/checksum.h"
#include "ds/core/error.h"
#include "ds/core/rng.h"
#include "ds/core/safetensors.h"
#include "ds/data/loader.h"
#include "ds/data/shard.h"
#include "ds/models/gpt.h"
#include "ds/runtime/checkpoint_files.h"
#include "ds/runtime/engine.h"
#include "devices.h"

using namespace ds;
namespace fs = std::filesystem;

namespace {

std::string config_json(const std::string& precision, int gas = 1, double clip = 0.0,
                        const std::string& extra = "") {
  std::string p =
      precision == "fp16"
          ? R"("fp16": {"enabled": true, "initial_scale_power": 8, "loss_scale_window": 3, "hysteresis": 2},)"
      : precision == "bf16" ? R"("bf16": {"enabled": true},)"
                            : "";
  return fmt::format(R"({{
    "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": {},
    "gradient_clipping": {}, {} {}
    "optimizer": {{"type": "AdamW", "params": {{"lr": 3e-3, "weight_decay": 0.1}}}},
    "scheduler": {{"type": "WarmupDecayLR", "params": {{"warmup_max_lr": 1e-2, "warmup_num_steps": 2, "total_num_steps": 100, "warmup_type": "linear"}}}}
  }})",
                     gas, clip, p, extra);
}

std::shared_ptr<models::GPT> make_model(const std::string& preset = "test-gpt2") {
  auto cfg = models::GPTConfig::preset(preset);
  return std::make_shared<models::GPT>(cfg);
}

// A small token corpus on disk, so the data position is part of what resume must restore.
fs::path make_corpus(const fs::path& dir, int64_t vocab) {
  fs::create_directories(dir);
  std::vector<int32_t> toks(4000);
  for (size_t i = 0; i < toks.size(); ++i)
    toks[i] = static_cast<int32_t>((i * 7 + (i / 13) * 3) % static_cast<size_t>(vocab));
  data::write_shard(dir / "train.bin", toks, static_cast<uint32_t>(vocab));
  return dir / "train.bin";
}

struct TrainRun {
  std::unique_ptr<runtime::Engine> engine;
  std::unique_ptr<data::DataLoader> loader;
  std::vector<std::string> log;
};

TrainRun start(const std::string& cfg, const fs::path& corpus,
               const std::string& preset = "test-gpt2", Device device = kCPU) {
  TrainRun r;
  auto model = make_model(preset);
  if (!device.is_cpu()) model->to(device);
  runtime::InitOptions opt;
  opt.log = [&log = r.log](const std::string& s) { log.push_back(s); };
  r.engine = runtime::initialize(model, cfg, opt);
  auto ds = std::make_shared<data::TokenDataset>(std::vector<fs::path>{corpus});
  data::SamplerOptions so;
  so.micro_batch = 2;
  so.grad_accum = static_cast<int>(r.engine->config().batch.gradient_accumulation_steps);
  so.seed = 7;
  r.loader = std::make_unique<data::DataLoader>(ds, 16, so);
  return r;
}

// One micro-step; returns the loss.
float micro_step(TrainRun& r) {
  auto b = r.loader->next();
  Tensor x = Tensor::from_ints(std::vector<int64_t>(b.inputs.begin(), b.inputs.end()), {2, 16},
                               DType::i32);
  Tensor y = Tensor::from_ints(std::vector<int64_t>(b.targets.begin(), b.targets.end()), {2, 16},
                               DType::i32);
  Tensor loss = r.engine->forward(x, y);
  r.engine->backward(loss);
  r.engine->step();
  return loss.item();
}

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("ds_engine_test_{}_{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    corpus_ = make_corpus(dir_ / "data", 64);
    rng::dropout_state() = {};
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_, corpus_;
};

}  // namespace

TEST_F(EngineTest, LossFallsAndCountersAdvance) {
  TrainRun r = start(config_json("fp32", 2), corpus_);
  float first = 0, last = 0;
  for (int i = 0; i < 40; ++i) {
    float l = micro_step(r);
    if (i < 2) first += l / 2;
    if (i >= 38) last += l / 2;
  }
  EXPECT_EQ(r.engine->micro_steps(), 40);
  EXPECT_EQ(r.engine->global_steps(), 20);
  EXPECT_EQ(r.engine->global_samples(), 80);
  EXPECT_LT(last, first - 0.5f) << "loss did not fall";
}

TEST_F(EngineTest, GradientAccumulationStepsOnlyAtBoundaries) {
  TrainRun r = start(config_json("fp32", 3), corpus_);
  const float before = r.engine->module().parameters()[0].to_vector()[0];
  micro_step(r);
  micro_step(r);
  EXPECT_EQ(r.engine->global_steps(), 0);
  EXPECT_EQ(r.engine->module().parameters()[0].to_vector()[0], before);
  micro_step(r);
  EXPECT_EQ(r.engine->global_steps(), 1);
  // WarmupDecayLR's first step runs at warmup_min_lr = 0 (as DeepSpeed): weights change from the
  // third optimizer step on (linear warmup is 0 at t = 0 too).
  EXPECT_EQ(r.engine->module().parameters()[0].to_vector()[0], before);
  for (int i = 0; i < 6; ++i) micro_step(r);
  EXPECT_EQ(r.engine->global_steps(), 3);
  EXPECT_NE(r.engine->module().parameters()[0].to_vector()[0], before);
}

// train_batch(next) is the micro-batch loop: the same weights, bit for bit, as forward,
// backward and step per micro-batch, the mean micro-batch loss, and the dropout stream positioned
// at each batch's sample_base.
TEST_F(EngineTest, TrainBatchIsTheMicroBatchLoop) {
  TrainRun a = start(config_json("fp32", 3), corpus_);
  TrainRun b = start(config_json("fp32", 3), corpus_);
  std::vector<uint64_t> seen;
  for (int s = 0; s < 3; ++s) {
    float manual = 0.0f;
    for (int m = 0; m < 3; ++m) manual += micro_step(a) / 3.0f;
    const double loss = b.engine->train_batch([&] {
      auto mb = b.loader->next();
      seen.push_back(static_cast<uint64_t>(seen.size() * 2));
      return runtime::MicroBatch{
          {.input_ids = Tensor::from_ints(std::vector<int64_t>(mb.inputs.begin(), mb.inputs.end()),
                                          {2, 16}, DType::i32),
           .labels = Tensor::from_ints(std::vector<int64_t>(mb.targets.begin(), mb.targets.end()),
                                       {2, 16}, DType::i32)},
          seen.back()};
    });
    EXPECT_NEAR(loss, manual, 1e-6 * std::abs(manual));  // float vs double summation
    EXPECT_EQ(rng::dropout_state().sample_base, seen.back());
  }
  EXPECT_EQ(b.engine->global_steps(), 3);
  EXPECT_EQ(b.engine->micro_steps(), 9);
  const auto pa = a.engine->module().parameters(), pb = b.engine->module().parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_EQ(pa[i].to_vector(), pb[i].to_vector()) << i;
  // Not at a boundary: refused, naming the micro-steps already run.
  micro_step(b);
  EXPECT_THROW(b.engine->train_batch([]() -> runtime::MicroBatch { return {}; }), Error);
}

// The batch contract by role (nn::Batch): a decoder LM's loss reads input_ids and labels, and an
// input it would ignore is refused by name rather than dropped.
TEST_F(EngineTest, NamedBatchInputsAModelWouldIgnoreAreRefused) {
  TrainRun r = start(config_json("fp32", 1), corpus_);
  const Tensor ids = Tensor::from_ints(std::vector<int64_t>(32, 3), {2, 16}, DType::i32);
  const Tensor eval = r.engine->eval_loss(nn::Batch{.input_ids = ids, .labels = ids});
  EXPECT_EQ(eval.item(), r.engine->eval_loss(ids, ids).item());
  for (const char* field : {"attention_mask", "token_type_ids", "decoder_input_ids"}) {
    nn::Batch b{.input_ids = ids, .labels = ids};
    (std::string(field) == "attention_mask"   ? b.attention_mask
     : std::string(field) == "token_type_ids" ? b.token_type_ids
                                              : b.decoder_input_ids) = ids;
    try {
      r.engine->eval_loss(b);
      ADD_FAILURE() << field << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  }
}

TEST_F(EngineTest, Bf16ParamsAreTheRoundedMasterWeights) {
  TrainRun r = start(config_json("bf16"), corpus_);
  for (int i = 0; i < 3; ++i) micro_step(r);
  const auto& flat = r.engine->flat();
  ASSERT_EQ(flat.params.dtype(), DType::bf16);
  const float* master = r.engine->master_weights().data<float>();
  const uint16_t* p16 = flat.params.data<uint16_t>();
  for (int64_t i = 0; i < flat.numel; ++i)
    ASSERT_EQ(p16[i], float_to_bf16(master[i]))
        << i << " master " << master[i] << " param " << bf16_to_float(p16[i]);
  const auto mem = r.engine->memory_budget();
  EXPECT_EQ(mem.params, flat.padded_numel * 2);
  EXPECT_EQ(mem.master_weights, flat.padded_numel * 4);
  EXPECT_EQ(mem.optimizer_states, flat.padded_numel * 8);
}

TEST_F(EngineTest, Fp16OverflowSkipsTheStepAndHalvesTheScale) {
  TrainRun r = start(config_json("fp16"), corpus_);
  EXPECT_EQ(r.engine->loss_scale(), 256.0);
  // Inject an overflow into one gradient on the second step.
  Tensor w = r.engine->module().parameters()[0];
  int calls = 0;
  w.add_grad_ready_hook([&](const Tensor& p) {
    if (++calls == 2) p.grad().data<uint16_t>()[0] = 0x7c00;  // +inf in fp16
  });
  micro_step(r);
  const double lr_after_1 = r.engine->get_lr();
  const auto weights = w.to_vector();
  micro_step(r);  // overflow
  EXPECT_TRUE(r.engine->last_step_skipped());
  EXPECT_EQ(r.engine->skipped_steps(), 1);
  EXPECT_EQ(r.engine->global_steps(), 2);     // a skipped step still counts
  EXPECT_EQ(r.engine->get_lr(), lr_after_1);  // the schedule did not step
  EXPECT_EQ(w.to_vector(), weights);          // the optimizer did not step
  // hysteresis 2: the first overflow only uses up hysteresis; the scale stays.
  EXPECT_EQ(r.engine->loss_scale(), 256.0);
  calls = -100;  // no more injections... until we force one more:
  w.add_grad_ready_hook([&](const Tensor& p) { p.grad().data<uint16_t>()[0] = 0x7c00; });
  micro_step(r);
  EXPECT_EQ(r.engine->loss_scale(), 128.0);
  bool saw = false;
  for (auto& l : r.log)
    saw = saw ||
          l.find("OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 256, reducing to 128") !=
              std::string::npos;
  EXPECT_TRUE(saw) << "missing the OVERFLOW message";
}

// deepspeed.cpp's own offload_optimizer.download_in_backward only schedules a device model's
// gradient copies: turned off for a model in host memory it is said to do nothing.
TEST_F(EngineTest, DownloadInBackwardOffWarnsWhereItDoesNothing) {
  const std::string key =
      R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu",
         "download_in_backward": false}},)";
  auto has_warning = [](const TrainRun& r) {
    for (const auto& l : r.log)
      if (l.find("download_in_backward = false has no effect: the model is in host memory") !=
          std::string::npos)
        return true;
    return false;
  };
  EXPECT_TRUE(has_warning(start(config_json("fp32", 1, 0.0, key), corpus_)));
  EXPECT_FALSE(has_warning(start(config_json("fp32", 1, 0.0, key), corpus_, "test-gpt2",
                                 Device{DeviceType::sim, 0})));
}

TEST_F(EngineTest, NonFiniteGradientsSkipInFp32AndRepeatedSkipsStop) {
  TrainRun r = start(config_json("fp32", 1, 1.0), corpus_);
  Tensor w = r.engine->module().parameters()[0];
  w.add_grad_ready_hook(
      [](const Tensor& p) { p.grad().data<float>()[0] = std::numeric_limits<float>::quiet_NaN(); });
  micro_step(r);
  EXPECT_TRUE(r.engine->last_step_skipped());
  ASSERT_FALSE(r.log.empty());
  EXPECT_NE(r.log.back().find("not finite"), std::string::npos);
  try {
    for (int i = 0; i < 60; ++i) micro_step(r);
    FAIL() << "expected the run to stop";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lower the learning rate"), std::string::npos);
  }
}

TEST_F(EngineTest, ResumeIsBitwiseIdentical) {
  for (const std::string prec : {"fp32", "bf16", "fp16"}) {
    const std::string cfg = config_json(prec, 2, 1.0);
    const int k = 6;  // optimizer steps before the stop; micro-steps = 2k
    // Continuous: 2k optimizer steps.
    std::vector<float> continuous;
    {
      rng::dropout_state() = {};
      TrainRun r = start(cfg, corpus_);
      for (int i = 0; i < 4 * k; ++i) continuous.push_back(micro_step(r));
    }
    // Interrupted: k steps, save, a fresh process state, load, k steps.
    std::vector<float> resumed;
    const fs::path ck = dir_ / ("ck_" + prec);
    {
      rng::dropout_state() = {};
      TrainRun r = start(cfg, corpus_);
      for (int i = 0; i < 2 * k; ++i) resumed.push_back(micro_step(r));
      r.engine->save_checkpoint(ck.string(), "", {{"loader", r.loader->state()}});
    }
    {
      rng::dropout_state() = {};
      TrainRun r = start(cfg, corpus_);
      nlohmann::json client = r.engine->load_checkpoint(ck.string());
      r.loader->load_state(client.at("loader"));
      EXPECT_EQ(r.engine->global_steps(), k);
      for (int i = 0; i < 2 * k; ++i) resumed.push_back(micro_step(r));
    }
    ASSERT_EQ(continuous.size(), resumed.size());
    for (size_t i = 0; i < continuous.size(); ++i)
      EXPECT_EQ(continuous[i], resumed[i]) << prec << " micro-step " << i;  // bitwise
  }
}

// A model on a GPU trains through the same engine (ZeRO-Offload's layout: parameters and
// gradients on the GPU, fp32 master weights and Adam moments in host memory, the CPU optimizer):
// the losses follow the CPU engine's in every precision and stage 0-2, and resume is bitwise.
// Runs on the first non-CPU device of tests/devices.h: the sim emulator without a GPU.
TEST_F(EngineTest, OnGpuFollowsTheCpuEngineAndResumesBitwise) {
  std::vector<Device> gpus;
  for (const Device d : ds::testing::test_devices())
    if (!d.is_cpu()) gpus.push_back(d);
  if (gpus.empty()) GTEST_SKIP() << "no GPU in this build or on this machine";
  const Device gpu = gpus.front();
  // bf16g: bf16 with bf16 gradients (they go down to the host optimizer in 16 bits). Stage 2 steps
  // in sub-groups of 1000 elements: several chunks through the pipelined device step.
  for (const std::string variant : {"fp32", "bf16", "bf16g", "fp16"}) {
    const std::string prec = variant == "bf16g" ? "bf16" : variant;
    for (int stage : {0, 2}) {
      const std::string cfg = config_json(
          prec, 2, 1.0,
          fmt::format(R"("zero_optimization": {{"stage": {}{}}}, {})", stage,
                      stage == 2 ? R"(, "sub_group_size": 1000)" : "",
                      variant == "bf16g" ? R"("data_types": {"grad_accum_dtype": "bf16"},)" : ""));
      const int k = 4;  // optimizer steps before the stop
      std::vector<float> cpu, continuous, resumed;
      {
        rng::dropout_state() = {};
        TrainRun r = start(cfg, corpus_);
        for (int i = 0; i < 4 * k; ++i) cpu.push_back(micro_step(r));
      }
      {
        rng::dropout_state() = {};
        TrainRun r = start(cfg, corpus_, "test-gpt2", gpu);
        for (int i = 0; i < 4 * k; ++i) continuous.push_back(micro_step(r));
      }
      // fp32 differs from the CPU only by summation order; 16-bit rounds the weights each step.
      const double tol = prec == "fp32" ? 1e-4 : 2e-2;
      for (size_t i = 0; i < cpu.size(); ++i)
        EXPECT_NEAR(continuous[i], cpu[i], tol * std::abs(cpu[i]))
            << variant << " stage " << stage << " micro-step " << i;
      const fs::path ck = dir_ / fmt::format("ck_gpu_{}_{}", variant, stage);
      {
        rng::dropout_state() = {};
        TrainRun r = start(cfg, corpus_, "test-gpt2", gpu);
        for (int i = 0; i < 2 * k; ++i) resumed.push_back(micro_step(r));
        r.engine->save_checkpoint(ck.string(), "", {{"loader", r.loader->state()}});
      }
      {
        rng::dropout_state() = {};
        TrainRun r = start(cfg, corpus_, "test-gpt2", gpu);
        nlohmann::json client = r.engine->load_checkpoint(ck.string());
        r.loader->load_state(client.at("loader"));
        for (int i = 0; i < 2 * k; ++i) resumed.push_back(micro_step(r));
      }
      ASSERT_EQ(continuous.size(), resumed.size());
      for (size_t i = 0; i < continuous.size(); ++i)
        EXPECT_EQ(continuous[i], resumed[i])
            << variant << " stage " << stage << " micro-step " << i;
    }
  }
  // Stage 3 (per-parameter shards, gathered for use) on the device model follows the CPU engine's.
  {
    const std::string cfg = config_json("fp32", 2, 1.0, R"("zero_optimization": {"stage": 3},)");
    std::vector<float> cpu, dev;
    for (const Device d : {kCPU, gpu}) {
      rng::dropout_state() = {};
      TrainRun r = start(cfg, corpus_, "test-gpt2", d);
      for (int i = 0; i < 8; ++i) (d.is_cpu() ? cpu : dev).push_back(micro_step(r));
    }
    ASSERT_EQ(dev.size(), cpu.size());
    for (size_t i = 0; i < cpu.size(); ++i)
      EXPECT_NEAR(dev[i], cpu[i], 1e-4 * std::abs(cpu[i])) << "stage 3 micro-step " << i;
  }
}

// DeepSpeed's wall_clock_breakdown: fwd/bwd/step times every steps_per_print optimizer steps, and
// nothing when it is off.
TEST_F(EngineTest, WallClockBreakdownReportsEveryStepsPerPrint) {
  for (const bool on : {false, true}) {
    TrainRun r =
        start(config_json("fp32", 2, 0.0,
                          fmt::format(R"("wall_clock_breakdown": {}, "steps_per_print": 2,)", on)),
              corpus_);
    for (int i = 0; i < 8; ++i) micro_step(r);  // 4 optimizer steps
    std::vector<std::string> lines;
    for (const std::string& l : r.log)
      if (l.find("time (ms)") != std::string::npos) lines.push_back(l);
    if (!on) {
      EXPECT_TRUE(lines.empty()) << lines.front();
      continue;
    }
    ASSERT_EQ(lines.size(), 2u);
    EXPECT_EQ(lines[0].rfind("[engine] step 2: time (ms) | fwd: ", 0), 0u) << lines[0];
    EXPECT_EQ(lines[1].rfind("[engine] step 4: time (ms) | fwd: ", 0), 0u) << lines[1];
    for (const std::string& l : lines) {
      EXPECT_NE(l.find("(means of the last 2 steps)"), std::string::npos) << l;
      double fwd = 0, bwd = 0, step = 0;
      ASSERT_EQ(std::sscanf(l.c_str() + l.find("fwd:"), "fwd: %lf | bwd: %lf | step: %lf", &fwd,
                            &bwd, &step),
                3)
          << l;
      EXPECT_GT(fwd, 0.0);
      EXPECT_GT(bwd, 0.0);
      EXPECT_GT(step, 0.0);
    }
  }
}

TEST_F(EngineTest, CheckpointLayoutAndLatest) {
  TrainRun r = start(config_json("bf16"), corpus_);
  micro_step(r);
  r.engine->save_checkpoint((dir_ / "ck").string());
  EXPECT_TRUE(fs::exists(dir_ / "ck" / "global_step1" / "mp_rank_00_model_states.safetensors"));
  EXPECT_TRUE(fs::exists(dir_ / "ck" / "global_step1" /
                         "bf16_zero_pp_rank_0_mp_rank_00_optim_states.safetensors"));
  EXPECT_TRUE(fs::exists(dir_ / "ck" / "global_step1" / "checksums.json"));
  std::ifstream latest(dir_ / "ck" / "latest");
  std::string tag;
  latest >> tag;
  EXPECT_EQ(tag, "global_step1");
  // No temporary folders left behind.
  for (auto& e : fs::directory_iterator(dir_ / "ck"))
    EXPECT_NE(e.path().filename().string()[0], '.');
}

TEST_F(EngineTest, UnwritableCheckpointFolderIsNamed) {
  TrainRun r = start(config_json("fp32"), corpus_);
  micro_step(r);
  std::ofstream(dir_ / "a_file") << "x";  // a folder cannot be created under a regular file
  const fs::path bad = dir_ / "a_file" / "ck";
  try {
    r.engine->save_checkpoint(bad.string());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[checkpoint] cannot create " + bad.string()),
              std::string::npos)
        << e.what();
  }
}

TEST_F(EngineTest, DamagedCheckpointsAreRefusedWithTheFileNamed) {
  const std::string cfg = config_json("fp32");
  const fs::path ck = dir_ / "ck";
  {
    TrainRun r = start(cfg, corpus_);
    micro_step(r);
    r.engine->save_checkpoint(ck.string());
  }
  const fs::path model_file = ck / "global_step1" / "mp_rank_00_model_states.safetensors";
  const fs::path backup = dir_ / "backup.safetensors";
  fs::copy_file(model_file, backup);
  auto expect_error = [&](const std::string& needle, const std::string& preset = "test-gpt2") {
    TrainRun r = start(cfg, corpus_, preset);
    try {
      r.engine->load_checkpoint(ck.string());
      ADD_FAILURE() << "expected an error containing '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  // Truncated.
  fs::resize_file(model_file, fs::file_size(model_file) - 100);
  expect_error("truncated");
  expect_error("mp_rank_00_model_states.safetensors");
  // Corrupted: one flipped byte, same size.
  fs::copy_file(backup, model_file, fs::copy_options::overwrite_existing);
  {
    std::fstream f(model_file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(model_file) / 2));
    char c = 0x5a;
    f.write(&c, 1);
  }
  expect_error("corrupted");
  // Wrong model.
  fs::copy_file(backup, model_file, fs::copy_options::overwrite_existing);
  expect_error("does not match this model", "test-llama");
  // A damaged `latest` (binary, or huge) is quoted escaped and cut, never echoed raw.
  fs::copy_file(backup, model_file, fs::copy_options::overwrite_existing);
  std::ofstream(ck / "latest", std::ios::binary) << std::string("glob\xff\x01" "al\x1b[2J");
  expect_error("names 'glob\\xff\\x01al\\x1b[2J', which is not a checkpoint tag");
  std::ofstream(ck / "latest", std::ios::binary) << std::string(4000, 'g') << "\n";
  expect_error("4000 characters, longer than any folder name");
  {
    std::ofstream big(ck / "latest", std::ios::binary);
    big << std::string(50 << 20, 'g');
  }
  {
    TrainRun r = start(cfg, corpus_);
    try {
      r.engine->load_checkpoint(ck.string());
      ADD_FAILURE() << "a 50 MB latest was accepted";
    } catch (const Error& e) {
      EXPECT_LT(std::string(e.what()).size(), 600u);
      EXPECT_NE(std::string(e.what()).find("is 52428800 bytes"), std::string::npos) << e.what();
    }
  }
  // Missing latest.
  fs::remove(ck / "latest");
  expect_error("no 'latest' file");
}

namespace {

// Rewrites one JSON metadata entry of a checkpoint file and re-records the file's checksum, so that
// only the metadata's content is wrong (as a buggy or hostile writer would leave it).
void rewrite_metadata(const fs::path& file, const std::string& key,
                      const std::function<void(nlohmann::json&)>& mutate) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::map<std::string, std::string> meta;
  {
    safetensors::Reader r(file.string());
    for (const auto& n : r.names()) tensors.emplace_back(n, r.get(n));
    meta = r.metadata();
  }
  nlohmann::json j = nlohmann::json::parse(meta.at(key));
  mutate(j);
  meta[key] = j.dump();
  safetensors::save(file.string(), tensors, meta);
  const fs::path sums_path = file.parent_path() / "checksums.json";
  nlohmann::json sums = nlohmann::json::parse(std::ifstream(sums_path));
  std::ifstream in(file, std::ios::binary);
  const std::string bytes{std::istreambuf_iterator<char>(in), {}};
  sums[file.filename().string()] = {
      {"bytes", bytes.size()},
      {"xxh64", fmt::format("{:016x}", xxh64(bytes.data(), bytes.size()))}};
  std::ofstream(sums_path) << sums.dump(2);
}

// One optimizer step, then a checkpoint into each of `dirs`.
void save_after_one_step(const std::string& cfg, const fs::path& corpus,
                         std::initializer_list<fs::path> dirs) {
  TrainRun r = start(cfg, corpus);
  micro_step(r);
  for (const auto& d : dirs) r.engine->save_checkpoint(d.string());
}

// What load_checkpoint(dir) says to a fresh engine; "" when it loads.
std::string load_error(const std::string& cfg, const fs::path& corpus, const fs::path& dir) {
  TrainRun r = start(cfg, corpus);
  try {
    r.engine->load_checkpoint(dir.string());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_F(EngineTest, MalformedCheckpointMetadataNamesFileAndField) {
  const std::string cfg = config_json("fp32");
  const fs::path ck = dir_ / "ck";
  save_after_one_step(cfg, corpus_, {ck});
  const fs::path model_file = ck / "global_step1" / "mp_rank_00_model_states.safetensors";
  const fs::path shard_file =
      ck / "global_step1" / "zero_pp_rank_0_mp_rank_00_optim_states.safetensors";
  const fs::path model_backup = dir_ / "model.bak", shard_backup = dir_ / "shard.bak",
                 sums_backup = dir_ / "sums.bak";
  fs::copy_file(model_file, model_backup);
  fs::copy_file(shard_file, shard_backup);
  fs::copy_file(ck / "global_step1" / "checksums.json", sums_backup);
  auto restore = [&] {
    fs::copy_file(model_backup, model_file, fs::copy_options::overwrite_existing);
    fs::copy_file(shard_backup, shard_file, fs::copy_options::overwrite_existing);
    fs::copy_file(sums_backup, ck / "global_step1" / "checksums.json",
                  fs::copy_options::overwrite_existing);
  };
  auto load_error = [&] { return ::load_error(cfg, corpus_, ck); };
  auto expect_all = [](const std::string& msg, std::initializer_list<std::string> needles) {
    for (const auto& n : needles)
      EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' in: " << msg;
    EXPECT_EQ(msg.find("json.exception"), std::string::npos) << msg;
  };

  rewrite_metadata(model_file, "ds_engine", [](nlohmann::json& j) { j["global_steps"] = "1"; });
  expect_all(load_error(),
             {model_file.string(), "ds_engine.global_steps must be an integer >= 0", "\"1\""});
  restore();
  rewrite_metadata(model_file, "ds_engine", [](nlohmann::json& j) { j["skipped_steps"] = -3; });
  expect_all(load_error(), {"ds_engine.skipped_steps must be an integer >= 0", "-3"});
  restore();
  rewrite_metadata(model_file, "ds_engine", [](nlohmann::json& j) { j.erase("micro_steps"); });
  expect_all(load_error(), {model_file.string(), "has no field 'micro_steps'"});
  restore();
  rewrite_metadata(model_file, "ds_engine", [](nlohmann::json& j) { j["dropout_rng"] = {1, 2}; });
  expect_all(load_error(), {"ds_engine.dropout_rng must be an object"});
  restore();
  rewrite_metadata(model_file, "ds_engine",
                   [](nlohmann::json& j) { j["lr_scheduler"]["last_batch_iteration"] = "x"; });
  expect_all(load_error(), {model_file.string(), "last_batch_iteration"});
  restore();
  rewrite_metadata(shard_file, "ds_optimizer",
                   [](nlohmann::json& j) { j["segments"] = {{"garbage"}}; });
  expect_all(load_error(), {shard_file.string(), "ds_optimizer.segments[] must be a list of"});
  restore();
  rewrite_metadata(shard_file, "ds_optimizer", [](nlohmann::json& j) {
    j["segments"] = {{0, 1u << 30, 0}};
  });
  expect_all(load_error(), {shard_file.string(), "lies outside"});
  restore();
  rewrite_metadata(shard_file, "ds_optimizer", [](nlohmann::json& j) { j["param_names"] = 7; });
  expect_all(load_error(), {shard_file.string(), "ds_optimizer.param_names must be an array"});
  restore();
  rewrite_metadata(shard_file, "ds_optimizer",
                   [](nlohmann::json& j) { j["scalar_state"]["step"] = "one"; });
  expect_all(load_error(), {"scalar_state.step must be a number"});
  restore();
  EXPECT_EQ(load_error(), "");  // the restored checkpoint loads
}

TEST_F(EngineTest, LatestMustNameATagInsideTheFolder) {
  const std::string cfg = config_json("fp32");
  const fs::path ck = dir_ / "ck", other = dir_ / "other";
  save_after_one_step(cfg, corpus_, {ck, other});
  auto load_error = [&] { return ::load_error(cfg, corpus_, ck); };
  // An absolute path would silently load another run's checkpoint.
  std::ofstream(ck / "latest") << (other / "global_step1").string() << "\n";
  EXPECT_NE(load_error().find("must be a folder name inside the checkpoint folder"),
            std::string::npos);
  std::ofstream(ck / "latest") << "../other/global_step1\n";
  EXPECT_NE(load_error().find("not a path"), std::string::npos);
  // `latest` as a directory is named as one, not reported as empty.
  fs::remove(ck / "latest");
  fs::create_directories(ck / "latest");
  EXPECT_NE(load_error().find("latest is a directory"), std::string::npos) << load_error();
}

TEST_F(EngineTest, StaleTemporariesAreRemovedAndRotationRenamesFirst) {
  const fs::path ck = dir_ / "ck";
  save_after_one_step(config_json("fp32"), corpus_, {ck});
  // What kills and full disks leave behind.
  fs::create_directories(ck / ".global_step2.tmp" / "x");
  fs::create_directories(ck / ".global_step1.old");
  fs::create_directories(ck / ".global_step0.deleting");
  std::ofstream(ck / "latest.tmp-4242") << "global_step2\n";
  const auto removed = runtime::remove_stale_checkpoint_temporaries(ck);
  EXPECT_EQ(removed.size(), 4u);
  for (const auto& e : fs::directory_iterator(ck)) {
    const std::string n = e.path().filename().string();
    EXPECT_TRUE(n == "latest" || n == "global_step1") << n;
  }
  EXPECT_TRUE(runtime::remove_stale_checkpoint_temporaries(dir_ / "absent").empty());

  runtime::delete_checkpoint(ck, "global_step1");
  EXPECT_FALSE(fs::exists(ck / "global_step1"));
  EXPECT_FALSE(fs::exists(ck / ".global_step1.deleting"));
  try {
    runtime::delete_checkpoint(ck, "global_step9");
    ADD_FAILURE() << "deleting a missing checkpoint must fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("global_step9"), std::string::npos) << e.what();
  }
}

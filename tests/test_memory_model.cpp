// The one memory model (zero/memory_model.h) against what real engines hold (Strategy::memory()
// and the optimizer state's store, stages 0-3, fp32 / bf16 / fp16, one process or N under
// mpirun), against the ZeRO paper's table in docs/zero.md, against DeepSpeed's estimator
// coefficients, and the will-it-fit check (train::plan_fit) built on it.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "ds/comm/group.h"
#include "ds/models/gpt.h"
#include "ds/runtime/engine.h"
#include "ds/train/fit.h"
#include "ds/zero/estimate.h"
#include "ds/zero/memory_model.h"

using namespace ds;

namespace {

std::string ds_config(int stage, const std::string& precision) {
  const std::string prec = precision == "bf16"   ? R"("bf16": {"enabled": true},)"
                           : precision == "fp16" ? R"("fp16": {"enabled": true},)"
                                                 : "";
  return fmt::format(R"({{"train_micro_batch_size_per_gpu": 2, {}
    "zero_optimization": {{"stage": {}, "stage3_param_persistence_threshold": 100}},
    "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-3}}}}}})",
                     prec, stage);
}

std::unique_ptr<runtime::Engine> make_engine(const std::string& cfg) {
  auto model = std::make_shared<models::GPT>(models::GPTConfig::preset("test-gpt2"));
  runtime::InitOptions opt;
  opt.group = comm::world();
  opt.log = [](const std::string&) {};
  return runtime::initialize(model, cfg, opt);
}

}  // namespace

class MemoryModel : public ::testing::TestWithParam<int> {};

// Every state, byte for byte, as the engine holds it on this rank.
TEST_P(MemoryModel, MatchesTheEngines) {
  const int stage = GetParam();
  for (const std::string prec : {"fp32", "bf16", "fp16"}) {
    auto e = make_engine(ds_config(stage, prec));
    const int n = e->world_size();
    const zero::MemorySpec spec =
        zero::memory_spec(e->strategy().options(), n, e->optimizer().state_floats_per_param());
    std::vector<int64_t> numels;
    for (const auto& en : e->strategy().flat().entries) numels.push_back(en.numel);
    const zero::RankMemory want = zero::model_state_memory(spec, numels);
    ASSERT_EQ(n, comm::world()->size());
    ASSERT_GT(want.params, 0);
    const runtime::MemoryBudget got = e->memory_budget();
    const std::string what = fmt::format("{} stage {} N {}", prec, stage, n);
    EXPECT_EQ(got.params, want.params) << what;
    EXPECT_EQ(got.grads, want.grads) << what;
    EXPECT_EQ(got.master_weights, want.master_weights) << what;
    EXPECT_EQ(got.optimizer_states, want.optimizer_states) << what;
    EXPECT_EQ(got.scratch, want.grad_copy) << what;
    EXPECT_EQ(got.total(), want.model_states()) << what;
    EXPECT_EQ(got.nvme, want.disk()) << what;

    // The will-it-fit check asks the same model, from the parameter count: exact at stages 0-2;
    // at stage 3 it leaves out per-parameter padding (< N elements each) and the persistent
    // parameters (numel <= 100 here, whole on every rank).
    const train::FitPlan fit =
        train::plan_fit(models::GPTConfig::preset("test-gpt2").num_parameters(), e->config(), n, 1, 0);
    const int64_t engine_ram = got.total() + got.scratch;
    if (stage < 3) {
      EXPECT_EQ(fit.model_states, engine_ram) << what;
    } else {
      int64_t persistent = 0;
      for (int64_t k : numels)
        if (k <= 100) persistent += n * ((k + n - 1) / n);
      const int64_t per = 18 + 4;  // at most: params, grads, master, moments, grad copy
      const int64_t slack = persistent * static_cast<int64_t>(dtype_size(e->training_dtype())) +
                            per * (static_cast<int64_t>(numels.size()) * n + 16);
      EXPECT_NEAR(static_cast<double>(fit.model_states), static_cast<double>(engine_ram),
                  static_cast<double>(slack))
          << what;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, MemoryModel, ::testing::Values(0, 1, 2, 3));

// NVMe offload (stage 3, bf16): what lands on disk and the ring in RAM, within one sub-group (the
// store rounds the last sub-group up to a whole slot and aligns them to 2048 elements).
TEST(MemoryModelNvme, MatchesTheStoresWithinOneSubGroup) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / fmt::format("ds_memory_model_{}", ::getppid());  // one mpirun
  fs::create_directories(dir);
  for (const bool params : {false, true}) {
    std::string off = fmt::format(
        R"("offload_optimizer": {{"device": "nvme", "nvme_path": "{}", "buffer_count": 4}})",
        dir.string());
    if (params)
      off += fmt::format(R"(, "offload_param": {{"device": "nvme", "nvme_path": "{}",
                             "buffer_count": 2, "buffer_size": 1500, "max_in_cpu": 0}})",
                         dir.string());
    auto e = make_engine(fmt::format(R"({{"train_micro_batch_size_per_gpu": 2,
      "bf16": {{"enabled": true}}, "aio": {{"use_direct_io": false}},
      "zero_optimization": {{"stage": 3, "stage3_param_persistence_threshold": 100,
        "sub_group_size": 2048, {}}},
      "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-3}}}}}})",
                                     off));
    const int n = e->world_size();
    const zero::MemorySpec spec = zero::memory_spec(e->strategy().options(), n, 2);
    std::vector<int64_t> numels;
    for (const auto& en : e->strategy().flat().entries) numels.push_back(en.numel);
    const zero::RankMemory want = zero::model_state_memory(spec, numels);
    const runtime::MemoryBudget got = e->memory_budget();
    const std::string what = params ? "optimizer and parameters on NVMe" : "optimizer on NVMe";
    const double slot = 12.0 * 2048;  // master + two moments of one sub-group
    ASSERT_GT(want.disk_optimizer, 0);
    EXPECT_NEAR(static_cast<double>(got.nvme), static_cast<double>(want.disk_optimizer), slot)
        << what;
    EXPECT_NEAR(static_cast<double>(e->strategy().offload_stats().disk_bytes),
                static_cast<double>(want.disk()), slot + 4096)
        << what;
    EXPECT_NEAR(static_cast<double>(got.optimizer_states),
                static_cast<double>(want.optimizer_states), slot)
        << what;
    EXPECT_EQ(got.grads, want.grads) << what;
    EXPECT_EQ(got.scratch, want.grad_copy) << what;
    EXPECT_EQ(got.master_weights, want.master_weights) << what;
  }
  comm::world()->barrier("memory model nvme test done");
  if (comm::world()->rank() == 0) fs::remove_all(dir);
}

// docs/zero.md's table: bytes per element held whole and sharded, stages 0-3.
TEST(MemoryModelTable, TheZeroPapersCoefficients) {
  struct Row {
    DType param, grad;
    int64_t whole[4], sharded[4], copy;
  };
  const Row rows[] = {
      {DType::f32, DType::f32, {16, 8, 4, 0}, {0, 8, 12, 16}, 0},
      {DType::bf16, DType::f32, {18, 6, 2, 0}, {0, 12, 16, 18}, 0},
      {DType::f16, DType::f16, {16, 4, 2, 0}, {0, 12, 14, 16}, 4},  // the ZeRO paper's 2 + 2 + 12
  };
  // copy: the fp32 copy of 16-bit gradients a whole-tensor optimizer (Lamb, SGD) reads; Adam reads
  // them a chunk at a time and needs none.
  for (const Row& r : rows)
    for (int s = 0; s <= 3; ++s)
      for (const bool whole_tensor : {false, true}) {
        zero::MemorySpec spec;
        spec.stage = s;
        spec.param_dtype = r.param;
        spec.grad_dtype = r.grad;
        spec.whole_tensor_optimizer = whole_tensor;
        const zero::PerElementBytes e = zero::per_element_bytes(spec);
        zero::PerElement states = e.device();
        states.whole -= e.grad_copy.whole;
        states.sharded -= e.grad_copy.sharded;
        EXPECT_EQ(states.whole, r.whole[s]) << dtype_name(r.param) << " stage " << s;
        EXPECT_EQ(states.sharded, r.sharded[s]) << dtype_name(r.param) << " stage " << s;
        EXPECT_EQ(e.grad_copy.whole + e.grad_copy.sharded, whole_tensor ? r.copy : 0)
            << dtype_name(r.param);
      }
}

// DeepSpeed's estimator (deepspeed/runtime/zero/stage_1_and_2.py, stage3.py) in the model's terms:
// the coefficients its formulas print (tests/test_estimate.cpp checks the tables byte for byte).
TEST(MemoryModelTable, DeepSpeedsEstimatorCoefficients) {
  using zero::deepspeed_estimator_spec;
  using zero::per_element_bytes;
  // ZeRO-2: GPU 2P + 18P/T; offloaded GPU 2P and CPU 16 bytes per element.
  auto z2 = per_element_bytes(deepspeed_estimator_spec(2, false, false));
  EXPECT_EQ(z2.device().whole, 2);
  EXPECT_EQ(z2.device().sharded, 18);
  z2 = per_element_bytes(deepspeed_estimator_spec(2, true, false));
  EXPECT_EQ(z2.device().whole, 2);
  EXPECT_EQ(z2.device().sharded, 0);
  EXPECT_EQ(z2.host.sharded, 16);
  // ZeRO-3: GPU 4L + 18P/T; optimizer offloaded 4L + 2P/T and CPU 16; both offloaded 4L and 18.
  auto z3 = per_element_bytes(deepspeed_estimator_spec(3, false, false));
  EXPECT_EQ(z3.gathered, 4);
  EXPECT_EQ(z3.device().whole, 0);
  EXPECT_EQ(z3.device().sharded, 18);
  z3 = per_element_bytes(deepspeed_estimator_spec(3, true, false));
  EXPECT_EQ(z3.device().sharded, 2);
  EXPECT_EQ(z3.host.sharded, 16);
  z3 = per_element_bytes(deepspeed_estimator_spec(3, true, true));
  EXPECT_EQ(z3.device().sharded, 0);
  EXPECT_EQ(z3.host.sharded, 18);
}

// NVMe offload: what moves to disk, the ring and read-ahead in RAM, ratio and max_in_cpu.
TEST(MemoryModelTable, NvmeOffload) {
  const int64_t P = 1 << 20;  // a multiple of 16 x N: no padding
  zero::MemorySpec s;
  s.stage = 3;
  s.world_size = 2;
  s.param_dtype = DType::bf16;
  s.optimizer = zero::OffloadTarget::nvme;
  s.sub_group_size = 1000;
  const int64_t p = P / 2;
  auto m = zero::model_state_memory(s, P);
  EXPECT_EQ(m.disk_optimizer, 12 * p);  // master + two moments
  EXPECT_EQ(m.optimizer_states, 4 * 1000 * 12);
  EXPECT_EQ(m.buffers, 4 * 1000 * 12);
  EXPECT_EQ(m.grad_copy, 0);  // the store widens one sub-group at a time
  EXPECT_EQ(m.params + m.grads, 2 * p + 4 * p);
  s.optimizer_ratio = 0.25;
  m = zero::model_state_memory(s, P);
  EXPECT_EQ(m.disk_optimizer, 3 * p);
  EXPECT_EQ(m.optimizer_states, 9 * p + 4 * 1000 * 12);
  // fp32 training: the parameters are the master weights; only the moments move.
  s.optimizer_ratio = 1.0;
  s.param_dtype = DType::f32;
  EXPECT_EQ(zero::model_state_memory(s, P).disk_optimizer, 8 * p);
  // ... unless the parameters go to disk too: then the optimizer keeps its own fp32 copy.
  s.params = zero::OffloadTarget::nvme;
  s.param_max_in_cpu = p / 4;
  s.param_buffer_count = 2;
  s.param_buffer_size = 100;
  m = zero::model_state_memory(s, P);
  EXPECT_EQ(m.disk_optimizer, 12 * p);
  EXPECT_EQ(m.disk_params, 4 * (p - p / 4));
  EXPECT_EQ(m.params, 4 * (p / 4 + 200));
  s.optimizer = zero::OffloadTarget::none;
  m = zero::model_state_memory(s, P);
  EXPECT_EQ(m.master_weights, 4 * p);
  EXPECT_EQ(m.disk_optimizer, 0);
}

TEST(MemoryModelTable, RefusesNonsense) {
  zero::MemorySpec s;
  s.stage = 4;
  try {
    zero::model_state_memory(s, 10);
    FAIL() << "stage 4 accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("[zero] memory model: ZeRO stage must be 0-3"),
              std::string::npos)
        << e.what();
  }
  s.stage = 0;
  EXPECT_THROW(zero::model_state_memory(s, -1), std::exception);
}

// A GPU run (--device cuda): the GPU holds parameters, gradients and activations; host memory the
// fp32 master weights, the moments and the staging; each is checked against its own capacity.
TEST(FitCheck, GpuRunCountsTheGpuAndHostSeparately) {
  const models::GPTConfig mc = models::GPTConfig::preset("gpt2-xl");
  const int64_t P = mc.num_parameters();
  config::DeepSpeedConfig fp32;
  const train::GpuFitPlan a = train::plan_fit_gpu(mc.num_parameters(), fp32, 0);
  EXPECT_EQ(a.params, 4 * P);
  EXPECT_EQ(a.grads, 4 * P);
  EXPECT_EQ(a.host_states, 16 * P);  // master 4 + moments 8 + fp32 gradient staging 4
  EXPECT_EQ(a.host_build, 4 * P);
  config::DeepSpeedConfig bf16 = fp32;
  bf16.bf16.enabled = true;
  const int64_t act = int64_t{2} << 30;
  const train::GpuFitPlan b = train::plan_fit_gpu(mc.num_parameters(), bf16, act);
  EXPECT_EQ(b.params, 2 * P);
  EXPECT_EQ(b.grads, 4 * P);  // bf16 training accumulates in fp32 unless grad_accum_dtype says
  EXPECT_EQ(b.host_states, 18 * P);  // + the bf16 parameters staged on the way up
  EXPECT_EQ(b.device(), 6 * P + act);
  config::DeepSpeedConfig bf16g = bf16;
  bf16g.data_types.grad_accum_dtype = DType::bf16;
  EXPECT_EQ(train::plan_fit_gpu(mc.num_parameters(), bf16g, act).grads, 2 * P);

  // Several ranks: each holds its 1/(tp x pp) of the model and its ZeRO partition of the optimizer
  // state over the data-parallel ranks; stage 2 keeps only its partition of the gradients.
  config::DeepSpeedConfig z2 = bf16;
  z2.zero_optimization.stage = 2;
  const train::GpuFitPlan c = train::plan_fit_gpu(mc.num_parameters(), z2, act, 0, 0, /*dp=*/4, /*mp=*/2);
  const int64_t half = (P + 1) / 2, quarter = (half + 3) / 4;
  EXPECT_EQ(c.params, 2 * half);
  EXPECT_EQ(c.grads, 4 * quarter);
  EXPECT_EQ(c.host_states, 18 * quarter);
  EXPECT_EQ(c.host_build, 4 * half);
  // Stage 3: the GPU holds what is gathered at once (max_live_parameters + a prefetch bucket), no
  // lasting gradients; host memory the shards of the working parameters and gradients too.
  config::DeepSpeedConfig z3 = bf16;
  z3.zero_optimization.stage = 3;
  const train::GpuFitPlan d = train::plan_fit_gpu(mc.num_parameters(), z3, act, 0, 0, 4, 1);
  const int64_t live = z3.zero_optimization.stage3_max_live_parameters +
                       z3.zero_optimization.stage3_prefetch_bucket_size;
  EXPECT_EQ(d.params, 2 * std::min(P, live));
  EXPECT_EQ(d.grads, 0);
  EXPECT_EQ(d.host_states, (4 + 8 + 4 + 2) * ((P + 3) / 4));  // master, moments, grads, bf16

  const int64_t GiB = int64_t{1} << 30;
  EXPECT_EQ(train::check_fit_gpu(b, 24 * GiB, 128 * GiB, "cuda:0", bf16), "");
  EXPECT_NE(train::check_fit_gpu(b, b.device() + b.device() / 20, 0, "cuda:0", bf16)
                .find("warning: this run needs"),
            std::string::npos);
  try {
    train::check_fit_gpu(b, 8 * GiB, 0, "cuda:0", bf16);
    ADD_FAILURE() << "8 GiB accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("does not fit on cuda:0"), std::string::npos) << m;
    EXPECT_NE(m.find("data_types.grad_accum_dtype"), std::string::npos) << m;
    EXPECT_NE(m.find("--gradient_checkpointing"), std::string::npos) << m;
  }
  try {
    train::check_fit_gpu(b, 0, 10 * GiB, "cuda:0", bf16);
    ADD_FAILURE() << "10 GiB of host memory accepted for 18 bytes per parameter";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit in host memory"), std::string::npos)
        << e.what();
  }
}

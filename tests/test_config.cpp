// DeepSpeed config parsing (§1-§3): defaults, batch rules and messages, "auto", every error path,
// deprecated spellings, lenient JSON, warnings for accepted-but-unimplemented keys, and the
// effective-config report.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "ds/core/error.h"
#include "ds/config/config.h"
#include "ds/runtime/engine.h"
#include "ds/zero/strategy.h"

using namespace ds;
using nlohmann::json;

namespace {

config::DeepSpeedConfig parse(const std::string& text, config::ConfigContext ctx = {}) {
  return config::parse_config(text, ctx);
}

config::ConfigContext world(int n) {
  config::ConfigContext c;
  c.world_size = n;
  return c;
}

// The message of the ds::Error that parsing throws ("" when it does not throw).
std::string error_of(const std::string& text, config::ConfigContext ctx = {}) {
  try {
    config::parse_config(text, ctx);
  } catch (const ds::Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_HAS(haystack, needle)                               \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) \
      << "expected to find: " << (needle) << "\nin: " << (haystack)

const config::ConfigValue& entry(const config::DeepSpeedConfig& c, std::string_view path) {
  const config::ConfigValue* v = c.find(path);
  EXPECT_NE(v, nullptr) << path;
  static config::ConfigValue none;
  return v ? *v : none;
}

bool has_warning(const config::DeepSpeedConfig& c, std::string_view needle) {
  for (const auto& w : c.warnings)
    if (w.find(needle) != std::string::npos) return true;
  return false;
}

}  // namespace

// ---- defaults (§1) ---------------------------------------------------------------------------

TEST(ConfigDefaults, MinimalConfigGetsDeepSpeedDefaults) {
  auto c = parse(R"({"train_batch_size": 16})");
  EXPECT_EQ(c.steps_per_print, 10);
  EXPECT_FALSE(c.wall_clock_breakdown);
  EXPECT_EQ(c.gradient_clipping, 0.0);
  EXPECT_FALSE(c.prescale_gradients);
  EXPECT_EQ(c.gradient_predivide_factor, 1.0);
  EXPECT_EQ(c.communication_data_type, ds::DType::f32);
  EXPECT_FALSE(c.zero_allow_untested_optimizer);
  EXPECT_TRUE(c.zero_force_ds_cpu_optimizer);
  EXPECT_FALSE(c.memory_breakdown);
  EXPECT_FALSE(c.dump_state);

  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.loss_scale, 0.0);
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_EQ(c.fp16.hysteresis, 2);
  EXPECT_FALSE(c.fp16.consecutive_hysteresis);
  EXPECT_EQ(c.fp16.min_loss_scale, 1.0);
  EXPECT_FALSE(c.fp16.auto_cast);
  EXPECT_FALSE(c.bf16.enabled);
  EXPECT_FALSE(c.data_types.grad_accum_dtype.has_value());
  EXPECT_EQ(c.optimizer.type, config::OptimizerType::None);
  EXPECT_EQ(c.scheduler.type, config::SchedulerType::None);

  const auto& z = c.zero_optimization;
  EXPECT_EQ(z.stage, 0);
  EXPECT_TRUE(z.contiguous_gradients);
  EXPECT_TRUE(z.reduce_scatter);
  EXPECT_EQ(z.reduce_bucket_size, 500000000);
  EXPECT_TRUE(z.allgather_partitions);
  EXPECT_EQ(z.allgather_bucket_size, 500000000);
  EXPECT_FALSE(z.overlap_comm);
  EXPECT_FALSE(z.round_robin_gradients);
  EXPECT_EQ(z.offload_optimizer.device, config::OffloadDevice::None);
  EXPECT_EQ(z.offload_optimizer.buffer_count, 4);
  EXPECT_EQ(z.offload_optimizer.ratio, 1.0);
  EXPECT_EQ(z.offload_param.buffer_count, 5);
  EXPECT_EQ(z.offload_param.buffer_size, 100000000);
  EXPECT_EQ(z.offload_param.max_in_cpu, 1000000000);
  EXPECT_EQ(z.sub_group_size, 1000000000);
  EXPECT_EQ(z.stage3_prefetch_bucket_size, 50000000);
  EXPECT_EQ(z.stage3_param_persistence_threshold, 100000);
  EXPECT_EQ(z.stage3_max_live_parameters, 1000000000);
  EXPECT_EQ(z.stage3_max_reuse_distance, 1000000000);
  EXPECT_FALSE(z.stage3_gather_16bit_weights_on_model_save);
  EXPECT_TRUE(z.load_from_fp32_weights);
  EXPECT_TRUE(z.ignore_unused_parameters);

  EXPECT_EQ(c.aio.block_size, 1048576);
  EXPECT_EQ(c.aio.queue_depth, 8);
  EXPECT_EQ(c.aio.intra_op_parallelism, 1);
  EXPECT_FALSE(c.aio.single_submit);
  EXPECT_TRUE(c.aio.overlap_events);
  EXPECT_FALSE(c.aio.use_gds);
  EXPECT_EQ(c.checkpoint.tag_validation, config::TagValidation::Warn);
  EXPECT_FALSE(c.checkpoint.load_universal);
  EXPECT_EQ(c.flops_profiler.profile_step, 1);
  EXPECT_EQ(c.flops_profiler.module_depth, -1);
  EXPECT_EQ(c.flops_profiler.top_modules, 1);
  EXPECT_TRUE(c.flops_profiler.detailed);
  EXPECT_TRUE(c.comms_logger.prof_all);
  EXPECT_EQ(c.csv_monitor.job_name, "DeepSpeedJobName");
  EXPECT_EQ(c.wandb.project, "deepspeed");
  EXPECT_TRUE(c.warnings.empty());
}

// One set of defaults: a minimal config mapped onto the ZeRO layer's options (zero_options, what
// the engine and the fit check build) gives zero::Options' and the offload options' own defaults
// (both start from zero/defaults.h), and the aio section io::AioOptions'.
TEST(ConfigDefaults, ZeroLayerOptionsStartFromTheSameDefaults) {
  const auto c = parse(R"({"train_batch_size": 16, "zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"},
      "offload_param": {"device": "nvme", "nvme_path": "/tmp"}}})");
  const zero::Options want;
  const zero::Options got = runtime::zero_options(c, ds::DType::f32, 1);
  EXPECT_EQ(got.reduce_bucket_size, want.reduce_bucket_size);
  EXPECT_EQ(got.param_persistence_threshold, want.param_persistence_threshold);
  EXPECT_EQ(got.prefetch_bucket_size, want.prefetch_bucket_size);
  EXPECT_EQ(got.max_live_parameters, want.max_live_parameters);
  EXPECT_EQ(got.max_reuse_distance, want.max_reuse_distance);
  EXPECT_EQ(got.sub_group_size, want.sub_group_size);
  ASSERT_TRUE(got.nvme_optimizer && got.nvme_params);
  const zero::NvmeOffloadOptions opt;
  const zero::NvmeParamOffloadOptions par;
  EXPECT_EQ(got.nvme_optimizer->buffer_count, opt.buffer_count);
  EXPECT_EQ(got.nvme_params->buffer_count, par.buffer_count);
  EXPECT_EQ(got.nvme_params->buffer_size, par.buffer_size);
  EXPECT_EQ(got.nvme_params->max_in_cpu, par.max_in_cpu);
  const io::AioOptions aio;
  EXPECT_EQ(got.nvme_optimizer->aio.block_size, aio.block_size);
  EXPECT_EQ(got.nvme_optimizer->aio.queue_depth, aio.queue_depth);
  EXPECT_EQ(got.nvme_optimizer->aio.threads, aio.threads);
  EXPECT_EQ(got.nvme_optimizer->aio.single_submit, aio.single_submit);
  EXPECT_EQ(got.nvme_optimizer->aio.overlap_events, aio.overlap_events);
  EXPECT_EQ(got.nvme_optimizer->aio.use_direct_io, aio.use_direct_io);
}

// NVMe offload needs a swap buffer: buffer_count 0 is refused by the config, naming the key.
TEST(ConfigDefaults, NvmeOffloadNeedsABuffer) {
  for (const char* section : {"offload_optimizer", "offload_param"})
    EXPECT_HAS(error_of(fmt::format(R"({{"train_batch_size": 16, "zero_optimization": {{"stage": 3,
        "{}": {{"device": "nvme", "nvme_path": "/tmp", "buffer_count": 0}}}}}})",
                                    section)),
               fmt::format("zero_optimization.{}.buffer_count = 0", section));
}

TEST(ConfigDefaults, OverlapCommDependsOnStage) {
  EXPECT_FALSE(parse(R"({"train_batch_size": 4, "zero_optimization": {"stage": 2}})")
                   .zero_optimization.overlap_comm);
  EXPECT_TRUE(parse(R"({"train_batch_size": 4, "zero_optimization": {"stage": 3}})")
                  .zero_optimization.overlap_comm);
  EXPECT_FALSE(parse(R"({"train_batch_size": 4,
                         "zero_optimization": {"stage": 3, "overlap_comm": false}})")
                   .zero_optimization.overlap_comm);
}

TEST(ConfigDefaults, AdamMeansAdamWUnlessAdamWModeFalse) {
  auto c = parse(R"({"train_batch_size": 4, "optimizer": {"type": "adam"}})");
  EXPECT_EQ(c.optimizer.type, config::OptimizerType::Adam);
  EXPECT_TRUE(c.optimizer.adam_w_mode);
  EXPECT_EQ(c.optimizer.lr, 1e-3);
  EXPECT_EQ(c.optimizer.betas[0], 0.9);
  EXPECT_EQ(c.optimizer.betas[1], 0.999);
  EXPECT_EQ(c.optimizer.eps, 1e-8);
  EXPECT_TRUE(c.optimizer.bias_correction);
  c = parse(R"({"train_batch_size": 4,
                "optimizer": {"type": "Adam", "params": {"adam_w_mode": false, "torch_adam": true}}})");
  EXPECT_FALSE(c.optimizer.adam_w_mode);
  EXPECT_TRUE(c.optimizer.torch_adam);
  c = parse(R"({"train_batch_size": 4,
                "optimizer": {"type": "AdamW", "params": {"adam_w_mode": false}}})");
  EXPECT_TRUE(c.optimizer.adam_w_mode);
  EXPECT_TRUE(has_warning(c, "adam_w_mode"));
}

TEST(ConfigDefaults, OptimizerTypesAndTheirKeys) {
  auto c = parse(R"({"train_batch_size": 4, "optimizer": {"type": "Lamb",
                     "params": {"lr": 0.01, "max_coeff": 5.0, "min_coeff": 0.1}}})");
  EXPECT_EQ(c.optimizer.type, config::OptimizerType::Lamb);
  EXPECT_EQ(c.optimizer.max_coeff, 5.0);
  EXPECT_EQ(c.optimizer.min_coeff, 0.1);
  c = parse(R"({"train_batch_size": 4, "optimizer": {"type": "Lamb"}})");
  EXPECT_EQ(c.optimizer.max_coeff, 10.0);
  EXPECT_EQ(c.optimizer.min_coeff, 0.01);
  c = parse(R"({"train_batch_size": 4, "optimizer": {"type": "SGD",
                "params": {"lr": 0.1, "momentum": 0.9, "nesterov": true}}})");
  EXPECT_EQ(c.optimizer.momentum, 0.9);
  EXPECT_TRUE(c.optimizer.nesterov);
  c = parse(R"({"train_batch_size": 4, "optimizer": {"type": "Adagrad"}})");
  EXPECT_EQ(c.optimizer.lr, 1e-2);
  EXPECT_EQ(c.optimizer.eps, 1e-10);
  c = parse(
      R"({"train_batch_size": 4, "optimizer": {"type": "LION", "params": {"betas": [0.95, 0.98]}}})");
  EXPECT_EQ(c.optimizer.type, config::OptimizerType::Lion);
  EXPECT_EQ(c.optimizer.betas[1], 0.98);
  // SGD has no betas: an Adam key there is unknown.
  EXPECT_HAS(
      error_of(
          R"({"train_batch_size": 4, "optimizer": {"type": "SGD", "params": {"betas": [0.9, 0.9]}}})"),
      "unknown key 'optimizer.params.betas'");
  EXPECT_HAS(error_of(R"({"train_batch_size": 4, "optimizer": {"type": "RMSprop"}})"),
             "optimizer.type = \"RMSprop\" is not allowed");
  EXPECT_HAS(error_of(R"({"train_batch_size": 4, "optimizer": {"params": {"lr": 1}}})"),
             "optimizer.type is missing");
  EXPECT_HAS(
      error_of(
          R"({"train_batch_size": 4, "optimizer": {"type": "Adam", "params": {"amsgrad": true}}})"),
      "amsgrad");
}

// ---- batch size (§2) -------------------------------------------------------------------------

TEST(ConfigBatch, AllThreeGivenAndConsistent) {
  auto c = parse(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
                     "gradient_accumulation_steps": 2})",
                 world(4));
  EXPECT_EQ(c.batch.train_batch_size, 32);
  EXPECT_EQ(c.batch.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(c.batch.gradient_accumulation_steps, 2);
  EXPECT_EQ(c.batch.world_size, 4);
  EXPECT_EQ(entry(c, "gradient_accumulation_steps").origin, config::Origin::File);
}

TEST(ConfigBatch, AllThreeInconsistentUsesDeepSpeedMessage) {
  auto msg = error_of(R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
                          "gradient_accumulation_steps": 1})");
  EXPECT_HAS(msg,
             "[config] Check batch related parameters. train_batch_size is not equal to "
             "micro_batch_per_gpu * gradient_acc_step * world_size 8 != 2 * 1 * 1");
  EXPECT_HAS(msg,
             "given: train_batch_size=8, train_micro_batch_size_per_gpu=2, "
             "gradient_accumulation_steps=1");
  EXPECT_HAS(msg, "world size N=1");
}

TEST(ConfigBatch, TrainAndMicroDeriveGas) {
  auto c = parse(R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4})", world(2));
  EXPECT_EQ(c.batch.gradient_accumulation_steps, 8);  // 64 // 4 // 2
  const auto& e = entry(c, "gradient_accumulation_steps");
  EXPECT_EQ(e.origin, config::Origin::Derived);
  EXPECT_EQ(e.value, 8);
  EXPECT_HAS(e.note, "64 // 4 // 2");
}

TEST(ConfigBatch, TrainAndGasDeriveMicro) {
  auto c = parse(R"({"train_batch_size": 64, "gradient_accumulation_steps": 4})", world(2));
  EXPECT_EQ(c.batch.train_micro_batch_size_per_gpu, 8);  // 64 // 2 // 4
  EXPECT_EQ(entry(c, "train_micro_batch_size_per_gpu").origin, config::Origin::Derived);
}

TEST(ConfigBatch, MicroAndGasDeriveTrain) {
  auto c =
      parse(R"({"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 5})", world(4));
  EXPECT_EQ(c.batch.train_batch_size, 60);
  EXPECT_EQ(entry(c, "train_batch_size").origin, config::Origin::Derived);
}

TEST(ConfigBatch, TrainOnly) {
  auto c = parse(R"({"train_batch_size": 24})", world(3));
  EXPECT_EQ(c.batch.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.batch.train_micro_batch_size_per_gpu, 8);
}

TEST(ConfigBatch, MicroOnly) {
  auto c = parse(R"({"train_micro_batch_size_per_gpu": 6})", world(2));
  EXPECT_EQ(c.batch.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.batch.train_batch_size, 12);
}

TEST(ConfigBatch, NoneOrGasOnlyIsAnError) {
  const char* want =
      "Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided";
  EXPECT_HAS(error_of("{}"), want);
  auto msg = error_of(R"({"gradient_accumulation_steps": 4})", world(2));
  EXPECT_HAS(msg, want);
  EXPECT_HAS(msg, "given: gradient_accumulation_steps=4");
  EXPECT_HAS(msg, "world size 2");
}

TEST(ConfigBatch, DerivedZeroIsAnError) {
  // 2 samples over 4 ranks: the micro batch floors to 0.
  auto msg = error_of(R"({"train_batch_size": 2})", world(4));
  EXPECT_HAS(msg, "Micro batch size per gpu: 0 has to be greater than 0");
  EXPECT_HAS(msg, "derived: gradient_accumulation_steps=1");
  EXPECT_HAS(msg, "train_micro_batch_size_per_gpu=0 (= 2 // 4 ranks)");
  EXPECT_HAS(msg, "world size N=4");
  EXPECT_HAS(error_of(R"({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 8})"),
             "Gradient accumulation steps: 0 has to be greater than 0");
}

TEST(ConfigBatch, DerivedButInconsistentSaysWhatWasDerived) {
  auto msg = error_of(R"({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4})");
  EXPECT_HAS(msg, "10 != 4 * 2 * 1");
  EXPECT_HAS(msg, "given: train_batch_size=10, train_micro_batch_size_per_gpu=4");
  EXPECT_HAS(msg, "derived: gradient_accumulation_steps=2 (= 10 // 4 // 1 ranks)");
}

TEST(ConfigBatch, NonPositiveGivenValueIsARangeError) {
  auto msg = error_of(R"({"train_batch_size": 0})");
  EXPECT_HAS(msg, "[config] train_batch_size = 0 is not allowed");
  EXPECT_HAS(msg, "an integer >= 1");
}

// ---- "auto" (§3) ------------------------------------------------------------------------------

constexpr const char* kAutoConfig = R"({
  "train_batch_size": "auto",
  "train_micro_batch_size_per_gpu": "auto",
  "gradient_accumulation_steps": "auto",
  "gradient_clipping": "auto",
  "fp16": {"enabled": "auto"},
  "bf16": {"enabled": "auto"},
  "optimizer": {"type": "AdamW",
                "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
  "scheduler": {"type": "WarmupDecayLR",
                "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                           "warmup_num_steps": "auto", "total_num_steps": "auto"}},
  "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",
                        "stage3_prefetch_bucket_size": "auto",
                        "stage3_param_persistence_threshold": "auto"}
})";

config::ConfigContext full_args() {
  config::ConfigContext c;
  c.world_size = 2;
  c.args.per_device_train_batch_size = 4;
  c.args.gradient_accumulation_steps = 3;
  c.args.learning_rate = 3e-4;
  c.args.adam_beta1 = 0.85;
  c.args.adam_beta2 = 0.95;
  c.args.adam_epsilon = 1e-6;
  c.args.weight_decay = 0.1;
  c.args.max_grad_norm = 1.0;
  c.args.warmup_steps = 100;
  c.args.total_steps = 5000;
  c.args.fp16 = false;
  c.args.bf16 = true;
  c.hidden_size = 768;
  return c;
}

TEST(ConfigAuto, EveryAutoFilledFromTrainerAndModel) {
  auto c = parse(kAutoConfig, full_args());
  EXPECT_EQ(c.batch.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(c.batch.gradient_accumulation_steps, 3);
  EXPECT_EQ(c.batch.train_batch_size, 24);
  EXPECT_EQ(c.gradient_clipping, 1.0);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_EQ(c.communication_data_type, ds::DType::bf16);
  EXPECT_EQ(c.optimizer.lr, 3e-4);
  EXPECT_EQ(c.optimizer.betas[0], 0.85);
  EXPECT_EQ(c.optimizer.betas[1], 0.95);
  EXPECT_EQ(c.optimizer.eps, 1e-6);
  EXPECT_EQ(c.optimizer.weight_decay, 0.1);
  const auto& w = std::get<config::WarmupDecayLRParams>(c.scheduler.params);
  EXPECT_EQ(w.warmup_min_lr, 0.0);
  EXPECT_EQ(w.warmup_max_lr, 3e-4);
  EXPECT_EQ(w.warmup_num_steps, 100);
  EXPECT_EQ(w.total_num_steps, 5000);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 768 * 768);
  EXPECT_EQ(c.zero_optimization.stage3_prefetch_bucket_size, 530841);  // int(0.9 * 768^2)
  EXPECT_EQ(c.zero_optimization.stage3_param_persistence_threshold, 7680);
  for (const char* p : {"train_batch_size", "optimizer.params.lr", "optimizer.params.betas",
                        "scheduler.params.total_num_steps", "bf16.enabled",
                        "zero_optimization.reduce_bucket_size"}) {
    EXPECT_EQ(entry(c, p).origin, config::Origin::Auto) << p;
  }
  EXPECT_HAS(entry(c, "optimizer.params.lr").note, "learning_rate");
  EXPECT_HAS(entry(c, "zero_optimization.reduce_bucket_size").note, "hidden_size 768");
}

TEST(ConfigAuto, BatchAutoWithoutTrainerValueIsDerived) {
  auto c = parse(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 4,
                     "gradient_accumulation_steps": 2})",
                 world(2));
  EXPECT_EQ(c.batch.train_batch_size, 16);
  EXPECT_EQ(entry(c, "train_batch_size").origin, config::Origin::Derived);
  auto msg = error_of(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"})");
  EXPECT_HAS(msg, "Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided");
  EXPECT_HAS(msg,
             "\"auto\" with no trainer value: train_batch_size, train_micro_batch_size_per_gpu");
}

TEST(ConfigAuto, UnresolvedAutoNamesTheKey) {
  auto msg = error_of(
      R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"lr": "auto"}}})");
  EXPECT_HAS(msg, "[config] optimizer.params.lr is \"auto\"");
  EXPECT_HAS(msg, "learning_rate");
  msg = error_of(R"({"train_batch_size": 8, "steps_per_print": "auto"})");
  EXPECT_HAS(msg, "steps_per_print is \"auto\"");
  msg = error_of(
      R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"betas": "auto"}}})");
  EXPECT_HAS(msg, "optimizer.params.betas is \"auto\"");
  EXPECT_HAS(msg, "adam_beta1 and adam_beta2");
  msg = error_of(
      R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "overlap_comm": "auto"}})");
  EXPECT_HAS(msg, "zero_optimization.overlap_comm is \"auto\"");
}

TEST(ConfigAuto, HiddenSizeKeys) {
  auto msg = error_of(R"({"train_batch_size": 8,
                          "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",
                                                "stage3_prefetch_bucket_size": "auto"}})");
  EXPECT_HAS(msg, "hidden size is unknown");
  EXPECT_HAS(msg,
             "zero_optimization.reduce_bucket_size, zero_optimization.stage3_prefetch_bucket_size");
  // Below stage 3 the stage-3 keys keep their defaults, like DeepSpeed.
  config::ConfigContext ctx;
  ctx.hidden_size = 1024;
  auto c = parse(R"({"train_batch_size": 8,
                     "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto",
                                           "stage3_prefetch_bucket_size": "auto"}})",
                 ctx);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 1024 * 1024);
  EXPECT_EQ(c.zero_optimization.stage3_prefetch_bucket_size, 50000000);
  EXPECT_EQ(entry(c, "zero_optimization.stage3_prefetch_bucket_size").origin, config::Origin::Default);
}

TEST(ConfigAuto, ContradictingArgumentsListEveryMismatch) {
  config::ConfigContext ctx;
  ctx.args.per_device_train_batch_size = 8;
  ctx.args.learning_rate = 3e-4;
  ctx.args.adam_beta2 = 0.95;
  ctx.args.max_grad_norm = 1.0;
  auto msg = error_of(R"({"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 1.0,
                          "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "betas": [0.9, 0.999]}}})",
                      ctx);
  EXPECT_HAS(msg, "contradicts the trainer's arguments");
  EXPECT_HAS(msg, "- ds train_micro_batch_size_per_gpu=4 vs trainer per_device_train_batch_size=8");
  EXPECT_HAS(msg, "- ds optimizer.params.lr=0.001 vs trainer learning_rate=0.0003");
  EXPECT_HAS(msg, "- ds optimizer.params.betas[1]=0.999 vs trainer adam_beta2=0.95");
  EXPECT_EQ(msg.find("gradient_clipping"), std::string::npos) << msg;  // equal: no mismatch
  // Matching explicit values are fine.
  ctx.args.per_device_train_batch_size = 4;
  ctx.args.learning_rate = 1e-3;
  ctx.args.adam_beta2 = 0.999;
  EXPECT_EQ(error_of(R"({"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 1.0,
                         "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "betas": [0.9, 0.999]}}})",
                     ctx),
            "");
}

TEST(ConfigAuto, ComputedTrainBatchMismatch) {
  config::ConfigContext ctx;
  ctx.world_size = 2;
  ctx.args.per_device_train_batch_size = 4;
  ctx.args.gradient_accumulation_steps = 2;
  auto msg = error_of(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": "auto",
                          "gradient_accumulation_steps": "auto"})",
                      ctx);
  EXPECT_HAS(msg, "- ds train_batch_size=32 vs trainer train_batch_size (calculated");
  EXPECT_HAS(msg, "=16");
}

// ---- unknown keys -----------------------------------------------------------------------------

TEST(ConfigUnknown, TypoGetsNearestKeyWithFullPath) {
  auto msg = error_of(R"({"train_batch_size": 8,
                          "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_sze": 1000}})");
  EXPECT_HAS(msg,
             "[config] unknown key 'zero_optimization.stage3_prefetch_bucket_sze' in "
             "<json string>: did you mean 'zero_optimization.stage3_prefetch_bucket_size'?");
}

TEST(ConfigUnknown, TopLevelAndSectionTypos) {
  EXPECT_HAS(error_of(R"({"train_batch_sise": 8})"), "did you mean 'train_batch_size'?");
  EXPECT_HAS(error_of(R"({"train_batch_size": 8, "zero_optimisation": {"stage": 1}})"),
             "did you mean 'zero_optimization'?");
  EXPECT_HAS(
      error_of(R"({"train_batch_size": 8, "fp16": {"enabled": true, "loss_scale_windw": 10}})"),
      "did you mean 'fp16.loss_scale_window'?");
  EXPECT_HAS(error_of(R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR",
                          "params": {"warmup_num_step": 10}}})"),
             "did you mean 'scheduler.params.warmup_num_steps'?");
  EXPECT_HAS(
      error_of(
          R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"bettas": [0.9, 0.9]}}})"),
      "did you mean 'optimizer.params.betas'?");
}

TEST(ConfigUnknown, MisplacedKeyPointsToItsSection) {
  auto msg = error_of(R"({"train_batch_size": 8, "hysteresis": 4})");
  EXPECT_HAS(msg, "unknown key 'hysteresis'");
  EXPECT_HAS(msg, "did you mean 'fp16.hysteresis'?");
}

TEST(ConfigUnknown, NothingCloseListsValidKeys) {
  auto msg = error_of(R"({"train_batch_size": 8, "aio": {"zzzzzzzz": 1}})");
  EXPECT_HAS(msg, "unknown key 'aio.zzzzzzzz'");
  EXPECT_HAS(msg, "valid keys in aio are block_size, intra_op_parallelism");
  EXPECT_EQ(msg.find("thread_count"), std::string::npos)
      << msg;  // old spellings are not advertised
}

TEST(ConfigUnknown, AllUnknownKeysReportedTogether) {
  auto msg = error_of(R"({"train_batch_size": 8, "foo_bar_baz": 1, "fp16": {"enabld": true}})");
  EXPECT_HAS(msg, "2 unknown keys");
  EXPECT_HAS(msg, "foo_bar_baz");
  EXPECT_HAS(msg, "fp16.enabld");
}

// ---- types and ranges -------------------------------------------------------------------------

TEST(ConfigTypes, WrongTypeNamesKeyValueAndAllowed) {
  auto msg = error_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": "two"}})");
  EXPECT_HAS(
      msg,
      "[config] zero_optimization.stage: expected an integer in [0, 3], got \"two\" (a string)");
  // "yes" is a boolean to pydantic (DeepSpeed takes it); "sure" is not.
  msg = error_of(R"({"train_batch_size": 8, "fp16": {"enabled": "sure"}})");
  EXPECT_HAS(msg, "fp16.enabled: expected true or false, got \"sure\"");
  msg = error_of(
      R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"betas": [0.9]}}})");
  EXPECT_HAS(msg, "optimizer.params.betas: expected a list of two numbers");
  msg = error_of(R"({"train_batch_size": 8, "zero_optimization": {"reduce_bucket_size": 5.5}})");
  EXPECT_HAS(msg, "zero_optimization.reduce_bucket_size: expected an integer >= 0, got 5.5");
  msg = error_of(R"({"train_batch_size": 8, "fp16": 1})");
  EXPECT_HAS(msg, "fp16: expected an object, got 1 (an integer)");
}

TEST(ConfigTypes, OutOfRangeNamesKeyValueAndAllowed) {
  auto msg = error_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": 4}})");
  EXPECT_HAS(msg, "[config] zero_optimization.stage = 4 is not allowed");
  EXPECT_HAS(msg, "allowed is an integer in [0, 3]");
  msg = error_of(R"({"train_batch_size": 8, "fp16": {"hysteresis": 0}})");
  EXPECT_HAS(msg, "fp16.hysteresis = 0 is not allowed");
  msg = error_of(R"({"train_batch_size": 8, "gradient_clipping": -1.0})");
  EXPECT_HAS(msg, "gradient_clipping = -1.0 is not allowed");
  EXPECT_HAS(msg, "a number >= 0");
  msg = error_of(R"({"train_batch_size": 8, "fp16": {"min_loss_scale": 0}})");
  EXPECT_HAS(msg, "a number > 0");
  msg = error_of(
      R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"betas": [0.9, 1.5]}}})");
  EXPECT_HAS(msg, "optimizer.params.betas = [0.9,1.5] is not allowed");
}

TEST(ConfigTypes, ChoicesListAllowedValues) {
  auto msg = error_of(R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR",
                          "params": {"warmup_type": "cosine"}}})");
  EXPECT_HAS(msg, "scheduler.params.warmup_type = \"cosine\" is not allowed");
  EXPECT_HAS(msg, "one of \"log\" or \"linear\"");
  msg = error_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2,
                     "offload_optimizer": {"device": "gpu"}}})");
  EXPECT_HAS(msg, "\"none\", \"cpu\" or \"nvme\"");
  msg = error_of(R"({"train_batch_size": 8, "communication_data_type": "fp8"})");
  EXPECT_HAS(msg, "communication_data_type = \"fp8\"");
  msg = error_of(R"({"train_batch_size": 8, "scheduler": {"type": "WarmupCosine"}})");
  EXPECT_HAS(msg, "did you mean \"WarmupCosineLR\"?");
}

TEST(ConfigTypes, FloatWrittenSizesAccepted) {
  auto c = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2,
                     "reduce_bucket_size": 5e8, "allgather_bucket_size": 2e8}})");
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 500000000);
  EXPECT_EQ(c.zero_optimization.allgather_bucket_size, 200000000);
}

TEST(ConfigTypes, RequiredSchedulerParams) {
  EXPECT_HAS(error_of(R"({"train_batch_size": 8, "scheduler": {"type": "WarmupDecayLR"}})"),
             "scheduler.params.total_num_steps is required for WarmupDecayLR");
  EXPECT_HAS(error_of(R"({"train_batch_size": 8, "scheduler": {"type": "OneCycle",
                          "params": {"cycle_min_lr": 1e-4}}})"),
             "cycle_max_lr are required for OneCycle");
}

// ---- cross-section rules ----------------------------------------------------------------------

TEST(ConfigRules, Fp16AndBf16TogetherIsAnError) {
  auto msg =
      error_of(R"({"train_batch_size": 8, "fp16": {"enabled": true}, "bf16": {"enabled": true}})");
  EXPECT_HAS(msg, "fp16.enabled and bf16.enabled are both true");
}

TEST(ConfigRules, MaxGradNormInOptimizerPointsToGradientClipping) {
  auto msg = error_of(R"({"train_batch_size": 8,
                          "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "max_grad_norm": 1.0}}})");
  EXPECT_HAS(msg, "optimizer.params.max_grad_norm");
  EXPECT_HAS(msg, "\"gradient_clipping\": 1.0");
}

TEST(ConfigRules, ZeroRefusesUntestedOptimizers) {
  auto msg = error_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2},
                          "optimizer": {"type": "Lamb"}})");
  EXPECT_HAS(msg, "optimizer Lamb is not supported with ZeRO (stage 2)");
  EXPECT_HAS(msg, "zero_allow_untested_optimizer");
  EXPECT_HAS(msg, "runs Lamb exactly");
  EXPECT_EQ(error_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2},
                         "zero_allow_untested_optimizer": true, "optimizer": {"type": "Lamb"}})"),
            "");
  for (const char* ok : {"Adam", "AdamW", "Adagrad", "Lion"}) {
    EXPECT_EQ(error_of(fmt::format(R"({{"train_batch_size": 8, "zero_optimization": {{"stage": 3}},
                                        "optimizer": {{"type": "{}"}}}})",
                                   ok)),
              "")
        << ok;
  }
  EXPECT_EQ(error_of(R"({"train_batch_size": 8, "optimizer": {"type": "SGD"}})"), "");  // stage 0
}

// deepspeed.cpp's own offload keys: on by default, each one turned off alone.
TEST(ConfigRules, OffloadSchedulingKeys) {
  auto d = parse(R"({"train_batch_size": 8})");
  const auto& o = d.zero_optimization.offload_optimizer;
  EXPECT_TRUE(o.overlap_step && o.step_in_backward && o.prefetch_in_backward &&
              o.download_in_backward);
  EXPECT_TRUE(d.aio.use_direct_io);
  auto c = parse(R"({"train_batch_size": 8, "aio": {"use_direct_io": false},
                     "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme",
                       "nvme_path": "/tmp", "overlap_step": false, "step_in_backward": "false",
                       "prefetch_in_backward": false, "download_in_backward": false}}})");
  const auto& f = c.zero_optimization.offload_optimizer;
  EXPECT_FALSE(f.overlap_step || f.step_in_backward || f.prefetch_in_backward ||
               f.download_in_backward);
  EXPECT_FALSE(c.aio.use_direct_io);
  EXPECT_HAS(error_of(R"({"train_batch_size": 8, "aio": {"use_direct_io": 2}})"),
             "aio.use_direct_io");
}

TEST(ConfigRules, OffloadChecks) {
  // DeepSpeed refuses ratio < 1 below stage 3; the NVMe store works at every stage, and ratio
  // means nothing without NVMe: a warning, not silence.
  auto w = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2,
                          "offload_optimizer": {"device": "cpu", "ratio": 0.5}}})");
  EXPECT_TRUE(has_warning(w, "ratio = 0.5 has no effect unless device is \"nvme\""));
  auto msg = error_of(R"({"train_batch_size": 8, "optimizer": {"type": "Lamb"},
                     "zero_allow_untested_optimizer": true, "zero_optimization": {"stage": 2,
                     "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"}}})");
  EXPECT_HAS(msg, "needs the Adam or AdamW optimizer");
  w = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 1,
                "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp", "pipeline_write": false}}})");
  EXPECT_TRUE(w.zero_optimization.offload_optimizer.pipeline_read);  // ours overlaps by default
  EXPECT_FALSE(w.zero_optimization.offload_optimizer.pipeline_write);
  EXPECT_TRUE(w.warnings.empty()) << fmt::format("{}", fmt::join(w.warnings, "\n"));
  msg = error_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
                     "offload_param": {"device": "nvme"}}})");
  EXPECT_HAS(msg, "offload_param.nvme_path is required");
  auto c = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2,
                     "offload_param": {"device": "cpu"}}})");
  EXPECT_TRUE(has_warning(c, "offload_param has no effect below stage 3"));
  c = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
                "offload_optimizer": {"device": "cpu", "pin_memory": true},
                "offload_param": {"device": "cpu"}}})");
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, config::OffloadDevice::CPU);
  EXPECT_TRUE(c.zero_optimization.offload_optimizer.pin_memory);
  EXPECT_EQ(c.zero_optimization.offload_param.device, config::OffloadDevice::CPU);
  // CPU offload: the user is told once per section what it does, never silently ignored.
  EXPECT_EQ(c.warnings.size(), 2u) << fmt::format("{}", fmt::join(c.warnings, "\n"));
  EXPECT_TRUE(has_warning(c, "offload_optimizer.device = \"cpu\": the optimizer state is in host "
                             "memory already"));
  EXPECT_TRUE(has_warning(c, "offload_param.device = \"cpu\": parameter offload to host memory is "
                             "not implemented"));
  // The guides' NVMe configs set pin_memory: it does nothing without an accelerator, and says so.
  c = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
                "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp", "pin_memory": true},
                "offload_param": {"device": "nvme", "nvme_path": "/tmp", "pin_memory": false}}})");
  EXPECT_EQ(c.warnings.size(), 1u) << fmt::format("{}", fmt::join(c.warnings, "\n"));
  EXPECT_TRUE(has_warning(c, "offload_optimizer.pin_memory = true has no effect"));
}

TEST(ConfigRules, CommunicationDtypeFollowsTraining) {
  auto c = parse(R"({"train_batch_size": 8, "fp16": {"enabled": true}})");
  EXPECT_EQ(c.communication_data_type, ds::DType::f16);
  EXPECT_EQ(entry(c, "communication_data_type").origin, config::Origin::Derived);
  c = parse(R"({"train_batch_size": 8, "bf16": {"enabled": true}, "communication_data_type": "fp32",
                "data_types": {"grad_accum_dtype": "fp32"}})");
  EXPECT_EQ(c.communication_data_type, ds::DType::f32);
  EXPECT_EQ(c.training_dtype(), ds::DType::bf16);
  EXPECT_EQ(c.data_types.grad_accum_dtype, ds::DType::f32);
}

TEST(ConfigRules, OneCycleWithoutBetasDisablesMomentum) {
  auto c = parse(R"({"train_batch_size": 8, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
                     "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.01, "cycle_max_lr": 0.1}}})");
  EXPECT_FALSE(std::get<config::OneCycleParams>(c.scheduler.params).cycle_momentum);
  EXPECT_TRUE(has_warning(c, "cycle_momentum is disabled"));
  EXPECT_EQ(std::get<config::OneCycleParams>(c.scheduler.params).cycle_second_step_size, 2000);
}

TEST(ConfigRules, ActivationCheckpointingSectionSaysWhatItDoes) {
  // Every key of the section works (runtime/activation_stash.h): no warning.
  auto c = parse(R"({"train_batch_size": 8, "activation_checkpointing": {"cpu_checkpointing": true,
                     "synchronize_checkpoint_boundary": true}})");
  EXPECT_TRUE(c.activation_checkpointing.cpu_checkpointing);
  EXPECT_TRUE(c.activation_checkpointing.synchronize_checkpoint_boundary);
  EXPECT_TRUE(c.warnings.empty()) << fmt::format("{}", fmt::join(c.warnings, "\n"));
  c = parse(R"({"train_batch_size": 8, "activation_checkpointing": {"partition_activations": true,
                "contiguous_memory_optimization": true, "number_checkpoints": 4}})");
  EXPECT_TRUE(c.warnings.empty()) << fmt::format("{}", fmt::join(c.warnings, "\n"));
  EXPECT_EQ(c.activation_checkpointing.number_checkpoints, 4);
  c = parse(R"({"train_batch_size": 8, "activation_checkpointing": {"number_checkpoints": 4}})");
  EXPECT_TRUE(has_warning(c, "number_checkpoints = 4 has no effect without "
                             "contiguous_memory_optimization"));
  c = parse(R"({"train_batch_size": 8, "activation_checkpointing": {"profile": true}})");
  EXPECT_TRUE(c.activation_checkpointing.profile);
  EXPECT_TRUE(c.warnings.empty()) << fmt::format("{}", fmt::join(c.warnings, "\n"));
  // DeepSpeed's checkpointing.configure() asserts both.
  EXPECT_HAS(error_of(R"({"train_batch_size": 8, "activation_checkpointing":
                         {"contiguous_memory_optimization": true, "number_checkpoints": 4}})"),
             "needs activation_checkpointing.partition_activations = true");
  EXPECT_HAS(error_of(R"({"train_batch_size": 8, "activation_checkpointing":
                         {"contiguous_memory_optimization": true, "partition_activations": true}})"),
             "needs activation_checkpointing.number_checkpoints");
}

// ---- accepted but not implemented -------------------------------------------------------------

TEST(ConfigWarnings, OneWarningPerUnimplementedKey) {
  auto c = parse(R"({
    "train_batch_size": 8,
    "tensorboard": {"enabled": true, "output_path": "tb/"},
    "flops_profiler": {"enabled": true, "profile_step": 3},
    "zero_optimization": {"stage": 3, "zero_quantized_weights": true, "zero_hpz_partition_size": 8,
                          "offload_optimizer": {"device": "cpu", "nvme_path": "/local_nvme"}},
    "optimizer": {"type": "MuAdam", "params": {"lr": 1e-3}},
    "autotuning": {"enabled": true, "fast": true},
    "zero_allow_untested_optimizer": true
  })");
  for (const char* key :
       {"zero_optimization.offload_optimizer.device = \"cpu\"", "autotuning"}) {
    int n = 0;
    for (const auto& w : c.warnings) n += w.find(key) != std::string::npos;
    EXPECT_EQ(n, 1) << key;
  }
  // TensorBoard (ds/runtime/tensorboard_monitor.h), the flops profiler
  // (ds/runtime/flops_profiler.h), ZeRO++'s qwZ and hpZ at stage 3 (docs/zero.md) and muP's
  // MuAdam (ds/optim/mup.h) are implemented: no warning.
  for (const auto& w : c.warnings)
    for (const char* done :
         {"tensorboard", "flops_profiler", "zero_quantized_weights", "hpz", "MuAdam"})
      EXPECT_EQ(w.find(done), std::string::npos) << w;
  EXPECT_EQ(c.warnings.size(), 2u) << fmt::format("{}", fmt::join(c.warnings, "\n"));
  for (const auto& w : c.warnings) EXPECT_EQ(w.rfind("[config] ", 0), 0u) << w;
  EXPECT_EQ(c.optimizer.type, config::OptimizerType::MuAdam);
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, config::OffloadDevice::CPU);
  EXPECT_EQ(c.zero_optimization.offload_optimizer.nvme_path, "/local_nvme");
  EXPECT_EQ(c.flops_profiler.profile_step, 3);

  std::FILE* f = std::tmpfile();
  config::print_config_warnings(c, f);
  std::rewind(f);
  char buf[8192] = {};
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  std::string printed(buf, n);
  EXPECT_EQ(std::count(printed.begin(), printed.end(), '\n'), 2);
  EXPECT_HAS(printed, "autotuning");
}

// Issue 34's acceptance: a config that turns on every section it covered (monitors, the flops
// profiler, Muon or a 1-bit optimizer, ZeRO++, MiCS, the activation-checkpointing section) parses
// without a single warning.
TEST(ConfigWarnings, EverySectionOnStartsWithoutAWarning) {
  const std::string common = R"(
    "train_batch_size": 16, "train_micro_batch_size_per_gpu": 2,
    "tensorboard": {"enabled": true, "output_path": "tb/", "job_name": "run"},
    "csv_monitor": {"enabled": true, "output_path": "csv/"},
    "flops_profiler": {"enabled": true, "profile_step": 2, "module_depth": 2, "top_modules": 3,
                       "detailed": true, "output_file": "profile.txt", "recompute_fwd_factor": 1.0},
    "activation_checkpointing": {"partition_activations": true, "cpu_checkpointing": true,
      "contiguous_memory_optimization": true, "number_checkpoints": 4,
      "synchronize_checkpoint_boundary": true, "profile": true},
    "comms_logger": {"enabled": true})";
  const auto zero3 = parse(fmt::format(R"({{{},
    "optimizer": {{"type": "Muon", "params": {{"lr": 1e-3, "muon_lr": 0.02, "adam_lr": 3e-4}}}},
    "zero_optimization": {{"stage": 3, "zero_quantized_weights": true,
      "zero_quantized_gradients": true, "zero_hpz_partition_size": 2, "mics_shard_size": 4}}}})",
                                       common));
  EXPECT_TRUE(zero3.warnings.empty()) << fmt::format("{}", fmt::join(zero3.warnings, "\n"));
  for (const auto& [type, freeze] : {std::pair<const char*, const char*>{"OneBitAdam", "freeze_step"},
                                     {"ZeroOneAdam", "var_freeze_step"},
                                     {"OneBitLamb", "freeze_step"}}) {
    const auto onebit = parse(fmt::format(R"({{{},
      "optimizer": {{"type": "{}", "params": {{"lr": 1e-3, "{}": 10}}}},
      "zero_optimization": {{"stage": 0}}}})",
                                          common, type, freeze));
    EXPECT_TRUE(onebit.warnings.empty()) << type << ": " << fmt::format("{}", fmt::join(onebit.warnings, "\n"));
  }
  const auto mup = parse(fmt::format(R"({{{},
    "optimizer": {{"type": "MuAdamW", "params": {{"lr": 1e-3}}}},
    "zero_optimization": {{"stage": 2}}, "zero_allow_untested_optimizer": true}})",
                                     common));
  EXPECT_TRUE(mup.warnings.empty()) << fmt::format("{}", fmt::join(mup.warnings, "\n"));
}

// The sections DeepSpeed 0.19 removed are refused whatever their value, as DeepSpeed refuses them.
TEST(ConfigWarnings, SectionsDeepSpeedRemovedAreRefused) {
  for (const char* key : {"elasticity", "amp", "nebula", "sparse_attention", "graph_harvesting",
                          "sparse_gradients", "progressive_layer_drop", "curriculum_learning",
                          "eigenvalue", "quantize_training", "compression_training"}) {
    const std::string e =
        error_of(fmt::format(R"({{"train_batch_size": 8, "{}": {{"enabled": false}}}})", key));
    EXPECT_HAS(e, fmt::format("[config] {} in", key));
    EXPECT_HAS(e, "DeepSpeed 0.19 removed");
    EXPECT_HAS(e, "remove the key");
  }
}

// ZeRO++'s weight keys act on stage 3's gathers: below it they warn; quantizing frozen weights has
// nothing to act on (frozen parameters are not partitioned here).
TEST(ConfigWarnings, ZeroPlusPlusKeysOutsideStage3Warn) {
  auto c = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2,
    "zero_quantized_weights": true, "zero_hpz_partition_size": 2,
    "zero_quantized_nontrainable_weights": true, "mics_shard_size": 2,
    "mics_hierarchical_params_gather": true}})");
  ASSERT_EQ(c.warnings.size(), 5u) << fmt::format("{}", fmt::join(c.warnings, "\n"));
  EXPECT_HAS(c.warnings[0], "zero_quantized_weights has no effect below stage 3 (stage is 2)");
  EXPECT_HAS(c.warnings[1], "zero_hpz_partition_size has no effect below stage 3");
  EXPECT_HAS(c.warnings[2], "mics_shard_size has no effect below stage 3");
  EXPECT_HAS(c.warnings[3], "mics_hierarchical_params_gather = true changes nothing");
  EXPECT_HAS(c.warnings[4], "zero_quantized_nontrainable_weights = true changes nothing");
}

// LoCo was removed from DeepSpeed 0.19, which refuses its key: so does deepspeed.cpp.
TEST(ConfigWarnings, LocoIsRefusedAsDeepSpeedRefusesIt) {
  const std::string e = error_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
    "zero_quantized_gradients": true, "zeropp_loco_param": {"err_beta": 0.8, "reset_T": 1024}}})");
  EXPECT_HAS(e, "zero_optimization.zeropp_loco_param");
  EXPECT_HAS(e, "remove the key");
}

// W&B and Comet have no C++ client: enabling them stops the parse with a message that names the
// alternatives, instead of a warning while the run logs nowhere the user looks.
TEST(ConfigWarnings, WandbAndCometAreRefusedWithTheAlternatives) {
  const std::string wandb =
      error_of(R"({"train_batch_size": 8, "wandb": {"enabled": true, "project": "x"}})");
  EXPECT_HAS(wandb, "wandb.enabled = true");
  EXPECT_HAS(wandb, "\"tensorboard\"");
  EXPECT_HAS(wandb, "csv_monitor");
  EXPECT_HAS(wandb, "wandb sync --sync-tensorboard");
  const std::string comet = error_of(R"({"train_batch_size": 8, "comet": {"enabled": true}})");
  EXPECT_HAS(comet, "comet.enabled = true");
  EXPECT_HAS(comet, "\"tensorboard\"");
  EXPECT_HAS(comet, "csv_monitor");
  // Disabled sections keep their keys (a config shared with DeepSpeed), without a warning.
  auto c = parse(R"({"train_batch_size": 8, "wandb": {"enabled": false, "team": "t"},
                     "comet": {"enabled": false, "samples_log_interval": 50}})");
  EXPECT_TRUE(c.warnings.empty()) << fmt::format("{}", fmt::join(c.warnings, "\n"));
  EXPECT_EQ(c.comet.samples_log_interval, 50);
}

TEST(ConfigWarnings, DisabledOrDefaultValuesDoNotWarn) {
  auto c = parse(R"({"train_batch_size": 8, "tensorboard": {"enabled": false, "output_path": "x"},
                     "autotuning": {"enabled": false}, "flops_profiler": {"enabled": false},
                     "zero_optimization": {"zero_quantized_weights": false, "zero_hpz_partition_size": 1},
                     "hybrid_engine": {}, "csv_monitor": {"enabled": true, "output_path": "logs/"},
                     "comms_logger": {"enabled": true, "prof_ops": ["all_reduce"]}})");
  EXPECT_TRUE(c.warnings.empty()) << fmt::format("{}", fmt::join(c.warnings, "\n"));
  EXPECT_TRUE(c.csv_monitor.enabled);
  EXPECT_EQ(c.comms_logger.prof_ops, std::vector<std::string>{"all_reduce"});
}

// ---- deprecated spellings ---------------------------------------------------------------------

TEST(ConfigDeprecated, CpuOffloadFlags) {
  auto c = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "cpu_offload": true,
                     "cpu_offload_param": true, "cpu_offload_use_pin_memory": true}})");
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, config::OffloadDevice::CPU);
  EXPECT_EQ(c.zero_optimization.offload_param.device, config::OffloadDevice::CPU);
  EXPECT_TRUE(c.zero_optimization.offload_optimizer.pin_memory);
  EXPECT_TRUE(c.zero_optimization.offload_param.pin_memory);
  EXPECT_TRUE(has_warning(c, "zero_optimization.cpu_offload is deprecated"));
  EXPECT_HAS(entry(c, "zero_optimization.offload_optimizer.device").note, "cpu_offload");
  c = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "cpu_offload": false}})");
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, config::OffloadDevice::None);
  EXPECT_HAS(
      error_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "cpu_offload": true,
                          "offload_optimizer": {"device": "cpu"}}})"),
      "are both given");
}

TEST(ConfigDeprecated, Stage3PrefixOptional) {
  auto c = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
                     "prefetch_bucket_size": 1234, "param_persistence_threshold": 55,
                     "max_live_parameters": 77, "max_reuse_distance": 88,
                     "gather_16bit_weights_on_model_save": true}})");
  EXPECT_EQ(c.zero_optimization.stage3_prefetch_bucket_size, 1234);
  EXPECT_EQ(c.zero_optimization.stage3_param_persistence_threshold, 55);
  EXPECT_EQ(c.zero_optimization.stage3_max_live_parameters, 77);
  EXPECT_EQ(c.zero_optimization.stage3_max_reuse_distance, 88);
  EXPECT_TRUE(c.zero_optimization.stage3_gather_16bit_weights_on_model_save);
  EXPECT_TRUE(c.warnings.empty());  // both spellings are current in DeepSpeed
  EXPECT_HAS(error_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
                          "prefetch_bucket_size": 1, "stage3_prefetch_bucket_size": 2}})"),
             "zero_optimization.stage3_prefetch_bucket_size is given twice");
}

TEST(ConfigDeprecated, OldSpellings) {
  auto c = parse(R"({"train_batch_size": 8, "bfloat16": {"enabled": true},
                     "zero_optimization": {"stage": 3, "stage3_gather_fp16_weights_on_model_save": true},
                     "aio": {"thread_count": 4}})");
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_TRUE(c.zero_optimization.stage3_gather_16bit_weights_on_model_save);
  EXPECT_EQ(c.aio.intra_op_parallelism, 4);
  EXPECT_TRUE(has_warning(c, "bfloat16"));
  EXPECT_TRUE(has_warning(c, "aio.thread_count"));
  EXPECT_TRUE(has_warning(c, "stage3_gather_fp16_weights_on_model_save"));
  EXPECT_HAS(
      error_of(
          R"({"train_batch_size": 8, "bfloat16": {"enabled": true}, "bf16": {"enabled": true}})"),
      "bf16 is given twice");
  c = parse(R"({"train_batch_size": 8, "zero_optimization": true, "allgather_size": 1000})");
  EXPECT_EQ(c.zero_optimization.stage, 1);
  EXPECT_EQ(c.zero_optimization.allgather_bucket_size, 1000);
}

// ---- lenient JSON -----------------------------------------------------------------------------

TEST(ConfigJson, CommentsAndTrailingCommas) {
  auto c = parse(R"({
    // the batch
    "train_batch_size": 16, /* per step, all ranks */
    "optimizer": {"type": "AdamW", "params": {"betas": [0.9, 0.95,], "lr": 1e-4,},},
    "csv_monitor": {"enabled": true, "output_path": "a,}b // not a comment, ]",},
  })");
  EXPECT_EQ(c.batch.train_batch_size, 16);
  EXPECT_EQ(c.optimizer.betas[1], 0.95);
  EXPECT_EQ(c.csv_monitor.output_path, "a,}b // not a comment, ]");
}

TEST(ConfigJson, DuplicateKeysAreAnError) {
  EXPECT_HAS(error_of(R"({"train_batch_size": 8, "fp16": {"enabled": true, "enabled": false}})"),
             "key 'fp16.enabled' appears twice");
  EXPECT_HAS(error_of(R"({"train_batch_size": 8, "train_batch_size": 16})"),
             "key 'train_batch_size' appears twice");
  // The same key in different objects is fine.
  EXPECT_EQ(
      error_of(R"({"train_batch_size": 8, "fp16": {"enabled": false}, "bf16": {"enabled": true}})"),
      "");
}

TEST(ConfigJson, StripTrailingCommas) {
  EXPECT_EQ(config::strip_trailing_commas(R"({"a": [1, 2,], })"), R"({"a": [1, 2 ]  })");
  EXPECT_EQ(config::strip_trailing_commas(R"({"a": ",}"})"), R"({"a": ",}"})");
  EXPECT_EQ(config::strip_trailing_commas("{\"a\": 1, // c,\n}"), "{\"a\": 1  // c,\n}");
  EXPECT_EQ(config::strip_trailing_commas(R"({"a": "x\",}", "b": 2,})"), R"({"a": "x\",}", "b": 2 })");
  EXPECT_EQ(config::strip_trailing_commas("[1, /* , */ 2, /* x */ ]"), "[1, /* , */ 2  /* x */ ]");
}

TEST(ConfigJson, FilePathAndSyntaxErrors) {
  auto dir =
      std::filesystem::temp_directory_path() / ("ds_config_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto path = (dir / "ds_config.json").string();
  {
    std::ofstream(path)
        << "{\n  \"train_batch_size\": 8,\n  // comment\n  \"fp16\": {\"enabled\": true,},\n}\n";
  }
  auto c = config::parse_config(path);
  EXPECT_TRUE(c.fp16.enabled);
  EXPECT_EQ(c.source, path);
  { std::ofstream(path) << "{\n  \"train_batch_size\": 8\n  \"fp16\": {}\n}\n"; }
  auto msg = error_of(path);
  EXPECT_HAS(msg, "[config] " + path + ": invalid JSON at line 3");
  { std::ofstream(path) << "{\"train_batch_size\": 8, \"fp16\": {\"enabld\": true}}"; }
  EXPECT_HAS(error_of(path), "in " + path);  // messages name the file
  EXPECT_HAS(error_of((dir / "missing.json").string()), "no such file");
  EXPECT_HAS(error_of("[1, 2]"), "no such file");  // not an object, not a path
  config::ConfigContext named;
  named.source_name = "trainer --deepspeed_config";
  EXPECT_HAS(error_of(R"({"train_batch_size": 0})", named), "trainer --deepspeed_config");
  std::filesystem::remove_all(dir);
}

TEST(ConfigJson, ParseJsonObjectDirectly) {
  json j = {{"train_micro_batch_size_per_gpu", 2}, {"gradient_accumulation_steps", 2}};
  auto c = config::parse_config_json(j, world(8));
  EXPECT_EQ(c.batch.train_batch_size, 32);
  EXPECT_EQ(j.size(), 2u);  // the caller's object is not modified
}

TEST(ConfigJson, EditDistance) {
  EXPECT_EQ(config::edit_distance("stage3_prefetch_bucket_sze", "stage3_prefetch_bucket_size"), 1u);
  EXPECT_EQ(config::edit_distance("hysteresis", "hysteresis"), 0u);
  EXPECT_EQ(config::edit_distance("ab", "ba"), 1u);  // a transposition is one edit
  EXPECT_EQ(config::edit_distance("", "abc"), 3u);
}

// ---- effective config ------------------------------------------------------------------------

TEST(ConfigReport, EveryValueWithItsOrigin) {
  config::ConfigContext ctx;
  ctx.world_size = 2;
  ctx.args.learning_rate = 2e-4;
  auto c = parse(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
                     "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
                     "zero_optimization": {"stage": 2, "cpu_offload": true}})",
                 ctx);
  EXPECT_EQ(entry(c, "train_batch_size").origin, config::Origin::File);
  EXPECT_EQ(entry(c, "gradient_accumulation_steps").origin, config::Origin::Derived);
  EXPECT_EQ(entry(c, "optimizer.params.lr").origin, config::Origin::Auto);
  EXPECT_EQ(entry(c, "fp16.hysteresis").origin, config::Origin::Default);
  EXPECT_EQ(entry(c, "fp16.hysteresis").value, 2);
  const std::string text = config::format_effective_config(c);
  EXPECT_HAS(text, "world size 2");
  auto line_of = [&](const std::string& key) {
    auto pos = text.find("\n  " + key + " ");
    EXPECT_NE(pos, std::string::npos) << key;
    return text.substr(pos + 1, text.find('\n', pos + 1) - pos - 1);
  };
  EXPECT_HAS(line_of("train_batch_size"), "32");
  EXPECT_HAS(line_of("train_batch_size"), "file");
  EXPECT_HAS(line_of("gradient_accumulation_steps"), "derived (= 32 // 4 // 2 ranks)");
  EXPECT_HAS(line_of("optimizer.params.lr"), "auto (auto: trainer learning_rate)");
  EXPECT_HAS(line_of("zero_optimization.overlap_comm"), "default");
  EXPECT_HAS(line_of("zero_optimization.offload_optimizer.device"), "\"cpu\"");
  EXPECT_HAS(line_of("zero_optimization.offload_optimizer.device"), "cpu_offload");
  EXPECT_HAS(line_of("aio.block_size"), "1048576");
  EXPECT_HAS(line_of("communication_data_type"), "derived");
  // Every recorded value appears.
  for (const auto& e : c.effective) EXPECT_HAS(text, "\n  " + e.path + " ");
}

// ---- the shipped configs ---------------------------------------------------------------------

TEST(ConfigShipped, ReadyConfigsParse) {
  const std::string dir = std::string(DS_SOURCE_DIR) + "/configs/";
  for (const char* name : {"ds_config_zero0.json", "ds_config_zero1.json", "ds_config_zero2.json",
                           "ds_config_zero3.json", "ds_config_bf16.json", "ds_config_fp16.json"}) {
    SCOPED_TRACE(name);
    config::ConfigContext ctx;
    ctx.world_size = 2;
    ctx.hidden_size = 768;
    config::DeepSpeedConfig c;
    ASSERT_NO_THROW(c = config::parse_config(dir + name, ctx));
    EXPECT_TRUE(c.warnings.empty()) << fmt::format("{}", fmt::join(c.warnings, "\n"));
  }
  auto z3 = config::parse_config(dir + "ds_config_zero3.json", world(2));
  EXPECT_EQ(z3.zero_optimization.stage, 3);
  EXPECT_EQ(config::parse_config(dir + "ds_config_zero0.json", world(2)).training_dtype(), ds::DType::f32);
  EXPECT_TRUE(config::parse_config(dir + "ds_config_bf16.json", world(2)).bf16.enabled);
  EXPECT_TRUE(config::parse_config(dir + "ds_config_fp16.json", world(2)).fp16.enabled);
}

// ---- configs as users write them ----------------------------------------------------------------

TEST(ConfigShipped, HuggingFaceZero3TemplateWithTrainerArgs) {
  // The ZeRO-3 offload template from the Hugging Face DeepSpeed integration docs, verbatim.
  config::ConfigContext ctx = full_args();
  ctx.world_size = 8;
  auto c = config::parse_config(std::string(DS_FIXTURE_DIR) + "/config/hf_zero3_offload.json", ctx);
  EXPECT_EQ(c.batch.train_batch_size, 8 * 4 * 3);
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_EQ(c.zero_optimization.stage, 3);
  EXPECT_EQ(c.zero_optimization.offload_param.device, config::OffloadDevice::CPU);
  EXPECT_TRUE(c.zero_optimization.offload_optimizer.pin_memory);
  EXPECT_EQ(c.zero_optimization.stage3_param_persistence_threshold, 7680);
  EXPECT_EQ(c.steps_per_print, 2000);
  EXPECT_EQ(std::get<config::WarmupLRParams>(c.scheduler.params).warmup_num_steps, 100);
  // Its only warnings: CPU offload, one for each section, saying what it does here.
  EXPECT_EQ(c.warnings.size(), 2u) << fmt::format("{}", fmt::join(c.warnings, "\n"));
  for (const auto& w : c.warnings) EXPECT_HAS(w, "device = \"cpu\"");
  // Without the trainer's arguments the first unresolved "auto" is named.
  config::ConfigContext bare;
  bare.hidden_size = 768;
  EXPECT_HAS(error_of(std::string(DS_FIXTURE_DIR) + "/config/hf_zero3_offload.json", bare),
             "is \"auto\"");
}

TEST(ConfigShipped, LegacyDeepSpeedExampleConfig) {
  auto c =
      config::parse_config(std::string(DS_FIXTURE_DIR) + "/config/deepspeed_legacy_zero2.json", world(4));
  EXPECT_EQ(c.batch.train_micro_batch_size_per_gpu, 8);  // 64 // 4 // 2
  EXPECT_EQ(c.optimizer.type, config::OptimizerType::Adam);
  EXPECT_TRUE(c.optimizer.adam_w_mode);
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, config::OffloadDevice::CPU);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 200000000);
  EXPECT_TRUE(c.fp16.enabled);
  // cpu_offload: deprecated, and CPU offload's notice.
  EXPECT_EQ(c.warnings.size(), 2u) << fmt::format("{}", fmt::join(c.warnings, "\n"));
}

// ---- issue 12: what a new user tripped over ---------------------------------------------------

TEST(ConfigFile, PathsThatAreNotRegularFilesSayWhatTheyAre) {
  const std::string dir = ::testing::TempDir() + "ds_config_dir";
  std::filesystem::create_directories(dir);
  EXPECT_HAS(error_of(dir), "it is a directory, not a regular file");
  EXPECT_HAS(error_of("/dev/zero"), "it is a character device");
  // A FIFO is refused by its type, never opened (opening would block until a writer appears).
  const std::string fifo = ::testing::TempDir() + "ds_config_fifo";
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_HAS(error_of(fifo), "it is a FIFO");
  std::filesystem::remove(fifo);
  EXPECT_HAS(error_of(::testing::TempDir() + "no_such_config.json"), "no such file");
}

TEST(ConfigJson, DeepNestingIsRefusedNotACrash) {
  std::string deep = R"({"train_batch_size": 8, "x": )";
  for (int i = 0; i < 100000; ++i) deep += "[";
  for (int i = 0; i < 100000; ++i) deep += "]";
  deep += "}";
  EXPECT_HAS(error_of(deep), "nest 100001 levels deep");
  // Brackets inside strings and comments do not count.
  auto c = parse(R"({"train_batch_size": 8, /* [[[[ */ "csv_monitor": {"job_name": "[[[[[["}})");
  EXPECT_EQ(c.csv_monitor.job_name, "[[[[[[");
}

TEST(ConfigRules, NullIsRefusedWhereDeepSpeedRefusesIt) {
  EXPECT_HAS(error_of(R"({"train_batch_size": 8, "gradient_clipping": null})"),
             "gradient_clipping is null");
  EXPECT_HAS(error_of(R"({"train_batch_size": 8, "optimizer": {"type": "AdamW",
                         "params": {"lr": null}}})"),
             "optimizer.params.lr is null");
  EXPECT_HAS(error_of(R"({"train_batch_size": 8, "fp16": null})"), "fp16 is null");
  // DeepSpeed's Optional fields: null means "not set".
  auto c = parse(R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": null,
                     "zero_optimization": {"stage": 2, "offload_optimizer": null},
                     "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4,
                       "cycle_max_lr": 1e-3, "cycle_second_step_size": null}}})");
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, config::OffloadDevice::None);
  EXPECT_EQ(std::get<config::OneCycleParams>(c.scheduler.params).cycle_second_step_size, 2000);
}

// DeepSpeed's pydantic sections (zero_optimization, fp16, bf16, the monitors) coerce in lax mode,
// so the Accelerate guide's `"enabled": "true"` runs there: take it the same way and say so.
TEST(ConfigRules, PydanticSectionsTakeQuotedBooleansAndNumbersAsDeepSpeedDoes) {
  auto c = parse(R"({"train_batch_size": 8, "bf16": {"enabled": "true"},
                     "zero_optimization": {"stage": "2", "overlap_comm": "False",
                       "contiguous_gradients": 0, "reduce_bucket_size": "5e8",
                       "allgather_bucket_size": " 200000000 "}})");
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_EQ(c.zero_optimization.stage, 2);
  EXPECT_FALSE(c.zero_optimization.contiguous_gradients);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 500000000);
  EXPECT_EQ(c.zero_optimization.allgather_bucket_size, 200000000);
  EXPECT_HAS(entry(c, "bf16.enabled").note, "DeepSpeed (pydantic) takes it as true");
  EXPECT_HAS(entry(c, "zero_optimization.overlap_comm").note, "takes it as false");
  EXPECT_HAS(entry(c, "zero_optimization.reduce_bucket_size").note, "as a number");
  EXPECT_EQ(entry(c, "zero_optimization.stage").value, 2);
  EXPECT_FALSE(parse(R"({"train_batch_size": 8, "fp16": {"enabled": "off"}})").fp16.enabled);
  // What pydantic refuses stays refused: other strings, other integers, fractions for integers.
  EXPECT_HAS(error_of(R"({"train_batch_size": 8, "bf16": {"enabled": "maybe"}})"),
             "bf16.enabled");
  EXPECT_HAS(error_of(R"({"train_batch_size": 8, "bf16": {"enabled": 2}})"), "bf16.enabled");
  EXPECT_HAS(error_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": "2.5"}})"),
             "zero_optimization.stage");
  EXPECT_HAS(error_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": "two"}})"),
             "zero_optimization.stage");
}

// Outside those sections DeepSpeed reads the raw value (get_scalar_param), where a quoted "false"
// is a non-empty string and so true: refuse it rather than guess.
TEST(ConfigRules, QuotedBooleanOutsidePydanticSectionsSaysToDropTheQuotes) {
  EXPECT_HAS(error_of(R"({"train_batch_size": 8, "prescale_gradients": "false"})"),
             "write false without quotes");
  EXPECT_HAS(error_of(R"({"train_batch_size": "8"})"), "train_batch_size");
}

TEST(ConfigRules, JobNameCannotLeaveOutputPath) {
  for (const char* bad : {"../escape", "a/b", "..", "."})
    EXPECT_HAS(error_of(fmt::format(R"({{"train_batch_size": 8, "csv_monitor":
                                        {{"enabled": true, "job_name": "{}"}}}})",
                                    bad)),
               "csv_monitor.job_name");
}

TEST(ConfigRules, Fp32OptimizerStatesFalseWarns) {
  auto c = parse(R"({"train_batch_size": 8, "optimizer": {"type": "AdamW",
                     "params": {"fp32_optimizer_states": false}}})");
  EXPECT_TRUE(has_warning(c, "fp32_optimizer_states = false"));
}

// ---- what a trainer reads before the one parse (ds::train::plan_run) --------------------------

TEST(ConfigTrainer, ParallelSizesAreTheTypedSections) {
  const auto s = ds::config::read_parallel_sizes(
      json::parse(R"({"train_batch_size": 8, "tensor_parallel": {"autotp_size": 2},
                      "pipeline": {"stages": 3, "partition": "uniform"}})"),
      "t.json");
  EXPECT_EQ(s.tensor_parallel.size, 2);
  EXPECT_EQ(s.pipeline.stages, 3);
  EXPECT_EQ(s.pipeline.partition, "uniform");
  const auto none =
      ds::config::read_parallel_sizes(json::parse(R"({"pipeline": {"partition": "uniform"}})"), "");
  EXPECT_EQ(none.tensor_parallel.size, 1);
  EXPECT_EQ(none.pipeline.stages, 0);
  // The same checks as the whole parse.
  try {
    ds::config::read_parallel_sizes(json::parse(R"({"pipeline": {"partition": "bogus"}})"),
                                    "t.json");
    FAIL();
  } catch (const ds::Error& e) {
    EXPECT_HAS(e.what(), "pipeline.partition = \"bogus\"");
  }
}

TEST(ConfigTrainer, BatchSizesAloneFollowTheRules) {
  config::ConfigContext ctx = world(2);
  ctx.args.per_device_train_batch_size = 4;
  ctx.args.gradient_accumulation_steps = 3;
  const auto b = ds::config::resolve_batch_sizes(
      json::parse(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
                      "gradient_accumulation_steps": "auto", "optimizer": {"type": "bogus"}})"),
      ctx);
  EXPECT_EQ(b.train_batch_size, 24);
  EXPECT_EQ(b.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(b.gradient_accumulation_steps, 3);
  // Derived as the parse derives it; the same error for a triad that does not add up.
  EXPECT_EQ(ds::config::resolve_batch_sizes(json::parse(R"({"train_batch_size": 16})"), world(2))
                .train_micro_batch_size_per_gpu,
            8);
  try {
    ds::config::resolve_batch_sizes(
        json::parse(R"({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 2,
                        "gradient_accumulation_steps": 2})"),
        world(2));
    FAIL();
  } catch (const ds::Error& e) {
    EXPECT_HAS(e.what(), "train_batch_size is not equal to");
  }
}

TEST(ConfigTrainer, PipelineStagesAuto) {
  // DeepSpeed's default for pipeline.stages is "auto" (deepspeed/runtime/config.py,
  // get_pipeline_config); written out it means the same: the job decides.
  const std::string cfg = R"({"train_batch_size": 8, "pipeline": {"stages": "auto"}})";
  auto c = parse(cfg);
  EXPECT_EQ(c.pipeline.stages, 0);
  EXPECT_EQ(entry(c, "pipeline.stages").value, "auto");
  EXPECT_EQ(ds::config::read_parallel_sizes(json::parse(cfg), "t.json").pipeline.stages, 0);
  config::ConfigContext ctx;
  ctx.args.pipeline_parallel_size = 2;
  c = parse(cfg, ctx);
  EXPECT_EQ(c.pipeline.stages, 2);
  EXPECT_HAS(error_of(R"({"train_batch_size": 8, "pipeline": {"stages": "two"}})"),
             "pipeline.stages must be a number of stages or \"auto\", got \"two\"");
}

TEST(ConfigTrainer, TrainerParallelSizesSetOpenSectionsAndMustAgree) {
  config::ConfigContext ctx;
  ctx.args.tensor_parallel_size = 2;
  ctx.args.pipeline_parallel_size = 2;
  auto c = parse(R"({"train_batch_size": 8})", ctx);
  EXPECT_EQ(c.tensor_parallel.size, 2);
  EXPECT_EQ(c.pipeline.stages, 2);
  EXPECT_HAS(entry(c, "tensor_parallel.autotp_size").note, "trainer tensor_parallel_size");
  c = parse(R"({"train_batch_size": 8, "tensor_parallel": {"autotp_size": 2},
                "pipeline": {"partition": "uniform"}})",
            ctx);
  EXPECT_EQ(c.tensor_parallel.size, 2);
  EXPECT_EQ(c.pipeline.stages, 2);
  EXPECT_HAS(error_of(R"({"train_batch_size": 8, "tensor_parallel": {"autotp_size": 4}})", ctx),
             "tensor_parallel_size 2 disagrees with tensor_parallel.autotp_size 4");
  EXPECT_HAS(error_of(R"({"train_batch_size": 8, "pipeline": {"stages": 1}})", ctx),
             "pipeline_parallel_size 2 disagrees with pipeline.stages 1");
}

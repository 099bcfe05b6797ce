// LR schedules (§4): values against DeepSpeed's own Python schedulers (fixture made by
// tests/fixtures/generators/gen_schedule_fixture.py from DeepSpeed 0.19.8: lr, beta1 and beta2 at every step,
// OneCycle's stairs included) and against the formulas restated here.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <numbers>

#include "ds/core/error.h"
#include "ds/config/config.h"
#include "ds/runtime/lr_schedule.h"

using namespace ds;
using namespace ds::runtime;
using nlohmann::json;

namespace {

json load_fixture(const char* name) {
  std::ifstream in(std::string(DS_FIXTURE_DIR) + "/config/" + name);
  EXPECT_TRUE(in.good()) << "missing fixture " << name;
  return json::parse(in);
}

// The scheduler exactly as a DeepSpeed config file would describe it, through the parser.
config::DeepSpeedConfig config_for(const std::string& type, const json& params, double base_lr) {
  json root = {{"train_batch_size", 1},
               {"optimizer", {{"type", "Adam"}, {"params", {{"lr", base_lr}}}}},
               {"scheduler", {{"type", type}, {"params", params}}}};
  return config::parse_config_json(root);
}

// Python and C++ call the same libm and we keep DeepSpeed's operation order, so values agree to
// the last bit in practice; 4 ulps (EXPECT_DOUBLE_EQ) leaves room for a different libm.
void expect_lr(double want, double got, const std::string& where) {
  if (want == 0.0) {
    EXPECT_EQ(got, 0.0) << where;
  } else {
    EXPECT_DOUBLE_EQ(want, got) << where;
  }
}

}  // namespace

TEST(Schedule, MatchesDeepSpeedFixture) {
  json fx = load_fixture("schedules.json");
  ASSERT_GE(fx["cases"].size(), 10u);
  for (const auto& c : fx["cases"]) {
    const std::string name = c["name"];
    const std::string type = c["type"];
    auto cfg = config_for(type, c["params"], c["base_lr"].get<double>());
    LRScheduler s(cfg.scheduler, cfg.optimizer.lr);
    const auto& ts = c["t"];
    const bool one_cycle = type == "OneCycle";
    for (size_t i = 0; i < ts.size(); ++i) {
      const int64_t t = ts[i];
      if (t >= 0) s.step();
      ASSERT_EQ(s.last_batch_iteration(), t);
      const std::string where = fmt::format("{} at t={}", name, t);
      expect_lr(c["lr"][i].get<double>(), s.get_lr(), where);
      if (one_cycle && c["params"].value("cycle_momentum", true)) {
        ASSERT_TRUE(s.get_beta1().has_value()) << where;
        EXPECT_DOUBLE_EQ(c["beta1"][i].get<double>(), *s.get_beta1()) << where;
        EXPECT_DOUBLE_EQ(c["beta2"][i].get<double>(), LRScheduler::kOneCycleBeta2) << where;
      } else {
        EXPECT_FALSE(s.get_beta1().has_value()) << where;
      }
    }
  }
}

TEST(Schedule, OneCycleStairsOfIssue12) {
  // The staircase DeepSpeed 0.19 gives for this config (issue 12), written out by hand.
  json params = {{"cycle_min_lr", 2e-4},         {"cycle_max_lr", 3e-3},
                 {"cycle_first_step_size", 7},   {"cycle_second_step_size", 9},
                 {"cycle_first_stair_count", 3}, {"cycle_second_stair_count", 2},
                 {"decay_step_size", 3},         {"decay_lr_rate", 0.2}};
  auto cfg = config_for("OneCycle", params, 1e-3);
  LRScheduler s(cfg.scheduler, cfg.optimizer.lr);
  const double a = 2e-4, up1 = 2e-4 + 2.8e-3 / 3, up2 = 2e-4 + 2 * 2.8e-3 / 3, mid = 2e-4 + 1.4e-3;
  const std::vector<double> want = {a,   a,   a,   up1, up1, up2, up2, 3e-3, mid,
                                    mid, mid, mid, a,   a,   a,   a,   a};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(s.get_lr(), want[i], 1e-15) << "t=" << static_cast<int64_t>(i) - 1;
    s.step();
  }
}

TEST(Schedule, WarmupLRMaxDefaultsToOptimizerLr) {
  // DeepSpeed 0.19: WarmupLR without warmup_max_lr warms up to the optimizer's lr.
  auto cfg = config_for("WarmupLR", {{"warmup_num_steps", 4}, {"warmup_type", "linear"}}, 3e-4);
  EXPECT_DOUBLE_EQ(std::get<config::WarmupLRParams>(cfg.scheduler.params).warmup_max_lr, 3e-4);
  // WarmupDecayLR keeps its own default of 1e-3.
  auto dec = config_for("WarmupDecayLR", {{"total_num_steps", 10}}, 3e-4);
  EXPECT_DOUBLE_EQ(std::get<config::WarmupDecayLRParams>(dec.scheduler.params).warmup_max_lr, 1e-3);
}

TEST(Schedule, OneCycleBeta2WarnsWhenReplaced) {
  auto cfg = config_for("OneCycle", {{"cycle_min_lr", 1e-4}, {"cycle_max_lr", 1e-3}}, 1e-3);
  bool warned = false;
  for (const auto& w : cfg.warnings)
    warned = warned || w.find("beta2 to 0.99") != std::string::npos;
  EXPECT_TRUE(warned) << "Adam's default beta2 0.999 is replaced by 0.99: say so";
}

TEST(Schedule, WarmupLRFormula) {
  config::WarmupLRParams p{1e-5, 1e-3, 100, config::WarmupType::Log};
  LRScheduler s(config::SchedulerConfig{config::SchedulerType::WarmupLR, p}, 0.5);
  EXPECT_DOUBLE_EQ(s.get_lr(), 1e-5);  // t = -1: the first optimizer step runs at warmup_min_lr
  for (int64_t t : {0, 1, 9, 50, 99}) {
    s.step_to(t);
    const double gamma = std::log(t + 1.0) / std::log(100.0);
    EXPECT_NEAR(s.get_lr(), 1e-5 + (1e-3 - 1e-5) * gamma, 1e-17) << t;
  }
  for (int64_t t : {100, 101, 100000}) {
    s.step_to(t);
    EXPECT_DOUBLE_EQ(s.get_lr(), 1e-3);
  }
  p.warmup_type = config::WarmupType::Linear;
  LRScheduler lin(config::SchedulerConfig{config::SchedulerType::WarmupLR, p}, 0.5);
  lin.step_to(25);
  EXPECT_NEAR(lin.get_lr(), 1e-5 + (1e-3 - 1e-5) * 0.25, 1e-17);
}

TEST(Schedule, WarmupStepsBelowTwoUseTwo) {
  // W = max(2, warmup_num_steps): ln(W) must not be 0.
  config::WarmupLRParams p{0.0, 1.0, 0, config::WarmupType::Log};
  LRScheduler s(config::SchedulerConfig{config::SchedulerType::WarmupLR, p}, 1.0);
  s.step_to(0);
  EXPECT_DOUBLE_EQ(s.get_lr(), 0.0);
  s.step_to(1);
  EXPECT_DOUBLE_EQ(s.get_lr(), 1.0);  // ln 2 / ln 2
}

TEST(Schedule, WarmupDecayLRFormula) {
  config::WarmupDecayLRParams p{110, 0.0, 1e-3, 10, config::WarmupType::Linear};
  LRScheduler s(config::SchedulerConfig{config::SchedulerType::WarmupDecayLR, p}, 0.5);
  s.step_to(5);
  EXPECT_DOUBLE_EQ(s.get_lr(), 1e-3 * 0.5);
  s.step_to(10);
  EXPECT_DOUBLE_EQ(s.get_lr(), 1e-3);  // (110 - 10) / (110 - 10)
  s.step_to(60);
  EXPECT_DOUBLE_EQ(s.get_lr(), 1e-3 * 0.5);
  s.step_to(110);
  EXPECT_DOUBLE_EQ(s.get_lr(), 0.0);
  s.step_to(500);
  EXPECT_DOUBLE_EQ(s.get_lr(), 0.0);  // clamped at 0
}

TEST(Schedule, WarmupCosineHoldsFloorAfterEnd) {
  config::WarmupCosineLRParams p{100, 0.0, 10, 0.05, config::WarmupType::Linear};
  const double base = 2e-3;
  LRScheduler s(config::SchedulerConfig{config::SchedulerType::WarmupCosineLR, p}, base);
  EXPECT_EQ(s.get_lr(), 0.0);  // DeepSpeed's value before the first step
  s.step_to(4);
  EXPECT_DOUBLE_EQ(s.get_lr(), base * 0.4);
  // Midpoint of the cosine: s = 45, S = 90 -> ratio = floor + (1 - floor) / 2.
  s.step_to(10 + 45 - 1);
  EXPECT_NEAR(s.get_lr(), base * (0.05 + 0.95 * 0.5), 1e-15);
  for (int64_t t : {99, 100, 150, 1000}) {
    s.step_to(t);
    EXPECT_DOUBLE_EQ(s.get_lr(), base * 0.05) << t;
  }
  // Monotone non-increasing after warm-up, never below the floor.
  double prev = 1e9;
  for (int64_t t = 10; t < 300; ++t) {
    s.step_to(t);
    EXPECT_LE(s.get_lr(), prev + 1e-18) << t;
    EXPECT_GE(s.get_lr(), base * 0.05 - 1e-18) << t;
    prev = s.get_lr();
  }
}

TEST(Schedule, OneCycleLrAndMomentum) {
  config::OneCycleParams p;
  p.cycle_min_lr = 1e-4;
  p.cycle_max_lr = 1e-3;
  p.cycle_first_step_size = 10;
  p.cycle_second_step_size = 10;
  p.decay_step_size = 5;
  p.decay_lr_rate = 0.5;
  p.decay_mom_rate = 0.1;
  LRScheduler s(config::SchedulerConfig{config::SchedulerType::OneCycle, p}, 0.1);
  EXPECT_DOUBLE_EQ(s.get_lr(), 1e-4);
  EXPECT_DOUBLE_EQ(*s.get_beta1(), 0.8);  // t = -1: DeepSpeed's constructor writes cycle_min_mom
  s.step_to(9);                           // i = 10: the peak
  EXPECT_DOUBLE_EQ(s.get_lr(), 1e-3);
  EXPECT_DOUBLE_EQ(*s.get_beta1(), 0.8);
  s.step_to(14);  // i = 15: halfway down
  EXPECT_NEAR(s.get_lr(), 1e-4 + 0.9e-3 * 0.5, 1e-16);
  EXPECT_NEAR(*s.get_beta1(), 0.85, 1e-15);
  s.step_to(29);  // decay phase: d = 29 - 20 + 1 = 10 -> lr = min / (1 + 0.5 * 10 / 5)
  EXPECT_DOUBLE_EQ(s.get_lr(), 1e-4 / 2.0);
  EXPECT_DOUBLE_EQ(*s.get_beta1(), 0.9 * (1 + 0.1 * 2));
}

TEST(Schedule, LRRangeTestFormula) {
  config::LRRangeTestParams p{1e-4, 10, 3.0, false};
  LRScheduler s(config::SchedulerConfig{config::SchedulerType::LRRangeTest, p}, 0.1);
  EXPECT_DOUBLE_EQ(s.get_lr(), 1e-4);
  s.step_to(4);
  EXPECT_DOUBLE_EQ(s.get_lr(), 1e-4 * (1 + 3.0 * 0.5));
  p.lr_range_test_staircase = true;
  LRScheduler st(config::SchedulerConfig{config::SchedulerType::LRRangeTest, p}, 0.1);
  st.step_to(8);
  EXPECT_DOUBLE_EQ(st.get_lr(), 1e-4);
  st.step_to(9);
  EXPECT_DOUBLE_EQ(st.get_lr(), 1e-4 * 4.0);
}

TEST(Schedule, ConstantWithoutScheduler) {
  auto cfg = config::parse_config(
      R"({"train_batch_size": 4, "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}}})");
  EXPECT_EQ(cfg.scheduler.type, config::SchedulerType::None);
  LRScheduler s(cfg.scheduler, cfg.optimizer.lr);
  for (int i = 0; i < 5; ++i) {
    EXPECT_DOUBLE_EQ(s.get_lr(), 3e-4);
    s.step();
  }
  EXPECT_FALSE(s.get_beta1().has_value());
}

TEST(Schedule, StateSaveLoadResumesExactly) {
  config::WarmupDecayLRParams p{200, 1e-6, 1e-3, 20, config::WarmupType::Log};
  config::SchedulerConfig c{config::SchedulerType::WarmupDecayLR, p};
  LRScheduler a(c, 0.1);
  for (int i = 0; i < 37; ++i) a.step();
  json state = a.state_dict();
  EXPECT_EQ(state["last_batch_iteration"], 36);
  EXPECT_EQ(state["type"], "WarmupDecayLR");
  LRScheduler b(c, 0.1);
  b.load_state_dict(json::parse(state.dump()));  // through text, as a checkpoint would
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(a.get_lr(), b.get_lr());
    a.step();
    b.step();
  }
  // DeepSpeed's own state dict has only last_batch_iteration.
  b.load_state_dict(json{{"last_batch_iteration", 5}});
  EXPECT_EQ(b.last_batch_iteration(), 5);
  EXPECT_THROW(b.load_state_dict(json{{"step", 5}}), ds::Error);
  EXPECT_THROW(b.load_state_dict(json{{"last_batch_iteration", -7}}), ds::Error);
}

TEST(Schedule, ResumeFromConfigLastBatchIteration) {
  auto cfg =
      config_for("WarmupLR", json{{"warmup_num_steps", 10}, {"last_batch_iteration", 4}}, 0.1);
  LRScheduler s(cfg.scheduler, cfg.optimizer.lr);
  EXPECT_EQ(s.last_batch_iteration(), 4);
  EXPECT_DOUBLE_EQ(s.get_lr(), s.lr_at(4));
}

TEST(Schedule, MismatchedConfigRejected) {
  config::SchedulerConfig bad{config::SchedulerType::WarmupLR, config::OneCycleParams{}};
  EXPECT_THROW(LRScheduler(bad, 0.1), ds::Error);
  EXPECT_THROW(LRScheduler(config::SchedulerConfig{}, -1.0), ds::Error);
}

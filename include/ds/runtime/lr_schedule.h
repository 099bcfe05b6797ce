#pragma once
// Learning-rate schedules of DeepSpeed (§4): WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle,
// LRRangeTest, and a constant lr when the config has no scheduler.
//
// The engine steps the scheduler once per *applied* optimizer step: never per micro-batch and
// never on a step skipped for overflow. The state is DeepSpeed's `last_batch_iteration` t, which
// starts at -1; the first step() makes it 0. The lr for the next optimizer step is get_lr(), so
// the very first optimizer step uses the value at t = -1 (warmup_min_lr for WarmupLR), exactly as
// in DeepSpeed, where the scheduler writes the lr into the optimizer at construction and after
// each step.
//
// Values follow DeepSpeed 0.19.8 (tests/fixtures/config/schedules.json), including OneCycle's
// stairs, WarmupCosineLR holding cos_min_ratio after total_num_steps, and OneCycle's momentum:
// beta1 is cycle_min_mom before the first step (DeepSpeed's constructor writes it) and beta2 is
// forced to kOneCycleBeta2 while momentum cycles (the config warns when that replaces a configured
// beta2).
#include <cstdint>
#include <optional>

#include <nlohmann/json.hpp>

#include "ds/config/config.h"

namespace ds::runtime {

class LRScheduler {
 public:
  // `base_lr` is the optimizer's configured lr: the constant lr without a scheduler, and the
  // value WarmupCosineLR multiplies by its ratio (the other schedules carry their own lrs).
  LRScheduler(const config::SchedulerConfig& cfg, double base_lr);

  // Advances t by one (call after each applied optimizer step).
  void step();
  // Sets t directly, like DeepSpeed's step(batch_iteration).
  void step_to(int64_t last_batch_iteration);

  // The lr for the next optimizer step, at the current t.
  double get_lr() const;
  // OneCycle with cycle_momentum: the optimizer's beta1 (momentum) at the current t; beta2 is then
  // kOneCycleBeta2. Otherwise nullopt, and the optimizer keeps its configured betas.
  std::optional<double> get_beta1() const;
  static constexpr double kOneCycleBeta2 = 0.99;  // DeepSpeed's OneCycle pairs beta1 with 0.99

  int64_t last_batch_iteration() const { return last_batch_iteration_; }
  config::SchedulerType type() const { return cfg_.type; }
  double base_lr() const { return base_lr_; }

  // Checkpoint state: {"type": <name>, "last_batch_iteration": t}. load_state_dict also accepts
  // DeepSpeed's own {"last_batch_iteration": t}. The type is informational: a run may resume with
  // a different schedule, as in DeepSpeed.
  nlohmann::json state_dict() const;
  void load_state_dict(const nlohmann::json& state);

  // The lr at an arbitrary t without changing the state (t >= -1); for plots and tests.
  double lr_at(int64_t t) const;
  std::optional<double> beta1_at(int64_t t) const;

 private:
  config::SchedulerConfig cfg_;
  double base_lr_;
  int64_t last_batch_iteration_;
};

}  // namespace ds::runtime

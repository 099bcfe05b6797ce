// DeepSpeed's lr schedules (§4). Each formula keeps DeepSpeed's order of floating-point operations
// (deepspeed/runtime/lr_schedules.py) so values match its Python implementation to the last bit.
#include "ds/runtime/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "ds/core/error.h"

namespace ds::runtime {

namespace {

// γ in [0, 1) during warm-up; W = max(2, warmup_num_steps) keeps ln(W) > 0.
double warmup_gamma(int64_t t, int64_t w, config::WarmupType type) {
  if (type == config::WarmupType::Log) {
    const double inverse_log_warm_up = 1.0 / std::log(static_cast<double>(w));
    return inverse_log_warm_up * std::log(static_cast<double>(t + 1));
  }
  return static_cast<double>(t) / static_cast<double>(w);
}

template <class P>
double warmup_lr(const P& p, int64_t t, double gamma) {
  const double delta = p.warmup_max_lr - p.warmup_min_lr;
  return p.warmup_min_lr + delta * gamma;
}

double one_cycle_scale_factor(const config::OneCycleParams& p, int64_t t) {
  const double first = static_cast<double>(p.cycle_first_step_size);
  const double second = static_cast<double>(p.cycle_second_step_size);
  const double total = first + second;
  const double step_ratio = first / total;
  const double i = static_cast<double>(t + 1);
  const double cycle = std::floor(1 + i / total);
  const double x = 1. + i / total - cycle;
  double scale_factor;
  int64_t stair_count;
  if (x <= step_ratio) {
    scale_factor = x / step_ratio;
    stair_count = p.cycle_first_stair_count;
  } else {
    scale_factor = (x - 1) / (step_ratio - 1);
    stair_count = p.cycle_second_stair_count;
  }
  // Stairs (DeepSpeed 0.19): lr and momentum hold flat over each of stair_count equal pieces of a
  // half cycle. The stair is taken from the integer step offset within the cycle, not from
  // scale_factor, whose value at a half-cycle boundary can fall just below an exact stair.
  if (stair_count > 0) {
    const double cycle_iteration = std::fmod(i, total);
    const double stairs = static_cast<double>(stair_count);
    const double stair_position = cycle_iteration <= first
                                      ? cycle_iteration * stairs / first
                                      : (total - cycle_iteration) * stairs / second;
    scale_factor = std::floor(stair_position) / stairs;
  }
  return scale_factor;
}

double one_cycle_total(const config::OneCycleParams& p) {
  return static_cast<double>(p.cycle_first_step_size) +
         static_cast<double>(p.cycle_second_step_size);
}

}  // namespace

LRScheduler::LRScheduler(const config::SchedulerConfig& cfg, double base_lr)
    : cfg_(cfg), base_lr_(base_lr), last_batch_iteration_(cfg.last_batch_iteration) {
  DS_CHECK(std::isfinite(base_lr) && base_lr >= 0,
           "[lr_schedule] the optimizer's base lr must be a finite number >= 0, got {}", base_lr);
  DS_CHECK(cfg.last_batch_iteration >= -1,
           "[lr_schedule] last_batch_iteration must be >= -1, got {}", cfg.last_batch_iteration);
  const bool matches =
      (cfg.type == config::SchedulerType::None && std::holds_alternative<std::monostate>(cfg.params)) ||
      (cfg.type == config::SchedulerType::WarmupLR && std::holds_alternative<config::WarmupLRParams>(cfg.params)) ||
      (cfg.type == config::SchedulerType::WarmupDecayLR &&
       std::holds_alternative<config::WarmupDecayLRParams>(cfg.params)) ||
      (cfg.type == config::SchedulerType::WarmupCosineLR &&
       std::holds_alternative<config::WarmupCosineLRParams>(cfg.params)) ||
      (cfg.type == config::SchedulerType::OneCycle && std::holds_alternative<config::OneCycleParams>(cfg.params)) ||
      (cfg.type == config::SchedulerType::LRRangeTest &&
       std::holds_alternative<config::LRRangeTestParams>(cfg.params));
  DS_CHECK(matches, "[lr_schedule] SchedulerConfig type {} does not match its params",
           config::scheduler_type_name(cfg.type));
}

void LRScheduler::step() {
  ++last_batch_iteration_;
}

void LRScheduler::step_to(int64_t t) {
  DS_CHECK(t >= -1, "[lr_schedule] last_batch_iteration must be >= -1, got {}", t);
  last_batch_iteration_ = t;
}

double LRScheduler::get_lr() const {
  return lr_at(last_batch_iteration_);
}

std::optional<double> LRScheduler::get_beta1() const {
  return beta1_at(last_batch_iteration_);
}

double LRScheduler::lr_at(int64_t t) const {
  switch (cfg_.type) {
    case config::SchedulerType::None:
      return base_lr_;
    case config::SchedulerType::WarmupLR: {
      const auto& p = std::get<config::WarmupLRParams>(cfg_.params);
      if (t < 0) return p.warmup_min_lr;
      const int64_t w = std::max<int64_t>(2, p.warmup_num_steps);
      return warmup_lr(p, t, t < w ? warmup_gamma(t, w, p.warmup_type) : 1.0);
    }
    case config::SchedulerType::WarmupDecayLR: {
      const auto& p = std::get<config::WarmupDecayLRParams>(cfg_.params);
      if (t < 0) return p.warmup_min_lr;
      const int64_t w = std::max<int64_t>(2, p.warmup_num_steps);
      double gamma;
      if (t < w) {
        gamma = warmup_gamma(t, w, p.warmup_type);
      } else {
        gamma = std::max(0.0, static_cast<double>(p.total_num_steps - t) /
                                  std::max(1.0, static_cast<double>(p.total_num_steps - w)));
      }
      return warmup_lr(p, t, gamma);
    }
    case config::SchedulerType::WarmupCosineLR: {
      const auto& p = std::get<config::WarmupCosineLRParams>(cfg_.params);
      if (t < 0) return 0.0;  // DeepSpeed's value before the first step()
      const int64_t w = std::max<int64_t>(2, p.warmup_num_steps);
      double ratio;
      if (t < w) {
        ratio = warmup_gamma(t, w, p.warmup_type);
        const double ratio_delta = 1. - p.warmup_min_ratio;
        ratio = p.warmup_min_ratio + ratio * ratio_delta;
      } else {
        const int64_t real_last_step = t - w + 1;
        const int64_t real_total_steps = p.total_num_steps - w;
        if (real_last_step >= real_total_steps) {
          // Our rule: hold the floor after the cosine ends (DeepSpeed lets it rise again).
          ratio = p.cos_min_ratio;
        } else {
          const double ratio_delta = 1. - p.cos_min_ratio;
          ratio = (1 + std::cos(std::numbers::pi * static_cast<double>(real_last_step) /
                                static_cast<double>(real_total_steps))) /
                  2;
          ratio = std::max(0.0, p.cos_min_ratio + ratio_delta * ratio);
        }
      }
      return base_lr_ * ratio;
    }
    case config::SchedulerType::OneCycle: {
      const auto& p = std::get<config::OneCycleParams>(cfg_.params);
      const double total = one_cycle_total(p);
      if (static_cast<double>(t) < total) {
        const double base_height = (p.cycle_max_lr - p.cycle_min_lr) * one_cycle_scale_factor(p, t);
        return p.cycle_min_lr + base_height;
      }
      if (p.decay_step_size == 0 || p.decay_lr_rate == 0.0) return p.cycle_min_lr;
      const double d = static_cast<double>(t) - total + 1;
      const double decay_interval = d / static_cast<double>(p.decay_step_size);
      const double lr_decay_factor = 1 + p.decay_lr_rate * decay_interval;
      return p.cycle_min_lr / lr_decay_factor;
    }
    case config::SchedulerType::LRRangeTest: {
      const auto& p = std::get<config::LRRangeTestParams>(cfg_.params);
      double interval = static_cast<double>(t + 1) / static_cast<double>(p.lr_range_test_step_size);
      if (p.lr_range_test_staircase) interval = std::floor(interval);
      return p.lr_range_test_min_lr * (1 + p.lr_range_test_step_rate * interval);
    }
  }
  return base_lr_;
}

std::optional<double> LRScheduler::beta1_at(int64_t t) const {
  if (cfg_.type != config::SchedulerType::OneCycle) return std::nullopt;
  const auto& p = std::get<config::OneCycleParams>(cfg_.params);
  if (!p.cycle_momentum) return std::nullopt;
  // Before the first step DeepSpeed's constructor writes cycle_min_mom, not the formula's value.
  if (t < 0) return p.cycle_min_mom;
  const double total = one_cycle_total(p);
  if (static_cast<double>(t) < total) {
    const double base_height = (p.cycle_max_mom - p.cycle_min_mom) * one_cycle_scale_factor(p, t);
    return p.cycle_max_mom - base_height;
  }
  if (p.decay_step_size == 0 || p.decay_mom_rate == 0.0) return p.cycle_max_mom;
  const double d = static_cast<double>(t) - total + 1;
  const double decay_interval = d / static_cast<double>(p.decay_step_size);
  const double mom_decay_factor = 1 + p.decay_mom_rate * decay_interval;
  return p.cycle_max_mom * mom_decay_factor;
}

nlohmann::json LRScheduler::state_dict() const {
  return nlohmann::json{{"type", config::scheduler_type_name(cfg_.type)},
                        {"last_batch_iteration", last_batch_iteration_}};
}

void LRScheduler::load_state_dict(const nlohmann::json& state) {
  DS_CHECK(state.is_object() && state.contains("last_batch_iteration") &&
               state["last_batch_iteration"].is_number_integer(),
           "[lr_schedule] checkpoint state must be an object with an integer "
           "\"last_batch_iteration\", got {}",
           state.dump());
  step_to(state["last_batch_iteration"].get<int64_t>());
}

}  // namespace ds::runtime

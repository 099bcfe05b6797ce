// The loss-scale state machine of DeepSpeed's DynamicLossScaler (deepspeed/runtime/fp16/
// loss_scaler.py), line for line, plus the fused unscale/clip coefficient.
#include "ds/runtime/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "ds/core/error.h"

namespace ds::runtime {

namespace {

// DeepSpeed prints int(scale); integral values below 2^63 print the same digits here.
std::string scale_text(double s) {
  if (std::floor(s) == s && std::fabs(s) < 9.2e18)
    return fmt::format("{}", static_cast<int64_t>(s));
  return fmt::format("{}", s);
}

}  // namespace

LossScaler::LossScaler(double init_scale, int64_t scale_window, int hysteresis, double min_scale,
                       bool consecutive_hysteresis, double scale_factor)
    : dynamic_(true),
      cur_scale_(init_scale),
      scale_factor_(scale_factor),
      scale_window_(scale_window),
      min_scale_(min_scale),
      delayed_shift_(hysteresis),
      cur_hysteresis_(hysteresis),
      consecutive_hysteresis_(consecutive_hysteresis) {
  DS_CHECK(std::isfinite(init_scale) && init_scale > 0,
           "[loss_scaler] initial scale must be a finite number > 0, got {}", init_scale);
  DS_CHECK(scale_window >= 1, "[loss_scaler] loss_scale_window must be >= 1, got {}", scale_window);
  DS_CHECK(hysteresis >= 1, "[loss_scaler] hysteresis must be >= 1, got {}", hysteresis);
  DS_CHECK(min_scale > 0, "[loss_scaler] min_loss_scale must be > 0, got {}", min_scale);
  DS_CHECK(scale_factor > 1, "[loss_scaler] scale factor must be > 1, got {}", scale_factor);
}

LossScaler LossScaler::make_static(double scale) {
  DS_CHECK(std::isfinite(scale) && scale > 0,
           "[loss_scaler] static loss scale must be a finite number > 0, got {}", scale);
  LossScaler s;
  s.dynamic_ = false;
  s.cur_scale_ = scale;
  return s;
}

LossScaler LossScaler::from_config(const config::FP16Config& fp16) {
  if (!fp16.enabled) return make_static(1.0);
  if (!fp16.dynamic()) return make_static(fp16.loss_scale);
  return LossScaler(std::ldexp(1.0, fp16.initial_scale_power), fp16.loss_scale_window,
                    fp16.hysteresis, fp16.min_loss_scale, fp16.consecutive_hysteresis);
}

void LossScaler::log(const std::string& message) const {
  if (sink_ && !message.empty()) sink_(message);
}

LossScaleUpdate LossScaler::update(bool overflow) {
  LossScaleUpdate out;
  out.skip_step = overflow;
  consecutive_overflows_ = overflow ? consecutive_overflows_ + 1 : 0;
  if (!dynamic_) {
    if (overflow)
      out.message =
          fmt::format("OVERFLOW! Rank {} Skipping step. Static loss scale: {}, not changed", rank_,
                      scale_text(cur_scale_));
    ++cur_iter_;
    out.scale = cur_scale_;
    log(out.message);
    return out;
  }
  if (overflow) {
    if (delayed_shift_ == 1 || cur_hysteresis_ == 1) {
      DS_CHECK(cur_scale_ != min_scale_,
               "[loss_scaler] Current loss scale already at minimum - cannot decrease scale "
               "anymore. Exiting run. (scale {} = min_loss_scale after {} overflowing steps in a "
               "row: the gradients are not finite at any scale; check the data and the lr, lower "
               "min_loss_scale, or train in bf16)",
               scale_text(cur_scale_), consecutive_overflows_);
      const double next_scale = std::max(cur_scale_ / scale_factor_, min_scale_);
      out.message = fmt::format(
          "OVERFLOW! Rank {} Skipping step. Attempted loss scale: {}, "
          "reducing to {}",
          rank_, scale_text(cur_scale_), scale_text(next_scale));
      cur_scale_ = next_scale;
    } else {
      out.message = fmt::format(
          "OVERFLOW! Rank {} Skipping step. Attempted loss scale: {}, but "
          "hysteresis is {}. Reducing hysteresis to {}",
          rank_, scale_text(cur_scale_), cur_hysteresis_, cur_hysteresis_ - 1);
      --cur_hysteresis_;
    }
    last_overflow_iter_ = cur_iter_;
  } else {
    if (consecutive_hysteresis_) cur_hysteresis_ = delayed_shift_;
    if ((cur_iter_ - last_overflow_iter_) % scale_window_ == 0) {
      if (!consecutive_hysteresis_) cur_hysteresis_ = delayed_shift_;
      cur_scale_ *= scale_factor_;
    }
  }
  ++cur_iter_;
  out.scale = cur_scale_;
  log(out.message);
  return out;
}

nlohmann::json LossScaler::state_dict() const {
  return nlohmann::json{{"dynamic", dynamic_},
                        {"cur_scale", cur_scale_},
                        {"cur_iter", cur_iter_},
                        {"last_overflow_iter", last_overflow_iter_},
                        {"cur_hysteresis", cur_hysteresis_},
                        {"consecutive_overflows", consecutive_overflows_},
                        {"scale_factor", scale_factor_},
                        {"scale_window", scale_window_},
                        {"min_scale", min_scale_},
                        {"hysteresis", delayed_shift_},
                        {"consecutive_hysteresis", consecutive_hysteresis_}};
}

void LossScaler::load_state_dict(const nlohmann::json& state) {
  auto need = [&](const char* key) -> const nlohmann::json& {
    DS_CHECK(state.is_object() && state.contains(key) && state[key].is_number(),
             "[loss_scaler] checkpoint state lacks a numeric \"{}\": {}", key, state.dump());
    return state[key];
  };
  const double scale = need("cur_scale").get<double>();
  DS_CHECK(std::isfinite(scale) && scale > 0,
           "[loss_scaler] checkpoint loss scale must be a finite number > 0, got {}", scale);
  cur_iter_ = need("cur_iter").get<int64_t>();
  last_overflow_iter_ = need("last_overflow_iter").get<int64_t>();
  consecutive_overflows_ = state.value("consecutive_overflows", int64_t{0});
  // A static scale comes from the config of the run that loads; only a dynamic scale resumes.
  if (dynamic_) {
    cur_scale_ = scale;
    // Clamped: a run may resume with a smaller configured hysteresis.
    const int64_t h = state.value("cur_hysteresis", int64_t{delayed_shift_});
    cur_hysteresis_ = static_cast<int>(std::clamp<int64_t>(h, 1, delayed_shift_));
  }
}

ClipCoefficient unscale_and_clip_coefficient(double scaled_norm, double loss_scale, double clip) {
  DS_CHECK(std::isfinite(scaled_norm),
           "[loss_scaler] gradient norm is {}: a non-finite norm is an overflow, skip the step "
           "instead of clipping",
           scaled_norm);
  DS_CHECK(loss_scale > 0, "[loss_scaler] loss scale must be > 0, got {}", loss_scale);
  ClipCoefficient c;
  double combined = loss_scale;
  if (clip > 0) {
    const double k = ((scaled_norm / loss_scale) + 1e-6) / clip;
    if (k > 1) {
      c.k = k;
      combined = k * loss_scale;
    }
  }
  c.factor = 1.0 / combined;
  return c;
}

}  // namespace ds::runtime

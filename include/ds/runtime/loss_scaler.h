#pragma once
// The fp16 loss scaler (§5) as a pure state machine: the engine reports whether the step's
// gradients overflowed (inf/NaN on any rank, all-reduced with MAX), the scaler says whether to skip
// the step and what the scale is for the next one. No tensors here.
//
// Dynamic mode (fp16.loss_scale == 0), DeepSpeed's DynamicLossScaler.update_scale:
//   overflow:  if hysteresis_left == 1 (or hysteresis == 1): scale = max(scale / 2, min_scale),
//              or an error when scale is already min_scale; else hysteresis_left -= 1.
//              last_overflow_iter = iter.
//   clean:     consecutive_hysteresis refills hysteresis_left; every `window` clean iterations
//              since the last overflow the scale doubles (and hysteresis_left refills).
//   iter += 1 in both cases.
// Static mode (fp16.loss_scale > 0, or bf16/fp32 with scale 1): the scale never changes. Unlike
// DeepSpeed, an overflow in static mode still skips the step (our rule: a non-finite gradient never
// reaches the weights), and consecutive_overflows() lets the engine stop after K in a row.
#include <cstdint>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "ds/config/config.h"

namespace ds::runtime {

struct LossScaleUpdate {
  bool skip_step = false;  // true on overflow: drop the gradients, leave optimizer and lr alone
  double scale = 1.0;      // the scale for the next backward
  // The log line for this update ("" when nothing happened), e.g.
  // "OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768".
  std::string message;
};

class LossScaler {
 public:
  // Dynamic scaler starting at init_scale. scale_factor is DeepSpeed's 2.
  LossScaler(double init_scale, int64_t scale_window, int hysteresis, double min_scale,
             bool consecutive_hysteresis, double scale_factor = 2.0);

  // A scaler that never changes `scale` (fp16.loss_scale > 0; 1.0 for bf16 and fp32).
  static LossScaler make_static(double scale);

  // From the fp16 section: dynamic when enabled with loss_scale 0 (starting at
  // 2^initial_scale_power), static at loss_scale when > 0, static 1.0 when fp16 is off.
  static LossScaler from_config(const config::FP16Config& fp16);

  // Advances the state machine by one optimizer step. Throws ds::Error
  // "[loss_scaler] Current loss scale already at minimum - cannot decrease scale anymore ..."
  // when an overflow arrives with the scale already at min_scale (and no hysteresis left).
  LossScaleUpdate update(bool overflow);

  double scale() const { return cur_scale_; }
  bool dynamic() const { return dynamic_; }
  int64_t cur_iter() const { return cur_iter_; }
  int64_t last_overflow_iter() const { return last_overflow_iter_; }
  int cur_hysteresis() const { return cur_hysteresis_; }
  int64_t consecutive_overflows() const { return consecutive_overflows_; }

  // The rank named in log lines (DeepSpeed logs on rank 0 only; the engine decides who prints).
  void set_rank(int rank) { rank_ = rank; }
  // Called with every non-empty message, in addition to returning it in LossScaleUpdate.
  void set_log_sink(std::function<void(const std::string&)> sink) { sink_ = std::move(sink); }

  // Checkpoint state (everything that changes, plus the settings for a sanity check on load).
  // Loading restores cur_scale, cur_iter, last_overflow_iter, cur_hysteresis and the overflow
  // counter; the settings come from the current config, as in DeepSpeed.
  nlohmann::json state_dict() const;
  void load_state_dict(const nlohmann::json& state);

 private:
  LossScaler() = default;
  void log(const std::string& message) const;

  bool dynamic_ = false;
  double cur_scale_ = 1.0;
  double scale_factor_ = 2.0;
  int64_t scale_window_ = 1000;
  double min_scale_ = 1.0;
  int delayed_shift_ = 1;  // DeepSpeed's name for the configured hysteresis
  int cur_hysteresis_ = 1;
  bool consecutive_hysteresis_ = false;
  int64_t cur_iter_ = 0;
  int64_t last_overflow_iter_ = -1;
  int64_t consecutive_overflows_ = 0;
  int rank_ = 0;
  std::function<void(const std::string&)> sink_;
};

// Unscaling fused with clipping (§5). With the norm of the *scaled* gradients, the loss scale and
// the clip threshold c (0 = no clipping): k = max(1, (norm/scale + 1e-6)/c) and the gradients are
// multiplied by factor = 1/(k*scale). The norm must be finite: a non-finite norm means overflow,
// and the step is skipped instead (this throws to catch a caller that forgot).
struct ClipCoefficient {
  double k = 1.0;       // clip divisor on the unscaled gradients (1 = not clipped)
  double factor = 1.0;  // multiply the scaled gradients by this
  bool clipped() const { return k > 1.0; }
};
ClipCoefficient unscale_and_clip_coefficient(double scaled_norm, double loss_scale, double clip);

}  // namespace ds::runtime

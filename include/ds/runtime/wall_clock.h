#pragma once
// DeepSpeed's `wall_clock_breakdown`: the wall time the engine spends in forward, backward and the
// optimizer step, reported as means per optimizer step every `steps_per_print` steps:
//
//   [engine] step 20: time (ms) | fwd: 41.20 | bwd: 95.73 | step: 61.02 (means of the last 10 steps)
//
// Forward and backward sum over the step's micro-batches. Each phase drains the model's device at
// its start and end (Backend::synchronize; DeepSpeed's timers synchronise the GPU the same way),
// so on a GPU the numbers are the device's work, not the launch time; that costs a little
// overlap, so the breakdown is off unless the config asks for it. DeepSpeed also splits backward
// into bwd_inner and bwd_allreduce; here the gradient reduction overlaps backward and is not split.
//
// Threading: the engine's thread only.
#include <array>
#include <chrono>
#include <cstdint>
#include <string>

#include "ds/core/device.h"

namespace ds::runtime {

class WallClockBreakdown {
 public:
  enum Phase : int { kForward = 0, kBackward = 1, kStep = 2 };
  static constexpr int kPhases = 3;

  WallClockBreakdown() = default;
  WallClockBreakdown(bool enabled, Device device) : enabled_(enabled), device_(device) {}
  bool enabled() const { return enabled_; }

  // Times one phase for its lifetime (nothing when disabled).
  class Scope {
   public:
    Scope(WallClockBreakdown& owner, Phase phase);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    WallClockBreakdown* owner_ = nullptr;  // null when disabled
    Phase phase_;
    std::chrono::steady_clock::time_point start_;
  };

  void step_done() { steps_ += enabled_ ? 1 : 0; }  // an optimizer step (boundary) finished
  int64_t steps() const { return steps_; }
  // "time (ms) | fwd: .. | bwd: .. | step: .. (means of the last N steps)"; resets the sums.
  std::string report();

 private:
  void synchronize() const;

  bool enabled_ = false;
  Device device_ = kCPU;
  std::array<double, kPhases> seconds_{};
  int64_t steps_ = 0;
};

}  // namespace ds::runtime

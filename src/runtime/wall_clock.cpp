#include "ds/runtime/wall_clock.h"

#include <fmt/format.h>

#include "ds/backend/backend.h"

namespace ds::runtime {

WallClockBreakdown::Scope::Scope(WallClockBreakdown& owner, Phase phase) : phase_(phase) {
  if (!owner.enabled_) return;
  owner_ = &owner;
  owner.synchronize();
  start_ = std::chrono::steady_clock::now();
}

WallClockBreakdown::Scope::~Scope() {
  if (!owner_) return;
  owner_->synchronize();
  owner_->seconds_[static_cast<size_t>(phase_)] +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void WallClockBreakdown::synchronize() const {
  backend::get(device_).synchronize();
}

std::string WallClockBreakdown::report() {
  const double n = steps_ > 0 ? static_cast<double>(steps_) : 1.0;
  std::string s = fmt::format(
      "time (ms) | fwd: {:.2f} | bwd: {:.2f} | step: {:.2f} (means of the last {} steps)",
      1e3 * seconds_[kForward] / n, 1e3 * seconds_[kBackward] / n, 1e3 * seconds_[kStep] / n,
      steps_);
  seconds_ = {};
  steps_ = 0;
  return s;
}

}  // namespace ds::runtime

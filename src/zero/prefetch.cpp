// ZeRO-3's trace and prefetch decisions (prefetch.h).
#include "prefetch.h"

namespace ds::zero::detail {

void Trace::begin_micro_step(bool training) {
  pos_ = 0;
  following_ = training && !recording_ && !events_.empty();
}

void Trace::end_micro_step() {
  if (recording_ && !events_.empty()) recording_ = false;
  following_ = false;
}

void Trace::on_gather(const std::vector<int>& params) {
  if (recording_) events_.push_back(params);
  if (!following_) return;
  if (pos_ < events_.size() && events_[pos_] == params) {
    ++pos_;
  } else {
    following_ = false;  // a different order than the first micro-step: no guessing
  }
}

std::span<const std::vector<int>> Trace::upcoming() const {
  if (pos_ >= events_.size()) return {};
  return std::span<const std::vector<int>>(events_).subspan(pos_);
}

Trace::Paused Trace::pause() {
  Paused p{recording_, following_};
  recording_ = false;
  following_ = false;
  return p;
}

void Trace::resume(Paused p) {
  recording_ = p.recording;
  following_ = p.following;
}

std::vector<int> plan_prefetch(std::span<const std::vector<int>> upcoming,
                               const std::vector<int64_t>& numel,
                               const std::vector<bool>& available, int64_t budget, int64_t max_live,
                               int64_t live) {
  std::vector<int> out;
  std::vector<bool> taken = available;
  for (size_t k = 0; k < upcoming.size() && budget > 0; ++k)
    for (int i : upcoming[k]) {
      const auto u = static_cast<size_t>(i);
      if (taken[u]) continue;
      if (live + numel[u] > max_live) return out;
      live += numel[u];
      out.push_back(i);
      taken[u] = true;
      budget -= numel[u];
    }
  return out;
}

std::vector<bool> reused_soon(std::span<const std::vector<int>> upcoming,
                              const std::vector<int>& params, const std::vector<int64_t>& numel,
                              int64_t distance) {
  std::vector<bool> keep(params.size(), false);
  for (size_t k = 0; k < upcoming.size() && distance > 0; ++k)
    for (int j : upcoming[k]) {
      for (size_t a = 0; a < params.size(); ++a) keep[a] = keep[a] || params[a] == j;
      distance -= numel[static_cast<size_t>(j)];
    }
  return keep;
}

}  // namespace ds::zero::detail

#pragma once
// ZeRO-3 prefetching along the recorded trace (internal to zero/).
//
// The first training micro-step records the order in which modules gather their parameters (the
// trace: one event per gather, the parameter indices it needs). Later training micro-steps follow
// it: when event k is gathered, the parameters of events k+1.. are gathered ahead, up to
// prefetch_bucket_size elements and while at most max_live_parameters elements are gathered; a
// parameter released after use is kept when the trace uses it again within max_reuse_distance
// elements. A gather that departs from the trace turns following off for the rest of that
// micro-step (no guessing). Evaluation and checkpoint gathers neither record nor follow.
//
// Pure bookkeeping: no communication, no buffers. Threading: the training thread only.
#include <cstdint>
#include <span>
#include <vector>

namespace ds::zero::detail {

class Trace {
 public:
  // Start of a micro-step's forward: follow the trace when training and one was recorded.
  void begin_micro_step(bool training);
  // End of a micro-step's backward: the first micro-step that recorded something ends recording.
  void end_micro_step();
  // A gather of `params` is about to happen: records it, or advances along the trace (or stops
  // following when it differs).
  void on_gather(const std::vector<int>& params);

  bool following() const { return following_; }
  // The events after the current position.
  std::span<const std::vector<int>> upcoming() const;

  // Gathers outside training's order (evaluation, checkpoints): neither recorded nor followed.
  struct Paused {
    bool recording, following;
  };
  Paused pause();
  void resume(Paused p);
  // Evaluation: stops recording for its duration (it may follow nothing either).
  bool recording() const { return recording_; }
  void set_recording(bool on) { recording_ = on; }

 private:
  std::vector<std::vector<int>> events_;
  bool recording_ = true;
  bool following_ = false;
  size_t pos_ = 0;
};

// The parameters to gather ahead now, in trace order: those of the upcoming events that are
// neither gathered nor already in flight, until `budget` elements are taken or gathering the next
// one would put more than `max_live` elements in memory (`live`: elements gathered now, not
// counting persistent parameters).
std::vector<int> plan_prefetch(std::span<const std::vector<int>> upcoming,
                               const std::vector<int64_t>& numel,
                               const std::vector<bool>& available, int64_t budget, int64_t max_live,
                               int64_t live);

// For each of `params` (just used), whether the upcoming events use it again within `distance`
// elements of gathers: then it stays gathered.
std::vector<bool> reused_soon(std::span<const std::vector<int>> upcoming,
                              const std::vector<int>& params, const std::vector<int64_t>& numel,
                              int64_t distance);

}  // namespace ds::zero::detail

#pragma once
// How many generation requests ds_serve holds at once: up to `max_batch` generating (sharing
// decode steps, ds/serve/scheduler.h) and up to `max_queue` waiting for a place. A request beyond
// that is answered 503 at once, naming the limit, instead of waiting without bound (a client then
// retries or goes to another replica, as vLLM and llama.cpp's server answer when saturated).
//
//   Admission gate(8, 16);
//   auto slot = gate.admit();   // throws ApiError(503) when 8 + 16 requests are admitted
//   ... generate; the slot is released when the last copy of `slot` goes (a streaming response
//   keeps one in its content provider until the stream ends)
//
// Thread-safe: admit() and the slots' release are atomic.
#include <atomic>
#include <memory>

namespace ds::serve {

class Admission {
 public:
  Admission(int max_batch, int max_queue)
      : max_batch_(max_batch < 1 ? 1 : max_batch), max_queue_(max_queue < 0 ? 0 : max_queue) {}
  using Slot = std::shared_ptr<void>;
  Slot admit();
  int admitted() const { return admitted_.load(); }
  int max_queue() const { return max_queue_; }

 private:
  const int max_batch_, max_queue_;
  std::atomic<int> admitted_{0};
};

}  // namespace ds::serve

// ds_serve's arrival-order lock (fifo_lock.h).
#include "fifo_lock.h"

#include <chrono>

namespace ds::serve {

bool FifoLock::lock(const std::function<bool()>& cancelled) {
  std::unique_lock<std::mutex> lk(mu_);
  const uint64_t ticket = next_++;
  while (serving_ != ticket) {
    if (cancelled) {
      lk.unlock();
      const bool gone = cancelled();  // may poll a socket: not under the lock
      lk.lock();
      if (gone && serving_ != ticket) {
        abandoned_.insert(ticket);
        return false;
      }
      if (serving_ == ticket) break;
    }
    cv_.wait_for(lk, std::chrono::milliseconds(20));
  }
  return true;
}

void FifoLock::unlock() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++serving_;
    while (abandoned_.erase(serving_) > 0) ++serving_;
  }
  cv_.notify_all();
}

int FifoLock::queued() const {
  std::lock_guard<std::mutex> lk(mu_);
  return static_cast<int>(next_ - serving_) - static_cast<int>(abandoned_.size());
}

}  // namespace ds::serve

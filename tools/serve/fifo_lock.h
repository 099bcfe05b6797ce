#pragma once
// The lock around ds_serve's model and KV cache, taken in arrival order, that a waiter may leave.
//
// A plain mutex wakes waiters in no particular order: under load an unlucky request can wait for
// many others that came after it, which is what p99 latency measures. Here each caller draws a
// ticket and is served when every earlier ticket has been served or abandoned. While waiting it
// polls `cancelled` (every 20 ms): a client that went away leaves the queue at once instead of
// waiting for its turn to find out.
//
//   FifoLock lock;
//   if (!lock.lock([&] { return conn.closed(); })) return;  // cancelled while waiting
//   ... generate ...
//   lock.unlock();
//
// Thread-safe; not recursive. unlock() must be called by the holder, once per successful lock().
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <set>

namespace ds::serve {

class FifoLock {
 public:
  // Blocks until the caller's turn; false (without the lock) when `cancelled` turned true first.
  bool lock(const std::function<bool()>& cancelled = {});
  void unlock();
  // Callers holding or waiting for the lock (waiters that left excluded).
  int queued() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t next_ = 0;             // the ticket the next caller draws
  uint64_t serving_ = 0;          // the ticket that holds (or may take) the lock
  std::set<uint64_t> abandoned_;  // tickets whose holders left the queue
};

}  // namespace ds::serve

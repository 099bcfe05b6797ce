#pragma once
// comms_logger: per-operation counts, bytes and time of every collective, as DeepSpeed's
// `comms_logger` (config "comms_logger": {"enabled": true}). Off by default; enabled by
// `comms_logger().enable(true)` or the environment variable DS_COMMS_LOGGER=1. Recording costs one
// mutex per completed operation. Times are measured on the communication thread from the start of
// the operation's execution to its completion (not including time queued behind earlier ones).
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "ds/comm/group.h"

namespace ds::comm {

class CommsLogger {
 public:
  struct Entry {
    uint64_t count = 0;
    uint64_t bytes = 0;    // sum of message sizes (Group::Op::bytes)
    double seconds = 0.0;  // sum of durations
    double max_seconds = 0.0;
  };

  void enable(bool on);
  bool enabled() const;
  // `group_size` selects the bus-bandwidth factor (nccl-tests' convention).
  void record(OpKind op, uint64_t bytes, double seconds, int group_size);
  void reset();
  // Totals per operation (all message sizes together).
  std::map<OpKind, Entry> totals() const;
  // A table, one row per (operation, message size) and a total row per operation:
  //   op  size  count  total_ms  avg_ms  max_ms  algbw_GBps  busbw_GBps
  std::string table() const;

 private:
  mutable std::mutex mu_;
  bool enabled_ = false;
  // (op, message bytes) -> entry; bus factor per op remembered from the last record.
  std::map<std::pair<OpKind, uint64_t>, Entry> entries_;
  std::map<OpKind, double> bus_factor_;
};

// The process-wide logger.
CommsLogger& comms_logger();

// Bus-bandwidth factor of an operation over n ranks: bus bytes = message bytes * factor.
double bus_factor(OpKind op, int n);

}  // namespace ds::comm

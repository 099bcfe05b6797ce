#pragma once
// Internals shared by the comm backends: the state behind a Work handle and the reduction kernels.
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>

#include "ds/comm/group.h"

namespace ds::comm::detail {

using Clock = std::chrono::steady_clock;

struct WorkState;

// The backend behind a Work: asked to explain (and act on) an expired deadline.
class WorkOwner {
 public:
  virtual ~WorkOwner() = default;
  // Returns the full message for the TimeoutError thrown by the waiter. Breaks the group.
  virtual std::string on_timeout(const WorkState& w) = 0;
};

struct WorkState {
  Group::Op op;
  uint64_t seq = 0;  // collectives: 1, 2, ... per group; send/recv: 0
  std::string group_name;
  int group_size = 1;
  Clock::time_point issued, deadline, started;
  std::weak_ptr<WorkOwner> owner;

  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  bool timed_out = false;
  std::string error;  // empty: success

  // Marks the operation finished (error empty = success), wakes waiters, drops the kept tensors and
  // records it in the comms_logger.
  void finish(std::string err = {}, bool is_timeout = false);
  // "all_reduce #17 [step 17] (4.00 MiB bf16 sum) on group world"
  std::string describe() const;
};

// A completed Work (size-1 group, empty ops).
Work completed_work(Group::Op op, const std::string& group_name, int group_size, uint64_t seq = 0);

// Seconds from DS_COMM_TIMEOUT (default 300) and DS_COMM_ABORT_GRACE (default 10).
double default_timeout_seconds();
double abort_grace_seconds();

std::string format_bytes(uint64_t bytes);  // "4.00 MiB"

// The size-1 world used when the process was not launched under MPI.
std::shared_ptr<Group> make_single_world();

// ---- reduction kernels (src/comm/reduce.cpp) ----
// dst[i] = srcs[0][i] op srcs[1][i] op ... op srcs[n_src-1][i], combined left to right. 16-bit
// inputs are widened to fp32, combined in fp32 and rounded once. dst may alias any src.
void reduce_n(void* dst, const void* const* srcs, int n_src, size_t n, DType dtype, ReduceOp op);

}  // namespace ds::comm::detail

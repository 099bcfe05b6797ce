#pragma once
// The MPI backend's per-group state: the communicators, the shared-memory arrival board and data
// window, and the communication thread that executes the group's operations in issue order.
// Built only with DS_WITH_MPI (src/comm/mpi_runtime.cpp, mpi_group.cpp, mpi_deadlines.cpp,
// shm.cpp). The C API only: OpenMPI's deprecated C++ bindings would otherwise come along.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/internal.h"

namespace ds::comm::detail {

// Exit status of a job ended because a deadline expired (as timeout(1)).
inline constexpr int kTimeoutExitCode = kCommFailureExitCode;

// One node-local rank's slot of the arrival board, in an MPI-3 shared-memory window. Written by its
// owner only (issued/kind by the caller thread, completed/barrier by the communication thread),
// read by every rank of the node when a deadline expires and, for `barrier`, by the shared-memory
// collectives. Separate cache lines so the polling of one does not slow the writing of the other.
// What a rank's communication thread is executing (shared-memory path), to catch ranks that issue
// different collectives under the same sequence number.
struct ExecRecord {
  uint64_t seq = 0;
  uint32_t kind = 0, dtype = 0, reduce = 0;
  uint64_t count = 0;
  int32_t root = 0;
  bool same_as(const ExecRecord& o) const {
    return kind == o.kind && dtype == o.dtype && count == o.count &&
           (static_cast<OpKind>(kind) == OpKind::broadcast ? root == o.root
            : static_cast<OpKind>(kind) == OpKind::reduce  ? root == o.root && reduce == o.reduce
                                                           : reduce == o.reduce);
  }
};

struct BoardSlot {
  alignas(64) std::atomic<uint64_t> issued{0};  // last collective sequence number issued
  std::atomic<uint32_t> issued_kind{0};         // its OpKind
  std::atomic<int32_t> pid{0};
  std::atomic<uint64_t> completed{0};  // every collective <= this has completed here
  std::atomic<uint32_t> exiting{0};  // 1 once this rank issues nothing more (group destroyed, exit)
  alignas(64) std::atomic<uint64_t> barrier{0};  // shared-memory barrier generation
  // Seqlock over the execution record: exec_seq is 0 while the fields change.
  alignas(64) std::atomic<uint64_t> exec_seq{0};
  std::atomic<uint32_t> exec_kind{0}, exec_dtype{0}, exec_reduce{0};
  std::atomic<int32_t> exec_root{0};
  std::atomic<uint64_t> exec_count{0};

  void write_exec(const ExecRecord& e) {
    exec_seq.store(0, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    exec_kind.store(e.kind, std::memory_order_relaxed);
    exec_dtype.store(e.dtype, std::memory_order_relaxed);
    exec_reduce.store(e.reduce, std::memory_order_relaxed);
    exec_root.store(e.root, std::memory_order_relaxed);
    exec_count.store(e.count, std::memory_order_relaxed);
    exec_seq.store(e.seq, std::memory_order_release);
  }
  // The record for `seq`, if that is what the slot holds right now.
  bool read_exec(uint64_t seq, ExecRecord& e) const {
    if (exec_seq.load(std::memory_order_acquire) != seq) return false;
    e.seq = seq;
    e.kind = exec_kind.load(std::memory_order_relaxed);
    e.dtype = exec_dtype.load(std::memory_order_relaxed);
    e.reduce = exec_reduce.load(std::memory_order_relaxed);
    e.root = exec_root.load(std::memory_order_relaxed);
    e.count = exec_count.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    return exec_seq.load(std::memory_order_relaxed) == seq;
  }
};
static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "shared-memory flags need lock-free atomics");

// An operation posted to MPI and not yet complete.
struct Active {
  std::shared_ptr<WorkState> w;
  MPI_Request req = MPI_REQUEST_NULL;
  std::function<void()> finish;  // after the request completes (frees copies); may throw
};

class GroupState : public WorkOwner, public std::enable_shared_from_this<GroupState> {
 public:
  // Collective over comm (takes ownership of it).
  GroupState(MPI_Comm comm, std::string name);
  ~GroupState() override;

  void start_thread();
  // Queue an operation (validated by Group::issue); deadline = now + timeout.
  Work submit(Group::Op op, double timeout_s, std::function<void()> blocking = {});
  // Drain every queued and posted operation (each bounded by its deadline), then stop the thread.
  void shutdown();
  // Free the windows and communicators (collective over the group; at finalize, creation order).
  void free_mpi();
  std::string on_timeout(const WorkState& w) override;

  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1;
  std::string name;
  std::vector<int> world_ranks;  // group rank -> world rank
  MPI_Comm node_comm = MPI_COMM_NULL;
  int node_rank = 0, node_size = 1, nodes = 1;
  std::vector<int> node_of_group;  // group rank -> node-local rank, -1 on another node
  std::vector<int> group_of_node;  // node-local rank -> group rank
  bool single_node = true;
  bool shm = false;  // the shared-memory collectives are on (single node, not disabled)

  std::atomic<bool> broken{false};
  void set_exiting() { board_[node_rank]->exiting.store(1, std::memory_order_release); }

 private:
  friend struct ShmOps;
  void loop();
  void execute(const std::shared_ptr<WorkState>& w, std::function<void()>& blocking);
  void post(const std::shared_ptr<WorkState>& w);
  bool poll_active();  // true when something completed
  void complete(const std::shared_ptr<WorkState>& w, std::string err = {}, bool timeout = false);
  void fail_all();
  // Deadline of the oldest collective (or `current`), and node-local peers that are exiting without
  // having issued it: throws after breaking the group. Cheap: runs every 50 ms at most.
  void check_peers(WorkState* current);
  // Shared-memory path, after the first barrier: do the peers run the same operation?
  void check_same_collective(const WorkState& w);
  // Marks the group broken with msg (first caller wins), prints it, arms the reaper that aborts
  // the job after the grace period. Returns the message in force.
  std::string break_group(const WorkState* w, std::string msg, bool timeout);
  std::string arrival_report(uint64_t seq, OpKind kind) const;
  std::string broken_message() const;

  // shared-memory collectives (shm.cpp)
 public:
  // Whether op runs on the shared-memory path (same answer on every rank: depends on op only).
  bool use_shm(const Group::Op& op) const;
  static constexpr size_t kShmBroadcastMin = size_t(16) << 20;
  // reduce (to a root): OpenMPI's is faster below ~8 MiB, ours above (bench_comm: 0.55-0.77x at
  // 64 KiB-4 MiB, 1.1-4.3x at 8-64 MiB).
  static constexpr size_t kShmReduceMin = size_t(8) << 20;
  void shm_run(WorkState& w);
  // shm_run's collectives, each over the double-buffered node regions (shm.cpp): between two
  // barriers a rank writes the regions of write_parity() and reads what was written before the
  // barrier, in read_parity().
  int write_parity() const { return static_cast<int>(interval_ & 1); }
  int read_parity() const { return static_cast<int>((interval_ + 1) & 1); }
  void shm_reduce_scatter(WorkState& w);
  void shm_reduce(WorkState& w);
  void shm_all_reduce(WorkState& w);
  void shm_broadcast(WorkState& w);
  void shm_barrier(WorkState& w);
  char* region(int node_rank, int parity, int which) const;  // which: 0 input, 1 result
  size_t slot_bytes = 0;
  // Spin until pred() holds, progressing posted MPI requests, honouring w's deadline.
  void spin_until(WorkState& w, const std::function<bool()>& pred);

 private:
  MPI_Win board_win_ = MPI_WIN_NULL, data_win_ = MPI_WIN_NULL;
  std::vector<BoardSlot*> board_;  // by node-local rank
  std::vector<char*> data_;        // by node-local rank
  uint64_t interval_ = 0;          // shared-memory barriers passed (communication thread only)
  bool check_pending_ = false;     // the current shared-memory op has not passed a barrier yet

  mutable std::mutex mu_;
  std::condition_variable cv_;
  struct Queued {
    std::shared_ptr<WorkState> w;
    std::function<void()> blocking;  // split: runs on the thread, blocking MPI
  };
  std::deque<Queued> queue_;
  std::map<uint64_t, std::shared_ptr<WorkState>> inflight_;  // collectives issued, not complete
  uint64_t next_seq_ = 0;
  bool stop_ = false, stopped_ = false, freed_ = false;
  std::vector<Active> active_;  // communication thread only
  std::thread thread_;

  mutable std::mutex timeout_mu_;
  std::string broken_msg_;
  const WorkState* broken_by_ = nullptr;  // identity only, never dereferenced
  bool broken_by_timeout_ = false;
  Clock::time_point last_peer_check_{};
};

// MPI datatype and op for a dtype / reduction (custom ops for 16-bit types and NaN-aware max).
MPI_Datatype mpi_type(DType t);
MPI_Op mpi_op(DType t, ReduceOp op);
void check_mpi(int rc, const char* what);

// End the job now on every rank (MPI_Abort, or _Exit without MPI).
[[noreturn]] void abort_now(int code);

// ---- shared by the backend's files (mpi_runtime.cpp, mpi_group.cpp, mpi_deadlines.cpp) ----

// ---- process-wide state (leaked on purpose: it must outlive static destructors and atexit) ----
struct Runtime {
  std::mutex mu;
  bool mpi_initialized = false;  // by us
  bool finalized = false;
  std::shared_ptr<Group> world;
  std::vector<std::shared_ptr<GroupState>> states;  // creation order
  std::vector<std::string> hosts;                   // world rank -> host name
  std::vector<MPI_Op> ops;                          // custom reduction ops
};
Runtime& rt();
// Set once any group broke: finalisation then ends the job instead of waiting for stuck ranks.
extern std::atomic<bool> g_any_broken;

std::string env(const char* name);                  // "" when unset
std::string rank_list(const std::vector<int>& rs);  // "rank 3" / "ranks 1, 2"
Clock::duration seconds_to_duration(double s);
// Collective over comm: builds a group's state (windows, board), starts its thread, registers it.
std::shared_ptr<Group> make_group(MPI_Comm comm, std::string name);

// Back-off for polling loops: spin briefly, then yield the core (ranks may outnumber cores, and the
// caller's computation shares it), then sleep once it is clear that a peer is late, so that a rank
// waiting for a slow peer costs almost no CPU. Time-based, so that long transfers that need
// frequent progress calls (MPI's) keep being polled while they move data.
class Backoff {
 public:
  void pause() {
    if (n_ < 64) {
      ++n_;
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
      if (n_ == 64) since_ = Clock::now();
      return;
    }
    const auto waited = Clock::now() - since_;
    if (waited < std::chrono::milliseconds(50))
      std::this_thread::yield();
    else if (waited < std::chrono::seconds(1))
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    else
      std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  void reset() {
    n_ = 0;
  }

 private:
  int n_ = 0;
  Clock::time_point since_;
};

}  // namespace ds::comm::detail

#pragma once
// Collective communication: one `Group` abstraction with a size-1 form and an MPI backend.
//
//   auto g = ds::comm::init_from_environment();   // MPI under mpirun / `deepspeed`, else size 1
//   g->all_reduce(grads, ds::comm::ReduceOp::sum, "step 17");
//   ds::comm::Work w = g->reduce_scatter_async(bucket, shard, ReduceOp::sum, "step 17 bucket 3");
//   ... compute ...
//   w.wait();                                      // deadline-bounded
//
// Every collective has a blocking form and an `_async` form returning a `Work` handle. All ranks of
// a group must issue the group's collectives in the same order (as with MPI and NCCL); different
// groups are independent (each has its own communication thread, so they never deadlock on one
// another). Buffers must stay alive and untouched until the Work completes; the Tensor overloads
// keep their tensors alive themselves.
//
// Device tensors: the MPI backend moves host memory, so the Tensor overloads take a tensor on a
// GPU (or the `sim` device) through host memory: an input is copied down when the operation is
// issued, an output copied up inside the Work's wait() (on the waiting thread), so the tensor holds
// the result once wait() returns, as for a host tensor. This costs a copy each way and serialises
// the copy with the collective; GPU-to-GPU collectives (NCCL) are not built yet (docs/cuda.md).
//
// Execution (MPI backend): each group owns a communication thread that executes its operations in
// issue order, so the caller returns at once and computes while the collective runs. Within one
// node, all_reduce, reduce_scatter, barrier, large reduces and broadcasts run as our shared-memory
// collectives (an MPI-3 shared window: every rank copies its input in, then reduces its own part
// reading all ranks' copies, memory-bandwidth bound); everything else, and everything across
// nodes, is MPI's non-blocking collectives posted and progressed by the thread. See
// docs/communication.md.
//
// Failures: every wait has a deadline (`timeout()`, default 300 s, env DS_COMM_TIMEOUT in
// seconds). On expiry the waiting rank prints and throws `TimeoutError` naming the operation, its
// sequence number, the caller's context string and the ranks that did not arrive (read from a
// shared-memory arrival board). A node-local peer that exits without issuing the collective, and
// ranks issuing different collectives under one sequence number, are reported at once (ds::Error).
// The group is then unusable, and because the other ranks would otherwise wait forever, the job is
// ended on every rank with MPI_Abort (exit status 124): at this process's exit, or after a grace
// period (env DS_COMM_ABORT_GRACE, default 10 s) if the process has not exited by then.
//
// Dtypes: fp32, bf16, fp16, int32, int64. Sums of 16-bit values are computed in fp32 per element
// and rounded once (shared-memory path: exactly round(x_0 + x_1 + ... + x_{N-1}) summed in rank
// order; MPI path: a custom MPI_Op that rounds once per pairwise combine, so N-1 roundings at
// most). MAX propagates NaN for floating dtypes.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ds/core/dtype.h"
#include "ds/core/error.h"
#include "ds/core/tensor.h"

namespace ds::comm {

enum class ReduceOp : uint8_t { sum, max };
const char* reduce_op_name(ReduceOp op);  // "sum", "max"

enum class OpKind : uint8_t {
  all_reduce,
  reduce_scatter,
  reduce,
  all_gather,
  broadcast,
  barrier,
  send,
  recv,
  split,
  all_to_all,
  all_to_all_v
};
const char* op_name(OpKind op);  // "all_reduce", ...
inline constexpr int kNumOpKinds = 11;

// A deadline expired. what() names the operation, its sequence number, context and missing ranks.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// What a group can do (ggml's supports_op): ask instead of failing deep inside a collective.
struct Capabilities {
  std::string backend;         // "single" or "mpi"
  bool async = false;          // _async forms overlap computation (a communication thread)
  bool shared_memory = false;  // all ranks on one node and the shared-memory collectives are on
  int nodes = 1;               // distinct nodes spanned by the group
  std::vector<DType> dtypes;   // every collective accepts these
  bool supports(OpKind op, DType dtype, ReduceOp reduce = ReduceOp::sum) const;
  std::string str() const;  // one line, for start-up banners
};

namespace detail {
struct WorkState;
struct AfterWait;
}

// Handle to an issued operation. Copyable; a default-constructed Work is already complete.
class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<detail::WorkState> state) : state_(std::move(state)) {}
  // True once the operation finished (successfully or not). Never blocks.
  bool test() const;
  // Blocks until the operation finished; rethrows its error. Throws TimeoutError when the group's
  // deadline (counted from the issue) expires first.
  void wait() const;
  // The operation's sequence number in its group (collectives count 1, 2, ...; 0 for send/recv).
  uint64_t sequence() const;
  // This Work with f run once, on the thread whose wait() first returns successfully, before that
  // wait() returns (every copy of the returned Work shares it). The Tensor overloads use it to copy
  // a device tensor's result up from its host staging on the caller's thread.
  Work after_wait(std::function<void()> f) const;

 private:
  std::shared_ptr<detail::WorkState> state_;
  std::shared_ptr<detail::AfterWait> after_;
};

class Group {
 public:
  virtual ~Group() = default;
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Capabilities capabilities() const = 0;
  // A short name for messages: "world", "world.split(1)".
  const std::string& name() const { return name_; }
  // This group's rank r as a rank of the world group (for messages and launch-level tools).
  virtual int world_rank(int r) const = 0;

  // Collective: ranks passing the same color form a new group, ordered by (key, rank); key < 0
  // means "my rank". color < 0 joins no group and returns nullptr (MPI_UNDEFINED).
  virtual std::shared_ptr<Group> split(int color, int key = -1) = 0;

  // Deadline of every wait on this group, in seconds (default: DS_COMM_TIMEOUT or 300).
  void set_timeout(double seconds);
  double timeout() const { return timeout_s_; }

  // ---- raw buffers: `count` elements of `dtype`, contiguous host memory ----
  // In place: buf = op over ranks of buf.
  Work all_reduce_async(void* buf, size_t count, DType dtype, ReduceOp op = ReduceOp::sum,
                        std::string_view context = {});
  // in (size() * chunk) -> out (chunk): out = op over ranks of in[rank() * chunk, +chunk).
  // out may alias in's own chunk (out == in + rank() * chunk).
  Work reduce_scatter_async(const void* in, void* out, size_t chunk, DType dtype,
                            ReduceOp op = ReduceOp::sum, std::string_view context = {});
  // In place: on `root`, buf receives the reduction of every rank's buf; elsewhere buf is only
  // read.
  Work reduce_async(void* buf, size_t count, DType dtype, int root, ReduceOp op = ReduceOp::sum,
                    std::string_view context = {});
  // in (chunk) -> out (size() * chunk), rank r's chunk at out + r * chunk. In place when
  // in == out + rank() * chunk.
  Work all_gather_async(const void* in, void* out, size_t chunk, DType dtype,
                        std::string_view context = {});
  // In place: every rank's buf becomes root's.
  Work broadcast_async(void* buf, size_t count, DType dtype, int root,
                       std::string_view context = {});
  Work barrier_async(std::string_view context = {});
  // in (size() * chunk) -> out (size() * chunk): rank r's in[j * chunk, +chunk) lands at
  // out[r * chunk, +chunk) of rank j (MPI_Alltoall). in and out must not overlap.
  Work all_to_all_async(const void* in, void* out, size_t chunk, DType dtype,
                        std::string_view context = {});
  // Variable sizes (MPI_Alltoallv, packed): in holds send_counts[j] elements for each rank j, one
  // run after another in rank order; out receives recv_counts[j] elements from each rank j, in
  // rank order. recv_counts[j] must equal rank j's send_counts[rank()]: exchange the counts first
  // (all_to_all_counts). Both vectors have size() entries; in and out must not overlap.
  Work all_to_all_v_async(const void* in, std::vector<size_t> send_counts, void* out,
                          std::vector<size_t> recv_counts, DType dtype,
                          std::string_view context = {});
  // Point to point; (src, tag) pairs match in issue order. Not collective: no sequence number.
  Work send_async(const void* buf, size_t count, DType dtype, int dst, int tag,
                  std::string_view context = {});
  Work recv_async(void* buf, size_t count, DType dtype, int src, int tag,
                  std::string_view context = {});

  void all_reduce(void* buf, size_t count, DType dtype, ReduceOp op = ReduceOp::sum,
                  std::string_view context = {}) {
    all_reduce_async(buf, count, dtype, op, context).wait();
  }
  void reduce_scatter(const void* in, void* out, size_t chunk, DType dtype,
                      ReduceOp op = ReduceOp::sum, std::string_view context = {}) {
    reduce_scatter_async(in, out, chunk, dtype, op, context).wait();
  }
  void reduce(void* buf, size_t count, DType dtype, int root, ReduceOp op = ReduceOp::sum,
              std::string_view context = {}) {
    reduce_async(buf, count, dtype, root, op, context).wait();
  }
  void all_gather(const void* in, void* out, size_t chunk, DType dtype,
                  std::string_view context = {}) {
    all_gather_async(in, out, chunk, dtype, context).wait();
  }
  void broadcast(void* buf, size_t count, DType dtype, int root, std::string_view context = {}) {
    broadcast_async(buf, count, dtype, root, context).wait();
  }
  void barrier(std::string_view context = {}) { barrier_async(context).wait(); }
  void all_to_all(const void* in, void* out, size_t chunk, DType dtype,
                  std::string_view context = {}) {
    all_to_all_async(in, out, chunk, dtype, context).wait();
  }
  void all_to_all_v(const void* in, std::vector<size_t> send_counts, void* out,
                    std::vector<size_t> recv_counts, DType dtype, std::string_view context = {}) {
    all_to_all_v_async(in, std::move(send_counts), out, std::move(recv_counts), dtype, context)
        .wait();
  }
  // What every rank sends this one: send_counts (size() entries, this rank's count for each rank)
  // in, recv[j] = rank j's send_counts[rank()] out. One all_to_all of int64 (a collective).
  std::vector<size_t> all_to_all_counts(const std::vector<size_t>& send_counts,
                                        std::string_view context = {});
  void send(const void* buf, size_t count, DType dtype, int dst, int tag,
            std::string_view context = {}) {
    send_async(buf, count, dtype, dst, tag, context).wait();
  }
  void recv(void* buf, size_t count, DType dtype, int src, int tag, std::string_view context = {}) {
    recv_async(buf, count, dtype, src, tag, context).wait();
  }

  // ---- tensors: contiguous, materialised, on any device (above); the Work keeps them alive ----
  Work all_reduce_async(const Tensor& t, ReduceOp op = ReduceOp::sum,
                        std::string_view context = {});
  // in.numel() == size() * out.numel(), same dtype.
  Work reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op = ReduceOp::sum,
                            std::string_view context = {});
  // In place on root (t holds the reduction there; elsewhere t is only read).
  Work reduce_async(const Tensor& t, int root, ReduceOp op = ReduceOp::sum,
                    std::string_view context = {});
  // out.numel() == size() * in.numel(), same dtype.
  Work all_gather_async(const Tensor& in, const Tensor& out, std::string_view context = {});
  Work broadcast_async(const Tensor& t, int root, std::string_view context = {});
  Work send_async(const Tensor& t, int dst, int tag, std::string_view context = {});
  Work recv_async(const Tensor& t, int src, int tag, std::string_view context = {});

  void all_reduce(const Tensor& t, ReduceOp op = ReduceOp::sum, std::string_view context = {}) {
    all_reduce_async(t, op, context).wait();
  }
  void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op = ReduceOp::sum,
                      std::string_view context = {}) {
    reduce_scatter_async(in, out, op, context).wait();
  }
  void reduce(const Tensor& t, int root, ReduceOp op = ReduceOp::sum,
              std::string_view context = {}) {
    reduce_async(t, root, op, context).wait();
  }
  void all_gather(const Tensor& in, const Tensor& out, std::string_view context = {}) {
    all_gather_async(in, out, context).wait();
  }
  void broadcast(const Tensor& t, int root, std::string_view context = {}) {
    broadcast_async(t, root, context).wait();
  }
  void send(const Tensor& t, int dst, int tag, std::string_view context = {}) {
    send_async(t, dst, tag, context).wait();
  }
  void recv(const Tensor& t, int src, int tag, std::string_view context = {}) {
    recv_async(t, src, tag, context).wait();
  }

  // ---- backend interface (what a backend implements; callers use the methods above) ----
  struct Op {
    OpKind kind = OpKind::barrier;
    const void* in = nullptr;  // all_reduce/broadcast/recv: unused (buffer is `out`)
    void* out = nullptr;
    size_t count = 0;  // all_reduce/broadcast/send/recv: elements; reduce_scatter/all_gather: chunk
    DType dtype = DType::f32;
    ReduceOp reduce = ReduceOp::sum;
    int peer = 0;  // broadcast, reduce: root; send: destination; recv: source
    int tag = 0;
    // all_to_all_v: elements to and from each rank (count is their larger sum).
    std::vector<size_t> send_counts{}, recv_counts{};
    std::string context{};
    std::vector<Tensor> keep_alive{};
    int group_size = 1;    // set by issue()
    size_t bytes() const;  // bytes of the larger buffer (the comms_logger's message size)
  };

 protected:
  explicit Group(std::string name);
  // Runs op (already validated); returns its handle.
  virtual Work start(Op op) = 0;

 private:
  Work issue(Op op);
  std::string name_;
  double timeout_s_;
};

// The process's world group: MPI when the process was started by mpirun (directly or through the
// `deepspeed` launcher: OMPI_COMM_WORLD_SIZE / PMIX_RANK, or RANK / WORLD_SIZE), otherwise a size-1
// group. Initialises MPI on first use (MPI_THREAD_MULTIPLE) and registers finalisation at exit.
// Throws "[comm] built without MPI" when launched with WORLD_SIZE > 1 in a build without MPI, and
// a "[comm] ... not started by mpirun" error when WORLD_SIZE > 1 without mpirun's environment.
// If the program initialised MPI itself (with MPI_THREAD_MULTIPLE), that MPI is used and the
// program calls finalize() before its own MPI_Finalize.
std::shared_ptr<Group> init_from_environment();
std::shared_ptr<Group> world();  // init_from_environment() on first call, then the same group
// A standalone size-1 group (every collective a copy or a no-op). Always available.
std::shared_ptr<Group> single_process_group();
bool mpi_available();  // built with MPI

// Ends MPI: drains every group's pending operations, frees windows and communicators,
// MPI_Finalize. Registered with atexit by init; calling it earlier is allowed (then no group may
// be used again). When a group is broken (a deadline expired) it ends the job with MPI_Abort
// instead, since MPI_Finalize would wait for ranks that are stuck.
void finalize();
// For main(): end the whole job now on every rank (MPI_Abort; exit(code) without MPI), after
// printing `why` to stderr. The way for a rank that hit a fatal error to stop its peers, which
// would otherwise wait for it until their deadlines.
[[noreturn]] void abort_job(int code, std::string_view why);

// A collective status check, for work that each rank does on its own and that can fail on some
// ranks only (writing a checkpoint shard, opening a file): every rank passes its own error ("" on
// success); when any rank failed, every rank throws ds::Error, the failing ranks with their own
// message, the others naming the ranks that failed, so that no rank goes on to wait for a peer that
// stopped. `what` names the work in the message ("writing checkpoint global_step8"). A collective
// (one all-gather of a status per rank, bounded by the group's deadline).
void raise_if_any_failed(Group& group, const std::string& error, std::string_view what);

// True once the communication layer has found the job broken (a deadline expired, ranks issued
// different collectives, a peer exited mid-collective). Its message has then been printed to stderr
// already and the job is being ended with kCommFailureExitCode; a main() that catches the resulting
// exception should call abort_job(kCommFailureExitCode, "") instead of printing it a second time.
bool job_failed();
inline constexpr int kCommFailureExitCode = 124;

}  // namespace ds::comm

// The MPI backend: initialisation from mpirun's environment, one communication thread per group,
// deadlines with an arrival board, finalisation. Shared-memory collectives are in shm.cpp.
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>

#include "comm/mpi_state.h"
#include "ds/comm/group.h"
#include "ds/comm/logger.h"

namespace ds::comm {
namespace detail {
namespace {

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

Runtime& rt() {
  static Runtime* r = new Runtime();
  return *r;
}

std::atomic<bool> g_any_broken{false};

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string rank_list(const std::vector<int>& rs) {
  std::string s = rs.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < rs.size(); ++i) s += (i ? ", " : "") + std::to_string(rs[i]);
  return s;
}

// ---- custom reductions: 16-bit floats combined in fp32 and rounded once; NaN-propagating max ----
template <DType D, ReduceOp R>
void user_op(void* in, void* inout, int* len, MPI_Datatype*) {
  const void* srcs[2] = {in, inout};
  reduce_n(inout, srcs, 2, static_cast<size_t>(*len), D, R);
}

MPI_Op g_bf16_sum, g_bf16_max, g_f16_sum, g_f16_max, g_f32_max;

void create_ops() {
  auto make = [](MPI_User_function* fn) {
    MPI_Op op;
    check_mpi(MPI_Op_create(fn, 1, &op), "MPI_Op_create");
    rt().ops.push_back(op);
    return op;
  };
  g_bf16_sum = make(&user_op<DType::bf16, ReduceOp::sum>);
  g_bf16_max = make(&user_op<DType::bf16, ReduceOp::max>);
  g_f16_sum = make(&user_op<DType::f16, ReduceOp::sum>);
  g_f16_max = make(&user_op<DType::f16, ReduceOp::max>);
  g_f32_max = make(&user_op<DType::f32, ReduceOp::max>);
}

Clock::duration seconds_to_duration(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

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

}  // namespace

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  DS_THROW("[comm] {} failed: {}", what, std::string(msg, len));
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::bf16:
    case DType::f16:
      return MPI_UINT16_T;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
  }
  return MPI_BYTE;
}

MPI_Op mpi_op(DType t, ReduceOp op) {
  switch (t) {
    case DType::f32:
      return op == ReduceOp::sum ? MPI_SUM : g_f32_max;
    case DType::bf16:
      return op == ReduceOp::sum ? g_bf16_sum : g_bf16_max;
    case DType::f16:
      return op == ReduceOp::sum ? g_f16_sum : g_f16_max;
    default:
      return op == ReduceOp::sum ? MPI_SUM : MPI_MAX;
  }
}

void abort_now(int code) {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  std::fflush(stdout);
  std::fflush(stderr);
  if (init && !fin) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

// ---- GroupState ----

GroupState::GroupState(MPI_Comm c, std::string n) : comm(c), name(std::move(n)) {
  check_mpi(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);

  // Group ranks -> world ranks (for messages).
  MPI_Group g, wg;
  MPI_Comm_group(comm, &g);
  MPI_Comm_group(MPI_COMM_WORLD, &wg);
  std::vector<int> mine(size);
  for (int i = 0; i < size; ++i) mine[i] = i;
  world_ranks.resize(size);
  MPI_Group_translate_ranks(g, size, mine.data(), wg, world_ranks.data());
  MPI_Group_free(&g);
  MPI_Group_free(&wg);

  // The ranks of this group on this node, ordered by group rank.
  check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node_comm),
            "MPI_Comm_split_type");
  MPI_Comm_rank(node_comm, &node_rank);
  MPI_Comm_size(node_comm, &node_size);
  group_of_node.resize(node_size);
  MPI_Allgather(&rank, 1, MPI_INT, group_of_node.data(), 1, MPI_INT, node_comm);
  node_of_group.assign(size, -1);
  for (int i = 0; i < node_size; ++i) node_of_group[group_of_node[i]] = i;
  int leader = node_rank == 0 ? 1 : 0;
  MPI_Allreduce(&leader, &nodes, 1, MPI_INT, MPI_SUM, comm);
  single_node = node_size == size;

  MPI_Info info;
  MPI_Info_create(&info);
  MPI_Info_set(info, "alloc_shared_noncontig", "true");  // each rank's slot on its own pages

  // Arrival board: one slot per node-local rank.
  void* base = nullptr;
  check_mpi(MPI_Win_allocate_shared(sizeof(BoardSlot), 1, info, node_comm, &base, &board_win_),
            "MPI_Win_allocate_shared (arrival board)");
  new (base) BoardSlot();
  static_cast<BoardSlot*>(base)->pid.store(static_cast<int32_t>(getpid()));
  board_.resize(node_size);
  for (int i = 0; i < node_size; ++i) {
    MPI_Aint sz;
    int du;
    void* p;
    MPI_Win_shared_query(board_win_, i, &sz, &du, &p);
    board_[i] = static_cast<BoardSlot*>(p);
  }
  MPI_Win_lock_all(MPI_MODE_NOCHECK, board_win_);

  // Shared-memory collectives: every rank of the group must be on this node, and every rank must
  // agree (DS_COMM_SHM=0 on any rank turns them off for all).
  int want = single_node && env("DS_COMM_SHM") != "0" ? 1 : 0, all = 0;
  MPI_Allreduce(&want, &all, 1, MPI_INT, MPI_MIN, comm);
  shm = all == 1 && size > 1;
  if (shm) {
    slot_bytes = 2u << 20;
    if (std::string s = env("DS_COMM_SHM_SLOT_KIB"); !s.empty()) slot_bytes = std::stoul(s) << 10;
    // Every rank must use the same slot size: take rank 0's.
    // Pieces are at least 32 elements of 8 bytes per rank, and whole pages.
    slot_bytes = std::max<size_t>(slot_bytes, size_t(256) * size);
    slot_bytes = (slot_bytes + 4095) / 4096 * 4096;
    unsigned long sb = slot_bytes;
    MPI_Bcast(&sb, 1, MPI_UNSIGNED_LONG, 0, comm);
    slot_bytes = sb;
    check_mpi(MPI_Win_allocate_shared(static_cast<MPI_Aint>(4 * slot_bytes), 1, info, node_comm,
                                      &base, &data_win_),
              "MPI_Win_allocate_shared (collective buffers)");
    std::memset(base, 0, 4 * slot_bytes);  // first touch by the owner
    data_.resize(node_size);
    for (int i = 0; i < node_size; ++i) {
      MPI_Aint sz;
      int du;
      void* p;
      MPI_Win_shared_query(data_win_, i, &sz, &du, &p);
      data_[i] = static_cast<char*>(p);
    }
    MPI_Win_lock_all(MPI_MODE_NOCHECK, data_win_);
  }
  MPI_Info_free(&info);
  MPI_Barrier(node_comm);  // every slot constructed before anyone reads it
}

GroupState::~GroupState() = default;  // MPI objects are freed by free_mpi() at finalize

void GroupState::start_thread() {
  thread_ = std::thread([this] { loop(); });
}

Work GroupState::submit(Group::Op op, double timeout_s, std::function<void()> blocking) {
  auto w = std::make_shared<WorkState>();
  const bool collective = op.kind != OpKind::send && op.kind != OpKind::recv;
  w->op = std::move(op);
  w->group_name = name;
  w->group_size = size;
  w->issued = w->started = Clock::now();
  w->deadline = w->issued + seconds_to_duration(timeout_s);
  w->owner = shared_from_this();
  {
    std::lock_guard lk(mu_);
    DS_CHECK(!stopped_ && !stop_,
             "[comm] {} issued on group {} after ds::comm::finalize() or the group's destruction",
             op_name(w->op.kind), name);
    if (collective) w->seq = ++next_seq_;
    if (broken) {
      // Still numbered, so that the message says which call came after the failure.
      w->finish(fmt::format("[comm] {} not started: {}", w->describe(), broken_message()),
                broken_by_timeout_);
      return Work(w);
    }
    if (collective) {
      BoardSlot& me = *board_[node_rank];
      me.issued_kind.store(static_cast<uint32_t>(w->op.kind), std::memory_order_relaxed);
      me.issued.store(w->seq, std::memory_order_release);
      inflight_.emplace(w->seq, w);
    }
    queue_.push_back({w, std::move(blocking)});
  }
  cv_.notify_one();
  return Work(w);
}

void GroupState::loop() {
  Backoff backoff;
  for (;;) {
    Queued q;
    {
      std::unique_lock lk(mu_);
      if (active_.empty()) cv_.wait(lk, [&] { return !queue_.empty() || stop_; });
      if (!queue_.empty()) {
        q = std::move(queue_.front());
        queue_.pop_front();
      } else if (stop_ && active_.empty()) {
        return;
      }
    }
    if (broken) {
      if (q.w) complete(q.w, broken_message(), broken_by_timeout_);
      fail_all();
      continue;
    }
    if (q.w) {
      execute(q.w, q.blocking);
      backoff.reset();
      continue;
    }
    if (poll_active()) {
      backoff.reset();
    } else {
      try {
        check_peers(nullptr);
      } catch (const std::exception&) {
        // The group is broken; the loop fails everything on its next turn.
      }
      backoff.pause();
    }
  }
}

bool GroupState::use_shm(const Group::Op& op) const {
  if (!shm) return false;
  switch (op.kind) {
    case OpKind::all_reduce:
    case OpKind::reduce_scatter:
    case OpKind::barrier:
      return true;
    case OpKind::reduce:
      return op.bytes() >= kShmReduceMin;
    // OpenMPI copies large messages once, straight between the processes (CMA); ours copies
    // twice, through the window. Measured (bench_comm): MPI wins all_gather at every size and
    // broadcast below 16 MiB.
    case OpKind::broadcast:
      return op.bytes() >= kShmBroadcastMin;
    default:
      return false;
  }
}

void GroupState::execute(const std::shared_ptr<WorkState>& w, std::function<void()>& blocking) {
  w->started = Clock::now();
  try {
    if (blocking) {
      blocking();
      complete(w);
    } else if (use_shm(w->op)) {
      shm_run(*w);
      complete(w);
    } else {
      post(w);
    }
  } catch (const TimeoutError& e) {
    complete(w, e.what(), true);
  } catch (const std::exception& e) {
    complete(w, e.what());
  }
}

namespace {

bool overlaps(const void* a, size_t na, const void* b, size_t nb) {
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return na && nb && pa < pb + nb && pb < pa + na;
}

int int_count(size_t n, const WorkState& w) {
  DS_CHECK(n <= static_cast<size_t>(INT32_MAX),
           "[comm] {}: {} elements exceed MPI's int count; split the buffer into buckets",
           w.describe(), n);
  return static_cast<int>(n);
}

}  // namespace

void GroupState::post(const std::shared_ptr<WorkState>& w) {
  Group::Op& op = w->op;
  const size_t es = dtype_size(op.dtype);
  MPI_Datatype type = mpi_type(op.dtype);
  Active a{w, MPI_REQUEST_NULL, {}};
  MPI_Request r = MPI_REQUEST_NULL;
  switch (op.kind) {
    case OpKind::all_reduce:
      check_mpi(MPI_Iallreduce(MPI_IN_PLACE, op.out, int_count(op.count, *w), type,
                               mpi_op(op.dtype, op.reduce), comm, &r),
                "MPI_Iallreduce");
      break;
    case OpKind::reduce_scatter: {
      const void* in = op.in;
      if (overlaps(op.in, op.count * size * es, op.out, op.count * es)) {
        // MPI forbids aliasing; a copy of the input keeps it simple (the shared-memory path
        // handles the in-place case without one).
        auto tmp = std::make_shared<std::vector<char>>(
            static_cast<const char*>(op.in),
            static_cast<const char*>(op.in) + op.count * size * es);
        in = tmp->data();
        a.finish = [tmp] {};
      }
      check_mpi(MPI_Ireduce_scatter_block(in, op.out, int_count(op.count, *w), type,
                                          mpi_op(op.dtype, op.reduce), comm, &r),
                "MPI_Ireduce_scatter_block");
      break;
    }
    case OpKind::all_gather: {
      const void* in = op.in;
      const int n = int_count(op.count, *w);
      if (in == static_cast<char*>(op.out) + rank * op.count * es) {
        in = MPI_IN_PLACE;
      } else if (overlaps(op.in, op.count * es, op.out, op.count * size * es)) {
        auto tmp = std::make_shared<std::vector<char>>(
            static_cast<const char*>(op.in), static_cast<const char*>(op.in) + op.count * es);
        in = tmp->data();
        a.finish = [tmp] {};
      }
      check_mpi(MPI_Iallgather(in, n, type, op.out, n, type, comm, &r), "MPI_Iallgather");
      break;
    }
    case OpKind::reduce:
      check_mpi(
          MPI_Ireduce(rank == op.peer ? MPI_IN_PLACE : op.out, op.out, int_count(op.count, *w),
                      type, mpi_op(op.dtype, op.reduce), op.peer, comm, &r),
          "MPI_Ireduce");
      break;
    case OpKind::broadcast:
      check_mpi(MPI_Ibcast(op.out, int_count(op.count, *w), type, op.peer, comm, &r), "MPI_Ibcast");
      break;
    case OpKind::barrier:
      check_mpi(MPI_Ibarrier(comm, &r), "MPI_Ibarrier");
      break;
    case OpKind::send:
      check_mpi(MPI_Isend(op.in, int_count(op.count, *w), type, op.peer, op.tag, comm, &r),
                "MPI_Isend");
      break;
    case OpKind::recv: {
      check_mpi(MPI_Irecv(op.out, int_count(op.count, *w), type, op.peer, op.tag, comm, &r),
                "MPI_Irecv");
      break;
    }
    case OpKind::split:
      DS_THROW("[comm] split is not posted");
  }
  a.req = r;
  active_.push_back(std::move(a));
}

bool GroupState::poll_active() {
  bool any = false;
  for (size_t i = 0; i < active_.size();) {
    Active& a = active_[i];
    int flag = 0;
    MPI_Status st;
    const int rc = MPI_Test(&a.req, &flag, &st);
    if (rc != MPI_SUCCESS) {
      std::shared_ptr<WorkState> w = a.w;
      active_.erase(active_.begin() + i);
      std::string err;
      try {
        check_mpi(rc, op_name(w->op.kind));
      } catch (const std::exception& e) {
        err = fmt::format("[comm] {}: {}", w->describe(), e.what());
      }
      // A collective that failed half-way leaves the ranks out of step: end the job.
      if (w->seq) err = break_group(w.get(), err, false);
      complete(w, err);
      any = true;
      continue;
    }
    if (!flag) {
      ++i;
      continue;
    }
    Active done = std::move(a);
    active_.erase(active_.begin() + i);
    any = true;
    std::string err;
    try {
      if (done.w->op.kind == OpKind::recv) {
        int got = 0;
        MPI_Get_count(&st, mpi_type(done.w->op.dtype), &got);
        DS_CHECK(static_cast<size_t>(got) == done.w->op.count,
                 "[comm] {}: the matching send carried {} elements", done.w->describe(), got);
      }
      if (done.finish) done.finish();
    } catch (const std::exception& e) {
      err = e.what();
    }
    complete(done.w, err);
  }
  return any;
}

void GroupState::complete(const std::shared_ptr<WorkState>& w, std::string err, bool timeout) {
  if (w->seq) {
    std::lock_guard lk(mu_);
    inflight_.erase(w->seq);
    const uint64_t c = inflight_.empty() ? next_seq_ : inflight_.begin()->first - 1;
    board_[node_rank]->completed.store(c, std::memory_order_release);
  }
  w->finish(std::move(err), timeout);
}

void GroupState::fail_all() {
  const std::string msg = broken_message();
  std::vector<Active> act;
  act.swap(active_);  // MPI requests abandoned: the job is about to be aborted
  for (Active& a : act) complete(a.w, msg, broken_by_timeout_);
  std::deque<Queued> q;
  {
    std::lock_guard lk(mu_);
    q.swap(queue_);
  }
  for (Queued& e : q) complete(e.w, msg, broken_by_timeout_);
}

void GroupState::spin_until(WorkState& w, const std::function<bool()>& pred) {
  Backoff backoff;
  for (uint64_t i = 0; !pred(); ++i) {
    if ((i & 63) == 63) {
      if (broken) DS_THROW("{}", broken_message());
      check_peers(&w);
      if (!active_.empty() && poll_active()) backoff.reset();
    }
    backoff.pause();
  }
}

void GroupState::shutdown() {
  {
    std::lock_guard lk(mu_);
    if (stopped_) return;
    stop_ = true;
  }
  // This rank will issue nothing more on the group: a peer waiting for it fails at once.
  set_exiting();
  cv_.notify_all();
  if (thread_.joinable()) {
    // A broken group's thread may sit in a blocking MPI call forever; the job is being aborted.
    if (broken)
      thread_.detach();
    else
      thread_.join();
  }
  std::lock_guard lk(mu_);
  stopped_ = true;
}

void GroupState::free_mpi() {
  if (freed_) return;
  freed_ = true;
  if (data_win_ != MPI_WIN_NULL) {
    MPI_Win_unlock_all(data_win_);
    MPI_Win_free(&data_win_);
  }
  if (board_win_ != MPI_WIN_NULL) {
    MPI_Win_unlock_all(board_win_);
    MPI_Win_free(&board_win_);
  }
  if (node_comm != MPI_COMM_NULL) MPI_Comm_free(&node_comm);
  if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
}

// ---- deadlines ----

std::string GroupState::broken_message() const {
  std::lock_guard lk(timeout_mu_);
  return broken_msg_.empty() ? fmt::format("[comm] group {} is broken", name) : broken_msg_;
}

std::string GroupState::arrival_report(uint64_t seq, OpKind kind) const {
  const Runtime& R = rt();
  auto who = [&](int r) {
    const int wr = world_ranks[r];
    std::string s =
        wr == r ? fmt::format("rank {}", r) : fmt::format("rank {} (world rank {})", r, wr);
    return s;
  };
  std::vector<int> missing, arrived, elsewhere;
  std::string details;
  for (int r = 0; r < size; ++r) {
    const int nr = node_of_group[r];
    if (nr < 0) {
      elsewhere.push_back(r);
      continue;
    }
    const BoardSlot& s = *board_[nr];
    const uint64_t issued = s.issued.load(std::memory_order_acquire);
    const auto k = static_cast<OpKind>(s.issued_kind.load(std::memory_order_relaxed));
    const int pid = s.pid.load();
    if (issued < seq) {
      missing.push_back(r);
      const bool alive = pid > 0 && (kill(pid, 0) == 0 || errno != ESRCH);
      std::string host =
          static_cast<size_t>(world_ranks[r]) < R.hosts.size() ? R.hosts[world_ranks[r]] : "?";
      details += fmt::format(
          "\n[comm]   {}: last collective issued on this group is {} "
          "(pid {} on {}, {})",
          who(r), issued ? fmt::format("#{} {}", issued, op_name(k)) : "none", pid, host,
          alive ? "still running" : "exited");
    } else {
      arrived.push_back(r);
      if (issued == seq && k != kind)
        details += fmt::format(
            "\n[comm]   {} issued #{} as {}, this rank as {}: the ranks issue "
            "collectives in different orders",
            who(r), seq, op_name(k), op_name(kind));
    }
  }
  std::string out;
  if (!missing.empty())
    out += fmt::format("\n[comm] {} did not arrive at #{}:", rank_list(missing), seq) + details;
  else
    out += details;
  if (!arrived.empty()) out += fmt::format("\n[comm]   arrived: {}", rank_list(arrived));
  if (!elsewhere.empty())
    out += fmt::format(
        "\n[comm]   {} on other nodes cannot be observed from here (the arrival "
        "board is per node); if every rank above arrived, one of them did not, or "
        "the network between nodes is stuck",
        rank_list(elsewhere));
  else if (missing.empty())
    out += fmt::format(
        "\n[comm]   every rank issued #{}, yet it did not complete: a rank stopped "
        "making progress inside it (or its transport is stuck)",
        seq);
  return out;
}

std::string GroupState::on_timeout(const WorkState& w) {
  {
    std::lock_guard lk(timeout_mu_);
    if (!broken_msg_.empty()) {
      if (&w == broken_by_) return broken_msg_;
      return fmt::format("[comm] {} failed because the group broke earlier:\n{}", w.describe(),
                         broken_msg_);
    }
  }
  // The collective the group is stuck in: the oldest one not complete on this rank.
  std::shared_ptr<WorkState> stuck;
  {
    std::lock_guard lk(mu_);
    if (!inflight_.empty()) stuck = inflight_.begin()->second;
  }
  const double secs = std::chrono::duration<double>(w.deadline - w.issued).count();
  std::string msg =
      fmt::format("[comm] timeout on rank {} after {:.0f} s: {}", rank, secs, w.describe());
  if (w.seq == 0) {  // send / recv
    msg += w.op.kind == OpKind::recv ? " was not matched by a send" : " was not matched by a recv";
    if (stuck)
      msg += fmt::format("\n[comm]   (this rank is also waiting in {})", stuck->describe());
    const int nr = node_of_group[w.op.peer];
    if (nr >= 0) {
      const BoardSlot& s = *board_[nr];
      const int pid = s.pid.load();
      const bool alive = pid > 0 && (kill(pid, 0) == 0 || errno != ESRCH);
      msg += fmt::format("\n[comm]   rank {}: last collective issued #{}, {}", w.op.peer,
                         s.issued.load(), alive ? "still running" : "exited");
    }
  } else {
    if (stuck && stuck.get() != &w)
      msg += fmt::format(" is queued behind {}, which did not complete", stuck->describe());
    else
      msg += " did not complete";
    const uint64_t seq = stuck ? stuck->seq : w.seq;
    const OpKind kind = stuck ? stuck->op.kind : w.op.kind;
    msg += arrival_report(seq, kind);
  }
  msg += fmt::format(
      "\n[comm] ending the job on every rank (MPI_Abort, exit status {}) so that no "
      "rank hangs; if the step is legitimately this slow, raise DS_COMM_TIMEOUT "
      "(seconds, now {:.0f})",
      kTimeoutExitCode, secs);
  return break_group(&w, std::move(msg), true);
}

std::string GroupState::break_group(const WorkState* w, std::string msg, bool timeout) {
  {
    std::lock_guard lk(timeout_mu_);
    if (!broken_msg_.empty()) return broken_msg_;  // another thread got here first
    broken_msg_ = std::move(msg);
    broken_by_ = w;
    broken_by_timeout_ = timeout;
  }
  broken = true;
  g_any_broken = true;
  cv_.notify_all();
  const std::string m = broken_message();
  std::fprintf(stderr, "%s\n", m.c_str());
  std::fflush(stderr);
  // The reaper: whatever the caller does with the exception, the job ends within the grace period.
  const double grace = abort_grace_seconds();
  std::thread([grace] {
    std::this_thread::sleep_for(std::chrono::duration<double>(grace));
    std::fprintf(stderr, "[comm] aborting the job %.0f s after a communication failure\n", grace);
    abort_now(kTimeoutExitCode);
  }).detach();
  return m;
}

void GroupState::check_peers(WorkState* current) {
  const Clock::time_point now = Clock::now();
  if (now - last_peer_check_ < std::chrono::milliseconds(50)) return;
  last_peer_check_ = now;
  // Deadlines are enforced here too: nobody may be waiting on an async op that never completes.
  if (current && now > current->deadline) throw TimeoutError(on_timeout(*current));
  if (!current)
    for (const Active& a : active_)
      if (now > a.w->deadline) throw TimeoutError(on_timeout(*a.w));
  std::shared_ptr<WorkState> stuck;
  {
    std::lock_guard lk(mu_);
    if (inflight_.empty()) return;
    stuck = inflight_.begin()->second;
  }
  // A node-local rank that is exiting (finalize, normal return from main) without having issued
  // the collective this rank is stuck in will never issue it: fail now rather than at the deadline.
  for (int nr = 0; nr < node_size; ++nr) {
    const BoardSlot& s = *board_[nr];
    const uint64_t issued = s.issued.load(std::memory_order_acquire);
    if (s.exiting.load(std::memory_order_acquire) && issued < stuck->seq) {
      const int r = group_of_node[nr];
      std::string msg = fmt::format(
          "[comm] on rank {}: {} cannot complete: rank {} is exiting (it returned from main or "
          "called ds::comm::finalize) without issuing it",
          rank, stuck->describe(), r);
      msg += arrival_report(stuck->seq, stuck->op.kind);
      msg += fmt::format("\n[comm] ending the job on every rank (MPI_Abort, exit status {})",
                         kTimeoutExitCode);
      DS_THROW("{}", break_group(stuck.get(), std::move(msg), false));
    }
  }
}

void GroupState::check_same_collective(const WorkState& w) {
  // Every rank wrote its record before the barrier this rank just passed. A peer's record for the
  // same sequence number must describe the same operation; a peer already past it cannot be checked
  // (its slot holds a later record), which is fine: some rank will see the mismatch.
  const ExecRecord mine{w.seq,
                        static_cast<uint32_t>(w.op.kind),
                        static_cast<uint32_t>(w.op.dtype),
                        static_cast<uint32_t>(w.op.reduce),
                        w.op.count,
                        w.op.peer};
  for (int nr = 0; nr < node_size; ++nr) {
    if (nr == node_rank) continue;
    ExecRecord theirs;
    if (!board_[nr]->read_exec(w.seq, theirs)) continue;
    if (theirs.same_as(mine)) continue;
    const int r = group_of_node[nr];
    auto what = [&](const ExecRecord& e) {
      return fmt::format(
          "{} of {} x {} {}{}", op_name(static_cast<OpKind>(e.kind)), e.count,
          dtype_name(static_cast<DType>(e.dtype)), reduce_op_name(static_cast<ReduceOp>(e.reduce)),
          static_cast<OpKind>(e.kind) == OpKind::broadcast ? fmt::format(" from rank {}", e.root)
          : static_cast<OpKind>(e.kind) == OpKind::reduce  ? fmt::format(" to rank {}", e.root)
                                                           : "");
    };
    std::string msg = fmt::format(
        "[comm] collective mismatch at #{} on group {}: rank {} runs {}{}, rank {} runs {}: every "
        "rank must issue the same collectives, with the same sizes, in the same order",
        w.seq, name, rank, what(mine), w.op.context.empty() ? "" : " [" + w.op.context + "]", r,
        what(theirs));
    msg += fmt::format("\n[comm] ending the job on every rank (MPI_Abort, exit status {})",
                       kTimeoutExitCode);
    DS_THROW("{}", break_group(&w, std::move(msg), false));
  }
}

}  // namespace detail

// ---- the Group over MPI ----

namespace {

using detail::GroupState;

class MpiGroup final : public Group {
 public:
  MpiGroup(std::shared_ptr<GroupState> st) : Group(st->name), st_(std::move(st)) {}
  ~MpiGroup() override { st_->shutdown(); }

  int rank() const override { return st_->rank; }
  int size() const override { return st_->size; }
  int world_rank(int r) const override { return st_->world_ranks.at(static_cast<size_t>(r)); }
  Capabilities capabilities() const override {
    return Capabilities{.backend = "mpi",
                        .async = true,
                        .shared_memory = st_->shm,
                        .nodes = st_->nodes,
                        .dtypes = {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64}};
  }
  std::shared_ptr<Group> split(int color, int key) override;

 protected:
  Work start(Op op) override { return st_->submit(std::move(op), timeout()); }

 private:
  std::shared_ptr<GroupState> st_;
};

// Collective over comm: builds the state (windows, board) and starts its thread.
std::shared_ptr<Group> make_group(MPI_Comm comm, std::string name) {
  auto st = std::make_shared<GroupState>(comm, std::move(name));
  {
    std::lock_guard lk(detail::rt().mu);
    detail::rt().states.push_back(st);
  }
  st->start_thread();
  return std::make_shared<MpiGroup>(st);
}

std::shared_ptr<Group> MpiGroup::split(int color, int key) {
  auto result = std::make_shared<std::shared_ptr<Group>>();
  auto st = st_;
  const std::string child = fmt::format("{}.split({})", name(), color);
  Op op{.kind = OpKind::split, .context = child};
  op.group_size = size();
  Work w = st_->submit(std::move(op), timeout(), [st, color, key, child, result] {
    MPI_Comm nc = MPI_COMM_NULL;
    detail::check_mpi(
        MPI_Comm_split(st->comm, color < 0 ? MPI_UNDEFINED : color, key < 0 ? st->rank : key, &nc),
        "MPI_Comm_split");
    if (nc != MPI_COMM_NULL) *result = make_group(nc, child);
  });
  w.wait();
  return *result;
}

void finalize_at_exit() {
  finalize();
}

}  // namespace

bool mpi_available() {
  return true;
}

std::shared_ptr<Group> init_from_environment() {
  detail::Runtime& R = detail::rt();
  {
    std::lock_guard lk(R.mu);
    if (R.world) return R.world;
    DS_CHECK(!R.finalized, "[comm] init_from_environment() after finalize()");
  }
  const std::string ompi_size = detail::env("OMPI_COMM_WORLD_SIZE");
  const std::string pmix = detail::env("PMIX_RANK");
  const std::string ws = detail::env("WORLD_SIZE");
  const bool under_mpirun = !ompi_size.empty() || !pmix.empty();
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!under_mpirun && !initialized) {
    DS_CHECK(ws.empty() || ws == "1",
             "[comm] WORLD_SIZE={} but this process was not started by mpirun (no "
             "OMPI_COMM_WORLD_SIZE / PMIX_RANK): start it with `deepspeed --launcher openmpi` or "
             "mpirun -np {} ...",
             ws, ws);
    std::lock_guard lk(R.mu);
    R.world = detail::make_single_world();
    return R.world;
  }
  int provided = 0;
  if (!initialized) {
    detail::check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided),
                      "MPI_Init_thread");
    R.mpi_initialized = true;
  } else {
    MPI_Query_thread(&provided);
  }
  DS_CHECK(provided >= MPI_THREAD_MULTIPLE,
           "[comm] this MPI provides thread level {} but the communication threads need "
           "MPI_THREAD_MULTIPLE ({}); use an MPI built with thread support (OpenMPI 4.1: "
           "ompi_info | grep MPI_THREAD_MULTIPLE)",
           provided, MPI_THREAD_MULTIPLE);
  int wrank = 0, wsize = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
  MPI_Comm_size(MPI_COMM_WORLD, &wsize);
  if (!ws.empty())
    DS_CHECK(std::to_string(wsize) == ws,
             "[comm] WORLD_SIZE={} but MPI started {} processes; launch with the same count", ws,
             wsize);
  // Host names, for messages that say where a rank lives.
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(host, &len);
  std::vector<char> all(static_cast<size_t>(wsize) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME,
                MPI_CHAR, MPI_COMM_WORLD);
  {
    std::lock_guard lk(R.mu);
    for (int i = 0; i < wsize; ++i) R.hosts.emplace_back(&all[size_t(i) * MPI_MAX_PROCESSOR_NAME]);
  }
  detail::create_ops();
  MPI_Comm comm;
  detail::check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "MPI_Comm_dup");
  std::shared_ptr<Group> w = make_group(comm, "world");
  {
    std::lock_guard lk(R.mu);
    R.world = w;
  }
  if (R.mpi_initialized) std::atexit(finalize_at_exit);
  return w;
}

std::shared_ptr<Group> world() {
  return init_from_environment();
}

void finalize() {
  detail::Runtime& R = detail::rt();
  std::vector<std::shared_ptr<GroupState>> states;
  {
    std::lock_guard lk(R.mu);
    if (R.finalized || R.states.empty()) return;
    states = R.states;
  }
  if (detail::g_any_broken) detail::abort_now(detail::kTimeoutExitCode);
  // Tell the peers this rank will issue nothing more (shutdown() does too, group by group): a peer
  // waiting for it in a collective fails at once (see check_peers) instead of at its deadline.
  for (auto& st : states) st->set_exiting();
  for (auto& st : states) st->shutdown();  // drains; a deadline expiring here breaks the group
  if (detail::g_any_broken) detail::abort_now(detail::kTimeoutExitCode);
  for (auto& st : states) st->free_mpi();
  for (MPI_Op& op : R.ops) MPI_Op_free(&op);
  {
    std::lock_guard lk(R.mu);
    R.finalized = true;
    R.states.clear();
    R.world.reset();
  }
  if (R.mpi_initialized) MPI_Finalize();  // else the program initialised MPI and finalises it
}

bool job_failed() {
  return detail::g_any_broken;
}

void abort_job(int code, std::string_view why) {
  if (!why.empty()) {
    std::fprintf(stderr, "%.*s\n", static_cast<int>(why.size()), why.data());
    std::fflush(stderr);
  }
  detail::abort_now(code);
}

}  // namespace ds::comm

// The MPI backend's groups: each group's communication thread executes its operations in issue
// order (posting MPI's non-blocking collectives and progressing them, or running the shared-memory
// collectives of shm.cpp), and the Group interface over it. Deadlines: mpi_deadlines.cpp.
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

  // Arrival board: one slot per node-local rank. MPI does not promise the cache-line alignment a
  // BoardSlot needs (OpenMPI's segments start 8 bytes past one), so each segment has room to align
  // its slot up; the offset within a page is the same in every process mapping the segment.
  auto aligned_slot = [](void* p) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    constexpr uintptr_t kAlign = alignof(BoardSlot);
    return reinterpret_cast<BoardSlot*>((a + kAlign - 1) / kAlign * kAlign);
  };
  void* base = nullptr;
  check_mpi(MPI_Win_allocate_shared(sizeof(BoardSlot) + alignof(BoardSlot), 1, info, node_comm,
                                    &base, &board_win_),
            "MPI_Win_allocate_shared (arrival board)");
  BoardSlot* own_slot = new (aligned_slot(base)) BoardSlot();
  own_slot->pid.store(static_cast<int32_t>(getpid()));
  board_.resize(node_size);
  for (int i = 0; i < node_size; ++i) {
    MPI_Aint sz;
    int du;
    void* p;
    MPI_Win_shared_query(board_win_, i, &sz, &du, &p);
    board_[i] = aligned_slot(p);
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
    case OpKind::all_to_all: {
      const int n = int_count(op.count, *w);
      check_mpi(MPI_Ialltoall(op.in, n, type, op.out, n, type, comm, &r), "MPI_Ialltoall");
      break;
    }
    case OpKind::all_to_all_v: {
      // Counts and displacements must live until the request completes: the finisher owns them.
      auto v = std::make_shared<std::vector<int>>(4 * static_cast<size_t>(size), 0);
      int* sc = v->data();
      int* sd = sc + size;
      int* rc = sd + size;
      int* rd = rc + size;
      size_t so = 0, ro = 0;
      for (int j = 0; j < size; ++j) {
        sc[j] = int_count(op.send_counts[static_cast<size_t>(j)], *w);
        rc[j] = int_count(op.recv_counts[static_cast<size_t>(j)], *w);
        sd[j] = int_count(so, *w);
        rd[j] = int_count(ro, *w);
        so += op.send_counts[static_cast<size_t>(j)];
        ro += op.recv_counts[static_cast<size_t>(j)];
      }
      a.finish = [v] {};
      check_mpi(MPI_Ialltoallv(op.in, sc, sd, type, op.out, rc, rd, type, comm, &r),
                "MPI_Ialltoallv");
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

// ---- the Group over MPI ----

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

}  // namespace detail
}  // namespace ds::comm

// The MPI backend's deadlines: what a rank reports when a collective does not complete in time
// (the shared-memory arrival board says which ranks arrived, which are elsewhere, which exited),
// peers that exit or issue a different collective, and breaking the group so that the job ends on
// every rank instead of hanging.
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <set>
#include <thread>

#include "comm/mpi_state.h"
#include "ds/comm/group.h"
#include "ds/comm/topology.h"

namespace ds::comm::detail {

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
    return s + rank_coordinates(wr);
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
      msg += fmt::format("\n[comm]   rank {}{}: last collective issued #{}, {}", w.op.peer,
                         rank_coordinates(world_ranks[w.op.peer]), s.issued.load(),
                         alive ? "still running" : "exited");
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
          "[comm] on rank {}: {} cannot complete: rank {}{} is exiting (it returned from main or "
          "called ds::comm::finalize) without issuing it",
          rank, stuck->describe(), r, rank_coordinates(world_ranks[r]));
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
                        // all_to_all_v's sizes differ by rank: only the operation must match.
                        w.op.kind == OpKind::all_to_all_v ? 0 : w.op.count,
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

}  // namespace ds::comm::detail

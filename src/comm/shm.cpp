// Shared-memory collectives for groups whose ranks all share one node (MPI-3 shared window).
//
// Each rank owns four slots of slot_bytes in the window: input and result, each double-buffered.
// An operation streams through them piece by piece; between pieces all ranks pass a barrier on the
// arrival board (a generation counter per rank). The one rule that makes the double buffering safe
// across pieces and across operations: data written between barriers k-1 and k (into slots of
// parity k & 1) is read only between barriers k and k+1. So a slot is rewritten two intervals
// later, after a barrier that every reader passed only once it had finished reading — no second
// barrier per piece.
//
// reduce_scatter: each rank copies its piece of every destination's chunk into its input slot;
//   barrier; each rank reduces its own chunk's piece reading all ranks' slots (in rank order, so
//   the result is deterministic) straight into the output. One barrier per piece.
// reduce (to a root): each rank copies a piece of its buffer into its input slot; barrier; the
//   root reduces the piece reading all ranks' slots, in rank order, into its buffer.
// all_reduce: the same, reducing 1/N of each piece into the result slot; after the next barrier
//   every rank copies all N results out (overlapping the next piece's copy-in).
// broadcast (large messages): the root copies in; barrier; everybody copies out.
// all_gather has no shared-memory form: OpenMPI copies large messages once, directly between the
// processes (CMA), where a window needs two copies; bench_comm measured MPI faster at every size.
#include <algorithm>
#include <cstring>

#include "comm/mpi_state.h"

namespace ds::comm::detail {
namespace {

constexpr size_t kAlign = 32;  // elements per piece boundary: keeps pieces vector- and line-aligned

size_t round_down(size_t x, size_t m) {
  return x / m * m;
}
size_t round_up(size_t x, size_t m) {
  return (x + m - 1) / m * m;
}
size_t ceil_div(size_t a, size_t b) {
  return (a + b - 1) / b;
}

bool overlaps(const void* a, size_t na, const void* b, size_t nb) {
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return na && nb && pa < pb + nb && pb < pa + na;
}

}  // namespace

char* GroupState::region(int nr, int parity, int which) const {
  return data_[nr] + static_cast<size_t>(parity * 2 + which) * slot_bytes;
}

void GroupState::shm_barrier(WorkState& w) {
  const uint64_t k = ++interval_;
  board_[node_rank]->barrier.store(k, std::memory_order_release);
  spin_until(w, [&] {
    for (int r = 0; r < node_size; ++r)
      if (board_[r]->barrier.load(std::memory_order_acquire) < k) return false;
    return true;
  });
  if (check_pending_) {  // first barrier of the operation: every rank has published its record
    check_pending_ = false;
    check_same_collective(w);
  }
}

void GroupState::shm_run(WorkState& w) {
  Group::Op& op = w.op;
  board_[node_rank]->write_exec({w.seq, static_cast<uint32_t>(op.kind),
                                 static_cast<uint32_t>(op.dtype), static_cast<uint32_t>(op.reduce),
                                 op.count, op.peer});
  check_pending_ = true;
  if (op.count == 0 || op.kind == OpKind::barrier) {
    // Nothing to move, but still one barrier: a rank passing an empty buffer where its peers pass
    // data is a mismatch to report, not something to skip past.
    shm_barrier(w);
    return;
  }
  switch (op.kind) {
    case OpKind::reduce_scatter: return shm_reduce_scatter(w);
    case OpKind::reduce: return shm_reduce(w);
    case OpKind::all_reduce: return shm_all_reduce(w);
    case OpKind::broadcast: return shm_broadcast(w);
    default: DS_THROW("[comm] {} has no shared-memory form", op_name(op.kind));
  }
}

// Single node: node-local rank == group rank.

void GroupState::shm_reduce_scatter(WorkState& w) {
  Group::Op& op = w.op;
  const int n = size, me = rank;
  const size_t es = dtype_size(op.dtype), c = op.count;
  std::vector<const void*> srcs(n);
  const char* in = static_cast<const char*>(op.in);
  char* out = static_cast<char*>(op.out);
  std::vector<char> tmp;
  // out == in + me * c is safe (each piece is copied in before its result is written); any other
  // overlap is not.
  if (out != in + me * c * es && overlaps(in, n * c * es, out, c * es)) {
    tmp.assign(in, in + n * c * es);
    in = tmp.data();
  }
  const size_t e = std::max(kAlign, round_down(slot_bytes / (n * es), kAlign));
  const size_t pieces = ceil_div(c, e);
  for (size_t t = 0; t <= pieces; ++t) {
    if (t >= 1) {
      const size_t off = (t - 1) * e, len = std::min(e, c - off);
      for (int r = 0; r < n; ++r) srcs[r] = region(r, read_parity(), 0) + me * e * es;
      reduce_n(out + off * es, srcs.data(), n, len, op.dtype, op.reduce);
    }
    if (t < pieces) {
      const size_t off = t * e, len = std::min(e, c - off);
      char* slot = region(me, write_parity(), 0);
      for (int d = 0; d < n; ++d) std::memcpy(slot + d * e * es, in + (d * c + off) * es, len * es);
      shm_barrier(w);
    }
  }
}

void GroupState::shm_reduce(WorkState& w) {
  Group::Op& op = w.op;
  const int n = size, me = rank;
  const size_t es = dtype_size(op.dtype), total = op.count;
  std::vector<const void*> srcs(n);
  char* buf = static_cast<char*>(op.out);
  const size_t e = std::max(kAlign, round_down(slot_bytes / es, kAlign));
  const size_t pieces = ceil_div(total, e);
  for (size_t t = 0; t <= pieces; ++t) {
    if (t >= 1 && me == op.peer) {
      const size_t off = (t - 1) * e, len = std::min(e, total - off);
      for (int r = 0; r < n; ++r) srcs[r] = region(r, read_parity(), 0);
      reduce_n(buf + off * es, srcs.data(), n, len, op.dtype, op.reduce);
    }
    if (t < pieces) {
      const size_t off = t * e, len = std::min(e, total - off);
      std::memcpy(region(me, write_parity(), 0), buf + off * es, len * es);
      shm_barrier(w);
    }
  }
}

void GroupState::shm_all_reduce(WorkState& w) {
  Group::Op& op = w.op;
  const int n = size, me = rank;
  const size_t es = dtype_size(op.dtype), total = op.count;
  std::vector<const void*> srcs(n);
  char* buf = static_cast<char*>(op.out);
  const size_t e = std::max(kAlign, round_down(slot_bytes / (n * es), kAlign));
  const size_t step = e * n, pieces = ceil_div(total, step);
  auto seg = [&](size_t p) {  // elements per rank in piece p (the last piece may be short)
    return round_up(ceil_div(std::min(step, total - p * step), n), kAlign);
  };
  for (size_t t = 0; t < pieces + 2; ++t) {
    if (t >= 2) {  // copy out every rank's reduced segment of piece t-2
      const size_t p = t - 2, off = p * step, len = std::min(step, total - off), s = seg(p);
      for (int r = 0; r < n; ++r) {
        const size_t b = std::min(len, r * s), en = std::min(len, (r + 1) * s);
        if (en > b) std::memcpy(buf + (off + b) * es, region(r, read_parity(), 1), (en - b) * es);
      }
    }
    if (t >= 1 && t - 1 < pieces) {  // reduce my segment of piece t-1
      const size_t p = t - 1, len = std::min(step, total - p * step), s = seg(p);
      const size_t b = std::min(len, me * s), en = std::min(len, (me + 1) * s);
      for (int r = 0; r < n; ++r) srcs[r] = region(r, read_parity(), 0) + b * es;
      if (en > b)
        reduce_n(region(me, write_parity(), 1), srcs.data(), n, en - b, op.dtype, op.reduce);
    }
    if (t < pieces) {
      const size_t off = t * step, len = std::min(step, total - off);
      std::memcpy(region(me, write_parity(), 0), buf + off * es, len * es);
    }
    if (t < pieces + 1) shm_barrier(w);
  }
}

void GroupState::shm_broadcast(WorkState& w) {
  Group::Op& op = w.op;
  const int me = rank, root = op.peer;
  const size_t es = dtype_size(op.dtype), total = op.count;
  char* buf = static_cast<char*>(op.out);
  const size_t e = std::max(kAlign, round_down(slot_bytes / es, kAlign));
  const size_t pieces = ceil_div(total, e);
  for (size_t t = 0; t <= pieces; ++t) {
    if (t >= 1 && me != root) {
      const size_t off = (t - 1) * e, len = std::min(e, total - off);
      std::memcpy(buf + off * es, region(root, read_parity(), 0), len * es);
    }
    if (t < pieces) {
      if (me == root) {
        const size_t off = t * e, len = std::min(e, total - off);
        std::memcpy(region(me, write_parity(), 0), buf + off * es, len * es);
      }
      shm_barrier(w);
    }
  }
}

}  // namespace ds::comm::detail

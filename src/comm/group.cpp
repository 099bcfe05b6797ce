// Backend-independent parts of ds::comm: argument checks, Work handles, the size-1 group.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>

#include "comm/internal.h"
#include "ds/comm/group.h"
#include "ds/comm/logger.h"

namespace ds::comm {

const char* reduce_op_name(ReduceOp op) {
  return op == ReduceOp::sum ? "sum" : "max";
}

const char* op_name(OpKind op) {
  switch (op) {
    case OpKind::all_reduce:
      return "all_reduce";
    case OpKind::reduce_scatter:
      return "reduce_scatter";
    case OpKind::reduce:
      return "reduce";
    case OpKind::all_gather:
      return "all_gather";
    case OpKind::broadcast:
      return "broadcast";
    case OpKind::barrier:
      return "barrier";
    case OpKind::send:
      return "send";
    case OpKind::recv:
      return "recv";
    case OpKind::split:
      return "split";
    case OpKind::all_to_all:
      return "all_to_all";
    case OpKind::all_to_all_v:
      return "all_to_all_v";
  }
  return "?";
}

bool Capabilities::supports(OpKind op, DType dtype, ReduceOp reduce) const {
  (void)op;
  (void)reduce;  // every collective takes sum and max on every listed dtype
  for (DType d : dtypes)
    if (d == dtype) return true;
  return false;
}

std::string Capabilities::str() const {
  std::string d;
  for (DType t : dtypes) d += fmt::format("{}{}", d.empty() ? "" : ",", dtype_name(t));
  return fmt::format("backend={} async={} shared_memory={} nodes={} dtypes={}", backend, async,
                     shared_memory, nodes, d);
}

size_t Group::Op::bytes() const {
  const size_t b = count * dtype_size(dtype);
  if (kind == OpKind::reduce_scatter || kind == OpKind::all_gather || kind == OpKind::all_to_all)
    return b * static_cast<size_t>(group_size);
  if (kind == OpKind::all_to_all_v) {
    size_t s = 0;
    for (size_t c : send_counts) s += c;
    return s * dtype_size(dtype);
  }
  return kind == OpKind::barrier || kind == OpKind::split ? 0 : b;
}

namespace detail {

double default_timeout_seconds() {
  if (const char* s = std::getenv("DS_COMM_TIMEOUT"); s && *s) {
    char* end = nullptr;
    const double v = std::strtod(s, &end);
    DS_CHECK(end != s && v > 0, "[comm] DS_COMM_TIMEOUT={} is not a positive number of seconds", s);
    return v;
  }
  return 300.0;
}

double abort_grace_seconds() {
  if (const char* s = std::getenv("DS_COMM_ABORT_GRACE"); s && *s) {
    char* end = nullptr;
    const double v = std::strtod(s, &end);
    if (end != s && v >= 0) return v;
  }
  return 10.0;
}

std::string format_bytes(uint64_t b) {
  if (b >= (1ull << 30)) return fmt::format("{:.2f} GiB", b / double(1ull << 30));
  if (b >= (1ull << 20)) return fmt::format("{:.2f} MiB", b / double(1ull << 20));
  if (b >= (1ull << 10)) return fmt::format("{:.2f} KiB", b / double(1ull << 10));
  return fmt::format("{} B", b);
}

void WorkState::finish(std::string err, bool is_timeout) {
  // Recorded before waking the waiters, so that a caller reading the logger after wait() sees it.
  if (err.empty()) {
    CommsLogger& log = comms_logger();
    if (log.enabled()) {
      const double secs = std::chrono::duration<double>(Clock::now() - started).count();
      log.record(op.kind, op.bytes(), secs, group_size);
    }
  }
  std::vector<Tensor> drop;
  {
    std::lock_guard lk(mu);
    if (done) return;
    done = true;
    error = std::move(err);
    timed_out = is_timeout;
    drop.swap(op.keep_alive);
  }
  cv.notify_all();
}

std::string WorkState::describe() const {
  std::string s = op_name(op.kind);
  if (seq) s += fmt::format(" #{}", seq);
  if (!op.context.empty()) s += fmt::format(" [{}]", op.context);
  switch (op.kind) {
    case OpKind::barrier:
    case OpKind::split:
      break;
    case OpKind::all_reduce:
    case OpKind::reduce_scatter:
      s += fmt::format(" ({} {} {})", format_bytes(op.bytes()), dtype_name(op.dtype),
                       reduce_op_name(op.reduce));
      break;
    case OpKind::reduce:
      s += fmt::format(" ({} {} {} to rank {})", format_bytes(op.bytes()), dtype_name(op.dtype),
                       reduce_op_name(op.reduce), op.peer);
      break;
    case OpKind::broadcast:
      s += fmt::format(" ({} {} from rank {})", format_bytes(op.bytes()), dtype_name(op.dtype),
                       op.peer);
      break;
    case OpKind::send:
      s += fmt::format(" ({} {} to rank {} tag {})", format_bytes(op.bytes()), dtype_name(op.dtype),
                       op.peer, op.tag);
      break;
    case OpKind::recv:
      s += fmt::format(" ({} {} from rank {} tag {})", format_bytes(op.bytes()),
                       dtype_name(op.dtype), op.peer, op.tag);
      break;
    default:
      s += fmt::format(" ({} {})", format_bytes(op.bytes()), dtype_name(op.dtype));
  }
  return s + " on group " + group_name;
}

Work completed_work(Group::Op op, const std::string& group_name, int group_size, uint64_t seq) {
  auto w = std::make_shared<WorkState>();
  w->seq = seq;
  w->op = std::move(op);
  w->group_name = group_name;
  w->group_size = group_size;
  w->issued = w->started = w->deadline = Clock::now();
  w->finish();
  return Work(std::move(w));
}

}  // namespace detail

// ---- Work ----

namespace detail {
// Work::after_wait's continuation: run once, by the first successful wait().
struct AfterWait {
  std::mutex mu;
  bool ran = false;
  std::function<void()> f;
};
}  // namespace detail

bool Work::test() const {
  if (!state_) return true;
  std::lock_guard lk(state_->mu);
  return state_->done;
}

void Work::wait() const {
  if (state_) {
    detail::WorkState& s = *state_;
    std::unique_lock lk(s.mu);
    if (!s.cv.wait_until(lk, s.deadline, [&] { return s.done; })) {
      lk.unlock();
      std::shared_ptr<detail::WorkOwner> owner = s.owner.lock();
      throw TimeoutError(
          owner ? owner->on_timeout(s)
                : fmt::format("[comm] {} did not complete before its deadline", s.describe()));
    }
    if (!s.error.empty()) {
      if (s.timed_out) throw TimeoutError(s.error);
      throw Error(s.error);
    }
  }
  if (after_) {
    std::lock_guard lk(after_->mu);
    if (!after_->ran) {
      after_->f();
      after_->ran = true;
      after_->f = nullptr;  // drops the staging it kept alive
    }
  }
}

uint64_t Work::sequence() const {
  return state_ ? state_->seq : 0;
}

Work Work::after_wait(std::function<void()> f) const {
  DS_CHECK(!after_, "[comm] internal: a Work takes one after_wait continuation");
  Work w = *this;
  w.after_ = std::make_shared<detail::AfterWait>();
  w.after_->f = std::move(f);
  return w;
}

// ---- Group: argument checks shared by every backend ----

Group::Group(std::string name)
    : name_(std::move(name)), timeout_s_(detail::default_timeout_seconds()) {}

void Group::set_timeout(double seconds) {
  DS_CHECK(seconds > 0, "[comm] timeout must be positive, got {}", seconds);
  timeout_s_ = seconds;
}

Work Group::issue(Op op) {
  const char* what = op_name(op.kind);
  op.group_size = size();
  DS_CHECK(op.count == 0 || op.kind == OpKind::barrier || op.out || op.in,
           "[comm] {}: null buffer for {} elements", what, op.count);
  switch (op.kind) {
    case OpKind::reduce_scatter:
    case OpKind::all_gather:
      DS_CHECK(op.count == 0 || (op.in && op.out), "[comm] {}: null buffer", what);
      break;
    case OpKind::all_to_all_v: {
      const size_t n = static_cast<size_t>(size());
      DS_CHECK(op.send_counts.size() == n && op.recv_counts.size() == n,
               "[comm] {}: {} send and {} receive counts for a group of {}", what,
               op.send_counts.size(), op.recv_counts.size(), n);
      size_t s = 0, r = 0;
      for (size_t j = 0; j < n; ++j) {
        s += op.send_counts[j];
        r += op.recv_counts[j];
      }
      op.count = std::max(s, r);
      DS_CHECK((s == 0 || op.in) && (r == 0 || op.out), "[comm] {}: null buffer", what);
      const auto a = reinterpret_cast<uintptr_t>(op.in), b = reinterpret_cast<uintptr_t>(op.out);
      const size_t es = dtype_size(op.dtype);
      DS_CHECK(s == 0 || r == 0 || a + s * es <= b || b + r * es <= a,
               "[comm] {}: the input and output buffers overlap; all_to_all_v is not in place",
               what);
      break;
    }
    case OpKind::all_to_all: {
      DS_CHECK(op.count == 0 || (op.in && op.out), "[comm] {}: null buffer", what);
      const auto a = reinterpret_cast<uintptr_t>(op.in), b = reinterpret_cast<uintptr_t>(op.out);
      const size_t n = op.count * dtype_size(op.dtype) * static_cast<size_t>(size());
      DS_CHECK(n == 0 || a + n <= b || b + n <= a,
               "[comm] {}: the input and output buffers overlap; all_to_all is not in place",
               what);
      break;
    }
    case OpKind::broadcast:
    case OpKind::reduce:
      DS_CHECK(op.peer >= 0 && op.peer < size(), "[comm] {}: root {} outside group {} of size {}",
               what, op.peer, name(), size());
      break;
    case OpKind::send:
    case OpKind::recv:
      DS_CHECK(op.peer >= 0 && op.peer < size(), "[comm] {}: rank {} outside group {} of size {}",
               what, op.peer, name(), size());
      DS_CHECK(op.tag >= 0 && op.tag <= 32767, "[comm] {}: tag {} outside [0, 32767]", what,
               op.tag);
      break;
    default:
      break;
  }
  return start(std::move(op));
}

Work Group::all_reduce_async(void* buf, size_t count, DType dtype, ReduceOp op,
                             std::string_view context) {
  Op o{.kind = OpKind::all_reduce,
       .in = buf,
       .out = buf,
       .count = count,
       .dtype = dtype,
       .reduce = op,
       .context = std::string(context)};
  return issue(std::move(o));
}

Work Group::reduce_scatter_async(const void* in, void* out, size_t chunk, DType dtype, ReduceOp op,
                                 std::string_view context) {
  Op o{.kind = OpKind::reduce_scatter,
       .in = in,
       .out = out,
       .count = chunk,
       .dtype = dtype,
       .reduce = op,
       .context = std::string(context)};
  return issue(std::move(o));
}

Work Group::reduce_async(void* buf, size_t count, DType dtype, int root, ReduceOp op,
                         std::string_view context) {
  Op o{.kind = OpKind::reduce,
       .in = buf,
       .out = buf,
       .count = count,
       .dtype = dtype,
       .reduce = op,
       .peer = root,
       .context = std::string(context)};
  return issue(std::move(o));
}

Work Group::all_to_all_async(const void* in, void* out, size_t chunk, DType dtype,
                             std::string_view context) {
  Op o{.kind = OpKind::all_to_all,
       .in = in,
       .out = out,
       .count = chunk,
       .dtype = dtype,
       .context = std::string(context)};
  return issue(std::move(o));
}

Work Group::all_to_all_v_async(const void* in, std::vector<size_t> send_counts, void* out,
                               std::vector<size_t> recv_counts, DType dtype,
                               std::string_view context) {
  Op o{.kind = OpKind::all_to_all_v,
       .in = in,
       .out = out,
       .dtype = dtype,
       .send_counts = std::move(send_counts),
       .recv_counts = std::move(recv_counts),
       .context = std::string(context)};
  return issue(std::move(o));
}

std::vector<size_t> Group::all_to_all_counts(const std::vector<size_t>& send_counts,
                                             std::string_view context) {
  const size_t n = static_cast<size_t>(size());
  DS_CHECK(send_counts.size() == n, "[comm] all_to_all_counts: {} counts for a group of {}",
           send_counts.size(), n);
  std::vector<int64_t> out(n), in(send_counts.begin(), send_counts.end());
  all_to_all(in.data(), out.data(), 1, DType::i64, context);
  return {out.begin(), out.end()};
}

Work Group::all_gather_async(const void* in, void* out, size_t chunk, DType dtype,
                             std::string_view context) {
  Op o{.kind = OpKind::all_gather,
       .in = in,
       .out = out,
       .count = chunk,
       .dtype = dtype,
       .context = std::string(context)};
  return issue(std::move(o));
}

Work Group::broadcast_async(void* buf, size_t count, DType dtype, int root,
                            std::string_view context) {
  Op o{.kind = OpKind::broadcast,
       .in = buf,
       .out = buf,
       .count = count,
       .dtype = dtype,
       .peer = root,
       .context = std::string(context)};
  return issue(std::move(o));
}

Work Group::barrier_async(std::string_view context) {
  Op o{.kind = OpKind::barrier, .context = std::string(context)};
  return issue(std::move(o));
}

Work Group::send_async(const void* buf, size_t count, DType dtype, int dst, int tag,
                       std::string_view context) {
  Op o{.kind = OpKind::send,
       .in = buf,
       .count = count,
       .dtype = dtype,
       .peer = dst,
       .tag = tag,
       .context = std::string(context)};
  return issue(std::move(o));
}

Work Group::recv_async(void* buf, size_t count, DType dtype, int src, int tag,
                       std::string_view context) {
  Op o{.kind = OpKind::recv,
       .out = buf,
       .count = count,
       .dtype = dtype,
       .peer = src,
       .tag = tag,
       .context = std::string(context)};
  return issue(std::move(o));
}

namespace {

void check_tensor(const Tensor& t, const char* op, const char* which) {
  DS_CHECK(t.defined(), "[comm] {}: {} tensor is undefined", op, which);
  DS_CHECK(t.is_contiguous(), "[comm] {}: {} tensor {} is not contiguous; pass t.contiguous()", op,
           which, shape_str(t.shape()));
  DS_CHECK(t.is_materialized(), "[comm] {}: {} tensor's storage is released (gather it first)", op,
           which);
}

// The host side of a tensor for the MPI backend: t itself in host memory; for a device tensor a
// host copy (its values copied down when `values`, else uninitialised: an output).
Tensor host_side(const Tensor& t, bool values) {
  if (t.device().is_cpu()) return t;
  Tensor h = Tensor::empty(t.shape(), t.dtype(), kCPU);
  if (values) h.copy_from(t);
  return h;
}

// w, with the result copied up from host staging h into device tensor t by its wait() (nothing
// to do when t is in host memory: then h is t).
Work copy_up_on_wait(Work w, const Tensor& h, const Tensor& t) {
  if (t.device().is_cpu()) return w;
  return w.after_wait([h, t] { t.copy_from(h); });
}

}  // namespace

Work Group::all_reduce_async(const Tensor& t, ReduceOp op, std::string_view context) {
  check_tensor(t, "all_reduce", "the");
  const Tensor h = host_side(t, /*values=*/true);
  Op o{.kind = OpKind::all_reduce,
       .in = h.raw_data(),
       .out = h.raw_data(),
       .count = static_cast<size_t>(h.numel()),
       .dtype = h.dtype(),
       .reduce = op,
       .context = std::string(context),
       .keep_alive = {h}};
  return copy_up_on_wait(issue(std::move(o)), h, t);
}

Work Group::reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op,
                                 std::string_view context) {
  check_tensor(in, "reduce_scatter", "input");
  check_tensor(out, "reduce_scatter", "output");
  DS_CHECK(in.dtype() == out.dtype(), "[comm] reduce_scatter: input is {}, output is {}",
           dtype_name(in.dtype()), dtype_name(out.dtype()));
  DS_CHECK(in.numel() == out.numel() * size(),
           "[comm] reduce_scatter: input has {} elements, expected output {} x group size {} = {}",
           in.numel(), out.numel(), size(), out.numel() * size());
  const Tensor hin = host_side(in, true), hout = host_side(out, false);
  Op o{.kind = OpKind::reduce_scatter,
       .in = hin.raw_data(),
       .out = hout.raw_data(),
       .count = static_cast<size_t>(hout.numel()),
       .dtype = hout.dtype(),
       .reduce = op,
       .context = std::string(context),
       .keep_alive = {hin, hout}};
  return copy_up_on_wait(issue(std::move(o)), hout, out);
}

Work Group::reduce_async(const Tensor& t, int root, ReduceOp op, std::string_view context) {
  check_tensor(t, "reduce", "the");
  const Tensor h = host_side(t, true);
  Op o{.kind = OpKind::reduce,
       .in = h.raw_data(),
       .out = h.raw_data(),
       .count = static_cast<size_t>(h.numel()),
       .dtype = h.dtype(),
       .reduce = op,
       .peer = root,
       .context = std::string(context),
       .keep_alive = {h}};
  Work w = issue(std::move(o));
  return rank() == root ? copy_up_on_wait(std::move(w), h, t) : w;  // elsewhere t is only read
}

Work Group::all_gather_async(const Tensor& in, const Tensor& out, std::string_view context) {
  check_tensor(in, "all_gather", "input");
  check_tensor(out, "all_gather", "output");
  DS_CHECK(in.dtype() == out.dtype(), "[comm] all_gather: input is {}, output is {}",
           dtype_name(in.dtype()), dtype_name(out.dtype()));
  DS_CHECK(out.numel() == in.numel() * size(),
           "[comm] all_gather: output has {} elements, expected input {} x group size {} = {}",
           out.numel(), in.numel(), size(), in.numel() * size());
  const Tensor hin = host_side(in, true), hout = host_side(out, false);
  Op o{.kind = OpKind::all_gather,
       .in = hin.raw_data(),
       .out = hout.raw_data(),
       .count = static_cast<size_t>(hin.numel()),
       .dtype = hin.dtype(),
       .context = std::string(context),
       .keep_alive = {hin, hout}};
  return copy_up_on_wait(issue(std::move(o)), hout, out);
}

Work Group::broadcast_async(const Tensor& t, int root, std::string_view context) {
  check_tensor(t, "broadcast", "the");
  const Tensor h = host_side(t, true);
  Op o{.kind = OpKind::broadcast,
       .in = h.raw_data(),
       .out = h.raw_data(),
       .count = static_cast<size_t>(h.numel()),
       .dtype = h.dtype(),
       .peer = root,
       .context = std::string(context),
       .keep_alive = {h}};
  return copy_up_on_wait(issue(std::move(o)), h, t);
}

Work Group::send_async(const Tensor& t, int dst, int tag, std::string_view context) {
  check_tensor(t, "send", "the");
  const Tensor h = host_side(t, true);
  Op o{.kind = OpKind::send,
       .in = h.raw_data(),
       .count = static_cast<size_t>(h.numel()),
       .dtype = h.dtype(),
       .peer = dst,
       .tag = tag,
       .context = std::string(context),
       .keep_alive = {h}};
  return issue(std::move(o));
}

Work Group::recv_async(const Tensor& t, int src, int tag, std::string_view context) {
  check_tensor(t, "recv", "the");
  const Tensor h = host_side(t, false);
  Op o{.kind = OpKind::recv,
       .out = h.raw_data(),
       .count = static_cast<size_t>(h.numel()),
       .dtype = h.dtype(),
       .peer = src,
       .tag = tag,
       .context = std::string(context),
       .keep_alive = {h}};
  return copy_up_on_wait(issue(std::move(o)), h, t);
}

// ---- the size-1 group ----

namespace {

class SingleProcessGroup;

// Send-to-self mailbox: a send before its recv stores a copy; a recv before its send waits.
struct SingleState : detail::WorkOwner {
  std::mutex mu;
  std::map<int, std::deque<std::vector<char>>> sent;                      // tag -> payloads
  std::map<int, std::deque<std::shared_ptr<detail::WorkState>>> waiting;  // tag -> recvs

  std::string on_timeout(const detail::WorkState& w) override {
    return fmt::format(
        "[comm] {} did not complete within its deadline: a size-1 group can only "
        "receive what it sent to itself, and no matching send (tag {}) was issued",
        w.describe(), w.op.tag);
  }
};

class SingleProcessGroup final : public Group {
 public:
  explicit SingleProcessGroup(std::string name)
      : Group(std::move(name)), state_(std::make_shared<SingleState>()) {}

  int rank() const override { return 0; }
  int size() const override { return 1; }
  int world_rank(int r) const override { return r; }
  Capabilities capabilities() const override {
    return Capabilities{.backend = "single",
                        .async = false,
                        .shared_memory = false,
                        .nodes = 1,
                        .dtypes = {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64}};
  }
  std::shared_ptr<Group> split(int color, int key) override {
    (void)key;
    if (color < 0) return nullptr;
    return std::make_shared<SingleProcessGroup>(fmt::format("{}.split({})", name(), color));
  }

 protected:
  Work start(Op op) override {
    const size_t nbytes = op.count * dtype_size(op.dtype);
    switch (op.kind) {
      case OpKind::reduce_scatter:
      case OpKind::all_gather:
      case OpKind::all_to_all:
        if (op.in != op.out && nbytes) std::memmove(op.out, op.in, nbytes);
        break;
      case OpKind::all_to_all_v: {
        const size_t n = op.send_counts[0] * dtype_size(op.dtype);
        DS_CHECK(op.recv_counts[0] == op.send_counts[0],
                 "[comm] all_to_all_v on group {}: sends {} elements to itself but expects {}",
                 name(), op.send_counts[0], op.recv_counts[0]);
        if (n) std::memmove(op.out, op.in, n);
        break;
      }
      case OpKind::send: {
        std::shared_ptr<detail::WorkState> r;
        {
          std::lock_guard lk(state_->mu);
          auto& q = state_->waiting[op.tag];
          if (!q.empty()) {
            r = q.front();
            q.pop_front();
          } else {
            const char* p = static_cast<const char*>(op.in);
            state_->sent[op.tag].emplace_back(p, p + nbytes);
          }
        }
        if (r) {
          const size_t want = r->op.count * dtype_size(r->op.dtype);
          if (want != nbytes) {
            r->finish(fmt::format("[comm] recv on group {}: expected {} bytes, tag {} brought {}",
                                  name(), want, op.tag, nbytes));
          } else {
            if (nbytes) std::memcpy(r->op.out, op.in, nbytes);
            r->finish();
          }
        }
        break;
      }
      case OpKind::recv: {
        std::lock_guard lk(state_->mu);
        auto& q = state_->sent[op.tag];
        if (q.empty()) {
          auto w = std::make_shared<detail::WorkState>();
          w->op = std::move(op);
          w->group_name = name();
          w->issued = w->started = detail::Clock::now();
          w->deadline = w->issued + std::chrono::duration_cast<detail::Clock::duration>(
                                        std::chrono::duration<double>(timeout()));
          w->owner = state_;
          state_->waiting[w->op.tag].push_back(w);
          return Work(w);
        }
        std::vector<char> msg = std::move(q.front());
        q.pop_front();
        DS_CHECK(msg.size() == nbytes,
                 "[comm] recv on group {}: expected {} bytes, tag {} brought {}", name(), nbytes,
                 op.tag, msg.size());
        if (nbytes) std::memcpy(op.out, msg.data(), nbytes);
        break;
      }
      default:
        break;  // all_reduce, broadcast, barrier: the data is already the result
    }
    const bool collective = op.kind != OpKind::send && op.kind != OpKind::recv;
    Work w = detail::completed_work(std::move(op), name(), 1, collective ? ++seq_ : 0);
    return w;
  }

 private:
  std::shared_ptr<SingleState> state_;
  std::atomic<uint64_t> seq_{0};
};

}  // namespace

std::shared_ptr<Group> single_process_group() {
  return std::make_shared<SingleProcessGroup>("single");
}

namespace detail {
// Used by the backends' init_from_environment when not launched under MPI.
std::shared_ptr<Group> make_single_world() {
  return std::make_shared<SingleProcessGroup>("world");
}
}  // namespace detail

void raise_if_any_failed(Group& group, const std::string& error, std::string_view what) {
  const int n = group.size();
  const int32_t mine = error.empty() ? 0 : 1;
  std::vector<int32_t> all(static_cast<size_t>(n), 0);
  group.all_gather(&mine, all.data(), 1, DType::i32, fmt::format("status after {}", what));
  std::vector<int> failed;
  for (int r = 0; r < n; ++r)
    if (all[static_cast<size_t>(r)] != 0) failed.push_back(r);
  if (failed.empty()) return;
  if (!error.empty()) throw Error(error);
  DS_THROW("[comm] {} failed on rank{} {} (see {} message); this rank stops too", what,
           failed.size() > 1 ? "s" : "", fmt::join(failed, ", "),
           failed.size() > 1 ? "their" : "its");
}

}  // namespace ds::comm

// The aio engine (io/aio.h): requests cut into pieces on one shared queue, drained by workers that
// either keep queue_depth pieces in flight on their own io_uring, or do one piece at a time with
// pread/pwrite. Completions are checked here, in one place, for both kinds.
#include <liburing.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "ds/core/error.h"
#include "ds/io/aio.h"

namespace ds::io {

Engine::~Engine() = default;

namespace {

using Clock = std::chrono::steady_clock;

struct TicketState {
  std::string path;     // for messages
  int64_t pending = 0;  // pieces not yet completed (guarded by the engine's mutex)
  std::string error;    // first failure
};

struct Piece {
  int fd = -1;
  char* buf = nullptr;
  int64_t bytes = 0, offset = 0, done = 0;
  bool write = false;
  std::shared_ptr<TicketState> ticket;
};

// DS_IO_FAULT="<read|write>:<errno name>:<bytes>" (see aio.h).
struct Fault {
  bool active = false, write = false;
  int err = 0;
  int64_t after = 0;
};

Fault parse_fault() {
  Fault f;
  const char* env = std::getenv("DS_IO_FAULT");
  if (!env || !*env) return f;
  const std::string s = env;
  const auto a = s.find(':'), b = s.find(':', a == std::string::npos ? a : a + 1);
  DS_CHECK(a != std::string::npos && b != std::string::npos,
           "[io] DS_IO_FAULT='{}' must be <read|write>:<ERRNO>:<bytes>", s);
  const std::string dir = s.substr(0, a), name = s.substr(a + 1, b - a - 1);
  static const std::pair<const char*, int> kNames[] = {
      {"EIO", EIO}, {"ENOSPC", ENOSPC}, {"EROFS", EROFS}, {"EACCES", EACCES}, {"EDQUOT", EDQUOT}};
  for (auto& [n, e] : kNames)
    if (name == n) f.err = e;
  DS_CHECK(dir == "read" || dir == "write", "[io] DS_IO_FAULT: direction '{}' is not read|write",
           dir);
  DS_CHECK(f.err != 0, "[io] DS_IO_FAULT: errno '{}' is not one of EIO ENOSPC EROFS EACCES EDQUOT",
           name);
  f.write = dir == "write";
  f.after = std::strtoll(s.c_str() + b + 1, nullptr, 10);
  f.active = true;
  return f;
}

const char* errno_name(int e) {
  switch (e) {
    case EIO:
      return "EIO";
    case ENOSPC:
      return "ENOSPC";
    case EROFS:
      return "EROFS";
    case EACCES:
      return "EACCES";
    case EDQUOT:
      return "EDQUOT";
    case EINVAL:
      return "EINVAL";
    case EBADF:
      return "EBADF";
    case EFBIG:
      return "EFBIG";
    default:
      return "errno";
  }
}

std::string advice(int e) {
  if (e == ENOSPC || e == EDQUOT)
    return "the disk is full: free space or point nvme_path elsewhere";
  if (e == EROFS || e == EACCES) return "the folder is not writable: point nvme_path elsewhere";
  if (e == EIO) return "the device reported an I/O error: check `dmesg` and the disk's health";
  if (e == EINVAL) return "misaligned O_DIRECT transfer (a bug: please report it)";
  return "check the disk and the path";
}

class PieceEngine final : public Engine {
 public:
  PieceEngine(const AioOptions& o, bool uring) : o_(o), uring_(uring), fault_(parse_fault()) {
    DS_CHECK(o.block_size >= kAlignment && o.block_size % kAlignment == 0,
             "[io] aio.block_size = {} must be a multiple of {} bytes", o.block_size, kAlignment);
    DS_CHECK(o.queue_depth >= 1 && o.threads >= 1,
             "[io] aio.queue_depth and aio.intra_op_parallelism must be >= 1");
    const int workers = uring_ ? o.threads : std::min(64, o.threads * o.queue_depth);
    for (int w = 0; w < workers; ++w)
      threads_.emplace_back([this] { uring_ ? uring_loop() : sync_loop(); });
  }

  ~PieceEngine() override {
    {
      std::unique_lock lk(mu_);
      done_cv_.wait(lk, [&] { return queue_.empty() && in_flight_ == 0; });
      stop_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  Ticket read(const File& f, void* buf, int64_t bytes, int64_t offset) override {
    return submit(f, static_cast<char*>(buf), bytes, offset, false);
  }
  Ticket write(const File& f, const void* buf, int64_t bytes, int64_t offset) override {
    return submit(f, static_cast<char*>(const_cast<void*>(buf)), bytes, offset, true);
  }

  void wait(Ticket t) override {
    std::unique_lock lk(mu_);
    auto it = tickets_.find(t);
    DS_CHECK(it != tickets_.end(), "[io] ticket {} is unknown or was already waited for", t);
    auto st = it->second;
    done_cv_.wait(lk, [&] { return st->pending == 0; });
    tickets_.erase(it);
    if (!st->error.empty()) throw Error(st->error);
  }

  bool done(Ticket t) override {
    std::lock_guard lk(mu_);
    auto it = tickets_.find(t);
    return it == tickets_.end() || it->second->pending == 0;
  }

  void wait_all() override {
    std::vector<Ticket> all;
    {
      std::lock_guard lk(mu_);
      for (auto& [t, st] : tickets_) all.push_back(t);
    }
    std::sort(all.begin(), all.end());
    std::string first;
    for (Ticket t : all) {
      try {
        wait(t);
      } catch (const Error& e) {
        if (first.empty()) first = e.what();
      }
    }
    if (!first.empty()) throw Error(first);
  }

  const char* kind() const override { return uring_ ? "io_uring" : "threads"; }
  const AioOptions& options() const override { return o_; }
  Counters counters() const override {
    Counters c;
    c.bytes_read = bytes_[0].load();
    c.bytes_written = bytes_[1].load();
    c.requests = requests_.load();
    c.busy_seconds = static_cast<double>(busy_ns_.load()) * 1e-9;
    return c;
  }

 private:
  Ticket submit(const File& f, char* buf, int64_t bytes, int64_t offset, bool write) {
    DS_CHECK(f.is_open(), "[io] {} on a closed file", write ? "write" : "read");
    DS_CHECK(bytes >= 0 && offset >= 0, "[io] negative size or offset on {}", f.path());
    if (f.direct())
      DS_CHECK(bytes % kAlignment == 0 && offset % kAlignment == 0 &&
                   reinterpret_cast<uintptr_t>(buf) % kAlignment == 0,
               "[io] O_DIRECT {} of {} bytes at offset {} of {} is not {}-byte aligned (a bug)",
               write ? "write" : "read", bytes, offset, f.path(), kAlignment);
    auto st = std::make_shared<TicketState>();
    st->path = f.path();
    std::unique_lock lk(mu_);
    const Ticket t = ++next_ticket_;
    tickets_.emplace(t, st);
    for (int64_t at = 0; at < bytes; at += o_.block_size) {
      Piece p;
      p.fd = f.fd();
      p.buf = buf + at;
      p.bytes = std::min(o_.block_size, bytes - at);
      p.offset = offset + at;
      p.write = write;
      p.ticket = st;
      queue_.push_back(std::move(p));
      ++st->pending;
    }
    requests_.fetch_add(1);
    lk.unlock();
    work_cv_.notify_all();
    return t;
  }

  // Takes up to `max` pieces; blocks while the queue is empty and `block` is set. Empty when
  // stopping.
  std::vector<Piece> take(int max, bool block) {
    std::unique_lock lk(mu_);
    if (block) work_cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    std::vector<Piece> out;
    while (!queue_.empty() && static_cast<int>(out.size()) < max) {
      out.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    in_flight_ += static_cast<int64_t>(out.size());
    return out;
  }

  // A piece ended: res = bytes transferred this time, or -errno. Returns true when the piece
  // needs resubmitting (short transfer, EINTR/EAGAIN).
  bool complete(Piece& p, int64_t res) {
    if (res == -EINTR || res == -EAGAIN) return true;
    if (res > 0) {
      p.done += res;
      bytes_[p.write ? 1 : 0].fetch_add(res);
      if (p.done < p.bytes) return true;
    }
    std::lock_guard lk(mu_);
    if (res <= 0 && p.ticket->error.empty()) {
      const int e = res == 0 ? 0 : static_cast<int>(-res);
      p.ticket->error =
          e == 0
              ? fmt::format(
                    "[io] {} of {} bytes at offset {} of {}: unexpected end of file "
                    "(the swap file is shorter than expected; was it truncated?)",
                    p.write ? "write" : "read", p.bytes - p.done, p.offset + p.done, p.ticket->path)
              : fmt::format("[io] {} of {} bytes at offset {} of {} failed: {} ({}, errno {}); {}",
                            p.write ? "write" : "read", p.bytes - p.done, p.offset + p.done,
                            p.ticket->path, std::strerror(e), errno_name(e), e, advice(e));
    }
    --p.ticket->pending;
    --in_flight_;
    if (p.ticket->pending == 0 || in_flight_ == 0) done_cv_.notify_all();
    return false;
  }

  // The injected failure for this piece, if any (0 = none).
  int injected(const Piece& p) const {
    if (!fault_.active || fault_.write != p.write) return 0;
    return bytes_[p.write ? 1 : 0].load() >= fault_.after ? fault_.err : 0;
  }

  void sync_loop() {
    for (;;) {
      std::vector<Piece> got = take(1, /*block=*/true);
      if (got.empty()) return;
      Piece& p = got.front();
      const auto t0 = Clock::now();
      for (;;) {
        int64_t res;
        if (int e = injected(p)) {
          res = -e;
        } else {
          const ssize_t r =
              p.write ? ::pwrite(p.fd, p.buf + p.done, p.bytes - p.done, p.offset + p.done)
                      : ::pread(p.fd, p.buf + p.done, p.bytes - p.done, p.offset + p.done);
          res = r < 0 ? -errno : r;
        }
        if (!complete(p, res)) break;
      }
      busy_ns_.fetch_add(
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
    }
  }

  void uring_loop() {
    io_uring ring;
    if (io_uring_queue_init(static_cast<unsigned>(o_.queue_depth), &ring, 0) != 0) {
      // make_engine() created a ring before choosing io_uring; this cannot fail for lack of
      // support, only for lack of memory. Fall back for this worker rather than lose pieces.
      sync_loop();
      return;
    }
    std::vector<Piece> slots(static_cast<size_t>(o_.queue_depth));
    std::vector<int> free_slots;
    for (int i = o_.queue_depth - 1; i >= 0; --i) free_slots.push_back(i);
    int live = 0;
    Clock::time_point busy_since{};
    auto prep = [&](int slot) {
      Piece& p = slots[static_cast<size_t>(slot)];
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      if (p.write)
        io_uring_prep_write(sqe, p.fd, p.buf + p.done, static_cast<unsigned>(p.bytes - p.done),
                            static_cast<uint64_t>(p.offset + p.done));
      else
        io_uring_prep_read(sqe, p.fd, p.buf + p.done, static_cast<unsigned>(p.bytes - p.done),
                           static_cast<uint64_t>(p.offset + p.done));
      io_uring_sqe_set_data64(sqe, static_cast<uint64_t>(slot));
      if (o_.single_submit) io_uring_submit(&ring);
    };
    for (;;) {
      // Refill: overlap_events keeps the ring full; otherwise a new batch only once it drained.
      const int room = (o_.overlap_events || live == 0) ? o_.queue_depth - live : 0;
      std::vector<Piece> got = room > 0 ? take(room, /*block=*/live == 0) : std::vector<Piece>{};
      if (got.empty() && live == 0) break;  // stopping
      if (live == 0 && !got.empty()) busy_since = Clock::now();
      for (Piece& p : got) {
        if (int e = injected(p)) {  // fails as the device would, without touching the file
          Piece q = std::move(p);
          complete(q, -e);
          continue;
        }
        const int slot = free_slots.back();
        free_slots.pop_back();
        slots[static_cast<size_t>(slot)] = std::move(p);
        prep(slot);
        ++live;
      }
      if (live == 0) continue;
      if (!o_.single_submit) io_uring_submit(&ring);
      // Reap: at least one completion (all of the batch when not overlapping).
      const int want = o_.overlap_events ? 1 : live;
      for (int reaped = 0; reaped < want;) {
        io_uring_cqe* cqe = nullptr;
        const int rc = io_uring_wait_cqe(&ring, &cqe);
        if (rc == -EINTR) continue;
        if (rc < 0) {  // the ring itself failed: fail every live piece rather than hang
          for (int s = 0; s < o_.queue_depth; ++s)
            if (std::find(free_slots.begin(), free_slots.end(), s) == free_slots.end()) {
              complete(slots[static_cast<size_t>(s)], rc);
              free_slots.push_back(s);
            }
          live = 0;
          break;
        }
        const int slot = static_cast<int>(io_uring_cqe_get_data64(cqe));
        const int64_t res = cqe->res;
        io_uring_cqe_seen(&ring, cqe);
        ++reaped;
        Piece& p = slots[static_cast<size_t>(slot)];
        if (complete(p, res)) {
          prep(slot);  // the rest of a short transfer, or a retry
          if (!o_.single_submit) io_uring_submit(&ring);
          if (!o_.overlap_events) --reaped;  // still part of the batch
        } else {
          free_slots.push_back(slot);
          --live;
        }
      }
      if (live == 0)
        busy_ns_.fetch_add(
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - busy_since)
                .count());
    }
    io_uring_queue_exit(&ring);
  }

  AioOptions o_;
  bool uring_;
  Fault fault_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Piece> queue_;
  int64_t in_flight_ = 0;
  bool stop_ = false;
  Ticket next_ticket_ = 0;
  std::unordered_map<Ticket, std::shared_ptr<TicketState>> tickets_;
  std::atomic<int64_t> bytes_[2] = {0, 0};
  std::atomic<int64_t> requests_{0}, busy_ns_{0};
  std::vector<std::thread> threads_;
};

// Whether this process may create an io_uring (kernels before 5.1, or seccomp / sysctl
// kernel.io_uring_disabled, say no).
bool uring_available(std::string* why) {
  io_uring ring;
  const int rc = io_uring_queue_init(4, &ring, 0);
  if (rc == 0) {
    io_uring_queue_exit(&ring);
    return true;
  }
  if (why) *why = fmt::format("io_uring unavailable ({})", std::strerror(-rc));
  return false;
}

}  // namespace

std::unique_ptr<Engine> make_engine(const AioOptions& o, std::string* fallback_reason) {
  AioOptions opts = o;
  if (const char* env = std::getenv("DS_AIO_ENGINE"); env && *env) {
    const std::string_view v = env;
    DS_CHECK(v == "uring" || v == "threads" || v == "auto",
             "[io] DS_AIO_ENGINE='{}' must be uring, threads or auto", v);
    if (v == "uring") opts.kind = AioOptions::Kind::Uring;
    if (v == "threads") opts.kind = AioOptions::Kind::Threads;
  }
  bool uring = false;
  std::string why;
  if (opts.kind == AioOptions::Kind::Threads) {
    why = "the thread pool was asked for";
  } else {
    uring = uring_available(&why);
    DS_CHECK(uring || opts.kind != AioOptions::Kind::Uring, "[io] {}", why);
  }
  if (!uring && fallback_reason) *fallback_reason = why;
  return std::make_unique<PieceEngine>(opts, uring);
}

}  // namespace ds::io

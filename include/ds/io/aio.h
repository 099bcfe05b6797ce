#pragma once
// Asynchronous file I/O for offload: ZeRO-Infinity's "aio" layer (DeepSpeed's csrc/aio/ and
// deepspeed/runtime/swap_tensor/aio_config.py; docs/offload.md), every completion checked, on
// io_uring through liburing, with a pread/pwrite worker pool as the fallback when io_uring is
// unavailable (old kernels, seccomp'd containers).
//
//   io::AioOptions o;                          // DeepSpeed's `aio` section (block_size, ...)
//   auto engine = io::make_engine(o);          // io_uring, or the thread pool
//   io::File f = io::File::open(path, io::File::kReadWrite | io::File::kCreate, /*direct=*/true);
//   io::Ticket t = engine->write(f, buf, bytes, offset);    // returns at once
//   ...compute...
//   engine->wait(t);                           // throws ds::Error naming file, offset, size, errno
//
// A request is cut into block_size pieces and the pieces are dealt to `threads` workers
// (intra_op_parallelism). An io_uring worker keeps up to queue_depth pieces in flight; a pool
// worker does one at a time, and the pool runs threads * queue_depth workers (at most 64). Every
// completion is checked: a short transfer is resubmitted for the rest, EINTR/EAGAIN retried, and
// any other error (EIO, ENOSPC, EROFS, EACCES, ...) or an unexpected end of file fails the ticket.
// wait() then throws; the engine stays usable. Nothing in this layer asserts or aborts.
//
// With O_DIRECT (File::direct()), buffers, sizes and offsets must be multiples of kAlignment;
// AlignedBuffer provides such memory. Counters record the bytes moved and the time each worker
// spent with I/O outstanding (for "bytes per step" and overlap figures).
//
// Fault injection for tests: DS_IO_FAULT="<read|write>:<ENOSPC|EIO|...>:<bytes>" makes every piece
// of that direction that starts after `bytes` bytes of it were transferred by this engine fail
// with that errno (as a real device would: the ticket fails and wait() throws).
//
// Threading: submit and wait from one thread at a time (the training thread); the workers are
// internal. The engine must outlive its tickets' buffers' use; its destructor waits for
// everything in flight (errors are then dropped: call wait_all() to see them).
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

namespace ds::io {

// O_DIRECT alignment of buffers, sizes and offsets: 4 KiB, the largest logical block size of
// common devices (offload.md §8.3: DeepSpeed's fixed 1 KiB fails on 4Kn drives).
inline constexpr int64_t kAlignment = 4096;
inline int64_t align_up(int64_t n, int64_t a = kAlignment) {
  return (n + a - 1) / a * a;
}

// DeepSpeed's `aio` section (deepspeed/runtime/swap_tensor/aio_config.py), same defaults as its
// JSON config.
struct AioOptions {
  int64_t block_size = 1048576;  // bytes per submitted piece
  int queue_depth = 8;           // pieces in flight per worker
  int threads = 1;               // intra_op_parallelism (old name: thread_count)
  bool single_submit = false;    // io_uring: one submit call per piece instead of one per batch
  bool overlap_events = true;  // refill the queue as pieces complete (false: batch, then wait all)
  // O_DIRECT for the offload swap files where the filesystem takes it (false: buffered I/O; the
  // page cache then holds swapped data too). Read by the stores that open those files
  // (zero/offload/), not by the engine: `aio.use_direct_io`, deepspeed.cpp's own key.
  bool use_direct_io = true;
  enum class Kind { Auto, Uring, Threads };
  Kind kind = Kind::Auto;  // Auto: io_uring when the kernel allows it; DS_AIO_ENGINE=threads|uring
};

// An open file and its path (for messages). Closed by the destructor; movable.
class File {
 public:
  enum Mode { kRead = 1, kReadWrite = 2, kCreate = 4 };
  // Opens `path`; `direct` adds O_DIRECT. Throws ds::Error naming the path and errno.
  static File open(const std::string& path, int mode, bool direct);
  File() = default;
  File(File&& o) noexcept;
  File& operator=(File&& o) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  bool direct() const { return direct_; }
  bool is_open() const { return fd_ >= 0; }
  // Reserves `bytes` on disk (fallocate; the file's size becomes at least that). A short disk is
  // an error naming the path, the bytes needed and the bytes available; a filesystem without
  // fallocate gets ftruncate (returns false then: space is not reserved).
  bool reserve(int64_t bytes);

 private:
  int fd_ = -1;
  std::string path_;
  bool direct_ = false;
};

// Host memory aligned to kAlignment for O_DIRECT transfers (zeroed). Movable.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(int64_t bytes);
  AlignedBuffer(AlignedBuffer&& o) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer();
  void* data() const { return p_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  int64_t bytes() const { return bytes_; }

 private:
  void release() noexcept;
  void* p_ = nullptr;
  int64_t bytes_ = 0;
  bool mapped_ = false;  // >= 2 MiB: its own mapping (returned to the system when freed)
};

using Ticket = uint64_t;

struct Counters {
  int64_t bytes_read = 0, bytes_written = 0;
  int64_t requests = 0;
  double busy_seconds = 0;  // summed over workers: time with at least one piece outstanding
};

class Engine {
 public:
  virtual ~Engine();
  // Queue a transfer of `bytes` at `offset`; the buffer must stay valid until wait().
  virtual Ticket read(const File& f, void* buf, int64_t bytes, int64_t offset) = 0;
  virtual Ticket write(const File& f, const void* buf, int64_t bytes, int64_t offset) = 0;
  // Blocks until every piece of `t` completed; throws ds::Error with the first failure. A ticket
  // is waited for once.
  virtual void wait(Ticket t) = 0;
  // True when `t` has completed (wait() then returns at once).
  virtual bool done(Ticket t) = 0;
  // Waits for every outstanding ticket; throws the first failure among them.
  virtual void wait_all() = 0;
  virtual const char* kind() const = 0;  // "io_uring" or "threads"
  virtual Counters counters() const = 0;
  virtual const AioOptions& options() const = 0;
};

// The engine for `o` (Kind::Auto: io_uring if a ring can be created here, else the pool, with the
// reason in `fallback_reason` when not null).
std::unique_ptr<Engine> make_engine(const AioOptions& o, std::string* fallback_reason = nullptr);

// Whether O_DIRECT works in `dir`: a 4 KiB aligned write and read of a temporary file that is
// removed again. False (with the reason) on tmpfs, overlayfs and other filesystems without it.
bool direct_io_supported(const std::string& dir, std::string* why = nullptr);

// Bytes free for an unprivileged writer on the filesystem holding `path` (statvfs f_bavail).
int64_t available_bytes(const std::string& path);

}  // namespace ds::io

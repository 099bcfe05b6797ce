// Files, aligned buffers and the O_DIRECT / free-space probes of the aio layer (io/aio.h).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <utility>

#include "ds/core/error.h"
#include "ds/io/swap_dir.h"
#include "ds/io/aio.h"

namespace ds::io {

File File::open(const std::string& path, int mode, bool direct) {
  int flags = (mode & kReadWrite) ? O_RDWR : O_RDONLY;
  if (mode & kCreate) flags |= O_CREAT;
  if (direct) flags |= O_DIRECT;
  flags |= O_CLOEXEC;
  const int fd = ::open(path.c_str(), flags, 0600);
  if (fd < 0) {
    const int e = errno;
    DS_THROW(
        "[io] cannot open {}{}: {} (errno {}){}", path, direct ? " with O_DIRECT" : "",
        std::strerror(e), e,
        e == EACCES || e == EROFS ? ": the folder is not writable; point nvme_path elsewhere" : "");
  }
  File f;
  f.fd_ = fd;
  f.path_ = path;
  f.direct_ = direct;
  return f;
}

File::File(File&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)), direct_(o.direct_) {}

File& File::operator=(File&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
    path_ = std::move(o.path_);
    direct_ = o.direct_;
  }
  return *this;
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

bool File::reserve(int64_t bytes) {
  if (bytes <= 0) return true;
  if (::fallocate(fd_, 0, 0, bytes) == 0) return true;
  const int e = errno;
  if (e == ENOSPC || e == EDQUOT || e == EFBIG) {
    const int64_t avail = available_bytes(path_);
    DS_THROW(
        "[io] cannot reserve {:.2f} GiB for {}: {} ({:.2f} GiB available on that filesystem{}); "
        "free space there or point nvme_path at a larger disk",
        static_cast<double>(bytes) / (1 << 30), path_, std::strerror(e),
        static_cast<double>(avail) / (1 << 30), other_swap_dirs(path_));
  }
  if (e != EOPNOTSUPP && e != ENOSYS && e != EINVAL)
    DS_THROW("[io] fallocate of {} bytes on {} failed: {} (errno {})", bytes, path_,
             std::strerror(e), e);
  // No fallocate on this filesystem: size the file so reads of untouched ranges succeed.
  if (::ftruncate(fd_, bytes) != 0) {
    const int e2 = errno;
    DS_THROW("[io] cannot size {} to {} bytes: {} (errno {})", path_, bytes, std::strerror(e2), e2);
  }
  return false;
}

AlignedBuffer::AlignedBuffer(int64_t bytes) : bytes_(align_up(bytes)) {
  if (bytes_ == 0) return;
  // Large buffers are mapped on 2 MiB boundaries, as transparent huge pages: a 1 MiB transfer from
  // scattered 4 KiB pages needs 256 segments and virtio disks take 254 per request, so the kernel
  // splits it; from huge pages it goes as one request (measured: 0.5-2.2 GB/s -> 2.4-3.4 GB/s
  // reads). Mapped, not malloc'ed: staging buffers come and go all step long, and their memory
  // must go back to the system when they do (the C heap keeps freed blocks below its mmap
  // threshold, per thread arena, and RSS would creep up).
  constexpr int64_t kHuge = int64_t{2} << 20;
  if (bytes_ >= kHuge) {
    const size_t len = static_cast<size_t>(bytes_ + kHuge);
    void* raw = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
      DS_THROW(
          "[io] out of memory mapping a {:.1f} MiB I/O buffer; lower buffer_count or "
          "sub_group_size",
          static_cast<double>(bytes_) / (1 << 20));
    const auto base = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t start = (base + kHuge - 1) & ~static_cast<uintptr_t>(kHuge - 1);
    const size_t head = start - base, tail = len - head - static_cast<size_t>(bytes_);
    if (head > 0) ::munmap(raw, head);
    if (tail > 0) ::munmap(reinterpret_cast<char*>(start) + bytes_, tail);
    p_ = reinterpret_cast<void*>(start);
    mapped_ = true;
    ::madvise(p_, static_cast<size_t>(bytes_), MADV_HUGEPAGE);  // advice only
    return;  // anonymous pages read as zeros
  }
  if (posix_memalign(&p_, static_cast<size_t>(kAlignment), static_cast<size_t>(bytes_)) != 0)
    DS_THROW(
        "[io] out of memory allocating a {:.1f} MiB I/O buffer; lower buffer_count or "
        "sub_group_size",
        static_cast<double>(bytes_) / (1 << 20));
  std::memset(p_, 0, static_cast<size_t>(bytes_));
}

void AlignedBuffer::release() noexcept {
  if (!p_) return;
  if (mapped_)
    ::munmap(p_, static_cast<size_t>(bytes_));
  else
    std::free(p_);
  p_ = nullptr;
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& o) noexcept
    : p_(std::exchange(o.p_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)),
      mapped_(std::exchange(o.mapped_, false)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  if (this != &o) {
    release();
    p_ = std::exchange(o.p_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    mapped_ = std::exchange(o.mapped_, false);
  }
  return *this;
}

AlignedBuffer::~AlignedBuffer() {
  release();
}

bool direct_io_supported(const std::string& dir, std::string* why) {
  const std::string path = dir + "/.ds_direct_probe." + std::to_string(::getpid());
  auto fail = [&](const char* step, int e) {
    if (why) *why = std::string(step) + ": " + std::strerror(e);
    ::unlink(path.c_str());
    return false;
  };
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) return fail("open with O_DIRECT", errno);
  AlignedBuffer out(kAlignment), in(kAlignment);
  for (int64_t i = 0; i < kAlignment; ++i)
    out.as<unsigned char>()[i] = static_cast<unsigned char>(i * 7);
  const ssize_t w = ::pwrite(fd, out.data(), kAlignment, 0);
  const int we = errno;
  const ssize_t r = w == kAlignment ? ::pread(fd, in.data(), kAlignment, 0) : -1;
  const int re = errno;
  ::close(fd);
  if (w != kAlignment) return fail("aligned O_DIRECT write", w < 0 ? we : EIO);
  if (r != kAlignment) return fail("aligned O_DIRECT read", r < 0 ? re : EIO);
  if (std::memcmp(out.data(), in.data(), kAlignment) != 0) return fail("read-back compare", EIO);
  ::unlink(path.c_str());
  return true;
}

int64_t available_bytes(const std::string& path) {
  struct statvfs s;
  if (::statvfs(path.c_str(), &s) != 0) return -1;
  return static_cast<int64_t>(s.f_bavail) * static_cast<int64_t>(s.f_frsize);
}

}  // namespace ds::io

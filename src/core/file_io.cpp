// Durable writes (file_io.h).
#include "ds/core/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "ds/core/checksum.h"
#include "ds/core/error.h"

namespace ds {

namespace fs = std::filesystem;

namespace {
std::string errno_text() {
  return std::strerror(errno);
}
}  // namespace

void write_all(int fd, const void* data, size_t len, const fs::path& path) {
  auto p = static_cast<const char*>(data);
  while (len > 0) {
    const ssize_t n = ::write(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    DS_CHECK(n > 0, "[io] writing '{}' failed: {}; check free disk space and permissions",
             path.string(), errno_text());
    p += n;
    len -= static_cast<size_t>(n);
  }
}

void fsync_dir(const fs::path& dir) {
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

fs::path temporary_name(const fs::path& path) {
  return fs::path(path.string() + ".tmp-" + std::to_string(::getpid()));
}

void write_file_atomic(const fs::path& path, std::string_view bytes) {
  const fs::path tmp = temporary_name(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  DS_CHECK(fd >= 0, "[io] cannot create '{}': {}; check that the folder exists and is writable",
           tmp.string(), errno_text());
  try {
    write_all(fd, bytes.data(), bytes.size(), tmp);
    DS_CHECK(::fsync(fd) == 0, "[io] fsync of '{}' failed: {}", tmp.string(), errno_text());
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = errno_text();
    ::unlink(tmp.c_str());
    DS_THROW("[io] cannot rename '{}' to '{}': {}", tmp.string(), path.string(), why);
  }
  fsync_dir(path.parent_path());
}

uint64_t file_xxh64(const fs::path& path, uint64_t* size) {
  std::ifstream in(path, std::ios::binary);
  DS_CHECK(in, "[io] cannot read {}", path.string());
  Xxh64 h;
  std::vector<char> buf(1 << 20);
  *size = 0;
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto got = in.gcount();
    if (got <= 0) break;
    h.update(buf.data(), static_cast<size_t>(got));
    *size += static_cast<uint64_t>(got);
  }
  return h.digest();
}

}  // namespace ds

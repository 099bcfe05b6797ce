// Durable writes (file_io.h).
#include "ds/core/file_io.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <regex>
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

std::vector<fs::path> remove_dead_temporaries(const fs::path& dir, const std::string& name) {
  static const std::regex kTemp(R"(^\.?(.+)\.(tmp-|tmp\.|old-)(\d+)$)");
  std::vector<fs::path> done;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return done;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir, ec)) names.push_back(e.path().filename().string());
  for (const std::string& n : names) {
    std::smatch m;
    if (!std::regex_match(n, m, kTemp)) continue;
    const std::string base = m[1].str();
    if (!name.empty() && base != name) continue;
    const long pid = std::strtol(m[3].str().c_str(), nullptr, 10);
    if (pid <= 0 || pid == static_cast<long>(::getpid())) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // it still runs
    const fs::path p = dir / n;
    if (m[2].str() == "old-" && !fs::exists(dir / base, ec)) {
      fs::rename(p, dir / base, ec);  // the replacement never took the name: the old one goes back
      DS_CHECK(!ec, "[io] cannot restore '{}' to '{}': {}", p.string(), (dir / base).string(),
               ec.message());
    } else {
      fs::remove_all(p, ec);
      DS_CHECK(!ec, "[io] cannot delete the stale temporary '{}': {}", p.string(), ec.message());
    }
    done.push_back(p);
  }
  return done;
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

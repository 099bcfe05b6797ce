// Run-unique swap folders with a held lock (io/swap_dir.h).
#include "ds/io/swap_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "ds/core/error.h"

namespace ds::io {
namespace fs = std::filesystem;

namespace {

// True when `dir` belongs to a run that is gone: its lock file exists and nobody holds it, and the
// folder is not brand new (a starting run creates the folder a moment before it takes the lock).
bool abandoned(const fs::path& dir) {
  std::error_code ec;
  const auto age = fs::file_time_type::clock::now() - fs::last_write_time(dir, ec);
  if (ec || age < std::chrono::minutes(1)) return false;
  const int fd = ::open((dir / "lock").c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return false;
  const bool free = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
  ::close(fd);  // releases the lock again
  return free;
}

}  // namespace

SwapDir::SwapDir(const std::string& nvme_path, const std::string& name,
                 const std::function<void(const std::string&)>& notice) {
  std::error_code ec;
  DS_CHECK(fs::is_directory(nvme_path, ec),
           "[offload] nvme_path {} is not a folder; create it or point nvme_path at one",
           nvme_path);
  const fs::path root = fs::path(nvme_path) / "ds_swap";
  fs::create_directories(root, ec);
  DS_CHECK(!ec, "[offload] cannot create {}: {}; is nvme_path writable?", root.string(),
           ec.message());
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    if (!entry.is_directory() || !abandoned(entry.path())) continue;
    std::error_code rm;
    const auto n = fs::remove_all(entry.path(), rm);
    if (!rm && notice)
      notice(
          fmt::format("[offload] removed {} ({} files) left by a run that ended without "
                      "cleaning up",
                      entry.path().string(), n));
  }
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  path_ = (root / fmt::format("{}-{}-{}", host, ::getpid(), name)).string();
  fs::remove_all(path_, ec);  // a previous process with our pid and name is certainly gone
  fs::create_directories(path_, ec);
  DS_CHECK(!ec, "[offload] cannot create {}: {}", path_, ec.message());
  lock_fd_ = ::open((fs::path(path_) / "lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  DS_CHECK(lock_fd_ >= 0 && ::flock(lock_fd_, LOCK_EX | LOCK_NB) == 0,
           "[offload] cannot lock {}/lock: {}", path_, std::strerror(errno));
}

SwapDir::~SwapDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

}  // namespace ds::io

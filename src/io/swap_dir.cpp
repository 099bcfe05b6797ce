// Run-unique swap folders with a held lock (io/swap_dir.h).
#include "ds/io/swap_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <signal.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <optional>
#include <vector>

#include "ds/core/error.h"

namespace ds::io {
namespace fs = std::filesystem;

namespace {

std::string this_host() {
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  return host;
}

// The owner's pid from a folder named <host>-<pid>-<name>, when <host> is this machine's.
std::optional<pid_t> local_owner(const fs::path& dir) {
  const std::string prefix = this_host() + "-";
  const std::string n = dir.filename().string();
  if (n.rfind(prefix, 0) != 0) return std::nullopt;
  pid_t pid = 0;
  const char* b = n.data() + prefix.size();
  const auto [end, err] = std::from_chars(b, n.data() + n.size(), pid);
  if (err != std::errc() || end == b || pid <= 0) return std::nullopt;
  return pid;
}

// True when `dir` belongs to a run that is gone. The owner holds a flock on `lock` for as long as
// it lives, and the kernel drops it the moment the process dies (kill -9 included), so a lock file
// nobody holds means a dead owner, however young the folder. A folder without a lock file is a run
// between creating the folder and its lock file, or one that died right there: it is dead only
// when its owner's pid (in its name) is on this machine and gone. Age plays no part: a run
// restarted at once after kill -9 must get the disk space back.
bool abandoned(const fs::path& dir) {
  const int fd = ::open((dir / "lock").c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    const auto pid = local_owner(dir);
    return pid && ::kill(*pid, 0) != 0 && errno == ESRCH;
  }
  const bool free = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
  ::close(fd);  // releases the lock again
  return free;
}

// Bytes the files under `dir` occupy on disk (allocated blocks: what removing them frees; a sparse
// file's length would overstate it).
uint64_t bytes_under(const fs::path& dir) {
  std::error_code ec;
  uint64_t n = 0;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    struct stat st {};
    if (it->is_regular_file(ec) && ::lstat(it->path().c_str(), &st) == 0)
      n += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  return n;
}

std::string describe(const fs::path& dir, uint64_t bytes, bool dead) {
  return fmt::format("{} ({:.2f} GiB, {})", dir.string(), static_cast<double>(bytes) / (1 << 30),
                     dead ? "its run is gone: delete it" : "a running process holds its lock");
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
  path_ = (root / fmt::format("{}-{}-{}", this_host(), ::getpid(), name)).string();
  fs::remove_all(path_, ec);  // a previous process with our pid and name is certainly gone
  fs::create_directories(path_, ec);
  DS_CHECK(!ec, "[offload] cannot create {}: {}", path_, ec.message());
  // The lock file appears already locked: it is made and locked under another name, then renamed
  // (the flock stays with the open file). A start-up scan by another run (another rank of this
  // job, a second job on the disk) sees either no lock file, and then this live pid, or one that
  // is held; never a lock file free for a moment, which it would take for a dead run's and delete
  // this folder under us (seen: a rank's swap file vanished right after it was created).
  const fs::path tmp = fs::path(path_) / "lock.tmp";
  lock_fd_ = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  DS_CHECK(lock_fd_ >= 0 && ::flock(lock_fd_, LOCK_EX | LOCK_NB) == 0,
           "[offload] cannot lock {}: {}", tmp.string(), std::strerror(errno));
  DS_CHECK(::rename(tmp.c_str(), (fs::path(path_) / "lock").c_str()) == 0,
           "[offload] cannot rename {} to lock: {}", tmp.string(), std::strerror(errno));
}

SwapDir::~SwapDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

std::string other_swap_dirs(const std::string& file) {
  std::error_code ec;
  fs::path own, root;
  for (fs::path p = fs::path(file); !p.empty() && p != p.root_path(); p = p.parent_path()) {
    if (p.parent_path().filename() == "ds_swap") {
      own = p;
      root = p.parent_path();
      break;
    }
  }
  if (root.empty()) return {};
  std::vector<std::string> parts;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    if (!e.is_directory(ec) || e.path() == own) continue;
    parts.push_back(describe(e.path(), bytes_under(e.path()), abandoned(e.path())));
  }
  if (parts.empty()) return {};
  return fmt::format("; other swap folders there: {}", fmt::join(parts, ", "));
}

SwapSpace swap_space(const std::string& nvme_path) {
  SwapSpace out;
  std::error_code ec;
  std::vector<std::string> parts;
  for (const auto& e : fs::directory_iterator(fs::path(nvme_path) / "ds_swap", ec)) {
    if (!e.is_directory(ec)) continue;
    const uint64_t bytes = bytes_under(e.path());
    const bool dead = abandoned(e.path());
    if (dead) out.reclaimable += static_cast<int64_t>(bytes);
    parts.push_back(dead ? fmt::format("{} ({:.2f} GiB, its run is gone: removed at start-up, "
                                       "counted as free)",
                                       e.path().string(), static_cast<double>(bytes) / (1 << 30))
                         : describe(e.path(), bytes, false));
  }
  if (!parts.empty()) out.folders = fmt::format("; swap folders there: {}", fmt::join(parts, ", "));
  return out;
}

}  // namespace ds::io

#pragma once
// A run-unique scratch folder for swap files under a user's nvme_path (DeepSpeed's swap folders,
// <nvme_path>/zero_stage_3/.../rank<R>/, are shared by every job on that path and wiped at start:
// transformers#31800; docs/offload.md): <nvme_path>/ds_swap/<host>-<pid>-<name>/, holding a `lock`
// file that this process keeps locked (flock) while it lives. Two jobs, or two ranks, on one
// nvme_path never share files. The folder is scratch: the destructor removes it (clean exit or
// exception); a folder left by a run that died is removed when the next one starts, with a notice.
// "Died" is decided by the lock, never by age: the kernel releases a flock when its process dies
// (kill -9 too), so a `lock` file nobody holds means a dead owner; a folder without one (its owner
// between mkdir and the lock) is dead only when the pid in its name is on this host and gone.
//
//   io::SwapDir dir(nvme_path, "rank0-optimizer", [](const std::string& m) { log(m); });
//   std::string file = dir.path() + "/state.swp";
//
// Threading: construct and destroy on one thread.
#include <cstdint>
#include <functional>
#include <string>

namespace ds::io {

class SwapDir {
 public:
  // Creates the folder (and nvme_path/ds_swap). Errors name the path and say what to do.
  SwapDir(const std::string& nvme_path, const std::string& name,
          const std::function<void(const std::string&)>& notice = {});
  ~SwapDir();
  SwapDir(const SwapDir&) = delete;
  SwapDir& operator=(const SwapDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int lock_fd_ = -1;
};

// For disk-full messages about `file` (a path inside some <nvme_path>/ds_swap/<run>/): the other
// run folders beside it, each with its size and whether its run is alive, as
// "; other swap folders there: ..."; empty when there are none or `file` is not in a ds_swap.
std::string other_swap_dirs(const std::string& file);

// For a free-space check made before this run's SwapDir exists (ds_train's start-up check): the
// run folders already in <nvme_path>/ds_swap. Folders of dead runs (by their lock, as above) are
// removed when a run starts, so their bytes count as free (`reclaimable`); `folders` names every
// folder with its size and whether its run is alive, as "; swap folders there: ..." ("" if none).
struct SwapSpace {
  int64_t reclaimable = 0;  // bytes on disk in folders of dead runs
  std::string folders;
};
SwapSpace swap_space(const std::string& nvme_path);

}  // namespace ds::io

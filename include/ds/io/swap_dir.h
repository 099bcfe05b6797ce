#pragma once
// A run-unique scratch folder for swap files under a user's nvme_path (reference/offload.md §8
// lessons 4, 5): <nvme_path>/ds_swap/<host>-<pid>-<name>/, holding a `lock` file that this process
// keeps locked (flock) while it lives. Two jobs, or two ranks, on one nvme_path never share files.
// The folder is scratch: the destructor removes it (clean exit or exception); a folder left by a
// run that died (its lock is free and it is older than a minute) is removed when the next one
// starts, with a notice.
//
//   io::SwapDir dir(nvme_path, "rank0-optimizer", [](const std::string& m) { log(m); });
//   std::string file = dir.path() + "/state.swp";
//
// Threading: construct and destroy on one thread.
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

}  // namespace ds::io

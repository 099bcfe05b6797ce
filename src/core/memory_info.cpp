#include "ds/core/memory_info.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "ds/core/error.h"

namespace ds {

namespace {

int64_t read_int_file(const char* path) {
  std::ifstream in(path);
  int64_t v = -1;
  if (!(in >> v)) return -1;  // missing, or "max"
  return v;
}

}  // namespace

int64_t available_memory_bytes() {
  int64_t avail = 0;
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kb = 0;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") {
      avail = kb * 1024;
      break;
    }
  const int64_t max = read_int_file("/sys/fs/cgroup/memory.max");
  const int64_t cur = read_int_file("/sys/fs/cgroup/memory.current");
  if (max > 0 && max - cur > 0 && (avail == 0 || max - cur < avail)) avail = max - cur;
  if (const char* env = std::getenv("DS_MEMORY_LIMIT"); env && *env) {
    char* end = nullptr;
    const double v = std::strtod(env, &end);
    const std::string u = end ? end : "";
    const double mul = u == "K" ? 1024.0 : u == "M" ? 1048576.0 : u == "G" ? 1073741824.0 : 1.0;
    DS_CHECK(v > 0 && (u.empty() || mul > 1.0),
             "[memory] DS_MEMORY_LIMIT='{}' must be a number of bytes, optionally with K, M or G",
             env);
    const auto limit = static_cast<int64_t>(v * mul);
    if (avail == 0 || limit < avail) avail = limit;
  }
  return avail;
}

}  // namespace ds

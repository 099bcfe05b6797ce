#include "ds/core/parallel.h"

#include <omp.h>

#include <algorithm>

#include <mutex>
#include <vector>

namespace ds {

namespace {
struct ThreadListeners {
  std::mutex mu;
  std::vector<std::function<void(int)>> fns;
  int set = 0;  // the last set_num_threads count, 0 before the first
};
ThreadListeners& listeners() {
  static ThreadListeners* l = new ThreadListeners();  // outlives static destructors
  return *l;
}
}  // namespace

int num_threads() {
  return omp_get_max_threads();
}

void set_num_threads(int n) {
  n = std::max(1, n);
  omp_set_num_threads(n);
  std::vector<std::function<void(int)>> fns;
  {
    auto& l = listeners();
    std::lock_guard lk(l.mu);
    l.set = n;
    fns = l.fns;
  }
  for (auto& f : fns) f(n);
}

void limit_this_thread(int n) {
  omp_set_num_threads(std::max(1, n));  // an ICV of the calling thread only
}

void add_thread_count_listener(std::function<void(int)> listener) {
  int now = 0;
  {
    auto& l = listeners();
    std::lock_guard lk(l.mu);
    l.fns.push_back(listener);
    now = l.set;
  }
  if (now > 0) listener(now);
}

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t max_chunks = (n + grain - 1) / grain;
  const int nt = static_cast<int>(std::min<int64_t>(max_chunks, omp_get_max_threads()));
  if (nt <= 1 || omp_in_parallel()) {
    fn(0, n);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num();
    const int64_t begin = n * t / nt, end = n * (t + 1) / nt;
    if (begin < end) fn(begin, end);
  }
}

}  // namespace ds

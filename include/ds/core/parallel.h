#pragma once
// One thread pool for everything: OpenMP. Our kernels and the BLAS (OpenBLAS built with OpenMP)
// share it, so they never oversubscribe the cores.
#include <cstdint>
#include <functional>

namespace ds {

int num_threads();
void set_num_threads(int n);  // also tells the listeners below (the BLAS's thread count)
// Called with the count of every set_num_threads, and at once with the current count when
// set_num_threads was called before the listener was added (a BLAS loaded later). For layers above
// core (the CPU backend's BLAS) to follow the thread count without core depending on them.
void add_thread_count_listener(std::function<void(int)> listener);

// Caps parallel_for (and OpenMP regions) started from the calling thread at n threads, without
// touching the other threads' setting or the BLAS: for a background thread (the offloaded
// optimizer step) that must not take the cores from the training thread's kernels.
void limit_this_thread(int n);

// Runs fn(begin, end) over [0, n) split into contiguous chunks of at least `grain` items.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace ds

#pragma once
// One thread pool for everything: OpenMP. Our kernels and the BLAS (OpenBLAS built with OpenMP)
// share it, so they never oversubscribe the cores.
#include <cstdint>
#include <functional>

namespace ds {

int num_threads();
void set_num_threads(int n);  // also sets the BLAS's thread count

// Runs fn(begin, end) over [0, n) split into contiguous chunks of at least `grain` items.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace ds

#include "ds/core/parallel.h"

#include <omp.h>

#include <algorithm>

#include "ds/backend/backend.h"

namespace ds {

namespace backend {
void set_blas_threads(int n);  // src/backend/cpu/blas.cpp
}

int num_threads() { return omp_get_max_threads(); }

void set_num_threads(int n) {
  omp_set_num_threads(std::max(1, n));
  backend::set_blas_threads(std::max(1, n));
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

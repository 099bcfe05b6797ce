#pragma once
// Row-wise iteration over strided views (header-only): the loop every strided kernel needs.
#include <cstdint>
#include <vector>

#include "ds/core/tensor.h"  // Shape

namespace ds {

// Iterates the multi-index of `shape` in row-major order over all dims but the last, calling
// fn(outer_linear_index, offset_in_a, offset_in_b) once per row. Offsets use the given strides.
template <class Fn>
void for_each_row(const Shape& shape, const Shape& sa, const Shape& sb, int64_t row_begin,
                  int64_t row_end, Fn fn) {
  const size_t nd = shape.size();
  if (nd <= 1) {
    for (int64_t r = row_begin; r < row_end; ++r) fn(r, 0, 0);
    return;
  }
  std::vector<int64_t> idx(nd - 1, 0);
  int64_t rem = row_begin;
  int64_t oa = 0, ob = 0;
  for (size_t d = nd - 1; d-- > 0;) {
    idx[d] = rem % shape[d];
    rem /= shape[d];
    oa += idx[d] * sa[d];
    ob += idx[d] * sb[d];
  }
  for (int64_t r = row_begin; r < row_end; ++r) {
    fn(r, oa, ob);
    for (size_t d = nd - 1; d-- > 0;) {
      ++idx[d];
      oa += sa[d];
      ob += sb[d];
      if (idx[d] < shape[d]) break;
      oa -= sa[d] * shape[d];
      ob -= sb[d] * shape[d];
      idx[d] = 0;
    }
  }
}

}  // namespace ds

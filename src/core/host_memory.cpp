// Host-memory primitives of core (host_memory.h).
#include "ds/core/host_memory.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "ds/core/error.h"
#include "ds/core/parallel.h"
#include "ds/core/strided.h"

namespace ds {

void host_copy(const Tensor& src, const Tensor& dst) {
  DS_CHECK(src.numel() == dst.numel(), "[copy] {} elements into {}", src.numel(), dst.numel());
  const int64_t n = src.numel();
  if (n == 0) return;
  if (src.is_contiguous() && dst.is_contiguous()) {
    const char* s = static_cast<const char*>(src.raw_data());
    char* d = static_cast<char*>(dst.raw_data());
    const size_t ss = dtype_size(src.dtype()), ds_ = dtype_size(dst.dtype());
    parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) {
      convert(s + b * ss, src.dtype(), d + b * ds_, dst.dtype(), static_cast<size_t>(e - b));
    });
    return;
  }
  // Strided: walk rows of the source's shape; each row is gathered into a contiguous scratch and
  // converted into the destination row (also strided in general).
  DS_CHECK(src.shape() == dst.shape() || dst.is_contiguous(),
           "[copy] strided copy needs equal shapes, got {} and {}", shape_str(src.shape()),
           shape_str(dst.shape()));
  const Shape& shape = src.shape();
  const int64_t cols = shape.empty() ? 1 : shape.back();
  const int64_t rows = n / cols;
  const Shape dst_strides = dst.shape() == src.shape() ? dst.strides() : contiguous_strides(shape);
  const int64_t ls = shape.empty() ? 1 : src.strides().back();
  const int64_t ld = shape.empty() ? 1 : dst_strides.back();
  const size_t ss = dtype_size(src.dtype()), dsz = dtype_size(dst.dtype());
  const char* s = static_cast<const char*>(src.raw_data());
  char* d = static_cast<char*>(dst.raw_data());
  parallel_for(rows, std::max<int64_t>(1, (1 << 14) / cols), [&](int64_t r0, int64_t r1) {
    std::vector<char> in(static_cast<size_t>(cols) * ss), outb(static_cast<size_t>(cols) * dsz);
    for_each_row(shape, src.strides(), dst_strides, r0, r1, [&](int64_t, int64_t os, int64_t od) {
      const char* srow = s + os * static_cast<int64_t>(ss);
      char* drow = d + od * static_cast<int64_t>(dsz);
      if (ls == 1 && ld == 1) {
        convert(srow, src.dtype(), drow, dst.dtype(), static_cast<size_t>(cols));
        return;
      }
      for (int64_t i = 0; i < cols; ++i)
        std::memcpy(in.data() + i * ss, srow + i * ls * static_cast<int64_t>(ss), ss);
      convert(in.data(), src.dtype(), outb.data(), dst.dtype(), static_cast<size_t>(cols));
      for (int64_t i = 0; i < cols; ++i)
        std::memcpy(drow + i * ld * static_cast<int64_t>(dsz), outb.data() + i * dsz, dsz);
    });
  });
}

void host_fill(const Tensor& dst, double value) {
  DS_CHECK(dst.is_contiguous(), "[fill] needs a contiguous tensor");
  const int64_t n = dst.numel();
  if (n == 0) return;
  if (value == 0.0) {
    char* d = static_cast<char*>(dst.raw_data());
    const size_t es = dtype_size(dst.dtype());
    parallel_for(n, 1 << 18, [&](int64_t b, int64_t e) {
      std::memset(d + b * es, 0, static_cast<size_t>(e - b) * es);
    });
    return;
  }
  // Fill a small pattern block in the target dtype, then replicate it.
  const int64_t block = std::min<int64_t>(n, 4096);
  std::vector<double> vals(static_cast<size_t>(block), value);
  std::vector<float> f(vals.begin(), vals.end());
  std::vector<int64_t> iv(static_cast<size_t>(block), static_cast<int64_t>(value));
  char* d = static_cast<char*>(dst.raw_data());
  const size_t es = dtype_size(dst.dtype());
  if (dst.dtype() == DType::i32 || dst.dtype() == DType::i64)
    convert(iv.data(), DType::i64, d, dst.dtype(), static_cast<size_t>(block));
  else
    convert(f.data(), DType::f32, d, dst.dtype(), static_cast<size_t>(block));
  for (int64_t off = block; off < n; off += block)
    std::memcpy(d + off * es, d, static_cast<size_t>(std::min(block, n - off)) * es);
}

}  // namespace ds

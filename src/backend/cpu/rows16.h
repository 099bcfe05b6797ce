#pragma once
// 16-bit tensors through the CPU's fp32 kernels, a block of rows at a time. Internal header.
//
// A kernel sees a contiguous float tensor as (rows, C). RowReader hands it a block of rows as fp32:
// the tensor's own memory when it is fp32, otherwise the rows widened into a per-thread scratch
// (bf16: a 16-bit shift; fp16: F16C), small enough to stay in L1 for the kernel's passes.
// RowWriter hands out fp32 rows to write: the tensor itself when fp32, otherwise scratch narrowed
// into the tensor by commit() with round to nearest even. Both go through ds::convert, the
// conversion Tensor::to uses, so a 16-bit result equals the old path's (widen the whole tensor,
// run the fp32 kernel, narrow the whole result) bit for bit whenever the kernel runs the same row
// helper on the same rows - which is what these classes are for: the fp32 path and the 16-bit path
// share one loop, and the math stays in fp32 registers with fp32 accumulation either way.
//
// Readers and writers own their scratch: make them inside the parallel region, one per thread.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "ds/core/dtype.h"
#include "ds/core/error.h"
#include "ds/core/tensor.h"

namespace ds::backend {

// Floats of scratch per operand and block: 8 KB, so that a kernel's three or four operands fit in
// L1 together.
constexpr int64_t kRowBlockFloats = 2048;

// Rows per block for rows of C values (at least one row: a longer row is one block).
inline int64_t rows_per_block(int64_t C) {
  return std::max<int64_t>(1, kRowBlockFloats / std::max<int64_t>(C, 1));
}

// A contiguous float tensor of any float dtype, read or written as (rows, C).
struct Rows {
  char* base = nullptr;
  DType dtype = DType::f32;
  int64_t C = 0;

  Rows() = default;
  Rows(const Tensor& t, int64_t cols) : C(cols) {
    if (!t.defined()) return;
    base = static_cast<char*>(t.raw_data());
    dtype = t.dtype();
  }
  bool f32() const { return dtype == DType::f32; }
  char* at(int64_t r) const { return base + r * C * static_cast<int64_t>(dtype_size(dtype)); }
};

// Contiguous and of a float dtype: what Rows needs. `op` names the kernel in the error.
inline void require_float_rows(const Tensor& t, const char* op) {
  DS_CHECK(is_floating(t.dtype()) && t.is_contiguous(),
           "[cpu:{}] kernel takes contiguous fp32, bf16 or fp16, got {}{}", op,
           dtype_name(t.dtype()), t.is_contiguous() ? "" : " (strided)");
}

class RowReader {
 public:
  // max_rows: the most rows one read() asks for.
  RowReader(const Rows& rows, int64_t max_rows) : rows_(rows) {
    if (!rows_.f32() && rows_.base) buf_.resize(static_cast<size_t>(max_rows * rows_.C));
  }
  // Rows [r0, r0 + n) as fp32 (valid until the next read).
  const float* read(int64_t r0, int64_t n) {
    if (rows_.f32()) return reinterpret_cast<const float*>(rows_.at(r0));
    convert(rows_.at(r0), rows_.dtype, buf_.data(), DType::f32, static_cast<size_t>(n * rows_.C));
    return buf_.data();
  }

 private:
  Rows rows_;
  std::vector<float> buf_;
};

class RowWriter {
 public:
  RowWriter(const Rows& rows, int64_t max_rows) : rows_(rows) {
    if (!rows_.f32() && rows_.base) buf_.resize(static_cast<size_t>(max_rows * rows_.C));
  }
  // Where to write rows [r0, r0 + n) in fp32; commit() stores them.
  float* rows(int64_t r0, int64_t n) {
    r0_ = r0;
    n_ = n;
    return rows_.f32() ? reinterpret_cast<float*>(rows_.at(r0)) : buf_.data();
  }
  void commit() const {
    if (!rows_.f32())
      convert(buf_.data(), DType::f32, rows_.at(r0_), rows_.dtype, static_cast<size_t>(n_ * rows_.C));
  }

 private:
  Rows rows_;
  std::vector<float> buf_;
  int64_t r0_ = 0, n_ = 0;
};

// A small vector (a norm's weight, C values) as fp32: the tensor's memory, or a widened copy.
class Floats {
 public:
  explicit Floats(const Tensor& t) {
    if (!t.defined()) return;
    if (t.dtype() == DType::f32) {
      p_ = t.data<float>();
      return;
    }
    buf_.resize(static_cast<size_t>(t.numel()));
    convert(t.raw_data(), t.dtype(), buf_.data(), DType::f32, buf_.size());
    p_ = buf_.data();
  }
  const float* get() const { return p_; }

 private:
  const float* p_ = nullptr;
  std::vector<float> buf_;
};

}  // namespace ds::backend

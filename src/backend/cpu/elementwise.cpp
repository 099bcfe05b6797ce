// CPU kernels: copies, fills, elementwise arithmetic with broadcasting, reductions.
//
// unary, binary, gelu_erf and swiglu take fp32, bf16 or fp16 operands (each its own dtype): 16-bit
// operands go through fp32 scratch a chunk of 2048 elements at a time (rows16.h), widened on the
// way in and narrowed (round to nearest even) on the way out, so the math is the fp32 kernel's and
// no whole-tensor fp32 copy is made. reduce and max_backward are fp32 only.
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/fast_math.h"
#include "backend/cpu/rows16.h"
#include "ds/core/error.h"
#include "ds/core/host_memory.h"
#include "ds/core/parallel.h"
#include "ds/core/strided.h"

namespace ds::backend {
namespace {

constexpr int64_t kGrain = 1 << 14;  // elements per thread below which threading costs more

void require_f32(const Tensor& t, const char* op) {
  DS_CHECK(t.dtype() == DType::f32, "[cpu:{}] kernel takes fp32, got {}", op,
           dtype_name(t.dtype()));
}

template <class F>
inline void binary_row(F f, const float* a, int64_t sa, const float* b, int64_t sb, float* o,
                       int64_t n) {
  if (sa == 1 && sb == 1) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) o[i] = f(a[i], b[i]);
  } else if (sa == 1 && sb == 0) {
    const float bv = b[0];
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) o[i] = f(a[i], bv);
  } else if (sa == 0 && sb == 1) {
    const float av = a[0];
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) o[i] = f(av, b[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) o[i] = f(a[i * sa], b[i * sb]);
  }
}

// One operand's row segment [off, off + m * stride) as fp32: its own memory when it is fp32 (stride
// kept), otherwise widened into buf, contiguous (stride 1) or one broadcast value (stride 0).
inline const float* widen_segment(const char* base, DType dt, int64_t off, int64_t stride,
                                  int64_t m, float* buf, int64_t* stride_out) {
  if (dt == DType::f32) {
    *stride_out = stride;
    return reinterpret_cast<const float*>(base) + off;
  }
  const int64_t es = static_cast<int64_t>(dtype_size(dt));
  *stride_out = stride == 0 ? 0 : 1;
  if (stride == 0 || stride == 1) {
    convert(base + off * es, dt, buf, DType::f32, static_cast<size_t>(stride == 0 ? 1 : m));
  } else {
    for (int64_t j = 0; j < m; ++j)
      convert(base + (off + j * stride) * es, dt, buf + j, DType::f32, 1);
  }
  return buf;
}

template <class F>
void run_binary(F f, const Tensor& a, const Tensor& b, const Tensor& out) {
  const Shape& shape = out.shape();
  const int64_t n = out.numel();
  if (n == 0) return;
  const int64_t cols = shape.empty() ? 1 : shape.back();
  const int64_t rows = n / cols;
  const int64_t la = shape.empty() ? 0 : a.strides().back();
  const int64_t lb = shape.empty() ? 0 : b.strides().back();
  const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(cols, 1));
  if (a.dtype() == DType::f32 && b.dtype() == DType::f32 && out.dtype() == DType::f32) {
    const float* pa = a.data<float>();
    const float* pb = b.data<float>();
    float* po = out.data<float>();
    parallel_for(rows, grain, [&](int64_t r0, int64_t r1) {
      for_each_row(shape, a.strides(), b.strides(), r0, r1, [&](int64_t r, int64_t oa, int64_t ob) {
        binary_row(f, pa + oa, la, pb + ob, lb, po + r * cols, cols);
      });
    });
    return;
  }
  // 16-bit operands: each row in segments of kRowBlockFloats through fp32 scratch.
  const char* pa = static_cast<const char*>(a.raw_data());
  const char* pb = static_cast<const char*>(b.raw_data());
  const Rows outr(out, 1);  // out is contiguous: element i is "row" i
  parallel_for(rows, grain, [&](int64_t r0, int64_t r1) {
    std::vector<float> fa(static_cast<size_t>(kRowBlockFloats)), fb(fa.size());
    RowWriter wr(outr, kRowBlockFloats);
    for_each_row(shape, a.strides(), b.strides(), r0, r1, [&](int64_t r, int64_t oa, int64_t ob) {
      for (int64_t c0 = 0; c0 < cols; c0 += kRowBlockFloats) {
        const int64_t m = std::min(kRowBlockFloats, cols - c0);
        int64_t sa = 0, sb = 0;
        const float* xa = widen_segment(pa, a.dtype(), oa + c0 * la, la, m, fa.data(), &sa);
        const float* xb = widen_segment(pb, b.dtype(), ob + c0 * lb, lb, m, fb.data(), &sb);
        binary_row(f, xa, sa, xb, sb, wr.rows(r * cols + c0, m), m);
        wr.commit();
      }
    });
  });
}

template <class F>
void unary_chunk(F f, const float* __restrict x, float* __restrict o, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) o[i] = f(x[i]);
}

// Elementwise over n elements of contiguous operands of any float dtype: fn(in0, in1, in2, out0,
// out1, m) on fp32 chunks of m <= kRowBlockFloats elements (null for an undefined operand). The
// chunks of a thread are consecutive pieces of its parallel_for range, so a vector loop's tail
// falls where an fp32 kernel over the same range has it.
template <class F>
void run_elementwise(int64_t n, std::initializer_list<const Tensor*> ins,
                     std::initializer_list<const Tensor*> outs, F fn) {
  std::array<Rows, 3> ri;
  std::array<Rows, 2> ro;
  size_t j = 0;
  for (const Tensor* t : ins) ri[j++] = t && t->defined() ? Rows(*t, 1) : Rows();
  j = 0;
  for (const Tensor* t : outs) ro[j++] = t && t->defined() ? Rows(*t, 1) : Rows();
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    const int64_t blk = std::min(kRowBlockFloats, e - b);
    RowReader r0(ri[0], blk), r1(ri[1], blk), r2(ri[2], blk);
    RowWriter w0(ro[0], blk), w1(ro[1], blk);
    for (int64_t i = b; i < e; i += kRowBlockFloats) {
      const int64_t m = std::min(kRowBlockFloats, e - i);
      const float* x0 = ri[0].base ? r0.read(i, m) : nullptr;
      const float* x1 = ri[1].base ? r1.read(i, m) : nullptr;
      const float* x2 = ri[2].base ? r2.read(i, m) : nullptr;
      float* y0 = ro[0].base ? w0.rows(i, m) : nullptr;
      float* y1 = ro[1].base ? w1.rows(i, m) : nullptr;
      fn(x0, x1, x2, y0, y1, m);
      if (y0) w0.commit();
      if (y1) w1.commit();
    }
  });
}

template <class F>
void run_unary(F f, const Tensor& x, const Tensor& out) {
  const int64_t n = x.numel();
  if (x.dtype() == DType::f32 && out.dtype() == DType::f32) {
    const float* px = x.data<float>();
    float* po = out.data<float>();
    parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
#pragma omp simd
      for (int64_t i = b; i < e; ++i) po[i] = f(px[i]);
    });
    return;
  }
  run_elementwise(n, {&x}, {&out}, [&](const float* px, const float*, const float*, float* po,
                                       float*, int64_t m) { unary_chunk(f, px, po, m); });
}

// The fused SwiGLU passes, one chunk (each the value of the unfused kernels' sequence of fp32
// operations, so equal to it bit for bit).
void swiglu_chunk(const float* __restrict g, const float* __restrict u, float* __restrict o,
                  int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) o[i] = fm::silu(g[i]) * u[i];
}

void swiglu_dgate_chunk(const float* __restrict dy, const float* __restrict g,
                        const float* __restrict u, float* __restrict d, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) d[i] = (dy[i] * u[i]) * fm::silu_grad(g[i]);
}

void swiglu_dup_chunk(const float* __restrict dy, const float* __restrict g, float* __restrict d,
                      int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) d[i] = dy[i] * fm::silu(g[i]);
}

void gelu_erf_chunk(const float* __restrict x, float* __restrict o, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) o[i] = fm::gelu_erf(x[i]);
}

void gelu_erf_grad_chunk(const float* __restrict g, const float* __restrict x,
                         float* __restrict d, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) d[i] = g[i] * fm::gelu_erf_grad(x[i]);
}

void require_same_size(std::initializer_list<const Tensor*> ts, int64_t n, const char* op) {
  for (const Tensor* t : ts) {
    if (!t->defined()) continue;
    require_float_rows(*t, op);
    DS_CHECK(t->numel() == n, "[cpu:{}] operands of {} and {} elements", op, t->numel(), n);
  }
}

}  // namespace

void CpuBackend::gelu_erf_forward(const Tensor& x, const Tensor& out) {
  require_same_size({&x, &out}, x.numel(), "gelu_erf");
  run_elementwise(x.numel(), {&x}, {&out}, [](const float* px, const float*, const float*,
                                              float* po, float*, int64_t m) {
    gelu_erf_chunk(px, po, m);
  });
}

void CpuBackend::gelu_erf_backward(const Tensor& dy, const Tensor& x, const Tensor& dx) {
  require_same_size({&dy, &x, &dx}, x.numel(), "gelu_erf_backward");
  run_elementwise(x.numel(), {&dy, &x}, {&dx}, [](const float* g, const float* px, const float*,
                                                  float* pd, float*, int64_t m) {
    gelu_erf_grad_chunk(g, px, pd, m);
  });
}

void CpuBackend::swiglu_forward(const Tensor& gate, const Tensor& up, const Tensor& out) {
  require_same_size({&gate, &up, &out}, gate.numel(), "swiglu");
  run_elementwise(gate.numel(), {&gate, &up}, {&out}, [](const float* g, const float* u,
                                                         const float*, float* o, float*,
                                                         int64_t m) { swiglu_chunk(g, u, o, m); });
}

void CpuBackend::swiglu_backward(const Tensor& dy, const Tensor& gate, const Tensor& up,
                                 const Tensor& dgate, const Tensor& dup) {
  require_same_size({&dy, &gate, &up, &dgate, &dup}, gate.numel(), "swiglu_backward");
  run_elementwise(gate.numel(), {&dy, &gate, &up}, {&dgate, &dup},
                  [](const float* g, const float* x, const float* u, float* dg, float* du,
                     int64_t m) {
                    if (dg) swiglu_dgate_chunk(g, x, u, dg, m);
                    if (du) swiglu_dup_chunk(g, x, du, m);
                  });
}

namespace {
// The kernels that take 16-bit operands directly (nothing for the ops layer to widen first).
bool takes_16bit(const std::string& op) {
  // clang-format off
  static const char* const kOps[] = {
      "unary",           "binary",           "gelu_erf_forward",   "gelu_erf_backward",
      "swiglu_forward",  "swiglu_backward",  "layer_norm_forward", "layer_norm_backward",
      "rms_norm_forward", "rms_norm_backward", "softmax_forward",  "softmax_backward",
      "attention_forward", "attention_backward", "rope",
      "embedding_forward", "embedding_backward", "cross_entropy_forward",
      "cross_entropy_backward", "reduce"};
  // clang-format on
  for (const char* k : kOps)
    if (op == k) return true;
  return false;
}
}  // namespace

bool CpuBackend::supports(const std::string& op, DType dtype) const {
  if (op == "copy" || op == "fill" || op == "axpy") return true;
  if (op == "adam") return false;  // src/optim's SIMD kernels (see CpuBackend::adam)
  if (op == "gemm" || op == "gemm_out16") return is_floating(dtype);
  if (op == "dropout") return is_floating(dtype);  // masks any float dtype in place
  // These compute in fp32 on 16-bit operands loaded a block at a time (rows16.h).
  if (takes_16bit(op)) return is_floating(dtype);
  // The decode kernels read bf16 weights (linear_rows) and bf16 KV caches (decode_attention) as
  // they are, widening in registers (src/backend/cpu/decode.cpp); fp16 goes through fp32 copies.
  if (op == "linear_rows" || op == "decode_attention")
    return dtype == DType::f32 || dtype == DType::bf16;
  return dtype == DType::f32;  // every other kernel computes in fp32; ops upcast 16-bit inputs
}

void CpuBackend::adam(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const AdamStep&,
                      const Tensor&) {
  DS_THROW("[cpu:adam] the CPU's Adam is optim::adam_update (src/optim, SIMD and multi-threaded); "
           "the backend kernel is for device memory");
}

void CpuBackend::copy(const Tensor& src, const Tensor& dst) {
  host_copy(src, dst);
}

void CpuBackend::fill(const Tensor& dst, double value) {
  host_fill(dst, value);
}

double CpuBackend::sum_of_squares(const Tensor& x) {
  DS_CHECK(is_floating(x.dtype()) && x.is_contiguous(),
           "[cpu:sum_of_squares] needs a contiguous floating tensor, got {} {}",
           dtype_name(x.dtype()), shape_str(x.shape()));
  const int64_t n = x.numel();
  // 16-bit values widen exactly, so the sum equals that of their fp32 copy.
  const bool f32 = x.dtype() == DType::f32, bf16 = x.dtype() == DType::bf16;
  const float* g = f32 ? x.data<float>() : nullptr;
  const uint16_t* h = f32 ? nullptr : x.data<uint16_t>();
  auto value = [&](int64_t i) -> double { return bf16 ? bf16_to_float(h[i]) : f16_to_float(h[i]); };
  constexpr int64_t kTile = 1 << 16;
  const int64_t tiles = (n + kTile - 1) / kTile;
  std::vector<double> partial(static_cast<size_t>(tiles), 0.0);
  parallel_for(tiles, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      double acc = 0.0;
      const int64_t end = std::min(n, (t + 1) * kTile);
      if (f32) {
        // Eight independent partial sums (one dependent add per element would not vectorise),
        // added in a fixed order: the same result on every run.
        double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int64_t i = t * kTile;
        for (; i + 8 <= end; i += 8)
          for (int j = 0; j < 8; ++j) lane[j] += static_cast<double>(g[i + j]) * g[i + j];
        for (; i < end; ++i) lane[0] += static_cast<double>(g[i]) * g[i];
        acc = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
      } else {
        for (int64_t i = t * kTile; i < end; ++i) {
          const double v = value(i);
          acc += v * v;
        }
      }
      partial[static_cast<size_t>(t)] = acc;
    }
  });
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

void CpuBackend::axpy(const Tensor& y, const Tensor& x, float alpha) {
  DS_CHECK(y.numel() == x.numel() && y.is_contiguous() && x.is_contiguous(),
           "[cpu:axpy] needs contiguous tensors of equal size ({} vs {})", y.numel(), x.numel());
  const int64_t n = y.numel();
  if (y.dtype() == DType::f32 && x.dtype() == DType::f32) {
    float* py = y.data<float>();
    const float* px = x.data<float>();
    parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
#pragma omp simd
      for (int64_t i = b; i < e; ++i) py[i] += alpha * px[i];
    });
    return;
  }
  // Mixed or 16-bit: convert chunks to fp32, add, convert back.
  char* py = static_cast<char*>(y.raw_data());
  const char* px = static_cast<const char*>(x.raw_data());
  const size_t ys = dtype_size(y.dtype()), xs = dtype_size(x.dtype());
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    constexpr int64_t kChunk = 2048;
    float fy[kChunk], fx[kChunk];
    for (int64_t i = b; i < e; i += kChunk) {
      const int64_t m = std::min(kChunk, e - i);
      convert(py + i * ys, y.dtype(), fy, DType::f32, static_cast<size_t>(m));
      convert(px + i * xs, x.dtype(), fx, DType::f32, static_cast<size_t>(m));
      for (int64_t j = 0; j < m; ++j) fy[j] += alpha * fx[j];
      convert(fy, DType::f32, py + i * ys, y.dtype(), static_cast<size_t>(m));
    }
  });
}

void CpuBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  for (const Tensor* t : {&a, &b, &out})
    DS_CHECK(is_floating(t->dtype()), "[cpu:binary] kernel takes fp32, bf16 or fp16, got {}",
             dtype_name(t->dtype()));
  switch (op) {
    case BinaryOp::add:
      return run_binary([](float x, float y) { return x + y; }, a, b, out);
    case BinaryOp::sub:
      return run_binary([](float x, float y) { return x - y; }, a, b, out);
    case BinaryOp::mul:
      return run_binary([](float x, float y) { return x * y; }, a, b, out);
    case BinaryOp::div:
      return run_binary([](float x, float y) { return x / y; }, a, b, out);
    case BinaryOp::gelu_backward:
      return run_binary([](float g, float x) { return g * fm::gelu_grad(x); }, a, b, out);
    case BinaryOp::silu_backward:
      return run_binary([](float g, float x) { return g * fm::silu_grad(x); }, a, b, out);
  }
}

void CpuBackend::unary(UnaryOp op, const Tensor& x, const Tensor& out, float s) {
  require_float_rows(x, "unary");
  require_float_rows(out, "unary");
  switch (op) {
    case UnaryOp::neg:
      return run_unary([](float v) { return -v; }, x, out);
    case UnaryOp::exp:
      return run_unary([](float v) { return std::exp(v); }, x, out);
    case UnaryOp::log:
      return run_unary([](float v) { return std::log(v); }, x, out);
    case UnaryOp::sqrt:
      return run_unary([](float v) { return std::sqrt(v); }, x, out);
    case UnaryOp::tanh:
      return run_unary([](float v) { return std::tanh(v); }, x, out);
    case UnaryOp::square:
      return run_unary([](float v) { return v * v; }, x, out);
    case UnaryOp::add_scalar:
      return run_unary([s](float v) { return v + s; }, x, out);
    case UnaryOp::mul_scalar:
      return run_unary([s](float v) { return v * s; }, x, out);
    case UnaryOp::pow_scalar:
      return run_unary([s](float v) { return std::pow(v, s); }, x, out);
    case UnaryOp::gelu:
      return run_unary([](float v) { return fm::gelu(v); }, x, out);
    case UnaryOp::silu:
      return run_unary([](float v) { return fm::silu(v); }, x, out);
  }
}

namespace {

// Element loads of the reduce kernel: fp32 as it is, 16-bit widened (exactly) on the fly.
struct LoadF32 {
  const float* p;
  float operator()(int64_t i) const { return p[i]; }
};
struct LoadBf16 {
  const uint16_t* p;
  float operator()(int64_t i) const { return bf16_to_float(p[i]); }
};
struct LoadF16 {
  const uint16_t* p;
  float operator()(int64_t i) const { return f16_to_float(p[i]); }
};

template <class Load>
void reduce_impl(Load x, bool is_sum, int64_t outer, int64_t red, int64_t inner, float* po) {
  if (inner == 1) {
    // Rows: fixed-order accumulation in double (deterministic and accurate for long rows).
    parallel_for(outer, std::max<int64_t>(1, kGrain / std::max<int64_t>(red, 1)),
                 [&](int64_t b, int64_t e) {
                   for (int64_t o = b; o < e; ++o) {
                     const int64_t row = o * red;
                     if (is_sum) {
                       double acc = 0.0;
                       for (int64_t r = 0; r < red; ++r) acc += x(row + r);
                       po[o] = static_cast<float>(acc);
                     } else {
                       float m = -std::numeric_limits<float>::infinity();
                       for (int64_t r = 0; r < red; ++r) m = std::max(m, x(row + r));
                       po[o] = m;
                     }
                   }
                 });
    return;
  }
  // Columns: each (outer, inner-chunk) accumulates rows in order; parallel over outer * chunks.
  const int64_t chunk = 256;
  const int64_t nchunks = (inner + chunk - 1) / chunk;
  parallel_for(outer * nchunks, 1, [&](int64_t b, int64_t e) {
    std::vector<double> acc(static_cast<size_t>(chunk));
    for (int64_t t = b; t < e; ++t) {
      const int64_t o = t / nchunks, c0 = (t % nchunks) * chunk;
      const int64_t c1 = std::min(inner, c0 + chunk);
      const int64_t base = o * red * inner;
      for (int64_t c = c0; c < c1; ++c)
        acc[static_cast<size_t>(c - c0)] = is_sum ? 0.0 : -std::numeric_limits<double>::infinity();
      for (int64_t r = 0; r < red; ++r) {
        const int64_t row = base + r * inner;
        if (is_sum) {
          for (int64_t c = c0; c < c1; ++c) acc[static_cast<size_t>(c - c0)] += x(row + c);
        } else {
          for (int64_t c = c0; c < c1; ++c)
            acc[static_cast<size_t>(c - c0)] =
                std::max<double>(acc[static_cast<size_t>(c - c0)], x(row + c));
        }
      }
      for (int64_t c = c0; c < c1; ++c)
        po[o * inner + c] = static_cast<float>(acc[static_cast<size_t>(c - c0)]);
    }
  });
}

}  // namespace

// x contiguous of any float dtype (16-bit values widened exactly as they are read: the result is
// that of the fp32 copy), out fp32.
void CpuBackend::reduce(ReduceOp op, const Tensor& x, int64_t outer, int64_t red, int64_t inner,
                        const Tensor& out) {
  DS_CHECK(is_floating(x.dtype()) && x.is_contiguous(),
           "[cpu:reduce] kernel takes contiguous fp32, bf16 or fp16, got {}{}",
           dtype_name(x.dtype()), x.is_contiguous() ? "" : " (strided)");
  require_f32(out, "reduce");
  float* po = out.data<float>();
  const bool is_sum = op == ReduceOp::sum;
  switch (x.dtype()) {
    case DType::bf16:
      return reduce_impl(LoadBf16{static_cast<const uint16_t*>(x.raw_data())}, is_sum, outer, red,
                         inner, po);
    case DType::f16:
      return reduce_impl(LoadF16{static_cast<const uint16_t*>(x.raw_data())}, is_sum, outer, red,
                         inner, po);
    default:
      return reduce_impl(LoadF32{x.data<float>()}, is_sum, outer, red, inner, po);
  }
}

// dx = dy at the first maximum of each (outer, inner) column, 0 elsewhere (torch.max(dim)'s index).
void CpuBackend::max_backward(const Tensor& x, const Tensor& vals, const Tensor& dy, int64_t outer,
                              int64_t red, int64_t inner, const Tensor& dx) {
  for (const Tensor* t : {&x, &vals, &dy, &dx}) require_f32(*t, "max_backward");
  DS_CHECK(x.is_contiguous() && vals.is_contiguous() && dy.is_contiguous() && dx.is_contiguous() &&
               x.numel() == outer * red * inner && dx.numel() == x.numel() &&
               vals.numel() == outer * inner && dy.numel() == outer * inner,
           "[cpu:max_backward] x and dx ({}, {}, {}), vals and dy ({}, {}), contiguous; got x {}, "
           "vals {}, dy {}, dx {}",
           outer, red, inner, outer, inner, shape_str(x.shape()), shape_str(vals.shape()),
           shape_str(dy.shape()), shape_str(dx.shape()));
  const float* px = x.data<float>();
  const float* pv = vals.data<float>();
  const float* pg = dy.data<float>();
  float* po = dx.data<float>();
  parallel_for(outer, std::max<int64_t>(1, kGrain / std::max<int64_t>(red * inner, 1)),
               [&](int64_t b, int64_t e) {
                 for (int64_t o = b; o < e; ++o) {
                   float* out = po + o * red * inner;
                   std::fill(out, out + red * inner, 0.0f);
                   for (int64_t i = 0; i < inner; ++i) {
                     const float m = pv[o * inner + i];
                     for (int64_t r = 0; r < red; ++r) {
                       if (px[(o * red + r) * inner + i] == m) {
                         out[r * inner + i] = pg[o * inner + i];
                         break;
                       }
                     }
                   }
                 }
               });
}

}  // namespace ds::backend

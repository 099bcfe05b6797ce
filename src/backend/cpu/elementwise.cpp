// CPU kernels: copies, fills, elementwise arithmetic with broadcasting, reductions.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/fast_math.h"
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

template <class F>
void run_binary(F f, const Tensor& a, const Tensor& b, const Tensor& out) {
  const Shape& shape = out.shape();
  const int64_t n = out.numel();
  if (n == 0) return;
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* po = out.data<float>();
  const int64_t cols = shape.empty() ? 1 : shape.back();
  const int64_t rows = n / cols;
  const int64_t la = shape.empty() ? 0 : a.strides().back();
  const int64_t lb = shape.empty() ? 0 : b.strides().back();
  parallel_for(rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(cols, 1)),
               [&](int64_t r0, int64_t r1) {
                 for_each_row(shape, a.strides(), b.strides(), r0, r1,
                              [&](int64_t r, int64_t oa, int64_t ob) {
                                binary_row(f, pa + oa, la, pb + ob, lb, po + r * cols, cols);
                              });
               });
}

template <class F>
void run_unary(F f, const float* x, float* o, int64_t n) {
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) o[i] = f(x[i]);
  });
}

}  // namespace

void CpuBackend::gelu_erf_forward(const Tensor& x, const Tensor& out) {
  DS_CHECK(x.dtype() == DType::f32 && out.dtype() == DType::f32 && x.is_contiguous() &&
               out.is_contiguous() && x.numel() == out.numel(),
           "[cpu:gelu_erf] x and out must be contiguous fp32 of one size");
  run_unary([](float v) { return fm::gelu_erf(v); }, x.data<float>(), out.data<float>(),
            x.numel());
}

void CpuBackend::gelu_erf_backward(const Tensor& dy, const Tensor& x, const Tensor& dx) {
  DS_CHECK(dy.dtype() == DType::f32 && x.dtype() == DType::f32 && dx.dtype() == DType::f32 &&
               dy.is_contiguous() && x.is_contiguous() && dx.is_contiguous() &&
               dy.numel() == x.numel() && dx.numel() == x.numel(),
           "[cpu:gelu_erf] dy, x and dx must be contiguous fp32 of one size");
  const float* g = dy.data<float>();
  const float* px = x.data<float>();
  float* pd = dx.data<float>();
  parallel_for(x.numel(), kGrain, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) pd[i] = g[i] * fm::gelu_erf_grad(px[i]);
  });
}

bool CpuBackend::supports(const std::string& op, DType dtype) const {
  if (op == "copy" || op == "fill" || op == "axpy") return true;
  if (op == "adam") return false;  // src/optim's SIMD kernels (see CpuBackend::adam)
  if (op == "gemm") return is_floating(dtype);
  if (op == "dropout") return is_floating(dtype);  // masks any float dtype in place
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
        for (int64_t i = t * kTile; i < end; ++i) acc += static_cast<double>(g[i]) * g[i];
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
  require_f32(a, "binary");
  require_f32(b, "binary");
  require_f32(out, "binary");
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
  require_f32(x, "unary");
  require_f32(out, "unary");
  DS_CHECK(x.is_contiguous() && out.is_contiguous(), "[cpu:unary] needs contiguous tensors");
  const float* px = x.data<float>();
  float* po = out.data<float>();
  const int64_t n = x.numel();
  switch (op) {
    case UnaryOp::neg:
      return run_unary([](float v) { return -v; }, px, po, n);
    case UnaryOp::exp:
      return run_unary([](float v) { return std::exp(v); }, px, po, n);
    case UnaryOp::log:
      return run_unary([](float v) { return std::log(v); }, px, po, n);
    case UnaryOp::sqrt:
      return run_unary([](float v) { return std::sqrt(v); }, px, po, n);
    case UnaryOp::tanh:
      return run_unary([](float v) { return std::tanh(v); }, px, po, n);
    case UnaryOp::square:
      return run_unary([](float v) { return v * v; }, px, po, n);
    case UnaryOp::add_scalar:
      return run_unary([s](float v) { return v + s; }, px, po, n);
    case UnaryOp::mul_scalar:
      return run_unary([s](float v) { return v * s; }, px, po, n);
    case UnaryOp::pow_scalar:
      return run_unary([s](float v) { return std::pow(v, s); }, px, po, n);
    case UnaryOp::gelu:
      return run_unary([](float v) { return fm::gelu(v); }, px, po, n);
    case UnaryOp::silu:
      return run_unary([](float v) { return fm::silu(v); }, px, po, n);
  }
}

void CpuBackend::reduce(ReduceOp op, const Tensor& x, int64_t outer, int64_t red, int64_t inner,
                        const Tensor& out) {
  require_f32(x, "reduce");
  require_f32(out, "reduce");
  const float* px = x.data<float>();
  float* po = out.data<float>();
  const bool is_sum = op == ReduceOp::sum;
  if (inner == 1) {
    // Rows: fixed-order accumulation in double (deterministic and accurate for long rows).
    parallel_for(outer, std::max<int64_t>(1, kGrain / std::max<int64_t>(red, 1)),
                 [&](int64_t b, int64_t e) {
                   for (int64_t o = b; o < e; ++o) {
                     const float* row = px + o * red;
                     if (is_sum) {
                       double acc = 0.0;
                       for (int64_t r = 0; r < red; ++r) acc += row[r];
                       po[o] = static_cast<float>(acc);
                     } else {
                       float m = -std::numeric_limits<float>::infinity();
                       for (int64_t r = 0; r < red; ++r) m = std::max(m, row[r]);
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
      const float* base = px + o * red * inner;
      for (int64_t c = c0; c < c1; ++c)
        acc[static_cast<size_t>(c - c0)] = is_sum ? 0.0 : -std::numeric_limits<double>::infinity();
      for (int64_t r = 0; r < red; ++r) {
        const float* row = base + r * inner;
        if (is_sum) {
          for (int64_t c = c0; c < c1; ++c) acc[static_cast<size_t>(c - c0)] += row[c];
        } else {
          for (int64_t c = c0; c < c1; ++c)
            acc[static_cast<size_t>(c - c0)] =
                std::max<double>(acc[static_cast<size_t>(c - c0)], row[c]);
        }
      }
      for (int64_t c = c0; c < c1; ++c)
        po[o * inner + c] = static_cast<float>(acc[static_cast<size_t>(c - c0)]);
    }
  });
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

// CUDA kernels: strided copies with dtype conversion, fills, axpy, sums of squares, elementwise
// arithmetic with broadcasting, reductions. Launchers are declared in kernels.h.
#include "backend/cuda/common.cuh"

namespace ds::backend::cuda_kernels {
namespace {

constexpr int kThreads = 256;

template <class I>
__global__ void copy_convert_kernel(const void* src, Elem st, View sv, bool src_flat, void* dst,
                                    Elem dt, View dv, bool dst_flat, I n) {
  for (I i = blockIdx.x * static_cast<I>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<I>(gridDim.x) * blockDim.x) {
    const I so = src_flat ? static_cast<I>(sv.offset) + i : view_offset<I>(sv, i);
    const I d_o = dst_flat ? static_cast<I>(dv.offset) + i : view_offset<I>(dv, i);
    if (st == dt && st == Elem::f32) {
      static_cast<float*>(dst)[d_o] = static_cast<const float*>(src)[so];
    } else if (st == dt && (st == Elem::bf16 || st == Elem::f16)) {
      static_cast<uint16_t*>(dst)[d_o] = static_cast<const uint16_t*>(src)[so];
    } else if (st == dt && st == Elem::i32) {
      static_cast<int32_t*>(dst)[d_o] = static_cast<const int32_t*>(src)[so];
    } else if (st == dt && st == Elem::i64) {
      static_cast<int64_t*>(dst)[d_o] = static_cast<const int64_t*>(src)[so];
    } else if (st != Elem::i64 && dt != Elem::i64) {
      store_f(dst, dt, d_o, load_f(src, st, so));
    } else {
      store_elem(dst, dt, d_o, load_elem(src, st, so));
    }
  }
}

bool is_flat(const View& v) {
  int64_t expect = 1;
  for (int d = v.ndim - 1; d >= 0; --d) {
    if (v.shape[d] != 1 && v.strides[d] != expect) return false;
    expect *= v.shape[d];
  }
  return true;
}

// Drops size-1 dims and merges dim d into d-1 where every view steps over the pair as over one
// dim (stride[d-1] == stride[d] * shape[d]): fewer dims, fewer divisions per element. The views
// must have the same shape.
void coalesce(View* const* views, int count) {
  View& a = *views[0];
  int out = 0;
  for (int d = 0; d < a.ndim; ++d) {
    if (a.shape[d] == 1) continue;
    bool merge = out > 0;
    for (int k = 0; k < count && merge; ++k) {
      const View& v = *views[k];
      merge = v.strides[out - 1] == v.strides[d] * v.shape[d];
    }
    for (int k = 0; k < count; ++k) {
      View& v = *views[k];
      if (merge) {
        v.shape[out - 1] *= v.shape[d];
        v.strides[out - 1] = v.strides[d];
      } else {
        v.shape[out] = v.shape[d];
        v.strides[out] = v.strides[d];
      }
    }
    if (!merge) ++out;
  }
  for (int k = 0; k < count; ++k) views[k]->ndim = out;
}

// Whether every element index and offset of these views fits 32-bit unsigned arithmetic.
bool fits32(int64_t n, const View& a, const View& b) {
  constexpr int64_t kLimit = int64_t{1} << 31;
  if (n >= kLimit) return false;
  for (const View* v : {&a, &b}) {
    int64_t span = v->offset;
    for (int d = 0; d < v->ndim; ++d) {
      if (v->strides[d] < 0) return false;
      span += (v->shape[d] - 1) * v->strides[d];
    }
    if (span >= kLimit) return false;
  }
  return true;
}

__global__ void fill_kernel(void* dst, Elem t, int64_t n, double value) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    store_elem(dst, t, i, value);
}

__global__ void axpy_kernel(void* y, Elem yt, const void* x, Elem xt, int64_t n, float alpha) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    store_f(y, yt, i, load_f(y, yt, i) + alpha * load_f(x, xt, i));
}

constexpr int64_t kTile = 1 << 16;

__global__ void sum_of_squares_kernel(const void* x, Elem t, int64_t n, double* partial) {
  __shared__ double shared[32];
  const int64_t t0 = blockIdx.x * kTile, t1 = min(n, t0 + kTile);
  double acc = 0.0;
  for (int64_t i = t0 + threadIdx.x; i < t1; i += blockDim.x) {
    const double v = load_f(x, t, i);
    acc += v * v;
  }
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

template <class I>
__global__ void binary_kernel(int op, const float* a, View va, const float* b, View vb, float* out,
                              I n) {
  for (I i = blockIdx.x * static_cast<I>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<I>(gridDim.x) * blockDim.x) {
    const float x = a[view_offset<I>(va, i)], y = b[view_offset<I>(vb, i)];
    float r;
    switch (op) {
      case 0: r = x + y; break;
      case 1: r = x - y; break;
      case 2: r = x * y; break;
      case 3: r = x / y; break;
      case 4: r = x * gelu_grad_f(y); break;
      default: r = x * silu_grad_f(y); break;
    }
    out[i] = r;
  }
}

// Both inputs contiguous and of out's shape: no index arithmetic.
__global__ void binary_flat_kernel(int op, const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = a[i], y = b[i];
    float r;
    switch (op) {
      case 0: r = x + y; break;
      case 1: r = x - y; break;
      case 2: r = x * y; break;
      case 3: r = x / y; break;
      case 4: r = x * gelu_grad_f(y); break;
      default: r = x * silu_grad_f(y); break;
    }
    out[i] = r;
  }
}

__global__ void unary_kernel(int op, const float* x, float* out, int64_t n, float s) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = x[i];
    float r;
    switch (op) {
      case 0: r = -v; break;
      case 1: r = expf(v); break;
      case 2: r = logf(v); break;
      case 3: r = sqrtf(v); break;
      case 4: r = tanhf(v); break;
      case 5: r = v * v; break;
      case 6: r = v + s; break;
      case 7: r = v * s; break;
      case 8: r = powf(v, s); break;
      case 9: r = gelu_f(v); break;
      default: r = silu_f(v); break;
    }
    out[i] = r;
  }
}

// inner == 1, stage 1: block (k, o) reduces chunk k of row o (a fixed split and a fixed tree)
// into partial[o * chunks + k]; with one chunk it writes out[o] directly.
__global__ void reduce_rows_kernel(bool is_sum, const float* x, int64_t reduced, int64_t chunks,
                                   double* partial, float* out) {
  __shared__ double dshared[32];
  __shared__ float fshared[32];
  const int64_t o = blockIdx.y, k = blockIdx.x;
  const float* row = x + o * reduced;
  const int64_t r0 = reduced * k / chunks, r1 = reduced * (k + 1) / chunks;
  double v;
  if (is_sum) {
    double acc = 0.0;
    for (int64_t r = r0 + threadIdx.x; r < r1; r += blockDim.x) acc += row[r];
    v = block_sum(acc, dshared);
  } else {
    float m = -INFINITY;
    for (int64_t r = r0 + threadIdx.x; r < r1; r += blockDim.x) m = fmaxf(m, row[r]);
    v = block_max(m, fshared);
  }
  if (threadIdx.x != 0) return;
  if (chunks == 1) out[o] = static_cast<float>(v);
  else partial[o * chunks + k] = v;
}

// inner > 1, stage 1: thread (c, k, o) reduces rows of chunk k of column c of slab o, in order.
__global__ void reduce_cols_kernel(bool is_sum, const float* x, int64_t reduced, int64_t inner,
                                   int64_t chunks, double* partial, float* out) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t k = blockIdx.y, o = blockIdx.z;
  if (c >= inner) return;
  const float* base = x + o * reduced * inner + c;
  const int64_t r0 = reduced * k / chunks, r1 = reduced * (k + 1) / chunks;
  double v;
  if (is_sum) {
    double acc = 0.0;
    for (int64_t r = r0; r < r1; ++r) acc += base[r * inner];
    v = acc;
  } else {
    float m = -INFINITY;
    for (int64_t r = r0; r < r1; ++r) m = fmaxf(m, base[r * inner]);
    v = m;
  }
  if (chunks == 1) out[o * inner + c] = static_cast<float>(v);
  else partial[(o * chunks + k) * inner + c] = v;
}

// Many outputs: a thread per output element, rows added in order.
__global__ void reduce_flat_kernel(bool is_sum, const float* x, int64_t outer, int64_t reduced,
                                   int64_t inner, float* out) {
  const int64_t n = outer * inner;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t o = i / inner, c = i % inner;
    const float* base = x + o * reduced * inner + c;
    if (is_sum) {
      double acc = 0.0;
      for (int64_t r = 0; r < reduced; ++r) acc += base[r * inner];
      out[i] = static_cast<float>(acc);
    } else {
      float m = -INFINITY;
      for (int64_t r = 0; r < reduced; ++r) m = fmaxf(m, base[r * inner]);
      out[i] = m;
    }
  }
}

// Stage 2: out[o * inner + c] = the chunks' partials combined in chunk order.
__global__ void reduce_finish_kernel(bool is_sum, const double* partial, int64_t outer,
                                     int64_t chunks, int64_t inner, float* out) {
  const int64_t n = outer * inner;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t o = i / inner, c = i % inner;
    double acc = is_sum ? 0.0 : -INFINITY;
    for (int64_t k = 0; k < chunks; ++k) {
      const double v = partial[(o * chunks + k) * inner + c];
      acc = is_sum ? acc + v : fmax(acc, v);
    }
    out[i] = static_cast<float>(acc);
  }
}

unsigned grid_for(int64_t n) {
  const unsigned b = blocks_for(n, kThreads);
  return b > 65535u * 8u ? 65535u * 8u : b;  // grid-stride loops cover the rest
}

}  // namespace

void copy_convert(const void* src, Elem st, const View& sv_in, void* dst, Elem dt,
                  const View& dv_in, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  View sv = sv_in, dv = dv_in;
  bool same_shape = sv.ndim == dv.ndim;
  for (int d = 0; d < sv.ndim && same_shape; ++d) same_shape = sv.shape[d] == dv.shape[d];
  if (same_shape) {
    View* both[] = {&sv, &dv};
    coalesce(both, 2);
  } else {  // dst is flat (contiguous): each view on its own
    View* one[] = {&sv};
    coalesce(one, 1);
  }
  const bool sflat = is_flat(sv), dflat = is_flat(dv);
  if (fits32(n, sv, dv))
    copy_convert_kernel<uint32_t><<<grid_for(n), kThreads, 0, stream>>>(
        src, st, sv, sflat, dst, dt, dv, dflat, static_cast<uint32_t>(n));
  else
    copy_convert_kernel<int64_t><<<grid_for(n), kThreads, 0, stream>>>(src, st, sv, sflat, dst, dt,
                                                                       dv, dflat, n);
}

void fill(void* dst, Elem t, int64_t n, double value, cudaStream_t stream) {
  if (n == 0) return;
  fill_kernel<<<grid_for(n), kThreads, 0, stream>>>(dst, t, n, value);
}

void axpy(void* y, Elem yt, const void* x, Elem xt, int64_t n, float alpha, cudaStream_t stream) {
  if (n == 0) return;
  axpy_kernel<<<grid_for(n), kThreads, 0, stream>>>(y, yt, x, xt, n, alpha);
}

void sum_of_squares_tiles(const void* x, Elem t, int64_t n, double* partial, cudaStream_t stream) {
  const int64_t tiles = (n + kTile - 1) / kTile;
  if (tiles == 0) return;
  sum_of_squares_kernel<<<static_cast<unsigned>(tiles), 512, 0, stream>>>(x, t, n, partial);
}

void binary(int op, const float* a, const View& va_in, const float* b, const View& vb_in,
            float* out, const View& vout, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  (void)vout;  // out is contiguous
  View va = va_in, vb = vb_in;
  View* both[] = {&va, &vb};
  coalesce(both, 2);
  if (is_flat(va) && is_flat(vb) && va.offset == 0 && vb.offset == 0) {
    binary_flat_kernel<<<grid_for(n), kThreads, 0, stream>>>(op, a, b, out, n);
    return;
  }
  if (fits32(n, va, vb))
    binary_kernel<uint32_t><<<grid_for(n), kThreads, 0, stream>>>(op, a, va, b, vb, out,
                                                                  static_cast<uint32_t>(n));
  else
    binary_kernel<int64_t><<<grid_for(n), kThreads, 0, stream>>>(op, a, va, b, vb, out, n);
}

void unary(int op, const float* x, float* out, int64_t n, float scalar, cudaStream_t stream) {
  if (n == 0) return;
  unary_kernel<<<grid_for(n), kThreads, 0, stream>>>(op, x, out, n, scalar);
}

int64_t reduce_chunks(int64_t outer, int64_t reduced, int64_t inner) {
  constexpr int64_t kMaxY = 65535, kScratch = int64_t{1} << 25;  // doubles (256 MiB)
  if (outer > kMaxY || outer * inner == 0) return 1;
  int64_t chunks;
  if (inner == 1) {
    chunks = reduced / (int64_t{1} << 14);  // ~16K elements a block
    if (chunks > 1024) chunks = 1024;
  } else {
    chunks = reduced / 128;  // ~128 rows a thread
    if (chunks > 64) chunks = 64;
  }
  while (chunks > 1 && outer * chunks * inner > kScratch) chunks /= 2;
  if (chunks > kMaxY) chunks = kMaxY;
  return chunks < 1 ? 1 : chunks;
}

void reduce(bool is_sum, const float* x, int64_t outer, int64_t reduced, int64_t inner, float* out,
            double* scratch, cudaStream_t stream) {
  if (outer * inner == 0) return;
  const int64_t chunks = reduce_chunks(outer, reduced, inner);
  if (outer > 65535) {  // beyond the grid's y/z limits, and parallel enough: a thread per output
    reduce_flat_kernel<<<grid_for(outer * inner), kThreads, 0, stream>>>(is_sum, x, outer, reduced,
                                                                         inner, out);
    return;
  }
  if (inner == 1) {
    reduce_rows_kernel<<<dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(outer)),
                         kThreads, 0, stream>>>(is_sum, x, reduced, chunks, scratch, out);
  } else {
    const dim3 grid(blocks_for(inner, kThreads), static_cast<unsigned>(chunks),
                    static_cast<unsigned>(outer));
    reduce_cols_kernel<<<grid, kThreads, 0, stream>>>(is_sum, x, reduced, inner, chunks, scratch,
                                                      out);
  }
  if (chunks > 1)
    reduce_finish_kernel<<<grid_for(outer * inner), kThreads, 0, stream>>>(is_sum, scratch, outer,
                                                                           chunks, inner, out);
}

}  // namespace ds::backend::cuda_kernels

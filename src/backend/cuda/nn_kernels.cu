// CUDA neural-network kernels over contiguous fp32 rows: layer norm, RMS norm, softmax, rotary
// embedding, embedding gather and scatter, cross-entropy, dropout. A row is one block (or one
// warp for short rows); a row's sums are block trees of fixed shape, so every result is
// deterministic. Sums across rows (the norms' weight gradients) go through kChunks partials whose
// split depends only on the row count, then are added in chunk order, as the CPU backend does.
#include "backend/cuda/common.cuh"

namespace ds::backend::cuda_kernels {
namespace {

constexpr int kRowThreads = 256;
constexpr int64_t kChunks = 64;

int64_t chunks_for(int64_t rows) { return rows < kChunks ? rows : kChunks; }

// ---- layer norm ----

__global__ void ln_forward_kernel(const float* x, const float* w, const float* b, float eps,
                                  int64_t C, float* y, float* mean, float* rstd) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  const float* xr = x + r * C;
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) s += xr[i];
  const float mu = block_sum(s, shared) / static_cast<float>(C);
  float v = 0.0f;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) v += (xr[i] - mu) * (xr[i] - mu);
  const float rs = rsqrtf(block_sum(v, shared) / static_cast<float>(C) + eps);
  float* yr = y + r * C;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x)
    yr[i] = (xr[i] - mu) * rs * w[i] + (b ? b[i] : 0.0f);
  if (threadIdx.x == 0) {
    mean[r] = mu;
    rstd[r] = rs;
  }
}

__global__ void ln_backward_dx_kernel(const float* dy, const float* x, const float* w,
                                      const float* mean, const float* rstd, int64_t C, float* dx) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  const float* g = dy + r * C;
  const float* xr = x + r * C;
  const float mu = mean[r], rs = rstd[r];
  float s1 = 0.0f, s2 = 0.0f;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
    const float gw = g[i] * w[i];
    s1 += gw;
    s2 += gw * (xr[i] - mu) * rs;
  }
  const float m1 = block_sum(s1, shared) / static_cast<float>(C);
  const float m2 = block_sum(s2, shared) / static_cast<float>(C);
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x)
    dx[r * C + i] = rs * (g[i] * w[i] - m1 - (xr[i] - mu) * rs * m2);
}

// part (nchunks, C) [+ (nchunks, C) for db]: chunk k's sum of its rows, rows in order. Grid
// (ceil(C / threads), nchunks).
__global__ void ln_backward_dw_kernel(const float* dy, const float* x, const float* mean,
                                      const float* rstd, int64_t rows, int64_t C, int64_t nchunks,
                                      bool with_db, float* part) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t k = blockIdx.y;
  if (c >= C) return;
  float dw = 0.0f, db = 0.0f;
  for (int64_t r = rows * k / nchunks; r < rows * (k + 1) / nchunks; ++r) {
    const float g = dy[r * C + c];
    dw += g * (x[r * C + c] - mean[r]) * rstd[r];
    db += g;
  }
  part[k * C + c] = dw;
  if (with_db) part[(nchunks + k) * C + c] = db;
}

// out[c] += sum over k of part[k][c], in chunk order.
__global__ void add_partials_kernel(const float* part, int64_t nchunks, int64_t C, float* out) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  float acc = out[c];
  for (int64_t k = 0; k < nchunks; ++k) acc += part[k * C + c];
  out[c] = acc;
}

// ---- RMS norm ----

__global__ void rms_forward_kernel(const float* x, const float* w, float eps, int64_t C, float* y,
                                   float* rstd) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  const float* xr = x + r * C;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) ss += xr[i] * xr[i];
  const float rs = rsqrtf(block_sum(ss, shared) / static_cast<float>(C) + eps);
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) y[r * C + i] = xr[i] * rs * w[i];
  if (threadIdx.x == 0) rstd[r] = rs;
}

__global__ void rms_backward_dx_kernel(const float* dy, const float* x, const float* w,
                                       const float* rstd, int64_t C, float* dx) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  const float* g = dy + r * C;
  const float* xr = x + r * C;
  const float rs = rstd[r];
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) s += g[i] * w[i] * xr[i];
  const float c3 = rs * rs * rs * block_sum(s, shared) / static_cast<float>(C);
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) dx[r * C + i] = rs * g[i] * w[i] - xr[i] * c3;
}

__global__ void rms_backward_dw_kernel(const float* dy, const float* x, const float* rstd,
                                       int64_t rows, int64_t C, int64_t nchunks, float* part) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t k = blockIdx.y;
  if (c >= C) return;
  float dw = 0.0f;
  for (int64_t r = rows * k / nchunks; r < rows * (k + 1) / nchunks; ++r)
    dw += dy[r * C + c] * x[r * C + c] * rstd[r];
  part[k * C + c] = dw;
}

// ---- softmax ----

__global__ void softmax_forward_kernel(const float* x, int64_t C, float* y) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  const float* xr = x + r * C;
  float* yr = y + r * C;
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) m = fmaxf(m, xr[i]);
  m = block_max(m, shared);
  if (m == -INFINITY) {  // a fully masked row: zeros rather than NaN, as on the CPU
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x) yr[i] = 0.0f;
    return;
  }
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) s += expf(xr[i] - m);
  const float inv = 1.0f / block_sum(s, shared);
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) yr[i] = expf(xr[i] - m) * inv;
}

__global__ void softmax_backward_kernel(const float* y, const float* dy, int64_t C, float* dx) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  const float* yr = y + r * C;
  const float* g = dy + r * C;
  float dot = 0.0f;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) dot += yr[i] * g[i];
  dot = block_sum(dot, shared);
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) dx[r * C + i] = yr[i] * (g[i] - dot);
}

// ---- rotary embedding: a thread per (row, pair); the copied tail by the pair threads too ----

__global__ void rope_kernel(const float* x, const float* cos_t, const float* sin_t, int64_t rows,
                            int64_t T, int64_t half, int64_t hd, bool interleaved, float* out) {
  const int64_t per_row = hd - half;  // half pairs + (hd - 2 half) copied elements
  const int64_t n = rows * per_row;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / per_row, i = idx % per_row;
    const float* xr = x + r * hd;
    float* orow = out + r * hd;
    if (i >= half) {  // the unrotated tail
      const int64_t d = 2 * half + (i - half);
      orow[d] = xr[d];
      continue;
    }
    const int64_t t = r % T;
    const float c = cos_t[t * half + i], s = sin_t[t * half + i];
    const int64_t ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + half;
    const float a = xr[ia], b = xr[ib];
    orow[ia] = a * c - b * s;
    orow[ib] = b * c + a * s;
  }
}

// ---- embedding ----

__global__ void embedding_forward_kernel(const float* weight, const void* ids, bool ids64,
                                         int64_t N, int64_t C, float* out) {
  const int64_t n = blockIdx.x;
  const int64_t id = ids64 ? static_cast<const int64_t*>(ids)[n] : static_cast<const int32_t*>(ids)[n];
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) out[n * C + c] = weight[id * C + c];
}

__global__ void embedding_backward_kernel(const float* dout, const int64_t* uniq,
                                          const int64_t* offsets, const int64_t* positions,
                                          int64_t C, float* dweight) {
  const int64_t u = blockIdx.x;
  const int64_t row = uniq[u];
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = dweight[row * C + c];
    for (int64_t p = offsets[u]; p < offsets[u + 1]; ++p) acc += dout[positions[p] * C + c];
    dweight[row * C + c] = acc;
  }
}

// ---- cross-entropy: a block per row, online max and sum over the row ----

__global__ void cross_entropy_forward_kernel(const float* logits, const void* targets,
                                             bool targets64, int64_t V, int64_t ignore_index,
                                             float* losses, float* lse) {
  __shared__ float shared[32];
  const int64_t n = blockIdx.x;
  const float* row = logits + n * V;
  float m = -INFINITY, s = 0.0f;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
    const float v = row[i];
    if (v > m) {
      s = (m == -INFINITY ? 0.0f : s * expf(m - v)) + 1.0f;
      m = v;
    } else if (v != -INFINITY) {
      s += expf(v - m);
    }
  }
  const float bm = block_max(m, shared);
  const float mine = m == -INFINITY ? 0.0f : s * expf(m - bm);
  const float total = block_sum(mine, shared);
  if (threadIdx.x == 0) {
    const float l = bm + logf(total);
    const int64_t t = targets64 ? static_cast<const int64_t*>(targets)[n]
                                : static_cast<const int32_t*>(targets)[n];
    lse[n] = l;
    losses[n] = t == ignore_index ? 0.0f : l - row[t];
  }
}

__global__ void cross_entropy_backward_kernel(const float* logits, const void* targets,
                                              bool targets64, int64_t V, int64_t ignore_index,
                                              const float* lse, float scale, float* dlogits) {
  const int64_t n = blockIdx.y;
  const int64_t t = targets64 ? static_cast<const int64_t*>(targets)[n]
                              : static_cast<const int32_t*>(targets)[n];
  const bool ignored = t == ignore_index;
  const float l = lse[n];
  const float* row = logits + n * V;
  float* d = dlogits + n * V;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < V;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    d[i] = ignored ? 0.0f : expf(row[i] - l) * scale - (i == t ? scale : 0.0f);
}

// ---- dropout ----

__global__ void dropout_kernel(const void* x, Elem xt, void* out, Elem ot, int64_t n,
                               uint64_t threshold, float keep_scale, uint64_t seed,
                               uint64_t stream_id, uint64_t base) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const bool keep = (hash3(seed, stream_id, base + static_cast<uint64_t>(i)) >> 40) >= threshold;
    store_f(out, ot, i, keep ? load_f(x, xt, i) * keep_scale : 0.0f);
  }
}

unsigned grid_for(int64_t n, int threads) {
  const unsigned b = blocks_for(n, threads);
  return b > 65535u * 8u ? 65535u * 8u : b;
}

// Row kernels use a block per row; rows beyond the grid's x limit are split into launches.
template <class Launch>
void for_row_batches(int64_t rows, Launch launch) {
  constexpr int64_t kMaxGrid = (1LL << 31) - 1;
  for (int64_t r0 = 0; r0 < rows; r0 += kMaxGrid) {
    const int64_t n = rows - r0 < kMaxGrid ? rows - r0 : kMaxGrid;
    launch(r0, static_cast<unsigned>(n));
  }
}

int row_threads(int64_t C) {
  // One warp for short rows, up to kRowThreads for long ones.
  int t = kWarp;
  while (t < kRowThreads && t * 4 < C) t *= 2;
  return t;
}

}  // namespace

void layer_norm_forward(const float* x, const float* w, const float* b, float eps, int64_t rows,
                        int64_t C, float* y, float* mean, float* rstd, cudaStream_t stream) {
  for_row_batches(rows, [&](int64_t r0, unsigned n) {
    ln_forward_kernel<<<n, row_threads(C), 0, stream>>>(x + r0 * C, w, b, eps, C, y + r0 * C,
                                                        mean + r0, rstd + r0);
  });
}

void layer_norm_backward(const float* dy, const float* x, const float* w, const float* mean,
                         const float* rstd, int64_t rows, int64_t C, float* dx, float* dw,
                         float* db, float* scratch, cudaStream_t stream) {
  if (rows == 0) return;
  for_row_batches(rows, [&](int64_t r0, unsigned n) {
    ln_backward_dx_kernel<<<n, row_threads(C), 0, stream>>>(dy + r0 * C, x + r0 * C, w, mean + r0,
                                                            rstd + r0, C, dx + r0 * C);
  });
  const int64_t nchunks = chunks_for(rows);
  const dim3 grid(blocks_for(C, 128), static_cast<unsigned>(nchunks));
  ln_backward_dw_kernel<<<grid, 128, 0, stream>>>(dy, x, mean, rstd, rows, C, nchunks,
                                                  db != nullptr, scratch);
  add_partials_kernel<<<blocks_for(C, 128), 128, 0, stream>>>(scratch, nchunks, C, dw);
  if (db)
    add_partials_kernel<<<blocks_for(C, 128), 128, 0, stream>>>(scratch + nchunks * C, nchunks,
                                                                 C, db);
}

void rms_norm_forward(const float* x, const float* w, float eps, int64_t rows, int64_t C, float* y,
                      float* rstd, cudaStream_t stream) {
  for_row_batches(rows, [&](int64_t r0, unsigned n) {
    rms_forward_kernel<<<n, row_threads(C), 0, stream>>>(x + r0 * C, w, eps, C, y + r0 * C,
                                                         rstd + r0);
  });
}

void rms_norm_backward(const float* dy, const float* x, const float* w, const float* rstd,
                       int64_t rows, int64_t C, float* dx, float* dw, float* scratch,
                       cudaStream_t stream) {
  if (rows == 0) return;
  for_row_batches(rows, [&](int64_t r0, unsigned n) {
    rms_backward_dx_kernel<<<n, row_threads(C), 0, stream>>>(dy + r0 * C, x + r0 * C, w,
                                                             rstd + r0, C, dx + r0 * C);
  });
  const int64_t nchunks = chunks_for(rows);
  const dim3 grid(blocks_for(C, 128), static_cast<unsigned>(nchunks));
  rms_backward_dw_kernel<<<grid, 128, 0, stream>>>(dy, x, rstd, rows, C, nchunks, scratch);
  add_partials_kernel<<<blocks_for(C, 128), 128, 0, stream>>>(scratch, nchunks, C, dw);
}

void softmax_forward(const float* x, int64_t rows, int64_t C, float* y, cudaStream_t stream) {
  for_row_batches(rows, [&](int64_t r0, unsigned n) {
    softmax_forward_kernel<<<n, row_threads(C), 0, stream>>>(x + r0 * C, C, y + r0 * C);
  });
}

void softmax_backward(const float* y, const float* dy, int64_t rows, int64_t C, float* dx,
                      cudaStream_t stream) {
  for_row_batches(rows, [&](int64_t r0, unsigned n) {
    softmax_backward_kernel<<<n, row_threads(C), 0, stream>>>(y + r0 * C, dy + r0 * C, C,
                                                              dx + r0 * C);
  });
}

void rope(const float* x, const float* cos_t, const float* sin_t, int64_t rows, int64_t T,
          int64_t half, int64_t hd, bool interleaved, float* out, cudaStream_t stream) {
  const int64_t n = rows * (hd - half);
  if (n == 0) return;
  rope_kernel<<<grid_for(n, 256), 256, 0, stream>>>(x, cos_t, sin_t, rows, T, half, hd,
                                                    interleaved, out);
}

void embedding_forward(const float* weight, const void* ids, bool ids64, int64_t N, int64_t C,
                       float* out, cudaStream_t stream) {
  if (N == 0) return;
  for_row_batches(N, [&](int64_t n0, unsigned n) {
    const void* id0 = ids64 ? static_cast<const void*>(static_cast<const int64_t*>(ids) + n0)
                            : static_cast<const void*>(static_cast<const int32_t*>(ids) + n0);
    embedding_forward_kernel<<<n, row_threads(C), 0, stream>>>(weight, id0, ids64, n, C,
                                                               out + n0 * C);
  });
}

void embedding_backward(const float* dout, const int64_t* uniq, const int64_t* offsets,
                        const int64_t* positions, int64_t n_uniq, int64_t C, float* dweight,
                        cudaStream_t stream) {
  if (n_uniq == 0) return;
  for_row_batches(n_uniq, [&](int64_t u0, unsigned n) {
    embedding_backward_kernel<<<n, row_threads(C), 0, stream>>>(dout, uniq + u0, offsets + u0,
                                                                positions, C, dweight);
  });
}

void cross_entropy_forward(const float* logits, const void* targets, bool targets64, int64_t N,
                           int64_t V, int64_t ignore_index, float* losses, float* lse,
                           cudaStream_t stream) {
  if (N == 0) return;
  for_row_batches(N, [&](int64_t n0, unsigned n) {
    const void* t0 = targets64 ? static_cast<const void*>(static_cast<const int64_t*>(targets) + n0)
                               : static_cast<const void*>(static_cast<const int32_t*>(targets) + n0);
    cross_entropy_forward_kernel<<<n, 512, 0, stream>>>(logits + n0 * V, t0, targets64, V,
                                                        ignore_index, losses + n0, lse + n0);
  });
}

void cross_entropy_backward(const float* logits, const void* targets, bool targets64, int64_t N,
                            int64_t V, int64_t ignore_index, const float* lse, float scale,
                            float* dlogits, cudaStream_t stream) {
  if (N == 0) return;
  constexpr int64_t kMaxY = 65535;
  for (int64_t n0 = 0; n0 < N; n0 += kMaxY) {
    const int64_t n = N - n0 < kMaxY ? N - n0 : kMaxY;
    const void* t0 = targets64 ? static_cast<const void*>(static_cast<const int64_t*>(targets) + n0)
                               : static_cast<const void*>(static_cast<const int32_t*>(targets) + n0);
    const unsigned gx = blocks_for(V, 512) > 32 ? 32 : blocks_for(V, 512);
    const dim3 grid(gx, static_cast<unsigned>(n));
    cross_entropy_backward_kernel<<<grid, 512, 0, stream>>>(logits + n0 * V, t0, targets64, V,
                                                           ignore_index, lse + n0, scale,
                                                           dlogits + n0 * V);
  }
}

void dropout(const void* x, Elem xt, void* out, Elem ot, int64_t n, uint64_t threshold,
             float keep_scale, uint64_t seed, uint64_t stream_id, uint64_t base,
             cudaStream_t stream) {
  if (n == 0) return;
  dropout_kernel<<<grid_for(n, 256), 256, 0, stream>>>(x, xt, out, ot, n, threshold, keep_scale,
                                                       seed, stream_id, base);
}

}  // namespace ds::backend::cuda_kernels

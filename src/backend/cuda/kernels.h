#pragma once
// The CUDA kernels' launchers: plain functions over device pointers, compiled by nvcc (*.cu) and
// called from the backend (cuda_backend.cpp), which validates shapes, dtypes and ids first. Keeping
// this header free of the library's headers keeps nvcc away from fmt and nlohmann-json.
//
// Every launcher enqueues on `stream` and returns at once; none synchronises and none throws (the
// backend checks cudaGetLastError after each launch). Pointers are device memory unless named
// host_*. Row kernels read a contiguous (rows, C) matrix; "deterministic" below means the result
// does not depend on scheduling: every sum is taken in a fixed order or a fixed tree.
#include <cuda_runtime.h>

#include <cstdint>

namespace ds::backend::cuda_kernels {

// Element types, in the order of ds::DType (f32, bf16, f16, i32, i64).
enum class Elem : int { f32 = 0, bf16 = 1, f16 = 2, i32 = 3, i64 = 4 };

constexpr int kMaxDims = 8;

// A strided view of up to kMaxDims dims: element offset of index (i0, .., i_{n-1}) is
// offset + sum(i_d * strides[d]).
struct View {
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
  int64_t offset = 0;
};

// ---- memory (elementwise.cu) ----
// dst[i] = convert(src[i]) for the n elements of src's logical order; dst likewise strided (a
// contiguous View for a contiguous dst). 16-bit narrowing rounds to nearest even.
void copy_convert(const void* src, Elem src_type, const View& src_view, void* dst, Elem dst_type,
                  const View& dst_view, int64_t n, cudaStream_t stream);
void fill(void* dst, Elem type, int64_t n, double value, cudaStream_t stream);
// y[i] += alpha * x[i]; any float types, computed in fp32.
void axpy(void* y, Elem y_type, const void* x, Elem x_type, int64_t n, float alpha,
          cudaStream_t stream);
// partial[t] = sum over tile t (2^16 elements) of x^2 in double, each tile by a fixed tree.
void sum_of_squares_tiles(const void* x, Elem type, int64_t n, double* partial, cudaStream_t stream);

// ---- elementwise (elementwise.cu); fp32 ----
// op codes are ds::backend::BinaryOp / UnaryOp values. a and b are broadcast views of out's shape.
void binary(int op, const float* a, const View& va, const float* b, const View& vb, float* out,
            const View& vout, int64_t n, cudaStream_t stream);
void unary(int op, const float* x, float* out, int64_t n, float scalar, cudaStream_t stream);
// out (outer, inner) = sum / max over the middle dim of x (outer, reduced, inner); sums in double,
// deterministic: long reductions are split into reduce_chunks() chunks fixed by the sizes alone,
// whose partials (scratch: outer * chunks * inner doubles) are then combined in order.
int64_t reduce_chunks(int64_t outer, int64_t reduced, int64_t inner);
void reduce(bool is_sum, const float* x, int64_t outer, int64_t reduced, int64_t inner, float* out,
            double* scratch, cudaStream_t stream);

// ---- neural-network rows (nn_kernels.cu); fp32, contiguous ----
void layer_norm_forward(const float* x, const float* w, const float* b, float eps, int64_t rows,
                        int64_t C, float* y, float* mean, float* rstd, cudaStream_t stream);
// dx written; dw (and db unless null) accumulated (+=), deterministic. scratch: 2 * 64 * C floats.
void layer_norm_backward(const float* dy, const float* x, const float* w, const float* mean,
                         const float* rstd, int64_t rows, int64_t C, float* dx, float* dw,
                         float* db, float* scratch, cudaStream_t stream);
void rms_norm_forward(const float* x, const float* w, float eps, int64_t rows, int64_t C, float* y,
                      float* rstd, cudaStream_t stream);
// scratch: 64 * C floats.
void rms_norm_backward(const float* dy, const float* x, const float* w, const float* rstd,
                       int64_t rows, int64_t C, float* dx, float* dw, float* scratch,
                       cudaStream_t stream);
void softmax_forward(const float* x, int64_t rows, int64_t C, float* y, cudaStream_t stream);
void softmax_backward(const float* y, const float* dy, int64_t rows, int64_t C, float* dx,
                      cudaStream_t stream);
// x and out (rows = B*NH*T, hd); cos/sin tables (T, half) already scaled (and negated for inverse).
void rope(const float* x, const float* cos_t, const float* sin_t, int64_t rows, int64_t T,
          int64_t half, int64_t hd, bool interleaved, float* out, cudaStream_t stream);
// ids int32 (ids64 false) or int64; every id already checked to be in [0, V).
void embedding_forward(const float* weight, const void* ids, bool ids64, int64_t N, int64_t C,
                       float* out, cudaStream_t stream);
// dweight[uniq[u]] += sum of dout rows positions[offsets[u] .. offsets[u+1]) in that order: the
// host groups the ids (stable), so repeated ids add in input order, deterministically.
void embedding_backward(const float* dout, const int64_t* uniq, const int64_t* offsets,
                        const int64_t* positions, int64_t n_uniq, int64_t C, float* dweight,
                        cudaStream_t stream);
void cross_entropy_forward(const float* logits, const void* targets, bool targets64, int64_t N,
                           int64_t V, int64_t ignore_index, float* losses, float* lse,
                           cudaStream_t stream);
void cross_entropy_backward(const float* logits, const void* targets, bool targets64, int64_t N,
                            int64_t V, int64_t ignore_index, const float* lse, float scale,
                            float* dlogits, cudaStream_t stream);
// out = x * keep / (1 - p), keep = (hash3(seed, stream_id, base + i) >> 40) >= threshold; the same
// mask as the CPU backend's for the same arguments. Any float types.
void dropout(const void* x, Elem x_type, void* out, Elem out_type, int64_t n, uint64_t threshold,
             float keep_scale, uint64_t seed, uint64_t stream_id, uint64_t base,
             cudaStream_t stream);

// ---- optimizer (optim_kernels.cu) ----
// The Adam step of ds::backend::AdamStep (backend.h), element by element with IEEE-rounded
// intrinsics in the CPU kernel's order: bitwise its result. out16 (Elem bf16 or f16) or null.
struct AdamConsts {
  float grad_scale, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, inv_sqrt_bc2,
      neg_step_size, weight_decay, neg_lr_wd;
  bool l2_decay, decoupled_decay;
};
void adam(float* p, const float* g, float* m, float* v, int64_t n, const AdamConsts& k,
          void* out16, Elem out16_type, cudaStream_t stream);

// ---- attention (attention.cu); fp32, q/out (B, NH, Tq, hd), k/v (B, NH, Tk, hd) ----
// key_lens: B device int64s, or null for every key. Flash-style: scores never stored, each row's
// log-sum-exp kept in lse (B, NH, Tq).
void attention_forward(const float* q, const float* k, const float* v, int64_t B, int64_t NH,
                       int64_t Tq, int64_t Tk, int64_t hd, float scale, bool causal,
                       const int64_t* key_lens, float* out, float* lse, cudaStream_t stream);
// dq, dk, dv written (not accumulated); scratch: B * NH * Tq floats. Deterministic.
void attention_backward(const float* dout, const float* q, const float* k, const float* v,
                        const float* out, const float* lse, int64_t B, int64_t NH, int64_t Tq,
                        int64_t Tk, int64_t hd, float scale, bool causal, const int64_t* key_lens,
                        float* dq, float* dk, float* dv, float* scratch, cudaStream_t stream);
// The largest head size attention supports.
constexpr int64_t kMaxHeadDim = 256;

}  // namespace ds::backend::cuda_kernels

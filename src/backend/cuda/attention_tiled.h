#pragma once
// Tiled flash attention (attention_tiled.cu) for the head sizes it is built for; attention.cu
// dispatches to it when tiled_attention_supports() says so. Same arguments and contract as the
// launchers in kernels.h; delta (B, NH, Tq) = rowsum(dout * out) is computed by the caller.
// Returns the launch's error (cudaSuccess when enqueued).
#include <cuda_runtime.h>

#include <cstdint>

namespace ds::backend::cuda_kernels {

bool tiled_attention_supports(int64_t hd, int64_t B, int64_t NH);
cudaError_t tiled_attention_forward(const float* q, const float* k, const float* v, int64_t B,
                                    int64_t NH, int64_t Tq, int64_t Tk, int64_t hd, float scale,
                                    bool causal, const int64_t* key_lens, float* out, float* lse,
                                    cudaStream_t stream);
cudaError_t tiled_attention_backward(const float* dout, const float* q, const float* k,
                                     const float* v, const float* lse, const float* delta,
                                     int64_t B, int64_t NH, int64_t Tq, int64_t Tk, int64_t hd,
                                     float scale, bool causal, const int64_t* key_lens, float* dq,
                                     float* dk, float* dv, cudaStream_t stream);

}  // namespace ds::backend::cuda_kernels

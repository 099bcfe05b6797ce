// The optimizer's update on the GPU: Adam/AdamW over flat fp32 buffers, one thread per element,
// every operation an IEEE-rounded intrinsic in the order of the CPU kernel (src/optim/
// simd_body.inl), so a GPU step is bitwise the CPU step (nvcc would otherwise contract a*b+c
// differently). Memory-bound: 16 bytes read and 12 written per element (+2 for a 16-bit copy).
#include "backend/cuda/common.cuh"

namespace ds::backend::cuda_kernels {
namespace {

__global__ void adam_kernel(float* p, const float* g, float* m, float* v, int64_t n, AdamConsts k,
                            void* out16, Elem out16_type) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float gi = __fmul_rn(g[i], k.grad_scale);
    float pi = p[i];
    if (k.l2_decay) gi = __fmaf_rn(k.weight_decay, pi, gi);
    const float mi = __fmaf_rn(gi, k.one_minus_beta1, __fmul_rn(m[i], k.beta1));
    const float vi = __fmaf_rn(__fmul_rn(gi, gi), k.one_minus_beta2, __fmul_rn(v[i], k.beta2));
    const float denom = __fmaf_rn(__fsqrt_rn(vi), k.inv_sqrt_bc2, k.eps);
    const float update = __fdiv_rn(mi, denom);
    if (k.decoupled_decay) pi = __fmaf_rn(pi, k.neg_lr_wd, pi);
    pi = __fmaf_rn(update, k.neg_step_size, pi);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if (out16) store_f(out16, out16_type, i, pi);
  }
}

}  // namespace

void adam(float* p, const float* g, float* m, float* v, int64_t n, const AdamConsts& k,
          void* out16, Elem out16_type, cudaStream_t stream) {
  if (n == 0) return;
  unsigned blocks = blocks_for(n, 256);
  if (blocks > 65535u * 8u) blocks = 65535u * 8u;
  adam_kernel<<<blocks, 256, 0, stream>>>(p, g, m, v, n, k, out16, out16_type);
}

}  // namespace ds::backend::cuda_kernels

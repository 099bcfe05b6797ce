// The CUDA backend's construction and its matrix multiply through cuBLAS.
//
// Row-major C = alpha op(A) op(B) + beta C is computed as the column-major C^T = op(B)^T op(A)^T,
// so A and B swap places and no data moves. fp32 operands use cuBLAS's plain fp32 compute (no TF32:
// the parity tests hold the GPU to 1e-4 of PyTorch's fp32); bf16 and fp16 operands run on the
// tensor cores with fp32 accumulation and an fp32 C, which is what Backend::gemm promises.
// (cublasSgemm for fp32 was measured against this entry point on an H200: the same 43.1k tokens/s
// for a GPT-2 training step, so there is one path.)
#include <cublas_v2.h>

#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/profile.h"
#include "ds/core/error.h"

namespace ds::backend {
namespace {

const char* cublas_status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "cuBLAS error";
  }
}

void cublas_check(cublasStatus_t s, int device, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  DS_THROW("[cuda:{}] {}: {}", device, what, cublas_status_name(s));
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: DS_THROW("[cuda:gemm] no matrix multiply for {}", dtype_name(t));
  }
}

}  // namespace

CudaBackend::CudaBackend(int device) : device_(device) {
  CudaDeviceGuard guard(device_);
  cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), device_,
             "cudaStreamCreateWithFlags");
  cublasHandle_t h = nullptr;
  cublas_check(cublasCreate(&h), device_, "cublasCreate");
  cublas_check(cublasSetStream(h, stream_), device_, "cublasSetStream");
  // Plain fp32 for fp32 operands (cuBLAS may otherwise pick TF32 when the environment asks).
  cublas_check(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH), device_, "cublasSetMathMode");
  // A workspace of its own lets cuBLAS pick its fastest Hopper kernels (NVIDIA recommends 32 MiB
  // there); without one it may fall back to slower ones.
  constexpr size_t kWorkspace = size_t{32} << 20;
  cuda_check(cudaMalloc(&workspace_, kWorkspace), device_, "cudaMalloc (cuBLAS workspace)");
  cublas_check(cublasSetWorkspace(h, workspace_, kWorkspace), device_, "cublasSetWorkspace");
  cublas_ = h;
  allocator_ = new_cuda_caching_allocator(device_, memory_limit_);
}

CudaBackend::~CudaBackend() {
  // Static destruction at exit: the driver may already be shutting down, so errors are ignored.
  if (cublas_) cublasDestroy(static_cast<cublasHandle_t>(cublas_));
  if (stream_) cudaStreamDestroy(stream_);
}

std::string CudaBackend::gemm_info() {
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, device_), device_, "cudaGetDeviceProperties");
  int version = 0;
  cublasGetVersion(static_cast<cublasHandle_t>(cublas_), &version);
  return fmt::format(
      "cuBLAS {} on {} (sm_{}{}, {} SMs, {:.1f} GiB): fp32 operands in fp32, bf16/fp16 on tensor "
      "cores with fp32 accumulation",
      version, prop.name, prop.major, prop.minor, prop.multiProcessorCount,
      static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
}

void CudaBackend::gemm(const Gemm& g) {
  const ProfileScope profile_scope(
      *this, "gemm",
      cuda_profiling() ? fmt::format("{} {}x{}x{}{}{}{}", dtype_name(g.dtype), g.m, g.n, g.k,
                                     g.trans_a ? " tA" : "", g.trans_b ? " tB" : "",
                                     g.batch > 1 ? fmt::format(" batch {}", g.batch) : "")
                       : std::string());
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  DS_CHECK(is_floating(g.dtype), "[cuda:gemm] no matrix multiply for {}", dtype_name(g.dtype));
  DS_CHECK(g.m <= INT32_MAX && g.n <= INT32_MAX && g.k <= INT32_MAX && g.lda <= INT32_MAX &&
               g.ldb <= INT32_MAX && g.ldc <= INT32_MAX && g.batch <= INT32_MAX,
           "[cuda:gemm] sizes ({} x {} x {}, batch {}) beyond cuBLAS's 32-bit arguments", g.m, g.n,
           g.k, g.batch);
  CudaDeviceGuard guard(device_);
  std::lock_guard<std::mutex> lock(cublas_mutex_);
  auto h = static_cast<cublasHandle_t>(cublas_);
  const cublasOperation_t op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cudaDataType_t in = cuda_type(g.dtype);
  const float alpha = g.alpha, beta = g.beta;
  const cublasStatus_t s = cublasGemmStridedBatchedEx(
      h, op_b, op_a, static_cast<int>(g.n), static_cast<int>(g.m), static_cast<int>(g.k), &alpha,
      g.b, in, static_cast<int>(g.ldb), g.stride_b, g.a, in, static_cast<int>(g.lda), g.stride_a,
      &beta, g.c, CUDA_R_32F, static_cast<int>(g.ldc), g.stride_c, static_cast<int>(g.batch),
      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  cublas_check(s, device_, "cublasGemmStridedBatchedEx");
}

}  // namespace ds::backend

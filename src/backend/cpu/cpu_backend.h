#pragma once
// The CPU backend: OpenMP threads, a runtime-loaded BLAS for GEMM (blas.cpp), our own kernels for
// the rest (elementwise.cpp, nn_kernels.cpp). Internal header.
#include "ds/backend/backend.h"

namespace ds::backend {

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  Allocator& allocator() override { return cpu_allocator(); }
  std::string gemm_info() override;
  bool supports(const std::string& op, DType dtype) const override;

  std::shared_ptr<Storage> host_staging(size_t nbytes) override {
    return Storage::allocate(nbytes, kCPU);
  }
  void copy(const Tensor& src, const Tensor& dst) override;
  void fill(const Tensor& dst, double value) override;
  void axpy(const Tensor& y, const Tensor& x, float alpha) override;
  double sum_of_squares(const Tensor& x) override;
  void gemm(const Gemm& g) override;
  void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) override;
  void unary(UnaryOp op, const Tensor& x, const Tensor& out, float scalar) override;
  void reduce(ReduceOp op, const Tensor& x, int64_t outer, int64_t reduced, int64_t inner,
              const Tensor& out) override;

  void layer_norm_forward(const Tensor& x, const Tensor& w, const Tensor& b, float eps,
                          const Tensor& y, const Tensor& mean, const Tensor& rstd) override;
  void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                           const Tensor& rstd, const Tensor& dx, const Tensor& dw,
                           const Tensor& db) override;
  void rms_norm_forward(const Tensor& x, const Tensor& w, float eps, const Tensor& y,
                        const Tensor& rstd) override;
  void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                         const Tensor& dx, const Tensor& dw) override;
  void softmax_forward(const Tensor& x, const Tensor& y) override;
  void softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) override;
  void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                         bool causal, std::span<const int64_t> key_lens, int64_t window,
                         float softcap, const Tensor& out, const Tensor& lse) override;
  void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& out, const Tensor& lse, float scale, bool causal,
                          std::span<const int64_t> key_lens, int64_t window, float softcap,
                          const Tensor& dq, const Tensor& dk, const Tensor& dv) override;
  void rope(const Tensor& x, int64_t pos0, const std::vector<double>& inv_freq, float scale,
            bool interleaved, bool inverse, const Tensor& out) override;
  void embedding_forward(const Tensor& weight, const Tensor& ids, const Tensor& out) override;
  void embedding_backward(const Tensor& dout, const Tensor& ids, const Tensor& dweight) override;
  void cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                             const Tensor& losses, const Tensor& lse) override;
  void cross_entropy_backward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                              const Tensor& lse, float scale, const Tensor& dlogits) override;
  void dropout(const Tensor& x, float p, uint64_t seed, uint64_t stream, uint64_t base,
               const Tensor& out) override;
  double bce_with_logits_sum(const Tensor& x, const Tensor& y) override;
  void bce_with_logits_backward(const Tensor& x, const Tensor& y, double scale,
                                const Tensor& dx) override;
  void max_backward(const Tensor& x, const Tensor& vals, const Tensor& dy, int64_t outer,
                    int64_t reduced, int64_t inner, const Tensor& dx) override;
  void vocab_ce_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_begin,
                      const Tensor& row_max, const Tensor& target_logit) override;
  void vocab_ce_sum_exp(const Tensor& logits, const Tensor& row_max,
                        const Tensor& sum_exp) override;
  void vocab_ce_backward(const Tensor& logits, const Tensor& targets, int64_t vocab_begin,
                         int64_t ignore_index, const Tensor& row_max, const Tensor& sum_exp,
                         float scale, const Tensor& dlogits) override;
  void gelu_erf_forward(const Tensor& x, const Tensor& out) override;
  void gelu_erf_backward(const Tensor& dy, const Tensor& x, const Tensor& dx) override;
  void swiglu_forward(const Tensor& gate, const Tensor& up, const Tensor& out) override;
  void swiglu_backward(const Tensor& dy, const Tensor& gate, const Tensor& up, const Tensor& dgate,
                       const Tensor& dup) override;
  void linear_rows(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) override;
  void decode_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, int64_t p0,
                        float scale, float softcap, const Tensor& out) override;
  void adam(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v,
            const AdamStep& step, const Tensor& out16) override;
};

// Single-precision GEMM through the loaded BLAS (row-major), usable by other CPU kernels (attention
// calls it per head from inside a parallel region; the BLAS then runs single-threaded).
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// bf16 GEMM on the CPU's bf16 units through oneDNN (onednn.cpp), row-major like sgemm, fp32 C
// (C = alpha op(A) op(B) + beta C). False when oneDNN's bf16 path is not in use (no library, a
// CPU without AVX512-BF16 / AMX-BF16, or DS_BF16_GEMM says otherwise); nothing is done then.
bool onednn_gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                      const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta,
                      float* c, int64_t ldc);
// C = op(A) op(B) (or C += when accumulate: C read in fp32, the total rounded once to nearest
// even) through oneDNN's matmul primitive, for `batch` products whose operands are stride_a /
// stride_b / stride_c elements apart (one call): the fp32 accumulators are converted in registers.
// A and B are `ab`: bf16 (C bf16: the bf16 results of ops::linear) or fp16 (C fp32 or fp16, on a
// CPU whose fp16 units oneDNN has a kernel for). False (nothing done) when the primitive is not
// available for these types.
bool onednn_matmul(DType ab, DType c_type, bool trans_a, bool trans_b, int64_t batch, int64_t m,
                   int64_t n, int64_t k, const void* a, int64_t lda, int64_t stride_a,
                   const void* b, int64_t ldb, int64_t stride_b, bool accumulate, void* c,
                   int64_t ldc, int64_t stride_c);
// fp32 GEMM through oneDNN's dnnl_sgemm (row-major, as sgemm); false when oneDNN did not load.
bool onednn_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                  int64_t ldc);
bool onednn_gemm_bf16_available();
bool onednn_f16_available();
bool onednn_sgemm_available();
// What the bf16 path is ("oneDNN 2.6.3 (libdnnl.so.2, dnnl_gemm_bf16bf16f32)"), or why there is
// none; what the fp32 one would be ("" when oneDNN did not load).
std::string onednn_gemm_info();
std::string onednn_sgemm_info();
// What the fp16 path is ("oneDNN 3.5.0 (libdnnl.so.3, matmul brg:avx512_core_fp16)"), or why
// fp16 products are converted to fp32 ("this CPU has no AVX512-FP16 or AMX-FP16").
std::string onednn_f16_info();

// C = A B^T for fp32 A with at most 8 rows against a large B (N, K) (a weight matrix: decode steps,
// beam search), through the decode row kernel instead of the BLAS; false (nothing done) for any
// other shape (decode.cpp).
bool gemm_few_rows(const Gemm& g);

}  // namespace ds::backend

// PLACEHOLDER: replaced by the real kernels (helper in progress).
#include "backend/cpu/cpu_backend.h"
#include "ds/core/error.h"
namespace ds::backend {
void CpuBackend::layer_norm_forward(const Tensor& x, const Tensor& w, const Tensor& b, float eps,
                          const Tensor& y, const Tensor& mean, const Tensor& rstd) { DS_THROW("[cpu:layer_norm_forward] not implemented yet"); }
void CpuBackend::layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                           const Tensor& rstd, const Tensor& dx, const Tensor& dw,
                           const Tensor& db) { DS_THROW("[cpu:layer_norm_backward] not implemented yet"); }
void CpuBackend::rms_norm_forward(const Tensor& x, const Tensor& w, float eps, const Tensor& y,
                        const Tensor& rstd) { DS_THROW("[cpu:rms_norm_forward] not implemented yet"); }
void CpuBackend::rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                         const Tensor& dx, const Tensor& dw) { DS_THROW("[cpu:rms_norm_backward] not implemented yet"); }
void CpuBackend::softmax_forward(const Tensor& x, const Tensor& y) { DS_THROW("[cpu:softmax_forward] not implemented yet"); }
void CpuBackend::softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) { DS_THROW("[cpu:softmax_backward] not implemented yet"); }
void CpuBackend::attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                         const Tensor& out, const Tensor& lse) { DS_THROW("[cpu:attention_forward] not implemented yet"); }
void CpuBackend::attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& out, const Tensor& lse, float scale, const Tensor& dq,
                          const Tensor& dk, const Tensor& dv) { DS_THROW("[cpu:attention_backward] not implemented yet"); }
void CpuBackend::rope(const Tensor& x, int64_t pos0, float theta, bool inverse, const Tensor& out) { DS_THROW("[cpu:rope] not implemented yet"); }
void CpuBackend::embedding_forward(const Tensor& weight, const Tensor& ids, const Tensor& out) { DS_THROW("[cpu:embedding_forward] not implemented yet"); }
void CpuBackend::embedding_backward(const Tensor& dout, const Tensor& ids, const Tensor& dweight) { DS_THROW("[cpu:embedding_backward] not implemented yet"); }
void CpuBackend::cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                             const Tensor& losses, const Tensor& lse) { DS_THROW("[cpu:cross_entropy_forward] not implemented yet"); }
void CpuBackend::cross_entropy_backward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                              const Tensor& lse, float scale, const Tensor& dlogits) { DS_THROW("[cpu:cross_entropy_backward] not implemented yet"); }
void CpuBackend::dropout(const Tensor& x, float p, uint64_t seed, uint64_t stream, uint64_t base,
               const Tensor& out) { DS_THROW("[cpu:dropout] not implemented yet"); }
}

// The sim backend (sim_backend.h): the CPU backend's kernels on host aliases of sim tensors.
#include "backend/sim/sim_backend.h"

#include <cmath>
#include <vector>

#include "backend/sim/sim_memory.h"
#include "ds/core/device_registry.h"
#include "ds/core/error.h"

namespace ds::backend {
namespace {

// t's host alias: a kCPU tensor over t's shadow memory with t's shape, strides, offset and dtype,
// keeping t's storage alive. Undefined tensors pass through; with host_ok, so do CPU tensors (the
// copies between host and device), otherwise a tensor off sim is an error, as on a GPU.
Tensor host(const Tensor& t, bool host_ok = false) {
  if (!t.defined() || (host_ok && t.device().is_cpu())) return t;
  DS_CHECK(t.device().type == DeviceType::sim,
           "[sim:0] a kernel got a tensor on {}: move it to sim:0 first (Tensor::copy_from)",
           t.device().str());
  const std::shared_ptr<Storage>& s = t.storage();
  auto alias = Storage::external(host_address(s->data()), s->nbytes(), kCPU, [keep = s](void*) {});
  return Tensor::from_storage(std::move(alias), t.shape(), t.dtype(), t.storage_offset(),
                              t.strides());
}

// A Gemm operand's host shadow.
template <class T>
T* host_ptr(T* p, const char* operand) {
  DS_CHECK(is_sim_address(p), "[sim:0:gemm] operand {} at {} is not sim memory", operand,
           static_cast<const void*>(p));
  return static_cast<T*>(host_address(p));
}

// Ids on a device are checked by its backend, not the ops layer: CUDA's message, on the host alias.
const Tensor& checked_ids(const Tensor& ids, int64_t V) {
  const std::vector<int64_t> h = ids.to_int_vector();
  for (size_t n = 0; n < h.size(); ++n)
    DS_CHECK(h[n] >= 0 && h[n] < V,
             "[embedding] id {} (at position {}) is out of range for vocabulary size {} (on sim:0)",
             h[n], n, V);
  return ids;
}

SimBackend& sim_backend() {
  // Never destroyed: tensors that outlive main() still return their memory to its allocator.
  static SimBackend* b = new SimBackend();
  return *b;
}

// Core's copy and fill for sim devices (Tensor's factories, clone, to(dtype), copy_from).
void registry_copy(const Tensor& src, const Tensor& dst) {
  sim_backend().copy(src, dst);
}
void registry_fill(const Tensor& dst, double value) {
  sim_backend().fill(dst, value);
}

// Registered before main when this file is linked in - which a static library does only when
// something references it (backend::get does): callers of a sim tensor call backend::sim() or
// backend::get(sim) first, as for CUDA (core/device_registry.h).
const bool kRegistered = (sim_backend(), true);

}  // namespace

Backend& sim() {
  (void)kRegistered;
  return sim_backend();
}

SimBackend::SimBackend() : allocator_(new_sim_allocator(memory_limit_)) {
  register_device(DeviceType::sim, DeviceOps{allocator_.get(), &registry_copy, &registry_fill});
}

std::string SimBackend::gemm_info() {
  return "sim (the CPU's: " + cpu().gemm_info() + ")";
}

bool SimBackend::supports(const std::string& op, DType dtype) const {
  if (op == "adam") return dtype == DType::f32;
  // Backend's composed defaults run here (see sim_backend.h): fp32 only, as on a GPU without a
  // kernel of its own.
  if (op == "linear_rows" || op == "decode_attention") return dtype == DType::f32;
  return cpu().supports(op, dtype);
}

void SimBackend::set_memory_limit(uint64_t bytes) {
  memory_limit_.store(bytes);
  if (bytes > 0) allocator_->empty_cache();
}

uint64_t SimBackend::available_memory() {
  const uint64_t limit = memory_limit_.load(), in_use = allocator_->stats().bytes_in_use;
  return limit > in_use ? limit - in_use : 0;  // 0 without a cap: unknown
}

void SimBackend::copy(const Tensor& src, const Tensor& dst) {
  cpu().copy(host(src, true), host(dst, true));
}
void SimBackend::fill(const Tensor& dst, double value) {
  cpu().fill(host(dst), value);
}
void SimBackend::axpy(const Tensor& y, const Tensor& x, float alpha) {
  cpu().axpy(host(y), host(x), alpha);
}
double SimBackend::sum_of_squares(const Tensor& x) {
  return cpu().sum_of_squares(host(x));
}

void SimBackend::gemm(const Gemm& g) {
  Gemm h = g;
  h.a = host_ptr(g.a, "a");
  h.b = host_ptr(g.b, "b");
  h.c = host_ptr(g.c, "c");
  cpu().gemm(h);
}

void SimBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  cpu().binary(op, host(a), host(b), host(out));
}
void SimBackend::unary(UnaryOp op, const Tensor& x, const Tensor& out, float scalar) {
  cpu().unary(op, host(x), host(out), scalar);
}
void SimBackend::reduce(ReduceOp op, const Tensor& x, int64_t outer, int64_t reduced, int64_t inner,
                        const Tensor& out) {
  cpu().reduce(op, host(x), outer, reduced, inner, host(out));
}

void SimBackend::layer_norm_forward(const Tensor& x, const Tensor& w, const Tensor& b, float eps,
                                    const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  cpu().layer_norm_forward(host(x), host(w), host(b), eps, host(y), host(mean), host(rstd));
}
void SimBackend::layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w,
                                     const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                                     const Tensor& dw, const Tensor& db) {
  cpu().layer_norm_backward(host(dy), host(x), host(w), host(mean), host(rstd), host(dx), host(dw),
                            host(db));
}
void SimBackend::rms_norm_forward(const Tensor& x, const Tensor& w, float eps, const Tensor& y,
                                  const Tensor& rstd) {
  cpu().rms_norm_forward(host(x), host(w), eps, host(y), host(rstd));
}
void SimBackend::rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w,
                                   const Tensor& rstd, const Tensor& dx, const Tensor& dw) {
  cpu().rms_norm_backward(host(dy), host(x), host(w), host(rstd), host(dx), host(dw));
}
void SimBackend::softmax_forward(const Tensor& x, const Tensor& y) {
  cpu().softmax_forward(host(x), host(y));
}
void SimBackend::softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  cpu().softmax_backward(host(y), host(dy), host(dx));
}
void SimBackend::attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                                   bool causal, std::span<const int64_t> key_lens, int64_t window,
                                   float softcap, const Tensor& out, const Tensor& lse) {
  cpu().attention_forward(host(q), host(k), host(v), scale, causal, key_lens, window, softcap,
                          host(out), host(lse));
}
void SimBackend::attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const Tensor& out, const Tensor& lse,
                                    float scale, bool causal, std::span<const int64_t> key_lens,
                                    int64_t window, float softcap, const Tensor& dq,
                                    const Tensor& dk, const Tensor& dv) {
  cpu().attention_backward(host(dout), host(q), host(k), host(v), host(out), host(lse), scale,
                           causal, key_lens, window, softcap, host(dq), host(dk), host(dv));
}
void SimBackend::rope(const Tensor& x, int64_t pos0, const std::vector<double>& inv_freq,
                      float scale, bool interleaved, bool inverse, const Tensor& out) {
  cpu().rope(host(x), pos0, inv_freq, scale, interleaved, inverse, host(out));
}
void SimBackend::embedding_forward(const Tensor& weight, const Tensor& ids, const Tensor& out) {
  cpu().embedding_forward(host(weight), checked_ids(host(ids), weight.size(0)), host(out));
}
void SimBackend::embedding_backward(const Tensor& dout, const Tensor& ids, const Tensor& dweight) {
  cpu().embedding_backward(host(dout), checked_ids(host(ids), dweight.size(0)), host(dweight));
}
void SimBackend::cross_entropy_forward(const Tensor& logits, const Tensor& targets,
                                       int64_t ignore_index, const Tensor& losses,
                                       const Tensor& lse) {
  cpu().cross_entropy_forward(host(logits), host(targets), ignore_index, host(losses), host(lse));
}
void SimBackend::cross_entropy_backward(const Tensor& logits, const Tensor& targets,
                                        int64_t ignore_index, const Tensor& lse, float scale,
                                        const Tensor& dlogits) {
  cpu().cross_entropy_backward(host(logits), host(targets), ignore_index, host(lse), scale,
                               host(dlogits));
}
void SimBackend::dropout(const Tensor& x, float p, uint64_t seed, uint64_t stream, uint64_t base,
                         const Tensor& out) {
  cpu().dropout(host(x), p, seed, stream, base, host(out));
}

void SimBackend::adam(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v,
                      const AdamStep& s, const Tensor& out16) {
  const int64_t n = p.numel();
  for (const Tensor* t : {&p, &g, &m, &v})
    DS_CHECK(t->dtype() == DType::f32 && t->is_contiguous() && t->numel() == n,
             "[sim:0:adam] p, g, m, v must be contiguous fp32 of {} elements", n);
  DS_CHECK(!out16.defined() || ((out16.dtype() == DType::bf16 || out16.dtype() == DType::f16) &&
                                out16.is_contiguous() && out16.numel() == n),
           "[sim:0:adam] out16 must be a contiguous bf16 or fp16 tensor of {} elements", n);
  const Tensor hp = host(p), hg = host(g), hm = host(m), hv = host(v), ho = host(out16);
  float* P = hp.data<float>();
  const float* G = hg.data<float>();
  float* M = hm.data<float>();
  float* V = hv.data<float>();
  uint16_t* O = ho.defined() ? static_cast<uint16_t*>(ho.raw_data()) : nullptr;
  const bool bf16 = ho.defined() && ho.dtype() == DType::bf16;
  // AdamStep's order (backend.h), every operation IEEE-rounded: src/optim/simd_body.inl's.
  for (int64_t i = 0; i < n; ++i) {
    float gi = G[i] * s.grad_scale;
    float pi = P[i];
    if (s.l2_decay) gi = std::fma(s.weight_decay, pi, gi);
    const float mi = std::fma(gi, s.one_minus_beta1, M[i] * s.beta1);
    const float vi = std::fma(gi * gi, s.one_minus_beta2, V[i] * s.beta2);
    const float denom = std::fma(std::sqrt(vi), s.inv_sqrt_bc2, s.eps);
    if (s.decoupled_decay) pi = std::fma(pi, s.neg_lr_wd, pi);
    pi = std::fma(mi / denom, s.neg_step_size, pi);
    P[i] = pi;
    M[i] = mi;
    V[i] = vi;
    if (O) O[i] = bf16 ? float_to_bf16(pi) : float_to_f16(pi);
  }
}

}  // namespace ds::backend

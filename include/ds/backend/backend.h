#pragma once
// The one kernel interface. Ops (src/ops) validate arguments, allocate outputs and record autograd
// history; the kernels behind them live in a Backend chosen by the tensor's device. The CPU backend
// is always built; the CUDA backend is built with -DDS_WITH_CUDA=ON and is otherwise a stub whose
// lookup throws a clear error (src/backend/no_cuda.cpp). A new op adds a method here, so every
// backend must say something about it.
//
// Unless a method says otherwise, tensors passed to kernels are contiguous fp32 and already
// shape-checked by the op; the op layer upcasts 16-bit inputs where a kernel has no 16-bit path.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ds/core/allocator.h"
#include "ds/core/storage.h"
#include "ds/core/tensor.h"

namespace ds::backend {

enum class BinaryOp : uint8_t {
  add,
  sub,
  mul,
  div,
  gelu_backward,  // out = a * gelu'(b)   (a = upstream gradient, b = gelu input)
  silu_backward,  // out = a * silu'(b)
};

enum class UnaryOp : uint8_t {
  neg,
  exp,
  log,
  sqrt,
  tanh,
  square,
  add_scalar,  // x + s
  mul_scalar,  // x * s
  pow_scalar,  // x ^ s
  gelu,        // tanh approximation, as GPT-2
  silu,
};

enum class ReduceOp : uint8_t { sum, max };

// C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b] for b in [0, batch); row-major.
// A is (M, K) after op, B is (K, N) after op, C is (M, N). Strides between batch items in elements.
struct Gemm {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f, beta = 0.0f;
  const void* a = nullptr;
  int64_t lda = 0, stride_a = 0;
  const void* b = nullptr;
  int64_t ldb = 0, stride_b = 0;
  void* c = nullptr;
  int64_t ldc = 0, stride_c = 0;
  int64_t batch = 1;
  DType dtype = DType::f32;    // of A and B
  DType c_dtype = DType::f32;  // of C: fp32, or (where supports("gemm_out16", dtype)) a 16-bit
                               // dtype: the fp32 result (beta: plus C widened) rounded once into C
};

// One fused Adam/AdamW step's constants, computed once per step by the optimizer layer
// (optim::adam_update, include/ds/optim/kernels.h, which documents the formulas). Per element, with
// IEEE-rounded operations in this order: g *= grad_scale; if l2_decay g = fma(wd, p, g);
// m = fma(g, 1-b1, m*b1); v = fma(g*g, 1-b2, v*b2); denom = fma(sqrt(v), inv_sqrt_bc2, eps);
// if decoupled_decay p = fma(p, neg_lr_wd, p); p = fma(m / denom, neg_step_size, p).
struct AdamStep {
  float grad_scale = 1.0f, beta1 = 0.9f, one_minus_beta1 = 0.1f, beta2 = 0.999f,
        one_minus_beta2 = 0.001f, eps = 1e-8f;
  float inv_sqrt_bc2 = 1.0f;   // 1 / sqrt(1 - beta2^t)
  float neg_step_size = 0.0f;  // -lr / (1 - beta1^t)
  float weight_decay = 0.0f;   // used when l2_decay
  float neg_lr_wd = 0.0f;      // -lr * wd, used when decoupled_decay
  bool l2_decay = false, decoupled_decay = false;
};

// Copies between a device and host memory that run beside the device's kernels (CUDA: a stream of
// their own, ordered against the compute stream by events only where asked), so that host work
// overlaps them: the offloaded optimizer step moves gradients down and parameters up chunk by
// chunk while the CPU optimizer steps the chunk in between (zero/strategy.cpp). Copies in one
// queue run in the order enqueued; two queues may run at once (a GPU has a copy engine per
// direction). On the CPU, and for any backend without a queue of its own, every copy completes
// inside copy() and the orderings are no-ops.
//
// Threading: one thread uses a queue. Lifetime: both sides of a copy must stay alive, and the host
// side untouched by the host, until wait() covers it; the destructor waits for every copy.
class TransferQueue {
 public:
  virtual ~TransferQueue() = default;
  // Copies enqueued from now on start only after every kernel enqueued on the device so far (the
  // backward that produced the gradients about to be copied down). The host does not wait.
  virtual void after_kernels() = 0;
  // Enqueues dst <- src: same dtype and numel, both contiguous, one on this queue's device and the
  // other in host memory (page-locked, Backend::host_staging, for the copy to be asynchronous).
  // Returns its ticket; tickets increase by one per copy.
  virtual uint64_t copy(const Tensor& src, const Tensor& dst) = 0;
  // Blocks the calling thread until the copy with this ticket, and every earlier one, is done.
  virtual void wait(uint64_t ticket) = 0;
  // Kernels enqueued on the device from now on start only after every copy enqueued so far (the
  // next forward reads the parameters just copied up). The host does not wait.
  virtual void before_kernels() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual Allocator& allocator() = 0;
  // A short description of the matrix-multiply path in use (printed at start-up).
  virtual std::string gemm_info() = 0;
  // Whether this backend has a kernel for op at dtype (ggml's supports_op): callers ask instead of
  // failing obscurely deep inside a kernel.
  virtual bool supports(const std::string& op, DType dtype) const = 0;

  // ---- memory ----
  // Host memory for staging copies to and from this backend's device: page-locked (pinned) where
  // that makes the copies faster (CUDA: cudaHostAlloc, copied by DMA at the link's speed), plain
  // host memory otherwise (the CPU backend; or when pinning fails). A kCPU storage either way.
  virtual std::shared_ptr<Storage> host_staging(size_t nbytes) = 0;
  // A new transfer queue for this device (TransferQueue above). Default: synchronous copies.
  virtual std::unique_ptr<TransferQueue> transfer_queue();
  // Caps the device memory this process's allocator reserves (PyTorch's
  // set_per_process_memory_fraction, in bytes; 0 = no cap): an allocation beyond it fails with the
  // out-of-memory error, as on a smaller card. Default: throws (host memory has no cap here).
  virtual void set_memory_limit(uint64_t bytes);
  // Bytes this process could still allocate on the device: its free memory plus what the caching
  // allocator holds unused, within set_memory_limit's cap. 0 = unknown (the CPU: host memory is
  // read by core/memory_info.h).
  virtual uint64_t available_memory() { return 0; }
  // Blocks until every kernel and copy enqueued on this device so far is done (timing, and
  // handing results to another thread). The CPU runs kernels synchronously: nothing to wait for.
  virtual void synchronize() {}
  // dst = src elementwise; same shape, any strides for both, converts dtype.
  virtual void copy(const Tensor& src, const Tensor& dst) = 0;
  virtual void fill(const Tensor& dst, double value) = 0;  // contiguous dst, any dtype
  // y += alpha * x in place; y and x contiguous, same numel, any float dtypes (computed in fp32).
  virtual void axpy(const Tensor& y, const Tensor& x, float alpha) = 0;
  // sum(x_i^2) over a contiguous fp32 x, accumulated in double over fixed tiles of 2^16 elements
  // summed in order: the same value for any thread count (ZeRO's gradient norm).
  virtual double sum_of_squares(const Tensor& x) = 0;

  // ---- linear algebra ----
  virtual void gemm(const Gemm& g) = 0;

  // ---- elementwise ----
  // a and b are broadcast views of out's shape (stride 0 on broadcast dims); out contiguous and
  // may be a itself (in place: each element is read before it is written).
  virtual void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  virtual void unary(UnaryOp op, const Tensor& x, const Tensor& out, float scalar = 0.0f) = 0;

  // ---- reductions: x is contiguous and read as (outer, reduced, inner); out is (outer, inner),
  // fp32; x fp32, or 16-bit where supports("reduce", dt) (read as its exact fp32 values) ----
  virtual void reduce(ReduceOp op, const Tensor& x, int64_t outer, int64_t reduced, int64_t inner,
                      const Tensor& out) = 0;

  // ---- neural-network kernels (rows = all leading dims flattened, C = last dim) ----
  // Contiguous fp32 tensors, except where supports(kernel, dt) says a backend takes a 16-bit dt:
  // then activations, their gradients and weights may be bf16/fp16 (each its own dtype), computed
  // in fp32; row statistics (mean, rstd, lse) and weight gradients (dw, db) stay fp32. The CPU does
  // so for the norms, softmax, attention, rope, gelu_erf and swiglu (docs/architecture.md).
  virtual void layer_norm_forward(const Tensor& x, const Tensor& w, const Tensor& b, float eps,
                                  const Tensor& y, const Tensor& mean, const Tensor& rstd) = 0;
  // dw and db are accumulated into (+=); db may be undefined (no bias).
  virtual void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w,
                                   const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                                   const Tensor& dw, const Tensor& db) = 0;
  virtual void rms_norm_forward(const Tensor& x, const Tensor& w, float eps, const Tensor& y,
                                const Tensor& rstd) = 0;
  virtual void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w,
                                 const Tensor& rstd, const Tensor& dx, const Tensor& dw) = 0;
  virtual void softmax_forward(const Tensor& x, const Tensor& y) = 0;  // over the last dim
  virtual void softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) = 0;
  // Attention: q and out (B, NH, Tq, hd), k and v (B, NH, Tk, hd), lse (B, NH, Tq) keeping each
  // row's log-sum-exp so that backward recomputes the scores one block of rows at a time instead of
  // storing them. Query i of batch b sees keys j < key_lens[b] (every key when key_lens is empty:
  // right padding) and, when causal, j <= i + Tk - Tq (the queries are the last Tq positions;
  // Tq <= Tk). window > 0 (causal, no key_lens): a sliding window, query at position
  // p = i + Tk - Tq sees keys p - window < j <= p (transformers' sliding_window mask; Gemma's
  // local layers); 0 = none. softcap > 0: each scaled score s becomes softcap * tanh(s / softcap)
  // before the mask and softmax (Gemma 2's attention logit soft-capping); 0 = none. A backend
  // without windows or soft-capping refuses them by name. Every row must see at least one key.
  virtual void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                                 bool causal, std::span<const int64_t> key_lens, int64_t window,
                                 float softcap, const Tensor& out, const Tensor& lse) = 0;
  virtual void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& out, const Tensor& lse,
                                  float scale, bool causal, std::span<const int64_t> key_lens,
                                  int64_t window, float softcap, const Tensor& dq, const Tensor& dk,
                                  const Tensor& dv) = 0;
  // Rotary embedding on x (B, NH, T, hd), positions pos0 .. pos0+T-1. The first r = 2 *
  // inv_freq.size() <= hd dims rotate (the rest are copied: partial rotary, GLM's r = hd/2), pair i
  // by angle p * inv_freq[i], cos and sin multiplied by scale (yarn's attention factor; 1
  // otherwise). Pairs are (i, i + r/2) (the LLaMA / Hugging Face "rotate_half" convention), or
  // (2i, 2i+1) when interleaved (GLM, ChatGLM, GPT-J). inverse rotates by -angle (the backward).
  virtual void rope(const Tensor& x, int64_t pos0, const std::vector<double>& inv_freq,
                    float scale, bool interleaved, bool inverse, const Tensor& out) = 0;
  // out (N, C) = weight[ids]; ids int32 or int64 (N). 16-bit where supports(): out has weight's
  // dtype and the rows are copied as they are.
  virtual void embedding_forward(const Tensor& weight, const Tensor& ids, const Tensor& out) = 0;
  // dweight (V, C) += scatter of dout rows by ids (deterministic order: each row's additions in
  // input order, from its current value). 16-bit where supports(): each touched row summed in
  // fp32 and rounded once, so the result is that of an fp32 dweight narrowed.
  virtual void embedding_backward(const Tensor& dout, const Tensor& ids, const Tensor& dweight) = 0;
  // losses (N) = lse - logit[target] (0 where target == ignore_index); lse (N) saved for backward.
  // losses and lse fp32; logits 16-bit where supports() (fp32 math on the widened values).
  virtual void cross_entropy_forward(const Tensor& logits, const Tensor& targets,
                                     int64_t ignore_index, const Tensor& losses,
                                     const Tensor& lse) = 0;
  // dlogits = (softmax(logits) - onehot(target)) * scale per row (0 for ignored rows). logits and
  // dlogits 16-bit where supports() (dlogits rounded from fp32; with one dtype it may alias logits).
  virtual void cross_entropy_backward(const Tensor& logits, const Tensor& targets,
                                      int64_t ignore_index, const Tensor& lse, float scale,
                                      const Tensor& dlogits) = 0;
  // ---- losses and gradients with a CPU kernel and a default composed of the kernels above ----
  // Binary cross entropy with logits (ops::bce_with_logits): x (logits) and y (targets in [0, 1])
  // contiguous fp32 of one size; returns sum_i max(x_i, 0) - x_i y_i + log1p(exp(-|x_i|)).
  // CPU: each term and the sum in double, over fixed tiles of 2^16 elements added in order (one
  // value for any thread count). Default: the terms from unary/binary kernels and their sum from
  // reduce, in fp32 on the device (no host copy of x or y; within ~1e-6 relative of the CPU's).
  virtual double bce_with_logits_sum(const Tensor& x, const Tensor& y);
  // dx = (sigmoid(x) - y) * scale, x, y, dx contiguous fp32 of one size. CPU: in double, rounded.
  // Default: sigmoid(x) = (1 + tanh(x / 2)) / 2 from unary/binary kernels, in fp32.
  virtual void bce_with_logits_backward(const Tensor& x, const Tensor& y, double scale,
                                        const Tensor& dx);
  // The backward of max over a dim (ops::max): x contiguous fp32 read as (outer, reduced, inner),
  // vals (outer, inner) its maxima (reduce's output), dy (outer, inner); dx (outer, reduced,
  // inner) gets dy at the first r where x == vals (as torch.max(dim) picks its index) and 0
  // everywhere else. Default: the CPU backend's kernel on host copies (choosing the first maximum
  // is a scan no other kernel does; a device without its own kernel pays the copies).
  virtual void max_backward(const Tensor& x, const Tensor& vals, const Tensor& dy, int64_t outer,
                            int64_t reduced, int64_t inner, const Tensor& dx);
  // Cross entropy over a vocabulary cut by columns (nn::vocab_parallel_cross_entropy): logits
  // (N, Vl) contiguous fp32 hold vocabulary entries [vocab_begin, vocab_begin + Vl); targets (N)
  // int32/int64 contiguous ids of the whole vocabulary (ignore_index marks ignored rows). The
  // caller all-reduces the statistics between the calls (comm/ does the communication):
  //   vocab_ce_stats:    row_max (N) = max_j logits[n, j]; target_logit (N) = logits[n,
  //                      targets[n] - vocab_begin] where that column is here, else 0.
  //   vocab_ce_sum_exp:  sum_exp (N) = sum_j exp(logits[n, j] - row_max[n]) (row_max: the
  //                      all-reduced maxima). CPU: accumulated in double, rounded.
  //   vocab_ce_backward: dlogits (N, Vl) = exp(logits - row_max) / sum_exp * scale, minus scale
  //                      at the target's column when it is here; zero rows where ignored.
  // Defaults: reduce, binary, unary and embedding kernels (the gather and scatter of the target
  // column), with the column indices made on the host from the ids (N integers).
  virtual void vocab_ce_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_begin,
                              const Tensor& row_max, const Tensor& target_logit);
  virtual void vocab_ce_sum_exp(const Tensor& logits, const Tensor& row_max, const Tensor& sum_exp);
  virtual void vocab_ce_backward(const Tensor& logits, const Tensor& targets, int64_t vocab_begin,
                                 int64_t ignore_index, const Tensor& row_max, const Tensor& sum_exp,
                                 float scale, const Tensor& dlogits);
  // Exact GELU (erf form, BERT's "gelu"): out = x Phi(x); dx = dy (Phi(x) + x phi(x)). fp32,
  // contiguous, one shape. Default: the CPU backend's kernel on host copies (correct on any
  // device; a device without its own kernel pays two copies each way).
  virtual void gelu_erf_forward(const Tensor& x, const Tensor& out);
  virtual void gelu_erf_backward(const Tensor& dy, const Tensor& x, const Tensor& dx);
  // SwiGLU (ops::swiglu): out = silu(gate) * up; the backward writes dgate = dy * up * silu'(gate)
  // and dup = dy * silu(gate), each unless undefined. Contiguous, one size. Default: the unary and
  // binary kernels (silu, mul, silu_backward) in fp32, one temporary per product; the CPU fuses
  // each into one pass with the same fp32 arithmetic (bitwise the default's result).
  virtual void swiglu_forward(const Tensor& gate, const Tensor& up, const Tensor& out);
  virtual void swiglu_backward(const Tensor& dy, const Tensor& gate, const Tensor& up,
                               const Tensor& dgate, const Tensor& dup);

  // ---- decoding (inference only: models::IncrementalDecoder) ----
  // y (R, N) = x (R, K) w^T + b, for R independent rows (decode: one row per sequence). Every row
  // is computed in one fixed order whatever R is, so row r equals the call with x's row r alone,
  // bit for bit (continuous batching then equals one-at-a-time decoding); a BLAS GEMM's sums depend
  // on R. Decode is bound by reading w once per step: a backend reads each weight row once for
  // all R rows. x, y contiguous fp32; w (N, K) contiguous fp32, or bf16 where
  // supports("linear_rows", bf16) (read as it is, fp32 accumulation: the result is that of w's
  // fp32 widening); b (N) fp32 or undefined. Default: one fp32 gemm per row (M = 1), which is
  // row-invariant on any device.
  virtual void linear_rows(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y);
  // Attention of n new query rows at positions p0 .. p0+n-1 against a key/value cache:
  // q (NH, n, hd); k_cache and v_cache (P, KV, hd) position-major (the rows a sequence has
  // cached, P >= p0 + n, rows p0.. already holding the new keys); out (n, NH, hd). Query head h
  // reads KV head h / (NH / KV) (grouped-query attention); query row i sees positions 0 .. p0+i.
  // Scores are scaled by `scale` (then soft-capped, softcap > 0: softcap * tanh(s / softcap)),
  // softmax and the weighted sum accumulate in fp32. All fp32,
  // contiguous; the caches bf16 where supports("decode_attention", bf16) (widened as read: the
  // result is that of the caches' fp32 widening). Default (fp32): gathers the cache into
  // (1, NH, p0+n, hd) and runs attention_forward.
  virtual void decode_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                int64_t p0, float scale, float softcap, const Tensor& out);

  // ---- optimizer ----
  // One Adam step over flat contiguous fp32 p, g, m, v of equal length (p, m, v updated in place);
  // out16, when defined, receives p rounded to its dtype (bf16 or fp16: the model's working copy).
  // Bitwise what the CPU optimizer computes for the same inputs. The CPU backend has no kernel
  // here (supports("adam") is false): on the CPU the optimizer layer runs its own SIMD kernels
  // (src/optim), and optim::adam_update dispatches by device.
  virtual void adam(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v,
                    const AdamStep& step, const Tensor& out16) = 0;

  // out = x * mask / (1 - p) with mask[i] = uniform(seed, stream, base + i) >= p. x/out any float.
  virtual void dropout(const Tensor& x, float p, uint64_t seed, uint64_t stream, uint64_t base,
                       const Tensor& out) = 0;
};

Backend& get(Device device);
Backend& cpu();
// CUDA: the real backend when built with DS_WITH_CUDA, otherwise throws "[cuda] built without ...".
Backend& cuda(int index);
// The CUDA devices this process sees: 0 without DS_WITH_CUDA, without a driver or without a GPU.
int cuda_device_count();
// The sim device emulator (sim:0, src/backend/sim): a device for tests whose memory the host
// cannot dereference (a host read of it faults at once) and whose kernels are the CPU's, so CI
// without a GPU runs device code paths. Always built; not a performance device. One per process.
Backend& sim();

}  // namespace ds::backend

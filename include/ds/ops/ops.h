#pragma once
// Differentiable tensor ops. Each validates its arguments (errors start with "[op_name]"), runs the
// kernel of the tensors' backend, and records a backward node when grad mode is on and an input
// requires grad. Shapes in comments use the project's letters: B batch, T time, C channels,
// NH heads, hd head size, V vocabulary, N rows.
//
// Floating inputs may be fp32, bf16 or fp16; ops whose kernels compute in fp32 upcast 16-bit inputs
// and return the input's dtype. Binary ops need both inputs in one dtype.
#include <cstdint>
#include <functional>
#include <vector>

#include "ds/core/tensor.h"

namespace ds::ops {

// ---- elementwise, with NumPy broadcasting ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, float s);
Tensor mul(const Tensor& a, float s);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor square(const Tensor& x);
Tensor pow(const Tensor& x, float exponent);
Shape broadcast_shapes(const Shape& a, const Shape& b);
Tensor broadcast_to(const Tensor& x, const Shape& shape);  // a view; backward sums

// ---- reductions ----
Tensor sum(const Tensor& x);  // all elements -> scalar (shape {})
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor max(const Tensor& x, int64_t dim, bool keepdim = false);  // values; gradient to the argmax

// ---- shape (views where possible) ----
Tensor reshape(const Tensor& x, const Shape& shape);  // one dim may be -1
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end);  // [start, end)
Tensor concat(const std::vector<Tensor>& xs, int64_t dim);
Tensor contiguous(const Tensor& x);         // differentiable copy when not contiguous
Tensor cast(const Tensor& x, DType dtype);  // differentiable dtype conversion

// ---- linear algebra ----
// (..., M, K) @ (..., K, N) -> (..., M, N); batch dims broadcast; 1-D operands as in NumPy are
// not supported (reshape first).
Tensor matmul(const Tensor& a, const Tensor& b);
// x (..., in) @ w(out, in)^T + b(out) -> (..., out); b may be undefined.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b = {});

// ---- neural-network ops ----
Tensor embedding(const Tensor& weight, const Tensor& ids);  // (V, C), ids (...) int -> (..., C)
Tensor layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, float eps = 1e-5f);
Tensor rms_norm(const Tensor& x, const Tensor& w, float eps = 1e-6f);
Tensor gelu(const Tensor& x);  // tanh approximation (GPT-2's "gelu_new")
// Exact GELU, x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) (BERT's "gelu", torch's default):
// Backend::gelu_erf_forward / _backward (a device without its own kernel runs the CPU's on host
// copies).
Tensor gelu_erf(const Tensor& x);
Tensor silu(const Tensor& x);
Tensor swiglu(const Tensor& gate, const Tensor& up);  // silu(gate) * up
Tensor softmax(const Tensor& x);                      // over the last dim
// Which keys each query sees (mask kinds: causal for decoders, none for encoders and
// cross-attention, plus right padding for both).
struct AttentionMask {
  // Query i sees keys j <= i + Tk - Tq (the queries are the last Tq positions); false: every key.
  bool causal = true;
  // (B) keys [0, len_b) of batch row b are visible (right padding: an encoder's or a
  // cross-attention's attention_mask as lengths); empty = all Tk. Each in [1, Tk].
  std::vector<int64_t> key_lengths;
  // Causal only, no key_lengths: a sliding window of this many keys, query at position p seeing
  // keys p - window < j <= p (transformers' sliding_window mask, Gemma's local layers); 0 = none.
  int64_t window = 0;
  // > 0: scaled scores s become softcap * tanh(s / softcap) before the mask (Gemma 2's
  // attn_logit_softcapping); 0 = none.
  float softcap = 0.0f;
};
// q (B, NH, Tq, hd), k, v (B, NH, Tk, hd) -> (B, NH, Tq, hd), scale 1/sqrt(hd) (or `scale` when
// > 0: T5 uses 1). Holds one block of scores per head per thread at a time; backward recomputes
// scores from the saved log-sum-exp.
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionMask& mask,
                 float scale = 0.0f);
// q, k, v (B, NH, T, hd) -> (B, NH, T, hd), causal: attention(q, k, v, {causal}).
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v);
// x (B, NH, T, hd): rotary position embedding for positions pos0 .. pos0+T-1, inverse frequencies
// theta^(-2i/hd).
Tensor rope(const Tensor& x, float theta = 10000.0f, int64_t pos0 = 0);
// The same with given inverse frequencies (nn::rope_inv_freq) and cos/sin multiplied by scale
// (yarn's attention factor). The first r = 2 * inv_freq.size() <= hd dims rotate, the rest pass
// through (partial rotary); pairs (i, i + r/2), or (2i, 2i+1) when interleaved (GLM).
Tensor rope(const Tensor& x, const std::vector<double>& inv_freq, float scale = 1.0f,
            int64_t pos0 = 0, bool interleaved = false);
// Inverted dropout; masks come from the process-wide counter stream (ds/core/rng.h), so they are
// reproducible and independent of the rank. Identity when !training or p == 0.
Tensor dropout(const Tensor& x, float p, bool training);
// logits (N, V), targets (N) int32/int64 -> scalar mean loss over targets != ignore_index.
// The losses (this, linear_cross_entropy, bce_with_logits) are computed in fp32 and returned as
// an fp32 scalar for any input dtype, as torch.autocast and Hugging Face models (which upcast
// the logits) give them: a bf16 loss would carry up to 2^-9 relative rounding into the logs.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100);
// cross_entropy(linear(x, w), targets) without forming the (N, V) logits: x (N, C), w (V, C) ->
// scalar mean loss. Rows go block_rows at a time (0: linear_cross_entropy_block_rows), and when a
// gradient is wanted it is computed block by block during this call (dx (N, C) and dw (V, C) kept
// in fp32), so peak memory is one block of logits instead of all of them (Liger-Kernel's fused
// linear cross entropy). The same values as the unfused pair up to the summation order of dw
// (16-bit inputs: logits and their gradient rounded to that dtype as the unfused ops round them).
// Backward scales the kept gradients by the upstream one: for 16-bit inputs with loss scaling
// (fp16), where the unscaled gradient may underflow, use the unfused pair.
// logit_bias (V), optional: a constant added to every row of logits (BART's final_logits_bias:
// a buffer, so it must not require a gradient), as add(linear(x, w), logit_bias) would.
Tensor linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& targets,
                            int64_t ignore_index = -100, int64_t block_rows = 0,
                            const Tensor& logit_bias = {});
// Rows per block linear_cross_entropy picks: about 16M logits (64 MiB in fp32), at least 1.
int64_t linear_cross_entropy_block_rows(int64_t rows, int64_t vocab);
// Binary cross entropy on logits (torch's BCEWithLogitsLoss, mean): logits and targets the same
// shape, targets floats in [0, 1], both on one device -> scalar mean of max(x, 0) - x y +
// log(1 + exp(-|x|)) (Backend::bce_with_logits_sum / _backward: the CPU's terms in double);
// targets get no gradient.
Tensor bce_with_logits(const Tensor& logits, const Tensor& targets);

// ---- decoding (inference: never recorded, no gradient) ----
// x (..., K) @ w^T + b -> (..., N) for decode rows (Backend::linear_rows): each row of x computed
// alone, so a row's result does not depend on the other rows (continuous batching). The result is
// in x's dtype. w fp32, or bf16 where the backend takes it (supports("linear_rows", bf16): read as
// it is, fp32 accumulation); x and b of any float dtype (widened: a few rows). Otherwise (an fp16
// weight, a backend without the bf16 kernel) ops::linear, whose sums may depend on the row count.
Tensor linear_rows(const Tensor& x, const Tensor& w, const Tensor& b = {});
// q (NH, n, hd) at positions p0 .. p0+n-1 against the caches (P, KV, hd) (rows 0 .. p0+n-1 valid)
// -> (n, NH, hd) in q's dtype, computed in fp32 (Backend::decode_attention: grouped-query heads,
// query i sees positions 0 .. p0+i). The caches fp32 or bf16 (both alike, contiguous): bf16 ones
// are read as they are where supports("decode_attention", bf16), else widened rows 0 .. p0+n-1.
// softcap > 0: scores soft-capped as in AttentionMask.
Tensor decode_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, int64_t p0,
                        float scale, float softcap = 0.0f);

// ---- in place, never recorded (optimizers, gradient bookkeeping) ----
void add_(const Tensor& dst, const Tensor& src, float alpha = 1.0f);  // dst += alpha * src
void mul_(const Tensor& dst, float s);
void fill_(const Tensor& dst, double value);

// ---- hooks ----
// Identity in forward; calls fn once, the first time a gradient flows back through it in a
// backward pass (module backward hooks hang on this).
Tensor backward_hook(const Tensor& x, std::function<void()> fn);

}  // namespace ds::ops

#pragma once
// Inference forward of models::GPT with a key/value cache: one decoder per sequence, no autograd.
//
//   serve::KVDecoder dec(model);
//   Tensor last = dec.forward(prompt_ids);  // prefill: one GEMM-path forward, fills the cache
//   Tensor next = dec.forward({token});     // decode: one position, attends to the cache
//   Tensor rows = KVDecoder::decode_batch({&a, &b, &c}, {ta, tb, tc});  // (3, V): one step for 3
//
// decode_batch is continuous batching's step: sequences of different lengths, each with its own
// cache and position, advance one token together. The linear layers (and the LM head) run once
// over the B rows, so the weights are read from memory once per step instead of once per
// sequence (decode on a CPU is bound by that read); embeddings, norms and attention stay per row
// or per sequence. Every decode row's dot products run in one fixed order whatever B is, so row b
// equals b's forward({token}) alone bit for bit (fp32 weights; other dtypes take ops::linear, whose
// sums may depend on B).
//
// The cache is an inference concern, kept out of the training code: the decoder reads the model's
// parameters by name (the Hugging Face names of gpt.h) and runs the same ops as the modules do, in
// both layouts (GPT-2; LLaMA family with grouped-query attention, q/k norm, rope scaling).
//
// Cache: per layer, K and V of every cached position, (T, KV, hd) position-major (KV = kv_heads,
// hd = head_dim: GQA stores the KV heads only, never the repeated ones), grown by doubling up to
// block_size. A chunk that starts at position 0 uses the fused causal-attention kernel of training
// (prefill logits then equal GPT::forward's exactly); a chunk after cached positions uses a small
// kernel here (one query row per head against the cache, fp32 accumulation).
//
// Threading: not thread-safe; one decoder per sequence, used by one thread at a time (decode_batch
// uses all of its decoders). The model must outlive it and must not be changed while it holds a
// cache (reset() after loading weights).
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ds/core/tensor.h"
#include "ds/models/gpt.h"

namespace ds::serve {

class KVDecoder {
 public:
  explicit KVDecoder(std::shared_ptr<models::GPT> model);

  // Runs ids at positions length() .. length() + n - 1, appends their keys and values to the cache
  // and returns fp32 logits (n, V) when all_logits, else (1, V) of the last position. Throws
  // "[generate] ..." when the cache would exceed block_size or ids is empty.
  Tensor forward(std::span<const int32_t> ids, bool all_logits = false);
  // One decode step of B sequences: ids[b] at position decoders[b]->length() for each b; returns
  // fp32 logits (B, V), row b equal to decoders[b]->forward({ids[b]}). The decoders must be
  // distinct and share one model. Throws "[generate] ..." as forward() does.
  static Tensor decode_batch(std::span<KVDecoder* const> decoders, std::span<const int32_t> ids);

  int64_t length() const { return len_; }  // cached positions
  int64_t capacity_limit() const;          // block_size
  // Forget positions >= n (n <= length()): reuse a common prompt prefix, or start over with 0.
  void truncate(int64_t n);
  void reset() { truncate(0); }
  // Bytes the cache holds now: 2 * L * capacity * KV * hd * 4.
  int64_t cache_bytes() const;

  const models::GPT& model() const { return *model_; }

 private:
  struct Layer {
    Tensor norm1_w, norm1_b, norm2_w, norm2_b;
    Tensor c_attn_w, c_attn_b, c_proj_w, c_proj_b;      // gpt2
    Tensor q_w, q_b, k_w, k_b, v_w, v_b, o_w, o_b;      // llama
    Tensor q_norm_w, k_norm_w;                          // qk_norm
    Tensor norm3_w, norm4_w;                            // sandwich_norm (GLM-4)
    Tensor fc_w, fc_b, mlp_proj_w, mlp_proj_b;          // gpt2 MLP
    Tensor gate_w, gate_b, up_w, up_b, down_w, down_b;  // SwiGLU
    std::vector<float> k, v;                            // (capacity, KV, hd)
  };
  // A sequence's rows in a step: n new tokens of dec at positions p0.., rows off.. of x.
  struct Chunk {
    KVDecoder* dec;
    int64_t p0, n, off;
  };
  void reserve(int64_t positions);
  // The forward of one step over every chunk's rows (this decoder's weights, each chunk's cache).
  Tensor run(std::span<const Chunk> seqs, std::span<const int32_t> ids, bool all_logits);
  Tensor attention(int64_t layer, const Tensor& x, std::span<const Chunk> seqs,
                   bool rows);  // (1, N, C) -> (1, N, C)
  Tensor attend(Layer& layer, Tensor q, Tensor k, Tensor v, int64_t p0, DType dtype);
  Tensor mlp(const Layer& layer, const Tensor& x, bool rows);

  std::shared_ptr<models::GPT> model_;
  models::GPTConfig cfg_;
  Tensor wte_, wpe_, normf_w_, normf_b_, head_w_;
  std::vector<Layer> layers_;
  std::vector<double> rope_inv_freq_;
  float rope_scale_ = 1.0f;
  int64_t len_ = 0, capacity_ = 0;
};

}  // namespace ds::serve

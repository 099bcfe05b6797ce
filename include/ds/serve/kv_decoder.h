#pragma once
// Inference forward of models::GPT with a key/value cache: one sequence, no autograd.
//
//   serve::KVDecoder dec(model);
//   Tensor last = dec.forward(prompt_ids);  // prefill: one GEMM-path forward, fills the cache
//   Tensor next = dec.forward({token});     // decode: one position, attends to the cache
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
// Threading: not thread-safe; one decoder per sequence, used by one thread at a time. The model
// must outlive it and must not be changed while it holds a cache (reset() after loading weights).
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
    Tensor fc_w, fc_b, mlp_proj_w, mlp_proj_b;          // gpt2 MLP
    Tensor gate_w, gate_b, up_w, up_b, down_w, down_b;  // SwiGLU
    std::vector<float> k, v;                            // (capacity, KV, hd)
  };
  void reserve(int64_t positions);
  Tensor attention(Layer& layer, const Tensor& x, int64_t p0);  // (1, n, C) -> (1, n, C)
  Tensor mlp(const Layer& layer, const Tensor& x);

  std::shared_ptr<models::GPT> model_;
  models::GPTConfig cfg_;
  Tensor wte_, wpe_, normf_w_, normf_b_, head_w_;
  std::vector<Layer> layers_;
  std::vector<double> rope_inv_freq_;
  float rope_scale_ = 1.0f;
  int64_t len_ = 0, capacity_ = 0;
};

}  // namespace ds::serve

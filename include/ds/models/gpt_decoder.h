#pragma once
// models::GPT's incremental decoder (models::IncrementalDecoder): the inference forward of every
// decoder-only family (GPT-2, LLaMA, Mistral, Qwen2/3, GLM, GLM-4, ChatGLM) with a key/value cache.
// Made by the registry (models::make_decoder, family.h) or directly:
//
//   models::GPTDecoder dec(model);
//
// It reads the model's parameters by name (the Hugging Face names of gpt.h) and runs the ops the
// modules run, in both layouts (GPT-2; the LLaMA family with grouped-query attention, q/k norm,
// partial or interleaved rotary, rope scaling, GLM-4's sandwich norms), on the model's device.
//
// Cache: per layer, K and V of every cached position, (capacity, KV, hd) position-major fp32
// tensors on the model's device (KV = kv_heads, hd = head_dim: GQA stores the KV heads only),
// grown by doubling up to block_size. A chunk that starts at position 0 runs the fused causal
// attention of training (prefill logits equal GPT::forward's exactly); a chunk after cached
// positions runs ops::decode_attention (Backend::decode_attention). Decode rows (one token per
// sequence, decode_batch) take ops::linear_rows (Backend::linear_rows): each row computed as it
// would be alone, so batched decoding equals one-at-a-time decoding bit for bit with fp32 weights
// (16-bit weights take ops::linear, whose sums may depend on the batch).
//
// Threading and lifetime: as models::IncrementalDecoder.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ds/core/tensor.h"
#include "ds/models/gpt.h"
#include "ds/models/incremental_decoder.h"

namespace ds::models {

class GPTDecoder final : public IncrementalDecoder {
 public:
  explicit GPTDecoder(std::shared_ptr<const GPT> model);

  Tensor forward(std::span<const int32_t> ids, bool all_logits = false) override;
  Tensor decode_batch(std::span<IncrementalDecoder* const> decoders,
                      std::span<const int32_t> ids) override;
  int64_t length() const override { return len_; }
  int64_t capacity_limit() const override;  // block_size
  int64_t vocab_size() const override;
  void truncate(int64_t n) override;
  // 2 * L * capacity * KV * hd * 4 bytes.
  int64_t cache_bytes() const override;
  std::unique_ptr<IncrementalDecoder> fresh() const override;

  const GPT& model() const;

 private:
  struct Weights;  // the model's tensors by role, shared by every decoder of one model
  // A sequence's rows in a step: n new tokens of dec at positions p0.., rows off.. of x.
  struct Chunk {
    GPTDecoder* dec;
    int64_t p0, n, off;
  };
  explicit GPTDecoder(std::shared_ptr<const Weights> weights);
  void reserve(int64_t positions);
  // The forward of one step over every chunk's rows (shared weights, each chunk's cache).
  Tensor run(std::span<const Chunk> seqs, std::span<const int32_t> ids, bool all_logits);
  Tensor attention(int64_t layer, const Tensor& x, std::span<const Chunk> seqs,
                   bool rows) const;  // (1, N, C) -> (1, N, C)
  // q (1, NH, n, hd), k and v (1, KV, n, hd) of this sequence's n new rows at p0 -> (1, n, NH*hd)
  Tensor attend(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t p0,
                DType dtype);
  Tensor mlp(int64_t layer, const Tensor& x, bool rows) const;

  std::shared_ptr<const Weights> weights_;
  std::vector<Tensor> k_, v_;  // per layer: (capacity, KV, hd) fp32 on the model's device
  int64_t len_ = 0, capacity_ = 0;
};

// A GPTDecoder over model, as an IncrementalDecoder (the registry's default Family::make_decoder).
std::unique_ptr<IncrementalDecoder> make_gpt_decoder(std::shared_ptr<const GPT> model);

}  // namespace ds::models

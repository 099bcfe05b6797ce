#pragma once
// models::GPT's incremental decoder (models::IncrementalDecoder): the inference forward of every
// decoder-only family (GPT-2, LLaMA, Mistral, Qwen2/3, GLM, GLM-4, ChatGLM, Phi-3) with a key/value
// cache.
// Made by the registry (models::make_decoder, family.h) or directly:
//
//   models::GPTDecoder dec(model);
//
// It owns the caches and the step (which rows belong to which sequence, at which positions) and
// knows no layout: the model's blocks do each family's arithmetic (nn::Block::decode and the
// attention and MLP classes, nn/decode.h), the model its embedding and head (GPT::decode_embed,
// decode_head), on the model's device. The model must be whole on this rank (no pipeline stage,
// no tensor parallelism).
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
// LongRoPE (Phi-3): a step that takes the sequence past original_max_position recomputes it from
// position 0 on the long table, as Phi3ForCausalLM's generate() drops its cache there: the cached
// keys were rotated on the short table. The decoder keeps its cached tokens for that.
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
  struct Weights;  // the model and its device, shared by every decoder of one model
  // A sequence's rows in a step: n new tokens of dec at positions p0.., rows off.. of x.
  struct Chunk {
    GPTDecoder* dec;
    int64_t p0, n, off;
  };
  explicit GPTDecoder(std::shared_ptr<const Weights> weights);
  void reserve(int64_t positions);
  // Whether n tokens after p0 cached ones take the sequence from LongRoPE's short table to its
  // long one (the cache then holds keys of the wrong table).
  bool switches_rope_table(int64_t p0, int64_t n) const;
  // forward() from position 0 over the cached tokens and ids: logits of ids' positions.
  Tensor recompute(std::span<const int32_t> ids, bool all_logits);
  // The forward of one step over every chunk's rows (shared weights, each chunk's cache).
  Tensor run(std::span<const Chunk> seqs, std::span<const int32_t> ids, bool all_logits);

  std::shared_ptr<const Weights> weights_;
  std::vector<Tensor> k_, v_;  // per layer: (capacity, KV, hd) fp32 on the model's device
  std::vector<int32_t> ids_;   // (len_) the cached positions' tokens
  int64_t len_ = 0, capacity_ = 0;
};

// A GPTDecoder over model, as an IncrementalDecoder (the registry's default Family::make_decoder).
std::unique_ptr<IncrementalDecoder> make_gpt_decoder(std::shared_ptr<const GPT> model);

}  // namespace ds::models

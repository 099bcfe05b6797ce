#pragma once
// The inference seam between models::GPTDecoder and the layers: one step of incremental decoding
// through a layer, for several sequences at once, each against its own key/value cache. The
// decoder owns the caches and the step (which rows belong to which sequence, at which positions);
// each family's layers (nn::Block::decode, the attention and MLP classes of layers.h) own the
// arithmetic, so a new family adds its block's decode and leaves the decoder alone.
//
// Decode runs under no_grad and calls the layers' forward() or ops directly, without module hooks:
// the model is whole on this rank (no ZeRO-3 pieces, no tensor parallelism; GPTDecoder checks).
#include <cstdint>
#include <span>
#include <vector>

#include "ds/core/tensor.h"

namespace ds::nn {

// One sequence's rows in a step through one layer: n new tokens at positions p0 .. p0+n-1, rows
// off .. off+n-1 of the step's (1, N, C) input, and this layer's key/value cache of the sequence:
// k_cache and v_cache (capacity, KV, hd) fp32, position-major, capacity >= p0 + n, rows 0 .. p0-1
// holding the cached positions (the layer writes rows p0 .. p0+n-1). Handles: views of the
// decoder's cache tensors, whose storage the layer writes.
struct DecodeSeq {
  int64_t p0 = 0, n = 0, off = 0;
  Tensor k_cache, v_cache;
};

// A step through one layer: every sequence's rows, in row order. rows = true for decode rows (one
// token per sequence, several sequences): every Linear then takes ops::linear_rows, whose rows
// do not depend on each other, so batched decoding equals one-at-a-time decoding bit for bit.
struct DecodeStep {
  std::span<const DecodeSeq> seqs;
  bool rows = false;
};

// Rows of seq in t (1, N, F) as a contiguous (1, n, F) tensor; t itself when one sequence owns
// every row.
Tensor decode_rows(const Tensor& t, const DecodeStep& step, const DecodeSeq& seq);

// (1, n, F) per sequence, in step order -> (1, N, F).
Tensor join_decode_rows(const std::vector<Tensor>& ys);

// One sequence's causal attention for its n new rows at positions p0..: q (1, NH, n, hd), k and v
// (1, KV, n, hd) (rotary embedding and q/k norms applied; NH % KV == 0, grouped-query attention
// when KV < NH). Writes k and v into the cache rows p0 .. p0+n-1, then attends: a chunk at
// position 0 runs the fused causal attention of training (prefill equals the module's forward
// exactly), a later chunk ops::decode_attention against the cache. Returns (1, n, NH*hd) in dtype.
// scale: of the scores (0 = 1/sqrt(hd)); window > 0: each row at position p sees cached positions
// p - window < j <= p only (a sliding-window layer; the cache still holds every position);
// softcap > 0: the scores soft-capped (ops::AttentionMask::softcap).
Tensor attend_cached(const Tensor& q, const Tensor& k, const Tensor& v, const DecodeSeq& seq,
                     DType dtype, float scale = 0.0f, int64_t window = 0, float softcap = 0.0f);

}  // namespace ds::nn

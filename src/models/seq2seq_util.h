#pragma once
// Small tensor helpers shared by the sequence-to-sequence families (seq2seq.cpp: BART /
// BlenderBot, seq2seq_t5.cpp: T5) and beam search (seq2seq_beam.cpp). Internal to src/models.
#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ds/core/error.h"
#include "ds/core/tensor.h"
#include "ds/nn/layers.h"
#include "ds/ops/ops.h"

namespace ds::models::detail {

// transformers' ACT2FN for the names the seq2seq configs use: "gelu" (exact, erf), "gelu_new" /
// "gelu_pytorch_tanh" (tanh approximation), "silu" / "swish", else "relu".
inline Tensor activate(const Tensor& x, const std::string& act) {
  if (act == "gelu") return ops::gelu_erf(x);
  if (act == "gelu_new" || act == "gelu_pytorch_tanh") return ops::gelu(x);
  if (act == "silu" || act == "swish") return ops::silu(x);
  // relu(x) = max(x, 0) over a trailing pair, the gradient going to the larger (x where x > 0).
  Shape s = x.shape();
  s.push_back(1);
  Tensor x1 = ops::reshape(x, s);
  Tensor z = Tensor::zeros(s, x.dtype(), x.device());
  return ops::max(ops::concat({x1, z}, -1), -1);
}

// Additive attention mask (B, 1, Tq, Tk) in `like`'s dtype and device: -1e30 on padded keys
// (mask.key_lengths) and, when causal, future keys (query i sees keys j <= i + Tk - Tq); an
// undefined tensor when nothing is masked.
inline Tensor additive_mask(const ops::AttentionMask& mask, int64_t B, int64_t Tq, int64_t Tk,
                            const Tensor& like) {
  std::vector<float> bias(static_cast<size_t>(B * Tq * Tk), 0.0f);
  bool any = false;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Tq; ++i)
      for (int64_t j = 0; j < Tk; ++j) {
        const bool pad = !mask.key_lengths.empty() && j >= mask.key_lengths[static_cast<size_t>(b)];
        const bool future = mask.causal && j > i + Tk - Tq;
        if (pad || future) {
          bias[static_cast<size_t>((b * Tq + i) * Tk + j)] = -1e30f;
          any = true;
        }
      }
  if (!any) return Tensor();
  return Tensor::from_data(bias, {B, 1, Tq, Tk}).to(like.device()).to(like.dtype());
}

// l(x), or per row (ops::linear_rows: a row's result does not depend on the other rows) when
// row_kernel and the weights allow it (no LoRA; x and the weights both fp32 or both bf16: a bf16
// model's decode step reads its bf16 weights as they are, fp32 accumulation, bf16 result).
inline Tensor project(nn::Linear& l, const Tensor& x, bool row_kernel) {
  const DType wd = l.weight().dtype();
  if (row_kernel && !l.has_lora() && x.dtype() == wd && (wd == DType::f32 || wd == DType::bf16))
    return ops::linear_rows(x, l.weight(), l.bias());
  return l(x);
}

// Rows [off, off + n) of t along dim 0 (t itself when that is all of it).
inline Tensor rows_of(const Tensor& t, int64_t off, int64_t n) {
  return off == 0 && n == t.size(0) ? t : ops::contiguous(ops::slice(t, 0, off, off + n));
}

// The positions P a group's self-attention cache (rows, NH, P, hd) holds for its step at g.pos:
// the cache's own when they suffice, else twice as many (at least 64, at least g.pos + 1, at most
// g.max_positions), so that a generation of T positions reallocates log2(T) times and holds at
// most max_positions. cache: the group's layer cache's self_k (undefined before the first step).
template <class Group>
int64_t self_cache_capacity(const Group& g, const Tensor& cache) {
  const int64_t need = g.pos + 1, have = cache.defined() ? cache.size(2) : 0;
  if (need <= have) return have;
  DS_CHECK(need <= g.max_positions,
           "[seq2seq] target position {} is past the cache's limit of {} positions", g.pos,
           g.max_positions);
  return std::min(g.max_positions, std::max({need, 2 * have, int64_t{64}}));
}

// cache (R, NH, P0, hd) with its first `keep` positions, in a zeroed (R, NH, P, hd) of like's
// dtype and device (like: the rows to be written, (R, NH, 1, hd)).
inline Tensor regrow_cache(const Tensor& cache, const Tensor& like, int64_t keep, int64_t P) {
  Tensor grown =
      Tensor::zeros({like.size(0), like.size(1), P, like.size(3)}, like.dtype(), like.device());
  if (cache.defined() && keep > 0)
    ops::slice(grown, 2, 0, keep).copy_from(ops::slice(cache, 2, 0, keep));
  return grown;
}

// A cached decoder step's attention, group by group (Seq2Seq::decode_step: groups of consecutive
// rows, each with its caches): q (N, NH, 1, hd), the groups' rows in order. Self-attention (k, v
// (N, NH, 1, hd) defined): each group's rows of k and v are written at position g.pos of its
// layer-`li` cache (grown by self_cache_capacity when full), which the group attends to whole,
// with key lengths g.pos + 1 (the rows past them are not read). Cross-attention (k undefined):
// the group attends to its source, projected by kv_of(memory) -> (keys, values) into the cache on
// its first step, masked by its cross_lengths. attend(group index, q rows, keys, values, mask) ->
// (rows, NH, 1, hd). -> (N, NH, 1, hd)
template <class Group, class KV, class F>
Tensor attend_groups(const Tensor& q, const Tensor& k, const Tensor& v,
                     std::span<const Group> groups, size_t li, KV&& kv_of, F&& attend) {
  std::vector<Tensor> out;
  int64_t off = 0;
  for (size_t i = 0; i < groups.size(); ++i) {
    const Group& g = groups[i];
    auto& cache = (*g.caches)[li];
    ops::AttentionMask mask;  // the one query is the newest position: it sees every key
    mask.causal = false;
    const Tensor qg = rows_of(q, off, g.rows);
    if (k.defined()) {
      const int64_t P = self_cache_capacity(g, cache.self_k);
      for (auto [c, t] : {std::pair{&cache.self_k, &k}, std::pair{&cache.self_v, &v}}) {
        const Tensor rows = rows_of(*t, off, g.rows);  // (rows, NH, 1, hd)
        if (!c->defined() || c->size(2) != P) *c = regrow_cache(*c, rows, g.pos, P);
        ops::slice(*c, 2, g.pos, g.pos + 1).copy_from(rows);
      }
      mask.key_lengths.assign(static_cast<size_t>(g.rows), g.pos + 1);
      out.push_back(attend(i, qg, cache.self_k, cache.self_v, mask));
    } else {
      if (!cache.cross_k.defined()) std::tie(cache.cross_k, cache.cross_v) = kv_of(g.memory);
      mask.key_lengths = g.cross_lengths;
      out.push_back(attend(i, qg, cache.cross_k, cache.cross_v, mask));
    }
    off += g.rows;
  }
  return out.size() == 1 ? out[0] : ops::concat(out, 0);
}

}  // namespace ds::models::detail

// Helpers of the layers' decode steps (ds/nn/decode.h): per-sequence rows and cached attention.
#include "ds/nn/decode.h"

#include <cmath>

#include "ds/core/error.h"
#include "ds/ops/ops.h"

namespace ds::nn {

Tensor decode_rows(const Tensor& t, const DecodeStep& step, const DecodeSeq& seq) {
  if (step.seqs.size() == 1) return t;
  return ops::contiguous(ops::slice(t, 1, seq.off, seq.off + seq.n));
}

Tensor join_decode_rows(const std::vector<Tensor>& ys) {
  DS_CHECK(!ys.empty(), "[generate] a decode step needs at least one sequence");
  return ys.size() == 1 ? ys[0] : ops::concat(ys, 1);
}

Tensor attend_cached(const Tensor& q, const Tensor& k, const Tensor& v, const DecodeSeq& seq,
                     DType dtype) {
  const int64_t NH = q.size(1), n = q.size(2), hd = q.size(3), KV = k.size(1), p0 = seq.p0;
  DS_CHECK(q.dim() == 4 && k.dim() == 4 && k.shape() == v.shape() && k.size(2) == n &&
               k.size(3) == hd && KV > 0 && NH % KV == 0 && seq.k_cache.dim() == 3 &&
               seq.k_cache.size(0) >= p0 + n && seq.k_cache.size(1) == KV,
           "[generate] cached attention: q {} (1, NH, n, hd), k and v {} (1, KV, n, hd), cache {} "
           "(capacity, KV, hd) at position {}",
           shape_str(q.shape()), shape_str(k.shape()), shape_str(seq.k_cache.shape()), p0);
  // (1, KV, n, hd) -> rows p0 .. p0+n-1 of (capacity, KV, hd)
  ops::slice(seq.k_cache, 0, p0, p0 + n)
      .copy_from(ops::transpose(ops::reshape(k, {KV, n, hd}), 0, 1));
  ops::slice(seq.v_cache, 0, p0, p0 + n)
      .copy_from(ops::transpose(ops::reshape(v, {KV, n, hd}), 0, 1));
  if (p0 == 0) {
    // Prefill: the fused kernel of training, with K/V repeated to NH heads as the module does.
    auto repeat_kv = [&](const Tensor& t) {
      if (KV == NH) return t;
      Tensor e = ops::broadcast_to(ops::reshape(t, {1, KV, 1, n, hd}), {1, KV, NH / KV, n, hd});
      return ops::reshape(ops::contiguous(e), {1, NH, n, hd});
    };
    const Tensor y = ops::causal_attention(q, repeat_kv(k), repeat_kv(v));  // (1, NH, n, hd)
    return ops::reshape(ops::contiguous(ops::transpose(y, 1, 2)), {1, n, NH * hd});
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  Tensor qf = q.dtype() == DType::f32 ? q : ops::cast(q, DType::f32);
  if (!qf.is_contiguous()) qf = ops::contiguous(qf);
  const Tensor y = ops::decode_attention(ops::reshape(qf, {NH, n, hd}), seq.k_cache, seq.v_cache,
                                         p0, scale);  // (n, NH, hd)
  return ops::reshape(dtype == DType::f32 ? y : ops::cast(y, dtype), {1, n, NH * hd});
}

}  // namespace ds::nn

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

namespace {

// Rows p0 .. p0+n-1 of a sliding-window layer against the cache: each row at position p attends
// to the cached positions [p - window + 1, p] (a contiguous slice of the position-major cache),
// one row at a time since the rows' windows start at different positions. qf (NH, n, hd) fp32.
Tensor attend_window_rows(const Tensor& qf, const DecodeSeq& seq, float scale, int64_t window,
                          float softcap) {
  const int64_t NH = qf.size(0), n = qf.size(1), hd = qf.size(2);
  std::vector<Tensor> rows;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = seq.p0 + i, start = std::max<int64_t>(0, p - window + 1);
    const Tensor qi = ops::contiguous(ops::slice(qf, 1, i, i + 1));  // (NH, 1, hd)
    rows.push_back(ops::decode_attention(qi, ops::slice(seq.k_cache, 0, start, p + 1),
                                         ops::slice(seq.v_cache, 0, start, p + 1), p - start, scale,
                                         softcap));  // (1, NH, hd)
  }
  return rows.size() == 1 ? rows[0] : ops::reshape(ops::concat(rows, 0), {n, NH, hd});
}

}  // namespace

Tensor attend_cached(const Tensor& q, const Tensor& k, const Tensor& v, const DecodeSeq& seq,
                     DType dtype, float scale_in, int64_t window, float softcap) {
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
    ops::AttentionMask mask;
    mask.window = window;
    mask.softcap = softcap;
    const Tensor y =
        ops::attention(q, repeat_kv(k), repeat_kv(v), mask, scale_in);  // (1, NH, n, hd)
    return ops::reshape(ops::contiguous(ops::transpose(y, 1, 2)), {1, n, NH * hd});
  }
  const float scale = scale_in > 0.0f ? scale_in : 1.0f / std::sqrt(static_cast<float>(hd));
  Tensor qf = q.dtype() == DType::f32 ? q : ops::cast(q, DType::f32);
  if (!qf.is_contiguous()) qf = ops::contiguous(qf);
  qf = ops::reshape(qf, {NH, n, hd});
  // Every row's window holds all its earlier positions until p0 + n exceeds the window.
  const Tensor y = window > 0 && p0 + n > window
                       ? attend_window_rows(qf, seq, scale, window, softcap)
                       : ops::decode_attention(qf, seq.k_cache, seq.v_cache, p0, scale,
                                               softcap);  // (n, NH, hd)
  return ops::reshape(dtype == DType::f32 ? y : ops::cast(y, dtype), {1, n, NH * hd});
}

}  // namespace ds::nn

#pragma once
// The attention kernels' argument contract (Backend::attention_forward/backward, backend.h), checked
// the same way by every backend before it launches anything. Internal header.
#include <span>

#include "ds/core/error.h"
#include "ds/core/tensor.h"

namespace ds::backend {

// q (B, NH, Tq, hd), k and v (B, NH, Tk, hd), contiguous fp32 (any float dtype with
// any_float: a backend whose kernels take 16-bit inputs); Tq <= Tk when causal; key_lens empty or
// one length in [1, Tk] per batch row; window >= 0, a window > 0 only causal and without key_lens.
// `who` prefixes the message ("cpu:attention").
inline void check_attention_args(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                 std::span<const int64_t> key_lens, int64_t window,
                                 const std::string& who, bool any_float = false) {
  for (const Tensor* t : {&q, &k, &v})
    DS_CHECK((any_float ? is_floating(t->dtype()) : t->dtype() == DType::f32) && t->is_contiguous(),
             "[{}] kernel takes contiguous {}, got {}{}", who,
             any_float ? "fp32, bf16 or fp16" : "fp32", dtype_name(t->dtype()),
             t->is_contiguous() ? "" : " (strided)");
  DS_CHECK(q.dim() == 4 && k.dim() == 4 && k.shape() == v.shape() && k.size(0) == q.size(0) &&
               k.size(1) == q.size(1) && k.size(3) == q.size(3),
           "[{}] q must be (B, NH, Tq, hd) and k, v (B, NH, Tk, hd), got {}, {}, {}", who,
           shape_str(q.shape()), shape_str(k.shape()), shape_str(v.shape()));
  DS_CHECK(!causal || q.size(2) <= k.size(2), "[{}] causal attention needs Tq {} <= Tk {}", who,
           q.size(2), k.size(2));
  DS_CHECK(key_lens.empty() || static_cast<int64_t>(key_lens.size()) == q.size(0),
           "[{}] {} key lengths for batch {}", who, key_lens.size(), q.size(0));
  DS_CHECK(window >= 0 && (window == 0 || (causal && key_lens.empty())),
           "[{}] a sliding window ({}) must be >= 0 and needs causal attention without key lengths",
           who, window);
  for (int64_t len : key_lens)
    DS_CHECK(len >= 1 && len <= k.size(2), "[{}] key length {} outside [1, Tk {}]", who, len,
             k.size(2));
}

}  // namespace ds::backend

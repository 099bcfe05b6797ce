#include "ds/nn/expert_lora.h"

#include "ds/core/error.h"
#include "ds/ops/ops.h"

namespace ds::nn {

ExpertLora::ExpertLora(int64_t experts, int64_t out, int64_t in, int64_t r, float scaling)
    : Module("ExpertLora"), E_(experts), r_(r), scaling_(scaling) {
  DS_CHECK(experts > 0 && out > 0 && in > 0 && r > 0,
           "[lora] expert LoRA: experts {}, out {}, in {}, r {} must be positive", experts, out, in,
           r);
  a_ = register_parameter("lora_A.weight", Tensor::zeros({r * experts, in}));
  b_ = register_parameter("lora_B.weight", Tensor::zeros({out, r * experts}));
}

Tensor expert_lora_delta(const Tensor& a, const Tensor& b, int64_t experts) {
  DS_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(0) == b.size(1) && a.size(0) % experts == 0,
           "[lora] expert LoRA factors A {} and B {} do not fit {} experts (A (r E, in), B (out, "
           "r E))",
           shape_str(a.shape()), shape_str(b.shape()), experts);
  const int64_t r = a.size(0) / experts, out = b.size(0), in = a.size(1);
  const Tensor a32 = a.dtype() == DType::f32 ? a : ops::cast(a, DType::f32);
  const Tensor b32 = b.dtype() == DType::f32 ? b : ops::cast(b, DType::f32);
  const Tensor ae = ops::reshape(a32, {experts, r, in});  // (E, r, in)
  // (out, r E) -> (out, r, E) -> (E, out, r): column j of B belongs to expert j % E
  const Tensor be = ops::contiguous(ops::permute(ops::reshape(b32, {out, r, experts}), {2, 0, 1}));
  return ops::matmul(be, ae);  // (E, out, in)
}

Tensor ExpertLora::forward(const Tensor& w) {
  DS_CHECK(w.dim() == 3 && w.size(0) == E_ && w.size(1) == b_.size(0) && w.size(2) == a_.size(1),
           "[lora] expert weight {} does not match its LoRA (experts {}, A {}, B {})",
           shape_str(w.shape()), E_, shape_str(a_.shape()), shape_str(b_.shape()));
  Tensor delta = ops::mul(expert_lora_delta(a_, b_, E_), scaling_);
  if (delta.dtype() != w.dtype()) delta = ops::cast(delta, w.dtype());
  return ops::add(w, delta);
}

}  // namespace ds::nn

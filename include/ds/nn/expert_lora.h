#pragma once
// LoRA on a stacked expert weight (nn::MoEExperts' gate_up_proj (E, 2I, C) or down_proj (E, C, I)),
// laid out as peft 0.21's ParamWrapper lays it out for `target_parameters` on transformers 5's
// (experts, out, in) parameters (peft/tuners/lora/layer.py, ParamWrapper.get_delta_weight with
// _did_swap_in_out_features):
//
//   lora_A.weight  (r E, in)    expert e's A is rows [e r, e r + r): A.reshape(E, r, in)[e]
//   lora_B.weight  (out, r E)   expert e's B is columns e, E + e, 2E + e, ...:
//                               B.reshape(out, r, E)[:, :, e]
//   delta[e] = B_e A_e (out, in);  W_eff = W + scaling * delta   (E, out, in)
//
// (einsum("o r e, e r i -> e o i", B.reshape(out, r, E), A.reshape(E, r, in))). The two factors
// interleave the experts differently, so one expert's factors are not one slice of B: expert
// parallelism, which keeps a slice of the experts per rank, is refused with LoRA on experts.
//
// The module's forward takes the base weight and returns W_eff, differentiable in A and B only
// (W is frozen): MoEExperts runs its grouped GEMMs on W_eff. Calling it through Module::operator()
// runs its hooks, so ZeRO-3 gathers A and B around it as around any module. Cost per forward:
// one (E, out, in) W_eff per adapted weight, kept for the backward, and in the backward the dense
// dW_eff (E, out, in) that grouped_linear computes anyway, reduced to dA and dB by two batched
// GEMMs. PEFT's ParamWrapper has no dropout (it refuses lora_dropout != 0); neither has this.
//
// Parameter names: the module is registered under the weight's own name ("gate_up_proj"), its two
// parameters are "lora_A.weight" and "lora_B.weight", so the model lists
// "layers.0.mlp.experts.gate_up_proj.lora_A.weight" (nn::is_lora_parameter holds for it).
//
// Threading: a module; one forward at a time.
#include <cstdint>

#include "ds/core/tensor.h"
#include "ds/nn/module.h"

namespace ds::nn {

class ExpertLora : public Module {
 public:
  // Zero-filled fp32 A (r E, in) and B (out, r E); apply_lora initialises A.
  ExpertLora(int64_t experts, int64_t out, int64_t in, int64_t r, float scaling);
  Tensor forward(const Tensor& w) override;    // w (E, out, in) -> W_eff (E, out, in), w's dtype
  const Tensor& lora_A() const { return a_; }  // (r E, in)
  const Tensor& lora_B() const { return b_; }  // (out, r E)
  int64_t rank() const { return r_; }
  float scaling() const { return scaling_; }

 private:
  int64_t E_, r_;
  float scaling_;
  Tensor a_, b_;
};

// delta (E, out, in), fp32, of factors A (r E, in) and B (out, r E) for E experts, unscaled;
// differentiable. Throws "[lora] ..." when the shapes do not fit E.
Tensor expert_lora_delta(const Tensor& a, const Tensor& b, int64_t experts);

}  // namespace ds::nn

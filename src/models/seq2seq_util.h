#pragma once
// Small tensor helpers shared by the sequence-to-sequence families (seq2seq.cpp: BART /
// BlenderBot, seq2seq_t5.cpp: T5) and beam search (seq2seq_beam.cpp). Internal to src/models.
#include <string>
#include <vector>

#include "ds/core/tensor.h"
#include "ds/ops/ops.h"

namespace ds::models::detail {

// A host tensor on `device` (the same tensor when device is the CPU).
inline Tensor on_device(const Tensor& host, Device device) {
  if (device.is_cpu()) return host;
  Tensor t = Tensor::empty(host.shape(), host.dtype(), device);
  t.copy_from(host);
  return t;
}

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
  return on_device(Tensor::from_data(bias, {B, 1, Tq, Tk}), like.device()).to(like.dtype());
}

}  // namespace ds::models::detail

#pragma once
// A micro-batch's tensors by role: what the engine hands a model's loss (runtime::LossFn,
// nn::Module::loss(const Batch&)). Decoder LMs use input_ids and labels (the data's shifted
// targets); encoder classifiers add attention_mask and token_type_ids (labels (B) per example);
// encoder-decoders add attention_mask (of the source) and, optionally, decoder_input_ids (else
// the labels shifted right). Undefined tensors are absent inputs. The data files do not change:
// each trainer fills the fields its set holds.
//
// Shapes: input_ids, attention_mask, token_type_ids (B, S) int; labels (B, T) int with -100
// ignored (decoders, encoder-decoders) or (B) (classifiers); decoder_input_ids (B, T) int.
// Ownership: tensors are shared handles (no copy).
#include "ds/core/tensor.h"

namespace ds::nn {

// Every field has a default (undefined) so that designated initializers may name only the inputs
// a batch has.
struct Batch {
  Tensor input_ids{};
  Tensor labels{};
  Tensor attention_mask{};
  Tensor token_type_ids{};
  Tensor decoder_input_ids{};
};

}  // namespace ds::nn

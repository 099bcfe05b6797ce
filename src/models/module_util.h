#pragma once
// Module-building helpers shared by the encoder models (encoder.cpp, deberta.cpp). Internal to
// src/models: not a public header.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "ds/core/error.h"
#include "ds/core/tensor.h"
#include "ds/models/gpt.h"  // ParamInit, GPT::init_values
#include "ds/nn/module.h"

namespace ds::models::detail {

// A module that only names its children (transformers' attention / output / intermediate
// wrappers); never called itself: the parameters' own modules run their hooks.
class Container : public nn::Module {
 public:
  explicit Container(std::string type) : Module(std::move(type)) {}
  template <class M>
  std::shared_ptr<M> add(const std::string& name, std::shared_ptr<M> m) {
    return register_module(name, std::move(m));
  }
};

// t is a (B, T) int32/int64 tensor (any (B, T) when B < 0); errors start with "[<model>]".
inline void check_ids(const Tensor& t, const char* model, const char* what, int64_t B, int64_t T) {
  DS_CHECK(t.defined() && t.dim() == 2 && (t.dtype() == DType::i32 || t.dtype() == DType::i64),
           "[{}] {} must be a (B, T) int32/int64 tensor, got {} {}", model, what,
           t.defined() ? shape_str(t.shape()) : "undefined",
           t.defined() ? dtype_name(t.dtype()) : "");
  DS_CHECK(B < 0 || (t.size(0) == B && t.size(1) == T),
           "[{}] {} is {}, input_ids ({}, {}): they must have the same shape", model, what,
           shape_str(t.shape()), B, T);
}

// Elements [begin, begin + count) of parameter `index` (named `name`) initialised as transformers'
// BERT-style _init_weights does: LayerNorm weights 1, biases 0, everything else normal(0, range)
// from the counter-based draws of (seed, index), so any piece is computed alone.
inline void init_encoder_values(const std::string& name, float range, uint64_t seed, size_t index,
                                int64_t begin, int64_t count, float* out) {
  ParamInit init{ParamInit::normal, range};
  if (name.find("LayerNorm.") != std::string::npos && name.ends_with(".weight"))
    init.kind = ParamInit::ones;
  else if (name.ends_with(".bias"))
    init.kind = ParamInit::zeros;
  GPT::init_values(init, seed, index, begin, count, out);
}

// Zeroes the flat elements [row0, row1) that fall in the piece [begin, begin + count) held in out
// (an Embedding's padding_idx row).
inline void zero_span(int64_t row0, int64_t row1, int64_t begin, int64_t count, float* out) {
  for (int64_t i = std::max(begin, row0); i < std::min(begin + count, row1); ++i)
    out[i - begin] = 0.0f;
}

}  // namespace ds::models::detail

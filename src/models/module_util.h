#pragma once
// Module-building helpers shared by the encoder models (encoder.cpp, deberta.cpp). Internal to
// src/models: not a public header.
#include <cstdint>
#include <memory>
#include <string>

#include "ds/core/error.h"
#include "ds/core/tensor.h"
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

// A host tensor (int ids or fp32 values) on `device`.
inline Tensor on_device(const Tensor& host, Device device) {
  if (device.is_cpu()) return host;
  Tensor t = Tensor::empty(host.shape(), host.dtype(), device);
  t.copy_from(host);
  return t;
}

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

}  // namespace ds::models::detail

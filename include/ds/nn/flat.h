#pragma once
// Flat parameter and gradient buffers (llm.c's one allocation with an offset table).
//
// flatten_parameters() copies every parameter of a module (in named_parameters() order) into one
// contiguous buffer and makes each parameter a view at its offset; gradients get the same layout in
// a second buffer, and each parameter's .grad becomes a view into it. Zeroing all gradients is then
// one memset, a ZeRO partition is a range of offsets, and a checkpoint is one write.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ds/core/tensor.h"
#include "ds/nn/module.h"

namespace ds::nn {

struct FlatEntry {
  std::string name;
  Shape shape;
  int64_t offset = 0;  // elements from the start of the flat buffer
  int64_t numel = 0;
};

struct FlatParameters {
  Tensor params;  // (padded_numel,) in `dtype`
  Tensor grads;   // (padded_numel,) in `grad_dtype`
  std::vector<FlatEntry> entries;
  int64_t numel = 0;         // sum of parameter sizes
  int64_t padded_numel = 0;  // numel rounded up to a multiple of `multiple_of`
};

// multiple_of: the padded size is a multiple of it (ZeRO passes ranks x alignment). The padding is
// zero-filled. Parameters keep their TensorImpl (hooks, names), only their storage moves.
// with_grads = false leaves gradients alone (ZeRO-2 keeps only a partition of them; `grads` is then
// undefined).
FlatParameters flatten_parameters(Module& module, DType dtype = DType::f32,
                                  DType grad_dtype = DType::f32, int64_t multiple_of = 1,
                                  bool with_grads = true);
// The same over a chosen list of (name, parameter), in that order: ZeRO flattens only the
// parameters that require a gradient, leaving frozen ones (LoRA's base, nn/lora.h) where they are.
// `on`: the device the buffers go to (default: the parameters'); a parameter on another device is
// converted to `dtype` there and copied over, so that only the flat buffers are ever allocated on
// `on` (ZeRO's device runs keep their fp32 copy in host memory this way).
FlatParameters flatten_parameters(const std::vector<std::pair<std::string, Tensor>>& named,
                                  DType dtype = DType::f32, DType grad_dtype = DType::f32,
                                  int64_t multiple_of = 1, bool with_grads = true,
                                  std::optional<Device> on = std::nullopt);

// The parameters of `module` (named_parameters() order) that require a gradient, and those that
// do not (frozen).
std::vector<std::pair<std::string, Tensor>> trainable_parameters(const Module& module);
std::vector<std::pair<std::string, Tensor>> frozen_parameters(const Module& module);

}  // namespace ds::nn

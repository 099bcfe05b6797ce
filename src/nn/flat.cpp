#include "ds/nn/flat.h"

#include "ds/core/error.h"

namespace ds::nn {

std::vector<std::pair<std::string, Tensor>> trainable_parameters(const Module& module) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& [name, p] : module.named_parameters())
    if (p.requires_grad()) out.emplace_back(name, p);
  return out;
}

std::vector<std::pair<std::string, Tensor>> frozen_parameters(const Module& module) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& [name, p] : module.named_parameters())
    if (!p.requires_grad()) out.emplace_back(name, p);
  return out;
}

FlatParameters flatten_parameters(Module& module, DType dtype, DType grad_dtype, int64_t multiple_of,
                                  bool with_grads) {
  return flatten_parameters(module.named_parameters(), dtype, grad_dtype, multiple_of, with_grads);
}

FlatParameters flatten_parameters(const std::vector<std::pair<std::string, Tensor>>& named,
                                  DType dtype, DType grad_dtype, int64_t multiple_of,
                                  bool with_grads, std::optional<Device> on) {
  DS_CHECK(multiple_of >= 1, "[flatten] multiple_of must be >= 1, got {}", multiple_of);
  FlatParameters flat;
  for (auto& [name, p] : named) {
    flat.entries.push_back({name, p.shape(), flat.numel, p.numel()});
    flat.numel += p.numel();
  }
  flat.padded_numel = (flat.numel + multiple_of - 1) / multiple_of * multiple_of;
  const Device dev = on ? *on : named.empty() ? kCPU : named.front().second.device();
  auto pstore = Storage::allocate(static_cast<size_t>(flat.padded_numel) * dtype_size(dtype), dev);
  flat.params = Tensor::from_storage(pstore, {flat.padded_numel}, dtype);
  flat.params.zero_();
  std::shared_ptr<Storage> gstore;
  if (with_grads) {
    gstore = Storage::allocate(static_cast<size_t>(flat.padded_numel) * dtype_size(grad_dtype), dev);
    flat.grads = Tensor::from_storage(gstore, {flat.padded_numel}, grad_dtype);
    flat.grads.zero_();
  }
  for (size_t i = 0; i < named.size(); ++i) {
    const Tensor& p = named[i].second;
    const FlatEntry& e = flat.entries[i];
    Tensor dst = Tensor::from_storage(pstore, p.shape(), dtype, e.offset);
    // Across devices, converted where the parameter is: no staging copy in its dtype on `dev`.
    dst.copy_from(p.device() == dev || p.dtype() == dtype ? p : p.to(dtype));
    // Rebind the parameter in place: same TensorImpl, storage now a view of the flat buffer.
    TensorImpl* impl = p.impl();
    impl->storage = Storage::view(pstore, static_cast<size_t>(e.offset) * dtype_size(dtype),
                                  static_cast<size_t>(e.numel) * dtype_size(dtype));
    impl->offset = 0;
    impl->strides = contiguous_strides(p.shape());
    impl->dtype = dtype;
    impl->grad = !with_grads ? Tensor()
                             : Tensor::from_storage(
                                   Storage::view(gstore, static_cast<size_t>(e.offset) * dtype_size(grad_dtype),
                                                 static_cast<size_t>(e.numel) * dtype_size(grad_dtype)),
                                   p.shape(), grad_dtype);
  }
  return flat;
}

}  // namespace ds::nn

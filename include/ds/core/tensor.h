#pragma once
// Tensor: a small value type (a shared handle) over a strided view of a Storage, plus the autograd
// metadata (requires_grad, grad, the node that produced it). Copying a Tensor copies the handle.
// Ops are free functions in ds::ops (include/ds/ops/ops.h); this class holds only what every layer
// needs. Data is reached through data<T>() at the moment of use: under ZeRO-3 a parameter's storage
// may be released between uses, so never cache the pointer across calls.
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "ds/core/device.h"
#include "ds/core/dtype.h"
#include "ds/core/storage.h"

namespace ds {

namespace autograd {
class Node;
}

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "(2, 3, 4)"
int64_t shape_numel(const Shape& s);
Shape contiguous_strides(const Shape& s);

class TensorImpl;

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- factories (contents as named; memory from the device's caching allocator) ----
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = kCPU);
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = kCPU);
  static Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = kCPU);
  static Tensor full(const Shape& shape, double value, DType dtype = DType::f32,
                     Device device = kCPU);
  static Tensor from_data(const std::vector<float>& values, const Shape& shape,
                          DType dtype = DType::f32);
  static Tensor from_ints(const std::vector<int64_t>& values, const Shape& shape,
                          DType dtype = DType::i64);
  static Tensor arange(int64_t n, DType dtype = DType::i64);
  // A tensor over an existing storage (a view at element offset with the given strides).
  static Tensor from_storage(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype,
                             int64_t offset = 0, Shape strides = {});

  // ---- metadata ----
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  const Shape& strides() const;
  int64_t dim() const;
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const;
  DType dtype() const;
  Device device() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }
  bool is_contiguous() const;
  int64_t storage_offset() const;  // in elements
  const std::shared_ptr<Storage>& storage() const;
  bool is_materialized() const;  // false when the storage was released (ZeRO-3)

  // ---- data access (checks dtype; throws on a released storage) ----
  template <class T>
  T* data() const;
  void* raw_data() const;
  float item() const;                   // one-element tensor, any dtype
  std::vector<float> to_vector() const;  // any float dtype, any layout, as fp32
  std::vector<int64_t> to_int_vector() const;

  // ---- copies and conversions (not recorded by autograd; see ops:: for differentiable ones) ----
  // Elements [offset, offset + numel) of a contiguous tensor, as a 1-D view of the same storage
  // (no autograd history): a range of a flat buffer.
  Tensor flat_range(int64_t offset, int64_t numel) const;
  Tensor contiguous() const;  // self if already contiguous
  Tensor clone() const;       // always a new contiguous copy
  Tensor to(DType dtype) const;  // self if same dtype
  // A contiguous copy on `device` (self if already there; not recorded by autograd): ids and
  // masks made on the host go to the model's device this way.
  Tensor to(Device device) const;
  Tensor detach() const;      // same storage, no autograd history
  void copy_from(const Tensor& src) const;  // same shape; converts dtype
  void zero_() const;

  // ---- autograd ----
  bool requires_grad() const;
  const Tensor& set_requires_grad(bool r) const;
  bool is_leaf() const;
  Tensor grad() const;
  void set_grad(const Tensor& g) const;  // e.g. a view into a flat gradient buffer
  const std::shared_ptr<autograd::Node>& grad_fn() const;
  // autograd::backward({*this}, {grad_output}) (autograd/engine.h). Core does not depend on
  // autograd: the autograd layer registers the implementation (set_backward_impl below) when it is
  // linked, which it is whenever a graph exists.
  void backward(const Tensor& grad_output = {}) const;
  // Fires once this leaf's gradient for the current backward is complete and accumulated.
  using GradReadyHook = std::function<void(const Tensor& param)>;
  int add_grad_ready_hook(GradReadyHook hook) const;
  void remove_grad_ready_hook(int handle) const;

  const std::string& name() const;
  const Tensor& set_name(std::string name) const;

  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same(const Tensor& o) const { return impl_ == o.impl_; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

class TensorImpl {
 public:
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // elements
  Shape shape;
  Shape strides;
  DType dtype = DType::f32;

  // autograd
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<autograd::Node> grad_fn;
  std::weak_ptr<autograd::Node> grad_accumulator;  // leaves: the node that accumulates .grad
  std::vector<std::pair<int, Tensor::GradReadyHook>> grad_ready_hooks;
  int next_hook_id = 0;
  std::string name;
};

template <class T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct dtype_of<bf16> {
  static constexpr DType value = DType::bf16;
};
template <>
struct dtype_of<f16> {
  static constexpr DType value = DType::f16;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::i64;
};
template <>
struct dtype_of<uint16_t> {  // raw 16-bit access to bf16 or fp16 storage
  static constexpr DType value = DType::bf16;
};

void check_dtype_access(const Tensor& t, DType want, bool any16);

template <class T>
T* Tensor::data() const {
  check_dtype_access(*this, dtype_of<T>::value, std::is_same_v<T, uint16_t>);
  return static_cast<T*>(raw_data());
}

// For the autograd layer: the implementation behind Tensor::backward (root, grad_output).
using BackwardImpl = void (*)(const Tensor& root, const Tensor& grad_output);
void set_backward_impl(BackwardImpl impl);

}  // namespace ds

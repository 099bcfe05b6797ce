#include "ds/core/tensor.h"

#include <algorithm>

#include "ds/core/device_registry.h"
#include "ds/core/error.h"

namespace ds {

std::string shape_str(const Shape& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

namespace {
const TensorImpl& impl_of(const Tensor& t) {
  DS_CHECK(t.defined(), "[tensor] use of an undefined tensor");
  return *t.impl();
}
}  // namespace

// ---- factories ----

Tensor Tensor::from_storage(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype,
                            int64_t offset, Shape strides) {
  for (int64_t d : shape) DS_CHECK(d >= 0, "[tensor] negative dimension in shape {}", shape_str(shape));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->offset = offset;
  impl->shape = shape;
  impl->strides = strides.empty() ? contiguous_strides(shape) : std::move(strides);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) DS_CHECK(d >= 0, "[tensor] negative dimension in shape {}", shape_str(shape));
  auto st = Storage::allocate(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), device);
  return from_storage(std::move(st), shape, dtype);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}

Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  device_ops(device).fill(t, value);
  return t;
}

Tensor Tensor::from_data(const std::vector<float>& values, const Shape& shape, DType dtype) {
  DS_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape),
           "[tensor] {} values given for shape {}", values.size(), shape_str(shape));
  Tensor t = empty(shape, dtype);
  convert(values.data(), DType::f32, t.raw_data(), dtype, values.size());
  return t;
}

Tensor Tensor::from_ints(const std::vector<int64_t>& values, const Shape& shape, DType dtype) {
  DS_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape),
           "[tensor] {} values given for shape {}", values.size(), shape_str(shape));
  Tensor t = empty(shape, dtype);
  convert(values.data(), DType::i64, t.raw_data(), dtype, values.size());
  return t;
}

Tensor Tensor::arange(int64_t n, DType dtype) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  return from_ints(v, {n}, dtype);
}

// ---- metadata ----

const Shape& Tensor::shape() const { return impl_of(*this).shape; }
const Shape& Tensor::strides() const { return impl_of(*this).strides; }
int64_t Tensor::dim() const { return static_cast<int64_t>(shape().size()); }
int64_t Tensor::size(int64_t d) const {
  const int64_t nd = dim();
  const int64_t i = d < 0 ? d + nd : d;
  DS_CHECK(i >= 0 && i < nd, "[tensor] dimension {} out of range for shape {}", d, shape_str(shape()));
  return shape()[static_cast<size_t>(i)];
}
int64_t Tensor::numel() const { return shape_numel(shape()); }
DType Tensor::dtype() const { return impl_of(*this).dtype; }
Device Tensor::device() const { return impl_of(*this).storage->device(); }
int64_t Tensor::storage_offset() const { return impl_of(*this).offset; }
const std::shared_ptr<Storage>& Tensor::storage() const { return impl_of(*this).storage; }
bool Tensor::is_materialized() const { return storage()->is_materialized(); }

bool Tensor::is_contiguous() const {
  const auto& s = shape();
  const auto& st = strides();
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    if (s[i] != 1 && st[i] != acc) return false;
    acc *= s[i];
  }
  return true;
}

void check_dtype_access(const Tensor& t, DType want, bool any16) {
  const DType have = t.dtype();
  if (any16 && (have == DType::bf16 || have == DType::f16)) return;
  DS_CHECK(have == want, "[tensor] data<{}>() on a {} tensor", dtype_name(want), dtype_name(have));
}

void* Tensor::raw_data() const {
  const auto& im = impl_of(*this);
  return static_cast<char*>(im.storage->data()) + im.offset * static_cast<int64_t>(dtype_size(im.dtype));
}

float Tensor::item() const {
  DS_CHECK(numel() == 1, "[item] needs a one-element tensor, got shape {}", shape_str(shape()));
  return to_vector()[0];
}

namespace {
// A contiguous host copy of t (t itself when it is one): the elements of a device tensor are read
// through its device's copy, which waits for the device.
Tensor host_contiguous(const Tensor& t) {
  if (t.device().is_cpu()) return t.contiguous();
  Tensor h = Tensor::empty(t.shape(), t.dtype(), kCPU);
  device_ops(t.device()).copy(t, h);
  return h;
}
}  // namespace

std::vector<float> Tensor::to_vector() const {
  Tensor c = host_contiguous(*this);
  std::vector<float> out(static_cast<size_t>(c.numel()));
  convert(c.raw_data(), c.dtype(), out.data(), DType::f32, out.size());
  return out;
}

std::vector<int64_t> Tensor::to_int_vector() const {
  Tensor c = host_contiguous(*this);
  std::vector<int64_t> out(static_cast<size_t>(c.numel()));
  convert(c.raw_data(), c.dtype(), out.data(), DType::i64, out.size());
  return out;
}

// ---- copies ----

Tensor Tensor::flat_range(int64_t offset, int64_t numel) const {
  DS_CHECK(is_contiguous(), "[tensor] flat_range of a non-contiguous tensor {}", shape_str(shape()));
  DS_CHECK(offset >= 0 && numel >= 0 && offset + numel <= this->numel(),
           "[tensor] flat_range [{}, {}) outside a tensor of {} elements", offset, offset + numel, this->numel());
  return from_storage(storage(), {numel}, dtype(), storage_offset() + offset);
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), dtype(), device());
  device_ops(device()).copy(*this, out);
  return out;
}

Tensor Tensor::to(DType dt) const {
  if (dt == dtype()) return *this;
  Tensor out = empty(shape(), dt, device());
  device_ops(device()).copy(*this, out);
  return out;
}

Tensor Tensor::to(Device device) const {
  if (device == this->device()) return *this;
  Tensor out = empty(shape(), dtype(), device);
  out.copy_from(*this);
  return out;
}

Tensor Tensor::detach() const {
  const auto& im = impl_of(*this);
  return from_storage(im.storage, im.shape, im.dtype, im.offset, im.strides);
}

void Tensor::copy_from(const Tensor& src) const {
  DS_CHECK(src.shape() == shape(), "[copy] source shape {} differs from destination shape {}",
           shape_str(src.shape()), shape_str(shape()));
  // Between host and device memory, the device's copy does it (it can reach both).
  device_ops(device().is_cpu() ? src.device() : device()).copy(src, *this);
}

void Tensor::zero_() const {
  if (is_contiguous()) {
    device_ops(device()).fill(*this, 0.0);
  } else {
    copy_from(zeros(shape(), dtype(), device()));
  }
}

// ---- autograd ----

bool Tensor::requires_grad() const { return impl_of(*this).requires_grad; }

const Tensor& Tensor::set_requires_grad(bool r) const {
  DS_CHECK(!r || is_floating(dtype()), "[tensor] only floating tensors can require grad ({})",
           dtype_name(dtype()));
  DS_CHECK(is_leaf() || r, "[tensor] cannot clear requires_grad on a non-leaf tensor; use detach()");
  impl_->requires_grad = r;
  return *this;
}

bool Tensor::is_leaf() const { return impl_of(*this).grad_fn == nullptr; }
Tensor Tensor::grad() const { return impl_of(*this).grad; }

void Tensor::set_grad(const Tensor& g) const {
  DS_CHECK(!g.defined() || g.shape() == shape(), "[tensor] grad of shape {} for a tensor of shape {}",
           g.defined() ? shape_str(g.shape()) : "", shape_str(shape()));
  impl_->grad = g;
}

const std::shared_ptr<autograd::Node>& Tensor::grad_fn() const { return impl_of(*this).grad_fn; }

namespace {
BackwardImpl g_backward = nullptr;
}  // namespace

void set_backward_impl(BackwardImpl impl) {
  g_backward = impl;
}

void Tensor::backward(const Tensor& grad_output) const {
  DS_CHECK(g_backward != nullptr,
           "[tensor] backward() needs the autograd layer, which registers itself when a graph is "
           "recorded; this tensor has no graph (set requires_grad and run ops on it)");
  g_backward(*this, grad_output);
}

int Tensor::add_grad_ready_hook(GradReadyHook hook) const {
  DS_CHECK(is_leaf(), "[hook] gradient-ready hooks are for leaf tensors (parameters)");
  auto& im = *impl_;
  const int id = im.next_hook_id++;
  im.grad_ready_hooks.emplace_back(id, std::move(hook));
  return id;
}

void Tensor::remove_grad_ready_hook(int handle) const {
  auto& hooks = impl_->grad_ready_hooks;
  hooks.erase(std::remove_if(hooks.begin(), hooks.end(),
                             [&](const auto& h) { return h.first == handle; }),
              hooks.end());
}

const std::string& Tensor::name() const { return impl_of(*this).name; }
const Tensor& Tensor::set_name(std::string n) const {
  impl_->name = std::move(n);
  return *this;
}

}  // namespace ds

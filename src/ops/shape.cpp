// Shape ops. reshape/transpose/permute/slice return views sharing storage when they can.
#include <numeric>

#include "ds/autograd/grad_mode.h"
#include "ds/autograd/node.h"
#include "ds/ops/ops.h"
#include "ops/op_util.h"

namespace ds::ops {

namespace {
Tensor view_of(const Tensor& x, const Shape& shape, const Shape& strides, int64_t offset) {
  return Tensor::from_storage(x.storage(), shape, x.dtype(), offset, strides);
}
}  // namespace

Tensor reshape(const Tensor& x, const Shape& shape_in) {
  Shape shape = shape_in;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      DS_CHECK(infer < 0, "[reshape] more than one -1 in {}", shape_str(shape_in));
      infer = static_cast<int64_t>(i);
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    DS_CHECK(known > 0 && x.numel() % known == 0, "[reshape] cannot reshape {} to {}",
             shape_str(x.shape()), shape_str(shape_in));
    shape[static_cast<size_t>(infer)] = x.numel() / known;
  }
  DS_CHECK(shape_numel(shape) == x.numel(), "[reshape] cannot reshape {} ({} elements) to {}",
           shape_str(x.shape()), x.numel(), shape_str(shape_in));
  Tensor base = x.contiguous();  // a copy only when x is a non-contiguous view
  Tensor out = view_of(base, shape, contiguous_strides(shape), base.storage_offset());
  const Shape xs = x.shape();
  return autograd::record(out, "ReshapeBackward", {x}, [xs](const Tensor& g) -> std::vector<Tensor> {
    return {reshape(g, xs)};
  });
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  const int64_t nd = x.dim();
  DS_CHECK(static_cast<int64_t>(dims.size()) == nd, "[permute] {} dims given for a {}-d tensor",
           dims.size(), nd);
  Shape shape(static_cast<size_t>(nd)), strides(static_cast<size_t>(nd));
  std::vector<int64_t> inverse(static_cast<size_t>(nd), -1);
  for (int64_t i = 0; i < nd; ++i) {
    const int64_t d = detail::norm_dim(dims[static_cast<size_t>(i)], nd, "permute");
    DS_CHECK(inverse[static_cast<size_t>(d)] < 0, "[permute] dimension {} repeated", d);
    inverse[static_cast<size_t>(d)] = i;
    shape[static_cast<size_t>(i)] = x.shape()[static_cast<size_t>(d)];
    strides[static_cast<size_t>(i)] = x.strides()[static_cast<size_t>(d)];
  }
  Tensor out = view_of(x, shape, strides, x.storage_offset());
  return autograd::record(out, "PermuteBackward", {x}, [inverse](const Tensor& g) -> std::vector<Tensor> {
    return {permute(g, inverse)};
  });
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  const int64_t nd = x.dim();
  d0 = detail::norm_dim(d0, nd, "transpose");
  d1 = detail::norm_dim(d1, nd, "transpose");
  std::vector<int64_t> perm(static_cast<size_t>(nd));
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[static_cast<size_t>(d0)], perm[static_cast<size_t>(d1)]);
  return permute(x, perm);
}

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end) {
  const int64_t d = detail::norm_dim(dim, x.dim(), "slice");
  const int64_t n = x.shape()[static_cast<size_t>(d)];
  DS_CHECK(0 <= start && start <= end && end <= n, "[slice] range [{}, {}) outside dimension {} of size {}",
           start, end, d, n);
  Shape shape = x.shape();
  shape[static_cast<size_t>(d)] = end - start;
  Tensor out = view_of(x, shape, x.strides(), x.storage_offset() + start * x.strides()[static_cast<size_t>(d)]);
  const Shape xs = x.shape();
  const DType dt = x.dtype();
  return autograd::record(out, "SliceBackward", {x}, [=](const Tensor& g) -> std::vector<Tensor> {
    Tensor gx = Tensor::zeros(xs, dt, g.device());
    Tensor part = view_of(gx, g.shape(), gx.strides(), start * gx.strides()[static_cast<size_t>(d)]);
    part.copy_from(g);
    return {gx};
  });
}

Tensor concat(const std::vector<Tensor>& xs, int64_t dim) {
  DS_CHECK(!xs.empty(), "[concat] no tensors given");
  const int64_t d = detail::norm_dim(dim, xs[0].dim(), "concat");
  Shape shape = xs[0].shape();
  int64_t total = 0;
  for (const auto& t : xs) {
    DS_CHECK(t.dim() == xs[0].dim() && t.dtype() == xs[0].dtype(),
             "[concat] tensors must share rank and dtype ({} {} vs {} {})", shape_str(t.shape()),
             dtype_name(t.dtype()), shape_str(xs[0].shape()), dtype_name(xs[0].dtype()));
    for (int64_t i = 0; i < t.dim(); ++i)
      DS_CHECK(i == d || t.shape()[static_cast<size_t>(i)] == shape[static_cast<size_t>(i)],
               "[concat] shapes {} and {} differ outside dimension {}", shape_str(t.shape()),
               shape_str(shape), d);
    total += t.shape()[static_cast<size_t>(d)];
  }
  shape[static_cast<size_t>(d)] = total;
  Tensor out = Tensor::empty(shape, xs[0].dtype(), xs[0].device());
  std::vector<int64_t> starts;
  int64_t at = 0;
  for (const auto& t : xs) {
    starts.push_back(at);
    Shape ps = shape;
    ps[static_cast<size_t>(d)] = t.shape()[static_cast<size_t>(d)];
    view_of(out, ps, out.strides(), at * out.strides()[static_cast<size_t>(d)]).copy_from(t);
    at += t.shape()[static_cast<size_t>(d)];
  }
  std::vector<int64_t> sizes;
  for (const auto& t : xs) sizes.push_back(t.shape()[static_cast<size_t>(d)]);
  return autograd::record(out, "ConcatBackward", xs, [=](const Tensor& g) -> std::vector<Tensor> {
    std::vector<Tensor> grads;
    for (size_t i = 0; i < sizes.size(); ++i)
      grads.push_back(slice(g, d, starts[i], starts[i] + sizes[i]).contiguous());
    return grads;
  });
}

Tensor contiguous(const Tensor& x) {
  if (x.is_contiguous()) return x;
  Tensor out = x.clone();
  return autograd::record(out, "ContiguousBackward", {x},
                          [](const Tensor& g) -> std::vector<Tensor> { return {g}; });
}

Tensor cast(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  Tensor out = x.to(dtype);
  const DType from = x.dtype();
  return autograd::record(out, "CastBackward", {x}, [from](const Tensor& g) -> std::vector<Tensor> {
    return {g.to(from)};
  });
}

}  // namespace ds::ops

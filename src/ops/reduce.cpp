#include <algorithm>
#include <limits>

#include "ds/autograd/grad_mode.h"
#include "ds/autograd/node.h"
#include "ds/ops/ops.h"
#include "ops/op_util.h"

namespace ds::ops {
using backend::ReduceOp;
using detail::be;

namespace {

Shape keepdim_shape(const Shape& s, const std::vector<int64_t>& dims) {
  Shape k = s;
  for (int64_t d : dims) k[static_cast<size_t>(d)] = 1;
  return k;
}

Shape drop_dims(const Shape& s, const std::vector<int64_t>& dims) {
  Shape out;
  for (size_t i = 0; i < s.size(); ++i)
    if (std::find(dims.begin(), dims.end(), static_cast<int64_t>(i)) == dims.end()) out.push_back(s[i]);
  return out;
}

// Sum over one contiguous run of dims [d0, d1] of a contiguous tensor (fp32, or 16-bit where the
// backend's reduce reads it), keeping dims; the result is fp32.
Tensor sum_range(const Tensor& x, int64_t d0, int64_t d1) {
  const Shape& s = x.shape();
  int64_t outer = 1, red = 1, inner = 1;
  for (int64_t i = 0; i < static_cast<int64_t>(s.size()); ++i) {
    if (i < d0) outer *= s[i];
    else if (i <= d1) red *= s[i];
    else inner *= s[i];
  }
  Shape os = s;
  for (int64_t i = d0; i <= d1; ++i) os[i] = 1;
  Tensor out = Tensor::empty(os, DType::f32, x.device());
  be(x).reduce(ReduceOp::sum, x, outer, red, inner, out);
  return out;
}

std::vector<int64_t> normalize_dims(const std::vector<int64_t>& dims, int64_t nd, const char* op) {
  std::vector<int64_t> d;
  for (int64_t v : dims) d.push_back(detail::norm_dim(v, nd, op));
  std::sort(d.begin(), d.end());
  d.erase(std::unique(d.begin(), d.end()), d.end());
  return d;
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims_in, bool keepdim) {
  detail::check_float(x, "sum");
  const int64_t nd = x.dim();
  const auto dims = normalize_dims(dims_in, nd, "sum");
  // A 16-bit x goes to the kernel as it is where the backend reads it (the first reduction's
  // output, and every later one, is fp32).
  const bool direct = x.dtype() != DType::f32 && be(x).supports("reduce", x.dtype());
  Tensor r = direct && !dims.empty() ? x.contiguous() : detail::f32c(x);
  // Reduce maximal runs of consecutive dims, last run first so earlier indices stay valid.
  size_t i = dims.size();
  while (i > 0) {
    size_t j = i - 1;
    while (j > 0 && dims[j - 1] + 1 == dims[j]) --j;
    r = sum_range(r, dims[j], dims[i - 1]);
    i = j;
  }
  const Shape out_shape = keepdim ? keepdim_shape(x.shape(), dims) : drop_dims(x.shape(), dims);
  Tensor out = detail::as_dtype(
      Tensor::from_storage(r.storage(), out_shape, DType::f32, r.storage_offset()), x.dtype());
  if (!autograd::is_grad_enabled() || !x.requires_grad()) return out;
  const Shape xs = x.shape(), ks = keepdim_shape(x.shape(), dims);
  return autograd::record(out, "SumBackward", {x}, [xs, ks](const Tensor& g) -> std::vector<Tensor> {
    return {broadcast_to(reshape(g, ks), xs).contiguous()};
  });
}

Tensor sum(const Tensor& x) {
  std::vector<int64_t> all(static_cast<size_t>(x.dim()));
  for (int64_t i = 0; i < x.dim(); ++i) all[static_cast<size_t>(i)] = i;
  return sum(x, all, false);
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims_in, bool keepdim) {
  const auto dims = normalize_dims(dims_in, x.dim(), "mean");
  int64_t count = 1;
  for (int64_t d : dims) count *= x.shape()[static_cast<size_t>(d)];
  return mul(sum(x, dims, keepdim), 1.0f / static_cast<float>(std::max<int64_t>(count, 1)));
}

Tensor mean(const Tensor& x) { return mul(sum(x), 1.0f / static_cast<float>(std::max<int64_t>(x.numel(), 1))); }

Tensor max(const Tensor& x, int64_t dim_in, bool keepdim) {
  detail::check_float(x, "max");
  const int64_t d = detail::norm_dim(dim_in, x.dim(), "max");
  Tensor xf = detail::f32c(x);
  const Shape& s = x.shape();
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < d; ++i) outer *= s[i];
  for (int64_t i = d + 1; i < x.dim(); ++i) inner *= s[i];
  const int64_t red = s[d];
  const Shape ks = keepdim_shape(s, {d});
  Tensor vals = Tensor::empty(ks, DType::f32, x.device());
  be(x).reduce(ReduceOp::max, xf, outer, red, inner, vals);
  const Shape out_shape = keepdim ? ks : drop_dims(s, {d});
  Tensor out = detail::as_dtype(Tensor::from_storage(vals.storage(), out_shape, DType::f32), x.dtype());
  if (!autograd::is_grad_enabled() || !x.requires_grad()) return out;
  Tensor sx = xf.detach(), sv = vals.detach();
  return autograd::record(out, "MaxBackward", {x}, [=](const Tensor& g) -> std::vector<Tensor> {
    // Gradient goes to the first position holding the maximum (as torch.max(dim) does).
    Tensor gx = Tensor::empty(s, DType::f32, sx.device());
    be(sx).max_backward(sx, sv, detail::f32c(g), outer, red, inner, gx);
    return {detail::as_dtype(gx, sx.dtype())};
  });
}

}  // namespace ds::ops

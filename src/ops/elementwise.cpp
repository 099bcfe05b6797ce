// Elementwise ops with broadcasting. Kernels compute in fp32 and the result is returned in the
// input dtype. 16-bit inputs go to the backend's kernel as they are when it reads them directly
// (Backend::supports("binary" / "unary", dtype): the CPU's), else they are upcast to fp32 copies.
// Either way each element is the fp32 result rounded once, so the two paths give the same bits.
#include <cmath>

#include "ds/autograd/grad_mode.h"
#include "ds/autograd/node.h"
#include "ds/ops/flop_count.h"
#include "ds/ops/ops.h"
#include "ops/op_util.h"

namespace ds::ops {
using backend::BinaryOp;
using backend::UnaryOp;
using detail::be;
using detail::f32c;

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  const size_t nd = std::max(a.size(), b.size());
  Shape out(nd);
  for (size_t i = 0; i < nd; ++i) {
    const int64_t da = i < nd - a.size() ? 1 : a[i - (nd - a.size())];
    const int64_t db = i < nd - b.size() ? 1 : b[i - (nd - b.size())];
    DS_CHECK(da == db || da == 1 || db == 1, "[broadcast] shapes {} and {} are not compatible",
             shape_str(a), shape_str(b));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

namespace {

// A stride-0 view of x expanded to `shape` (no copy, no autograd).
Tensor expand_view(const Tensor& x, const Shape& shape) {
  const size_t nd = shape.size(), xd = x.shape().size();
  Shape strides(nd, 0);
  for (size_t i = 0; i < xd; ++i) {
    const size_t o = nd - xd + i;
    strides[o] = x.shape()[i] == 1 && shape[o] != 1 ? 0 : x.strides()[i];
  }
  return Tensor::from_storage(x.storage(), shape, x.dtype(), x.storage_offset(), strides);
}

// Sums g (of broadcast shape) down to `shape`.
Tensor reduce_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  const size_t nd = g.shape().size(), xd = shape.size();
  std::vector<int64_t> dims;
  for (size_t i = 0; i < nd; ++i) {
    const bool leading = i < nd - xd;
    if (leading || (shape[i - (nd - xd)] == 1 && g.shape()[i] != 1)) dims.push_back(static_cast<int64_t>(i));
  }
  Tensor s = sum(g, dims, /*keepdim=*/true);
  return reshape(s, shape);
}

Tensor binary_kernel(BinaryOp op, const Tensor& a, const Tensor& b) {
  const Shape shape = broadcast_shapes(a.shape(), b.shape());
  if (a.dtype() != DType::f32 && a.dtype() == b.dtype() && be(a).supports("binary", a.dtype())) {
    Tensor out = Tensor::empty(shape, a.dtype(), a.device());
    be(a).binary(op, expand_view(a, shape), expand_view(b, shape), out);
    return out;
  }
  Tensor fa = f32c(a), fb = f32c(b);
  Tensor out = Tensor::empty(shape, DType::f32, a.device());
  be(a).binary(op, expand_view(fa, shape), expand_view(fb, shape), out);
  return out;
}

Tensor binary(BinaryOp op, const char* name, const Tensor& a, const Tensor& b) {
  detail::check_float(a, name);
  detail::check_float(b, name);
  detail::check_same_device(a, b, name);
  DS_CHECK(a.dtype() == b.dtype(), "[{}] dtypes differ: {} and {}", name, dtype_name(a.dtype()),
           dtype_name(b.dtype()));
  const detail::CountOp counted(
      name, detail::elementwise_cost(static_cast<double>(
                detail::counting_flops() ? shape_numel(broadcast_shapes(a.shape(), b.shape())) : 0)));
  Tensor out = detail::as_dtype(binary_kernel(op, a, b), a.dtype());
  if (!autograd::is_grad_enabled() || !autograd::any_requires_grad({a, b})) return out;
  Tensor sa = a.detach(), sb = b.detach();
  const Shape shape_a = a.shape(), shape_b = b.shape();
  const bool need_a = a.requires_grad(), need_b = b.requires_grad();
  return autograd::record(out, name, {a, b}, [=](const Tensor& g) -> std::vector<Tensor> {
    Tensor ga, gb;
    switch (op) {
      case BinaryOp::add:
        if (need_a) ga = reduce_to(g, shape_a);
        if (need_b) gb = reduce_to(g, shape_b);
        break;
      case BinaryOp::sub:
        if (need_a) ga = reduce_to(g, shape_a);
        if (need_b) gb = reduce_to(neg(g), shape_b);
        break;
      case BinaryOp::mul:
        if (need_a) ga = reduce_to(mul(g, sb), shape_a);
        if (need_b) gb = reduce_to(mul(g, sa), shape_b);
        break;
      case BinaryOp::div:
        if (need_a) ga = reduce_to(div(g, sb), shape_a);
        if (need_b) gb = reduce_to(neg(div(mul(g, sa), mul(sb, sb))), shape_b);
        break;
      default:
        DS_THROW("[{}] no gradient", name);
    }
    return {ga, gb};
  });
}

Tensor unary_kernel(UnaryOp op, const Tensor& x, float s) {
  if (x.dtype() != DType::f32 && be(x).supports("unary", x.dtype())) {
    Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
    be(x).unary(op, x.contiguous(), out, s);  // a strided view: a 16-bit copy, not an fp32 one
    return out;
  }
  Tensor fx = f32c(x);
  Tensor out = Tensor::empty(x.shape(), DType::f32, x.device());
  be(x).unary(op, fx, out, s);
  return detail::as_dtype(out, x.dtype());
}

Tensor unary(UnaryOp op, const char* name, const Tensor& x, float s,
             std::function<Tensor(const Tensor& g, const Tensor& x, const Tensor& y)> grad) {
  detail::check_float(x, name);
  const detail::CountOp counted(name, detail::elementwise_cost(static_cast<double>(x.numel())));
  Tensor y = unary_kernel(op, x, s);
  if (!autograd::is_grad_enabled() || !x.requires_grad()) return y;
  Tensor sx = x.detach(), sy = y.detach();
  return autograd::record(y, name, {x}, [=](const Tensor& g) -> std::vector<Tensor> {
    return {grad(g, sx, sy)};
  });
}

}  // namespace

Tensor broadcast_to(const Tensor& x, const Shape& shape) {
  DS_CHECK(broadcast_shapes(x.shape(), shape) == shape, "[broadcast_to] cannot broadcast {} to {}",
           shape_str(x.shape()), shape_str(shape));
  Tensor out = expand_view(x, shape);
  const Shape xs = x.shape();
  return autograd::record(out, "BroadcastBackward", {x},
                          [xs](const Tensor& g) -> std::vector<Tensor> { return {reduce_to(g, xs)}; });
}

Tensor add(const Tensor& a, const Tensor& b) { return binary(BinaryOp::add, "add", a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary(BinaryOp::sub, "sub", a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(BinaryOp::mul, "mul", a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary(BinaryOp::div, "div", a, b); }

Tensor add(const Tensor& a, float s) {
  return unary(UnaryOp::add_scalar, "add_scalar", a, s,
               [](const Tensor& g, const Tensor&, const Tensor&) { return g; });
}
Tensor mul(const Tensor& a, float s) {
  return unary(UnaryOp::mul_scalar, "mul_scalar", a, s,
               [s](const Tensor& g, const Tensor&, const Tensor&) { return mul(g, s); });
}
Tensor neg(const Tensor& x) {
  return unary(UnaryOp::neg, "neg", x, 0,
               [](const Tensor& g, const Tensor&, const Tensor&) { return neg(g); });
}
Tensor exp(const Tensor& x) {
  return unary(UnaryOp::exp, "exp", x, 0,
               [](const Tensor& g, const Tensor&, const Tensor& y) { return mul(g, y); });
}
Tensor log(const Tensor& x) {
  return unary(UnaryOp::log, "log", x, 0,
               [](const Tensor& g, const Tensor& x, const Tensor&) { return div(g, x); });
}
Tensor sqrt(const Tensor& x) {
  return unary(UnaryOp::sqrt, "sqrt", x, 0, [](const Tensor& g, const Tensor&, const Tensor& y) {
    return div(mul(g, 0.5f), y);
  });
}
Tensor tanh(const Tensor& x) {
  return unary(UnaryOp::tanh, "tanh", x, 0, [](const Tensor& g, const Tensor&, const Tensor& y) {
    return mul(g, add(neg(square(y)), 1.0f));
  });
}
Tensor square(const Tensor& x) {
  return unary(UnaryOp::square, "square", x, 0, [](const Tensor& g, const Tensor& x, const Tensor&) {
    return mul(g, mul(x, 2.0f));
  });
}
Tensor pow(const Tensor& x, float p) {
  return unary(UnaryOp::pow_scalar, "pow", x, p, [p](const Tensor& g, const Tensor& x, const Tensor&) {
    return mul(g, mul(pow(x, p - 1.0f), p));
  });
}

// ---- in place ----

void add_(const Tensor& dst, const Tensor& src, float alpha) {
  DS_CHECK(dst.numel() == src.numel(), "[add_] {} elements into {}", src.numel(), dst.numel());
  DS_CHECK(dst.is_contiguous(), "[add_] destination must be contiguous");
  be(dst).axpy(dst, src.contiguous(), alpha);
}

void mul_(const Tensor& dst, float s) {
  DS_CHECK(dst.is_contiguous(), "[mul_] destination must be contiguous");
  if (dst.dtype() == DType::f32) {
    be(dst).unary(UnaryOp::mul_scalar, dst, dst, s);
  } else {
    Tensor f = dst.to(DType::f32);
    be(dst).unary(UnaryOp::mul_scalar, f, f, s);
    dst.copy_from(f);
  }
}

void fill_(const Tensor& dst, double value) {
  if (dst.is_contiguous()) {
    be(dst).fill(dst, value);
  } else {
    dst.copy_from(Tensor::full(dst.shape(), value, dst.dtype(), dst.device()));
  }
}

// ---- hooks ----

Tensor backward_hook(const Tensor& x, std::function<void()> fn) {
  if (!autograd::is_grad_enabled() || !x.requires_grad()) return x;
  Tensor out = x.detach();
  auto fired = std::make_shared<bool>(false);
  return autograd::record(out, "BackwardHook", {x}, [fn, fired](const Tensor& g) -> std::vector<Tensor> {
    if (!*fired) {
      *fired = true;
      fn();
    }
    return {g};
  });
}

}  // namespace ds::ops

// matmul and linear on the backend's GEMM. Operands whose last two dims are a transposed
// contiguous matrix are passed to the GEMM with a transpose flag instead of being copied.
#include "ds/autograd/grad_mode.h"
#include "ds/autograd/node.h"
#include "ds/ops/flop_count.h"
#include "ds/ops/ops.h"
#include "ops/op_util.h"

namespace ds::ops {
using detail::be;

namespace {

// A (batch, rows, cols) matrix operand: either row-major (trans=false) or the transpose of a
// row-major matrix (trans=true), with a constant stride between batch items.
struct Operand {
  Tensor t;  // keeps the memory alive
  const void* data;
  bool trans;
  int64_t ld;
  int64_t batch_stride;
};

// x: (..., r, c) whose leading dims collapse to `batch` items. Returns an operand without copying
// when the layout allows, otherwise a contiguous copy.
Operand as_operand(const Tensor& x_in, DType compute) {
  Tensor x = x_in.dtype() == compute ? x_in : x_in.to(compute);
  const int64_t nd = x.dim();
  const int64_t r = x.size(-2), c = x.size(-1);
  const auto& st = x.strides();
  // Batch dims must be collapsible with a uniform stride.
  auto batch_uniform = [&](int64_t inner) {
    int64_t expect = inner;
    for (int64_t i = nd - 3; i >= 0; --i) {
      if (x.shape()[static_cast<size_t>(i)] != 1 && st[static_cast<size_t>(i)] != expect) return false;
      expect *= x.shape()[static_cast<size_t>(i)];
    }
    return true;
  };
  if (st[static_cast<size_t>(nd - 1)] == 1 && (r == 1 || st[static_cast<size_t>(nd - 2)] == c) &&
      batch_uniform(r * c))
    return {x, x.raw_data(), false, c, r * c};
  if (st[static_cast<size_t>(nd - 2)] == 1 && (c == 1 || st[static_cast<size_t>(nd - 1)] == r) &&
      batch_uniform(r * c))
    return {x, x.raw_data(), true, r, r * c};
  Tensor cx = x.contiguous();
  return {cx, cx.raw_data(), false, c, r * c};
}

Tensor matmul_impl(const Tensor& a, const Tensor& b) {
  DS_CHECK(a.dim() >= 2 && b.dim() >= 2, "[matmul] operands need at least 2 dims, got {} and {}",
           shape_str(a.shape()), shape_str(b.shape()));
  const int64_t m = a.size(-2), k = a.size(-1), k2 = b.size(-2), n = b.size(-1);
  DS_CHECK(k == k2, "[matmul] inner dimensions differ: {} @ {}", shape_str(a.shape()), shape_str(b.shape()));
  const DType compute = a.dtype() == b.dtype() ? a.dtype() : DType::f32;
  const Shape ab(a.shape().begin(), a.shape().end() - 2), bb(b.shape().begin(), b.shape().end() - 2);
  Shape out_shape;

  backend::Gemm g;
  g.dtype = compute;
  g.m = m;
  g.n = n;
  g.k = k;
  if (b.dim() == 2) {
    // (..., M, K) @ (K, N): fold the batch into M when a's rows are contiguous.
    Tensor ac = a.dtype() == compute ? a.contiguous() : a.to(compute);
    Operand ob = as_operand(b, compute);
    const int64_t rows = ac.numel() / std::max<int64_t>(k, 1);
    out_shape = ab;
    out_shape.push_back(m);
    out_shape.push_back(n);
    Tensor out = Tensor::empty(out_shape, DType::f32, a.device());
    g.m = rows;
    g.a = ac.raw_data();
    g.lda = k;
    g.b = ob.data;
    g.trans_b = ob.trans;
    g.ldb = ob.ld;
    g.c = out.raw_data();
    g.ldc = n;
    be(a).gemm(g);
    return out;
  }
  const Shape batch = broadcast_shapes(ab, bb);
  Shape ea = batch, eb = batch;
  ea.insert(ea.end(), {m, k});
  eb.insert(eb.end(), {k, n});
  Tensor ax = a.shape() == ea ? a : broadcast_to(a.detach(), ea).contiguous();
  Tensor bx = b.shape() == eb ? b : broadcast_to(b.detach(), eb).contiguous();
  Operand oa = as_operand(ax, compute), ob = as_operand(bx, compute);
  out_shape = batch;
  out_shape.insert(out_shape.end(), {m, n});
  Tensor out = Tensor::empty(out_shape, DType::f32, a.device());
  g.batch = shape_numel(batch);
  g.a = oa.data;
  g.trans_a = oa.trans;
  g.lda = oa.ld;
  g.stride_a = oa.batch_stride;
  g.b = ob.data;
  g.trans_b = ob.trans;
  g.ldb = ob.ld;
  g.stride_b = ob.batch_stride;
  g.c = out.raw_data();
  g.ldc = n;
  g.stride_c = m * n;
  be(a).gemm(g);
  return out;
}

// Sums a broadcast batch gradient back to the operand's own shape.
Tensor reduce_batch(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  const size_t nd = g.shape().size(), xd = shape.size();
  std::vector<int64_t> dims;
  for (size_t i = 0; i + 2 < nd; ++i) {
    const bool leading = i < nd - xd;
    if (leading || (shape[i - (nd - xd)] == 1 && g.shape()[i] != 1)) dims.push_back(static_cast<int64_t>(i));
  }
  return reshape(sum(g, dims, true), shape);
}

// Column sums (cols) in fp32 of a (rows, cols) tensor: the bias gradient. A 16-bit one is read as
// it is where the backend's reduce takes it (no fp32 copy); the sums are those of its fp32 copy.
Tensor column_sums(const Tensor& g, int64_t rows, int64_t cols) {
  const Tensor gc = g.contiguous();
  const Tensor x = gc.dtype() == DType::f32 || be(gc).supports("reduce", gc.dtype())
                       ? gc
                       : gc.to(DType::f32);
  Tensor out = Tensor::empty({cols}, DType::f32, g.device());
  be(x).reduce(backend::ReduceOp::sum, x, 1, rows, cols, out);
  return out;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  detail::check_float(a, "matmul");
  detail::check_float(b, "matmul");
  detail::check_same_device(a, b, "matmul");
  const detail::CountOp counted(
      "matmul", detail::gemm_cost(static_cast<double>(a.numel()) *
                                  static_cast<double>(b.dim() > 0 ? b.size(-1) : 1)));
  const DType out_dtype = a.dtype() == b.dtype() ? a.dtype() : DType::f32;
  Tensor out = detail::as_dtype(matmul_impl(a, b), out_dtype);
  if (!autograd::is_grad_enabled() || !autograd::any_requires_grad({a, b})) return out;
  Tensor sa = a.detach(), sb = b.detach();
  const bool need_a = a.requires_grad(), need_b = b.requires_grad();
  return autograd::record(out, "MatmulBackward", {a, b}, [=](const Tensor& g) -> std::vector<Tensor> {
    Tensor ga, gb;
    if (need_a) ga = detail::as_dtype(reduce_batch(matmul_impl(g, transpose(sb, -1, -2)), sa.shape()), sa.dtype());
    if (need_b) {
      if (sb.dim() == 2) {
        // dB = A^T @ G with the batch folded into the rows.
        Tensor a2 = reshape(sa.contiguous(), {-1, sa.size(-1)});
        Tensor g2 = reshape(g.contiguous(), {-1, g.size(-1)});
        gb = matmul_impl(transpose(a2, 0, 1), g2);
      } else {
        gb = reduce_batch(matmul_impl(transpose(sa, -1, -2), g), sb.shape());
      }
      gb = detail::as_dtype(gb, sb.dtype());
    }
    return {ga, gb};
  });
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  detail::check_float(x, "linear");
  detail::check_float(w, "linear");
  DS_CHECK(w.dim() == 2 && x.dim() >= 1 && x.size(-1) == w.size(1),
           "[linear] input {} does not match weight {} (expected (..., {}))", shape_str(x.shape()),
           shape_str(w.shape()), w.dim() == 2 ? w.size(1) : -1);
  DS_CHECK(!b.defined() || (b.dim() == 1 && b.size(0) == w.size(0)),
           "[linear] bias {} does not match weight {}", b.defined() ? shape_str(b.shape()) : "",
           shape_str(w.shape()));
  const int64_t in = w.size(1), outf = w.size(0);
  const int64_t rows = x.numel() / std::max<int64_t>(in, 1);
  const detail::CountOp counted(
      "linear", detail::gemm_cost(static_cast<double>(rows) * static_cast<double>(in) *
                                  static_cast<double>(outf)));
  const DType compute = x.dtype() == w.dtype() ? x.dtype() : DType::f32;
  Tensor xc = x.dtype() == compute ? x.contiguous() : x.to(compute);
  Tensor wc = w.dtype() == compute ? w.contiguous() : w.to(compute);
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  out_shape.push_back(outf);
  // 16-bit operands (and bias): the GEMM writes the 16-bit result itself where the backend can (no
  // fp32 copy of the output); else an fp32 result, rounded. A 16-bit C holds a 16-bit bias
  // exactly, so starting C from the bias rounds nothing more. The same for the gradients.
  const bool gemm16 = compute != DType::f32 && be(x).supports("gemm_out16", compute);
  const bool out16 = gemm16 && (!b.defined() || b.dtype() == compute);
  const DType ydt = out16 ? compute : DType::f32;
  Tensor y = Tensor::empty(out_shape, ydt, x.device());
  backend::Gemm g;
  g.dtype = compute;
  g.c_dtype = ydt;
  g.m = rows;
  g.n = outf;
  g.k = in;
  g.a = xc.raw_data();
  g.lda = in;
  g.b = wc.raw_data();
  g.trans_b = true;
  g.ldb = in;
  g.c = y.raw_data();
  g.ldc = outf;
  if (b.defined()) {
    // Start C from the bias rows, then accumulate the product into it (beta = 1).
    Tensor bf = out16 ? b.contiguous() : detail::f32c(b);
    be(x).copy(Tensor::from_storage(bf.storage(), {rows, outf}, bf.dtype(), bf.storage_offset(), {0, 1}),
               Tensor::from_storage(y.storage(), {rows, outf}, ydt));
    g.beta = 1.0f;
  }
  be(x).gemm(g);
  Tensor out = out16 ? y : detail::as_dtype(y, x.dtype());  // out16: y has x's dtype
  if (!autograd::is_grad_enabled() || !autograd::any_requires_grad({x, w, b})) return out;
  Tensor sx = xc.detach(), sw = wc.detach();
  const bool nx = x.requires_grad(), nw = w.requires_grad(), nb = b.defined() && b.requires_grad();
  const DType xd = x.dtype(), wd = w.dtype(), bd = b.defined() ? b.dtype() : DType::f32;
  const Shape xs = x.shape();
  return autograd::record(out, "LinearBackward", {x, w, b}, [=](const Tensor& gout) -> std::vector<Tensor> {
    Tensor gc = gout.dtype() == compute ? gout.contiguous() : gout.to(compute);
    Tensor gx, gw, gb;
    if (nx) {  // dX (rows, in) = G (rows, out) @ W (out, in)
      const DType cd = gemm16 && xd == compute ? xd : DType::f32;
      Tensor dx = Tensor::empty(xs, cd, gc.device());
      backend::Gemm d;
      d.dtype = compute;
      d.c_dtype = cd;
      d.m = rows; d.n = in; d.k = outf;
      d.a = gc.raw_data(); d.lda = outf;
      d.b = sw.raw_data(); d.ldb = in;
      d.c = dx.raw_data(); d.ldc = in;
      backend::get(gc.device()).gemm(d);
      gx = cd == xd ? dx : detail::as_dtype(dx, xd);
    }
    if (nw) {  // dW (out, in) = G^T (out, rows) @ X (rows, in)
      const DType cd = gemm16 && wd == compute ? wd : DType::f32;
      Tensor dw = Tensor::empty({outf, in}, cd, gc.device());
      backend::Gemm d;
      d.dtype = compute;
      d.c_dtype = cd;
      d.m = outf; d.n = in; d.k = rows;
      d.a = gc.raw_data(); d.trans_a = true; d.lda = outf;
      d.b = sx.raw_data(); d.ldb = in;
      d.c = dw.raw_data(); d.ldc = in;
      backend::get(gc.device()).gemm(d);
      gw = cd == wd ? dw : detail::as_dtype(dw, wd);
    }
    if (nb) gb = detail::as_dtype(column_sums(gout, rows, outf), bd);
    return {gx, gw, gb};
  });
}

}  // namespace ds::ops

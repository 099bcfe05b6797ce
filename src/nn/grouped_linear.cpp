// The experts' GEMMs of a mixture-of-experts layer (ds/nn/grouped_linear.h).
#include "ds/nn/grouped_linear.h"

#include <utility>
#include <vector>

#include "ds/autograd/grad_mode.h"
#include "ds/autograd/node.h"
#include "ds/backend/backend.h"
#include "ds/core/error.h"
#include "ds/ops/flop_count.h"
#include "ds/ops/ops.h"

namespace ds::nn {

namespace {

const float* f32(const Tensor& t) { return static_cast<const float*>(t.raw_data()); }
float* f32(Tensor& t) { return static_cast<float*>(t.raw_data()); }

// C (m, n) [ldc] = op(A) @ op(B) on the device of the operands (fp32, row-major).
void gemm_f32(const Device& dev, bool trans_a, int64_t m, int64_t n, int64_t k, const float* a,
              int64_t lda, const float* b, int64_t ldb, bool trans_b, float* c, int64_t ldc) {
  backend::Gemm g;
  g.trans_a = trans_a;
  g.trans_b = trans_b;
  g.m = m;
  g.n = n;
  g.k = k;
  g.a = a;
  g.lda = lda;
  g.b = b;
  g.ldb = ldb;
  g.c = c;
  g.ldc = ldc;
  backend::get(dev).gemm(g);
}

// fp32 on one device: one GEMM per expert straight between the buffers (no per-expert tensors,
// no transposed copies, no joins): y (M, out) = each run of xs times w[e]^T; backward
// dxs = each run of g times w[e], dw[e] = g_e^T x_e written into its slice of one (E, out, in).
Tensor grouped_linear_f32(const Tensor& xs_in, const Tensor& w, const std::vector<int64_t>& counts) {
  const Tensor xs = xs_in.contiguous();
  const Tensor wc = w.contiguous();
  const int64_t M = xs.size(0), E = w.size(0), out = w.size(1), in = w.size(2);
  const Device dev = xs.device();
  Tensor y = Tensor::empty({M, out}, DType::f32, dev);
  {
    const ops::detail::CountOp counted("grouped_linear",
                                       ops::detail::gemm_cost(double(M) * double(out) * double(in)));
    int64_t off = 0;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t n = counts[static_cast<size_t>(e)];
      if (n > 0)
        gemm_f32(dev, false, n, out, in, f32(xs) + off * in, in, f32(wc) + e * out * in, in,
                 true, f32(y) + off * out, out);
      off += n;
    }
  }
  if (!autograd::is_grad_enabled() || !autograd::any_requires_grad({xs_in, w})) return y;
  const Tensor sx = xs.detach();
  const Tensor sw = w;  // the parameter's own handle: ZeRO-3 re-gathers into it
  return autograd::record(
      y, "GroupedLinearBackward", {xs_in, w},
      [sx, sw, counts, M, E, out, in](const Tensor& gout) -> std::vector<Tensor> {
        const Tensor g = gout.dtype() == DType::f32 ? gout.contiguous() : gout.to(DType::f32);
        const Tensor wd = sw.detach().contiguous();
        const Device dev = g.device();
        Tensor gx = Tensor::empty({M, in}, DType::f32, dev);
        Tensor gw = Tensor::empty({E, out, in}, DType::f32, dev);
        int64_t off = 0;
        for (int64_t e = 0; e < E; ++e) {
          const int64_t n = counts[static_cast<size_t>(e)];
          float* gw_e = f32(gw) + e * out * in;
          if (n == 0) {  // no rows: a zero gradient, as transformers gives an unused expert
            gw.flat_range(e * out * in, out * in).zero_();
            continue;
          }
          const float* g_e = f32(g) + off * out;
          gemm_f32(dev, false, n, in, out, g_e, out, f32(wd) + e * out * in, in, false,
                   f32(gx) + off * in, in);  // (n, out) @ (out, in)
          gemm_f32(dev, true, out, in, n, g_e, out, f32(sx) + off * in, in, false, gw_e,
                   in);  // (out, n) @ (n, in)
          off += n;
        }
        return {gx, gw};
      });
}

// Expert e's rows [off, off + n) of t (M, k) for each expert with rows, as (n, k) views.
std::vector<std::pair<int64_t, Tensor>> runs(const Tensor& t, const std::vector<int64_t>& counts) {
  std::vector<std::pair<int64_t, Tensor>> out;
  int64_t off = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    if (counts[e] > 0)
      out.emplace_back(static_cast<int64_t>(e), ops::slice(t, 0, off, off + counts[e]));
    off += counts[e];
  }
  return out;
}

Tensor expert_weight(const Tensor& w, int64_t e) {  // (E, out, in) -> (out, in), a view
  return ops::reshape(ops::slice(w, 0, e, e + 1), {w.size(1), w.size(2)});
}

Tensor join_rows(const std::vector<Tensor>& parts) {
  return parts.size() == 1 ? parts[0].contiguous() : ops::concat(parts, 0);
}

}  // namespace

Tensor grouped_linear(const Tensor& xs, const Tensor& w, const std::vector<int64_t>& counts) {
  DS_CHECK(xs.dim() == 2 && w.dim() == 3 && xs.size(1) == w.size(2) &&
               static_cast<int64_t>(counts.size()) == w.size(0),
           "[grouped_linear] xs {} and w {} must be (M, in) and (E, out, in) with {} counts",
           shape_str(xs.shape()), shape_str(w.shape()), counts.size());
  int64_t M = 0;
  for (int64_t n : counts) {
    DS_CHECK(n >= 0, "[grouped_linear] negative count {}", n);
    M += n;
  }
  DS_CHECK(M == xs.size(0), "[grouped_linear] counts sum to {}, xs has {} rows", M, xs.size(0));
  if (M == 0) {
    // No rows (an expert-parallel rank whose experts got no token): still a node of the graph,
    // so that w gets its (zero) gradient like on every other rank.
    const Tensor sw = w;
    return autograd::record(Tensor::zeros({0, w.size(1)}, xs.dtype(), xs.device()),
                            "GroupedLinearBackward", {xs, w},
                            [sw, in = xs.size(1)](const Tensor& g) -> std::vector<Tensor> {
                              return {Tensor::zeros({0, in}, g.dtype(), g.device()),
                                      Tensor::zeros(sw.shape(), g.dtype(), g.device())};
                            });
  }
  if (xs.dtype() == DType::f32 && w.dtype() == DType::f32 && xs.device() == w.device())
    return grouped_linear_f32(xs, w, counts);
  // Other dtypes (bf16 training): per-expert ops::linear / ops::matmul, which widen and round as
  // the dense layers do.
  std::vector<Tensor> ys;
  {
    autograd::NoGradGuard no_grad;
    for (const auto& [e, rows] : runs(xs, counts))
      ys.push_back(ops::linear(rows, expert_weight(w, e)));
  }
  Tensor y = join_rows(ys);  // (M, out)
  const Tensor sx = xs.detach();
  const Tensor sw = w;  // the parameter's own handle: ZeRO-3 re-gathers into it
  return autograd::record(
      y, "GroupedLinearBackward", {xs, w},
      [sx, sw, counts](const Tensor& g) -> std::vector<Tensor> {
        const int64_t E = sw.size(0), out = sw.size(1), in = sw.size(2);
        const Tensor wd = sw.detach();
        const auto gs = runs(g, counts), xr = runs(sx, counts);
        std::vector<Tensor> gx, gw(static_cast<size_t>(E));
        for (size_t i = 0; i < gs.size(); ++i) {
          const int64_t e = gs[i].first;
          gx.push_back(ops::matmul(gs[i].second, expert_weight(wd, e)));  // (n, out) @ (out, in)
          gw[static_cast<size_t>(e)] =
              ops::matmul(ops::contiguous(ops::transpose(gs[i].second, 0, 1)),
                          xr[i].second);  // (out, n) @ (n, in)
        }
        for (Tensor& t : gw)
          if (!t.defined()) t = Tensor::zeros({out, in}, g.dtype(), g.device());
        return {join_rows(gx), ops::reshape(ops::concat(gw, 0), {E, out, in})};
      });
}


}  // namespace ds::nn

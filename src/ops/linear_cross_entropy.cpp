// ops::linear_cross_entropy (ds/ops/ops.h): the cross entropy of x @ w^T computed a block of rows
// at a time, so the (N, V) logits and their gradient never exist whole (Liger-Kernel's fused linear
// cross entropy). Per block: logits = x_r @ w^T (GEMM, fp32 out; rounded to the inputs' 16-bit
// dtype, as the unfused linear's output would be, and read in that dtype by the cross-entropy
// kernels), the kernels give the losses, each row's log-sum-exp and, when a gradient is wanted,
// dlogits = (softmax - onehot) / count (in the inputs' dtype); then dx_r = dlogits @ w and
// dw += dlogits^T @ x_r (fp32 accumulation). Backward only
// scales the stored dx and dw by the upstream gradient. A constant logit bias is added to each
// block's logits (in place, a stride-0 view of the (V) bias as the second operand).
#include <algorithm>

#include "ds/autograd/grad_mode.h"
#include "ds/autograd/node.h"
#include "ds/ops/flop_count.h"
#include "ds/ops/ops.h"
#include "ops/op_util.h"

namespace ds::ops {
using detail::be;

namespace {

// rows x cols view of a contiguous buffer, starting at element `offset`.
Tensor block(const Tensor& buf, int64_t offset, int64_t rows, int64_t cols) {
  return Tensor::from_storage(buf.storage(), {rows, cols}, buf.dtype(),
                              buf.storage_offset() + offset);
}

// c (m, n) = or += op(a) @ op(b), row-major operands of dtype dt; c fp32, or 16-bit where the
// backend supports("gemm_out16", dt) (rounded once).
void gemm(backend::Backend& bk, DType dt, const Tensor& a, bool trans_a, const Tensor& b,
          bool trans_b, const Tensor& c, bool accumulate) {
  backend::Gemm g;
  g.dtype = dt;
  g.c_dtype = c.dtype();
  g.trans_a = trans_a;
  g.trans_b = trans_b;
  g.m = c.size(0);
  g.n = c.size(1);
  g.k = trans_a ? a.size(0) : a.size(1);
  g.a = a.raw_data();
  g.lda = a.size(1);
  g.b = b.raw_data();
  g.ldb = b.size(1);
  g.c = c.raw_data();
  g.ldc = c.size(1);
  g.beta = accumulate ? 1.0f : 0.0f;
  bk.gemm(g);
}

}  // namespace

int64_t linear_cross_entropy_block_rows(int64_t rows, int64_t vocab) {
  // About 16M logits (64 MiB in fp32) per block: large enough for full-speed GEMMs.
  constexpr int64_t kBlockElements = int64_t{1} << 24;
  return std::clamp<int64_t>(kBlockElements / std::max<int64_t>(vocab, 1), 1,
                             std::max<int64_t>(rows, 1));
}

namespace {

// The arguments' checks (errors name the op).
void check_args(const Tensor& x, const Tensor& w, const Tensor& targets, const Tensor& logit_bias) {
  detail::check_float(x, "linear_cross_entropy");
  detail::check_float(w, "linear_cross_entropy");
  detail::check_same_device(x, w, "linear_cross_entropy");
  DS_CHECK(targets.defined() && (targets.dtype() == DType::i32 || targets.dtype() == DType::i64),
           "[linear_cross_entropy] targets must be int32 or int64");
  detail::check_same_device(x, targets, "linear_cross_entropy");
  DS_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1),
           "[linear_cross_entropy] x {} and w {} must be (N, C) and (V, C)", shape_str(x.shape()),
           shape_str(w.shape()));
  const int64_t N = x.size(0), V = w.size(0);
  DS_CHECK(V > 0, "[linear_cross_entropy] the weight has no classes");
  DS_CHECK(targets.dim() == 1 && targets.size(0) == N,
           "[linear_cross_entropy] targets {} must be ({}), one per row of x",
           shape_str(targets.shape()), N);
  if (logit_bias.defined()) {
    detail::check_float(logit_bias, "linear_cross_entropy");
    detail::check_same_device(x, logit_bias, "linear_cross_entropy");
    DS_CHECK(logit_bias.numel() == V && logit_bias.size(-1) == V,
             "[linear_cross_entropy] logit_bias {} must hold one value per class ({})",
             shape_str(logit_bias.shape()), V);
    DS_CHECK(!logit_bias.requires_grad(),
             "[linear_cross_entropy] logit_bias is a constant (a buffer such as BART's "
             "final_logits_bias); for a trained bias use linear + cross_entropy");
  }
}

}  // namespace

Tensor linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& targets,
                            int64_t ignore_index, int64_t block_rows, const Tensor& logit_bias) {
  check_args(x, w, targets, logit_bias);
  const int64_t N = x.size(0), C = x.size(1), V = w.size(0);
  const detail::CountOp counted(
      "linear_cross_entropy",
      detail::gemm_cost(static_cast<double>(N) * static_cast<double>(C) * static_cast<double>(V)));
  const Tensor tc = targets.contiguous();
  const int64_t count = detail::count_targets(tc, V, ignore_index);
  // The GEMMs run in the operands' common dtype (fp32 when they differ), as ops::linear's.
  const DType dt = x.dtype() == w.dtype() ? x.dtype() : DType::f32;
  const Tensor xc = x.dtype() == dt ? x.contiguous() : x.to(dt);
  const Tensor wc = w.dtype() == dt ? w.contiguous() : w.to(dt);
  const bool need_x = x.requires_grad(), need_w = w.requires_grad();
  const bool grad = autograd::is_grad_enabled() && (need_x || need_w);
  backend::Backend& bk = be(x);
  const Device dev = x.device();

  const int64_t R = block_rows > 0 ? std::min(block_rows, std::max<int64_t>(N, 1))
                                   : linear_cross_entropy_block_rows(N, V);
  // 16-bit inputs: each block's logits are the linear's output rounded to that dtype. Where the
  // backend's cross-entropy kernels take 16-bit logits, they read that rounded block directly and
  // write the 16-bit gradient over it (the GEMMs' operand), and where its GEMM writes a 16-bit C
  // the block is never fp32 at all; otherwise the rounded values go back to fp32 for the kernels.
  const bool narrow = dt != DType::f32;
  const bool direct = narrow && bk.supports("cross_entropy_forward", dt) &&
                      bk.supports("cross_entropy_backward", dt);
  // On that path the GEMM writes the 16-bit block itself where it can: no fp32 block at all.
  const bool gemm16 = direct && bk.supports("gemm_out16", dt);
  const Tensor logits = gemm16 ? Tensor() : Tensor::empty({R * V}, DType::f32, dev);  // one block's
  const Tensor rounded = narrow ? Tensor::empty({R * V}, dt, dev) : Tensor();
  const Tensor dlogits = grad && !direct ? Tensor::empty({R * V}, DType::f32, dev) : Tensor();
  const Tensor losses = Tensor::empty({N}, DType::f32, dev),
               lse = Tensor::empty({N}, DType::f32, dev);
  const Tensor dx = grad && need_x ? Tensor::empty({N, C}, DType::f32, dev) : Tensor();
  const Tensor dw = grad && need_w ? Tensor::empty({V, C}, DType::f32, dev) : Tensor();
  // The bias in fp32, read by each block as a stride-0 (r, V) view; for 16-bit inputs first
  // rounded to their dtype, as add(linear(x, w), logit_bias.to(dtype)) rounds it.
  const Tensor bias = !logit_bias.defined() ? Tensor()
                      : narrow              ? logit_bias.to(dt).to(DType::f32).contiguous()
                                            : logit_bias.to(DType::f32).contiguous();
  const float inv_count = count > 0 ? 1.0f / static_cast<float>(count) : 0.0f;
  for (int64_t r0 = 0; r0 < N; r0 += R) {
    const int64_t r = std::min(R, N - r0);
    const Tensor xr = block(xc, r0 * C, r, C);
    // The logits the kernels read: fp32, or 16-bit as the linear's (and the bias add's) output.
    const Tensor lg = gemm16 ? Tensor() : block(logits, 0, r, V);
    Tensor in = narrow ? block(rounded, 0, r, V) : lg;
    if (gemm16) {
      gemm(bk, dt, xr, false, wc, true, in, false);  // (r, C) @ (V, C)^T, rounded in the GEMM
    } else {
      gemm(bk, dt, xr, false, wc, true, lg, false);
      if (narrow) in.copy_from(lg);  // the linear's output
    }
    if (bias.defined()) {  // then add(logits, bias), rounded as its output
      const Tensor rows =
          Tensor::from_storage(bias.storage(), {r, V}, DType::f32, bias.storage_offset(), {0, 1});
      bk.binary(backend::BinaryOp::add, in, rows, in);
    }
    if (narrow && !direct) {
      lg.copy_from(in);
      in = lg;
    }
    const Tensor tr = tc.flat_range(r0, r);
    const Tensor lr = lse.flat_range(r0, r);
    bk.cross_entropy_forward(in, tr, ignore_index, losses.flat_range(r0, r), lr);
    if (!grad) continue;
    // The GEMM operand: 16-bit as the unfused backward's (written over the 16-bit logits when
    // the kernel takes them), else fp32.
    Tensor dd = direct ? in : block(dlogits, 0, r, V);
    bk.cross_entropy_backward(in, tr, ignore_index, lr, inv_count, dd);
    if (narrow && !direct) {
      const Tensor d16 = block(rounded, 0, r, V);
      d16.copy_from(dd);
      dd = d16;
    }
    if (dx.defined()) gemm(bk, dt, dd, false, wc, false, block(dx, r0 * C, r, C), false);
    if (dw.defined()) gemm(bk, dt, dd, true, xr, false, dw, r0 > 0);  // (r, V)^T @ (r, C)
  }
  if (dw.defined() && N == 0) dw.zero_();
  double total = 0.0;  // in row order, in double: the value cross_entropy gives
  {
    const std::vector<float> lv = losses.to_vector();
    for (float l : lv) total += l;
  }
  const float loss = count > 0 ? static_cast<float>(total / static_cast<double>(count)) : 0.0f;
  Tensor out = Tensor::full({}, loss, DType::f32, dev);
  if (!grad) return out;
  const DType xt = x.dtype(), wt = w.dtype();
  return autograd::record(out, "LinearCrossEntropyBackward", {x, w},
                          [=](const Tensor& g) -> std::vector<Tensor> {
                            const float s = g.item();
                            auto scaled = [s](const Tensor& t, DType to) {
                              if (!t.defined()) return Tensor();
                              Tensor u = s == 1.0f ? t : t.clone();
                              if (s != 1.0f) mul_(u, s);
                              return detail::as_dtype(u, to);
                            };
                            return {scaled(dx, xt), scaled(dw, wt)};
                          });
}

}  // namespace ds::ops

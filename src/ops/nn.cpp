// Neural-network ops: embedding, normalisation, activations, softmax, attention, rotary embedding,
// dropout and cross-entropy. Each validates its arguments, runs the kernel of the tensors' backend
// and records its backward. Results come back in the input's dtype. A 16-bit input goes to the
// kernel as it is when the backend says its kernels take that dtype (Backend::supports: the CPU's
// norms, activations, softmax, attention and rotary kernels do, computing in fp32 a block at a
// time; see direct16 below); otherwise it is widened to an fp32 copy (f32c), the fp32 kernel runs
// and the result is narrowed. Backward closures save detached tensors (16-bit as they are on the direct
// path, fp32 copies otherwise), never the op's own output with its history.
#include <algorithm>
#include <cmath>

#include "ds/autograd/grad_mode.h"
#include "ds/autograd/node.h"
#include "ds/core/rng.h"
#include "ds/ops/flop_count.h"
#include "ds/ops/ops.h"
#include "ops/op_util.h"

namespace ds::ops {
using backend::BinaryOp;
using backend::UnaryOp;
using detail::as_dtype;
using detail::be;
using detail::f32c;

namespace {

bool wants_grad(std::initializer_list<Tensor> inputs) {
  return autograd::is_grad_enabled() && autograd::any_requires_grad(inputs);
}

void check_index(const Tensor& ids, const char* op, const char* what) {
  DS_CHECK(ids.defined(), "[{}] undefined {}", op, what);
  DS_CHECK(ids.dtype() == DType::i32 || ids.dtype() == DType::i64,
           "[{}] {} must be int32 or int64, got {}", op, what, dtype_name(ids.dtype()));
}

// Rows of a (..., C) tensor.
int64_t rows_of(const Tensor& x) { return x.dim() == 0 ? 1 : x.numel() / std::max<int64_t>(x.size(-1), 1); }

Tensor empty_f32(const Shape& s, const Tensor& like) { return Tensor::empty(s, DType::f32, like.device()); }

void check_norm_args(const Tensor& x, const Tensor& w, const Tensor& b, const char* op) {
  detail::check_float(x, op);
  detail::check_float(w, op);
  DS_CHECK(x.dim() >= 1, "[{}] input must have at least one dim", op);
  const int64_t C = x.size(-1);
  DS_CHECK(w.dim() == 1 && w.size(0) == C, "[{}] weight {} does not match the last dim of {}", op,
           shape_str(w.shape()), shape_str(x.shape()));
  detail::check_same_device(x, w, op);
  if (b.defined()) {
    detail::check_float(b, op);
    DS_CHECK(b.dim() == 1 && b.size(0) == C, "[{}] bias {} does not match the last dim of {}", op,
             shape_str(b.shape()), shape_str(x.shape()));
    detail::check_same_device(x, b, op);
  }
}

// Whether x is 16-bit and its backend's kernels (every one named: forward and backward) take that
// dtype directly. Then the op hands its tensors over as they are (contiguous) and allocates outputs
// in x's dtype: no fp32 copy of the activations. Otherwise (fp32, or a backend without such
// kernels: CUDA today) the f32c path: fp32 inputs, fp32 outputs narrowed to x's dtype.
bool direct16(const Tensor& x, std::initializer_list<const char*> kernels) {
  if (x.dtype() == DType::f32) return false;
  for (const char* k : kernels)
    if (!be(x).supports(k, x.dtype())) return false;
  return true;
}

// A kernel input on either path (undefined stays undefined).
Tensor kin(const Tensor& t, bool direct) {
  if (!t.defined()) return t;
  return direct ? t.contiguous() : f32c(t);
}

// A kernel output of shape s for an op on `like` (like's dtype on the direct path, else fp32).
Tensor kout(const Shape& s, const Tensor& like, bool direct) {
  return Tensor::empty(s, direct ? like.dtype() : DType::f32, like.device());
}

// A kernel output as the op's result in dtype dt.
Tensor result(const Tensor& y, DType dt, bool direct) { return direct ? y : as_dtype(y, dt); }

// A unary activation whose backward is a BinaryOp of (upstream gradient, saved input).
Tensor activation(UnaryOp fwd, BinaryOp bwd, const char* name, const char* node_name, const Tensor& x) {
  detail::check_float(x, name);
  const detail::CountOp counted(name, detail::elementwise_cost(static_cast<double>(x.numel())));
  const bool d16 = direct16(x, {"unary", "binary"});
  Tensor fx = kin(x, d16);
  Tensor y = kout(x.shape(), x, d16);
  be(x).unary(fwd, fx, y, 0.0f);
  Tensor out = result(y, x.dtype(), d16);
  if (!wants_grad({x})) return out;
  Tensor sx = fx.detach();
  const DType dt = x.dtype();
  return autograd::record(out, node_name, {x}, [sx, bwd, dt, d16](const Tensor& g) -> std::vector<Tensor> {
    Tensor gc = kin(g, d16);
    Tensor dx = kout(sx.shape(), sx, d16);
    be(sx).binary(bwd, gc, sx, dx);
    return {result(dx, dt, d16)};
  });
}

}  // namespace

// ---- embedding ----

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  detail::check_float(weight, "embedding");
  check_index(ids, "embedding", "ids");
  DS_CHECK(weight.dim() == 2, "[embedding] weight must be (V, C), got {}", shape_str(weight.shape()));
  detail::check_same_device(weight, ids, "embedding");
  const int64_t V = weight.size(0), C = weight.size(1);
  Tensor idc = ids.contiguous();
  if (idc.device().is_cpu()) {  // device ids are checked by that backend's kernel
    const bool i64 = idc.dtype() == DType::i64;
    const void* p = idc.raw_data();
    const int64_t N = idc.numel();
    for (int64_t n = 0; n < N; ++n) {
      const int64_t id = i64 ? static_cast<const int64_t*>(p)[n] : static_cast<const int32_t*>(p)[n];
      DS_CHECK(id >= 0 && id < V, "[embedding] id {} (at position {}) is out of range for vocabulary size {}",
               id, n, V);
    }
  }
  Shape os = ids.shape();
  os.push_back(C);
  // 16-bit tables are gathered as they are and their gradient summed into a 16-bit table (fp32
  // sums, rounded once) where the backend can: no fp32 copy of the (V, C) table either way.
  const bool d16 = direct16(weight, {"embedding_forward", "embedding_backward"});
  Tensor y = kout(os, weight, d16);
  be(weight).embedding_forward(kin(weight, d16), idc, y);
  Tensor out = result(y, weight.dtype(), d16);
  if (!wants_grad({weight})) return out;
  const DType wd = weight.dtype();
  const Tensor sid = idc.detach();
  return autograd::record(out, "EmbeddingBackward", {weight}, [sid, V, C, wd, d16](const Tensor& g) -> std::vector<Tensor> {
    Tensor dw = Tensor::zeros({V, C}, d16 ? wd : DType::f32, g.device());
    be(g).embedding_backward(kin(g, d16), sid, dw);
    return {result(dw, wd, d16)};
  });
}

// ---- normalisation ----

Tensor layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, float eps) {
  check_norm_args(x, w, b, "layer_norm");
  const detail::CountOp counted(
      "layer_norm", detail::elementwise_cost(static_cast<double>(x.numel()), w.defined() ? 5 : 4));
  const int64_t C = x.size(-1), rows = rows_of(x);
  const bool d16 = direct16(x, {"layer_norm_forward", "layer_norm_backward"});
  Tensor fx = kin(x, d16), fw = kin(w, d16), fb = kin(b, d16);
  Tensor y = kout(x.shape(), x, d16);
  Tensor mean = empty_f32({rows}, x), rstd = empty_f32({rows}, x);  // (rows)
  be(x).layer_norm_forward(fx, fw, fb, eps, y, mean, rstd);
  Tensor out = result(y, x.dtype(), d16);
  if (!wants_grad({x, w, b})) return out;
  const Tensor sx = fx.detach(), sw = fw.detach();
  const bool has_b = b.defined();
  const DType xd = x.dtype(), wd = w.dtype(), bd = has_b ? b.dtype() : DType::f32;
  return autograd::record(out, "LayerNormBackward", {x, w, b},
                          [=](const Tensor& g) -> std::vector<Tensor> {
                            Tensor dx = kout(sx.shape(), sx, d16);
                            // Weight gradients: fp32 sums over the rows, whatever x's dtype.
                            Tensor dw = Tensor::zeros({C}, DType::f32, sx.device());
                            Tensor db = has_b ? Tensor::zeros({C}, DType::f32, sx.device()) : Tensor();
                            be(sx).layer_norm_backward(kin(g, d16), sx, sw, mean, rstd, dx, dw, db);
                            return {result(dx, xd, d16), as_dtype(dw, wd), has_b ? as_dtype(db, bd) : Tensor()};
                          });
}

Tensor rms_norm(const Tensor& x, const Tensor& w, float eps) {
  check_norm_args(x, w, Tensor(), "rms_norm");
  const detail::CountOp counted("rms_norm", detail::elementwise_cost(static_cast<double>(x.numel()), 4));
  const int64_t C = x.size(-1), rows = rows_of(x);
  const bool d16 = direct16(x, {"rms_norm_forward", "rms_norm_backward"});
  Tensor fx = kin(x, d16), fw = kin(w, d16);
  Tensor y = kout(x.shape(), x, d16);
  Tensor rstd = empty_f32({rows}, x);  // (rows)
  be(x).rms_norm_forward(fx, fw, eps, y, rstd);
  Tensor out = result(y, x.dtype(), d16);
  if (!wants_grad({x, w})) return out;
  const Tensor sx = fx.detach(), sw = fw.detach();
  const DType xd = x.dtype(), wd = w.dtype();
  return autograd::record(out, "RMSNormBackward", {x, w}, [=](const Tensor& g) -> std::vector<Tensor> {
    Tensor dx = kout(sx.shape(), sx, d16);
    Tensor dw = Tensor::zeros({C}, DType::f32, sx.device());  // fp32 sum over the rows
    be(sx).rms_norm_backward(kin(g, d16), sx, sw, rstd, dx, dw);
    return {result(dx, xd, d16), as_dtype(dw, wd)};
  });
}

// ---- activations ----

Tensor gelu(const Tensor& x) {
  return activation(UnaryOp::gelu, BinaryOp::gelu_backward, "gelu", "GeluBackward", x);
}
Tensor gelu_erf(const Tensor& x) {
  detail::check_float(x, "gelu_erf");
  const detail::CountOp counted("gelu_erf", detail::elementwise_cost(static_cast<double>(x.numel())));
  const bool d16 = direct16(x, {"gelu_erf_forward", "gelu_erf_backward"});
  Tensor fx = kin(x, d16);
  Tensor y = kout(x.shape(), x, d16);
  be(x).gelu_erf_forward(fx, y);
  Tensor out = result(y, x.dtype(), d16);
  if (!wants_grad({x})) return out;
  Tensor sx = fx.detach();
  const DType dt = x.dtype();
  return autograd::record(out, "GeluErfBackward", {x}, [sx, dt, d16](const Tensor& g) -> std::vector<Tensor> {
    Tensor dx = kout(sx.shape(), sx, d16);
    be(sx).gelu_erf_backward(kin(g, d16), sx, dx);
    return {result(dx, dt, d16)};
  });
}

Tensor silu(const Tensor& x) {
  return activation(UnaryOp::silu, BinaryOp::silu_backward, "silu", "SiluBackward", x);
}

Tensor swiglu(const Tensor& gate, const Tensor& up) {
  detail::check_float(gate, "swiglu");
  detail::check_float(up, "swiglu");
  detail::check_same_device(gate, up, "swiglu");
  DS_CHECK(gate.shape() == up.shape(), "[swiglu] gate {} and up {} must have the same shape",
           shape_str(gate.shape()), shape_str(up.shape()));
  DS_CHECK(gate.dtype() == up.dtype(), "[swiglu] dtypes differ: {} and {}", dtype_name(gate.dtype()),
           dtype_name(up.dtype()));
  const detail::CountOp counted("swiglu", detail::elementwise_cost(static_cast<double>(gate.numel())));
  const bool d16 = direct16(gate, {"swiglu_forward", "swiglu_backward"});
  Tensor fg = kin(gate, d16), fu = kin(up, d16);
  Tensor y = kout(gate.shape(), gate, d16);
  be(gate).swiglu_forward(fg, fu, y);
  Tensor out = result(y, gate.dtype(), d16);
  if (!wants_grad({gate, up})) return out;
  const Tensor sg = fg.detach(), su = fu.detach();
  const bool ng = gate.requires_grad(), nu = up.requires_grad();
  const DType dt = gate.dtype();
  return autograd::record(out, "SwiGLUBackward", {gate, up}, [=](const Tensor& g) -> std::vector<Tensor> {
    // dgate = g * up * silu'(gate), dup = g * silu(gate) (silu recomputed rather than saved)
    Tensor dgate = ng ? kout(sg.shape(), sg, d16) : Tensor();
    Tensor dup = nu ? kout(sg.shape(), sg, d16) : Tensor();
    be(sg).swiglu_backward(kin(g, d16), sg, su, dgate, dup);
    return {ng ? result(dgate, dt, d16) : Tensor(), nu ? result(dup, dt, d16) : Tensor()};
  });
}

// ---- softmax ----

Tensor softmax(const Tensor& x) {
  detail::check_float(x, "softmax");
  DS_CHECK(x.dim() >= 1, "[softmax] input must have at least one dim");
  const detail::CountOp counted("softmax", detail::elementwise_cost(static_cast<double>(x.numel())));
  const bool d16 = direct16(x, {"softmax_forward", "softmax_backward"});
  Tensor fx = kin(x, d16);
  Tensor y = kout(x.shape(), x, d16);
  be(x).softmax_forward(fx, y);
  Tensor out = result(y, x.dtype(), d16);
  if (!wants_grad({x})) return out;
  // The backward reads y: fp32 on the f32c path, the rounded 16-bit output on the direct path.
  const Tensor sy = y.detach();
  const DType dt = x.dtype();
  return autograd::record(out, "SoftmaxBackward", {x}, [sy, dt, d16](const Tensor& g) -> std::vector<Tensor> {
    Tensor dx = kout(sy.shape(), sy, d16);
    be(sy).softmax_backward(sy, kin(g, d16), dx);
    return {result(dx, dt, d16)};
  });
}

// ---- attention ----

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionMask& mask,
                 float scale_in) {
  for (const Tensor* t : {&q, &k, &v}) detail::check_float(*t, "attention");
  DS_CHECK(q.dim() == 4 && k.dim() == 4 && k.shape() == v.shape() && k.size(0) == q.size(0) &&
               k.size(1) == q.size(1) && k.size(3) == q.size(3),
           "[attention] q must be (B, NH, Tq, hd) and k, v (B, NH, Tk, hd), got {}, {}, {}",
           shape_str(q.shape()), shape_str(k.shape()), shape_str(v.shape()));
  DS_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(), "[attention] q, k, v dtypes differ");
  detail::check_same_device(q, k, "attention");
  detail::check_same_device(q, v, "attention");
  const int64_t B = q.size(0), NH = q.size(1), Tq = q.size(2), Tk = k.size(2), hd = q.size(3);
  DS_CHECK(hd > 0, "[attention] head size must be positive");
  DS_CHECK(!mask.causal || Tq <= Tk,
           "[attention] causal attention needs at most as many queries ({}) as keys ({})", Tq, Tk);
  DS_CHECK(mask.key_lengths.empty() || static_cast<int64_t>(mask.key_lengths.size()) == B,
           "[attention] {} key lengths for a batch of {}", mask.key_lengths.size(), B);
  for (size_t b = 0; b < mask.key_lengths.size(); ++b)
    DS_CHECK(mask.key_lengths[b] >= 1 && mask.key_lengths[b] <= Tk,
             "[attention] key length {} of batch row {} outside [1, {}]: every row needs a "
             "visible key",
             mask.key_lengths[b], b, Tk);
  DS_CHECK(mask.window >= 0 && (mask.window == 0 || (mask.causal && mask.key_lengths.empty())),
           "[attention] a sliding window ({}) must be >= 0 and needs causal attention without key "
           "lengths",
           mask.window);
  DS_CHECK(mask.softcap >= 0.0f && std::isfinite(mask.softcap),
           "[attention] softcap must be finite and >= 0 (0 = none), got {}", mask.softcap);
  const float scale = scale_in > 0.0f ? scale_in : 1.0f / std::sqrt(static_cast<float>(hd));
  const detail::CountOp counted(
      "attention", detail::gemm_cost(static_cast<double>(q.numel()) * static_cast<double>(Tk) +
                                     static_cast<double>(B * NH * Tq) * static_cast<double>(Tk) *
                                         static_cast<double>(v.size(3))));
  const bool d16 = direct16(q, {"attention_forward", "attention_backward"});
  Tensor fq = kin(q, d16), fk = kin(k, d16), fv = kin(v, d16);
  Tensor o = kout(q.shape(), q, d16);  // (B, NH, Tq, hd)
  Tensor lse = empty_f32({B, NH, Tq}, q);  // fp32 on both paths
  be(q).attention_forward(fq, fk, fv, scale, mask.causal, mask.key_lengths, mask.window,
                          mask.softcap, o, lse);
  Tensor out = result(o, q.dtype(), d16);
  if (!wants_grad({q, k, v})) return out;
  // The backward reads o: fp32 on the f32c path, the rounded 16-bit output on the direct path.
  const Tensor sq = fq.detach(), sk = fk.detach(), sv = fv.detach(), so = o.detach();
  const DType dt = q.dtype();
  const bool nq = q.requires_grad(), nk = k.requires_grad(), nv = v.requires_grad();
  return autograd::record(out, mask.causal ? "CausalAttentionBackward" : "AttentionBackward", {q, k, v}, [=](const Tensor& g) -> std::vector<Tensor> {
    Tensor dq = kout(sq.shape(), sq, d16), dk = kout(sk.shape(), sk, d16), dv = kout(sv.shape(), sv, d16);
    be(sq).attention_backward(kin(g, d16), sq, sk, sv, so, lse, scale, mask.causal,
                              mask.key_lengths, mask.window, mask.softcap, dq, dk, dv);
    return {nq ? result(dq, dt, d16) : Tensor(), nk ? result(dk, dt, d16) : Tensor(), nv ? result(dv, dt, d16) : Tensor()};
  });
}

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v) {
  DS_CHECK(q.defined() && k.defined() && v.defined() && k.shape() == q.shape() &&
               v.shape() == q.shape(),
           "[causal_attention] q, k, v shapes differ: {}, {}, {}", shape_str(q.shape()),
           shape_str(k.shape()), shape_str(v.shape()));
  return attention(q, k, v, AttentionMask{});
}

// ---- rotary embedding ----

Tensor rope(const Tensor& x, float theta, int64_t pos0) {
  DS_CHECK(theta > 0.0f, "[rope] theta must be positive, got {}", theta);
  DS_CHECK(x.defined() && x.dim() == 4, "[rope] x must be (B, NH, T, hd), got {}",
           x.defined() ? shape_str(x.shape()) : "undefined");
  const int64_t hd = x.size(3);
  DS_CHECK(hd % 2 == 0, "[rope] head size {} must be even (pairs (i, i + hd/2) rotate)", hd);
  std::vector<double> inv(static_cast<size_t>(hd / 2));
  for (int64_t i = 0; i < hd / 2; ++i)
    inv[static_cast<size_t>(i)] = std::pow(static_cast<double>(theta), -2.0 * static_cast<double>(i) / static_cast<double>(hd));
  return rope(x, inv, 1.0f, pos0);
}

Tensor rope(const Tensor& x, const std::vector<double>& inv_freq, float scale, int64_t pos0,
            bool interleaved) {
  detail::check_float(x, "rope");
  DS_CHECK(x.dim() == 4, "[rope] x must be (B, NH, T, hd), got {}", shape_str(x.shape()));
  const int64_t half = static_cast<int64_t>(inv_freq.size());
  DS_CHECK(half > 0 && 2 * half <= x.size(3),
           "[rope] {} inverse frequencies for head size {} (need 1 .. hd/2: the first 2 * {} "
           "dims rotate)",
           inv_freq.size(), x.size(3), inv_freq.size());
  DS_CHECK(pos0 >= 0, "[rope] pos0 must be non-negative, got {}", pos0);
  const detail::CountOp counted("rope", detail::elementwise_cost(static_cast<double>(x.numel()), 3));
  const bool d16 = direct16(x, {"rope"});
  Tensor fx = kin(x, d16);
  Tensor y = kout(x.shape(), x, d16);
  be(x).rope(fx, pos0, inv_freq, scale, interleaved, /*inverse=*/false, y);
  Tensor out = result(y, x.dtype(), d16);
  if (!wants_grad({x})) return out;
  const DType dt = x.dtype();
  // scale * rotation: its transpose is scale * the inverse rotation, the gradient's map (the
  // dims that pass through pass their gradient through).
  return autograd::record(out, "RopeBackward", {x}, [inv_freq, scale, pos0, interleaved, dt, d16](const Tensor& g) -> std::vector<Tensor> {
    Tensor gc = kin(g, d16);
    Tensor dx = Tensor::empty(gc.shape(), d16 ? dt : DType::f32, gc.device());
    be(gc).rope(gc, pos0, inv_freq, scale, interleaved, /*inverse=*/true, dx);
    return {result(dx, dt, d16)};
  });
}

// ---- dropout ----

Tensor dropout(const Tensor& x, float p, bool training) {
  detail::check_float(x, "dropout");
  DS_CHECK(p >= 0.0f && p < 1.0f, "[dropout] p = {} must be in [0, 1)", p);
  if (!training || p == 0.0f) return x;
  const detail::CountOp counted("dropout", {});  // 0, as DeepSpeed's rule for F.dropout
  // One counter stream per call; the index within it is the element's global position, with the
  // batch offset of this rank's first sample, so the mask of a sample does not depend on which
  // rank (or how many) processes it.
  auto& st = rng::dropout_state();
  const uint64_t seed = st.seed, stream = st.offset;
  st.offset += 1;
  const int64_t n = x.numel();
  const int64_t per_sample = x.dim() >= 1 && x.size(0) > 0 ? n / x.size(0) : n;
  const uint64_t base = st.sample_base * static_cast<uint64_t>(per_sample);
  Tensor xc = x.contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  be(x).dropout(xc, p, seed, stream, base, out);
  if (!wants_grad({x})) return out;
  return autograd::record(out, "DropoutBackward", {x}, [=](const Tensor& g) -> std::vector<Tensor> {
    // Same (seed, stream, base): the mask is recomputed, not stored.
    Tensor gc = g.contiguous();
    Tensor dx = Tensor::empty(gc.shape(), gc.dtype(), gc.device());
    be(gc).dropout(gc, p, seed, stream, base, dx);
    return {dx};
  });
}

// ---- cross-entropy ----

// Mean over targets != ignore_index. When every target is ignored the loss is 0 and the gradient
// is zero (PyTorch returns NaN there; a batch of padding should not poison training).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  detail::check_float(logits, "cross_entropy");
  const detail::CountOp counted("cross_entropy", {});  // 0: DeepSpeed does not count F.cross_entropy
  check_index(targets, "cross_entropy", "targets");
  detail::check_same_device(logits, targets, "cross_entropy");
  DS_CHECK(logits.dim() >= 2, "[cross_entropy] logits must be (N, V), got {}", shape_str(logits.shape()));
  const Shape lead(logits.shape().begin(), logits.shape().end() - 1);
  DS_CHECK(targets.shape() == lead, "[cross_entropy] targets {} do not match logits {} (expected {})",
           shape_str(targets.shape()), shape_str(logits.shape()), shape_str(lead));
  const int64_t V = logits.size(-1), N = shape_numel(lead);
  DS_CHECK(V > 0, "[cross_entropy] logits have no classes");
  Tensor tc = targets.contiguous();
  const int64_t count = detail::count_targets(tc, V, ignore_index);
  // 16-bit logits go to the kernels as they are where the backend takes them (fp32 math on the
  // widened values, a chunk at a time), and the gradient comes back in their dtype.
  const bool d16 = direct16(logits, {"cross_entropy_forward", "cross_entropy_backward"});
  Tensor fl = kin(logits, d16);
  Tensor losses = empty_f32({N}, logits), lse = empty_f32({N}, logits);  // (N)
  be(logits).cross_entropy_forward(fl, tc, ignore_index, losses, lse);
  double total = 0.0;  // fixed order, double: deterministic and exact enough for any N
  {
    const std::vector<float> lv = losses.to_vector();
    for (float l : lv) total += l;
  }
  const float loss = count > 0 ? static_cast<float>(total / static_cast<double>(count)) : 0.0f;
  Tensor out = Tensor::full({}, loss, DType::f32, logits.device());
  if (!wants_grad({logits})) return out;
  const Tensor sl = fl.detach();
  const DType dt = logits.dtype();
  return autograd::record(out, "CrossEntropyBackward", {logits}, [=](const Tensor& g) -> std::vector<Tensor> {
    const float scale = count > 0 ? g.item() / static_cast<float>(count) : 0.0f;
    Tensor d = kout(sl.shape(), sl, d16);
    be(sl).cross_entropy_backward(sl, tc, ignore_index, lse, scale, d);
    return {result(d, dt, d16)};
  });
}

Tensor bce_with_logits(const Tensor& logits, const Tensor& targets) {
  detail::check_float(logits, "bce_with_logits");
  detail::check_float(targets, "bce_with_logits");
  DS_CHECK(logits.shape() == targets.shape(),
           "[bce_with_logits] targets {} must have the shape of the logits {}",
           shape_str(targets.shape()), shape_str(logits.shape()));
  detail::check_same_device(logits, targets, "bce_with_logits");
  const int64_t n = logits.numel();
  DS_CHECK(n > 0, "[bce_with_logits] empty logits");
  const Tensor fx = f32c(logits), fy = f32c(targets);
  const double total = be(logits).bce_with_logits_sum(fx, fy);
  Tensor out = Tensor::full({}, total / static_cast<double>(n), DType::f32, logits.device());
  if (!wants_grad({logits})) return out;
  const Tensor sx = fx.detach(), sy = fy.detach();
  const DType dt = logits.dtype();
  return autograd::record(out, "BCEWithLogitsBackward", {logits}, [=](const Tensor& g) -> std::vector<Tensor> {
    // d/dx = (sigmoid(x) - y) / n
    Tensor d = empty_f32(sx.shape(), sx);
    be(sx).bce_with_logits_backward(sx, sy, g.item() / static_cast<double>(n), d);
    return {as_dtype(d, dt)};
  });
}

}  // namespace ds::ops

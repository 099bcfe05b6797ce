// The Adam and SGD inner loops, written once against a tiny vector vocabulary and included by
// cpu_adam_sgd.cpp into one namespace per instruction set (scalar, avx2, avx512). The including
// namespace provides:
//   vf                         the vector type (float for the scalar path)
//   kW                         floats per vector (1, 8, 16)
//   vload(const float*) / vstore(float*, vf) / vset1(float)
//   vmul(a, b) = a*b,  vfma(a, b, c) = a*b + c (one rounding),  vdiv(a, b),  vsqrt(a)
//   vstore_bf16 / vstore_f16 (uint16_t*, vf): round to nearest even, kW values
// Every path performs the same IEEE operations in the same order, so results are bitwise equal
// across paths; nothing may be written as a*b + c here (the compiler could contract it to an fma
// on one path and not another), always vmul or vfma explicitly.
//
// Each kernel handles the largest multiple of kW elements of [0, n) and returns that count; the
// caller finishes the tail with the scalar path (which handles everything).
// No include guard: included several times on purpose.

inline void store16(uint16_t* out16, Out16 kind, vf x) {
  if (kind == Out16::bf16)
    vstore_bf16(out16, x);
  else
    vstore_f16(out16, x);
}

inline int64_t adam_kernel(float* p, const float* g, float* m, float* v, int64_t n,
                           const AdamConsts& k, uint16_t* out16, Out16 kind) {
  const vf gs = vset1(k.grad_scale), b1 = vset1(k.beta1), omb1 = vset1(k.one_minus_beta1);
  const vf b2 = vset1(k.beta2), omb2 = vset1(k.one_minus_beta2), eps = vset1(k.eps);
  const vf isbc2 = vset1(k.inv_sqrt_bc2), step_size = vset1(k.neg_step_size);
  const vf wd = vset1(k.weight_decay), neg_lr_wd = vset1(k.neg_lr_wd);
  int64_t i = 0;
  for (; i + kW <= n; i += kW) {
    vf gi = vmul(vload(g + i), gs);
    vf pi = vload(p + i);
    if (k.l2_decay) gi = vfma(wd, pi, gi);
    const vf mi = vfma(gi, omb1, vmul(vload(m + i), b1));
    const vf vi = vfma(vmul(gi, gi), omb2, vmul(vload(v + i), b2));
    const vf denom = vfma(vsqrt(vi), isbc2, eps);
    const vf update = vdiv(mi, denom);
    if (k.decoupled_decay) pi = vfma(pi, neg_lr_wd, pi);
    pi = vfma(update, step_size, pi);
    vstore(p + i, pi);
    vstore(m + i, mi);
    vstore(v + i, vi);
    if (kind != Out16::none) store16(out16 + i, kind, pi);
  }
  return i;
}

inline int64_t sgd_kernel(float* p, const float* g, float* buf, int64_t n, const SgdConsts& k,
                          uint16_t* out16, Out16 kind) {
  const vf gs = vset1(k.grad_scale), wd = vset1(k.weight_decay), mom = vset1(k.momentum);
  const vf omd = vset1(k.one_minus_dampening), neg_lr = vset1(k.neg_lr);
  int64_t i = 0;
  for (; i + kW <= n; i += kW) {
    vf d = vmul(vload(g + i), gs);
    vf pi = vload(p + i);
    if (k.has_weight_decay) d = vfma(wd, pi, d);
    if (k.has_momentum) {
      const vf b = k.first_momentum_step ? d : vfma(d, omd, vmul(vload(buf + i), mom));
      vstore(buf + i, b);
      d = k.nesterov ? vfma(b, mom, d) : b;
    }
    pi = vfma(d, neg_lr, pi);
    vstore(p + i, pi);
    if (kind != Out16::none) store16(out16 + i, kind, pi);
  }
  return i;
}

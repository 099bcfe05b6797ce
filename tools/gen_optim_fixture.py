#!/usr/bin/python3
"""Writes tests/fixtures/optim/optim_parity.json: ten optimizer steps of Adam/AdamW, SGD and Lamb
over a flat buffer of three "tensors", computed in float64 as the reference for the C++ kernels
(tests/test_optim.cpp).

Adam, AdamW and SGD run torch.optim itself. Two references are written by hand because torch has
no equivalent: Adam without bias correction, and Lamb (torch has no Lamb). Both follow DeepSpeed's
formulas (docs/optimizers.md); the hand-written Adam is checked against torch.optim.AdamW in this
script before it is trusted for the variant torch lacks.

Inputs (initial parameters, per-step gradients) are decimal numbers with 4 significant digits; the
C++ side reads them as double and rounds to float32, and so does this script, so both start from
the same float32 values. The reference then computes in float64, with every hyper-parameter rounded to float32 first
(the C++ API takes floats: 0.999f is 0.99900001287, and 1 - beta2 differs from 0.001 by 1.3e-5
relative, which would otherwise swamp the comparison). Expected values are written with
8 significant digits (relative rounding <= 5e-8, far inside the test's 1e-5 tolerance).

Needs only torch (Debian's python3-torch 1.13 is enough):
    /usr/bin/python3 tools/gen_optim_fixture.py
"""
import json
import math
import os

import torch

SIZES = [117, 61, 22]  # three tensors; the second and third make Lamb's trust ratio clamp
STEPS = 10
SEED = 1234


def dec4(x):
    """x rounded to 4 significant digits, as the float32 the C++ side will read."""
    s = float("%.4g" % x)
    return float(torch.tensor(s, dtype=torch.float32).item()), s


def make_inputs():
    g = torch.Generator().manual_seed(SEED)
    scales = [0.5, 20.0, 0.002]  # ||w||/||update||: ~0.5 (inside), ~20 (> max 10), ~0.002 (< min)
    params, params_text = [], []
    for n, sc in zip(SIZES, scales):
        for x in (torch.randn(n, generator=g, dtype=torch.float64) * sc).tolist():
            f, s = dec4(x)
            params.append(f)
            params_text.append(s)
    grads, grads_text = [], []
    for step in range(STEPS):
        row = (torch.randn(sum(SIZES), generator=g, dtype=torch.float64) * 0.1).tolist()
        if step == 3:
            row[5:9] = [0.0] * 4  # zero gradients: moments decay, no new information
        fs, ss = zip(*(dec4(x) for x in row))
        grads.append(list(fs))
        grads_text.append(list(ss))
    return params, params_text, grads, grads_text


def f32(x):
    """x rounded to float32, as the C++ API (float hyper-parameters) receives it."""
    return float(torch.tensor(x, dtype=torch.float32).item())


def lr_at(base, step):  # a schedule, so the tests exercise set_lr between steps
    return f32(f32(base) * (1.0 - 0.05 * step))  # as the test computes it, then rounds to float


def split(flat):
    out, off = [], 0
    for n in SIZES:
        out.append(flat[off:off + n])
        off += n
    return out


def run_torch(make_opt, params, grads, base_lr, grad_scale):
    ts = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in split(params)]
    opt = make_opt(ts)
    history = []
    for step in range(STEPS):
        for t, gsplit in zip(ts, split(grads[step])):
            t.grad = torch.tensor(gsplit, dtype=torch.float64) * grad_scale
        for group in opt.param_groups:
            group["lr"] = lr_at(base_lr, step)
        opt.step()
        history.append(torch.cat([t.detach() for t in ts]).tolist())
    state = {}
    for key in ("exp_avg", "exp_avg_sq", "momentum_buffer"):
        if key in opt.state[ts[0]]:
            state[key] = torch.cat([opt.state[t][key] for t in ts]).tolist()
    return history, state


def run_adam_manual(params, grads, base_lr, grad_scale, betas, eps, wd, adamw, bias_correction):
    """DeepSpeed's cpu_adam formula (csrc/includes/cpu_adam.h; docs/optimizers.md), float64."""
    p = torch.tensor(params, dtype=torch.float64)
    m = torch.zeros_like(p)
    v = torch.zeros_like(p)
    b1, b2 = betas
    history = []
    for step in range(STEPS):
        t = step + 1
        lr = lr_at(base_lr, step)
        g = torch.tensor(grads[step], dtype=torch.float64) * grad_scale
        if wd and not adamw:
            g = g + wd * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        bc1 = 1 - b1 ** t if bias_correction else 1.0
        bc2 = 1 - b2 ** t if bias_correction else 1.0
        denom = v.sqrt() / math.sqrt(bc2) + eps
        if wd and adamw:
            p = p - lr * wd * p
        p = p - (lr / bc1) * m / denom
        history.append(p.tolist())
    return history, {"exp_avg": m.tolist(), "exp_avg_sq": v.tolist()}


def run_lamb(params, grads, base_lr, grad_scale, betas, eps, wd, max_coeff, min_coeff,
             eps_inside_sqrt=False, legacy=False):
    """DeepSpeed FusedLamb (csrc/lamb/fused_lamb_cuda_kernel.cu), per tensor, float64.

    Current formula: m_hat = m / bc1, v_hat = v / bc2, update = m_hat / (sqrt(v_hat) + eps) + wd*p,
    coeff = clamp(||p|| / ||update||, min_coeff, max_coeff) (1 if either norm is 0),
    p -= lr * coeff * update. Legacy (DeepSpeed <= 0.16.x): no correction inside the update,
    p -= lr * sqrt(bc2) / bc1 * coeff * update.
    """
    b1, b2 = betas
    ps = [torch.tensor(x, dtype=torch.float64) for x in split(params)]
    ms = [torch.zeros_like(x) for x in ps]
    vs = [torch.zeros_like(x) for x in ps]
    history, coeffs = [], []
    for step in range(STEPS):
        t = step + 1
        lr = lr_at(base_lr, step)
        bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
        step_coeffs = []
        for i, gi in enumerate(split(grads[step])):
            g = torch.tensor(gi, dtype=torch.float64) * grad_scale
            ms[i] = b1 * ms[i] + (1 - b1) * g
            vs[i] = b2 * vs[i] + (1 - b2) * g * g
            if legacy:
                m_hat, v_hat, mult = ms[i], vs[i], math.sqrt(bc2) / bc1
            else:
                m_hat, v_hat, mult = ms[i] / bc1, vs[i] / bc2, 1.0
            denom = (v_hat + eps).sqrt() if eps_inside_sqrt else v_hat.sqrt() + eps
            update = m_hat / denom + wd * ps[i]
            w_norm, u_norm = ps[i].norm().item(), update.norm().item()
            coeff = 1.0
            if w_norm != 0 and u_norm != 0:
                coeff = min(max(w_norm / u_norm, min_coeff), max_coeff)
            step_coeffs.append(coeff)
            ps[i] = ps[i] - lr * mult * coeff * update
        history.append(torch.cat(ps).tolist())
        coeffs.append(step_coeffs)
    return history, {"exp_avg": torch.cat(ms).tolist(), "exp_avg_sq": torch.cat(vs).tolist()}, coeffs


def fmt8(values):
    return [float("%.8g" % x) for x in values]


def main():
    params, params_text, grads, grads_text = make_inputs()
    cases = []

    def add(name, optimizer, cfg, grad_scale, history, state, coeffs=None, keep_state=True):
        case = {"name": name, "optimizer": optimizer, "config": cfg, "grad_scale": grad_scale,
                "expected_params": [fmt8(h) for h in history]}
        if keep_state:
            case["expected_state"] = {k: fmt8(v) for k, v in state.items()}
        if coeffs is not None:
            case["expected_lamb_coeffs"] = [fmt8(c) for c in coeffs]
        cases.append(case)

    def hp(cfg, key):  # a hyper-parameter as the C++ side holds it (float32)
        v = cfg[key]
        return tuple(f32(x) for x in v) if isinstance(v, list) else f32(v)

    # AdamW (DeepSpeed "Adam" with adam_w_mode true): torch.optim.AdamW.
    cfg = {"lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.05,
           "adam_w_mode": True, "bias_correction": True}
    h, st = run_torch(lambda ts: torch.optim.AdamW(ts, lr=hp(cfg, "lr"), betas=hp(cfg, "betas"),
                                                   eps=hp(cfg, "eps"),
                                                   weight_decay=hp(cfg, "weight_decay")),
                      params, grads, cfg["lr"], 1.0)
    hm, _ = run_adam_manual(params, grads, cfg["lr"], 1.0, hp(cfg, "betas"), hp(cfg, "eps"),
                            hp(cfg, "weight_decay"), True, True)
    err = max(abs(a - b) / (abs(b) + 1e-12) for ra, rb in zip(hm, h) for a, b in zip(ra, rb))
    assert err < 1e-12, f"hand-written Adam disagrees with torch.optim.AdamW: {err}"
    add("adamw", "AdamW", cfg, 1.0, h, st)

    # Adam, L2 mode (adam_w_mode false): torch.optim.Adam's weight_decay; gradients scaled by 0.5.
    cfg = {"lr": 0.01, "betas": [0.8, 0.99], "eps": 1e-6, "weight_decay": 0.1,
           "adam_w_mode": False, "bias_correction": True}
    h, st = run_torch(lambda ts: torch.optim.Adam(ts, lr=hp(cfg, "lr"), betas=hp(cfg, "betas"),
                                                  eps=hp(cfg, "eps"),
                                                  weight_decay=hp(cfg, "weight_decay")),
                      params, grads, cfg["lr"], 0.5)
    add("adam_l2", "Adam", cfg, 0.5, h, st, keep_state=False)

    # Adam without bias correction (DeepSpeed option; torch has none): hand-written reference.
    cfg = {"lr": 0.005, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01,
           "adam_w_mode": True, "bias_correction": False}
    h, st = run_adam_manual(params, grads, cfg["lr"], 1.0, hp(cfg, "betas"), hp(cfg, "eps"),
                            hp(cfg, "weight_decay"), True, False)
    add("adam_no_bias_correction", "Adam", cfg, 1.0, h, st, keep_state=False)

    # SGD, momentum + Nesterov + weight decay.
    cfg = {"lr": 0.05, "momentum": 0.9, "dampening": 0.0, "nesterov": True, "weight_decay": 0.01}
    h, st = run_torch(lambda ts: torch.optim.SGD(ts, lr=hp(cfg, "lr"), momentum=hp(cfg, "momentum"),
                                                 nesterov=True,
                                                 weight_decay=hp(cfg, "weight_decay")),
                      params, grads, cfg["lr"], 1.0)
    add("sgd_nesterov", "SGD", cfg, 1.0, h, st)

    # SGD, momentum with dampening, gradients scaled by 0.25.
    cfg = {"lr": 0.1, "momentum": 0.8, "dampening": 0.3, "nesterov": False, "weight_decay": 0.0}
    h, st = run_torch(lambda ts: torch.optim.SGD(ts, lr=hp(cfg, "lr"), momentum=hp(cfg, "momentum"),
                                                 dampening=hp(cfg, "dampening")),
                      params, grads, cfg["lr"], 0.25)
    add("sgd_dampening", "SGD", cfg, 0.25, h, st, keep_state=False)

    # Lamb (DeepSpeed FusedLamb, current formula), per-tensor trust ratios hitting both clamps.
    cfg = {"lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01,
           "max_coeff": 10.0, "min_coeff": 0.01, "bias_correction": True}
    h, st, co = run_lamb(params, grads, cfg["lr"], 1.0, hp(cfg, "betas"), hp(cfg, "eps"),
                         hp(cfg, "weight_decay"), hp(cfg, "max_coeff"), hp(cfg, "min_coeff"))
    add("lamb", "Lamb", cfg, 1.0, h, st, co)

    # Lamb, DeepSpeed <= 0.16.x formula, eps inside the square root, gradients scaled by 2.
    cfg = {"lr": 0.02, "betas": [0.9, 0.99], "eps": 1e-6, "weight_decay": 0.0,
           "max_coeff": 5.0, "min_coeff": 0.05, "bias_correction": True,
           "eps_inside_sqrt": True, "legacy_bias_correction": True}
    h, st, co = run_lamb(params, grads, cfg["lr"], 2.0, hp(cfg, "betas"), hp(cfg, "eps"),
                         hp(cfg, "weight_decay"), hp(cfg, "max_coeff"), hp(cfg, "min_coeff"),
                         eps_inside_sqrt=True, legacy=True)
    add("lamb_legacy_eps_inside", "Lamb", cfg, 2.0, h, st, co, keep_state=False)

    out = {
        "generator": "tools/gen_optim_fixture.py",
        "torch_version": torch.__version__,
        "segments": [[sum(SIZES[:i]), n] for i, n in enumerate(SIZES)],
        "steps": STEPS,
        "lr_schedule": "lr(step) = config.lr * (1 - 0.05 * step), step = 0, 1, ...",
        "init_params": [float(s) for s in params_text],
        "grads": [[float(s) for s in row] for row in grads_text],
        "cases": cases,
    }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures",
                        "optim", "optim_parity.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {os.path.normpath(path)} ({os.path.getsize(path)} bytes, {len(cases)} cases)")


if __name__ == "__main__":
    main()

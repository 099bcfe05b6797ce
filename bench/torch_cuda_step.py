#!/usr/bin/env python3
"""PyTorch reference for bench_cuda on the same GPU: the same matrix products, the same attention
shape and the same GPT-2 forward + backward, timed the same way (median of timed iterations after a
warm-up, ending on a value read back to the host). fp32 everywhere with TF32 off, as ours.

Prints BENCH lines:
  BENCH torch_matmul dtype=<fp32|bf16> n=4096 tflops=<x>
  BENCH torch_attention ... forward_ms=<x> backward_ms=<y>   (scaled_dot_product_attention)
  BENCH torch_fwd_bwd model=gpt2-124m mode=<eager|compile> tokens_per_s=<x> step_ms=<y>
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {
    "gpt2-124m": dict(n_layer=12, n_head=12, n_embd=768),
    "gpt2-350m": dict(n_layer=24, n_head=16, n_embd=1024),
}


class Block(nn.Module):
    def __init__(self, c, nh):
        super().__init__()
        self.nh = nh
        self.ln_1 = nn.LayerNorm(c)
        self.c_attn = nn.Linear(c, 3 * c)
        self.c_proj = nn.Linear(c, c)
        self.ln_2 = nn.LayerNorm(c)
        self.c_fc = nn.Linear(c, 4 * c)
        self.mlp_proj = nn.Linear(4 * c, c)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.nh, C // self.nh).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, block, n_layer, n_head, n_embd):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block, n_embd)
        self.h = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)

    def forward(self, idx, targets):
        T = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def timed(fn, reps):
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2-124m")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--compile", action="store_true", help="also time torch.compile(model)")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = "cuda"
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")

    for dt, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        n = 4096
        x = torch.randn(n, n, device=dev, dtype=dt)
        y = torch.randn(n, n, device=dev, dtype=dt)
        t = timed(lambda: [x @ y for _ in range(10)], 5) / 10
        print(f"BENCH torch_matmul dtype={name} n={n} tflops={2 * n**3 / t / 1e12:.1f}")

    p = PRESETS[a.model]
    nh, hd = p["n_head"], p["n_embd"] // p["n_head"]
    q, k, v = (torch.randn(a.batch, nh, a.seq, hd, device=dev, requires_grad=True) for _ in range(3))
    f_ms = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), a.steps) * 1e3
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    g = torch.ones_like(y)
    b_ms = timed(lambda: torch.autograd.grad(y, (q, k, v), g, retain_graph=True), a.steps) * 1e3
    print(f"BENCH torch_attention B={a.batch} NH={nh} T={a.seq} hd={hd} forward_ms={f_ms:.3f} "
          f"backward_ms={b_ms:.3f}")

    model = GPT(50257, max(1024, a.seq), **p).to(dev)
    gen = torch.Generator().manual_seed(1)
    idx = torch.randint(0, 50257, (a.batch, a.seq), generator=gen).to(dev)
    tgt = torch.randint(0, 50257, (a.batch, a.seq), generator=gen).to(dev)
    params = sum(x.numel() for x in model.parameters())
    modes = [("eager", model)]
    if a.compile:
        modes.append(("compile", torch.compile(model)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
    tokens = a.batch * a.seq
    for mode, m in modes:
        def step():
            m.zero_grad(set_to_none=False)
            m(idx, tgt).backward()
        step()  # compiles, for the compiled model
        t = timed(step, a.steps)
        print(f"BENCH torch_fwd_bwd model={a.model} mode={mode} dtype=fp32 tokens_per_s={tokens / t:.0f} "
              f"step_ms={t * 1e3:.1f} model_tflops={6 * params * tokens / t / 1e12:.1f}")

        def train_step():
            step()
            opt.step()
        t = timed(train_step, a.steps)
        print(f"BENCH torch_train_step model={a.model} mode={mode} dtype=fp32 optimizer=AdamW(fused) "
              f"tokens_per_s={tokens / t:.0f} step_ms={t * 1e3:.1f} "
              f"model_tflops={6 * params * tokens / t / 1e12:.1f}")


if __name__ == "__main__":
    main()

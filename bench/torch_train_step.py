#!/usr/bin/env python3
"""PyTorch reference for bench_train_step: the same GPT-2 model, batch and optimizer.

One full training step (forward, backward, AdamW) of a GPT-2-layout model, timed the same way as
bench/bench_train_step.cpp, so the two numbers can be compared in one run. Prints

  BENCH torch_train_step model=<name> tokens_per_s=<x> achieved_gflops=<y> torch=<version>

Run with the BLAS core type chosen for this CPU (bench/run_train_step.sh does it): Debian's PyTorch
links the same OpenBLAS as we do and suffers the same 5x loss on CPUs it does not recognise.
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {
    "tiny": dict(n_layer=4, n_head=4, n_embd=256),
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
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
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
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied head
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2-124m", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    model = GPT(50257, 1024, **PRESETS[args.model])
    with torch.no_grad():  # GPT-2 initialisation, so the loss starts near ln(V) as ours does
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.02)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    idx = torch.randint(0, 50257, (args.batch, args.seq))
    tgt = torch.randint(0, 50257, (args.batch, args.seq))
    times = []
    for step in range(args.steps + 1):  # the first step warms up
        t0 = time.perf_counter()
        loss = model(idx, tgt)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    dt = sorted(times[1:])[len(times[1:]) // 2]
    tokens = args.batch * args.seq
    gflops = 6 * params * tokens / dt / 1e9
    print(f"torch {torch.__version__} params={params} median_step_s={dt:.3f} loss={loss.item():.4f}")
    print(f"BENCH torch_train_step model={args.model} tokens_per_s={tokens / dt:.1f} "
          f"achieved_gflops={gflops:.1f} torch={torch.__version__}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The peer of bench_train_step in the precision users train in: transformers' GPT2LMHeadModel.

One training step (forward, backward, AdamW) of GPT-2 124M (transformers' GPT2Config defaults,
SDPA attention) at the same batch as bench_train_step, in fp32 or under
torch.autocast("cpu", dtype=torch.bfloat16) (parameters and AdamW in fp32, the matmuls, attention
and activations in bf16: PyTorch's mixed precision on the CPU). Also PyTorch's own GEMM peak in
that dtype (2048^3, best of five), the reference bench_train_step measures for us. Prints

  BENCH torch_hf_step dtype=<d> tokens_per_s=<x> peak_gflops=<y> peak_rss_mib=<z> torch=<v>

Needs torch and transformers (PyPI, in a virtual environment outside the project):
  python3 -m venv /tmp/peer && /tmp/peer/bin/pip install torch transformers
"""
import argparse
import resource
import time

import torch


def gemm_peak(dtype):
    n = 2048
    a = torch.full((n, n), 0.5, dtype=dtype)
    b = torch.full((n, n), 0.25, dtype=dtype)
    a @ b
    best = 1e30
    for _ in range(5):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bf16", choices=["fp32", "bf16"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    bf16 = args.dtype == "bf16"
    peak = gemm_peak(torch.bfloat16 if bf16 else torch.float32)
    cfg = GPT2Config(attn_implementation="sdpa")
    model = GPT2LMHeadModel(cfg)
    model.train()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    idx = torch.randint(0, cfg.vocab_size, (args.batch, args.seq))
    times = []
    for step in range(args.steps + 1):  # the first step warms up
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=idx, labels=idx).loss
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        print(f"step {step}: {times[-1]:.3f} s loss {loss.item():.4f}", flush=True)
    dt = sorted(times[1:])[len(times[1:]) // 2]
    tokens = args.batch * args.seq
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"torch {torch.__version__} params={params} median_step_s={dt:.3f}")
    print(f"BENCH torch_hf_step dtype={args.dtype} tokens_per_s={tokens / dt:.1f} "
          f"achieved_gflops={6 * params * tokens / dt / 1e9:.1f} peak_gflops={peak:.1f} "
          f"peak_rss_mib={rss:.1f} torch={torch.__version__}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""PyTorch peers of bench_zero: DDP (gloo) and ZeroRedundancyOptimizer on N processes.

The same GPT-2-layout model as bench_zero (bench/torch_train_step.py's blocks, our presets' block
sizes, tied LM head), fp32, AdamW(lr 1e-4, weight decay 0.1), micro-batch --batch per process,
each process its own synthetic tokens, 1 thread per process. Launched with
torch.multiprocessing.spawn over the gloo backend on 127.0.0.1.

  /usr/bin/python3 bench/torch_ddp.py --mode ddp|zero1 [--model tiny] [--batch 8] [--seq 256]
                                      [--steps 4] [--warmup 1] [--nproc 2] [--threads 1]

  ddp    DistributedDataParallel (default 25 MiB buckets) + torch.optim.AdamW
  zero1  DistributedDataParallel + torch.distributed.optim.ZeroRedundancyOptimizer(AdamW): each
         process keeps AdamW moments for its share of the parameters and broadcasts its updated
         parameters after the step (PyTorch's ZeRO-1)

tokens/s = global tokens per step / median step time (a step's time is the slowest process's).
Peak RSS is VmHWM of each process. Prints per process, then

  BENCH torch_ddp mode=<m> tokens_per_s=<x> peak_rss_mib=<max over processes> torch=<version>

OPENBLAS_CORETYPE: Debian's PyTorch links the OpenBLAS that falls back to generic kernels on CPUs
it does not recognise (reference/machine.md). Unless it is already set, this script sets it
before importing torch to the core deepspeed.cpp picks from the CPU's flags (Cooperlake with
avx512_bf16, SkylakeX with AVX-512, Haswell with AVX2+FMA), so both sides run the same kernels.
Needs torch with torch.distributed (Debian's python3-torch 1.13: /usr/bin/python3).
"""
import os


def openblas_core_for_this_cpu():
    """The core deepspeed.cpp's src/backend/cpu/blas.cpp picks, from /proc/cpuinfo's flags."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((l.split(":", 1)[1].split() for l in f if l.startswith("flags")), [])
    except OSError:
        return None
    flags = set(flags)
    if {"avx512f", "avx512bw", "avx512vl"} <= flags:
        return "Cooperlake" if "avx512_bf16" in flags else "SkylakeX"
    if {"avx2", "fma"} <= flags:
        return "Haswell"
    return None


# Before torch is imported (here and in the spawned children, which inherit the environment).
if "OPENBLAS_CORETYPE" not in os.environ and openblas_core_for_this_cpu():
    os.environ["OPENBLAS_CORETYPE"] = openblas_core_for_this_cpu()
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_train_step import Block  # noqa: E402  (the reference block of bench_train_step)

# deepspeed.cpp's presets (src/models/gpt.cpp): layers, heads, width, vocabulary, block size.
PRESETS = {
    "tiny": (4, 4, 256, 50257, 256),
    "gpt2": (12, 12, 768, 50257, 1024),
    "gpt2-124m": (12, 12, 768, 50257, 1024),
    "gpt2-350m": (24, 16, 1024, 50257, 1024),
    "gpt2-medium": (24, 16, 1024, 50257, 1024),
}


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, vocab, block):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block, n_embd)
        self.h = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        # GPT-2's initialisation, as deepspeed.cpp's (torch's Embedding default N(0, 1) would put
        # the tied head's logits in the hundreds).
        for name, p in self.named_parameters():
            if name.endswith("weight") and p.dim() == 2:
                proj = name.endswith("c_proj.weight") or name.endswith("mlp_proj.weight")
                nn.init.normal_(p, 0.0, 0.02 / (2 * n_layer) ** 0.5 if proj else 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied head
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def vm_hwm_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return -1


def worker(rank, args, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", rank=rank, world_size=args.nproc)
    n = args.nproc
    torch.manual_seed(0)  # same initial weights everywhere (DDP broadcasts rank 0's anyway)
    model = GPT(*PRESETS[args.model])
    vocab = PRESETS[args.model][3]
    params = sum(p.numel() for p in model.parameters())
    ddp = DDP(model)
    if args.mode == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.AdamW,
                                      lr=1e-4, weight_decay=0.1)
    else:
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4, weight_decay=0.1)
    if rank == 0:
        print(f"torch {torch.__version__} {args.mode}: model {args.model} ({params / 1e6:.1f}M "
              f"parameters), {n} processes x {torch.get_num_threads()} threads, micro-batch "
              f"{args.batch} x {args.seq}, OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE')}",
              flush=True)
    times = []
    first = last = 0.0
    for step in range(args.warmup + args.steps):
        g = torch.Generator().manual_seed(step * n + rank)  # this process's own slice
        idx = torch.randint(0, vocab, (args.batch, args.seq), generator=g)
        tgt = torch.randint(0, vocab, (args.batch, args.seq), generator=g)
        t0 = time.perf_counter()
        loss = ddp(idx, tgt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        last = loss.item()
        if step == 0:
            first = last
        if step >= args.warmup:
            times.append(dt)
        if rank == 0:
            print(f"step {step}{' (warm-up)' if step < args.warmup else ''}: {dt:.3f} s  "
                  f"loss {last:.4f}", flush=True)
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    own = sorted(times)
    stats = torch.tensor([own[len(own) // 2], vm_hwm_kib() / 1024.0], dtype=torch.float64)
    every = [torch.zeros_like(stats) for _ in range(n)]
    dist.all_gather(every, stats)
    if rank == 0:
        tokens = args.batch * args.seq * n
        step_s = sorted(slowest.tolist())[len(times) // 2]
        print("rank  tokens/s  peak RSS MiB")
        for r, s in enumerate(every):
            print(f"{r:4d}  {tokens / s[0].item():8.1f}  {s[1].item():12.1f}")
        peak = max(s[1].item() for s in every)
        print(f"median step {step_s:.3f} s (slowest process per step), loss {first:.4f} -> {last:.4f}")
        print(f"BENCH torch_ddp mode={args.mode} tokens_per_s={tokens / step_s:.1f} "
              f"peak_rss_mib={peak:.1f} torch={torch.__version__}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", default="ddp", choices=["ddp", "zero1"])
    ap.add_argument("--model", default="tiny", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if args.seq > PRESETS[args.model][4]:
        ap.error(f"--seq {args.seq} exceeds the model's block size {PRESETS[args.model][4]}")
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(args, port), nprocs=args.nproc, join=True)


if __name__ == "__main__":
    main()

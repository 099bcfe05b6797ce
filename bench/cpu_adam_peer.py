#!/usr/bin/env python3
"""The peers of bench_adam: one CPU AdamW step of DeepSpeed's DeepSpeedCPUAdam and of
torch.optim.AdamW over n fp32 parameters, timed the way bench_adam times ours (median of --reps
steps after one warm-up step, which also allocates the optimizer states).

Implementations (--impls, comma-separated, run one after another, never at the same time):
  deepspeed         DeepSpeedCPUAdam(adamw_mode=True), fp32 params/grads, fp32 states
  deepspeed_copy16  the same fp32 step followed by p16.copy_(p) into a bf16 tensor: what DeepSpeed's
                    ZeRO-Offload does to get the 16-bit parameters (its optimizer has no fused
                    16-bit write); the counterpart of bench_adam's "+bf16 copy"
  deepspeed_bf16    DeepSpeedCPUAdam with bf16 params and grads, fp32 states (its native bf16
                    mode; a different workload: 22 bytes per element, not 28 or 30)
  torch_foreach     torch.optim.AdamW(foreach=True)
  torch_fused       torch.optim.AdamW(fused=True), if this torch supports it on CPU

Hyper-parameters as bench_adam: lr 1e-4, weight_decay 0.01, betas (0.9, 0.999), eps 1e-8.
Output, one line per measurement:
  BENCH cpu_adam impl=<impl> n=<n> ms=<x> gbps=<28*n/ms/1e6>
(deepspeed_copy16 and deepspeed_bf16 add bytes_per_elem=<b> and compute gbps from it).
Lines starting with '#' are notes (why an implementation was skipped, versions, threads).

Set OMP_NUM_THREADS before starting Python (DeepSpeed's kernel is OpenMP); bench/run_cpu_adam.sh
does, and also sets THP_MEM_ALLOC_ENABLE=1 so torch's large buffers get transparent huge pages
as bench_adam's allocator does.
"""
import argparse
import gc
import os
import statistics
import sys
import time

LR, WD, BETAS, EPS = 1e-4, 0.01, (0.9, 0.999), 1e-8


def note(msg):
    print(f"# {msg}", flush=True)


def time_steps(step, reps):
    step()  # warm-up: allocates the states, faults in pages, starts the thread team
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), times


def make_param(torch, n, dtype):
    p = torch.nn.Parameter(torch.full((n,), 0.5, dtype=dtype))
    p.grad = torch.full((n,), 0.01, dtype=dtype)
    return p


def run_impl(torch, impl, n, reps):
    """Returns (ms, bytes_per_elem, all_times) or raises; frees everything before returning."""
    if impl in ("deepspeed", "deepspeed_copy16", "deepspeed_bf16"):
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        dtype = torch.bfloat16 if impl == "deepspeed_bf16" else torch.float32
        p = make_param(torch, n, dtype)
        opt = DeepSpeedCPUAdam([p], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, adamw_mode=True,
                               fp32_optimizer_states=True)
        if impl == "deepspeed_copy16":
            p16 = torch.empty((n,), dtype=torch.bfloat16)

            def step():
                opt.step()
                p16.copy_(p.data)

            bpe = 30
        else:
            step = opt.step
            bpe = 22 if impl == "deepspeed_bf16" else 28
    elif impl in ("torch_foreach", "torch_fused"):
        p = make_param(torch, n, torch.float32)
        kw = {"foreach": True} if impl == "torch_foreach" else {"fused": True}
        opt = torch.optim.AdamW([p], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, **kw)
        step = opt.step
        bpe = 28
    else:
        raise ValueError(f"unknown impl {impl}")
    ms, times = time_steps(step, reps)
    if not torch.isfinite(p.data[: min(n, 1 << 20)].float()).all():
        raise RuntimeError("non-finite parameters after the steps")
    del step, opt, p
    gc.collect()
    return ms, bpe, times


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", default="50000000,100000000,250000000,500000000",
                    help="comma-separated parameter counts")
    ap.add_argument("--impls", default="deepspeed,deepspeed_copy16,deepspeed_bf16,torch_foreach,torch_fused")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()

    if os.environ.get("OMP_NUM_THREADS") != str(args.threads):
        note(f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')} (expected {args.threads}: "
             "DeepSpeed's OpenMP kernel reads it at start-up)")
    import torch

    torch.set_num_threads(args.threads)
    note(f"torch {torch.__version__} threads={torch.get_num_threads()} "
         f"cpu_capability={torch.backends.cpu.get_cpu_capability()} "
         f"THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE', 'unset')}")
    impls = [s for s in args.impls.split(",") if s]

    if any(i.startswith("deepspeed") for i in impls):
        try:
            import deepspeed
            from deepspeed.ops.adam import DeepSpeedCPUAdam  # noqa: F401
            from deepspeed.ops.op_builder import CPUAdamBuilder

            CPUAdamBuilder().load()  # JIT build on first use (minutes), outside the timing
            note(f"deepspeed {deepspeed.__version__}, cpu_adam op loaded")
        except Exception as e:  # noqa: BLE001
            note(f"DeepSpeedCPUAdam unavailable ({type(e).__name__}: {e}); skipping deepspeed*")
            impls = [i for i in impls if not i.startswith("deepspeed")]

    if "deepspeed_bf16" in impls:
        # DeepSpeed's cpu_adam vectorises bf16 only when built for AVX-512 (or NEON): with
        # __AVX256__ its Step_AVX returns early for bf16 and the whole buffer goes through the
        # scalar tail loop (csrc/includes/cpu_adam.h, Step_AVX). It still runs, so measure it and say so.
        flags = open("/proc/cpuinfo").read()
        if "avx512f" not in flags.split():
            note("deepspeed_bf16: no AVX-512 on this CPU, so DeepSpeed's cpu_adam is built with "
                 "__AVX256__ and runs bf16 params through its scalar fallback loop (not its SIMD path)")

    if "torch_fused" in impls:
        try:
            p = torch.nn.Parameter(torch.zeros(16))
            p.grad = torch.zeros(16)
            torch.optim.AdamW([p], lr=LR, fused=True).step()
        except Exception as e:  # noqa: BLE001
            note(f"torch_fused unsupported on CPU here ({type(e).__name__}: {e}); skipping")
            impls.remove("torch_fused")

    for n in [int(float(s)) for s in args.n.split(",") if s]:
        for impl in impls:
            try:
                ms, bpe, times = run_impl(torch, impl, n, args.reps)
            except Exception as e:  # noqa: BLE001
                note(f"{impl} n={n} failed: {type(e).__name__}: {e}")
                gc.collect()
                continue
            extra = "" if bpe == 28 else f" bytes_per_elem={bpe}"
            note(f"{impl} n={n} times_ms=" + ",".join(f"{t:.1f}" for t in times))
            print(f"BENCH cpu_adam impl={impl} n={n} ms={ms:.2f} gbps={bpe * n / ms / 1e6:.2f}{extra}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

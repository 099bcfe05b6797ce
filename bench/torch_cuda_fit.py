#!/usr/bin/env python3
"""Peers for bench/run_cuda_fit.sh: GPT-2 XL (1.5B, transformers' GPT2LMHeadModel, random
weights) trained on one GPU whose memory is capped as a smaller card's would be
(torch.cuda.set_per_process_memory_fraction), the Accelerate guide's experiment:

  --mode plain       PyTorch alone: bf16 autocast, fp32 weights, fused AdamW, all on the GPU
                     (what data parallelism keeps per GPU: 16 bytes per parameter)
  --mode deepspeed   DeepSpeed ZeRO-2 with offload_optimizer.device cpu (pinned), bf16: the
                     weights and gradients in 16 bits on the GPU, the fp32 master weights and Adam
                     moments in host memory, stepped by DeepSpeedCPUAdam (built by JIT)

Both use gradient checkpointing and random token ids. Prints one line:
  BENCH torch_fit mode=<m> limit_gib=<x> batch=<b> seq=<t> status=<ok|oom> tokens_per_s=<x>
        step_s=<x> peak_gib=<x>
"""
import argparse
import os
import statistics
import sys
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["plain", "deepspeed"], required=True)
    ap.add_argument("--limit_gib", type=float, default=24.0)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--layers", type=int, default=48)
    a = ap.parse_args()

    from transformers import GPT2Config, GPT2LMHeadModel

    total = torch.cuda.get_device_properties(0).total_memory
    if a.limit_gib > 0:
        torch.cuda.set_per_process_memory_fraction(min(1.0, a.limit_gib * 2**30 / total), 0)
    cfg = GPT2Config(n_layer=a.layers, n_head=25, n_embd=1600, n_positions=1024,
                     vocab_size=50257, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     use_cache=False)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (a.batch, a.seq), device="cuda")
    status, times = "ok", []
    try:
        if a.mode == "plain":
            with torch.device("cuda"):
                model = GPT2LMHeadModel(cfg)
            model.gradient_checkpointing_enable()
            model.train()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

            def step():
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                return loss
        else:
            import deepspeed

            os.environ.setdefault("RANK", "0")
            os.environ.setdefault("LOCAL_RANK", "0")
            os.environ.setdefault("WORLD_SIZE", "1")
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", "29517")
            deepspeed.init_distributed(dist_backend="nccl")
            with torch.device("cuda"):
                model = GPT2LMHeadModel(cfg).to(torch.bfloat16)
            model.gradient_checkpointing_enable()
            ds_cfg = {
                "train_micro_batch_size_per_gpu": a.batch,
                "gradient_accumulation_steps": 1,
                "bf16": {"enabled": True},
                "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.0}},
                "zero_optimization": {
                    "stage": 2,
                    "offload_optimizer": {"device": "cpu", "pin_memory": True},
                    "overlap_comm": True,
                    "contiguous_gradients": True,
                },
                "steps_per_print": 10**9,
            }
            engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                   config=ds_cfg)

            def step():
                loss = engine(input_ids=ids, labels=ids).loss
                engine.backward(loss)
                engine.step()
                return loss

        torch.cuda.reset_peak_memory_stats()
        for i in range(a.steps + 1):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss = step()
            loss.item()
            torch.cuda.synchronize()
            if i > 0:  # the first step builds kernels and state
                times.append(time.perf_counter() - t0)
    except torch.OutOfMemoryError as e:
        status = "oom"
        print(f"torch_fit {a.mode}: out of memory: {str(e).splitlines()[0]}", file=sys.stderr)
    peak = torch.cuda.max_memory_allocated() / 2**30
    s = statistics.median(times) if times else float("nan")
    tps = a.batch * a.seq / s if times else 0.0
    print(f"BENCH torch_fit mode={a.mode} limit_gib={a.limit_gib:g} batch={a.batch} seq={a.seq} "
          f"status={status} tokens_per_s={tps:.0f} step_s={s:.3f} peak_gib={peak:.2f}", flush=True)


if __name__ == "__main__":
    main()

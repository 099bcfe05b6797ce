#!/usr/bin/env python3
"""Peer of build/bench/bench_offload: real DeepSpeed (PyPI) ZeRO-3 with the optimizer state and the
parameters offloaded (ZeRO-Infinity: device "nvme"; or device "cpu" for both, the ZeRO-Offload
fallback), on a GPT-2-layout model, one CPU process.

  DS_ACCELERATOR=cpu python bench/ds_offload_peer.py --layers 4 --embd 1024 --heads 16 \
      --vocab 50257 --seq 128 --batch 1 --steps 3 --nvme /path/to/swap --offload nvme

Same configuration as bench_offload (bench/bench_offload.cpp): bf16, AdamW lr 1e-4 wd 0.01 (DeepSpeed
picks its CPU Adam, DeepSpeedCPUAdam in AdamW mode, under offload), micro-batch --batch, gradient
accumulation 1, gradients accumulated in bf16 (data_types.grad_accum_dtype), ZeRO-3 with
sub_group_size / stage3_param_persistence_threshold 1e5 / stage3_prefetch_bucket_size 5e7,
offload_optimizer {nvme, buffer_count 4}, offload_param {nvme, buffer_count 5, buffer_size,
max_in_cpu 0}, aio {block_size 1 MiB, queue_depth 8, intra_op_parallelism 1}; synthetic tokens.

The model is built inside deepspeed.zero.Init(remote_device=<offload device>) so that it is
partitioned (and, for nvme, swapped out) layer by layer and never whole in RAM. transformers'
GPT2LMHeadModel is used when importable (dropout 0, n_positions = --seq, tied LM head); else a
hand-written torch module of the same layout and parameter count.

Each step (forward + backward + optimizer step) is timed. Peak RSS is VmHWM from /proc/self/status:
init_peak_rss_mib up to the first step, then reset by writing 5 to /proc/self/clear_refs, and
peak_rss_mib covers the training steps. Last line:

  BENCH ds_offload impl=deepspeed offload=<nvme|cpu> params=<n> step_s=<median> peak_rss_mib=<m>
        init_peak_rss_mib=<m> ...
"""
import argparse
import json
import os
import statistics
import sys
import time


def status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def proc_io():
    """(read_bytes, write_bytes) this process caused at the storage layer (/proc/self/io); the
    swap files are opened O_DIRECT, so this is the swap traffic (plus anything else read)."""
    r = w = 0
    with open("/proc/self/io") as f:
        for line in f:
            k, v = line.split(":")
            if k == "read_bytes":
                r = int(v)
            elif k == "write_bytes":
                w = int(v)
    return r, w


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--embd", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--nvme", default=None, help="swap folder (needed for --offload nvme)")
    p.add_argument("--offload", choices=["nvme", "cpu"], default="nvme")
    # bench_offload's defaults (bench_offload.cpp: --sub_group_size, --param_buffer_size 2e7).
    p.add_argument("--sub_group_size", type=int, default=20000000)
    p.add_argument("--param_buffer_size", type=int, default=20000000)
    p.add_argument("--buffer_count", type=int, default=4)
    p.add_argument("--param_buffer_count", type=int, default=5,
                   help="offload_param.buffer_count (DeepSpeed needs one buffer per live parameter)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--model", choices=["auto", "hf", "torch"], default="auto",
                   help="auto: transformers' GPT2LMHeadModel if importable, else the torch module")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16",
                   help="bf16 (as bench_offload) or fp32 training (bf16 off): PyTorch's bf16 GEMM "
                        "on CPUs without AVX-512 BF16 is slow, fp32 separates that from offload")
    p.add_argument("--name", default=None)
    p.add_argument("--profile", action="store_true",
                   help="cProfile the steps after the first; print the top functions")
    a = p.parse_args()
    if a.offload == "nvme" and not a.nvme:
        p.error("--offload nvme needs --nvme PATH")
    return a


def ds_config(a):
    zero = {
        "stage": 3,
        "sub_group_size": a.sub_group_size,
        "stage3_param_persistence_threshold": 100000,
        "stage3_prefetch_bucket_size": 50000000,
    }
    if a.offload == "nvme":
        zero["offload_optimizer"] = {"device": "nvme", "nvme_path": a.nvme,
                                     "buffer_count": a.buffer_count, "pin_memory": False}
        zero["offload_param"] = {"device": "nvme", "nvme_path": a.nvme, "buffer_count": a.param_buffer_count,
                                 "buffer_size": a.param_buffer_size, "max_in_cpu": 0,
                                 "pin_memory": False}
    else:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
        zero["offload_param"] = {"device": "cpu", "pin_memory": False}
    return {
        "train_micro_batch_size_per_gpu": a.batch,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": a.dtype == "bf16"},
        "data_types": {"grad_accum_dtype": a.dtype},
        "aio": {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1},
        "zero_optimization": zero,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}},
        "zero_force_ds_cpu_optimizer": True,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


def build_torch_gpt2(a):
    """GPT-2 layout by hand: wte, wpe, pre-LN blocks (LN, fused qkv + proj, LN, 4C MLP with GELU),
    ln_f, LM head tied to wte; biases everywhere, as GPT-2."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self, C, H):
            super().__init__()
            self.H = H
            self.ln_1 = nn.LayerNorm(C)
            self.c_attn = nn.Linear(C, 3 * C)
            self.c_proj = nn.Linear(C, C)
            self.ln_2 = nn.LayerNorm(C)
            self.c_fc = nn.Linear(C, 4 * C)
            self.mlp_proj = nn.Linear(4 * C, C)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT2(nn.Module):
        def __init__(self, V, T, L, C, H):
            super().__init__()
            self.wte = nn.Embedding(V, C)
            self.wpe = nn.Embedding(T, C)
            self.h = nn.ModuleList(Block(C, H) for _ in range(L))
            self.ln_f = nn.LayerNorm(C)

        def forward(self, idx):
            T = idx.shape[1]
            x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
            for b in self.h:
                x = b(x)
            # Tied LM head: F.linear with wte.weight (ZeRO-3 gathers it for this module's forward).
            return F.linear(self.ln_f(x), self.wte.weight)

    return GPT2(a.vocab, a.seq, a.layers, a.embd, a.heads)


def init_gpt2_weights(model, n_layer, deepspeed):
    """GPT-2's initialisation (as bench_offload's model, include/ds/models/gpt.h): weights and
    embeddings N(0, 0.02), the residual projections N(0, 0.02 / sqrt(2 L)), biases 0, LayerNorm
    weights 1. Under zero.Init the parameters are already partitioned (and for nvme swapped out)
    when the constructor's own init runs, so that init touches empty shards; here each module's
    parameters are gathered in turn, set, and re-partitioned (what transformers does under
    HfDeepSpeedConfig), never the whole model at once."""
    import math
    import torch
    for name, m in model.named_modules():
        ps = list(m.named_parameters(recurse=False))
        if not ps:
            continue
        with deepspeed.zero.GatheredParameters([p for _, p in ps], modifier_rank=0):
            with torch.no_grad():
                for pn, p in ps:
                    if p.dim() == 1:
                        is_norm = isinstance(m, torch.nn.LayerNorm)
                        p.fill_(1.0 if (pn == "weight" and is_norm) else 0.0)
                    else:
                        std = 0.02
                        if name.endswith("c_proj") or name.endswith("mlp_proj"):
                            std = 0.02 / math.sqrt(2 * n_layer)
                        p.normal_(0.0, std)


def main():
    a = parse_args()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    for k, v in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29511"), ("RANK", "0"),
                 ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(k, v)
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(a.threads)
    import deepspeed

    use_hf = False
    if a.model in ("auto", "hf"):
        try:
            import transformers
            from transformers import GPT2Config, GPT2LMHeadModel
            use_hf = True
        except ImportError:
            if a.model == "hf":
                raise
    cfg = ds_config(a)
    if a.offload == "nvme":
        os.makedirs(a.nvme, exist_ok=True)
    print(f"torch {torch.__version__}, deepspeed {deepspeed.__version__}, "
          f"accelerator {deepspeed.get_accelerator().device_name()}, "
          f"model {'transformers ' + transformers.__version__ + ' GPT2LMHeadModel' if use_hf else 'torch GPT-2'}",
          flush=True)
    print("ds_config " + json.dumps(cfg), flush=True)

    t_init = time.perf_counter()
    deepspeed.init_distributed(dist_backend="gloo")
    # No dtype= here: the parameter dtype comes from the config (bf16.enabled -> bfloat16, else
    # float32). DeepSpeed 0.19.8 partition_parameters.py Init._set_dtype ignores an explicit dtype
    # when the accelerator reports no fp16 support (CPU without AVX-512 FP16) and picks bfloat16:
    # `dtype or torch.float16 if is_fp16_supported() else torch.bfloat16 if ...` parses as
    # `(dtype or fp16) if is_fp16_supported() else ...`.
    with deepspeed.zero.Init(remote_device=a.offload, config_dict_or_path=cfg, pin_memory=False):
        if use_hf:
            mc = GPT2Config(vocab_size=a.vocab, n_positions=a.seq, n_embd=a.embd, n_layer=a.layers,
                            n_head=a.heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                            tie_word_embeddings=True, use_cache=False)
            model = GPT2LMHeadModel(mc)
        else:
            model = build_torch_gpt2(a)
    t_built = time.perf_counter()
    init_gpt2_weights(model, a.layers, deepspeed)
    t_weights = time.perf_counter()
    # ZeRO-3 partitioned params report numel 0; ds_numel is the full size. Tied weights once.
    seen, params = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            params += getattr(p, "ds_numel", p.numel())
    pdt = next(model.parameters()).dtype
    print(f"model: L {a.layers}, C {a.embd}, NH {a.heads}, V {a.vocab}, T {a.seq}: "
          f"{params / 1e9:.3f}B parameters ({pdt}); offload {a.offload}", flush=True)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=cfg)
    t_end = time.perf_counter()
    init_s = t_end - t_init
    print(f"init phases: zero.Init build {t_built - t_init:.1f} s, weight init "
          f"{t_weights - t_built:.1f} s, deepspeed.initialize {t_end - t_weights:.1f} s", flush=True)
    init_peak = status_kib("VmHWM")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM: the training steps' own peak
    print(f"init {init_s:.1f} s, peak RSS {init_peak / 1024:.0f} MiB "
          f"(optimizer {type(engine.optimizer).__name__} / "
          f"{type(getattr(engine.optimizer, 'optimizer', None)).__name__})", flush=True)

    step_s, fwd_s, bwd_s, opt_s, rd, wr = [], [], [], [], [], []
    n = a.batch * a.seq
    prof = None
    for s in range(a.steps):
        if a.profile and s == 1:
            import cProfile
            prof = cProfile.Profile()
            prof.enable()
        i = torch.arange(n, dtype=torch.int64)
        x = ((i * 7919 + s * 104729) % a.vocab).view(a.batch, a.seq)
        y = ((i * 6271 + s * 15485863 + 1) % a.vocab).view(a.batch, a.seq)
        io0 = proc_io()
        t0 = time.perf_counter()
        out = engine(x)
        logits = out.logits if use_hf else out
        loss = F.cross_entropy(logits.float().view(-1, a.vocab), y.view(-1))
        t1 = time.perf_counter()
        engine.backward(loss)
        t2 = time.perf_counter()
        engine.step()
        t3 = time.perf_counter()
        io1 = proc_io()
        dt = t3 - t0
        step_s.append(dt)
        fwd_s.append(t1 - t0)
        bwd_s.append(t2 - t1)
        opt_s.append(t3 - t2)
        rd.append(io1[0] - io0[0])
        wr.append(io1[1] - io0[1])
        print(f"step {s + 1}: {dt:.3f} s (forward {t1 - t0:.3f}, backward {t2 - t1:.3f}, "
              f"step {t3 - t2:.3f}), loss {loss.item():.4f}, read {rd[-1] / 1e9:.3f} GB, "
              f"written {wr[-1] / 1e9:.3f} GB, RSS {status_kib('VmRSS') / 1024:.0f} MiB",
              flush=True)

    if prof is not None:
        import pstats
        prof.disable()
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(25)
    med = statistics.median
    name = a.name or f"gpt-{a.layers}x{a.embd}"
    print(f"BENCH ds_offload impl=deepspeed offload={a.offload} model={name} params={params} "
          f"step_s={med(step_s):.3f} peak_rss_mib={status_kib('VmHWM') / 1024:.0f} "
          f"init_peak_rss_mib={init_peak / 1024:.0f} init_s={init_s:.1f} dtype={a.dtype} "
          f"fwd_s={med(fwd_s):.3f} bwd_s={med(bwd_s):.3f} opt_s={med(opt_s):.3f} "
          f"read_gb={med(rd) / 1e9:.3f} write_gb={med(wr) / 1e9:.3f} "
          f"tokens={n} steps={a.steps} deepspeed={deepspeed.__version__} torch={torch.__version__}",
          flush=True)
    sys.stdout.flush()
    # Skip interpreter teardown of the aio handles / swap buffers (not part of the measurement).
    os._exit(0)


if __name__ == "__main__":
    main()

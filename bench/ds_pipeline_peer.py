#!/usr/bin/env python3
"""Peer of build/bench/bench_pipeline: real DeepSpeed (PyPI 0.19.x, CPU, gloo) trains the same
GPT-2-layout model as a PipelineModule with pp = 2 on 2 ranks (its TrainSchedule, 1F1B), fp32,
AdamW, ZeRO-0, the token embedding tied between the first and the last stage (TiedLayerSpec, as
Megatron-DeepSpeed's GPT2ModelPipe), blocks split evenly (partition_method "type:Block").

  OMP_NUM_THREADS=1 /tmp/dsvenv/bin/python -m torch.distributed.run --nproc_per_node 2 \\
      bench/ds_pipeline_peer.py --layers 8 --embd 256 --heads 4 --vocab 512 --seq 128 \\
      --batch 2 --micro_batches 8 --steps 3

Each train_batch (m micro-batches and the optimizer step) is timed after one warm-up; tokens/s =
batch * m * seq / median step time. Peak RSS is VmHWM of each rank. Last line per rank:

  BENCH ds_pipeline impl=deepspeed rank=<r> p=2 m=<m> step_s=<t> tokens_per_s=<x> peak_rss_mib=<m>
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def vmhwm_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


class Embed(nn.Module):
    def __init__(self, vocab, seq, embd):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(vocab, embd) * 0.02)  # wte, tied with the head
        self.pos = nn.Parameter(torch.randn(seq, embd) * 0.02)  # wpe

    def forward(self, ids):
        return F.embedding(ids, self.weight) + self.pos[: ids.shape[1]]


def head(module, x):  # the tied LM head on the last stage
    return F.linear(x, module.weight)


class Block(nn.Module):  # GPT-2: x + attn(ln_1(x)); x + mlp(ln_2(x)); causal attention, GELU
    def __init__(self, embd, heads):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(embd), nn.LayerNorm(embd)
        self.c_attn, self.c_proj = nn.Linear(embd, 3 * embd), nn.Linear(embd, embd)
        self.c_fc, self.mlp_proj = nn.Linear(embd, 4 * embd), nn.Linear(4 * embd, embd)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


def main():
    ap = argparse.ArgumentParser()
    for name, default in (("layers", 8), ("embd", 256), ("heads", 4), ("vocab", 512), ("seq", 128),
                          ("batch", 2), ("micro_batches", 8), ("steps", 3)):
        ap.add_argument("--" + name, type=int, default=default)
    a = ap.parse_args()
    import deepspeed
    from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(1234)
    layers = [TiedLayerSpec("embed", Embed, a.vocab, a.seq, a.embd, tied_weight_attr="weight")]
    layers += [LayerSpec(Block, a.embd, a.heads) for _ in range(a.layers)]
    layers += [LayerSpec(nn.LayerNorm, a.embd),
               TiedLayerSpec("embed", Embed, a.vocab, a.seq, a.embd, forward_fn=head,
                             tied_weight_attr="weight")]
    model = PipelineModule(layers=layers, num_stages=2, partition_method="type:Block",
                           loss_fn=lambda logits, y: F.cross_entropy(logits.reshape(-1, a.vocab),
                                                                     y.reshape(-1)))
    cfg = {"train_micro_batch_size_per_gpu": a.batch, "gradient_accumulation_steps": a.micro_batches,
           "zero_optimization": {"stage": 0}, "steps_per_print": 10**9,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=cfg)

    def data():
        g = torch.Generator().manual_seed(7)
        while True:
            x = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)
            yield x, torch.roll(x, -1, 1)

    it = data()
    times = []
    for k in range(a.steps + 1):
        t = time.perf_counter()
        engine.train_batch(data_iter=it)
        if k > 0:
            times.append(time.perf_counter() - t)
    step = statistics.median(times)
    rank = torch.distributed.get_rank()
    print(f"BENCH ds_pipeline impl=deepspeed rank={rank} p=2 m={a.micro_batches} step_s={step:.3f} "
          f"tokens_per_s={a.batch * a.micro_batches * a.seq / step:.0f} "
          f"peak_rss_mib={vmhwm_mib():.0f}", flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Write tests/fixtures/parity/{gpt2,llama}.safetensors: PyTorch reference results for test_parity.

The reference models below mirror models::GPT exactly (same parameter names, same (out, in) Linear
weights, GPT-2's tanh GELU, LLaMA's RMSNorm, rotate_half RoPE and SwiGLU). Each is given random
float32 parameters, which are written to the fixture; the reference then runs in float64 FROM
THOSE float32 values, so the only differences the C++ test sees are its own fp32 rounding errors.

Each fixture holds
  param.<name>    initial parameters (F32)            input_ids, targets (I64, (B, T); a few -100)
  logits (F32, (B, T, V))   loss (F32, scalar)        grad.<name> every parameter gradient (F32)
  adamw_losses (F32, (10,)): the loss before each of 10 AdamW steps on the same batch
and metadata: config (the models::GPTConfig JSON), adamw (its hyper-parameters), torch version.

Needs PyTorch (Debian's python3-torch: /usr/bin/python3) and nothing else; safetensors is written
by hand (struct + json).

    /usr/bin/python3 tools/gen_parity_fixture.py [--out tests/fixtures/parity]
"""
import argparse
import json
import math
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

B = 2
ADAMW = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
ADAMW_STEPS = 10

# The "test-gpt2" / "test-llama" presets of include/ds/models/gpt.h (ffn_hidden resolved).
CONFIGS = {
    "gpt2": dict(layout="gpt2", vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32,
                 ffn_hidden=0, ffn_multiple_of=256, norm_eps=1e-5, rope_theta=10000.0, dropout=0.0,
                 bias=True, tie_embeddings=True, seed=0),
    "llama": dict(layout="llama", vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32,
                  ffn_hidden=0, ffn_multiple_of=16, norm_eps=1e-6, rope_theta=10000.0, dropout=0.0,
                  bias=False, tie_embeddings=False, seed=0),
}


def ffn_hidden(cfg):
    if cfg["ffn_hidden"]:
        return cfg["ffn_hidden"]
    c = cfg["n_embd"]
    if cfg["layout"] == "gpt2":
        return 4 * c
    h = 2 * (4 * c) // 3
    m = cfg["ffn_multiple_of"]
    return (h + m - 1) // m * m


def causal_attention(q, k, v):  # (B, NH, T, hd) each
    T, hd = q.size(-2), q.size(-1)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    return att @ v


# ---- GPT-2 layout ----

class GPT2Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        c = cfg["n_embd"]
        self.nh = cfg["n_head"]
        self.c_attn = nn.Linear(c, 3 * c, bias=cfg["bias"])
        self.c_proj = nn.Linear(c, c, bias=cfg["bias"])

    def forward(self, x):
        Bx, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(Bx, T, self.nh, C // self.nh).transpose(1, 2) for t in (q, k, v))
        y = causal_attention(q, k, v).transpose(1, 2).contiguous().view(Bx, T, C)
        return self.c_proj(y)


class GPT2MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        c, h = cfg["n_embd"], ffn_hidden(cfg)
        self.c_fc = nn.Linear(c, h, bias=cfg["bias"])
        self.c_proj = nn.Linear(h, c, bias=cfg["bias"])

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class GPT2Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        c, eps = cfg["n_embd"], cfg["norm_eps"]
        self.ln_1 = nn.LayerNorm(c, eps=eps)
        self.attn = GPT2Attention(cfg)
        self.ln_2 = nn.LayerNorm(c, eps=eps)
        self.mlp = GPT2MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        assert cfg["tie_embeddings"] and cfg["bias"]
        self.wte = nn.Embedding(cfg["vocab_size"], cfg["n_embd"])
        self.wpe = nn.Embedding(cfg["block_size"], cfg["n_embd"])
        self.h = nn.ModuleList(GPT2Block(cfg) for _ in range(cfg["n_layer"]))
        self.ln_f = nn.LayerNorm(cfg["n_embd"], eps=cfg["norm_eps"])

    def forward(self, ids):
        T = ids.size(1)
        x = self.wte(ids) + self.wpe(torch.arange(T))
        for block in self.h:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()  # tied head


# ---- LLaMA layout ----

class RMSNorm(nn.Module):
    def __init__(self, c, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(c))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    h = x.size(-1) // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope(x, theta):  # x (B, NH, T, hd): Hugging Face LLaMA's rotary embedding
    T, hd = x.size(-2), x.size(-1)
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)  # (T, hd/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, hd)
    return x * emb.cos().to(x.dtype) + rotate_half(x) * emb.sin().to(x.dtype)


class LlamaAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        c = cfg["n_embd"]
        self.nh, self.theta = cfg["n_head"], cfg["rope_theta"]
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(self, name, nn.Linear(c, c, bias=cfg["bias"]))

    def forward(self, x):
        Bx, T, C = x.shape
        heads = lambda t: t.view(Bx, T, self.nh, C // self.nh).transpose(1, 2)
        q = rope(heads(self.q_proj(x)), self.theta)
        k = rope(heads(self.k_proj(x)), self.theta)
        v = heads(self.v_proj(x))
        y = causal_attention(q, k, v).transpose(1, 2).contiguous().view(Bx, T, C)
        return self.o_proj(y)


class LlamaMLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        c, h = cfg["n_embd"], ffn_hidden(cfg)
        self.gate_proj = nn.Linear(c, h, bias=cfg["bias"])
        self.up_proj = nn.Linear(c, h, bias=cfg["bias"])
        self.down_proj = nn.Linear(h, c, bias=cfg["bias"])

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        c, eps = cfg["n_embd"], cfg["norm_eps"]
        self.input_layernorm = RMSNorm(c, eps)
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = RMSNorm(c, eps)
        self.mlp = LlamaMLP(cfg)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        assert not cfg["tie_embeddings"]
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["n_embd"])
        self.layers = nn.ModuleList(LlamaBlock(cfg) for _ in range(cfg["n_layer"]))
        self.norm = RMSNorm(cfg["n_embd"], cfg["norm_eps"])
        self.lm_head = nn.Linear(cfg["n_embd"], cfg["vocab_size"], bias=False)

    def forward(self, ids):
        x = self.embed_tokens(ids)
        for block in self.layers:
            x = block(x)
        return self.lm_head(self.norm(x))


# ---- fixture ----

def randomize(model, gen):
    """float32 parameters with O(1) activations: embeddings N(0, 0.3^2) (the tied GPT-2 head then
    gives logits of std ~2, not a saturated softmax), matrices N(0, 1/fan_in), norm weights
    1 + N(0, 0.1^2), biases N(0, 0.1^2). Far from the training init on purpose, so that attention
    is not uniform and every term of every gradient matters."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                v = 0.1 * torch.randn(p.shape, generator=gen)
            elif p.dim() == 1:  # norm weights
                v = 1.0 + 0.1 * torch.randn(p.shape, generator=gen)
            elif "wte" in name or "wpe" in name or "embed_tokens" in name:
                v = 0.3 * torch.randn(p.shape, generator=gen)
            else:
                v = torch.randn(p.shape, generator=gen) / math.sqrt(p.size(1))
            p.copy_(v.float())


def write_safetensors(path, tensors, metadata):
    """fp32, bf16 (as its raw 16 bits) and int64 tensors; also used by gen_bf16_parity_fixture.py."""
    names = {torch.float32: "F32", torch.bfloat16: "BF16", torch.int64: "I64"}
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous()
        raw = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
        data = raw.numpy().tobytes()  # little-endian on every machine we run on
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def make_fixture(layout, out_dir):
    cfg = CONFIGS[layout]
    gen = torch.Generator().manual_seed(1234 if layout == "gpt2" else 5678)
    model = (GPT2 if layout == "gpt2" else Llama)(cfg)
    randomize(model, gen)
    params32 = {n: p.detach().clone() for n, p in model.named_parameters()}  # float32, as stored
    model = model.double()  # the reference runs in float64 from the float32 values

    T, V = cfg["block_size"], cfg["vocab_size"]
    ids = torch.randint(0, V, (B, T), generator=gen)
    targets = torch.randint(0, V, (B, T), generator=gen)
    targets[0, 3] = -100
    targets[1, T - 1] = -100

    def loss_of(logits):
        return F.cross_entropy(logits.view(-1, V), targets.view(-1), ignore_index=-100)

    logits = model(ids)
    loss = loss_of(logits)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}

    # AdamW on the same batch; torch applies the decay to every parameter, as our flat-buffer
    # optimizer does when given one group.
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)
    losses = []
    for _ in range(ADAMW_STEPS):
        opt.zero_grad(set_to_none=True)
        l = loss_of(model(ids))
        l.backward()
        opt.step()
        losses.append(l.item())
    assert abs(losses[0] - loss.item()) < 1e-12

    tensors = {}
    for n, p in params32.items():
        tensors["param." + n] = p
    tensors["input_ids"] = ids
    tensors["targets"] = targets
    tensors["logits"] = logits.detach().float()
    tensors["loss"] = loss.detach().float().reshape(())
    for n, g in grads.items():
        tensors["grad." + n] = g.float()
    tensors["adamw_losses"] = torch.tensor(losses, dtype=torch.float32)
    meta = {
        "config": json.dumps(cfg),
        "adamw": json.dumps(dict(ADAMW, steps=ADAMW_STEPS)),
        "generator": "tools/gen_parity_fixture.py",
        "torch": torch.__version__,
        "reference_dtype": "float64",
    }
    path = os.path.join(out_dir, layout + ".safetensors")
    write_safetensors(path, tensors, meta)
    size = os.path.getsize(path)
    assert size < 300_000, f"{path} is {size} bytes; keep fixtures small"
    n_params = sum(p.numel() for p in params32.values())
    print(f"{path}: {size} bytes, {n_params} parameters, loss {loss.item():.6f}, "
          f"after {ADAMW_STEPS} AdamW steps {losses[-1]:.6f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.normpath(
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "parity")))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)
    for layout in ("gpt2", "llama"):
        make_fixture(layout, args.out)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Write tests/fixtures/generate/<case>/: tiny Hugging Face models with fixed weights and the
tokens transformers' greedy generate() produces from them (test_serve's GreedyParity tests).

Each case folder holds what `save_pretrained` wrote (config.json, generation_config.json,
model.safetensors, fp32) and expected.json:
  {"transformers": version, "torch": version, "class": model class, "eos_token_id": 256,
   "max_new_tokens": N,
   "prompts": [{"text", "prompt_ids", "new_ids", "min_margin"}, ...]}
new_ids are the generated ids (the eos id included when generation stopped on it), from
`model.generate(ids, do_sample=False, max_new_tokens=N)` in float32 with the model's default
attention, as a user would run it. min_margin is the smallest gap between the chosen logit and the
runner-up over the steps, measured in a float64 rerun that must choose the same tokens: the C++
side computes in fp32 with other summation orders, so a gap far above fp32 rounding (~1e-5 at
logits of O(10)) is what makes token-for-token equality a fair test. The script refuses a case
whose gap is under 1e-3.

The vocabulary is 257 (id b = byte b, 256 = end of text) so that ds::serve::load_model pairs the
models with its byte tokenizer and the prompts are plain text.

The test suite never runs Python: this script only (re)writes the committed fixtures.

    /tmp/dsvenv/bin/python tools/gen_generate_fixture.py [--out tests/fixtures/generate]

Needs torch and transformers 5 (tested with torch 2.15, transformers 5.23).
"""
import argparse
import json
import os
import shutil

import torch
import transformers
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, Qwen3Config

EOS = 256
MAX_NEW = 32
PROMPTS = ["Hello", "The quick brown fox", "1 2 3 4", "你好"]

# name: (config class, config fields)
CASES = {
    # GPT-2 layout: fused c_attn (Conv1D, [in, out]), learned positions, tied head.
    "gpt2": (GPT2Config, dict(vocab_size=257, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                              bos_token_id=EOS, eos_token_id=EOS)),
    # LLaMA layout with grouped-query attention (4 query heads, 2 KV heads), head_dim 16 != 32 / 4,
    # llama3 rope scaling, untied head.
    "llama_gqa": (LlamaConfig, dict(
        vocab_size=257, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
        tie_word_embeddings=False, bos_token_id=EOS, eos_token_id=EOS,
        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                             low_freq_factor=1.0, high_freq_factor=4.0,
                             original_max_position_embeddings=16))),
    # Qwen3: per-head q/k RMSNorm before RoPE, GQA, tied head.
    "qwen3_gqa": (Qwen3Config, dict(
        vocab_size=257, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
        tie_word_embeddings=True, bos_token_id=EOS, eos_token_id=EOS,
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
}


def randomize(model, gen):
    """Weights far from the N(0, 0.02) init: logits spread over O(10), so greedy choices are
    decided by clear margins rather than the last bits."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.split(".")[-2].startswith("ln"):
                if name.endswith("weight"):
                    p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
                else:
                    p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))


def greedy_with_margins(model, ids, max_new):
    """Greedy decoding by full forwards: the tokens and the smallest top-1/top-2 logit gap."""
    seq = ids.clone()
    margin = float("inf")
    for _ in range(max_new):
        logits = model(input_ids=seq).logits[0, -1]
        top = torch.topk(logits, 2)
        margin = min(margin, (top.values[0] - top.values[1]).item())
        nxt = top.indices[0].view(1, 1)
        seq = torch.cat([seq, nxt], dim=1)
        if nxt.item() == EOS:
            break
    return seq[0, ids.shape[1]:].tolist(), margin


def dump_compact(obj):
    """JSON with one line per prompt (readable diffs, small files)."""
    head = {k: v for k, v in obj.items() if k != "prompts"}
    lines = [json.dumps(p, ensure_ascii=False) for p in obj["prompts"]]
    body = json.dumps(head, indent=1, ensure_ascii=False)[:-2]
    return body + ',\n "prompts": [\n  ' + ",\n  ".join(lines) + "\n ]\n}\n"


def write_case(out, name):
    cls, fields = CASES[name]
    folder = os.path.join(out, name)
    shutil.rmtree(folder, ignore_errors=True)
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    model = AutoModelForCausalLM.from_config(cls(**fields))
    randomize(model, gen)
    model.eval()
    model.save_pretrained(folder)

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    model64 = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64,
                                                   attn_implementation="eager").eval()
    prompts = []
    with torch.no_grad():
        for text in PROMPTS:
            pids = list(text.encode("utf-8"))
            ids = torch.tensor([pids], dtype=torch.long)
            out_ids = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                     max_new_tokens=MAX_NEW, eos_token_id=EOS, pad_token_id=EOS)
            new_ids = out_ids[0, len(pids):].tolist()
            ref_ids, margin = greedy_with_margins(model64, ids, MAX_NEW)
            if ref_ids != new_ids:
                raise SystemExit(f"{name} {text!r}: float32 generate() {new_ids} differs from the "
                                 f"float64 greedy rerun {ref_ids}; change the seed")
            if margin < 1e-3:
                raise SystemExit(f"{name} {text!r}: a greedy step is decided by {margin:.2e}; "
                                 "change the seed or the weight scale")
            prompts.append(dict(text=text, prompt_ids=pids, new_ids=new_ids,
                                min_margin=round(margin, 6)))
    expected = {"transformers": transformers.__version__, "torch": torch.__version__,
                "class": type(model).__name__, "eos_token_id": EOS, "max_new_tokens": MAX_NEW,
                "prompts": prompts}
    with open(os.path.join(folder, "expected.json"), "w") as f:
        f.write(dump_compact(expected))
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
    print(f"{name}: {type(model).__name__}, {size / 1024:.0f} KiB, new tokens "
          f"{[len(p['new_ids']) for p in prompts]}, smallest margin "
          f"{min(p['min_margin'] for p in prompts):.3f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "generate"))
    args = ap.parse_args()
    torch.manual_seed(0)
    os.makedirs(args.out, exist_ok=True)
    for name in CASES:
        write_case(args.out, name)


if __name__ == "__main__":
    main()

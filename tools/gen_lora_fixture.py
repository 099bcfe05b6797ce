#!/usr/bin/env python3
"""Write tests/fixtures/lora/<case>/: a tiny Hugging Face model, a PEFT LoRA adapter for it as
peft saves it, and peft's own logits, loss and LoRA gradients (test_lora).

Each case folder holds
  base/        config.json + model.safetensors (fp32), what save_pretrained wrote
  adapter/     adapter_config.json + adapter_model.safetensors, what PeftModel.save_pretrained wrote
               (lora_B randomised away from its zero init, so that every path of the LoRA matters)
  reference.safetensors:
    input_ids, targets (I64, (B, T); a few targets -100)   logits (F32, (B, T, V))
    loss (F32, scalar; mean cross entropy of logits against targets, no shift)
    grad.<PEFT name without the adapter name> (F32) for every LoRA matrix (peft freezes the base)
The reference runs peft over transformers in float64 (eager attention) from the saved files, so
the C++ test sees its own fp32 rounding alone.

The test suite never runs Python: this script only (re)writes the committed fixtures, and checks
what test_lora exports when DS_LORA_EXPORT_DIR is set (our adapter must load in peft, our merged
model in transformers, both giving the reference logits):

    /tmp/dsvenv/bin/python tools/gen_lora_fixture.py [--out tests/fixtures/lora]
    DS_LORA_EXPORT_DIR=/tmp/lora_export build/tests/test_lora
    /tmp/dsvenv/bin/python tools/gen_lora_fixture.py --check-export /tmp/lora_export

Needs torch, transformers 5 and peft (tested with torch 2.15, transformers 5.23, peft 0.21.2).
"""
import argparse
import json
import os
import shutil

import peft
import torch
import torch.nn.functional as F
import transformers
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

B, T = 2, 8

# name: (config, peft target_modules, fan_in_fan_out)
CASES = {
    "llama": (LlamaConfig(vocab_size=48, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                          tie_word_embeddings=False),
              ["q_proj", "v_proj", "down_proj"], False),
    "gpt2": (GPT2Config(vocab_size=48, n_positions=32, n_embd=16, n_layer=2, n_head=4),
             ["c_attn", "c_fc"], True),
}
R, ALPHA = 4, 8  # scaling alpha / r = 2: a wrong scaling shows


def randomize(model, gen):
    """Weights well away from transformers' N(0, 0.02) init, so that every path matters."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or ".ln_" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))


def reference(base_dir, adapter_dir):
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float64,
                                                attn_implementation="eager")
    return PeftModel.from_pretrained(base, adapter_dir, is_trainable=True)


def write_case(out, name):
    cfg, targets, fan_in_fan_out = CASES[name]
    folder = os.path.join(out, name)
    shutil.rmtree(folder, ignore_errors=True)
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    randomize(model, gen)
    base_dir, adapter_dir = os.path.join(folder, "base"), os.path.join(folder, "adapter")
    model.save_pretrained(base_dir)
    gc = os.path.join(base_dir, "generation_config.json")
    if os.path.exists(gc):
        os.remove(gc)
    lcfg = LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=targets,
                      fan_in_fan_out=fan_in_fan_out, task_type="CAUSAL_LM")
    pm = get_peft_model(model, lcfg)
    with torch.no_grad():
        for pname, p in pm.named_parameters():
            if "lora_B" in pname:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    pm.save_pretrained(adapter_dir)
    os.remove(os.path.join(adapter_dir, "README.md"))  # peft's model card: nothing to test

    ref = reference(base_dir, adapter_dir)
    V = cfg.vocab_size
    ids = torch.randint(0, V, (B, T), generator=gen)
    tgt = torch.randint(0, V, (B, T), generator=gen)
    tgt[0, 0] = tgt[1, 3] = -100
    logits = ref(input_ids=ids).logits
    loss = F.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1), ignore_index=-100)
    loss.backward()
    tensors = {"input_ids": ids, "targets": tgt, "logits": logits.float().detach(),
               "loss": loss.float().detach()}
    n = 0
    for pname, p in ref.named_parameters():
        if p.requires_grad:
            assert "lora_" in pname, pname
            tensors["grad." + pname.replace(".default", "")] = p.grad.float()
            n += 1
    meta = {"transformers": transformers.__version__, "torch": torch.__version__,
            "peft": peft.__version__}
    save_file({k: v.contiguous() for k, v in tensors.items()},
              os.path.join(folder, "reference.safetensors"), metadata=meta)
    print(f"{name}: {n} LoRA matrices, loss {loss.item():.6f}")


def check_export(export_dir, fixtures):
    """test_lora's exports of each case: <case>/adapter must load in peft over the fixture's base,
    <case>/merged in transformers, both with the reference logits."""
    worst = 0.0
    for name in sorted(os.listdir(export_dir)):
        ref_file = os.path.join(fixtures, name, "reference.safetensors")
        if not os.path.exists(ref_file):
            continue
        r = load_file(ref_file)
        with torch.no_grad():
            pm = reference(os.path.join(fixtures, name, "base"),
                           os.path.join(export_dir, name, "adapter"))
            got = pm(input_ids=r["input_ids"]).logits.float()
            e1 = ((got - r["logits"]).abs().max() / r["logits"].abs().max()).item()
            merged = AutoModelForCausalLM.from_pretrained(
                os.path.join(export_dir, name, "merged"), dtype=torch.float64,
                attn_implementation="eager")
            got = merged(input_ids=r["input_ids"]).logits.float()
            e2 = ((got - r["logits"]).abs().max() / r["logits"].abs().max()).item()
        worst = max(worst, e1, e2)
        ok = e1 < 1e-6 and e2 < 1e-5
        print(f"{name}: our adapter in peft {e1:.2e}, our merged model in transformers {e2:.2e} "
              f"(max rel diff of logits) {'ok' if ok else 'FAIL'}")
        if not ok:
            raise SystemExit(1)
    print(f"exports load in peft {peft.__version__} / transformers {transformers.__version__}; "
          f"worst {worst:.2e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    fixtures = os.path.join(here, "..", "tests", "fixtures", "lora")
    ap.add_argument("--out", default=fixtures)
    ap.add_argument("--check-export", metavar="DIR",
                    help="check test_lora's exports (DS_LORA_EXPORT_DIR) instead")
    args = ap.parse_args()
    torch.manual_seed(0)
    if args.check_export:
        check_export(args.check_export, args.out)
        return
    os.makedirs(args.out, exist_ok=True)
    for name in CASES:
        write_case(args.out, name)


if __name__ == "__main__":
    main()

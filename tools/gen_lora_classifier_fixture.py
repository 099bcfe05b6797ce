#!/usr/bin/env python3
"""Write tests/fixtures/lora_classifier/<case>/: a tiny Hugging Face *ForSequenceClassification
model, a PEFT LoRA adapter for it with task_type SEQ_CLS as peft saves it (peft's default
target_modules for the model type, and the classification head `classifier` as modules_to_save),
and peft's own logits, loss and gradients (test_lora's classifier cases).

Each case folder holds
  base/        config.json + model.safetensors (fp32), what save_pretrained wrote
  adapter/     adapter_config.json + adapter_model.safetensors, what PeftModel.save_pretrained
               wrote (lora_B and the saved head randomised, so that every path matters)
  reference.safetensors:
    input_ids, token_type_ids, attention_mask (I64, (B, T)), labels (I64, (B))
    logits (F32, (B, NL)), loss (F32, scalar; mean cross entropy)
    grad.<peft parameter name without the adapter name> (F32) for every trainable parameter
    (the LoRA matrices and the head's modules_to_save copy)
The reference runs peft over transformers in float64 (eager attention), from the saved files.

The suite never runs Python. This script (re)writes the fixtures, and checks what test_lora
exports when DS_LORA_EXPORT_DIR is set (our adapter loads in peft over the base, our merged folder
in transformers, both giving the reference logits):

    $VENV/bin/python tools/gen_lora_classifier_fixture.py
    DS_LORA_EXPORT_DIR=/tmp/lora_export build/tests/test_lora
    $VENV/bin/python tools/gen_lora_classifier_fixture.py --check-export /tmp/lora_export

Tested with torch 2.15, transformers 5.24, peft 0.21.2.
"""
import argparse
import os
import shutil

import peft
import torch
import torch.nn.functional as F
import transformers
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import (AutoModelForSequenceClassification, BertConfig, DebertaV2Config,
                          RobertaConfig)

B, T, NL = 3, 7, 3
R, ALPHA = 4, 8  # scaling 2: a wrong scaling shows

CASES = {
    "bert": BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=32, max_position_embeddings=32, num_labels=NL,
                       hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
    "roberta": RobertaConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2,
                             num_attention_heads=4, intermediate_size=32,
                             max_position_embeddings=40, num_labels=NL, pad_token_id=1,
                             type_vocab_size=1, hidden_dropout_prob=0.0,
                             attention_probs_dropout_prob=0.0),
    "deberta-v2": DebertaV2Config(vocab_size=40, hidden_size=16, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=32,
                                  max_position_embeddings=32, num_labels=NL, relative_attention=True,
                                  position_buckets=8, max_relative_positions=16,
                                  pos_att_type=["p2c", "c2p"], share_att_key=False,
                                  position_biased_input=False, type_vocab_size=2,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                  pooler_dropout=0.0),
}


def randomize(model, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm.weight" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))


def reference(base_dir, adapter_dir):
    base = AutoModelForSequenceClassification.from_pretrained(base_dir, dtype=torch.float64,
                                                              attn_implementation="eager")
    return PeftModel.from_pretrained(base, adapter_dir, is_trainable=True)


def inputs(r):
    return dict(input_ids=r["input_ids"], token_type_ids=r["token_type_ids"],
                attention_mask=r["attention_mask"])


def write_case(out, name):
    cfg = CASES[name]
    folder = os.path.join(out, name)
    shutil.rmtree(folder, ignore_errors=True)
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    model = AutoModelForSequenceClassification.from_config(cfg, attn_implementation="eager")
    randomize(model, gen)
    base_dir, adapter_dir = os.path.join(folder, "base"), os.path.join(folder, "adapter")
    model.save_pretrained(base_dir)
    # peft's defaults: target_modules from the model type, modules_to_save ["classifier", "score"]
    pm = get_peft_model(model, LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0,
                                          task_type="SEQ_CLS"))
    with torch.no_grad():
        for pname, p in pm.named_parameters():
            if "lora_B" in pname or "modules_to_save" in pname:
                p.add_(0.3 * torch.randn(p.shape, generator=gen))
    pm.save_pretrained(adapter_dir)
    os.remove(os.path.join(adapter_dir, "README.md"))

    ref = reference(base_dir, adapter_dir)
    ids = torch.randint(3, cfg.vocab_size, (B, T), generator=gen)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 5:] = 0
    mask[2, 3:] = 0
    ids[mask == 0] = cfg.pad_token_id or 0
    tt = torch.zeros(B, T, dtype=torch.long)
    if cfg.type_vocab_size > 1:
        tt[:, 4:] = 1
    labels = torch.randint(0, NL, (B,), generator=gen)
    logits = ref(input_ids=ids, token_type_ids=tt, attention_mask=mask).logits
    loss = F.cross_entropy(logits, labels)
    loss.backward()
    tensors = {"input_ids": ids, "token_type_ids": tt, "attention_mask": mask, "labels": labels,
               "logits": logits.float().detach(), "loss": loss.float().detach()}
    n = 0
    for pname, p in ref.named_parameters():
        if p.requires_grad:
            assert "lora_" in pname or "modules_to_save" in pname, pname
            tensors["grad." + pname.replace(".default", "").replace(".modules_to_save", "")] = \
                p.grad.float()
            n += 1
    meta = {"transformers": transformers.__version__, "torch": torch.__version__,
            "peft": peft.__version__}
    save_file({k: v.contiguous() for k, v in tensors.items()},
              os.path.join(folder, "reference.safetensors"), metadata=meta)
    print(f"{name}: {n} trainable tensors, loss {loss.item():.6f}")


def check_export(export_dir, fixtures):
    worst = 0.0
    for name in sorted(os.listdir(export_dir)):
        ref_file = os.path.join(fixtures, name, "reference.safetensors")
        if not os.path.exists(ref_file):
            continue
        r = load_file(ref_file)
        with torch.no_grad():
            pm = reference(os.path.join(fixtures, name, "base"),
                           os.path.join(export_dir, name, "adapter"))
            got = pm(**inputs(r)).logits.float()
            e1 = ((got - r["logits"]).abs().max() / r["logits"].abs().max()).item()
            merged = AutoModelForSequenceClassification.from_pretrained(
                os.path.join(export_dir, name, "merged"), dtype=torch.float64,
                attn_implementation="eager")
            got = merged(**inputs(r)).logits.float()
            e2 = ((got - r["logits"]).abs().max() / r["logits"].abs().max()).item()
        worst = max(worst, e1, e2)
        ok = e1 < 1e-5 and e2 < 1e-5
        print(f"{name}: our adapter in peft {e1:.2e}, our merged model in transformers {e2:.2e} "
              f"(max rel diff of logits) {'ok' if ok else 'FAIL'}")
        if not ok:
            raise SystemExit(1)
    print(f"exports load in peft {peft.__version__} / transformers {transformers.__version__}; "
          f"worst {worst:.2e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures",
                                                  "lora_classifier"))
    ap.add_argument("--check-export", metavar="DIR")
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

#!/usr/bin/env python3
"""Write tests/fixtures/hf_families/<case>/ for the encoder classifiers: tiny random-weight
BertForSequenceClassification / RobertaForSequenceClassification models as transformers saves
them, with transformers' own logits, loss and every gradient (test_hf_encoders).

Each case folder holds what `save_pretrained` wrote (config.json, model.safetensors), the weights
rounded to the case's dtype, and reference.safetensors:
  input_ids (I64, (B, T)), attention_mask and token_type_ids (I64, (B, T); absent when the case
  passes none), labels (I64 (B) class ids; F32 (B) for regression, (B, num_labels) 0/1 for
  multi-label)
  logits (F32, (B, num_labels)), loss (F32, scalar: transformers' own, from labels)
  grad.<Hugging Face parameter name> (F32) for every parameter
  adamw_losses (F32, (10)): the loss before each of 10 torch AdamW steps (lr 1e-3, betas
  (0.9, 0.999), eps 1e-8, weight decay 0.1 on every parameter) on the same batch
The reference runs transformers itself in float64 (eager attention, eval mode: dropout off) from
the saved weights, so the C++ test sees its own fp32 rounding alone.

The padded cases right-pad with pad_token_id and also place one pad-id token inside a row's real
tokens: torch's Embedding(padding_idx) gives that row no gradient there too, and RoBERTa's position
ids skip it (create_position_ids_from_input_ids counts non-pad tokens).

The test suite never runs Python: this script only (re)writes the committed fixtures, and checks
an export of ours (test_hf_encoders writes it when DS_HF_EXPORT_DIR is set) against them:

    python3 -m venv /tmp/hf && /tmp/hf/bin/pip install torch transformers safetensors
    /tmp/hf/bin/python tools/gen_encoder_fixture.py [--out tests/fixtures/hf_families]
    DS_HF_EXPORT_DIR=/tmp/enc_export build/tests/test_hf_encoders
    /tmp/hf/bin/python tools/gen_encoder_fixture.py --check-export /tmp/enc_export

Needs torch and transformers 5 (tested with torch 2.15, transformers 5.24).
"""
import argparse
import os
import shutil

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoModelForSequenceClassification, BertConfig, RobertaConfig

B, T = 3, 10
SMALL = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=48)

# name: (config class, extra config fields, saved dtype, lengths or None (no attention_mask),
#        token types?)
CASES = {
    # 3 labels, exact GELU, padded batch with two segments, fp32.
    "bert_cls": (BertConfig, dict(num_labels=3, max_position_embeddings=40, type_vocab_size=2),
                 torch.float32, [10, 7, 4], True),
    # RoBERTa: pad_token_id 1 (positions start at 2), one token type, 3 labels, padded, bf16.
    "roberta_cls": (RobertaConfig, dict(num_labels=3, max_position_embeddings=42,
                                        type_vocab_size=1, pad_token_id=1),
                    torch.bfloat16, [6, 10, 3], False),
    # Regression (num_labels 1: MSE), tanh GELU, classifier_dropout set, no mask and no token
    # types (transformers' defaults), bf16.
    "bert_regression": (BertConfig, dict(num_labels=1, max_position_embeddings=40,
                                         type_vocab_size=2, hidden_act="gelu_new",
                                         classifier_dropout=0.2),
                        torch.bfloat16, None, False),
    # Multi-label (BCE with logits on 4 labels), one layer, padded with two segments, bf16.
    "bert_multilabel": (BertConfig, dict(num_labels=4, problem_type="multi_label_classification",
                                         num_hidden_layers=1, max_position_embeddings=40,
                                         type_vocab_size=2),
                        torch.bfloat16, [9, 10, 5], True),
}


def randomize(model, gen):
    """Weights well away from transformers' N(0, 0.02) init, so that every path matters."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("LayerNorm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))


def reference(folder):
    model = AutoModelForSequenceClassification.from_pretrained(
        folder, dtype=torch.float64, attn_implementation="eager")
    model.eval()  # dropout off
    return model


def inputs(cfg, lengths, types, gen):
    pad = cfg.pad_token_id
    ids = torch.randint(3, cfg.vocab_size, (B, T), generator=gen)
    out = {}
    if lengths is not None:
        mask = torch.zeros(B, T, dtype=torch.long)
        for b, n in enumerate(lengths):
            mask[b, :n] = 1
            ids[b, n:] = pad
        ids[0, 2] = pad  # a pad-id token among real ones (row 0 is full length)
        out["attention_mask"] = mask
    if types:
        tt = torch.zeros(B, T, dtype=torch.long)
        for b, n in enumerate(lengths):
            tt[b, n // 2:n] = 1
        out["token_type_ids"] = tt
    out["input_ids"] = ids
    return out


def write_case(out, name):
    cls, extra, dtype, lengths, types = CASES[name]
    folder = os.path.join(out, name)
    shutil.rmtree(folder, ignore_errors=True)
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    cfg = cls(**{**SMALL, **extra})
    model = AutoModelForSequenceClassification.from_config(cfg, attn_implementation="eager")
    randomize(model, gen)
    model = model.to(dtype)
    model.save_pretrained(folder)

    ref = reference(folder)
    x = inputs(ref.config, lengths, types, gen)
    if ref.config.problem_type == "multi_label_classification":
        labels = torch.randint(0, 2, (B, ref.config.num_labels), generator=gen).double()
    elif ref.config.num_labels == 1:
        labels = torch.randn(B, generator=gen, dtype=torch.float64)
    else:
        labels = torch.randint(0, ref.config.num_labels, (B,), generator=gen)
    res = ref(**x, labels=labels)
    res.loss.backward()
    tensors = dict(x)
    tensors["labels"] = labels.float() if labels.is_floating_point() else labels
    tensors["logits"] = res.logits.float().detach()
    tensors["loss"] = res.loss.float().detach()
    for pname, p in ref.named_parameters():
        tensors["grad." + pname] = p.grad.float()
    # Ten AdamW steps on the same batch (eval mode: no dropout), the loss before each step.
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.1)
    losses = []
    for _ in range(10):
        opt.zero_grad()
        step_loss = ref(**x, labels=labels).loss
        step_loss.backward()
        losses.append(step_loss.item())
        opt.step()
    tensors["adamw_losses"] = torch.tensor(losses, dtype=torch.float32)
    meta = {"transformers": transformers.__version__, "torch": torch.__version__,
            "class": type(ref).__name__, "dtype": str(dtype).replace("torch.", "")}
    save_file({k: v.contiguous() for k, v in tensors.items()},
              os.path.join(folder, "reference.safetensors"), metadata=meta)
    files = sorted(os.listdir(folder))
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in files)
    print(f"{name}: {type(ref).__name__} {meta['dtype']}, loss {res.loss.item():.6f}, "
          f"{size / 1024:.0f} KiB ({', '.join(files)})")


def check_export(export_dir, fixtures):
    """Our export of each case must load in transformers as the same class with the same logits."""
    worst = 0.0
    for name in sorted(os.listdir(export_dir)):
        ref_file = os.path.join(fixtures, name, "reference.safetensors")
        if name not in CASES or not os.path.exists(ref_file):
            continue
        r = load_file(ref_file)
        want_class = CASES[name][0].model_type
        model = reference(os.path.join(export_dir, name))
        x = {k: r[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in r}
        logits = model(**x).logits.float()
        err = ((logits - r["logits"]).abs().max() / r["logits"].abs().max()).item()
        worst = max(worst, err)
        ok = model.config.model_type == want_class and err < 1e-6
        print(f"{name}: {type(model).__name__}, logits max rel diff {err:.2e} "
              f"{'ok' if ok else 'FAIL'}")
        if not ok:
            raise SystemExit(1)
    print(f"all exports load in transformers {transformers.__version__}; worst {worst:.2e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    fixtures = os.path.join(here, "..", "tests", "fixtures", "hf_families")
    ap.add_argument("--out", default=fixtures)
    ap.add_argument("--check-export", metavar="DIR",
                    help="check test_hf_encoders' export (DS_HF_EXPORT_DIR) instead")
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

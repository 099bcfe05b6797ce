#!/usr/bin/env python3
"""Write tests/fixtures/hf_families/deberta_*/ for the DeBERTa-v2 classifier: tiny random-weight
DebertaV2ForSequenceClassification models as transformers saves them, with transformers' own
logits, loss and every gradient (test_hf_deberta). The sibling of gen_encoder_fixture.py (BERT and
RoBERTa), whose layout and helpers it shares: each case folder holds config.json and
model.safetensors as save_pretrained wrote them, and reference.safetensors with
  input_ids (I64, (B, T)), attention_mask and token_type_ids (I64, (B, T); absent when the case
  passes none), labels (I64 (B) class ids; F32 (B) for regression)
  logits (F32, (B, num_labels)), loss (F32, scalar), grad.<Hugging Face parameter name> (F32)
  adamw_losses (F32, (10)): the loss before each of 10 torch AdamW steps (as gen_encoder_fixture,
  but eps 1e-6: in deberta_xl some conv weights' gradients sit at fp32 rounding level (one is
  1.3e-7 in float64, 1.2e-8 in ours and 3.0e-7 in torch's own fp32 run), and with eps 1e-8 Adam
  turns that noise into steps of up to lr, which moved our next losses by up to 1e-3 of the
  reference (torch fp32: 2e-5); with 1e-6 such steps shrink tenfold)
deberta_xl is the shape of microsoft/deberta-v2-xlarge(-mnli) in miniature; its reference also
holds transformers' make_log_bucket_position over every relative distance for the xlarge settings
(bucket.256_512: distances -1023..1023) and for the fixture's own (bucket.8_24).

The reference runs transformers in float64, eval mode (dropout off), from the saved fp32 weights.

    python3 -m venv /tmp/hf && /tmp/hf/bin/pip install torch transformers safetensors
    /tmp/hf/bin/python tools/gen_deberta_fixture.py [--out tests/fixtures/hf_families]
    DS_HF_EXPORT_DIR=/tmp/deb_export build/tests/test_hf_deberta
    /tmp/hf/bin/python tools/gen_deberta_fixture.py --check-export /tmp/deb_export

Needs torch and transformers 5 (tested with torch 2.15, transformers 5.24).
"""
import argparse
import os
import shutil

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoModelForSequenceClassification, DebertaV2Config
from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

from gen_encoder_fixture import B, T, inputs, randomize, reference

SMALL = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=48)

# name: (extra config fields, lengths or None (no attention_mask), token types?)
CASES = {
    # microsoft/deberta-v2-xlarge's switches: no absolute positions, no token types, log-bucketed
    # relative positions shared with the content projections, LayerNorm on rel_embeddings,
    # p2c + c2p, the GELU ConvLayer after layer 0; 3 labels (MNLI), padded batch.
    "deberta_xl": (dict(num_labels=3, max_position_embeddings=24, relative_attention=True,
                        position_buckets=8, max_relative_positions=-1, share_att_key=True,
                        pos_att_type="p2c|c2p", norm_rel_ebd="layer_norm", conv_kernel_size=3,
                        conv_act="gelu", position_biased_input=False, type_vocab_size=0,
                        layer_norm_eps=1e-7),
                   [10, 7, 4], False),
    # DeBERTa-v2 in its other form: absolute positions and two token types, embedding_size 24
    # (embed_proj), unbucketed relative positions clamped at 6, separate pos_key_proj /
    # pos_query_proj, no rel LayerNorm, no conv; tanh GELU, tanh pooler, cls_dropout set.
    "deberta_types": (dict(num_labels=2, max_position_embeddings=16, relative_attention=True,
                           max_relative_positions=6, share_att_key=False,
                           pos_att_type=["c2p", "p2c"], position_biased_input=True,
                           type_vocab_size=2, embedding_size=24, hidden_act="gelu_new",
                           pooler_hidden_act="tanh", cls_dropout=0.2),
                      [9, 10, 5], True),
    # Regression (num_labels 1: MSE), c2p alone, a grouped kernel-5 tanh conv, buckets 4 of 16,
    # one layer, no mask and no token types.
    "deberta_regression": (dict(num_labels=1, num_hidden_layers=1, max_position_embeddings=32,
                                relative_attention=True, position_buckets=4,
                                max_relative_positions=16, share_att_key=True,
                                pos_att_type=["c2p"], norm_rel_ebd="layer_norm",
                                conv_kernel_size=5, conv_groups=2, conv_act="tanh",
                                position_biased_input=False, type_vocab_size=0),
                           None, False),
}


def bucket_table(bucket, max_pos):
    d = torch.arange(-(2 * max_pos - 1), 2 * max_pos, dtype=torch.long)
    return make_log_bucket_position(d, bucket, max_pos).to(torch.long)


def write_case(out, name):
    extra, lengths, types = CASES[name]
    folder = os.path.join(out, name)
    shutil.rmtree(folder, ignore_errors=True)
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    cfg = DebertaV2Config(**{**SMALL, **extra})
    model = AutoModelForSequenceClassification.from_config(cfg, attn_implementation="eager")
    randomize(model, gen)
    model.save_pretrained(folder)

    ref = reference(folder)
    x = inputs(ref.config, lengths, types, gen)
    if ref.config.num_labels == 1:
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
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        tensors["grad." + pname] = g.float()
    if name == "deberta_xl":
        tensors["bucket.256_512"] = bucket_table(256, 512)
        tensors["bucket.8_24"] = bucket_table(8, 24)
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-6,
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
            "class": type(ref).__name__, "dtype": "float32"}
    save_file({k: v.contiguous() for k, v in tensors.items()},
              os.path.join(folder, "reference.safetensors"), metadata=meta)
    files = sorted(os.listdir(folder))
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in files)
    print(f"{name}: {type(ref).__name__}, loss {res.loss.item():.6f}, "
          f"{size / 1024:.0f} KiB ({', '.join(files)})")


def check_export(export_dir, fixtures):
    """Our export of each case must load in transformers as the same class with the same logits."""
    worst = 0.0
    for name in sorted(os.listdir(export_dir)):
        ref_file = os.path.join(fixtures, name, "reference.safetensors")
        if name not in CASES or not os.path.exists(ref_file):
            continue
        r = load_file(ref_file)
        model = reference(os.path.join(export_dir, name))
        x = {k: r[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in r}
        # Flattened: with labels, a num_labels 1 model returns (B) logits, without (B, 1).
        logits = model(**x).logits.float().flatten()
        want = r["logits"].flatten()
        err = ((logits - want).abs().max() / want.abs().max()).item()
        worst = max(worst, err)
        ok = model.config.model_type == "deberta-v2" and err < 1e-6
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
                    help="check test_hf_deberta's export (DS_HF_EXPORT_DIR) instead")
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

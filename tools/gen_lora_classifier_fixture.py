#!/usr/bin/env python3
"""Write tests/fixtures/lora_classifier/<case>/: a tiny Hugging Face *ForSequenceClassification
model, a PEFT LoRA adapter for it with task_type SEQ_CLS as peft saves it (peft's default
target_modules for the model type, and the classification head `classifier` as modules_to_save),
and peft's own logits, loss and gradients (test_lora's classifier cases); with --task seq2seq,
tests/fixtures/lora_seq2seq/<case>/ for the encoder-decoders (TaskType.SEQ_2_SEQ_LM, below).

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

--task seq2seq: tests/fixtures/lora_seq2seq/<case>/ over the committed seq2seq fixtures
tests/fixtures/hf_families/<case> (tools/gen_seq2seq_fixture.py) as bases: bart_s2s,
blenderbot_s2s and t5_relu_tied, each with
  adapter/     a SEQ_2_SEQ_LM adapter as PeftModel.save_pretrained wrote it: peft's default
               target_modules for the model type (bart q_proj,v_proj; t5 q,v; blenderbot, which
               peft's table lacks, given BART's), nothing to save besides LoRA; lora_B randomised;
               base_model_name_or_path null (as the classifier fixtures)
  reference.safetensors:
    input_ids, attention_mask, labels (I64): the base fixture's batch
    logits (F32, (B, T, V)), loss (F32): peft's, float64, eval mode
    grad.<peft parameter name without the adapter name> (F32) for every trainable parameter
    generated (I64, (B, 1 + N)): greedy generate(max_new_tokens=N (metadata max_new_tokens),
    processors off) of the unmerged peft model

    $VENV/bin/python tools/gen_lora_classifier_fixture.py --task seq2seq
    DS_LORA_EXPORT_DIR=/tmp/lora_export build/tests/test_lora --gtest_filter='*LoraSeq2SeqPeft*'
    $VENV/bin/python tools/gen_lora_classifier_fixture.py --task seq2seq --check-export /tmp/lora_export

Tested with torch 2.15, transformers 5.24, peft 0.21.2.
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
from transformers import (AutoModelForSeq2SeqLM, AutoModelForSequenceClassification, BertConfig,
                          DebertaV2Config, RobertaConfig)

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


# SEQ_2_SEQ_LM cases: base folder under tests/fixtures/hf_families -> target_modules (None:
# peft's default for the model type).
S2S_CASES = {"bart_s2s": None, "blenderbot_s2s": ["q_proj", "v_proj"], "t5_relu_tied": None}
S2S_NEW = 8  # greedy tokens generated


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


def s2s_reference(base_dir, adapter_dir):
    base = AutoModelForSeq2SeqLM.from_pretrained(base_dir, dtype=torch.float64,
                                                 attn_implementation="eager")
    pm = PeftModel.from_pretrained(base, adapter_dir, is_trainable=True)
    pm.eval()  # dropout off (the bases have dropout 0.1)
    return pm


def s2s_inputs(r):
    return dict(input_ids=r["input_ids"], attention_mask=r["attention_mask"])


def s2s_generate(model, r):
    c = model.config
    return model.generate(**s2s_inputs(r), num_beams=1, do_sample=False, max_new_tokens=S2S_NEW,
                          min_length=0, no_repeat_ngram_size=0, encoder_no_repeat_ngram_size=0,
                          forced_bos_token_id=None,
                          forced_eos_token_id=getattr(c, "forced_eos_token_id", None),
                          eos_token_id=c.eos_token_id, pad_token_id=c.pad_token_id,
                          decoder_start_token_id=c.decoder_start_token_id)


def write_s2s_case(out, bases, name):
    base_dir = os.path.join(bases, name)
    folder = os.path.join(out, name)
    shutil.rmtree(folder, ignore_errors=True)
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    model = AutoModelForSeq2SeqLM.from_pretrained(base_dir, attn_implementation="eager")
    pm = get_peft_model(model, LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0,
                                          task_type="SEQ_2_SEQ_LM",
                                          target_modules=S2S_CASES[name]))
    scale = 0.15 if model.config.model_type == "t5" else 0.3  # T5's attention is unscaled
    with torch.no_grad():
        for pname, p in pm.named_parameters():
            if "lora_B" in pname:
                p.add_(scale * torch.randn(p.shape, generator=gen))
    adapter_dir = os.path.join(folder, "adapter")
    pm.save_pretrained(adapter_dir)
    os.remove(os.path.join(adapter_dir, "README.md"))
    cfg_file = os.path.join(adapter_dir, "adapter_config.json")
    with open(cfg_file) as f:
        acfg = json.load(f)
    acfg["base_model_name_or_path"] = None  # not this machine's path
    with open(cfg_file, "w") as f:
        json.dump(acfg, f, indent=2, sort_keys=True)

    r = load_file(os.path.join(base_dir, "reference.safetensors"))
    ref = s2s_reference(base_dir, adapter_dir)
    res = ref(**s2s_inputs(r), labels=r["labels"])
    res.loss.backward()
    tensors = {"input_ids": r["input_ids"], "attention_mask": r["attention_mask"],
               "labels": r["labels"], "logits": res.logits.float().detach(),
               "loss": res.loss.float().detach()}
    n = 0
    for pname, p in ref.named_parameters():
        if p.requires_grad:
            assert "lora_" in pname, pname  # SEQ_2_SEQ_LM trains the adapters only
            tensors["grad." + pname.replace(".default", "")] = p.grad.float()
            n += 1
    with torch.no_grad():
        tensors["generated"] = s2s_generate(ref, r)
    meta = {"transformers": transformers.__version__, "torch": torch.__version__,
            "peft": peft.__version__, "max_new_tokens": str(S2S_NEW)}
    save_file({k: v.contiguous() for k, v in tensors.items()},
              os.path.join(folder, "reference.safetensors"), metadata=meta)
    print(f"{name}: {n} trainable tensors, loss {res.loss.item():.6f}, targets "
          f"{acfg['target_modules']}, generated {tensors['generated'].tolist()}")


def check_s2s_export(export_dir, fixtures, bases):
    """Our adapter loads in peft over the base, our merged folder in transformers: the reference
    logits, and the merged model's greedy generation is the unmerged peft model's."""
    worst = 0.0
    for name in sorted(os.listdir(export_dir)):
        ref_file = os.path.join(fixtures, name, "reference.safetensors")
        if not os.path.exists(ref_file):
            continue
        r = load_file(ref_file)
        with torch.no_grad():
            pm = s2s_reference(os.path.join(bases, name), os.path.join(export_dir, name, "adapter"))
            got = pm(**s2s_inputs(r), labels=r["labels"]).logits.float()
            e1 = ((got - r["logits"]).abs().max() / r["logits"].abs().max()).item()
            merged = AutoModelForSeq2SeqLM.from_pretrained(
                os.path.join(export_dir, name, "merged"), dtype=torch.float64,
                attn_implementation="eager")
            merged.eval()
            got = merged(**s2s_inputs(r), labels=r["labels"]).logits.float()
            e2 = ((got - r["logits"]).abs().max() / r["logits"].abs().max()).item()
            same = torch.equal(s2s_generate(merged, r), r["generated"])
        worst = max(worst, e1, e2)
        ok = e1 < 1e-5 and e2 < 1e-5 and same
        print(f"{name}: our adapter in peft {e1:.2e}, our merged model in transformers {e2:.2e} "
              f"(max rel diff of logits), merged greedy generation "
              f"{'equal' if same else 'DIFFERENT'} {'ok' if ok else 'FAIL'}")
        if not ok:
            raise SystemExit(1)
    print(f"exports load in peft {peft.__version__} / transformers {transformers.__version__}; "
          f"worst {worst:.2e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    fixtures = os.path.join(here, "..", "tests", "fixtures")
    ap.add_argument("--task", choices=["classifier", "seq2seq"], default="classifier")
    ap.add_argument("--out", help="default tests/fixtures/lora_classifier (--task seq2seq: "
                    "tests/fixtures/lora_seq2seq)")
    ap.add_argument("--check-export", metavar="DIR")
    args = ap.parse_args()
    s2s = args.task == "seq2seq"
    out = args.out or os.path.join(fixtures, "lora_seq2seq" if s2s else "lora_classifier")
    bases = os.path.join(fixtures, "hf_families")
    torch.manual_seed(0)
    if args.check_export:
        if s2s:
            check_s2s_export(args.check_export, out, bases)
        else:
            check_export(args.check_export, out)
        return
    os.makedirs(out, exist_ok=True)
    for name in S2S_CASES if s2s else CASES:
        if s2s:
            write_s2s_case(out, bases, name)
        else:
            write_case(out, name)


if __name__ == "__main__":
    main()

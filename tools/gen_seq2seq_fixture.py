#!/usr/bin/env python3
"""Write tests/fixtures/hf_families/<case>/ for the sequence-to-sequence models
(models::Seq2Seq, test_hf_seq2seq): tiny random-weight BartForConditionalGeneration,
BlenderbotForConditionalGeneration and T5ForConditionalGeneration models as transformers saves
them, with transformers' own logits, loss, every gradient and greedy generation.

T5 cases: t5_relu_tied (T5DenseActDense, lm_head tied to shared, decoder output scaled by
d_model^-0.5) and t5_gated_untied (t5-v1_1 / flan-t5 style: gated-gelu, an lm_head.weight of its
own, no scale; config.json as the hub's, tie_word_embeddings false). transformers 5 builds T5's
lm_head tied always and unties it on load when the file's lm_head.weight differs, so the untied
case writes a distinct lm_head.weight into the saved file and reloads.

Each case folder holds what `save_pretrained` wrote (config.json, generation_config.json,
model.safetensors) and reference.safetensors:
  input_ids, attention_mask (I64, (B, S)): right-padded source batch
  labels (I64, (B, T)): target ids, -100 after each row's end (ignored by the loss)
  logits (F32, (B, T, V)), loss (F32, scalar): transformers' own from labels (the decoder input is
  shift_tokens_right(labels, pad_token_id, decoder_start_token_id))
  grad.<Hugging Face parameter name> (F32) for every parameter
  generated (I64, (B, 1 + N)): generate(input_ids, attention_mask, num_beams=1, do_sample=False,
  max_new_tokens=N, min_length=0, no_repeat_ngram_size=0, encoder_no_repeat_ngram_size=0) with the config's eos / pad /
  forced_eos_token_id; the first column is decoder_start_token_id
  generated_eos (I64): the same with eos_token_id = generated[0, 2] (metadata generated_eos):
  rows that end are padded with pad_token_id, and generation stops when every row has ended
  greedy_proc (I64): greedy with min_length=4, no_repeat_ngram_size=2,
  encoder_no_repeat_ngram_size=2
  beam_<a|b|c> (I64): beam search with the settings of BEAMS (metadata beam_<x>_eos: its eos)
The reference runs transformers itself in float64 (eager attention, eval mode: dropout off) from
the saved weights, so the C++ test sees its own fp32 rounding alone. final_logits_bias (a buffer,
zero at init) is randomised too so that its path is checked.

The test suite never runs Python: this script only (re)writes the committed fixtures, and checks
an export of ours (test_hf_seq2seq writes it when DS_HF_EXPORT_DIR is set) against them:

    python3 -m venv /tmp/hf && /tmp/hf/bin/pip install torch transformers safetensors
    /tmp/hf/bin/python tools/gen_seq2seq_fixture.py [--out tests/fixtures/hf_families]
    DS_HF_EXPORT_DIR=/tmp/s2s_export build/tests/test_hf_seq2seq
    /tmp/hf/bin/python tools/gen_seq2seq_fixture.py --check-export /tmp/s2s_export

Needs torch and transformers 5 (tested with torch 2.15, transformers 5.24).
"""
import argparse
import os
import shutil

import torch
import transformers
from safetensors.torch import load_file, save_file
import json

from transformers import (AutoModelForSeq2SeqLM, BartConfig, BlenderbotConfig, T5Config)

B, S, T, NEW = 3, 9, 7, 8
SRC_LENGTHS = [9, 6, 4]
TGT_LENGTHS = [7, 5, 3]

# name: (config class, config fields)
CASES = {
    # BART: post-LN, layernorm_embedding, positions offset by 2, exact GELU, no embedding scale;
    # encoder and decoder differ in heads and FFN width.
    "bart_s2s": (BartConfig, dict(vocab_size=64, d_model=32, encoder_layers=2, decoder_layers=2,
                                  encoder_attention_heads=4, decoder_attention_heads=2,
                                  encoder_ffn_dim=40, decoder_ffn_dim=48,
                                  max_position_embeddings=24, activation_function="gelu",
                                  scale_embedding=False)),
    # BART with ReLU, sqrt(d_model) embedding scale, one decoder layer.
    "bart_relu_scaled": (BartConfig, dict(vocab_size=64, d_model=32, encoder_layers=2,
                                          decoder_layers=1, encoder_attention_heads=4,
                                          decoder_attention_heads=4, encoder_ffn_dim=40,
                                          decoder_ffn_dim=40, max_position_embeddings=20,
                                          activation_function="relu", scale_embedding=True)),
    # BlenderBot (blenderbot-400M-distill's shape of config): pre-LN, final encoder/decoder
    # layer_norm, positions without offset, scale_embedding true, pad 0 / bos 1 / eos 2.
    "blenderbot_s2s": (BlenderbotConfig, dict(vocab_size=64, d_model=32, encoder_layers=2,
                                              decoder_layers=2, encoder_attention_heads=4,
                                              decoder_attention_heads=4, encoder_ffn_dim=40,
                                              decoder_ffn_dim=48, max_position_embeddings=20,
                                              activation_function="gelu",
                                              scale_embedding=True)),
    # T5: d_kv * num_heads (48) != d_model, 3 encoder / 2 decoder blocks (transformers 5.24's
    # generate sizes its cache by num_layers: more decoder than encoder blocks fail there), few
    # buckets so that the log-spaced buckets and the max_distance clamp are reached.
    "t5_relu_tied": (T5Config, dict(vocab_size=64, d_model=32, d_kv=12, d_ff=40, num_layers=3,
                                    num_decoder_layers=2, num_heads=4,
                                    relative_attention_num_buckets=8,
                                    relative_attention_max_distance=6, feed_forward_proj="relu",
                                    decoder_start_token_id=0, dropout_rate=0.1)),
    # t5-v1_1 / flan-t5 style: gated-gelu (gelu_new), untied lm_head, no decoder output scale.
    "t5_gated_untied": (T5Config, dict(vocab_size=64, d_model=32, d_kv=8, d_ff=48, num_layers=2,
                                       num_decoder_layers=2, num_heads=4,
                                       relative_attention_num_buckets=16,
                                       relative_attention_max_distance=20,
                                       feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                                       decoder_start_token_id=0, dropout_rate=0.1)),
}


# Beam-search settings: generate(**fields, do_sample=False, max_new_tokens=NEW); eos "config" is the
# config's eos_token_id, "early" the token row 0 generated second greedily (beams end early).
BEAMS = {
    "a": dict(num_beams=4, length_penalty=0.8, no_repeat_ngram_size=2, min_length=3,
              encoder_no_repeat_ngram_size=0, early_stopping=False, eos="config"),
    "b": dict(num_beams=3, length_penalty=1.5, no_repeat_ngram_size=0, min_length=0,
              encoder_no_repeat_ngram_size=2, early_stopping=True, eos="early"),
    "c": dict(num_beams=2, length_penalty=-0.5, no_repeat_ngram_size=3, min_length=0,
              encoder_no_repeat_ngram_size=0, early_stopping="never", eos="early"),
}

# Seeds moved off sum(ord(name)) where that drew a model whose greedy output is one repeated
# token: the generation test wants rows that differ.
SEED_SHIFT = {"blenderbot_s2s": 2, "t5_relu_tied": 3}


def randomize(model, gen):
    """Weights well away from transformers' N(0, 0.02) init, so that every path matters."""
    t5 = model.config.model_type == "t5"  # unscaled attention: smaller weights keep softmax soft
    with torch.no_grad():
        for name, p in model.named_parameters():
            if t5 and "relative_attention_bias" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
                continue
            if t5 and "layer_norm" not in name:
                p.copy_(0.15 * torch.randn(p.shape, generator=gen))
                continue
            if "layer_norm" in name and name.endswith(".weight") or \
                    "layernorm_embedding.weight" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
        if hasattr(model, "final_logits_bias"):
            model.final_logits_bias.copy_(0.1 * torch.randn(model.final_logits_bias.shape,
                                                            generator=gen))


def untie_t5(folder, gen):
    """A distinct lm_head.weight in the file and the hub's config form (tie_word_embeddings
    false, no scale_decoder_outputs): what transformers 5 reads as t5-v1_1 / flan-t5."""
    path = os.path.join(folder, "model.safetensors")
    sd = load_file(path)
    sd["lm_head.weight"] = 0.15 * torch.randn(sd["shared.weight"].shape, generator=gen)
    save_file(sd, path, metadata={"format": "pt"})
    cpath = os.path.join(folder, "config.json")
    with open(cpath) as f:
        cfg = json.load(f)
    cfg["tie_word_embeddings"] = False
    cfg.pop("scale_decoder_outputs", None)
    with open(cpath, "w") as f:
        json.dump(cfg, f, indent=2)


def reference(folder):
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, dtype=torch.float64,
                                                  attn_implementation="eager")
    model.eval()  # dropout off
    return model


def batch(cfg, gen):
    pad = cfg.pad_token_id
    ids = torch.randint(3, cfg.vocab_size, (B, S), generator=gen)
    mask = torch.zeros(B, S, dtype=torch.long)
    for b, n in enumerate(SRC_LENGTHS):
        mask[b, :n] = 1
        ids[b, n:] = pad
    ids[0, 3] = pad  # a pad-id token among real ones: its embedding row gets no gradient
    labels = torch.randint(3, cfg.vocab_size, (B, T), generator=gen)
    for b, n in enumerate(TGT_LENGTHS):
        labels[b, n - 1] = cfg.eos_token_id
        labels[b, n:] = -100
    return ids, mask, labels


def write_case(out, name):
    cls, fields = CASES[name]
    folder = os.path.join(out, name)
    shutil.rmtree(folder, ignore_errors=True)
    gen = torch.Generator().manual_seed(sum(map(ord, name)) + SEED_SHIFT.get(name, 0))
    cfg = cls(**fields)
    model = AutoModelForSeq2SeqLM.from_config(cfg, attn_implementation="eager")
    randomize(model, gen)
    model.save_pretrained(folder)
    if name == "t5_gated_untied":
        untie_t5(folder, gen)

    ref = reference(folder)
    if name == "t5_gated_untied":
        assert ref.lm_head.weight is not ref.shared.weight, "transformers kept lm_head tied"
    ids, mask, labels = batch(ref.config, gen)
    res = ref(input_ids=ids, attention_mask=mask, labels=labels)
    res.loss.backward()
    tensors = {"input_ids": ids, "attention_mask": mask, "labels": labels,
               "logits": res.logits.float().detach(), "loss": res.loss.float().detach()}
    for pname, p in ref.named_parameters():
        tensors["grad." + pname] = p.grad.float()
    with torch.no_grad():
        gen_ids = ref.generate(input_ids=ids, attention_mask=mask, num_beams=1, do_sample=False,
                               max_new_tokens=NEW, min_length=0, no_repeat_ngram_size=0,
                               encoder_no_repeat_ngram_size=0,
                               forced_bos_token_id=None,
                               forced_eos_token_id=getattr(ref.config, 'forced_eos_token_id', None),
                               eos_token_id=ref.config.eos_token_id,
                               pad_token_id=ref.config.pad_token_id,
                               decoder_start_token_id=ref.config.decoder_start_token_id)
    tensors["generated"] = gen_ids
    # The same with eos_token_id = the token row 0 generated second: row 0 ends early and is
    # padded, the others go on (or, when every row ends, generation stops before NEW tokens).
    eos = int(gen_ids[0, 2])
    with torch.no_grad():
        tensors["generated_eos"] = ref.generate(
            input_ids=ids, attention_mask=mask, num_beams=1, do_sample=False, max_new_tokens=NEW,
            min_length=0, no_repeat_ngram_size=0, encoder_no_repeat_ngram_size=0,
            forced_bos_token_id=None, forced_eos_token_id=getattr(ref.config, 'forced_eos_token_id', None),
            eos_token_id=eos, pad_token_id=ref.config.pad_token_id,
            decoder_start_token_id=ref.config.decoder_start_token_id)
    # Greedy with the n-gram and min-length processors.
    with torch.no_grad():
        tensors["greedy_proc"] = ref.generate(
            input_ids=ids, attention_mask=mask, num_beams=1, do_sample=False, max_new_tokens=NEW,
            min_length=4, no_repeat_ngram_size=2, encoder_no_repeat_ngram_size=2,
            forced_bos_token_id=None, forced_eos_token_id=getattr(ref.config, 'forced_eos_token_id', None),
            eos_token_id=ref.config.eos_token_id, pad_token_id=ref.config.pad_token_id,
            decoder_start_token_id=ref.config.decoder_start_token_id)
    # Beam search, three settings (BEAMS); "beam_<name>" holds generate's output for each.
    meta = {"transformers": transformers.__version__, "torch": torch.__version__,
            "class": type(ref).__name__, "max_new_tokens": str(NEW), "generated_eos": str(eos)}
    for bname, opts in BEAMS.items():
        kw = dict(opts)
        kw["eos_token_id"] = eos if kw.pop("eos") == "early" else ref.config.eos_token_id
        with torch.no_grad():
            tensors["beam_" + bname] = ref.generate(
                input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW,
                forced_bos_token_id=None, forced_eos_token_id=getattr(ref.config, 'forced_eos_token_id', None),
                pad_token_id=ref.config.pad_token_id,
                decoder_start_token_id=ref.config.decoder_start_token_id, **kw)
        meta["beam_" + bname + "_eos"] = str(kw["eos_token_id"])
    save_file({k: v.contiguous() for k, v in tensors.items()},
              os.path.join(folder, "reference.safetensors"), metadata=meta)
    print(f"{name}: loss {res.loss.item():.6f}, generated {gen_ids.tolist()}, "
          f"with eos {eos}: {tensors['generated_eos'].tolist()}, "
          f"greedy_proc {tensors['greedy_proc'].tolist()}, "
          f"beams {[tensors['beam_' + b].tolist() for b in BEAMS]}, "
          f"files {sorted(os.listdir(folder))}")


def check_export(export_root, fixtures):
    """transformers loads each export of ours and gives the fixture's logits."""
    for name in CASES:
        src = os.path.join(export_root, name)
        if not os.path.isdir(src):
            continue
        ref = load_file(os.path.join(fixtures, name, "reference.safetensors"))
        model = reference(src)
        with torch.no_grad():
            logits = model(input_ids=ref["input_ids"], attention_mask=ref["attention_mask"],
                           labels=ref["labels"]).logits.float()
        err = ((logits - ref["logits"]).abs().max() / ref["logits"].abs().max()).item()
        print(f"{name}: transformers on our export, logits rel err {err:.2e}")
        assert err < 1e-5, name


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests",
                                                  "fixtures", "hf_families"))
    ap.add_argument("--check-export")
    ap.add_argument("--cases", default=",".join(CASES),
                    help="comma-separated case names to (re)write (default: all)")
    args = ap.parse_args()
    if args.check_export:
        check_export(args.check_export, args.out)
        return
    torch.manual_seed(0)
    for name in args.cases.split(","):
        write_case(args.out, name)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Write tests/fixtures/hf_families/<case>/: tiny Hugging Face models of the LLaMA and GLM families
as transformers saves them, with transformers' own logits, loss and gradients (test_hf_families).

Each case folder holds what `save_pretrained` wrote (config.json, model.safetensors or shards with
model.safetensors.index.json), the weights rounded to the case's dtype, and reference.safetensors:
  input_ids, targets (I64, (B, T); a few targets -100)   logits (F32, (B, T, V))
  loss (F32, scalar; mean cross entropy of logits against targets, no shift)
  grad.<Hugging Face parameter name> (F32) for every parameter (a tied head's gradient is in
  model.embed_tokens.weight)
The reference runs transformers itself in float64 (eager attention) from the saved weights, so the
C++ test sees its own fp32 rounding (and transformers' fp32 RoPE tables and RMSNorm) alone.

chatglm2 is the glm case rewritten into ChatGLM2's remote-code layout (write_chatglm): transformers
cannot run that code here, so the test compares it against the glm case's reference.

Two cases rewrite config.json into the transformers 4.x form (top-level rope_theta, rope_scaling
with "type", torch_dtype) to cover the legacy fields; transformers 5 still loads them.

The test suite never runs Python: this script only (re)writes the committed fixtures, and checks
an export of ours (written by test_hf_families when DS_HF_EXPORT_DIR is set) against them:

    /tmp/dsvenv/bin/python tools/gen_hf_family_fixture.py [--out tests/fixtures/hf_families]
    DS_HF_EXPORT_DIR=/tmp/hf_export build/tests/test_hf_families
    /tmp/dsvenv/bin/python tools/gen_hf_family_fixture.py --check-export /tmp/hf_export

Needs torch and transformers 5 (tested with torch 2.15, transformers 5.23).
"""
import argparse
import json
import os
import shutil

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file, save_file
from transformers import (AutoModelForCausalLM, Glm4Config, GlmConfig, LlamaConfig, MistralConfig,
                          Qwen2Config, Qwen3Config)

B, T = 2, 8
SMALL = dict(vocab_size=48, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)

# name: (config class, extra config fields, saved dtype, shard size or None, legacy rewrite)
CASES = {
    # GQA, llama3 rope (one frequency in the smoothed band at this size), untied head, bf16.
    "llama3_gqa": (LlamaConfig, dict(head_dim=8, tie_word_embeddings=False, rope_parameters=dict(
        rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
        high_freq_factor=4.0, original_max_position_embeddings=16)), torch.bfloat16, None, False),
    # yarn with the default attention factor, tied head, fp32 in shards.
    "llama_yarn_tied": (LlamaConfig, dict(head_dim=8, tie_word_embeddings=True, rope_parameters=dict(
        rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=16)),
        torch.float32, "20KB", False),
    # Mistral in the 4.x form (top-level rope_theta 1e6 and torch_dtype), fp16.
    "mistral": (MistralConfig, dict(head_dim=8, sliding_window=4096, rope_parameters=dict(
        rope_type="default", rope_theta=1000000.0)), torch.float16, None, True),
    # Qwen2: q/k/v biases, tied head, 4.x rope_scaling {"type": "linear"}, bf16.
    "qwen2_linear": (Qwen2Config, dict(tie_word_embeddings=True, rope_parameters=dict(
        rope_type="linear", rope_theta=10000.0, factor=2.0)), torch.bfloat16, None, True),
    # Qwen3: q/k norms, head_dim 8 != hidden / heads = 4, untied, fp32.
    "qwen3": (Qwen3Config, dict(head_dim=8, tie_word_embeddings=False, rope_parameters=dict(
        rope_type="default", rope_theta=1000000.0)), torch.float32, None, False),
    # (GLM's pad_token_id is None here: with one, torch's Embedding(padding_idx) gives the pad row
    # no gradient, a training detail outside the model's math that we do not copy.)
    # GLM: q/k/v biases, rotary on half of each head (partial_rotary_factor 0.5, GlmConfig's
    # default, left out of the config), pairs (2i, 2i+1), fused gate_up_proj, bf16.
    "glm": (GlmConfig, dict(head_dim=8, rms_norm_eps=1e-5, pad_token_id=None, eos_token_id=1),
            torch.bfloat16, None, False),
    # GLM-4: sandwich norms, no attention biases, a quarter of each head rotating, fp32 in shards.
    "glm4": (Glm4Config, dict(head_dim=16, attention_bias=False, pad_token_id=None, rope_parameters=dict(
        rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25)), torch.float32,
        "20KB", False),
}

# Converted from a case into the remote-code ChatGLM2/3 layout (modeling_chatglm.py's names,
# fused query_key_value and dense_h_to_4h, ChatGLMConfig's fields): the same weights and math,
# so the source case's reference holds (test_hf_families checks logits, loss and gradients).
CHATGLM = {"chatglm2": "glm"}


def randomize(model, gen):
    """Weights well away from transformers' N(0, 0.02) init, so that every path matters."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))


def to_legacy(path):
    """Rewrite a saved config.json into the 4.x form: rope_theta / rope_scaling at the top."""
    with open(path) as f:
        cfg = json.load(f)
    rp = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rp.pop("rope_theta")
    rtype = rp.pop("rope_type")
    cfg["rope_scaling"] = None if rtype == "default" else dict(type=rtype, **rp)
    cfg["torch_dtype"] = cfg.pop("dtype")
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def reference(folder):
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64,
                                                 attn_implementation="eager")
    return model


def write_case(out, name):
    cls, extra, dtype, shard, legacy = CASES[name]
    folder = os.path.join(out, name)
    shutil.rmtree(folder, ignore_errors=True)
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    cfg = cls(**SMALL, **extra)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    randomize(model, gen)
    model = model.to(dtype)
    kw = dict(max_shard_size=shard) if shard else {}
    model.save_pretrained(folder, **kw)
    gc = os.path.join(folder, "generation_config.json")
    if os.path.exists(gc):
        os.remove(gc)
    if legacy:
        to_legacy(os.path.join(folder, "config.json"))

    ref = reference(folder)
    V = ref.config.vocab_size
    ids = torch.randint(0, V, (B, T), generator=gen)
    targets = torch.randint(0, V, (B, T), generator=gen)
    targets[0, 0] = targets[1, 3] = -100
    logits = ref(input_ids=ids).logits
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=-100)
    loss.backward()
    tensors = {"input_ids": ids, "targets": targets, "logits": logits.float().detach(),
               "loss": loss.float().detach()}
    for pname, p in ref.named_parameters():
        tensors["grad." + pname] = p.grad.float()
    meta = {"transformers": transformers.__version__, "torch": torch.__version__,
            "class": type(ref).__name__, "dtype": str(dtype).replace("torch.", "")}
    save_file({k: v.contiguous() for k, v in tensors.items()},
              os.path.join(folder, "reference.safetensors"), metadata=meta)
    files = sorted(os.listdir(folder))
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in files)
    print(f"{name}: {type(ref).__name__} {meta['dtype']}, loss {loss.item():.6f}, "
          f"{size / 1024:.0f} KiB ({', '.join(files)})")


def write_chatglm(out, name, source):
    """The source GLM case rewritten as a ChatGLM2 checkpoint (transformers cannot load it without
    the model's remote code, which is why the source's reference is reused)."""
    src = os.path.join(out, source)
    folder = os.path.join(out, name)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    with open(os.path.join(src, "config.json")) as f:
        g = json.load(f)
    rp = g.get("rope_parameters") or {}
    assert rp.get("partial_rotary_factor", 0.5) == 0.5, "ChatGLM rotates half of each head"
    cfg = {
        "_name_or_path": "THUDM/chatglm2-6b", "model_type": "chatglm",
        "architectures": ["ChatGLMModel"],
        "auto_map": {"AutoConfig": "configuration_chatglm.ChatGLMConfig",
                     "AutoModel": "modeling_chatglm.ChatGLMForConditionalGeneration"},
        "add_bias_linear": False, "add_qkv_bias": g.get("attention_bias", True),
        "apply_query_key_layer_scaling": True, "apply_residual_connection_post_layernorm": False,
        "attention_dropout": 0.0, "attention_softmax_in_fp32": True, "bias_dropout_fusion": True,
        "ffn_hidden_size": g["intermediate_size"], "fp32_residual_connection": False,
        "hidden_dropout": 0.0, "hidden_size": g["hidden_size"], "kv_channels": g["head_dim"],
        "layernorm_epsilon": g["rms_norm_eps"], "multi_query_attention": True,
        "multi_query_group_num": g["num_key_value_heads"],
        "num_attention_heads": g["num_attention_heads"], "num_layers": g["num_hidden_layers"],
        "original_rope": True, "padded_vocab_size": g["vocab_size"], "post_layer_norm": True,
        "rmsnorm": True, "rope_ratio": rp.get("rope_theta", 10000.0) / 10000.0,
        "seq_length": g["max_position_embeddings"], "use_cache": True, "torch_dtype": g["dtype"],
        "transformers_version": "4.30.2", "tie_word_embeddings": False, "eos_token_id": 2,
        "pad_token_id": 0}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    w = load_file(os.path.join(src, "model.safetensors"))
    out_t = {"transformer.embedding.word_embeddings.weight": w["model.embed_tokens.weight"],
             "transformer.encoder.final_layernorm.weight": w["model.norm.weight"],
             "transformer.output_layer.weight": w["lm_head.weight"]}
    # The remote code keeps its rotary frequencies as a buffer; the importer skips it.
    head_dim = g["head_dim"]
    inv = 1.0 / (10000 ** (torch.arange(0, head_dim // 2, 2, dtype=torch.float) / (head_dim // 2)))
    out_t["transformer.rotary_pos_emb.inv_freq"] = inv.to(w["model.norm.weight"].dtype)
    for i in range(g["num_hidden_layers"]):
        a, b = f"model.layers.{i}.", f"transformer.encoder.layers.{i}."
        sa = a + "self_attn."
        out_t[b + "input_layernorm.weight"] = w[a + "input_layernorm.weight"]
        out_t[b + "post_attention_layernorm.weight"] = w[a + "post_attention_layernorm.weight"]
        out_t[b + "self_attention.query_key_value.weight"] = torch.cat(
            [w[sa + "q_proj.weight"], w[sa + "k_proj.weight"], w[sa + "v_proj.weight"]], 0)
        if cfg["add_qkv_bias"]:
            out_t[b + "self_attention.query_key_value.bias"] = torch.cat(
                [w[sa + "q_proj.bias"], w[sa + "k_proj.bias"], w[sa + "v_proj.bias"]], 0)
        out_t[b + "self_attention.dense.weight"] = w[sa + "o_proj.weight"]
        out_t[b + "mlp.dense_h_to_4h.weight"] = w[a + "mlp.gate_up_proj.weight"]
        out_t[b + "mlp.dense_4h_to_h.weight"] = w[a + "mlp.down_proj.weight"]
    save_file({k: v.contiguous() for k, v in out_t.items()},
              os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    print(f"{name}: {len(out_t)} tensors in ChatGLM2's layout from {source} "
          f"(reference: {source}/reference.safetensors)")


def check_export(export_dir, fixtures):
    """Our export of each case must load in transformers as the same class with the same logits."""
    worst = 0.0
    for name in sorted(os.listdir(export_dir)):
        source = CHATGLM.get(name, name)  # a converted case is checked against its source
        ref_file = os.path.join(fixtures, source, "reference.safetensors")
        if not os.path.exists(ref_file):
            continue
        r = load_file(ref_file)
        with open(os.path.join(fixtures, source, "config.json")) as f:
            want_class = json.load(f)["architectures"][0]
        model = reference(os.path.join(export_dir, name))
        got_class = type(model).__name__
        logits = model(input_ids=r["input_ids"]).logits.float()
        err = ((logits - r["logits"]).abs().max() / r["logits"].abs().max()).item()
        worst = max(worst, err)
        status = "ok" if got_class == want_class and err < 1e-6 else "FAIL"
        print(f"{name}: {got_class} (want {want_class}), logits max rel diff {err:.2e} {status}")
        if status != "ok":
            raise SystemExit(1)
    print(f"all exports load in transformers {transformers.__version__}; worst {worst:.2e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    fixtures = os.path.join(here, "..", "tests", "fixtures", "hf_families")
    ap.add_argument("--out", default=fixtures)
    ap.add_argument("--check-export", metavar="DIR",
                    help="check test_hf_families' export (DS_HF_EXPORT_DIR) instead")
    args = ap.parse_args()
    torch.manual_seed(0)
    if args.check_export:
        check_export(args.check_export, args.out)
        return
    os.makedirs(args.out, exist_ok=True)
    for name in CASES:
        write_case(args.out, name)
    for name, source in CHATGLM.items():
        write_chatglm(args.out, name, source)


if __name__ == "__main__":
    main()

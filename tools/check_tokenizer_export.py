#!/usr/bin/env python3
"""Check that tokenizers exported by deepspeed.cpp load in transformers and encode identically.

    DS_TOKENIZER_EXPORT_DIR=/tmp/tok_export build/tests/test_hf_tokenizer \\
        --gtest_filter=HfTokenizer.ExportReloadsIdentically
    /tmp/dsvenv/bin/python tools/check_tokenizer_export.py /tmp/tok_export

For each exported folder, AutoTokenizer.from_pretrained(folder) must give the ids recorded in
tests/fixtures/tokenizers/cases.json (with and without special tokens), the same bos/eos/pad ids,
and the same chat template rendering. Manual check (the C++ suite never runs Python).
"""
import json
import pathlib
import sys

from transformers import AutoTokenizer

ROOT = pathlib.Path(__file__).resolve().parent.parent
CASES = json.loads((ROOT / "tests" / "fixtures" / "tokenizers" / "cases.json").read_text())
FOLDERS = {"gpt2_bpe": "gpt2_bpe", "vocab_merges": "gpt2_bpe/vocab_merges", "llama3_bpe": "llama3_bpe",
           "qwen2_bpe": "qwen2_bpe", "spm": "spm", "gpt2_real": "gpt2_real"}


def main(export_dir):
    failures = 0
    for sub, name in FOLDERS.items():
        folder = pathlib.Path(export_dir) / sub
        if not folder.is_dir():
            print(f"{sub}: not exported, skipped")
            continue
        tok = AutoTokenizer.from_pretrained(str(folder))
        ref = CASES["tokenizers"][name]
        bad = []
        for c in ref["cases"]:
            if tok.encode(c["text"], add_special_tokens=False) != c["ids"]:
                bad.append(c["text"])
            elif "ids_with_special" in c and tok.encode(c["text"]) != c["ids_with_special"]:
                bad.append(c["text"] + " (special)")
        for key, attr in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("pad", "pad_token_id")):
            if key in ref["info"] and ref["info"][key] != getattr(tok, attr):
                bad.append(f"{key}: {getattr(tok, attr)} != {ref['info'][key]}")
        for fmt in CASES["chat"].values():
            if fmt["tokenizer"] == sub and tok.chat_template == fmt["jinja"]:
                for c in fmt["cases"]:
                    text = tok.apply_chat_template(c["messages"], tokenize=False,
                                                   add_generation_prompt=c["add_generation_prompt"])
                    if text != c["text"]:
                        bad.append(f"chat: {text!r}")
        print(f"{sub}: {type(tok).__name__}, {len(ref['cases']) - len(bad)}/{len(ref['cases'])} cases "
              f"identical" + ("" if not bad else f"; differ: {bad}"))
        failures += len(bad)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/tok_export"))

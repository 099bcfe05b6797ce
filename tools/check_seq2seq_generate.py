#!/usr/bin/env python3
"""Checks ds_generate on an encoder-decoder folder against transformers' generate(): the same text
for greedy decoding, beam search with no_repeat_ngram_size, and beam search with min_length and
length_penalty, for a few prompts. A manual check (tests never run Python); the folder is e.g.
the export of scripts/run_seq2seq_demo.sh.

  $VENV/bin/python tools/check_seq2seq_generate.py out/seq2seq_demo/run/hf_model \
      build/tools/ds_generate
"""
import subprocess
import sys

from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

PROMPTS = ["Hello how are you?", "Do you like dogs?", "what's up"]
SETTINGS = [
    {},
    {"num_beams": 4, "no_repeat_ngram_size": 3},
    {"num_beams": 3, "min_length": 5, "length_penalty": 0.5, "max_new_tokens": 8},
]


def main():
    folder, binary = sys.argv[1], sys.argv[2]
    model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    bad = 0
    for prompt in PROMPTS:
        for s in SETTINGS:
            args = [binary, "--model", folder, "--prompt", prompt]
            for k, v in s.items():
                args += [f"--{k}", str(v)]
            ours = subprocess.run(args, capture_output=True, text=True, check=True).stdout
            ours = ours.rstrip("\n")
            kw = {"num_beams": 1, "do_sample": False, **s}
            # GenerationConfig's default max_length 20 counts the decoder start token.
            kw.setdefault("max_new_tokens", (model.generation_config.max_length or 20) - 1)
            out = model.generate(**tok(prompt, return_tensors="pt"), **kw)
            theirs = tok.decode(out[0], skip_special_tokens=True)
            ok = ours == theirs
            bad += not ok
            print("same" if ok else "DIFF", repr(prompt), s, repr(ours), "" if ok else repr(theirs))
    print(f"{len(PROMPTS) * len(SETTINGS) - bad} of {len(PROMPTS) * len(SETTINGS)} the same")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()

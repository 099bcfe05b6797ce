#!/usr/bin/env python3
"""Writes tests/fixtures/seq2seq/truncation_cases.json: what transformers' tokenizer(text,
truncation=True, max_length=L) gives with the RoBERTa/BART-style BPE fixture tokenizer
(tests/fixtures/classification/roberta_bpe: <s> x </s>), which ds_prepare --task seq2seq must
reproduce for sources (tests/test_seq2seq_data.cpp).

  $VENV/bin/python tools/gen_seq2seq_data_fixture.py
"""
import json
import os

from transformers import PreTrainedTokenizerFast

ROOT = os.path.join(os.path.dirname(__file__), "..")
TOK = os.path.join(ROOT, "tests", "fixtures", "classification", "roberta_bpe")
OUT = os.path.join(ROOT, "tests", "fixtures", "seq2seq", "truncation_cases.json")

TEXTS = [
    "Hello there, how are you?",
    "What is your name?",
    "Tell me a very long story about cats and dogs and the weather in the city.",
    "ok",
    "Numbers 12,345.67 and symbols !?",
]


def main():
    tok = PreTrainedTokenizerFast.from_pretrained(TOK)
    cases = []
    for text in TEXTS:
        for max_length in (3, 5, 8, 64):
            ids = tok(text, truncation=True, max_length=max_length)["input_ids"]
            cases.append({"text": text, "max_length": max_length, "ids": ids})
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump({"tokenizer": "tests/fixtures/classification/roberta_bpe", "cases": cases}, f,
                  indent=1)
        f.write("\n")
    print(f"wrote {OUT}: {len(cases)} cases")


if __name__ == "__main__":
    main()

"""Fixture for ds_prepare --task classification's truncation (tests/test_classification.cpp).

Encodes sentence pairs (and single sentences) with Hugging Face `tokenizers` and the committed
WordPiece fixture (tests/fixtures/tokenizers/bert_wordpiece), truncated to max_length with
strategy longest_first, as transformers' tokenizer(a, b, truncation=True, max_length=T) does, and
writes tests/fixtures/classification/truncation_cases.json: {"tokenizer", "cases": [{"a", "b"
(null: single sentence), "max_length", "ids", "type_ids"}]}.

Offline; needs `tokenizers` (any recent version; transformers pulls it in):
    python -m venv /tmp/hf && /tmp/hf/bin/pip install tokenizers
    /tmp/hf/bin/python tools/gen_classification_fixture.py
"""
import json
import pathlib
import random

from tokenizers import Tokenizer

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOK = ROOT / "tests" / "fixtures" / "tokenizers" / "bert_wordpiece" / "tokenizer.json"
OUT = ROOT / "tests" / "fixtures" / "classification" / "truncation_cases.json"

WORDS = ("the cat sat on a mat while dogs ran far away into night , and . "
         "she said : hello world ! 42 tests pass ? maybe").split()


def sentence(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def main():
    rng = random.Random(1234)
    cases = []
    # Lengths chosen to cover: no cut, only the longer cut, both cut with an even and an odd
    # budget, a tie, A longer and B longer, and single sentences.
    shapes = [(3, 3), (2, 20), (20, 2), (10, 10), (11, 10), (10, 11), (30, 5), (5, 30), (1, 1),
              (15, 15), (7, 40), (40, 7)]
    for na, nb in shapes:
        a, b = sentence(rng, na), sentence(rng, nb)
        for max_length in (5, 8, 9, 12, 16, 17, 32, 64):
            cases.append((a, b, max_length))
    for n in (3, 12, 40):
        a = sentence(rng, n)
        for max_length in (4, 9, 16, 64):
            cases.append((a, None, max_length))
    out = []
    for a, b, max_length in cases:
        tok = Tokenizer.from_file(str(TOK))
        tok.enable_truncation(max_length=max_length, strategy="longest_first")
        enc = tok.encode(a, b) if b is not None else tok.encode(a)
        out.append({"a": a, "b": b, "max_length": max_length, "ids": enc.ids,
                    "type_ids": enc.type_ids})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"tokenizer": "tokenizers/bert_wordpiece", "cases": out},
                              separators=(",", ":")) + "\n")
    print(f"wrote {len(out)} cases to {OUT}")


if __name__ == "__main__":
    main()

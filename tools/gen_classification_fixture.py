"""Fixture for ds_prepare --task classification's truncation (tests/test_classification.cpp).

Encodes sentence pairs (and single sentences) with Hugging Face `tokenizers` and the committed
WordPiece fixture (tests/fixtures/tokenizers/bert_wordpiece), truncated to max_length with
strategy longest_first, as transformers' tokenizer(a, b, truncation=True, max_length=T) does, and
writes tests/fixtures/classification/truncation_cases.json: {"tokenizer", "cases": [{"a", "b"
(null: single sentence), "max_length", "ids", "type_ids"}]}.

Also a RoBERTa-style byte-level BPE folder, tests/fixtures/classification/roberta_bpe: the GPT-2
fixture (tests/fixtures/tokenizers/gpt2_bpe) plus the special tokens <s> </s> <pad> and the
post-processor RobertaProcessing (<s> A </s></s> B </s>, type ids 0), with its cases in
roberta_cases.json (same layout).

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
GPT2 = ROOT / "tests" / "fixtures" / "tokenizers" / "gpt2_bpe" / "tokenizer.json"
ROBERTA = ROOT / "tests" / "fixtures" / "classification" / "roberta_bpe"

WORDS = ("the cat sat on a mat while dogs ran far away into night , and . "
         "she said : hello world ! 42 tests pass ? maybe").split()


def sentence(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def cases_for(tok_file, cases):
    out = []
    for a, b, max_length in cases:
        tok = Tokenizer.from_file(str(tok_file))
        tok.enable_truncation(max_length=max_length, strategy="longest_first")
        enc = tok.encode(a, b) if b is not None else tok.encode(a)
        out.append({"a": a, "b": b, "max_length": max_length, "ids": enc.ids,
                    "type_ids": enc.type_ids})
    return out


def roberta_folder():
    from tokenizers import AddedToken, processors

    tok = Tokenizer.from_file(str(GPT2))
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<s>", "</s>", "<pad>")])
    cls, sep = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    tok.post_processor = processors.RobertaProcessing(("</s>", sep), ("<s>", cls))
    ROBERTA.mkdir(parents=True, exist_ok=True)
    tok.save(str(ROBERTA / "tokenizer.json"))
    (ROBERTA / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "cls_token": "<s>", "sep_token": "</s>", "pad_token": "<pad>",
        "unk_token": "<|endoftext|>", "model_max_length": 512}, indent=2) + "\n")
    return ROBERTA / "tokenizer.json"


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
    out = cases_for(TOK, cases)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"tokenizer": "tokenizers/bert_wordpiece", "cases": out},
                              separators=(",", ":")) + "\n")
    rob = cases_for(roberta_folder(), cases)
    (OUT.parent / "roberta_cases.json").write_text(
        json.dumps({"tokenizer": "classification/roberta_bpe", "cases": rob},
                   separators=(",", ":")) + "\n")
    print(f"wrote {len(rob)} RoBERTa cases and {ROBERTA}")
    print(f"wrote {len(out)} cases to {OUT}")


if __name__ == "__main__":
    main()

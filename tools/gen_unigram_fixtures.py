#!/usr/bin/env python3
"""Write the Unigram tokenizer fixtures of tests/fixtures/tokenizers/ and unigram_cases.json.

No model hub is reachable from the project's machines, so two SentencePiece unigram models (1000
pieces) are trained here on the corpus of gen_hf_tokenizer_fixtures.py (State of the Union speeches
plus a multilingual paragraph) and converted by transformers 5 exactly as it converts real models:

  deberta_unigram/  DebertaV2Tokenizer.from_pretrained(<folder with spm.model>).save_pretrained():
                    Sequence[Replace(\\s{2,}|[\\n\\r\\t] -> " "), NFC, Strip(right)] normalizer,
                    Metaspace(always, split) pre-tokenizer, Unigram, [CLS] $A [SEP] /
                    [CLS] $A [SEP] $B [SEP] template with type ids, Metaspace decoder;
  deberta_spm/      the same tokenizer as the hub ships DeBERTa-v3: spm.model and a
                    tokenizer_config.json naming DebertaV2Tokenizer, no tokenizer.json
  t5_unigram/       T5Tokenizer.from_pretrained(<folder with spiece.model>, extra_ids=0): Precompiled
                    normalizer (sentencepiece's nmt_nfkc charsmap), WhitespaceSplit + Metaspace,
                    "$A </s>" template, Metaspace decoder
  unigram_bytefallback/  the DeBERTa vocabulary (it holds the <0xNN> pieces) with byte_fallback, a
                    Sequence[NFKC, Lowercase, Replace("``" -> "\\"")] normalizer, Metaspace(first, no
                    split), and the Llama-style decoder Sequence[Replace(▁ -> " "), ByteFallback,
                    Fuse, Strip(" ", 1, 0)]; written with the `tokenizers` library

and unigram_cases.json: for each folder and each tricky string, what the `tokenizers` library gives
(ids, offsets, decode with and without skipping special tokens) and, for pairs, ids and type ids,
checked against AutoTokenizer; and tests/fixtures/classification/deberta_cases.json: sentence pairs
(and single sentences) as transformers' tokenizer(a, b, truncation=True, max_length=T) encodes them
with the DeBERTa folder, for ds_prepare --task classification (tests/test_classification.cpp).

    $VENV/bin/python tools/gen_unigram_fixtures.py   # transformers 5, sentencepiece, protobuf

The C++ tests (tests/test_unigram_tokenizer.cpp) never run Python.
"""
import json
import pathlib
import sys
import tempfile

import sentencepiece as spm
import tokenizers
import transformers
from tokenizers import Tokenizer
from transformers import AutoTokenizer, DebertaV2Tokenizer, T5Tokenizer

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from gen_hf_tokenizer_fixtures import corpus  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "tokenizers"

CASES = [
    "",
    " ",
    "Hello world",
    "The President of the United States.",
    "  leading and trailing  ",
    "multiple   spaces\tand\ttabs\nand\r\nnewlines",
    "a\n\n\nb",
    "Cafe\u0301 na\u0308ive re\u0301sume\u0301",  # decomposed accents: NFC composes them
    "café naïve",
    "ﬁﬂ ① ｆｕｌｌｗｉｄｔｈ Ⅻ",  # NFKC / nmt_nfkc fold these
    "你好世界，中文",
    "こんにちは 世界",
    "emoji 👋🏽 and 🇫🇷 flags",
    "zero\u200bwidth and \u00a0nbsp",
    "ünïcödé ÀÉÎÕÜ",
    "Ärger ist ÜBER alles",
    "Ḁ Ǆ ǅ İstanbul",
    "numbers 1234567890 and 3.14",
    "[CLS] is text here, [MASK] is special",
    "a[MASK]b",
    "</s> and <pad> in text",
    "<0x41> spelled byte",
    "``quoted'' text",
    "x" * 40,
    "Mr. Speaker, Mr. President, distinguished Members of Congress",
    "\u2581already\u2581has\u2581metaspace",
    "tab\tend\t",
]
PAIRS = [
    ("Hello world", "Goodbye world"),
    ("", "only b"),
    ("The Congress shall", "make no law respecting an establishment of religion"),
    ("  spaced  a ", " b\t"),
    ("你好", "emoji 👋"),
]


def train(prefix, **kw):
    with tempfile.TemporaryDirectory() as tmp:
        text = pathlib.Path(tmp) / "corpus.txt"
        text.write_text("\n".join(line for doc in corpus() for line in doc.split(". ")))
        spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(pathlib.Path(tmp) / "m"),
                                       model_type="unigram", vocab_size=1000,
                                       character_coverage=0.9995, num_threads=1, minloglevel=2, **kw)
        return (pathlib.Path(tmp) / "m.model").read_bytes()


def make_deberta(folder):
    model = train("deb", byte_fallback=True, unk_id=1, bos_id=2, eos_id=3, pad_id=0,
                  pad_piece="[PAD]", unk_piece="[UNK]", bos_piece="[CLS]", eos_piece="[SEP]",
                  user_defined_symbols=["[MASK]"], normalization_rule_name="identity",
                  split_digits=True)
    with tempfile.TemporaryDirectory() as tmp:
        (pathlib.Path(tmp) / "spm.model").write_bytes(model)
        tok = DebertaV2Tokenizer.from_pretrained(tmp)
        save(tok, folder)
    # The folder as the hub ships DeBERTa-v3 (spm.model, no tokenizer.json): load_tokenizer builds
    # the same pipeline from it.
    spm_folder = folder.parent / "deberta_spm"
    spm_folder.mkdir(parents=True, exist_ok=True)
    (spm_folder / "spm.model").write_bytes(model)
    (spm_folder / "tokenizer_config.json").write_text(json.dumps(
        {"do_lower_case": False, "vocab_type": "spm", "tokenizer_class": "DebertaV2Tokenizer"},
        indent=2) + "\n")


def make_t5(folder):
    model = train("t5", unk_id=2, bos_id=-1, eos_id=1, pad_id=0)
    with tempfile.TemporaryDirectory() as tmp:
        (pathlib.Path(tmp) / "spiece.model").write_bytes(model)
        tok = T5Tokenizer.from_pretrained(tmp, extra_ids=0)
        save(tok, folder)


def make_bytefallback(folder, deberta):
    j = json.loads((deberta / "tokenizer.json").read_text())
    j["model"]["byte_fallback"] = True
    j["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "NFKC"}, {"type": "Lowercase"},
        {"type": "Replace", "pattern": {"String": "``"}, "content": "\""}]}
    j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                          "split": False}
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    tok = Tokenizer.from_str(json.dumps(j))  # validates the file
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(tok.to_str() + "\n")
    # transformers rebuilds DebertaV2Tokenizer's own pipeline; the generic class keeps this one.
    cfg = json.loads((deberta / "tokenizer_config.json").read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def save(tok, folder):
    with tempfile.TemporaryDirectory() as tmp:
        tok.save_pretrained(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        # One line: the files stay small and diffs of regenerated fixtures stay readable enough.
        j = json.loads((pathlib.Path(tmp) / "tokenizer.json").read_text())
        (folder / "tokenizer.json").write_text(json.dumps(j, ensure_ascii=False) + "\n")
        cfg = json.loads((pathlib.Path(tmp) / "tokenizer_config.json").read_text())
        for key in ("is_local", "local_files_only"):
            cfg.pop(key, None)
        (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def byte_offsets(text, offsets):
    """`tokenizers` reports character offsets to Python; the C++ TokenSpan holds byte offsets."""
    at = [len(text[:i].encode("utf-8")) for i in range(len(text) + 1)]
    return [[at[b], at[e]] for b, e in offsets]


def cases(folder):
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    hf = AutoTokenizer.from_pretrained(str(folder))
    singles = []
    for text in CASES:
        e = tok.encode(text, add_special_tokens=False)
        with_special = tok.encode(text, add_special_tokens=True).ids
        assert hf.encode(text, add_special_tokens=True) == with_special, (folder, text)
        singles.append({"text": text, "ids": e.ids, "offsets": byte_offsets(text, e.offsets),
                        "ids_with_special": with_special,
                        "decoded": tok.decode(with_special, skip_special_tokens=False),
                        "decoded_skip": tok.decode(with_special, skip_special_tokens=True),
                        "normalized": tok.normalizer.normalize_str(text) if tok.normalizer else text})
    pairs = []
    for a, b in PAIRS:
        e = tok.encode(a, b, add_special_tokens=True)
        h = hf(a, b)
        assert h["input_ids"] == e.ids, (folder, a, b)
        if "token_type_ids" in h:
            assert h["token_type_ids"] == e.type_ids, (folder, a, b)
        plain = tok.encode(a, b, add_special_tokens=False)
        pairs.append({"a": a, "b": b, "ids": e.ids, "type_ids": e.type_ids, "ids_plain": plain.ids,
                      "type_ids_plain": plain.type_ids})
    return {"vocab_size": tok.get_vocab_size(), "singles": singles, "pairs": pairs}


# Sentence pairs for ds_prepare --task classification on the DeBERTa folder (--seq_len
# CLASSIFY_SEQ_LEN, HF longest_first truncation), and for its truncation at several lengths.
CLASSIFY_SEQ_LEN = 24
CLASSIFY_PAIRS = [
    ("The Congress shall make no law", "respecting an establishment of religion"),
    ("Mr. Speaker, Mr. President, distinguished Members of Congress, honored guests",
     "and fellow citizens: tonight we gather"),
    ("  multiple   spaces\tand tabs ", "Café naïve ünïcödé"),
    ("你好世界", "emoji 👋🏽"),
    ("short", "a much longer second sentence that will be cut by longest first truncation"),
    ("a much longer first sentence that will be cut by longest first truncation too", "short"),
]


def classification_cases(folder):
    """transformers' tokenizer(a, b, truncation=True, max_length=T) for the DeBERTa folder."""
    hf = AutoTokenizer.from_pretrained(str(folder))
    out = []
    for a, b in CLASSIFY_PAIRS + [(a, None) for a, _ in CLASSIFY_PAIRS[:3]]:
        for max_length in (8, 13, CLASSIFY_SEQ_LEN, 64):
            e = hf(a, b, truncation=True, max_length=max_length) if b is not None else \
                hf(a, truncation=True, max_length=max_length)
            out.append({"a": a, "b": b, "max_length": max_length, "ids": e["input_ids"],
                        "type_ids": e["token_type_ids"], "label": len(out) % 2})
    return out


def main():
    deberta, t5, bf = OUT / "deberta_unigram", OUT / "t5_unigram", OUT / "unigram_bytefallback"
    make_deberta(deberta)
    make_t5(t5)
    make_bytefallback(bf, deberta)
    out = {"tokenizers": tokenizers.__version__, "transformers": transformers.__version__}
    for folder in (deberta, t5, bf):
        out[folder.name] = cases(folder)
    (OUT / "unigram_cases.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    cls = {"tokenizer": "tokenizers/deberta_unigram", "seq_len": CLASSIFY_SEQ_LEN,
           "cases": classification_cases(deberta)}
    (ROOT / "tests" / "fixtures" / "classification" / "deberta_cases.json").write_text(
        json.dumps(cls, ensure_ascii=False, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()

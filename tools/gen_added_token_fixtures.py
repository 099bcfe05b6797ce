#!/usr/bin/env python3
"""Write tests/fixtures/tokenizers/added_token_cases.json: added tokens with lstrip, rstrip,
single_word and normalized, as the `tokenizers` library matches them.

Each case takes a fixture folder's tokenizer.json (written by gen_hf_tokenizer_fixtures.py and
gen_unigram_fixtures.py), applies a JSON patch (RFC 6902 "add"/"replace"; the C++ test applies the
same patch with nlohmann::json::patch) that adds tokens with those flags, and records for a few
texts the ids (without and with the post-processor's special tokens) and the offsets (in bytes)
`tokenizers` gives:

  bpe_blenderbot  byte-level BPE as BlenderBot's tokenizer.json: ByteLevel with add_prefix_space,
                  "$A </s>" template, <mask> with lstrip=true (normalized=true)
  bpe_flags       byte-level BPE without prefix space: lstrip (normalized=false), rstrip, both,
                  single_word tokens
  bpe_nfc         Qwen2-style BPE with an NFC normalizer: a normalized=true token matches the
                  decomposed spelling, a normalized=false one only its own bytes
  wordpiece_lower BERT uncased (BertNormalizer lowercases): normalized=true "Hello" matches "HELLO",
                  normalized=false "World" only "World"; single_word; lstrip/rstrip
  unigram_t5      T5 (Precompiled normalizer, WhitespaceSplit + Metaspace): lstrip, rstrip,
                  single_word, a normalized token met through NFKC (fullwidth letters)
  unigram_lower   NFKC + Lowercase normalizer, Metaspace(first, no split): normalized true/false
  unigram_deberta DeBERTa-v2 pipeline with [MASK] lstrip=true (as DeBERTa-v3's tokenizer.json)

It also checks the word-character class single_word uses against every code point (the regex
crate's \\w; src/data/added_tokens.cpp hard-codes the result) and prints what differs from
"L, M, Nl, Nd, Pc, ZWNJ/ZWJ".

    $VENV/bin/python tools/gen_added_token_fixtures.py   # needs only `tokenizers`

The C++ tests (tests/test_hf_tokenizer.cpp, test_wordpiece_tokenizer.cpp,
test_unigram_tokenizer.cpp) never run Python.
"""
import copy
import json
import pathlib
import unicodedata

import tokenizers
from tokenizers import Tokenizer

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "tokenizers"


def tok(id_, content, special=False, normalized=None, lstrip=False, rstrip=False, single_word=False):
    return {"id": id_, "content": content, "single_word": single_word, "lstrip": lstrip,
            "rstrip": rstrip, "normalized": (not special) if normalized is None else normalized,
            "special": special}


def add(token):
    return {"op": "add", "path": "/added_tokens/-", "value": token}


def replace(path, value):
    return {"op": "replace", "path": path, "value": value}


def apply_patch(j, patch):
    """The subset of RFC 6902 the cases use: add (objects, arrays, "-") and replace."""
    j = copy.deepcopy(j)
    for op in patch:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = j
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        last = parts[-1]
        if isinstance(parent, list):
            if last == "-":
                assert op["op"] == "add"
                parent.append(op["value"])
            elif op["op"] == "add":
                parent.insert(int(last), op["value"])
            else:
                parent[int(last)] = op["value"]
        else:
            assert op["op"] == "add" or last in parent, op
            parent[last] = op["value"]
    return j


BLENDERBOT_TEMPLATE = {
    "type": "TemplateProcessing",
    "single": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}}],
    "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}},
             {"SpecialToken": {"id": "</s>", "type_id": 1}}],
    "special_tokens": {"</s>": {"id": "</s>", "ids": [700], "tokens": ["</s>"]}},
}

CASES = [
    {
        "name": "bpe_blenderbot",
        "base": "gpt2_bpe",
        "patch": [
            replace("/pre_tokenizer/add_prefix_space", True),
            replace("/post_processor", BLENDERBOT_TEMPLATE),
            add(tok(700, "</s>", special=True)),
            add(tok(701, "<mask>", special=True, normalized=True, lstrip=True)),
        ],
        "texts": ["Hello <mask> world", "Hello<mask>", "  <mask>", "<mask>", "Hello <mask>",
                  "a <mask><mask> b", "a\t \n<mask>!", "say </s> <mask> </s>",
                  "x\u3000<mask>\u2000y", "<mask> <mask>  <mask>"],
    },
    {
        "name": "bpe_flags",
        "base": "gpt2_bpe",
        "patch": [
            add(tok(700, "<mask>", special=True, lstrip=True)),
            add(tok(701, "[R]", special=True, rstrip=True)),
            add(tok(702, "<both>", special=True, lstrip=True, rstrip=True)),
            add(tok(703, "dog", special=False, normalized=False, single_word=True)),
            add(tok(704, "<w>", special=True, single_word=True)),
        ],
        "texts": ["Hello <mask> world", "Hello<mask>", "  <mask>", "[R]  x", "a [R]   <mask> b",
                  "a  <both>  b", "<both><both>", "hot dog", "hotdog", "dogs", "dog.", "a dog_",
                  "dog1 dog", "x<w>y", "x <w> y", "_<w>", "1<w>", "-<w>-", "\u00e9<w>",
                  "\u00b2<w>", "\u24b6<w>", "a\u0301<w>", "<w>\u200d", "<w><w>", "hotdog dog"],
    },
    {
        "name": "bpe_nfc",
        "base": "qwen2_bpe",
        "patch": [
            add(tok(800, "caf\u00e9", special=False, normalized=True)),
            add(tok(801, "Cafe\u0301", special=False, normalized=False)),
        ],
        "texts": ["caf\u00e9", "cafe\u0301 au lait", "Cafe\u0301", "Caf\u00e9", "a caf\u00e9cafe\u0301"],
    },
    {
        "name": "wordpiece_lower",
        "base": "bert_wordpiece",
        "patch": [
            add(tok(400, "Hello", special=False, normalized=True)),
            add(tok(401, "World", special=False, normalized=False)),
            add(tok(402, "Cat", special=False, normalized=True, single_word=True)),
            add(tok(403, "<x>", special=True, lstrip=True, rstrip=True)),
            replace("/added_tokens/4/lstrip", True),
        ],
        "texts": ["Hello world", "HELLO World", "say hello, World!", "worldWorld", "the CAT sat",
                  "concatenate cats", "cat.", "  <x>  y", "a [MASK] b", "a[MASK]b", "HeLLo[MASK]World",
                  "h\u00e9llo Hello"],
    },
    {
        "name": "unigram_t5",
        "base": "t5_unigram",
        "patch": [
            add(tok(1000, "<mask>", special=True, lstrip=True)),
            add(tok(1001, "<sep>", special=True, rstrip=True)),
            add(tok(1002, "Foo", special=False, normalized=True)),
            add(tok(1003, "bar", special=False, normalized=False, single_word=True)),
        ],
        "texts": ["Hello <mask> world", "Hello<mask>", "  <mask>", "a<sep>   b", "foo Foo FOO",
                  "\uff26\uff4f\uff4f the", "bar barn crowbar bar.", "<mask><sep> x", "The <mask>."],
    },
    {
        "name": "unigram_lower",
        "base": "unigram_bytefallback",
        "patch": [
            add(tok(1000, "Hello", special=False, normalized=True)),
            add(tok(1001, "World", special=False, normalized=False)),
        ],
        "texts": ["Hello world", "HELLO World", "say hello, World!", "worldWorld", "\uff28ello"],
    },
    {
        "name": "unigram_deberta",
        "base": "deberta_unigram",
        "patch": [replace("/added_tokens/4/lstrip", True)],
        "texts": ["The [MASK] of the", "The[MASK]", "  [MASK]  x", "a\n\n[MASK]"],
    },
]


def check_word_chars():
    """single_word's word class, per code point, against the regex crate's \\w as tokenizers runs it."""
    j = json.loads((FIX / "gpt2_bpe" / "tokenizer.json").read_text())
    j["added_tokens"].append(tok(700, "<w>", special=True, single_word=True))
    t = Tokenizer.from_str(json.dumps(j))
    cps = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000]
    word = set()
    for k in range(0, len(cps), 50000):
        chunk = cps[k:k + 50000]
        for c, e in zip(chunk, t.encode_batch([chr(c) + "<w>" for c in chunk])):
            if 700 not in e.ids:
                word.add(c)

    def simple(c):
        cat = unicodedata.category(chr(c))
        return cat[0] in "LM" or cat in ("Nl", "Nd", "Pc") or c in (0x200C, 0x200D)

    extra = sorted(c for c in word if not simple(c) and unicodedata.category(chr(c)) != "Cn")
    missing = sorted(c for c in cps if simple(c) and c not in word)
    runs = []
    for c in extra:
        if runs and runs[-1][1] == c - 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    print("word characters besides L, M, Nl, Nd, Pc, ZWNJ/ZWJ (assigned in Python's Unicode "
          f"{unicodedata.unidata_version}):", ", ".join(f"U+{a:04X}..U+{b:04X}" for a, b in runs))
    print("L, M, Nl, Nd, Pc characters that are not word characters:", len(missing))


def main():
    out = {"tokenizers_version": tokenizers.__version__, "cases": []}
    for case in CASES:
        base = json.loads((FIX / case["base"] / "tokenizer.json").read_text())
        t = Tokenizer.from_str(json.dumps(apply_patch(base, case["patch"])))
        texts = []
        for text in case["texts"]:
            e = t.encode(text, add_special_tokens=False)
            texts.append({
                "text": text,
                "ids": e.ids,
                # `tokenizers`' Python offsets count characters; ours count UTF-8 bytes.
                "offsets": [[len(text[:a].encode()), len(text[:b].encode())] for a, b in e.offsets],
                "ids_with_special": t.encode(text, add_special_tokens=True).ids,
            })
        out["cases"].append({"name": case["name"], "base": case["base"], "patch": case["patch"],
                             "texts": texts})
    path = FIX / "added_token_cases.json"
    path.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n")
    print("wrote", path)
    check_word_chars()


if __name__ == "__main__":
    main()

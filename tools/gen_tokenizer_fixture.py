#!/usr/bin/env python3
"""Write tests/fixtures/data/tokenizer_cases.json: GPT-2 encodings made by a reference encoder.

The reference is OpenAI's original encoder.py algorithm (gpt-2/src/encoder.py), reproduced below
with the Python `regex` module, over the encoder.json / vocab.bpe that scripts/fetch_data.sh
extracts. The fixture holds, for each case, the text, its pre-tokenizer words and its ids; plus a
summary (token count and a hash of the ids) of the whole SOTU corpus, each speech encoded alone.

    pip install regex
    scripts/fetch_data.sh
    python3 tools/gen_tokenizer_fixture.py [--cache .cache/data] > tests/fixtures/data/tokenizer_cases.json
"""
import argparse
import json
import os
import random
import sys
from functools import lru_cache

import regex

PAT = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


@lru_cache()
def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(2**8):
        if b not in bs:
            bs.append(b)
            cs.append(2**8 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def get_pairs(word):
    return set(zip(word, word[1:]))


class Encoder:
    """encoder.py's Encoder, unchanged in substance."""

    def __init__(self, encoder, bpe_merges):
        self.encoder = encoder
        self.byte_encoder = bytes_to_unicode()
        self.bpe_ranks = dict(zip(bpe_merges, range(len(bpe_merges))))
        self.cache = {}

    def bpe(self, token):
        if token in self.cache:
            return self.cache[token]
        word = tuple(token)
        pairs = get_pairs(word)
        if not pairs:
            return token
        while True:
            bigram = min(pairs, key=lambda pair: self.bpe_ranks.get(pair, float("inf")))
            if bigram not in self.bpe_ranks:
                break
            first, second = bigram
            new_word = []
            i = 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                    new_word.extend(word[i:j])
                    i = j
                except ValueError:
                    new_word.extend(word[i:])
                    break
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    new_word.append(first + second)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            word = tuple(new_word)
            if len(word) == 1:
                break
            pairs = get_pairs(word)
        word = " ".join(word)
        self.cache[token] = word
        return word

    def encode(self, text):
        ids = []
        for token in regex.findall(PAT, text):
            token = "".join(self.byte_encoder[b] for b in token.encode("utf-8"))
            ids.extend(self.encoder[t] for t in self.bpe(token).split(" "))
        return ids


def load(cache):
    with open(os.path.join(cache, "gpt2", "encoder.json"), encoding="utf-8") as f:
        encoder = json.load(f)
    with open(os.path.join(cache, "gpt2", "vocab.bpe"), encoding="utf-8") as f:
        bpe_data = f.read()
    merges = [tuple(m.split()) for m in bpe_data.split("\n")[1:-1]]
    return Encoder(encoder, merges)


HANDWRITTEN = [
    "Hello world",
    "",
    " ",
    "a",
    "Hello, world! How's it going? I'm fine, we'll see; they've done it, you'd know, we're here.",
    "DON'T SHOUT, it'S fine 'tis 'Twas",
    "rock 'n' roll, ' s, 'x, ''s, !'s",
    "Don’t use curly quotes’ve",
    "multiple   spaces    here     ",
    "   leading spaces",
    "trailing spaces   ",
    "tabs\tand\t\ttabs \t mixed",
    "line one\nline two\n\nparagraph\n\n\n  indented\n",
    "windows\r\nline\r\nendings\r\n",
    "numbers 1234567890 3.14159 -42 1,000,000 2nd 3rd 0x1F 1e-9",
    "Café naïve résumé façade Ångström jalapeño über Straße",
    "decomposed: e\u0301 n\u0303 a\u0308",
    "中文分词测试，日本語のテキスト、한국어 텍스트",
    "Emoji: 😀 👍🏽 👨‍👩‍👧 🇺🇸 ❤️ 🤖🚀",
    "Русский текст, Ελληνικά, עברית, العربية ١٢٣, हिन्दी, ไทย",
    "superscripts x² y³, fractions ½ ¼, roman Ⅻ ⅷ, fullwidth １２３ ＡＢＣ",
    "no\u00a0break\u00a0space and ideographic\u3000space and thin\u2009space",
    "line\u2028separator\u2029para \u0085next",
    "<|endoftext|>",
    "text<|endoftext|>more text",
    "symbols: © ® ™ € £ ¥ § ¶ • … — – « » ‹ › “ ” ‘ ’",
    "code: def f(x): return x**2 + 1  # comment\n    if (a && b) { c = d[i]; }",
    "URL https://example.com/path?query=1&b=two#frag and email a.b@c.org",
    "math 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛 ∀x∈ℝ: x²≥0",
    "!!!??? ... ,,, ;;; ---- ____ ==== ****",
    "   \n   \n   ",
    "\n",
    "\n\n\nx",
    " \tx",
    "a \u3000b",
    "'s",
    "'",
    "x'",
    "control\x00chars\x01\x1f\x7f here",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
    "The State of the Union is strong. Mr. Speaker, Mr. Vice President, Members of Congress.",
]

POOL = (
    list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
    + list(" " * 8) + list("\n\t\r") + list("'''.,;:!?-_()[]{}\"/\\@#$%^&*+=<>|~`")
    + list("sStTmMdDrevl")  # contraction letters, so 's 're 'll ... occur often
    + ["\u00a0", "\u3000", "\u2009", "\u0085", "\u2028", "\x0b", "\x0c", "\x1c"]
    + list("éñüçÅßøæœ") + ["\u0301", "\u0308", "\u200d", "\ufe0f"]
    + list("中文日本語かなカナ한국어") + list("русскийΕλληνικάעבריתالعربية") + list("हिन्दीไทย")
    + list("²³½¼Ⅻⅷ٣١２３߂፩") + ["😀", "👍", "🏽", "👨", "🇺", "🇸", "🚀"]
    + list("’‘“”…—–«»€©™") + ["𝔘", "𝟙", "\U0001F600", "\U00010140", "\U000E0001", "\U0010FFFD"]
)


def random_cases(rng):
    cases = []
    for _ in range(150):
        n = rng.randint(1, 40)
        cases.append("".join(rng.choice(POOL) for _ in range(n)))
    # Code points from anywhere in Unicode (no surrogates): exercises every range table.
    for _ in range(60):
        n = rng.randint(1, 24)
        chars = []
        for _ in range(n):
            while True:
                cp = rng.randint(0, 0x10FFFF) if rng.random() < 0.5 else rng.randint(0x80, 0x2FFFF)
                if not 0xD800 <= cp <= 0xDFFF:
                    break
            chars.append(chr(cp))
            if rng.random() < 0.3:
                chars.append(" ")
        cases.append("".join(chars))
    return cases


def fnv1a64(ids):
    """FNV-1a over the ids, one 64-bit step per id (tests/test_tokenizer.cpp does the same)."""
    h = 0xCBF29CE484222325
    for i in ids:
        h ^= i
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--cache", default=os.environ.get("DS_CACHE_DIR", os.path.join(repo, ".cache", "data")))
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()

    enc = load(args.cache)
    cases = []
    for text in HANDWRITTEN + random_cases(random.Random(args.seed)):
        cases.append({"text": text, "words": regex.findall(PAT, text), "ids": enc.encode(text)})

    sotu_dir = os.path.join(args.cache, "sotu")
    names = sorted(n for n in os.listdir(sotu_dir) if n.endswith(".txt"))
    all_ids = []
    for name in names:
        with open(os.path.join(sotu_dir, name), encoding="utf-8") as f:
            all_ids.extend(enc.encode(f.read()))
    out = {
        "generator": "tools/gen_tokenizer_fixture.py (encoder.py algorithm, Python regex "
                     f"{regex.__version__}, seed {args.seed})",
        "cases": cases,
        "sotu": {"files": len(names), "tokens": len(all_ids), "fnv1a64": f"{fnv1a64(all_ids):016x}",
                 "first_ids": all_ids[:16]},
    }
    # One case per line: readable diffs when the fixture is regenerated.
    w = sys.stdout.write
    w("{\n")
    for key in ("generator", "sotu"):
        w(f" {json.dumps(key)}: {json.dumps(out[key], ensure_ascii=False)},\n")
    w(' "cases": [\n')
    w(",\n".join("  " + json.dumps(c, ensure_ascii=False) for c in out["cases"]))
    w("\n ]\n}\n")


if __name__ == "__main__":
    main()

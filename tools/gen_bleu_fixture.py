#!/usr/bin/env python3
"""Writes tests/fixtures/bleu/cases.json: sacreBLEU's corpus BLEU (its defaults: tokenize 13a,
smooth exp, no lowercasing, 4-grams) and 13a tokenizations for tricky sentences, which
tests/test_seq2seq_data.cpp checks train::corpus_bleu / tokenize_13a against.

  $VENV/bin/pip install sacrebleu
  $VENV/bin/python tools/gen_bleu_fixture.py
"""
import json
import os

import sacrebleu
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "bleu", "cases.json")

TOKENIZE = [
    "Hello, world!",
    "It costs $3,000.50 (approx.) - or 1,5 euros.",
    "A.B.C. and e.g. 3.14, 2-3 pages; x-ray 12-",
    "&quot;quoted&quot; &amp;lt; tags <b>bold</b> &gt; &amp;",
    "line one-\ntwo\nthree <skipped> four",
    "  spaces\tand\ttabs  \u00a0nbsp\u2009thin\u3000ideo  ",
    "Ünïcödé café, naïve… «quotes» — dash",
    "don't won't y'all 'single' \"double\"",
    "a..b,,c ..., end.",
    "{curly}[square]~tilde^caret_under`back|pipe\\slash/fwd@at?q=1&x=2#h%",
    "",
    "9.99-1.5 -3 --flag 2--3",
]

CORPORA = {
    "identical": (["the cat sat on the mat ."], [["the cat sat on the mat ."]]),
    "punctuation_numbers": (
        ["It costs $3,000.50, i.e. a lot!", "Call 555-1234 now.", "Prices: 1.5 to 2,5 (approx)."],
        [["It costs $3,000.50 - a lot!", "Call 555-1234 today.", "Prices: 1.5 to 2,5."]],
    ),
    "short_hyp_brevity": (
        ["the cat", "hello"],
        [["the cat sat on the mat", "hello there my good friend"]],
    ),
    "short_hyp_nonzero": (
        ["the cat sat on", "hello there my good"],
        [["the cat sat on the mat", "hello there my good friend ."]],
    ),
    "empty_hypothesis": (
        ["", "the quick brown fox jumps"],
        [["a sentence here", "the quick brown fox jumps over"]],
    ),
    "all_empty_hyps": (["", ""], [["some words", "more words"]]),
    "no_4gram_match_smoothing": (
        ["the cat is on a mat today", "one two three"],
        [["the cat sat on the mat", "one two four"]],
    ),
    "unigram_only_match": (["a b c d"], [["d c b a"]]),
    "longer_than_reference": (
        ["the the the the the the the cat on the mat"],
        [["the cat is on the mat"]],
    ),
    "two_references": (
        ["the cat sat on the mat", "it is raining"],
        [["the cat is on the mat", "it rains"], ["a cat sat on the mat", "it is raining today"]],
    ),
    "chitchat_like": (
        ["i'm good , thanks ! how about you ?", "yes , i love dogs .", "what do you do?"],
        [["I'm good, thanks! How are you?", "Yes, I love dogs.", "What do you do for work?"]],
    ),
    "html_entities": (["a &amp; b &lt; c"], [["a & b < c"]]),
    "hyphen_newline": (["state-\nof-the-art model"], [["stateof-the-art model"]]),
    "three_words": (["a b c"], [["a b c"]]),
}


def main():
    tok = Tokenizer13a()
    cases = {
        "sacrebleu_version": sacrebleu.__version__,
        "tokenize_13a": [{"text": t, "tokens": tok(t.rstrip())} for t in TOKENIZE],
        "corpus_bleu": [],
    }
    for name, (hyps, ref_streams) in CORPORA.items():
        s = sacrebleu.corpus_bleu(hyps, ref_streams)
        refs = [list(r) for r in zip(*ref_streams)]  # per hypothesis
        cases["corpus_bleu"].append({
            "name": name,
            "hypotheses": hyps,
            "references": refs,
            "score": s.score,
            "bp": s.bp,
            "sys_len": s.sys_len,
            "ref_len": s.ref_len,
            "counts": list(s.counts),
            "totals": list(s.totals),
            "precisions": list(s.precisions),
        })
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(cases, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {OUT}: {len(cases['corpus_bleu'])} corpora, {len(TOKENIZE)} tokenizations")


if __name__ == "__main__":
    main()

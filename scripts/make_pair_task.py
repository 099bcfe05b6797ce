"""A small sentence-pair (paraphrase-style) task from the demo corpus, in MRPC's TSV layout.

GLUE's MRPC cannot be downloaded here, so this makes a stand-in from the public-domain State of
the Union addresses that scripts/fetch_data.sh unpacks (.cache/data/sotu): deterministic, stdlib
only. Each record pairs a sentence A of a speech with a sentence B:

  label 1 ("paraphrase"): B is A lightly reworded: a few neighbouring words swapped and one word
                          dropped (the same content, another surface form);
  label 0 (not):          B is the sentence that follows A in the same speech (same topic and
                          vocabulary, different content), or, one time in four, a sentence of
                          another speech.

Speeches up to --val_from_year - 1 give train.tsv, later ones dev.tsv (as ds_prepare's SOTU split),
with MRPC's header "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String" and about as many positives as
negatives. Then (docs/data.md, "A sentence-pair task from the demo corpus"):

    bash scripts/fetch_data.sh
    python3 scripts/make_pair_task.py --out .cache/pairs
    ds_prepare --task classification --tokenizer BERT_FOLDER --seq_len 128 --val_files 'dev*' \
        --output .cache/prepared/pairs .cache/pairs/train.tsv .cache/pairs/dev.tsv

BERT_FOLDER: a WordPiece tokenizer folder (a bert-base-uncased download, or one trained on the
corpus with --train_tokenizer DIR, which needs the `tokenizers` package from PyPI).
"""
import argparse
import pathlib
import random
import re

SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def sentences(text):
    out = []
    for s in SENTENCE.split(" ".join(text.split())):
        words = s.split()
        if 8 <= len(words) <= 40:
            out.append(s)
    return out


def reword(s, rng):
    words = s.split()
    for _ in range(max(1, len(words) // 8)):
        i = rng.randrange(len(words) - 1)
        words[i], words[i + 1] = words[i + 1], words[i]
    del words[rng.randrange(len(words))]
    return " ".join(words)


def make(files, n, rng):
    speeches = [sentences(f.read_text(encoding="utf-8", errors="replace")) for f in files]
    speeches = [s for s in speeches if len(s) >= 2]
    rows = []
    for k in range(n):
        si = rng.randrange(len(speeches))
        sp = speeches[si]
        i = rng.randrange(len(sp) - 1)
        a = sp[i]
        if k % 2 == 0:
            b, label = reword(a, rng), 1
        elif k % 8 == 1:
            other = speeches[rng.randrange(len(speeches))]
            b, label = other[rng.randrange(len(other))], 0
        else:
            b, label = sp[i + 1], 0
        rows.append((label, f"{si}.{i}", f"{si}.{i}b", a, b))
    rng.shuffle(rows)
    return rows


def write(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        f.write("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n")
        for r in rows:
            f.write("\t".join(str(x).replace("\t", " ") for x in r) + "\n")


def train_tokenizer(files, out, vocab_size):
    from tokenizers import BertWordPieceTokenizer  # PyPI: tokenizers

    tok = BertWordPieceTokenizer(lowercase=True)
    tok.train([str(f) for f in files], vocab_size=vocab_size)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        '{"tokenizer_class": "BertTokenizerFast", "unk_token": "[UNK]", "pad_token": "[PAD]", '
        '"cls_token": "[CLS]", "sep_token": "[SEP]", "mask_token": "[MASK]", '
        '"model_max_length": 512, "do_lower_case": true}\n')


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sotu", default=".cache/data/sotu", help="folder of <year>_*.txt speeches")
    ap.add_argument("--out", default=".cache/pairs", help="writes train.tsv and dev.tsv here")
    ap.add_argument("--val_from_year", type=int, default=2001)
    ap.add_argument("--train", type=int, default=4000, help="train records")
    ap.add_argument("--dev", type=int, default=800, help="dev records")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--train_tokenizer", help="also train a WordPiece tokenizer into this folder")
    ap.add_argument("--vocab_size", type=int, default=8000)
    a = ap.parse_args()
    files = sorted(pathlib.Path(a.sotu).glob("*.txt"))
    if not files:
        raise SystemExit(f"no .txt files in {a.sotu}: run bash scripts/fetch_data.sh first")
    train = [f for f in files if int(f.name[:4]) < a.val_from_year]
    dev = [f for f in files if int(f.name[:4]) >= a.val_from_year]
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(a.seed)
    write(out / "train.tsv", make(train, a.train, rng))
    write(out / "dev.tsv", make(dev, a.dev, rng))
    print(f"wrote {out / 'train.tsv'} ({a.train} pairs, speeches before {a.val_from_year}) and "
          f"{out / 'dev.tsv'} ({a.dev} pairs)")
    if a.train_tokenizer:
        train_tokenizer(train, pathlib.Path(a.train_tokenizer), a.vocab_size)
        print(f"wrote a WordPiece tokenizer ({a.vocab_size} ids) to {a.train_tokenizer}")


if __name__ == "__main__":
    main()

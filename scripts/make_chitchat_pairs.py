#!/usr/bin/env python3
"""Source/target JSONL for ds_prepare --task seq2seq from the Chit-Chat Challenge corpus (BYU PCC
lab) that the PyPI package chitchat-dataset ships (MIT licence; 7,168 conversations,
chitchat_dataset/dataset.json): each turn (a speaker's consecutive messages joined by spaces) is
a source, the other speaker's next turn its target. Short pairs only (--max_words), so that a tiny
model learns something in minutes. The last --val_conversations conversations (in the file's
order) go to val.jsonl, the others to train.jsonl.

  $VENV/bin/pip install chitchat-dataset
  python scripts/make_chitchat_pairs.py --output .cache/chitchat
  # or, without installing: --dataset path/to/chitchat_dataset/dataset.json

With --train_tokenizer DIR it also trains a BART-style byte-level BPE (<s> x </s>, <pad>, the
`tokenizers` package from PyPI) of --vocab_size ids on the training turns: far smaller than
GPT-2's 50,257, so that a tiny model's output layer is cheap and learns in minutes.
"""
import argparse
import json
import os


def dataset_path(given):
    if given:
        return given
    try:
        import chitchat_dataset  # noqa: F401
    except ImportError as e:
        raise SystemExit("make_chitchat_pairs: pip install chitchat-dataset (MIT), or give "
                         "--dataset path/to/dataset.json") from e
    return os.path.join(os.path.dirname(chitchat_dataset.__file__), "dataset.json")


def turns(conversation):
    out = []
    for messages in conversation["messages"]:
        text = " ".join(" ".join(m["text"].split()) for m in messages).strip()
        if text:
            out.append(text)
    return out


def train_tokenizer(texts, out, vocab_size):
    from tokenizers import ByteLevelBPETokenizer, processors  # PyPI: tokenizers

    tok = ByteLevelBPETokenizer(add_prefix_space=True)
    tok.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=2,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>"])
    tok.post_processor = processors.RobertaProcessing(
        ("</s>", tok.token_to_id("</s>")), ("<s>", tok.token_to_id("<s>")),
        trim_offsets=True, add_prefix_space=True)
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
                   "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>",
                   "cls_token": "<s>", "sep_token": "</s>", "model_max_length": 1024}, f, indent=2)
    print(f"make_chitchat_pairs: trained a {tok.get_vocab_size()}-id byte-level BPE -> {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="", help="dataset.json (default: the installed package's)")
    ap.add_argument("--output", required=True, help="folder for train.jsonl and val.jsonl")
    ap.add_argument("--max_words", type=int, default=12, help="longest source / target kept")
    ap.add_argument("--val_conversations", type=int, default=200)
    ap.add_argument("--max_pairs", type=int, default=0, help="training pairs at most (0: all)")
    ap.add_argument("--train_tokenizer", default="", help="folder for a BPE trained on the pairs")
    ap.add_argument("--vocab_size", type=int, default=4000)
    args = ap.parse_args()

    with open(dataset_path(args.dataset), encoding="utf-8") as f:
        data = json.load(f)
    conversations = list(data.values())
    split = len(conversations) - args.val_conversations
    os.makedirs(args.output, exist_ok=True)
    counts = {"train": 0, "val": 0}
    train_texts = []
    with open(os.path.join(args.output, "train.jsonl"), "w", encoding="utf-8") as tr, \
            open(os.path.join(args.output, "val.jsonl"), "w", encoding="utf-8") as va:
        for i, conv in enumerate(conversations):
            name = "train" if i < split else "val"
            t = turns(conv)
            for a, b in zip(t, t[1:]):
                if len(a.split()) > args.max_words or len(b.split()) > args.max_words:
                    continue
                if name == "train" and args.max_pairs and counts["train"] >= args.max_pairs:
                    continue
                (tr if name == "train" else va).write(
                    json.dumps({"source": a, "target": b}, ensure_ascii=False) + "\n")
                counts[name] += 1
                if name == "train":
                    train_texts += [a, b]
    print(f"make_chitchat_pairs: {len(conversations)} conversations -> {counts['train']} train, "
          f"{counts['val']} val pairs (<= {args.max_words} words) in {args.output}")
    if args.train_tokenizer:
        train_tokenizer(train_texts, args.train_tokenizer, args.vocab_size)


if __name__ == "__main__":
    main()

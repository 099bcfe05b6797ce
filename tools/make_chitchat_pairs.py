#!/usr/bin/env python3
"""Source/target JSONL for ds_prepare --task seq2seq from the Chit-Chat Challenge corpus (BYU PCC
lab) that the PyPI package chitchat-dataset ships (MIT licence; 7,168 conversations,
chitchat_dataset/dataset.json): each turn (a speaker's consecutive messages joined by spaces) is
a source, the other speaker's next turn its target. Short pairs only (--max_words), so that a tiny
model learns something in minutes. The last --val_conversations conversations (in the file's
order) go to val.jsonl, the others to train.jsonl.

  /work/venv-hf/bin/pip install chitchat-dataset
  python tools/make_chitchat_pairs.py --output .cache/chitchat
  # or, without installing: --dataset path/to/chitchat_dataset/dataset.json
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="", help="dataset.json (default: the installed package's)")
    ap.add_argument("--output", required=True, help="folder for train.jsonl and val.jsonl")
    ap.add_argument("--max_words", type=int, default=12, help="longest source / target kept")
    ap.add_argument("--val_conversations", type=int, default=200)
    ap.add_argument("--max_pairs", type=int, default=0, help="training pairs at most (0: all)")
    args = ap.parse_args()

    with open(dataset_path(args.dataset), encoding="utf-8") as f:
        data = json.load(f)
    conversations = list(data.values())
    split = len(conversations) - args.val_conversations
    os.makedirs(args.output, exist_ok=True)
    counts = {"train": 0, "val": 0}
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
    print(f"make_chitchat_pairs: {len(conversations)} conversations -> {counts['train']} train, "
          f"{counts['val']} val pairs (<= {args.max_words} words) in {args.output}")


if __name__ == "__main__":
    main()

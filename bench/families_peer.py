"""PyTorch / transformers / DeepSpeed peers for bench/run_families.sh (the encoder and seq2seq families).

Subcommands (fp32 unless --dtype bf16, random weights from a fixed seed, dropout as the configs
say):

  save-bert DIR            BertForSequenceClassification, BERT-base shape (12 x 768, 12 heads,
                           vocab 30522, 2 labels, pad id 0) saved as a Hugging Face folder
                           (config.json + model.safetensors) that ds_train --init_from reads.
  train-bert DIR           Training steps of that classifier on the sentence pairs of --tsv,
                           tokenized with --tokenizer (tokenizer.json) and padded to --seq, batches
                           of --batch in file order. --engine torch: AdamW + clip_grad_norm_ (as
                           ds_train's defaults: lr 2e-5, weight decay 0, clip 1.0);
                           --engine deepspeed: deepspeed.initialize with ZeRO stage --stage, the
                           same optimizer settings (one process, gloo; DeepSpeed picks its CPU
                           Adam). Prints one line per step and
                           BENCH families_peer task=bert_train ... step_s=<median after warm-up>
                           peak_rss_mib=<VmHWM>.
  save-bart DIR            BartForConditionalGeneration, BART-base shape (6 + 6 x 768, 12 heads,
                           FFN 3072, vocab 50265).
  train-bart DIR           Training steps (AdamW + clip 1.0) on random source / label ids
                           (--batch x --src, --batch x --tgt; the same ids bench_seq2seq draws are
                           not needed: the work depends on the shapes only).
  --dtype bf16 (train-bert, train-bart): mixed precision as a PyTorch / Hugging Face user runs it
                           on the CPU (Trainer's bf16=True there is autocast): --engine torch:
                           forward and loss under torch.autocast("cpu", dtype=torch.bfloat16),
                           fp32 parameters, gradients and AdamW; --engine deepspeed: the config's
                           "bf16": {"enabled": true} (DeepSpeed's bf16 parameters with fp32 master
                           weights; its CPU support varies: a failure ends the run with the error).
  gen-bart DIR             generate(num_beams=--beams, max_new_tokens=--new_tokens) for --batch
                           rows of source ids read from --ids (written by bench_seq2seq), timed
                           --reps times; writes the output ids to --out (one row a line).

Threads: torch.set_num_threads(--threads) (2 in the benchmark).
"""
import argparse
import os
import resource
import statistics
import sys
import time


def peak_rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bert_config():
    from transformers import BertConfig

    return BertConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=12,
                      num_attention_heads=12, intermediate_size=3072, max_position_embeddings=512,
                      type_vocab_size=2, pad_token_id=0, num_labels=2)


def bart_config():
    from transformers import BartConfig

    return BartConfig(vocab_size=50265, d_model=768, encoder_layers=6, decoder_layers=6,
                      encoder_attention_heads=12, decoder_attention_heads=12,
                      encoder_ffn_dim=3072, decoder_ffn_dim=3072, max_position_embeddings=1024,
                      pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
                      forced_eos_token_id=2, scale_embedding=False)


def save(model_cls, cfg, out):
    import torch

    torch.manual_seed(0)
    model = model_cls(cfg)
    model.save_pretrained(out)
    n = sum(p.numel() for p in model.parameters())
    print(f"saved {model_cls.__name__} ({n / 1e6:.1f}M parameters) to {out}")


def bert_batches(a):
    """The pairs of --tsv (MRPC layout) tokenized as ds_prepare does: [CLS] A [SEP] B [SEP], padded."""
    import torch
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(a.tokenizer, "tokenizer.json"),
                                  pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
                                  unk_token="[UNK]")
    rows = [l.rstrip("\n").split("\t") for l in open(a.tsv, encoding="utf-8")][1:]
    need = a.batch * a.steps
    rows = (rows * (need // len(rows) + 1))[:need]
    enc = tok([r[3] for r in rows], [r[4] for r in rows], padding="max_length", truncation=True,
              max_length=a.seq, return_tensors="pt", return_token_type_ids=True)
    labels = torch.tensor([int(r[0]) for r in rows])
    for s in range(a.steps):
        sl = slice(s * a.batch, (s + 1) * a.batch)
        yield dict(input_ids=enc["input_ids"][sl], attention_mask=enc["attention_mask"][sl],
                   token_type_ids=enc["token_type_ids"][sl], labels=labels[sl])


def bart_batches(a):
    import torch

    g = torch.Generator().manual_seed(1)
    for _ in range(a.steps):
        src = torch.randint(3, 50265, (a.batch, a.src), generator=g)
        src[:, -1] = 2
        tgt = torch.randint(3, 50265, (a.batch, a.tgt), generator=g)
        tgt[:, -1] = 2
        yield dict(input_ids=src, attention_mask=torch.ones_like(src), labels=tgt)


def train(a, model_cls, batches, task):
    import torch

    torch.set_num_threads(a.threads)
    model = model_cls.from_pretrained(a.dir)
    model.train()
    if a.engine == "deepspeed":
        import deepspeed

        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
        deepspeed.init_distributed(dist_backend="gloo")
        cfg = {"train_micro_batch_size_per_gpu": a.batch, "gradient_accumulation_steps": 1,
               "gradient_clipping": 1.0,
               "optimizer": {"type": "AdamW",
                             "params": {"lr": a.lr, "weight_decay": 0.0, "betas": [0.9, 0.999],
                                        "eps": 1e-8}},
               "zero_optimization": {"stage": a.stage}, "steps_per_print": 1 << 30}
        if a.dtype == "bf16":
            cfg["bf16"] = {"enabled": True}
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                               config=cfg)
        version = f"deepspeed={deepspeed.__version__} torch={torch.__version__}"
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
        version = f"torch={torch.__version__}"
    autocast = a.dtype == "bf16" and a.engine == "torch"
    times = []
    for s, b in enumerate(batches(a)):
        t = time.perf_counter()
        if a.engine == "deepspeed":
            loss = engine(**b).loss
            engine.backward(loss)
            engine.step()
        else:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = model(**b).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t)
        print(f"step {s}: loss {loss.item():.4f} {times[-1]:.3f} s", flush=True)
    timed = times[a.warmup:] or times
    med = statistics.median(timed)
    tokens = a.batch * (a.seq if task == "bert_train" else a.src + a.tgt)
    print(f"BENCH families_peer task={task} engine={a.engine} stage={a.stage if a.engine == 'deepspeed' else '-'}"
          f" dtype={a.dtype}{'_autocast' if autocast else ''} batch={a.batch} step_s={med:.3f} steps={' '.join(f'{x:.3f}' for x in timed)}"
          f" tokens_per_s={tokens / med:.1f} peak_rss_mib={peak_rss_mib():.0f} {version}",
          flush=True)


def gen(a):
    import torch
    from transformers import BartForConditionalGeneration

    torch.set_num_threads(a.threads)
    model = BartForConditionalGeneration.from_pretrained(a.dir).eval()
    rows = [[int(x) for x in l.split()] for l in open(a.ids) if l.strip()][: a.batch]
    ids = torch.tensor(rows)
    times, out = [], None
    with torch.inference_mode():
        for _ in range(a.reps):
            t = time.perf_counter()
            out = model.generate(ids, attention_mask=torch.ones_like(ids), num_beams=a.beams,
                                 max_new_tokens=a.new_tokens, do_sample=False, min_length=0,
                                 length_penalty=1.0, early_stopping=False, no_repeat_ngram_size=0)
            times.append(time.perf_counter() - t)
    with open(a.out, "w") as f:
        for r in out.tolist():
            f.write(" ".join(map(str, r)) + "\n")
    print(f"BENCH families_peer task=bart_beam engine=transformers batch={a.batch} beams={a.beams}"
          f" new_tokens={a.new_tokens} gen_s={statistics.median(times):.3f}"
          f" all={' '.join(f'{x:.3f}' for x in times)} out_len={out.shape[1]}"
          f" torch={torch.__version__}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("cmd", choices=["save-bert", "train-bert", "save-bart", "train-bart", "gen-bart"])
    ap.add_argument("dir")
    ap.add_argument("--engine", choices=["torch", "deepspeed"], default="torch")
    ap.add_argument("--stage", type=int, default=2)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                    help="train-*: bf16 = torch.autocast (engine torch) or DeepSpeed's bf16")
    ap.add_argument("--tsv")
    ap.add_argument("--tokenizer")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--src", type=int, default=128)
    ap.add_argument("--tgt", type=int, default=64)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ids")
    ap.add_argument("--out")
    ap.add_argument("--beams", type=int, default=4)
    ap.add_argument("--new_tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--local_rank", type=int, default=-1)  # the deepspeed launcher's
    a = ap.parse_args()
    from transformers import BartForConditionalGeneration, BertForSequenceClassification

    if a.cmd == "save-bert":
        save(BertForSequenceClassification, bert_config(), a.dir)
    elif a.cmd == "save-bart":
        save(BartForConditionalGeneration, bart_config(), a.dir)
    elif a.cmd == "train-bert":
        train(a, BertForSequenceClassification, bert_batches, "bert_train")
    elif a.cmd == "train-bart":
        train(a, BartForConditionalGeneration, bart_batches, "bart_train")
    else:
        gen(a)


if __name__ == "__main__":
    sys.exit(main())

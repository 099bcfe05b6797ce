"""PyTorch / transformers peer for bench/run_moe.sh (mixture-of-experts training, issue 35).

Subcommands (fp32, random weights from a fixed seed):

  save-tokenizer DIR --text_dir D   A byte-level BPE tokenizer (vocab --vocab, default 32000)
                           trained on the *.txt files of D, saved as DIR/tokenizer.json (what
                           ds_prepare --tokenizer reads).
  save-moe DIR             Qwen3MoeForCausalLM, --hidden x --layers, --experts experts of width
                           --moe_ffn, top --topk (norm_topk_prob true, output_router_logits true:
                           the loss includes the load-balancing term, coefficient 0.001, as in
                           training), heads of 64, --kv_heads KV heads, vocab --vocab, untied
                           lm_head; saved as a Hugging Face folder (config.json +
                           model.safetensors) that ds_train --init_from reads.
  save-dense DIR           Qwen3ForCausalLM of the same shape with one dense SwiGLU MLP of width
                           --topk x --moe_ffn per layer: the MoE model's active parameters.
  train DIR                Training steps of the folder's model (AutoModelForCausalLM): AdamW
                           (lr 1e-4, weight decay 0, as ds_train's config in run_moe.sh) +
                           clip_grad_norm_(1.0), batches of --batch x --seq ids cut in order from
                           the --text_dir files tokenized with --tokenizer (the corpus ds_prepare
                           gave ds_train; the windows are not the same ones, the shapes are).
                           --experts chooses transformers' experts implementation (default: its
                           own choice, grouped_mm on torch >= 2.9). Prints one line per step and
                           BENCH moe_peer ... step_s=<median after warm-up> steps=<all timed>
                           peak_rss_mib=<VmHWM> experts_impl=<what the model used>.

Threads: torch.set_num_threads(--threads) (2 in the benchmark).
"""
import argparse
import glob
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


def common(a):
    return dict(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers,
                num_attention_heads=a.hidden // 64, num_key_value_heads=a.kv_heads, head_dim=64,
                max_position_embeddings=max(1024, a.seq), rms_norm_eps=1e-6, rope_theta=1e6,
                tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=None)


def save(a):
    import torch

    torch.manual_seed(0)
    if a.cmd == "save-moe":
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

        cfg = Qwen3MoeConfig(**common(a), intermediate_size=a.topk * a.moe_ffn,
                             moe_intermediate_size=a.moe_ffn, num_experts=a.experts,
                             num_experts_per_tok=a.topk, norm_topk_prob=True,
                             output_router_logits=True, router_aux_loss_coef=0.001,
                             decoder_sparse_step=1, mlp_only_layers=[])
        model = Qwen3MoeForCausalLM(cfg)
    else:
        from transformers import Qwen3Config, Qwen3ForCausalLM

        cfg = Qwen3Config(**common(a), intermediate_size=a.topk * a.moe_ffn)
        model = Qwen3ForCausalLM(cfg)
    model.save_pretrained(a.dir)
    n = sum(p.numel() for p in model.parameters())
    print(f"saved {type(model).__name__} ({n / 1e6:.2f}M parameters) to {a.dir}")


def save_tokenizer(a):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    files = sorted(glob.glob(os.path.join(a.text_dir, "*.txt")))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=a.vocab, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train(files, trainer)
    os.makedirs(a.dir, exist_ok=True)
    tok.save(os.path.join(a.dir, "tokenizer.json"))
    print(f"saved a byte-level BPE tokenizer (vocab {tok.get_vocab_size()}) to {a.dir}")


def batches(a):
    import torch
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(a.tokenizer, "tokenizer.json"))
    ids, need = [], a.batch * a.seq * a.steps
    for f in sorted(glob.glob(os.path.join(a.text_dir, "*.txt"))):
        ids += tok.encode(open(f, encoding="utf-8").read()).ids + [0]
        if len(ids) >= need:
            break
    ids = torch.tensor((ids * (need // len(ids) + 1))[:need]).view(a.steps, a.batch, a.seq)
    for s in range(a.steps):
        yield dict(input_ids=ids[s], labels=ids[s])


def train(a):
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(a.threads)
    kw = {"experts_implementation": a.experts_impl} if a.experts_impl else {}
    model = AutoModelForCausalLM.from_pretrained(a.dir, dtype=torch.float32, **kw)
    model.train()
    impl = getattr(model.config, "_experts_implementation", None) if hasattr(
        model.config, "num_experts") else "dense"
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
    times = []
    for s, b in enumerate(batches(a)):
        t = time.perf_counter()
        loss = model(**b).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t)
        print(f"step {s}: loss {loss.item():.4f} {times[-1]:.3f} s", flush=True)
    timed = times[a.warmup:] or times
    med = statistics.median(timed)
    n = sum(p.numel() for p in model.parameters())
    print(f"BENCH moe_peer model={type(model).__name__} params={n} batch={a.batch} seq={a.seq}"
          f" step_s={med:.3f} steps={' '.join(f'{x:.3f}' for x in timed)}"
          f" tokens_per_s={a.batch * a.seq / med:.1f} peak_rss_mib={peak_rss_mib():.0f}"
          f" experts_impl={impl} torch={torch.__version__}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("cmd", choices=["save-tokenizer", "save-moe", "save-dense", "train"])
    ap.add_argument("dir")
    ap.add_argument("--text_dir")
    ap.add_argument("--tokenizer")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--kv_heads", type=int, default=4)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--topk", type=int, default=2)
    ap.add_argument("--moe_ffn", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--experts_impl", default=None,
                    help="train: transformers' experts_implementation (eager, grouped_mm, "
                         "batched_mm; default: transformers' choice)")
    a = ap.parse_args()
    if a.cmd == "save-tokenizer":
        save_tokenizer(a)
    elif a.cmd == "train":
        train(a)
    else:
        save(a)


if __name__ == "__main__":
    sys.exit(main())

"""Reference for bench/run_generate.sh: a GPT-2-124M-shaped model with random weights, saved as a
Hugging Face folder for ds_generate (--save), and transformers' generate() timed on it (--run).

  python bench/generate_peer.py --save DIR
  python bench/generate_peer.py --run DIR --prompt_tokens 512 --new_tokens 128 --threads 2
  python bench/generate_peer.py --run DIR --dtype bf16   # model.to(torch.bfloat16): bf16 weights
                                                          # and KV cache, as ds_generate --dtype bf16

Prefill = one forward over the prompt (use_cache=True), best of --reps; decode = greedy generate()
of new_tokens after that prompt (min_new_tokens = new_tokens, so eos never ends it early) minus one
prefill, over new_tokens - 1 steps (the first new token comes from the prefill), best of --reps.
Prints: BENCH torch_generate dtype=.. prefill_tokens_per_s=.. decode_tokens_per_s=.. torch=..
transformers=..
"""
import argparse
import time

import torch
import transformers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--save")
    ap.add_argument("--run")
    ap.add_argument("--prompt_tokens", type=int, default=512)
    ap.add_argument("--new_tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.save:
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config())  # 124M, random weights
        model.save_pretrained(a.save)
        return
    # dtype pinned: transformers 5 would load in the checkpoint's dtype (float32 here) anyway.
    model = transformers.GPT2LMHeadModel.from_pretrained(a.run, dtype=torch.float32).eval()
    if a.dtype == "bf16":
        model = model.to(torch.bfloat16)  # weights rounded to nearest even, as ds_generate's
    ids = torch.full((1, a.prompt_tokens), 23748, dtype=torch.long)  # " hello" x N, as ds_generate
    best_pre, best_total = float("inf"), float("inf")
    with torch.inference_mode():
        for _ in range(a.reps):
            t0 = time.perf_counter()
            model(ids, use_cache=True)
            best_pre = min(best_pre, time.perf_counter() - t0)
            t0 = time.perf_counter()
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens,
                                 pad_token_id=50256)
            best_total = min(best_total, time.perf_counter() - t0)
            assert out.shape[1] == a.prompt_tokens + a.new_tokens
    decode = (a.new_tokens - 1) / max(best_total - best_pre, 1e-9)
    print(f"BENCH torch_generate dtype={a.dtype} prompt_tokens={a.prompt_tokens} "
          f"new_tokens={a.new_tokens} "
          f"prefill_tokens_per_s={a.prompt_tokens / best_pre:.1f} decode_tokens_per_s={decode:.1f} "
          f"torch={torch.__version__} transformers={transformers.__version__}")


if __name__ == "__main__":
    main()

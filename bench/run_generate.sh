#!/usr/bin/env bash
# Generation speed: ds_generate against transformers' generate() on the same GPT-2-124M-shaped model
# with random weights, in one sitting. bench/generate_peer.py writes the model as a Hugging Face
# folder (safetensors) and times transformers on it; ds_generate loads that folder.
#
#   bash bench/run_generate.sh
#
# Environment:
#   DS_BUILD_DIR   build directory holding tools/ds_generate (default: build)
#   SKIP_BUILD=1   do not build ds_generate first
#   PYTHON_TORCH   interpreter with torch + transformers (default /tmp/dsvenv/bin/python)
#   PROMPT_TOKENS  prompt length (default 512); NEW_TOKENS decoded tokens (default 128)
#   THREADS        compute threads for both (default 2); REPS runs each, best kept (default 3)
#   MODEL_DIR      where the random model is written (default /tmp/ds_bench_gpt2_random)
#   DTYPE          fp32 (default) or bf16: ds_generate --dtype bf16 (bf16 weights and KV cache)
#                  against transformers with model.to(torch.bfloat16)
#
# Output: BENCH lines of both sides and
#   BENCH generate_vs_torch dtype=<DTYPE> prefill_ratio=<ours/torch> decode_ratio=<ours/torch>
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DS_BUILD_DIR:-$REPO/build}"
PY="${PYTHON_TORCH:-/tmp/dsvenv/bin/python}"
PROMPT_TOKENS="${PROMPT_TOKENS:-512}"
NEW_TOKENS="${NEW_TOKENS:-128}"
THREADS="${THREADS:-2}"
REPS="${REPS:-3}"
MODEL_DIR="${MODEL_DIR:-/tmp/ds_bench_gpt2_random}"
DTYPE="${DTYPE:-fp32}"
[[ "$DTYPE" == fp32 || "$DTYPE" == bf16 ]] || { echo "DTYPE must be fp32 or bf16" >&2; exit 2; }
export OMP_NUM_THREADS="$THREADS"

[[ "${SKIP_BUILD:-0}" == 1 ]] || cmake --build "$BUILD" --target ds_generate -j2 >/dev/null
TOK="$REPO/.cache/data/gpt2"
[[ -f "$TOK/encoder.json" ]] || "$REPO/scripts/fetch_data.sh" >&2
[[ -f "$MODEL_DIR/config.json" ]] || "$PY" "$REPO/bench/generate_peer.py" --save "$MODEL_DIR"

# " hello" is one GPT-2 token (23748): the prompt is exactly PROMPT_TOKENS tokens.
PROMPT="$(printf ' hello%.0s' $(seq "$PROMPT_TOKENS"))"
best_pre=0 best_dec=0
for _ in $(seq "$REPS"); do
  line="$("$BUILD/tools/ds_generate" --model "$MODEL_DIR" --tokenizer "$TOK" --prompt "$PROMPT" \
    --max_tokens "$NEW_TOKENS" --temperature 0 --ignore_eos --threads "$THREADS" --dtype "$DTYPE" \
    2>&1 >/dev/null |
    grep 'prefill')"
  echo "$line"
  pre="$(sed -E 's/.* = ([0-9.]+) tokens\/s; decode.*/\1/' <<<"$line")"
  dec="$(sed -E 's/.*decode .* = ([0-9.]+) tokens\/s;.*/\1/' <<<"$line")"
  best_pre="$(awk -v a="$best_pre" -v b="$pre" 'BEGIN { print (b > a ? b : a) }')"
  best_dec="$(awk -v a="$best_dec" -v b="$dec" 'BEGIN { print (b > a ? b : a) }')"
done
echo "BENCH ds_generate dtype=$DTYPE prompt_tokens=$PROMPT_TOKENS new_tokens=$NEW_TOKENS prefill_tokens_per_s=$best_pre decode_tokens_per_s=$best_dec"
torch_line="$("$PY" "$REPO/bench/generate_peer.py" --run "$MODEL_DIR" --prompt_tokens "$PROMPT_TOKENS" \
  --new_tokens "$NEW_TOKENS" --threads "$THREADS" --reps "$REPS" --dtype "$DTYPE" 2>/dev/null |
  grep '^BENCH')"
echo "$torch_line"
tpre="$(sed -E 's/.*prefill_tokens_per_s=([0-9.]+).*/\1/' <<<"$torch_line")"
tdec="$(sed -E 's/.*decode_tokens_per_s=([0-9.]+).*/\1/' <<<"$torch_line")"
awk -v a="$best_pre" -v b="$tpre" -v c="$best_dec" -v d="$tdec" -v t="$DTYPE" \
  'BEGIN { printf "BENCH generate_vs_torch dtype=%s prefill_ratio=%.2f decode_ratio=%.2f\n", t, a / b, c / d }'

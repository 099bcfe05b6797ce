#!/usr/bin/env bash
# ds_serve under load: p50/p99 latency, time to first token, requests/s and tokens/s at 1, 8 and
# 32 concurrent clients (bench/bench_serve.cpp: streaming /v1/completions, greedy, each client
# sending its next request when the last is answered), against the reference measured in the same
# run: ds_generate's single-request decode speed on the same model and prompt (one process, no
# HTTP; before and after the server), and optionally transformers' generate()
# (bench/generate_peer.py). The server runs once per --max_batch value of MAX_BATCH: with 1 (one
# generation at a time) its tokens/s at any client count stays near the single-request speed
# (tokens_ratio ~1) and latency grows with the queue; with continuous batching (8) concurrent
# clients share decode steps and tokens/s grows with them, up to the batch.
#
#   bash bench/run_serve.sh
#
# Environment:
#   DS_BUILD_DIR   build directory (default: build); SKIP_BUILD=1 does not build first
#   MODEL_DIR      model folder (default /tmp/ds_bench_gpt2_random: GPT-2 124M shape, random
#                  weights, written by bench/generate_peer.py --save when missing)
#   TOK            tokenizer folder (default .cache/data/gpt2, fetched by scripts/fetch_data.sh)
#   CLIENTS        client counts (default 1,8,32); REQUESTS per level, at least 2 per client
#                  (default 16); NEW_TOKENS per request (default 32); THREADS compute threads
#                  (default 2); REPS ds_generate runs, best kept (default 3); MAX_BATCH the
#                  server's --max_batch values, one server each (default "1 8")
#   PYTHON_TORCH   interpreter with torch + transformers for the transformers reference (default
#                  /tmp/dsvenv/bin/python; SKIP_TORCH=1 leaves it out)
#
# Output: BENCH lines of each side, then per level
#   BENCH serve max_batch=<b> clients=<n> ... (bench_serve's line)
#   BENCH serve_vs_generate max_batch=<b> clients=<n> tokens_ratio=<serve tokens/s / ds_generate
#         decode tokens/s>
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DS_BUILD_DIR:-$REPO/build}"
MODEL_DIR="${MODEL_DIR:-/tmp/ds_bench_gpt2_random}"
TOK="${TOK:-$REPO/.cache/data/gpt2}"
CLIENTS="${CLIENTS:-1,8,32}"
REQUESTS="${REQUESTS:-16}"
NEW_TOKENS="${NEW_TOKENS:-32}"
THREADS="${THREADS:-2}"
REPS="${REPS:-3}"
MAX_BATCH="${MAX_BATCH:-1 8}"
PY="${PYTHON_TORCH:-/tmp/dsvenv/bin/python}"
PROMPT="The history of the city begins with a small settlement on the river"
export OMP_NUM_THREADS="$THREADS"

[[ "${SKIP_BUILD:-0}" == 1 ]] ||
  cmake --build "$BUILD" --target ds_generate ds_serve bench_serve -j2 >/dev/null
[[ -f "$TOK/encoder.json" || -f "$TOK/vocab.json" || -f "$TOK/tokenizer.json" ]] ||
  "$REPO/scripts/fetch_data.sh" >&2
[[ -f "$MODEL_DIR/config.json" ]] || "$PY" "$REPO/bench/generate_peer.py" --save "$MODEL_DIR"
tok_args=()
[[ -f "$MODEL_DIR/tokenizer.json" || -f "$MODEL_DIR/vocab.json" ]] || tok_args=(--tokenizer "$TOK")

# Reference: one request in one process; REPS runs before the server and REPS after it (on a
# shared machine the load drifts during the run), best kept.
best_dec=0
reference() {
  for _ in $(seq "$REPS"); do
    line="$("$BUILD/tools/ds_generate" --model "$MODEL_DIR" "${tok_args[@]}" --prompt "$PROMPT" \
      --max_tokens "$NEW_TOKENS" --temperature 0 --ignore_eos --threads "$THREADS" 2>&1 >/dev/null |
      grep 'prefill')"
    echo "$line"
    dec="$(sed -E 's/.*decode .* = ([0-9.]+) tokens\/s;.*/\1/' <<<"$line")"
    best_dec="$(awk -v a="$best_dec" -v b="$dec" 'BEGIN { print (b > a ? b : a) }')"
  done
}
reference

# The server, once per --max_batch: room for every client (no 503 in this benchmark), one
# connection thread each.
LOG="$(mktemp)"
SERVER=""
trap '[[ -z "$SERVER" ]] || kill "$SERVER" 2>/dev/null || true; rm -f "$LOG" "$LOG".bench*' EXIT
for mb in $MAX_BATCH; do
  "$BUILD/tools/ds_serve" --model "$MODEL_DIR" "${tok_args[@]}" --port 0 --threads "$THREADS" \
    --http_threads 40 --max_queue 64 --max_batch "$mb" 2>"$LOG" &
  SERVER=$!
  PORT=""
  for _ in $(seq 600); do
    PORT="$(sed -nE 's#.* on http://127\.0\.0\.1:([0-9]+) .*#\1#p' "$LOG")"
    [[ -n "$PORT" ]] && break
    sleep 0.1
  done
  [[ -n "$PORT" ]] || { cat "$LOG" >&2; exit 1; }
  # One request first: the server's first generation pays for page faults and thread start-up.
  "$BUILD/bench/bench_serve" --port "$PORT" --clients 1 --requests 1 --max_tokens 4 \
    --prompt "$PROMPT" >/dev/null
  "$BUILD/bench/bench_serve" --port "$PORT" --clients "$CLIENTS" --requests "$REQUESTS" \
    --max_tokens "$NEW_TOKENS" --prompt "$PROMPT" | sed "s/^BENCH serve /BENCH serve max_batch=$mb /" |
    tee "$LOG.bench.$mb"
  kill "$SERVER"
  wait "$SERVER" 2>/dev/null || true
  SERVER=""
done
reference
echo "BENCH ds_generate new_tokens=$NEW_TOKENS decode_tokens_per_s=$best_dec (best of $((2 * REPS)))"
for mb in $MAX_BATCH; do
  while read -r l; do
    n="$(sed -E 's/.*clients=([0-9]+) .*/\1/' <<<"$l")"
    t="$(sed -E 's/.*tokens_per_s=([0-9.]+) .*/\1/' <<<"$l")"
    awk -v b="$mb" -v n="$n" -v t="$t" -v r="$best_dec" \
      'BEGIN { printf "BENCH serve_vs_generate max_batch=%d clients=%d tokens_ratio=%.2f\n", b, n, t / r }'
  done <"$LOG.bench.$mb"
done

if [[ "${SKIP_TORCH:-0}" != 1 && -x "$PY" ]]; then
  n_prompt="$(grep -oE 'prefill [0-9]+ tokens' <<<"$line" | grep -oE '[0-9]+')"
  "$PY" "$REPO/bench/generate_peer.py" --run "$MODEL_DIR" --prompt_tokens "$n_prompt" \
    --new_tokens "$NEW_TOKENS" --threads "$THREADS" --reps "$REPS" 2>/dev/null | grep '^BENCH' || true
fi

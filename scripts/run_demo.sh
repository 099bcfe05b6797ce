#!/usr/bin/env bash
# The README's main command: set up a fresh machine and train a small GPT on the State of the Union
# corpus for a few minutes, with a DeepSpeed config.
#
#   bash scripts/run_demo.sh [ds_train flags...]     e.g. --max_steps 50, or --bf16
#
# 1. scripts/setup.sh --no-build: installs what is missing (apt-get), fetches and checksums the
#    GPT-2 tokenizer and the corpus into .cache/data.
# 2. Configures a Release build in $DS_BUILD_DIR (default build/) and builds only ds_prepare and
#    ds_train (the whole tree, tests included, takes much longer on 2 cores).
# 3. Tokenizes the corpus with ds_prepare into .cache/prepared/sotu (speeches up to 2000 train,
#    2001 on validate), unless data/sotu or .cache/prepared/sotu already holds it.
# 4. Trains a small GPT-2 (configs/model_demo.json: 4 layers, 4 heads, C 128, 7.2M parameters)
#    with configs/ds_demo.json (AdamW, WarmupDecayLR, gradient clipping, every value "auto" and
#    filled from the flags below) at T 128, micro-batch 8, for 600 steps into $DS_DEMO_OUT (default
#    out/demo); then prints where the metrics, loss curve, checkpoint and generated sample are.
#
# Flags after the script name go to ds_train after the demo's own, so they win (e.g. --max_steps 50
# for a quick look). An interrupted demo continues with: bash scripts/run_demo.sh
# --resume_from_checkpoint latest
#
# Environment: DS_BUILD_DIR, DS_CACHE_DIR (default .cache/data), DS_DEMO_OUT, DS_BUILD_JOBS.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${DS_BUILD_DIR:-$REPO/build}"
CACHE="${DS_CACHE_DIR:-$REPO/.cache/data}"
OUT="${DS_DEMO_OUT:-$REPO/out/demo}"
JOBS="${DS_BUILD_JOBS:-$(nproc)}"

log() { echo "run_demo: $*"; }
die() {
  echo "run_demo: error: $*" >&2
  exit 1
}

for arg in "$@"; do
  if [[ "$arg" == -h || "$arg" == --help ]]; then
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"
    exit 0
  fi
done

# --- 1. dependencies and data ---------------------------------------------------------------------
bash "$REPO/scripts/setup.sh" --no-build
[[ -f "$CACHE/gpt2/encoder.json" && -d "$CACHE/sotu" ]] ||
  die "the tokenizer or the corpus is missing under $CACHE (see the fetch_data messages above)"

# --- 2. build the two programs ----------------------------------------------------------------------
log "building ds_prepare and ds_train in $BUILD_DIR"
cmake -S "$REPO" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null </dev/null
cmake --build "$BUILD_DIR" -j"$JOBS" --target ds_prepare ds_train </dev/null
DS_PREPARE="$BUILD_DIR/tools/ds_prepare"
DS_TRAIN="$BUILD_DIR/tools/ds_train"

# --- 3. tokenized corpus ----------------------------------------------------------------------------
DATA=""
for cand in "$REPO/data/sotu" "$REPO/.cache/prepared/sotu"; do
  if [[ -f "$cand/meta.json" ]]; then
    DATA="$cand"
    break
  fi
done
if [[ -z "$DATA" ]]; then
  DATA="$REPO/.cache/prepared/sotu"
  log "tokenizing the corpus into $DATA"
  "$DS_PREPARE" --tokenizer "$CACHE/gpt2" --output "$DATA" --val_from_year 2001 "$CACHE/sotu"
else
  log "using the tokenized corpus in $DATA"
fi

# --- 4. train -------------------------------------------------------------------------------------
# 600 steps of 8 x 128 tokens: about 4 minutes on 2 idle cores; the loss ends well below the
# corpus's unigram entropy (6.68 nats/token, printed at start-up and drawn on the loss curve).
log "training; flags given to this script are appended: $*"
"$DS_TRAIN" \
  --deepspeed "$REPO/configs/ds_demo.json" \
  --model "$REPO/configs/model_demo.json" \
  --train_data "$DATA" \
  --output_dir "$OUT" \
  --tokenizer "$CACHE/gpt2" \
  --block_size 128 \
  --per_device_train_batch_size 8 \
  --gradient_accumulation_steps 1 \
  --learning_rate 3e-3 \
  --warmup_steps 20 \
  --weight_decay 0.1 \
  --adam_beta2 0.95 \
  --max_grad_norm 1.0 \
  --max_steps 600 \
  --logging_steps 25 \
  --eval_steps 100 \
  --eval_batches 10 \
  --save_steps 200 \
  --save_total_limit 2 \
  --sample_prompt "Fellow-Citizens of the Senate and House of Representatives:" \
  --sample_tokens 48 \
  "$@"

log "done. Open $OUT/loss.svg in a browser or image viewer for the loss curve."

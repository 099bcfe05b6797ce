#!/usr/bin/env bash
# A chit-chat fine-tune of a tiny BART, offline after one PyPI download (docs/finetuning.md,
# "Encoder-decoders: a chit-chat demo"):
#
#   bash scripts/run_seq2seq_demo.sh
#
# 1. The corpus: the Chit-Chat Challenge conversations (BYU PCC lab, MIT licence) that the PyPI
#    package chitchat-dataset ships, fetched with pip download (no install) unless
#    $OUT/chitchat/dataset.json exists; scripts/make_chitchat_pairs.py turns each turn and the reply
#    to it into {"source", "target"} records of at most 12 words (the last 200 conversations are
#    validation), and trains a BART-style byte-level BPE of 4000 ids on the training turns (the
#    `tokenizers` package; no BART tokenizer is reachable offline, and GPT-2's 50,257 ids make a
#    tiny model's output layer the whole cost: GPT2_TOKENIZER=1 uses .cache/data/gpt2 instead).
# 2. ds_prepare --task seq2seq: sources of at most 24 ids, targets of at most 16 (<s> x </s>).
# 3. Before: ds_train --eval_only on the randomly initialised tiny BART (the same --seed as the
#    run): eval loss, BLEU of greedy answers to the first validation turns, three of them shown.
# 4. ds_train for STEPS steps (d_model 128, 2 + 2 layers), evaluating every EVAL_STEPS steps
#    (loss and BLEU of BLEU_EXAMPLES greedy answers), exported as a Hugging Face BART folder.
# 5. After: ds_generate answers a few questions with the export (greedy and beam search).
#
# Environment: DS_BUILD_DIR, DS_CACHE_DIR (default .cache/data), DS_SEQ2SEQ_OUT (default
# out/seq2seq_demo), STEPS (300), EVAL_STEPS (100), BLEU_EXAMPLES (128), THREADS (all cores),
# PYTHON (python3, with the tokenizers package), GPT2_TOKENIZER (0), DS_BUILD_JOBS.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${DS_BUILD_DIR:-$REPO/build}"
CACHE="${DS_CACHE_DIR:-$REPO/.cache/data}"
OUT="${DS_SEQ2SEQ_OUT:-$REPO/out/seq2seq_demo}"
JOBS="${DS_BUILD_JOBS:-$(nproc)}"
PY="${PYTHON:-python3}"
STEPS="${STEPS:-300}"
EVAL_STEPS="${EVAL_STEPS:-100}"
BLEU_EXAMPLES="${BLEU_EXAMPLES:-128}"
THREADS="${THREADS:-$(nproc)}"

log() { echo "run_seq2seq_demo: $*"; }
die() {
  echo "run_seq2seq_demo: error: $*" >&2
  exit 1
}
for arg in "$@"; do
  if [[ "$arg" == -h || "$arg" == --help ]]; then
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"
    exit 0
  fi
done

if [[ "${GPT2_TOKENIZER:-0}" == 1 ]]; then
  [[ -f "$CACHE/gpt2/encoder.json" ]] ||
    die "no GPT-2 tokenizer in $CACHE/gpt2: run scripts/fetch_data.sh (or scripts/setup.sh) first"
  TOK="$CACHE/gpt2"
  TRAIN_TOK=()
else
  TOK="$OUT/pairs/tokenizer"
  TRAIN_TOK=(--train_tokenizer "$TOK" --vocab_size 4000)
fi
log "building ds_prepare, ds_train and ds_generate in $BUILD_DIR"
cmake -S "$REPO" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null </dev/null
cmake --build "$BUILD_DIR" -j"$JOBS" --target ds_prepare ds_train ds_generate </dev/null >/dev/null
BIN="$BUILD_DIR/tools"
mkdir -p "$OUT"

# --- 1. the corpus -------------------------------------------------------------------------------
DATASET="$OUT/chitchat/dataset.json"
if [[ ! -f "$DATASET" ]]; then
  log "fetching chitchat-dataset (MIT) from PyPI with pip download"
  rm -rf "$OUT/chitchat/wheel"
  "$PY" -m pip download --quiet --no-deps chitchat-dataset==0.9.0 -d "$OUT/chitchat/wheel" ||
    die "pip download chitchat-dataset failed (is PyPI reachable?)"
  "$PY" - "$OUT/chitchat" <<'PYEOF'
import glob, sys, zipfile
out = sys.argv[1]
wheel = glob.glob(f"{out}/wheel/chitchat_dataset-*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    with open(f"{out}/dataset.json", "wb") as f:
        f.write(z.read("chitchat_dataset/dataset.json"))
    lic = [n for n in z.namelist() if n.endswith("LICENSE")]
    if lic:
        with open(f"{out}/LICENSE", "wb") as f:
            f.write(z.read(lic[0]))
PYEOF
fi
"$PY" "$REPO/scripts/make_chitchat_pairs.py" --dataset "$DATASET" --output "$OUT/pairs" \
  "${TRAIN_TOK[@]}"

# --- 2. the set ----------------------------------------------------------------------------------
"$BIN/ds_prepare" --task seq2seq --tokenizer "$TOK" --max_source_len 24 \
  --max_target_len 16 --val_files 'val*' --output "$OUT/set" "$OUT/pairs/train.jsonl" \
  "$OUT/pairs/val.jsonl"
cat >"$OUT/bart_chat_tiny.json" <<'JSON'
{"family": "bart", "d_model": 128, "encoder_layers": 2, "decoder_layers": 2, "encoder_heads": 4,
 "decoder_heads": 4, "encoder_ffn": 512, "decoder_ffn": 512, "dropout": 0.1}
JSON
COMMON=(--train_data "$OUT/set" --model "$OUT/bart_chat_tiny.json" --seed 7 --threads "$THREADS"
  --per_device_train_batch_size 32 --eval_batches 8 --eval_bleu_examples "$BLEU_EXAMPLES")

# --- 3. before -----------------------------------------------------------------------------------
log "before training: the random tiny BART on the validation turns"
"$BIN/ds_train" "${COMMON[@]}" --eval_only --output_dir "$OUT/before" 2>&1 |
  grep --line-buffered -E 'eval only|source:|target:|output:'

# --- 4. training ---------------------------------------------------------------------------------
log "training $STEPS steps"
"$BIN/ds_train" "${COMMON[@]}" --max_steps "$STEPS" --learning_rate 3e-3 --warmup_steps 20 \
  --eval_steps "$EVAL_STEPS" --save_steps 0 --logging_steps 20 --output_dir "$OUT/run" 2>&1 |
  grep --line-buffered -E '^\[ds_train\] |^    (source|target|output):'

# --- 5. after ------------------------------------------------------------------------------------
log "after training: ds_generate on the export ($OUT/run/hf_model)"
for q in "Hello how are you?" "What do you do for fun?" "Do you like dogs?" \
  "What is your favorite movie?"; do
  greedy="$("$BIN/ds_generate" --model "$OUT/run/hf_model" --prompt "$q" 2>/dev/null)"
  beam="$("$BIN/ds_generate" --model "$OUT/run/hf_model" --prompt "$q" --num_beams 4 \
    --no_repeat_ngram_size 3 2>/dev/null)"
  printf '  %-30s greedy: %s\n  %-30s beam 4: %s\n' "$q" "$greedy" "" "$beam"
done
log "eval results: $OUT/run/eval_results.json"

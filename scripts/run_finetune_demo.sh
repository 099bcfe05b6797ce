#!/usr/bin/env bash
# The fine-tune-and-serve journey on a fresh machine, offline (docs/finetuning.md, docs/serving.md):
#
#   bash scripts/run_finetune_demo.sh
#
# 1. scripts/setup.sh --no-build (apt packages, the GPT-2 tokenizer and the State of the Union
#    corpus), then builds ds_prepare, ds_train, ds_generate and ds_serve.
# 2. A base model: no model hub is reachable, so a small GPT-2 (configs/model_demo.json) is
#    pre-trained on the corpus for BASE_STEPS steps and exported as a Hugging Face folder with its
#    tokenizer (skipped when $OUT/base/hf_model exists).
# 3. Prompt/response data in the ChatGLM guide's JSONL format ({"prompt", "response", "history"}),
#    made from the corpus: "Who gave the State of the Union address of 1861?" -> "Abraham Lincoln
#    gave it.", and how each address begins, some records with a history turn.
# 4. ds_prepare --sft chatglm --template chatglm: rendered, answers-only loss mask, T = 128.
# 5. ds_train --init_from the base: every weight trains (LORA=1: LoRA r 8 on c_attn, c_fc, c_proj,
#    only the LoRA matrices train, merged at the end; on a base this small LoRA learns the answers
#    far more slowly); the export carries the chat template.
# 6. ds_serve on 127.0.0.1:$PORT, asked through the guide's API (POST /) and OpenAI's
#    (/v1/chat/completions), then stopped. Before that, the base and the fine-tuned model answer
#    the same question with ds_generate (before / after).
#
# Environment: DS_BUILD_DIR, DS_CACHE_DIR (default .cache/data), DS_FINETUNE_OUT (default
# out/finetune_demo), BASE_STEPS (300), SFT_STEPS (400), LORA (0), PORT (8765), DS_BUILD_JOBS.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${DS_BUILD_DIR:-$REPO/build}"
CACHE="${DS_CACHE_DIR:-$REPO/.cache/data}"
OUT="${DS_FINETUNE_OUT:-$REPO/out/finetune_demo}"
JOBS="${DS_BUILD_JOBS:-$(nproc)}"
PORT="${PORT:-8765}"

log() { echo "run_finetune_demo: $*"; }
die() {
  echo "run_finetune_demo: error: $*" >&2
  exit 1
}
for arg in "$@"; do
  if [[ "$arg" == -h || "$arg" == --help ]]; then
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"
    exit 0
  fi
done

# --- 1. dependencies, data, programs -------------------------------------------------------------
bash "$REPO/scripts/setup.sh" --no-build
[[ -f "$CACHE/gpt2/encoder.json" && -d "$CACHE/sotu" ]] ||
  die "the tokenizer or the corpus is missing under $CACHE (see the fetch_data messages above)"
log "building ds_prepare, ds_train and ds_serve in $BUILD_DIR"
cmake -S "$REPO" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null </dev/null
cmake --build "$BUILD_DIR" -j"$JOBS" --target ds_prepare ds_train ds_generate ds_serve </dev/null
BIN="$BUILD_DIR/tools"
mkdir -p "$OUT"

# --- 2. base model -------------------------------------------------------------------------------
if [[ ! -f "$OUT/base/hf_model/config.json" ]]; then
  PRE="$OUT/pretrain_data"
  [[ -f "$PRE/meta.json" ]] ||
    "$BIN/ds_prepare" --tokenizer "$CACHE/gpt2" --output "$PRE" --val_from_year 2001 "$CACHE/sotu"
  log "pre-training the base model (${BASE_STEPS:-300} steps)"
  "$BIN/ds_train" --model "$REPO/configs/model_demo.json" --train_data "$PRE" \
    --output_dir "$OUT/base" --tokenizer "$CACHE/gpt2" --block_size 128 \
    --per_device_train_batch_size 8 --learning_rate 3e-3 --warmup_steps 20 --weight_decay 0.1 \
    --max_grad_norm 1.0 --max_steps "${BASE_STEPS:-300}" --logging_steps 50 --eval_steps 0 \
    --save_steps 0 --sample_tokens 0
else
  log "using the base model in $OUT/base/hf_model"
fi

# --- 3. prompt/response records (the ChatGLM guide's format) ---------------------------------------
python3 - "$CACHE/sotu" "$OUT/sotu_chat.jsonl" <<'PY'
import json, os, re, sys
src, out = sys.argv[1], sys.argv[2]
records = []
for name in sorted(os.listdir(src)):
    m = re.match(r"(\d{4})_(.+?)_[a-z]+\.txt$", name)
    if not m:
        continue
    year, who = m.group(1), " ".join(w.capitalize() for w in m.group(2).split("_"))
    text = open(os.path.join(src, name), encoding="utf-8", errors="replace").read()
    first = re.split(r"(?<=[.!?])\s", " ".join(text.split()), maxsplit=1)[0][:160]
    q1 = f"Who gave the State of the Union address of {year}?"
    a1 = f"{who} gave it."
    records.append({"prompt": q1, "response": a1, "history": []})
    records.append({"prompt": f"How does the {year} address begin?", "response": first,
                    "history": [[q1, a1]]})
with open(out, "w") as f:
    for r in records:
        f.write(json.dumps(r) + "\n")
print(f"run_finetune_demo: {len(records)} prompt/response records -> {out}")
PY

# --- 4. SFT shards ---------------------------------------------------------------------------------
rm -rf "$OUT/sft_data"
"$BIN/ds_prepare" --sft chatglm --template chatglm --tokenizer "$OUT/base/hf_model" --seq_len 128 \
  --output "$OUT/sft_data" "$OUT/sotu_chat.jsonl"

# --- 5. fine-tune (all weights; LORA=1: LoRA only, merged) ----------------------------------------
ft=(--learning_rate 3e-3)
if [[ "${LORA:-0}" == 1 ]]; then
  ft=(--learning_rate 1e-2 --lora_dim 8 --lora_alpha 16 --lora_module_name c_attn,c_fc,c_proj
      --only_optimize_lora --merge_lora)
fi
log "fine-tuning (${SFT_STEPS:-400} steps): ${ft[*]}"
rm -rf "$OUT/sft"
"$BIN/ds_train" --init_from "$OUT/base/hf_model" --train_data "$OUT/sft_data" \
  --output_dir "$OUT/sft" --per_device_train_batch_size 8 --warmup_steps 10 \
  --max_steps "${SFT_STEPS:-400}" --logging_steps 50 --eval_steps 100 --save_steps 0 \
  --sample_tokens 0 "${ft[@]}"

# --- before / after: the same question, rendered as the chatglm template renders it -------------------
QUESTION=$'[Round 0]\n问：Who gave the State of the Union address of 1933?\n答：'
for m in base sft; do
  log "$m model, greedy: $(printf '%q' "$QUESTION")"
  "$BIN/ds_generate" --model "$OUT/$m/hf_model" --prompt "$QUESTION" --temperature 0 \
    --max_tokens 24 2>/dev/null
  echo
done

# --- 6. serve and ask ------------------------------------------------------------------------------
log "serving $OUT/sft/hf_model on 127.0.0.1:$PORT"
"$BIN/ds_serve" --model "$OUT/sft/hf_model" --port "$PORT" > "$OUT/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  curl -s -o /dev/null "http://127.0.0.1:$PORT/v1/models" && break
  kill -0 $SERVER 2>/dev/null || die "ds_serve exited: $(tail -3 "$OUT/serve.log")"
  sleep 0.2
done
ask() {
  log "POST / $1"
  curl -s -X POST "http://127.0.0.1:$PORT" -H 'Content-Type: application/json' -d "$1"
  echo
}
ask '{"prompt": "Who gave the State of the Union address of 1861?", "history": [], "max_length": 128, "temperature": 0}'
ask '{"prompt": "How does the 1861 address begin?", "history": [["Who gave the State of the Union address of 1861?", "Abraham Lincoln gave it."]], "max_length": 128, "temperature": 0}'
log "POST /v1/chat/completions"
curl -s "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model": "sft", "messages": [{"role": "user", "content": "Who gave the State of the Union address of 1933?"}], "max_tokens": 24, "temperature": 0}'
echo
kill $SERVER
wait $SERVER 2>/dev/null || true
trap - EXIT
log "done: base $OUT/base/hf_model, fine-tuned $OUT/sft/hf_model (loss curve $OUT/sft/loss.svg)"

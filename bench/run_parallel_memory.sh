#!/usr/bin/env bash
# Memory per rank for the same model on 2 ranks: pipeline (pp = 2), tensor (tp = 2) and data
# parallel with ZeRO-3 (dp = 2), each a short ds_train run; prints each rank's model-state bytes
# and peak RSS from the run's memory.json (bench/RESULTS.md, "Memory per rank: pp, tp, ZeRO-3").
#
#   bash bench/run_parallel_memory.sh [MODEL=gpt2-350m] [STEPS=2]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${DS_BUILD_DIR:-build}"
MODEL="${MODEL:-gpt2-350m}"
DATA="${DATA:-.cache/prepared/sotu}"
OUT="${OUT:-$BUILD/parallel_memory}"
[[ -f "$DATA/meta.json" ]] || { echo "run_parallel_memory.sh: no prepared data in $DATA (bash scripts/fetch_data.sh; ds_prepare)" >&2; exit 1; }
mkdir -p "$OUT"
cfg() {  # $1 = ZeRO stage
  printf '{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2, "zero_optimization": {"stage": %s}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}\n' "$1" > "$OUT/z$1.json"
  echo "$OUT/z$1.json"
}
export OMP_NUM_THREADS=1
for run in "pp2 --pipeline_parallel_size 2 --deepspeed $(cfg 0)" \
           "tp2 --tensor_parallel_size 2 --deepspeed $(cfg 0)" \
           "dp2_zero3 --deepspeed $(cfg 3)"; do
  name="${run%% *}"; flags="${run#* }"
  rm -rf "$OUT/$name"
  "$BUILD/tools/deepspeed" --num_procs 2 "$BUILD/tools/ds_train" --train_data "$DATA" --model "$MODEL" \
    --block_size 128 --max_steps "${STEPS:-2}" --eval_steps 0 --sample_tokens 0 --skip_memory_check \
    --export_hf none --output_dir "$OUT/$name" $flags > "$OUT/$name.log" 2>&1 || { echo "$name failed: $OUT/$name.log"; tail -5 "$OUT/$name.log"; continue; }
  python3 - "$OUT/$name/memory.json" "$name" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
ranks = m.get("ranks", [])
states = [r.get("model_state_bytes", 0) for r in ranks]
rss = [r.get("peak_rss_bytes", 0) for r in ranks]
print(f"BENCH parallel_memory run={sys.argv[2]} " + " ".join(
    f"rank{i}_states_mib={s/2**20:.0f} rank{i}_peak_rss_mib={p/2**20:.0f}" for i, (s, p) in enumerate(zip(states, rss))))
PY
done

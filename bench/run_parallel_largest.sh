#!/usr/bin/env bash
# The largest model each of pp = 2, tp = 2 and dp = 2 + ZeRO-3 trains on 2 ranks of this machine
# (both ranks share its RAM): GPT-2-layout models of growing size, fp32 AdamW, micro-batch 1 x 128
# tokens, 2 optimizer steps each (gradient_accumulation_steps 2). A size passes when ds_train ends
# its steps and writes its checkpoint (deleted after each run); an approach stops at its first failure (the kernel's OOM killer: this machine has no
# swap). The start-up fit check is skipped so that the kernel, not the estimate, decides. Prints
# one line per run and each approach's largest passing size (bench/RESULTS.md, "Largest model on
# 2 ranks").
#
#   bash bench/run_parallel_largest.sh [SIZES="24:1536:16 24:1792:16 26:1920:16 24:2048:16"]
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD="${DS_BUILD_DIR:-build}"
DATA="${DATA:-.cache/prepared/sotu}"
OUT="${OUT:-$BUILD/parallel_largest}"
SIZES="${SIZES:-24:1536:16 24:1792:16 26:1920:16 24:2048:16}"
[[ -f "$DATA/meta.json" ]] || { echo "run_parallel_largest.sh: no prepared data in $DATA (bash scripts/fetch_data.sh; ds_prepare)" >&2; exit 1; }
mkdir -p "$OUT"
cfg() {  # $1 = ZeRO stage
  printf '{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2, "zero_optimization": {"stage": %s}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}\n' "$1" > "$OUT/z$1.json"
  echo "$OUT/z$1.json"
}
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB RAM, swap $(free -g | awk '/Swap:/{print $2}') GiB"
export OMP_NUM_THREADS=1
for run in "pp2 --pipeline_parallel_size 2 --deepspeed $(cfg 0)" \
           "tp2 --tensor_parallel_size 2 --deepspeed $(cfg 0)" \
           "dp2_zero3 --deepspeed $(cfg 3)"; do
  name="${run%% *}"; flags="${run#* }"; best="none"
  for size in $SIZES; do
    IFS=: read -r L C H <<<"$size"
    model="$OUT/gpt-${L}x${C}.json"
    printf '{"preset": "gpt2", "n_layer": %s, "n_embd": %s, "n_head": %s, "block_size": 128}\n' "$L" "$C" "$H" > "$model"
    rm -rf "$OUT/$name-$L-$C"
    t0=$(date +%s)
    if "$BUILD/tools/deepspeed" --num_procs 2 "$BUILD/tools/ds_train" --train_data "$DATA" --model "$model" \
        --block_size 128 --max_steps 2 --eval_steps 0 --sample_tokens 0 --skip_memory_check \
        --export_hf none --output_dir "$OUT/$name-$L-$C" $flags > "$OUT/$name-$L-$C.log" 2>&1; then
      ok=1
    else
      ok=0
    fi
    # GPT-2 layout: 12 C^2 + 13 C per block, the tied wte (V C), wpe (128 C), ln_f.
    params=$(python3 -c "L, C = $L, $C; print(f'{(L * (12 * C * C + 13 * C) + 50257 * C + 128 * C + 2 * C) / 1e9:.2f}B')")
    rss=$(python3 - "$OUT/$name-$L-$C/memory.json" <<'PY' 2>/dev/null
import json, sys
m = json.load(open(sys.argv[1]))
print(" ".join(f"rank{i}_peak_rss_mib={r.get('peak_rss_bytes', 0)/2**20:.0f}" for i, r in enumerate(m.get("ranks", []))))
PY
)
    echo "BENCH parallel_largest run=$name model=gpt-${L}x${C} params=$params trained=$ok seconds=$(( $(date +%s) - t0 )) ${rss:-}"
    rm -rf "$OUT/$name-$L-$C"  # its end-of-run checkpoint: tens of GB
    [[ $ok == 1 ]] || { tail -3 "$OUT/$name-$L-$C.log" | sed 's/^/  /'; break; }
    best="gpt-${L}x${C}"
  done
  echo "BENCH parallel_largest_summary run=$name largest=$best"
done

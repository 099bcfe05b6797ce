#!/usr/bin/env bash
# ZeRO++ (qwZ, qgZ, hpZ) and MiCS against plain ZeRO-3 on 4 ranks: tokens/s, model states per rank
# and each collective's bytes per step (comms_logger, rank 0's messages), one configuration after
# another in the same sitting (bench_zero --comm_bytes under mpirun -np 4, 1 thread per rank).
#
#   bench/run_zeropp.sh [--model tiny] [--batch 2] [--seq 128] [--steps 3] [--logs DIR]
#                       [--common '"stage3_max_reuse_distance": 0']
#
# --common: zero_optimization keys every configuration gets. The default releases each parameter
# after use (reuse distance 0), so the backward gathers again as a memory-bound run does; with
# DeepSpeed's defaults (reuse distance 1e9) a small model stays gathered from its forward to its
# backward, and hpZ has no backward gathers to serve.
#
# Prints one line per configuration:
#   <name>  tokens/s  model-states MiB  all_gather MB/step  reduce_scatter MB/step  all_to_all
#   MB/step  all_reduce MB/step
# and the ratios of the quantized bytes to ZeRO-3's, which docs/zero.md's formulas predict: qwZ
# gathers (1 + 4/2048)/4 of fp32's bytes, qgZ reduces (0.5 + 4/2048)/4 of them.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${DS_BUILD_DIR:-$REPO/build}"
MODEL=tiny BATCH=2 SEQ=128 STEPS=3 LOGS="$BUILD/bench_zeropp_logs"
COMMON='"stage3_max_reuse_distance": 0'
while [[ $# -gt 0 ]]; do
  case "$1" in
    --model) MODEL="$2"; shift 2 ;;
    --batch) BATCH="$2"; shift 2 ;;
    --seq) SEQ="$2"; shift 2 ;;
    --steps) STEPS="$2"; shift 2 ;;
    --logs) LOGS="$2"; shift 2 ;;
    --common) COMMON="$2"; shift 2 ;;
    *) echo "run_zeropp.sh: unknown flag $1" >&2; exit 2 ;;
  esac
done
cmake --build "$BUILD" -j2 --target bench_zero >/dev/null
mkdir -p "$LOGS"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
declare -a NAMES=(zero3 qwZ qgZ hpZ2 mics2 qwZ+qgZ+hpZ2)
declare -a EXTRA=('' '"zero_quantized_weights": true' '"zero_quantized_gradients": true'
  '"zero_hpz_partition_size": 2' '"mics_shard_size": 2'
  '"zero_quantized_weights": true, "zero_quantized_gradients": true, "zero_hpz_partition_size": 2')
printf "%-14s %9s %10s %12s %12s %12s %12s\n" config tokens/s states_MiB gather_MB rscatter_MB a2a_MB allred_MB
for i in "${!NAMES[@]}"; do
  log="$LOGS/${NAMES[$i]}.log"
  mpirun -np 4 --oversubscribe -x OMP_NUM_THREADS=1 "$BUILD/bench/bench_zero" --model "$MODEL" \
    --stage 3 --batch "$BATCH" --seq "$SEQ" --steps "$STEPS" --warmup 1 --comm_bytes \
    --zero_json "$COMMON${EXTRA[$i]:+, ${EXTRA[$i]}}" >"$log" 2>&1 || { echo "${NAMES[$i]} failed: see $log" >&2; exit 1; }
  mb() { awk -v op="$1" '$1=="COMM" && $2=="op="op {split($3,a,"="); printf "%.2f", a[2]/1e6; f=1} END {if (!f) printf "0"}' "$log"; }
  tps=$(awk '$1=="BENCH" {split($4,a,"="); print a[2]}' "$log")
  states=$(awk '$1=="MEM" {split($4,a,"="); print a[2]}' "$log")
  printf "%-14s %9s %10s %12s %12s %12s %12s\n" "${NAMES[$i]}" "$tps" "$states" "$(mb all_gather)" \
    "$(mb reduce_scatter)" "$(mb all_to_all)" "$(mb all_reduce)"
done

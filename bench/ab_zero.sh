#!/usr/bin/env bash
# Interleaved A/B of bench_zero between two source trees (each with its own Release build/), for
# "did this change slow the CPU path?" on a machine whose load drifts: rounds of A then B per stage,
# so drift hits both sides alike.
#
#   bench/ab_zero.sh BEFORE_TREE AFTER_TREE [--rounds 3] [--stages "3 2"] [--model tiny]
#
# Prints one line per run: round, stage, tree, and bench_zero's BENCH line (tokens_per_s,
# peak_rss_mib). Needs OpenMPI's mpirun and build/bench/bench_zero in both trees.
set -euo pipefail
A="${1:?usage: ab_zero.sh BEFORE_TREE AFTER_TREE [--rounds N] [--stages LIST] [--model M]}"
B="${2:?usage: ab_zero.sh BEFORE_TREE AFTER_TREE [--rounds N] [--stages LIST] [--model M]}"
shift 2
ROUNDS=3 STAGES="3 2" MODEL=tiny
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --stages) STAGES=$2; shift 2 ;;
    --model) MODEL=$2; shift 2 ;;
    *) echo "ab_zero.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
for tree in "$A" "$B"; do
  [[ -x "$tree/build/bench/bench_zero" ]] || {
    echo "ab_zero.sh: $tree/build/bench/bench_zero is missing: build it there first" >&2; exit 2; }
done
MPIRUN=(mpirun -np 2 --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1)
for round in $(seq 1 "$ROUNDS"); do
  for stage in $STAGES; do
    for tree in "$A" "$B"; do
      line=$("${MPIRUN[@]}" "$tree/build/bench/bench_zero" --model "$MODEL" --stage "$stage" \
               --batch 8 --seq 256 --steps 3 --warmup 1 --bucket 5000000 2>&1 | grep -a "^BENCH" | tail -1)
      echo "round $round stage $stage $tree $line"
    done
  done
done

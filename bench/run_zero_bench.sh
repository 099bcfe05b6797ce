#!/usr/bin/env bash
# ZeRO stages 0-3 on 2 ranks against PyTorch DDP (gloo) and ZeroRedundancyOptimizer, same model,
# batch and run; then the largest micro-batch under a fixed memory cap per rank.
#
#   bench/run_zero_bench.sh [--model tiny] [--batch 8] [--seq 256] [--steps 3] [--warmup 1]
#                           [--bucket 5000000] [--cap_mib M] [--cap_seq 64] [--cap_ddp_batch 2]
#                           [--max_batch 32] [--cap_batches "1 2 4 8"] [--no_cap]
#                           [--no_throughput] [--logs DIR]
#
# 1. Throughput: PyTorch DDP, PyTorch ZeRO-1 (bench/torch_ddp.py, Debian's python3-torch), then
#    bench_zero for stages 0-3 (mpirun -np 2, 1 thread per rank), then PyTorch DDP once more to
#    show how much the machine's load drifted during the run. Every bench_zero run ends with
#      BENCH zero stage=<s> tokens_per_s=<x> torch_ddp_tokens_per_s=<y> ratio=<x/y> peak_rss_mib=<m>
#    where y is the first PyTorch DDP measurement.
# 2. Memory cap: for our stages 0 (= DDP) to 3 and PyTorch's DDP and ZeRO-1, the largest
#    micro-batch (at --cap_seq tokens) whose peak RSS (VmHWM, largest rank) stays under the cap,
#    from short runs (1 warm-up + 1 timed step: every buffer, moment and stage-3 prefetch exists by
#    then). Without --cap_mib the cap is set so that our stage 0 fits exactly --cap_ddp_batch: the
#    midpoint of its peak RSS at that batch and the next. Search per configuration: batch 1, 2, ...
#    (or the --cap_batches list) up to the first one over the cap (peak RSS is not monotonic in the
#    batch: see largest()).
#
# Defaults ("tiny", 16.1M parameters) take 5-11 minutes on 2 busy cores. GPT-2 124M (the batch
# 4 x 64 of reference/machine.md's peers table; probes only the listed batches):
#   bench/run_zero_bench.sh --model gpt2-124m --batch 4 --seq 64 --cap_seq 64 \
#       --cap_batches "1 2 3 4 6 8 12 16 24 32" --logs build/bench_zero_logs_gpt2
# (about half an hour on 2 busy cores).
#
# All logs go to --logs (default build/bench_zero_logs). Needs build/ configured with MPI,
# OpenMPI's mpirun and /usr/bin/python3 with torch (Debian python3-torch).
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL=tiny BATCH=8 SEQ=256 STEPS=3 WARMUP=1 BUCKET=5000000
CAP_MIB="" CAP_SEQ=64 CAP_DDP_BATCH=2 MAX_BATCH=32 CAP_BATCHES="" DO_CAP=1 DO_TPUT=1 LOGS=build/bench_zero_logs
while [[ $# -gt 0 ]]; do
  case "$1" in
    --model) MODEL=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --seq) SEQ=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --bucket) BUCKET=$2; shift 2 ;;
    --cap_mib) CAP_MIB=$2; shift 2 ;;
    --cap_seq) CAP_SEQ=$2; shift 2 ;;
    --cap_ddp_batch) CAP_DDP_BATCH=$2; shift 2 ;;
    --max_batch) MAX_BATCH=$2; shift 2 ;;
    --cap_batches) CAP_BATCHES=$2; shift 2 ;;
    --no_cap) DO_CAP=0; shift ;;
    --no_throughput) DO_TPUT=0; shift ;;
    --logs) LOGS=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_zero_bench.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

PY=${PYTHON_TORCH:-/usr/bin/python3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN=(mpirun -np 2 --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1)
BIN=build/bench/bench_zero
mkdir -p "$LOGS"

# The OpenBLAS core deepspeed.cpp picks on this CPU (src/backend/cpu/blas.cpp), for PyTorch too.
flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
has() { [[ " $flags " == *" $1 "* ]]; }
if has avx512f && has avx512bw && has avx512vl; then
  if has avx512_bf16; then CORE=Cooperlake; else CORE=SkylakeX; fi
elif has avx2 && has fma; then CORE=Haswell
else CORE=""; fi
TORCH_ENV=(env OMP_NUM_THREADS=1)
[[ -n "$CORE" ]] && TORCH_ENV+=(OPENBLAS_CORETYPE="$CORE")

echo "== building bench_zero"
[[ -f build/CMakeCache.txt ]] || cmake -S . -B build >/dev/null
if ! cmake --build build --target bench_zero -- -j2 >"$LOGS/build.log" 2>&1; then
  # A new bench/cmake fragment needs a re-configure before the target exists.
  cmake -S . -B build >/dev/null && cmake --build build --target bench_zero -- -j2 >"$LOGS/build.log" 2>&1 \
    || { tail -30 "$LOGS/build.log"; exit 1; }
fi

field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" | tail -1; }  # value of " key=value" in a BENCH line

# run_ours STAGE BATCH SEQ STEPS WARMUP LOG [bench_zero args...] -> prints the BENCH line
run_ours() {
  local log=$6
  "${MPIRUN[@]}" "$BIN" --model "$MODEL" --stage "$1" --batch "$2" --seq "$3" --steps "$4" --warmup "$5" \
    --bucket "$BUCKET" --torch_tokens_per_s "${TORCH_TPS:-0}" "${@:7}" >"$log" 2>&1 || { echo "FAILED: see $log" >&2; tail -5 "$log" >&2; return 1; }
  grep '^BENCH zero' "$log" | tail -1
}
# run_torch MODE BATCH SEQ STEPS WARMUP LOG -> prints the BENCH line
run_torch() {
  local log=$6
  "${TORCH_ENV[@]}" "$PY" bench/torch_ddp.py --mode "$1" --model "$MODEL" --batch "$2" --seq "$3" \
    --steps "$4" --warmup "$5" >"$log" 2>&1 || { echo "FAILED: see $log" >&2; tail -5 "$log" >&2; return 1; }
  grep '^BENCH torch_ddp' "$log" | tail -1
}

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "model $MODEL, 2 ranks x 1 thread, micro-batch $BATCH x $SEQ, fp32 AdamW, OPENBLAS_CORETYPE for torch: ${CORE:-unset}"
T_START=$(date +%s)

if [[ $DO_TPUT == 1 ]]; then
  echo "== throughput: $WARMUP warm-up + $STEPS timed steps each"
  l=$(run_torch ddp "$BATCH" "$SEQ" "$STEPS" "$WARMUP" "$LOGS/torch_ddp.log"); echo "$l"
  TORCH_TPS=$(field tokens_per_s <<<"$l"); TORCH_RSS=$(field peak_rss_mib <<<"$l")
  TORCH_VER=$(field torch <<<"$l")
  l=$(run_torch zero1 "$BATCH" "$SEQ" "$STEPS" "$WARMUP" "$LOGS/torch_zero1.log"); echo "$l"
  Z1_TPS=$(field tokens_per_s <<<"$l"); Z1_RSS=$(field peak_rss_mib <<<"$l")
  declare -A TPS RSS STATES INUSE
  for s in 0 1 2 3; do
    l=$(run_ours "$s" "$BATCH" "$SEQ" "$STEPS" "$WARMUP" "$LOGS/zero_stage$s.log"); echo "$l"
    TPS[$s]=$(field tokens_per_s <<<"$l"); RSS[$s]=$(field peak_rss_mib <<<"$l")
    m=$(grep '^MEM zero' "$LOGS/zero_stage$s.log" | tail -1)
    STATES[$s]=$(field model_states_mib <<<"$m"); INUSE[$s]=$(field alloc_peak_in_use_mib <<<"$m")
  done
  l=$(run_torch ddp "$BATCH" "$SEQ" "$STEPS" "$WARMUP" "$LOGS/torch_ddp_again.log")
  TORCH_TPS2=$(field tokens_per_s <<<"$l")
  echo "PyTorch DDP again after our runs: $TORCH_TPS2 tokens/s (first: $TORCH_TPS; the difference is machine-load drift)"
  echo
  echo "| run | tokens/s | vs torch DDP | vs torch ZeRO-1 | peak RSS MiB (largest rank) | model states MiB per rank | allocator peak in use MiB |"
  echo "|---|---|---|---|---|---|---|"
  echo "| PyTorch $TORCH_VER DDP (gloo) | $TORCH_TPS | 1.00 | | $TORCH_RSS | | |"
  echo "| PyTorch $TORCH_VER ZeroRedundancyOptimizer | $Z1_TPS | $(awk -v a="$Z1_TPS" -v b="$TORCH_TPS" 'BEGIN{printf "%.2f", a/b}') | 1.00 | $Z1_RSS | | |"
  for s in 0 1 2 3; do
    echo "| deepspeed.cpp ZeRO-$s | ${TPS[$s]} | $(awk -v a="${TPS[$s]}" -v b="$TORCH_TPS" 'BEGIN{printf "%.2f", a/b}') | $(awk -v a="${TPS[$s]}" -v b="$Z1_TPS" 'BEGIN{printf "%.2f", a/b}') | ${RSS[$s]} | ${STATES[$s]} | ${INUSE[$s]} |"
  done
  echo
fi

if [[ $DO_CAP == 1 ]]; then
  declare -A CACHE  # "config:batch" -> peak RSS MiB
  # Functions below set globals (RSS_OUT, BEST_OUT) instead of printing: $(...) would run them in
  # a subshell and lose the cache.
  label() { case $1 in ddp) echo "PyTorch DDP";; zero1) echo "PyTorch ZeRO-1";; 0) echo "ZeRO-0 (DDP)";;
            3lean) echo "ZeRO-3, no prefetch/reuse";; *) echo "ZeRO-$1";; esac; }
  # 3lean: stage 3 with the memory-lean knobs a user under a cap would pick (DeepSpeed's default
  # stage3_prefetch_bucket_size of 5e7 elements is 40% of gpt2-124m, gathered ahead).
  LEAN=(--zero_json '"stage3_prefetch_bucket_size": 0, "stage3_max_reuse_distance": 0')
  # peak_rss CONFIG BATCH -> RSS_OUT. CONFIG is 0..3 or 3lean (ours) or ddp / zero1 (PyTorch)
  peak_rss() {
    local key="$1:$2" l
    if [[ -z "${CACHE[$key]:-}" ]]; then
      if [[ $1 == ddp || $1 == zero1 ]]; then
        l=$(run_torch "$1" "$2" "$CAP_SEQ" 1 1 "$LOGS/cap_torch_$1_b$2.log") || l="peak_rss_mib=999999"
      elif [[ $1 == 3lean ]]; then
        l=$(run_ours 3 "$2" "$CAP_SEQ" 1 1 "$LOGS/cap_stage$1_b$2.log" "${LEAN[@]}") || l="peak_rss_mib=999999"
      else
        l=$(run_ours "$1" "$2" "$CAP_SEQ" 1 1 "$LOGS/cap_stage$1_b$2.log") || l="peak_rss_mib=999999"
      fi
      CACHE[$key]=$(field peak_rss_mib <<<"$l")
      echo "   $(label "$1") batch $2: peak RSS ${CACHE[$key]} MiB"
    fi
    RSS_OUT=${CACHE[$key]}
  }
  fits() { peak_rss "$1" "$2"; awk -v r="$RSS_OUT" -v c="$CAP_MIB" 'BEGIN{exit !(r <= c)}'; }
  # largest CONFIG -> BEST_OUT: the largest b <= MAX_BATCH such that every micro-batch 1..b stays
  # under the cap (what a user raising the batch one by one finds). A linear scan, not a bisection:
  # peak RSS need not be monotonic in the batch (how well the caching allocator reuses freed blocks
  # depends on the sizes, so some batch sizes happen to reuse more than others).
  # With --cap_batches "1 2 4 8 ..." only those batches are probed (for big models).
  largest() {
    local b best=0
    for b in ${CAP_BATCHES:-$(seq 1 "$MAX_BATCH")}; do
      fits "$1" "$b" || break
      best=$b
    done
    BEST_OUT=$best
  }
  next_batch() {  # the probed batch after $1 (empty if none)
    local b
    for b in ${CAP_BATCHES:-$(seq 1 "$MAX_BATCH")}; do (( b > $1 )) && { echo "$b"; return; }; done
    return 0
  }

  echo "== largest micro-batch under a memory cap per rank (seq $CAP_SEQ, 2 ranks, 1 warm-up + 1 step per probe)"
  if [[ -z "$CAP_MIB" ]]; then
    peak_rss 0 "$CAP_DDP_BATCH"; a=$RSS_OUT; peak_rss 0 $((CAP_DDP_BATCH + 1)); b=$RSS_OUT
    CAP_MIB=$(awk -v a="$a" -v b="$b" 'BEGIN{printf "%.0f", (a+b)/2}')
    echo "cap: $CAP_MIB MiB per rank (midway between our stage 0's peak RSS at batch $CAP_DDP_BATCH and $((CAP_DDP_BATCH + 1)))"
  else
    echo "cap: $CAP_MIB MiB per rank (--cap_mib)"
  fi
  declare -A BEST
  for c in 0 1 2 3 3lean ddp zero1; do
    largest "$c"; BEST[$c]=$BEST_OUT
    echo "$(label "$c") fits micro-batch ${BEST[$c]}"
  done
  echo
  echo "| $MODEL, seq $CAP_SEQ, cap $CAP_MIB MiB per rank | largest micro-batch | its peak RSS MiB | next probed batch's peak RSS MiB | allocator peak in use / reserved MiB at that batch |"
  echo "|---|---|---|---|---|"
  for c in ddp zero1 0 1 2 3 3lean; do
    b=${BEST[$c]} r="" r2="" al=""
    if (( b > 0 )); then peak_rss "$c" "$b" >/dev/null; r=$RSS_OUT; fi
    nb=$(next_batch "$b"); if [[ -n "$nb" ]]; then peak_rss "$c" "$nb" >/dev/null; r2="$RSS_OUT (batch $nb)"; fi
    if (( b > 0 )) && [[ $c != ddp && $c != zero1 ]]; then
      al=$(awk '/^MEM zero/ {for (i = 1; i <= NF; ++i) {split($i, kv, "="); m[kv[1]] = kv[2]}
                              printf "%s / %s", m["alloc_peak_in_use_mib"], m["alloc_reserved_mib"]}' \
             "$LOGS/cap_stage${c}_b$b.log")
    fi
    echo "| $(label "$c") | $b | $r | $r2 | $al |"
  done
  summary="DDP fits batch ${BEST[0]}"
  for s in 1 2 3; do summary+=", ZeRO-$s fits ${BEST[$s]}"; done
  summary+=" (${BEST[3lean]} without prefetch/reuse)"
  echo "$summary (PyTorch DDP fits ${BEST[ddp]}, PyTorch ZeRO-1 fits ${BEST[zero1]})"
fi
echo "total time: $(( $(date +%s) - T_START )) s"

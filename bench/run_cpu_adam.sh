#!/usr/bin/env bash
# CPU Adam(W) step: ours (bench_adam, ds::optim::adam_update) against DeepSpeed's DeepSpeedCPUAdam
# and torch.optim.AdamW (bench/cpu_adam_peer.py), per n, in one sitting: for each n, ours runs,
# then each peer, one process and one implementation at a time (500M fp32 Adam needs ~8 GB each);
# with ROUNDS=R that sequence is repeated R times per n, and each implementation's best (lowest)
# median over the rounds is summarised, so a burst of other load on this small machine hits one
# round of one implementation rather than deciding a comparison.
# bench_adam also measures a STREAM triad in the same process: the memory-bandwidth bound.
#
#   bash bench/run_cpu_adam.sh
#
# Environment:
#   DS_BUILD_DIR   build directory holding bench/bench_adam (default: build, relative to the repo)
#   SKIP_BUILD=1   do not run `cmake --build $DS_BUILD_DIR --target bench_adam` first
#   PYTHON_TORCH   interpreter with torch (+ deepspeed) (default /tmp/dsvenv/bin/python);
#                  if it is missing, only ours runs
#   NS             parameter counts (default "50000000 100000000 250000000 500000000")
#   THREADS        threads for all implementations (default 2; OMP_NUM_THREADS is set to it)
#   REPS           timed steps per measurement, median reported (default 5; plus one warm-up)
#   ROUNDS         rounds of (ours, peers) per n (default 1); summary = best median over rounds,
#                  triad = best triad over rounds
#   PEER_IMPLS     default deepspeed,deepspeed_copy16,deepspeed_bf16,torch_foreach,torch_fused
#   PEER_THP       THP_MEM_ALLOC_ENABLE for the peers (default 1: torch's big buffers then get
#                  transparent huge pages, as bench_adam's allocator does with MADV_HUGEPAGE)
#
# Output: the raw BENCH lines of both sides, then per n
#   BENCH cpu_adam_vs n=<n> ours_ms=<a> deepspeed_ms=<b> torch_ms=<c> ours_vs_deepspeed=<b/a>
#         ours_vs_torch=<c/a> fraction_of_triad=<ours GB/s / triad GB/s> torch_impl=<faster torch>
#         rounds=<R>
#   BENCH cpu_adam_bound n=<n> triad_gbps=<t> adam_bound_ms=<28n/t> ours_fraction=..
#         deepspeed_fraction=.. torch_fraction=..
#   BENCH cpu_adam_vs_bf16 n=<n> ours_ms=<fused bf16 write> deepspeed_copy16_ms=<step + copy_>
#         ours_vs_deepspeed_copy16=<ratio> deepspeed_bf16_ms=<bf16 params, fp32 states>
# (ratios > 1: ours is faster). NA where a side did not run.
set -u -o pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
build="${DS_BUILD_DIR:-build}"
py="${PYTHON_TORCH:-/tmp/dsvenv/bin/python}"
ns="${NS:-50000000 100000000 250000000 500000000}"
threads="${THREADS:-2}"
reps="${REPS:-5}"
rounds="${ROUNDS:-1}"
impls="${PEER_IMPLS:-deepspeed,deepspeed_copy16,deepspeed_bf16,torch_foreach,torch_fused}"
export OMP_NUM_THREADS="$threads"

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  if [ ! -f "$build/CMakeCache.txt" ]; then
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null || exit 1
  fi
  cmake --build "$build" --target bench_adam -j2 >/dev/null || { echo "bench_adam build failed" >&2; exit 1; }
fi
ours="$build/bench/bench_adam"
[ -x "$ours" ] || { echo "no $ours (build target bench_adam)" >&2; exit 1; }

have_py=1
if ! [ -x "$py" ] && ! command -v "$py" >/dev/null 2>&1; then
  have_py=0
elif ! "$py" -c "import torch" >/dev/null 2>&1; then
  have_py=0
fi

echo "# run_cpu_adam.sh $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
echo "# cpu: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1), $(nproc) cpus," \
  "$(grep -qw avx512f /proc/cpuinfo && echo AVX-512 || echo 'no AVX-512')," \
  "$(grep -qw avx2 /proc/cpuinfo && echo AVX2 || echo 'no AVX2')"
echo "# threads=$threads reps=$reps rounds=$rounds ns=[$ns] ours=$ours"
echo "# load before: $(uptime)"
if [ "$have_py" = 1 ]; then
  echo "# peers: $py impls=$impls THP_MEM_ALLOC_ENABLE=${PEER_THP:-1}"
  if ! grep -qw avx512f /proc/cpuinfo && [[ ",$impls," == *,deepspeed_bf16,* ]]; then
    echo "# deepspeed_bf16: no AVX-512 here, so DeepSpeed's cpu_adam (built with __AVX256__) runs" \
      "bf16 params through its scalar fallback loop, not its SIMD path"
  fi
else
  echo "# PYTHON_TORCH=$py is missing (or has no torch): running ours only, no DeepSpeed/torch numbers"
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# field <file> <line-prefix regex> <key> [max]: the smallest (largest with "max") value of key=
# over the matching lines (one per round); empty when there is none
field() {
  awk -v pre="$2" -v key="$3" -v want="${4:-min}" '$0 ~ "^" pre {
      for (i = 1; i <= NF; i++) if (index($i, key "=") == 1) {
        v = substr($i, length(key) + 2) + 0
        if (!seen || (want == "max" ? v > best : v < best)) { best = v; s = substr($i, length(key) + 2) }
        seen = 1 } }
    END { if (seen) print s }' "$1"
}
# ratio a b: b/a with 2 decimals, NA when either is missing
ratio() { if [ -n "$1" ] && [ -n "$2" ]; then awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b / a }'; else echo NA; fi; }
na() { if [ -n "$1" ]; then echo "$1"; else echo NA; fi; }

summary=()
for n in $ns; do
  o="$tmp/ours_$n" p="$tmp/peer_$n"
  : >"$o"
  : >"$p"
  for ((r = 1; r <= rounds; r++)); do
    [ "$rounds" -gt 1 ] && echo "# n=$n round $r/$rounds, load: $(cut -d' ' -f1-3 /proc/loadavg)"
    "$ours" --n "$n" --threads "$threads" --reps "$reps" --adam-only 1 2>&1 | tee -a "$o"
    if [ "$have_py" = 1 ]; then
      # one implementation per process: each frees all of its ~8 GB (500M) before the next starts
      for impl in ${impls//,/ }; do
        THP_MEM_ALLOC_ENABLE="${PEER_THP:-1}" "$py" bench/cpu_adam_peer.py --n "$n" --impls "$impl" \
          --threads "$threads" --reps "$reps" 2>&1 |
          grep -v -e 'real_accelerator.py' -e 'No CUDA runtime is found' -e '^# torch ' \
            -e '^# deepspeed [0-9]' -e '^# deepspeed_bf16: no AVX-512' | tee -a "$p"
      done
    fi
  done

  a=$(field "$o" "BENCH adam " ms)
  triad=$(field "$o" "BENCH adam " triad_gbytes_per_s max)
  frac=""
  if [ -n "$a" ] && [ -n "$triad" ]; then
    frac=$(awk -v n="$n" -v ms="$a" -v t="$triad" 'BEGIN { printf "%.3f", 28 * n / ms / 1e6 / t }')
  fi
  a16=$(field "$o" "BENCH adam_out16_bf16 " ms)
  b=$(field "$p" "BENCH cpu_adam impl=deepspeed " ms)
  b16c=$(field "$p" "BENCH cpu_adam impl=deepspeed_copy16 " ms)
  b16=$(field "$p" "BENCH cpu_adam impl=deepspeed_bf16 " ms)
  tfe=$(field "$p" "BENCH cpu_adam impl=torch_foreach " ms)
  tfu=$(field "$p" "BENCH cpu_adam impl=torch_fused " ms)
  c="" cimpl=NA
  if [ -n "$tfu" ]; then c=$tfu cimpl=torch_fused; fi
  if [ -n "$tfe" ] && { [ -z "$c" ] || awk -v x="$tfe" -v y="$c" 'BEGIN { exit !(x < y) }'; }; then
    c=$tfe cimpl=torch_foreach
  fi
  fr() { if [ -n "$1" ] && [ -n "$triad" ]; then awk -v n="$n" -v ms="$1" -v t="$triad" 'BEGIN { printf "%.3f", 28 * n / ms / 1e6 / t }'; else echo NA; fi; }
  bound=$(awk -v n="$n" -v t="$triad" 'BEGIN { printf "%.2f", 28 * n / t / 1e6 }')
  summary+=("BENCH cpu_adam_vs n=$n ours_ms=$(na "$a") deepspeed_ms=$(na "$b") torch_ms=$(na "$c") ours_vs_deepspeed=$(ratio "$a" "$b") ours_vs_torch=$(ratio "$a" "$c") fraction_of_triad=$(na "$frac") torch_impl=$cimpl rounds=$rounds")
  summary+=("BENCH cpu_adam_bound n=$n triad_gbps=$(na "$triad") adam_bound_ms=$bound ours_fraction=$(na "$frac") deepspeed_fraction=$(fr "$b") torch_fraction=$(fr "$c")")
  summary+=("BENCH cpu_adam_vs_bf16 n=$n ours_ms=$(na "$a16") deepspeed_copy16_ms=$(na "$b16c") ours_vs_deepspeed_copy16=$(ratio "$a16" "$b16c") deepspeed_bf16_ms=$(na "$b16")")
done

echo "# load after: $(uptime)"
echo "# summary (ratios > 1: ours is faster)"
printf '%s\n' "${summary[@]}"

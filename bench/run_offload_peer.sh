#!/usr/bin/env bash
# Peer of bench/run_offload.sh: real DeepSpeed (PyPI 0.19.x, CPU accelerator, one process) trains
# the same GPT-2-layout model with ZeRO-3 and the optimizer state and the parameters on NVMe
# (ZeRO-Infinity), through bench/ds_offload_peer.py (same config as build/bench/bench_offload).
#
#   bash bench/run_offload_peer.sh [--offload nvme|cpu|both] [any ds_offload_peer.py option ...]
#
# Shape defaults (override by env or by passing the option, which wins):
#   LAYERS=4 EMBD=1024 HEADS=16 VOCAB=50257 SEQ=128 BATCH=1 STEPS=3 OFFLOAD=nvme
# --offload both (or OFFLOAD=both) runs nvme and then the cpu-offload fallback (ZeRO-Offload,
# offload device "cpu" for both), one BENCH line each.
# Swap folder: $DS_NVME_PATH/ds_peer_swap.<pid> (default $DS_BUILD_DIR or build/, then
# .../offload_peer_nvme), removed on exit. Python: $DS_VENV/bin/python (default /tmp/dsvenv; made
# with `python3 -m venv /tmp/dsvenv && /tmp/dsvenv/bin/pip install torch deepspeed transformers`).
# The NVMe path JIT-compiles DeepSpeed's async_io op, which needs libaio-dev
# (`apt-get install -y libaio-dev`); the first run builds cpu_adam / async_io / shm_comm into
# ~/.cache/torch_extensions (minutes on 2 cores; not part of the reported init_s after that).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${DS_VENV:-/tmp/dsvenv}"
PY="$VENV/bin/python"
[[ -x "$PY" ]] || { echo "run_offload_peer.sh: $PY missing (python3 -m venv $VENV && $VENV/bin/pip install torch deepspeed transformers)" >&2; exit 1; }

offload="${OFFLOAD:-nvme}"
args=()
shape=(--layers "${LAYERS:-4}" --embd "${EMBD:-1024}" --heads "${HEADS:-16}" --vocab "${VOCAB:-50257}"
       --seq "${SEQ:-128}" --batch "${BATCH:-1}" --steps "${STEPS:-3}")
while [[ $# -gt 0 ]]; do
  case "$1" in
    --offload) offload="$2"; shift 2 ;;
    --nvme) DS_NVME_PATH="$2"; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
case "$offload" in
  nvme|cpu) modes=("$offload") ;;
  both) modes=(nvme cpu) ;;
  *) echo "run_offload_peer.sh: --offload must be nvme, cpu or both" >&2; exit 2 ;;
esac

base="${DS_NVME_PATH:-${DS_BUILD_DIR:-build}/offload_peer_nvme}"
swap="$base/ds_peer_swap.$$"
mkdir -p "$swap"
trap 'rm -rf "$swap"; rmdir "$base" 2>/dev/null || true' EXIT

if [[ " ${modes[*]} " == *" nvme "* ]]; then
  if ! "$PY" -c "from deepspeed.ops.op_builder import AsyncIOBuilder as B; import sys; sys.exit(0 if B().is_compatible() else 1)" >/dev/null 2>&1; then
    echo "run_offload_peer.sh: DeepSpeed's async_io op is not compatible here (libaio-dev missing? apt-get install -y libaio-dev)" >&2
    exit 1
  fi
fi

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB RAM"
echo "swap path: $swap ($(df -h "$swap" | awk 'NR==2{print $4 " free on " $1}'), $(stat -f -c %T "$swap"))"

benches=()
for m in "${modes[@]}"; do
  log="$swap/peer_$m.log"
  # Later options win in argparse, so explicit args override the env/default shape.
  set +e
  DS_ACCELERATOR=cpu MASTER_ADDR=127.0.0.1 MASTER_PORT="${MASTER_PORT:-29511}" RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 \
    "$PY" bench/ds_offload_peer.py "${shape[@]}" --offload "$m" --nvme "$swap/$m" "${args[@]}" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  set -e
  if [[ $rc -ne 0 ]]; then
    echo "run_offload_peer.sh: offload=$m failed (exit $rc); last lines:" >&2
    tail -n 15 "$log" >&2
  fi
  b=$(grep '^BENCH ' "$log" || true)
  [[ -n "$b" ]] && benches+=("$b")
  rm -rf "$swap/$m"
done
echo "---"
printf '%s\n' "${benches[@]}"
[[ ${#benches[@]} -eq ${#modes[@]} ]]

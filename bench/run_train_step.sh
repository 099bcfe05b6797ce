#!/usr/bin/env bash
# One training step of GPT-2 124M (batch 8 x 256, AdamW, 2 threads): deepspeed.cpp and PyTorch in
# the same run, each against the sgemm peak measured by bench_train_step.
#
#   bash bench/run_train_step.sh [--model gpt2-124m] [--steps 3]
#
# PyTorch is Debian's python3-torch 1.13 (scripts/setup.sh --with-torch), run with the OpenBLAS core
# type our engine picks for this CPU, so both use the same GEMM kernels. PYTHON_TORCH=/path/to/python
# selects another PyTorch, e.g. 2.x from PyPI in a virtual environment (its own MKL/oneDNN kernels;
# OPENBLAS_CORETYPE does not concern it):
#   python3 -m venv /tmp/torch2 && /tmp/torch2/bin/pip install torch
#   PYTHON_TORCH=/tmp/torch2/bin/python bash bench/run_train_step.sh
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${DS_BUILD_DIR:-$REPO/build}"
MODEL=gpt2-124m
STEPS=3
while [[ $# -gt 0 ]]; do
  case "$1" in
    --model) MODEL="$2"; shift 2 ;;
    --steps) STEPS="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
cmake --build "$BUILD_DIR" --target bench_train_step >/dev/null
if grep -q avx512f /proc/cpuinfo; then core=SkylakeX; else core=Haswell; fi
OMP_NUM_THREADS=2 "$BUILD_DIR/bench/bench_train_step" --model "$MODEL" --steps "$STEPS" --threads 2 |
  tee /tmp/ds_train_step.txt
ours=$(sed -n 's/.*BENCH train_step.*tokens_per_s=\([0-9.]*\).*/\1/p' /tmp/ds_train_step.txt)
PY=${PYTHON_TORCH:-/usr/bin/python3}
torch_line=$(OPENBLAS_CORETYPE=$core OMP_NUM_THREADS=2 "$PY" "$REPO/bench/torch_train_step.py" \
  --model "$MODEL" --steps "$STEPS" --threads 2 | tee /dev/stderr | grep '^BENCH')
theirs=$(sed -n 's/.*tokens_per_s=\([0-9.]*\).*/\1/p' <<<"$torch_line")
torch_ver=$("$PY" -c 'import torch; print(torch.__version__)')
echo "BENCH train_step_vs_torch model=$MODEL ours_tokens_per_s=$ours torch_tokens_per_s=$theirs ratio=$(python3 -c "print(f'{$ours/$theirs:.2f}')") openblas_core=$core torch=$torch_ver"

#!/usr/bin/env bash
# One training step of GPT-2 124M (batch 8 x 256, AdamW, 2 threads): deepspeed.cpp and PyTorch in
# the same run, each against the sgemm peak measured by bench_train_step.
#
#   bash bench/run_train_step.sh [--model gpt2-124m] [--steps 3]
#   PYTHON_TORCH=/path/to/venv/python bash bench/run_train_step.sh --dtype bf16
#
# --dtype bf16: our engine's bf16 step (bench_train_step --dtype bf16: bf16 parameters and
# activations, fp32 master weights) against transformers' GPT2LMHeadModel (SDPA) under
# torch.autocast("cpu", bfloat16) (bench/torch_hf_gpt2_step.py), each with its own bf16 GEMM
# peak measured in the same run; needs a PyTorch 2.x with transformers (PYTHON_TORCH).
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
DTYPE=fp32
while [[ $# -gt 0 ]]; do
  case "$1" in
    --model) MODEL="$2"; shift 2 ;;
    --steps) STEPS="$2"; shift 2 ;;
    --dtype) DTYPE="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
cmake --build "$BUILD_DIR" --target bench_train_step >/dev/null
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-); flags:$(grep -m1 '^flags' /proc/cpuinfo | grep -o -w -E 'avx2|avx512f|avx512_bf16|amx_bf16|amx_tile' | tr '\n' ' ')"
if [[ "$DTYPE" == bf16 ]]; then
  PY=${PYTHON_TORCH:-python3}
  OMP_NUM_THREADS=2 "$BUILD_DIR/bench/bench_train_step" --model "$MODEL" --steps "$STEPS" \
    --threads 2 --dtype bf16 | tee /tmp/ds_train_step_bf16.txt
  ours=$(sed -n 's/.*BENCH train_step.*tokens_per_s=\([0-9.]*\).*/\1/p' /tmp/ds_train_step_bf16.txt)
  our_rss=$(sed -n 's/.*BENCH train_step.*peak_rss_mib=\([0-9.]*\).*/\1/p' /tmp/ds_train_step_bf16.txt)
  torch_line=$(OMP_NUM_THREADS=2 "$PY" "$REPO/bench/torch_hf_gpt2_step.py" --dtype bf16 \
    --steps "$STEPS" --threads 2 | tee /dev/stderr | grep '^BENCH')
  theirs=$(sed -n 's/.*tokens_per_s=\([0-9.]*\).*/\1/p' <<<"$torch_line")
  their_rss=$(sed -n 's/.*peak_rss_mib=\([0-9.]*\).*/\1/p' <<<"$torch_line")
  echo "BENCH train_step_vs_torch dtype=bf16 model=$MODEL ours_tokens_per_s=$ours torch_autocast_tokens_per_s=$theirs ratio=$(python3 -c "print(f'{$ours/$theirs:.2f}')") ours_peak_rss_mib=$our_rss torch_peak_rss_mib=$their_rss"
  exit 0
fi
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

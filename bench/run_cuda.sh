#!/usr/bin/env bash
# The CUDA backend against PyTorch on the same GPU, in one run: bench_cuda (GEMM rates, attention
# forward/backward, GPT-2 124M forward+backward and a training step with AdamW on the GPU) and
# bench/torch_cuda_step.py (the same work in PyTorch, eager and with TORCH_COMPILE=1 also
# torch.compile). Results: bench/RESULTS.md, "CUDA backend".
#
#   bash bench/run_cuda.sh [BUILD_DIR]      # default build-cuda (cmake -DDS_WITH_CUDA=ON)
#
# On a GPU machine without this project's build dependencies (the device machine of docs/cuda.md),
# build elsewhere and run `bash scripts/cuda_pack.sh BUILD_DIR DIR` then
# `bash scripts/cuda_device_check.sh DIR` there instead: it runs the same two programs.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$REPO/build-cuda}"
"$BUILD/bench/bench_cuda" --batch 8 --seq 1024 --steps 5
python3 "$REPO/bench/torch_cuda_step.py" --batch 8 --seq 1024 --steps 5 ${TORCH_COMPILE:+--compile}

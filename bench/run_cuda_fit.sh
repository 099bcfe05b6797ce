#!/usr/bin/env bash
# GPT-2 XL (1.5B) on one GPU capped at 24 GiB, as the Accelerate guide trains it on a 24 GB card:
# ds_train --device cuda (ZeRO-Offload: 16-bit weights and gradients on the GPU, fp32 master
# weights and Adam moments in pinned host memory, our CPU AdamW, copies overlapped chunk by chunk)
# against PyTorch alone (everything on the GPU: the guide's "plain data parallel") and real
# DeepSpeed ZeRO-2 + offload_optimizer cpu, in the same call on the same GPU
# (bench/torch_cuda_fit.py). Records go to bench/RESULTS.md "CUDA backend".
#
#   bash bench/run_cuda_fit.sh DIR [LIMIT_GIB] [BATCH] [ours|peers|deepspeed|all]
#
# DIR: scripts/cuda_pack.sh's output with a prepared corpus in DIR/sotu (GPT-2 vocabulary).
# DeepSpeed must be importable (the device machine gets it as carried wheels: docs/cuda.md).
set -uo pipefail
DIR="$(cd "${1:?usage: run_cuda_fit.sh DIR [LIMIT_GIB] [BATCH]}" && pwd)"
LIMIT="${2:-24}"
BATCH="${3:-8}"
PART="${4:-all}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOGS="${OUT:-$DIR/logs}"
mkdir -p "$LOGS"
# The packed libraries, and cuBLAS from the machine's toolkit (scripts/cuda_device_check.sh finds
# it elsewhere when the toolkit is not at /usr/local/cuda).
export LD_LIBRARY_PATH="$DIR/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true

if [[ "$PART" == ours || "$PART" == all ]]; then
# OURS_CONFIGS: the DeepSpeed configs to run ds_train with (default: ZeRO-2 + offload_optimizer cpu,
# fp32 gradients; bench/cuda/gpt2xl_offload_bf16grads.json keeps bf16 gradients as DeepSpeed does;
# bench/cuda/gpt2xl_offload_timed.json prints the fwd/bwd/step breakdown each step).
for cfg in ${OURS_CONFIGS:-bench/cuda/gpt2xl_offload.json}; do
  echo "=== ds_train --device cuda gpt2-xl, $cfg, limit ${LIMIT} GiB, batch ${BATCH}x1024"
  rm -rf /dev/shm/ds_fit_run  # the final checkpoint (21 GB) in memory: no disk time
  timeout 300 "$DIR/bin/ds_train" --device cuda --device_memory_limit "$LIMIT" --model gpt2-xl \
    --deepspeed "$REPO/$cfg" --train_data "$DIR/sotu" \
    --output_dir /dev/shm/ds_fit_run --block_size 1024 --per_device_train_batch_size "$BATCH" \
    --gradient_checkpointing --max_steps 6 --learning_rate 1e-4 --warmup_steps 0 --export_hf none \
    --sample_tokens 0 --eval_steps 1000 --eval_batches 1 --logging_steps 1 --save_steps 0 \
    --skip_memory_check 2>&1 | tee "$LOGS/ds_train_fit_$(basename "$cfg" .json).log" |
    grep -E "device|model:|step .*/|rror|memory|time \(ms\)|done" | head -n 30
  rm -rf /dev/shm/ds_fit_run
done
fi
[[ "$PART" == ours ]] && exit 0

run_peer() {  # run_peer MODE LIMIT
  echo "=== torch_cuda_fit --mode $1 --limit_gib $2"
  # DeepSpeed's op builder reads TORCH_CUDA_ARCH_LIST as digits ("9.0a" fails): name plain 9.0.
  (unset LD_LIBRARY_PATH; export TORCH_CUDA_ARCH_LIST=9.0; timeout 400 python3 "$REPO/bench/torch_cuda_fit.py" --mode "$1" \
    --limit_gib "$2" --batch "$BATCH" --steps 4) 2>&1 | tee "$LOGS/torch_fit_$1_$2.log" |
    grep -E "BENCH|out of memory|rror" | head -n 10
}
[[ "$PART" != deepspeed ]] && run_peer plain "$LIMIT"
[[ "$PART" != deepspeed ]] && run_peer plain 0
run_peer deepspeed "$LIMIT"

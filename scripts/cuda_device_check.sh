#!/usr/bin/env bash
# The CUDA backend's checks on a GPU machine, from binaries built elsewhere:
#
#   bash scripts/cuda_device_check.sh DIR [quick|train|full]
#
# DIR holds bin/ (test_ops, test_gradcheck_basic, test_gradcheck_nn, test_parity, test_core,
# test_engine, test_trainer, test_zero, test_tensor_parallel, ds_train, bench_cuda from a -DDS_WITH_CUDA=ON build) and lib/ (the shared libraries they
# need that the GPU machine may lack; scripts/cuda_pack.sh makes both). Runs every op test and gradient check on
# cuda:0, the GPU parity fixtures, the engine on a GPU, then bench_cuda beside PyTorch on the same GPU
# (bench/torch_cuda_step.py). `quick`: the tests only; `train`: the tests and ds_train; `full`
# (default): everything. Logs go to $OUT when set (the device tool), else
# to DIR/logs. Exit status: the number of failed test binaries.
set -uo pipefail
DIR="$(cd "${1:?usage: cuda_device_check.sh DIR [quick|train|full]}" && pwd)"
MODE="${2:-full}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOGS="${OUT:-$DIR/logs}"
mkdir -p "$LOGS"

# cuBLAS: the machine's own (the CUDA toolkit's, or the one PyTorch's wheels carry).
cublas_dir=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
  /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib \
  /opt/torch/.venv/lib/python3*/site-packages/nvidia/cublas/lib; do
  if ls "$d"/libcublasLt.so.13* >/dev/null 2>&1; then cublas_dir="$d"; break; fi
done
if [[ -z "$cublas_dir" ]]; then
  f="$(find / -xdev -name 'libcublasLt.so.13*' 2>/dev/null | head -n 1)"
  cublas_dir="$(dirname "${f:-/nonexistent/x}")"
fi
echo "cublas: $cublas_dir"
export LD_LIBRARY_PATH="$DIR/lib:$cublas_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader || true

# The test binaries look for their fixtures where they were built (DS_FIXTURE_DIR is absolute):
# cuda_pack.sh wrote that path to DIR/built_at; link it to this checkout.
build_root="$(cat "$DIR/built_at" 2>/dev/null || true)"
if [[ -n "$build_root" && ! -e "$build_root/tests/fixtures" && "$build_root" != "$REPO" ]]; then
  mkdir -p "$(dirname "$build_root")" && ln -sfn "$REPO" "$build_root"
fi

failed=0
run_test() {  # run_test NAME FILTER
  local name="$1" filter="$2"
  echo "=== $name ($filter)"
  (cd "$REPO" && timeout 300 "$DIR/bin/$name" --gtest_filter="$filter" --gtest_color=no) \
    >"$LOGS/$name.log" 2>&1
  local rc=$?
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|tests ran|parity\]" "$LOGS/$name.log" |
    head -n 40
  if [[ $rc != 0 ]]; then
    failed=$((failed + 1))
    echo "--- $name exit $rc; first failures:"
    grep -B2 -A12 -m 6 "Failure\|what()\|error" "$LOGS/$name.log" | head -n 80
  fi
}
run_test test_core 'Backend*:Allocator*'
run_test test_ops '*cuda*'
run_test test_gradcheck_basic '*cuda*'
run_test test_gradcheck_nn '*cuda*'
run_test test_parity '*OnGpu*'
run_test test_engine '*OnGpu*'
run_test test_trainer '*OnGpu*'
# The model on the GPU under ZeRO 0-3 (stage 3: host shards, device buffers; also on NVMe) and
# tensor parallelism, against the host (one process here: no mpirun on the device machine).
run_test test_zero '*OnADevice*'
run_test test_tensor_parallel '*OnADevice*'

# ds_train --device cuda: GPT-2 124M on a prepared corpus (DIR/sotu: ds_prepare's output), when
# packed. fp32, then bf16.
if [[ -f "$DIR/sotu/meta.json" && "$MODE" != quick ]]; then
  for prec in "" --bf16; do
    echo "=== ds_train --device cuda ${prec:-(fp32)}"
    rm -rf /tmp/ds_gpu_run
    timeout 240 "$DIR/bin/ds_train" --device cuda --model gpt2-124m --train_data "$DIR/sotu" \
      --output_dir /tmp/ds_gpu_run --block_size 1024 --per_device_train_batch_size 8 \
      --max_steps 40 --learning_rate 6e-4 --warmup_steps 10 --export_hf none --sample_tokens 0 \
      --eval_steps 20 --eval_batches 4 --logging_steps 10 $prec 2>&1 |
      tee "$LOGS/ds_train${prec:+_bf16}.log" | grep -E "device|step .*/|eval loss|done|rror|memory" | head -n 20
  done
fi

if [[ "$MODE" == full ]]; then
  echo "=== bench_cuda"
  timeout 240 "$DIR/bin/bench_cuda" --batch 8 --seq 1024 --steps 5 2>&1 | tee "$LOGS/bench_cuda.log" |
    grep -E "BENCH|GEMM path|step|rror" | head -n 20
  echo "=== torch (same GPU)"
  (unset LD_LIBRARY_PATH; timeout 300 python3 "$REPO/bench/torch_cuda_step.py" --batch 8 \
    --seq 1024 --steps 5 ${TORCH_COMPILE:+--compile}) 2>&1 | tee "$LOGS/torch_cuda.log" |
    grep -E "BENCH|torch |rror" | head -n 20
fi
echo "failed test binaries: $failed"
exit "$failed"

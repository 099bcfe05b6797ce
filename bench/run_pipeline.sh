#!/usr/bin/env bash
# The pipeline benchmarks in one sitting (bench/RESULTS.md, "Pipeline parallelism"):
#   1. build/bench/bench_pipeline on 2 ranks (pp = 2): the bubble against (p-1)/(m+p-1) for
#      m = 1, 4, 8, 16, and tokens/s and peak RSS at m = 8;
#   2. real DeepSpeed's PipelineModule on the same model and m = 8 (bench/ds_pipeline_peer.py,
#      gloo on CPU, 2 ranks), when the venv is there.
# One thread per rank on both sides. Shape: LAYERS=8 EMBD=256 HEADS=4 VOCAB=512 SEQ=128 BATCH=2.
#
#   bash bench/run_pipeline.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${DS_BUILD_DIR:-build}"
shape=(--layers "${LAYERS:-8}" --embd "${EMBD:-256}" --heads "${HEADS:-4}" --vocab "${VOCAB:-512}"
       --seq "${SEQ:-128}" --batch "${BATCH:-2}")
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun -np 2 --oversubscribe -x OMP_NUM_THREADS "$BUILD/bench/bench_pipeline" "${shape[@]}" --steps "${STEPS:-3}"
PY="${DS_VENV:-/tmp/dsvenv}/bin/python"
if [[ -x "$PY" ]]; then
  DS_ACCELERATOR=cpu "$PY" -m torch.distributed.run --nproc_per_node 2 bench/ds_pipeline_peer.py \
    "${shape[@]}" --micro_batches 8 --steps "${STEPS:-3}" 2>&1 | grep '^BENCH'
else
  echo "run_pipeline.sh: $PY missing: no DeepSpeed peer (python3 -m venv /tmp/dsvenv && /tmp/dsvenv/bin/pip install torch deepspeed)"
fi

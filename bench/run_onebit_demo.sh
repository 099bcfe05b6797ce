#!/bin/bash
# The demo corpus (scripts/run_demo.sh's model and flags) trained on N ranks with AdamW and with
# OneBitAdam (freeze_step as given), for comparing their losses (bench/RESULTS.md, "1-bit optimizers").
#
#   bash bench/run_onebit_demo.sh [ranks 2] [steps 200] [freeze_step 150] [build dir build] \
#       [tokenized corpus .cache/prepared/sotu]
#
# The corpus is ds_prepare's output (scripts/run_demo.sh makes it). Runs go to /tmp/onebit-demo-*.
# BETA2=0.999 in the environment replaces the demo's beta2 0.95.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
NP="${1:-2}"; STEPS="${2:-200}"; FREEZE="${3:-150}"; BUILD="${4:-$REPO/build}"
DATA="${5:-$REPO/.cache/prepared/sotu}"
SCHED='"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
  "warmup_num_steps": "auto", "total_num_steps": "auto", "warmup_type": "linear"}}'
for OPT in AdamW OneBitAdam; do
  EXTRA=""
  [[ "$OPT" == OneBitAdam ]] && EXTRA=", \"freeze_step\": $FREEZE"
  CFG='{"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 10,
    "optimizer": {"type": "'$OPT'", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
      "weight_decay": "auto"'$EXTRA'}}, '$SCHED', "zero_optimization": {"stage": 0}}'
  OUT="/tmp/onebit-demo-$OPT-$NP"
  rm -rf "$OUT"
  mpirun -np "$NP" --oversubscribe -x OMP_NUM_THREADS=1 "$BUILD/tools/ds_train" --deepspeed "$CFG" \
    --model "$REPO/configs/model_demo.json" --train_data "$DATA" --output_dir "$OUT" \
    --tokenizer "$REPO/.cache/data/gpt2" --block_size 128 --per_device_train_batch_size 8 \
    --gradient_accumulation_steps 1 --learning_rate 3e-3 --warmup_steps 20 --weight_decay 0.1 \
    --adam_beta2 "${BETA2:-0.95}" --max_grad_norm 1.0 --max_steps "$STEPS" --logging_steps 25 \
    --eval_steps 100 --eval_batches 10 --save_steps 100000 2>&1 | grep -E "step [0-9]+/|loss" | sed "s/^/$OPT: /"
done

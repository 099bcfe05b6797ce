#!/usr/bin/env bash
# The new model families on the CPU, each against its peer in the same run (issue 22; bf16: 32):
#   bert  training steps of a BERT-base-shaped sequence classifier (12 x 768, 12 heads, vocab 30522,
#         2 labels) by ds_train on an MRPC-style pair set (scripts/make_pair_task.py, ds_prepare
#         --task classification, seq 128), ZeRO-2, against transformers'
#         BertForSequenceClassification + torch AdamW and against DeepSpeed (PyPI) ZeRO-2, same
#         batches, same random weights (a Hugging Face folder written by transformers);
#   bart  training steps of a BART-base-shaped BartForConditionalGeneration (6 + 6 x 768, 12 heads,
#         vocab 50265, source 128 / target 64) by bench_seq2seq (models::Seq2Seq +
#         runtime::Engine, ZeRO-2) against transformers + torch AdamW;
#   beam  beam search (4 beams, 32 new tokens, source 64, batch 1 and 4) of that BART model:
#         Seq2Seq::generate_beam against transformers' generate(num_beams=4), same source ids,
#         the outputs compared.
# fp32 by default; DTYPE=bf16 runs bert and bart in bf16 on every side (beam stays fp32):
#   ours: ds_train with "bf16": {"enabled": true} in its --deepspeed config, bench_seq2seq
#         --dtype bf16 (the same engine config): bf16 parameters, activations and GEMMs (oneDNN on a
#         CPU with AVX512-BF16 / AMX), fp32 master weights, gradient reduction and AdamW;
#   torch: forward and loss under torch.autocast("cpu", dtype=torch.bfloat16), fp32 parameters
#         and torch AdamW (what Trainer's bf16=True is on the CPU; families_peer.py --dtype bf16);
#   DeepSpeed: its config's "bf16": {"enabled": true} (the model in bf16, fp32 master weights in
#         its ZeRO optimizer; works on the CPU with 0.19.8); if it fails there the peer is
#         dropped with the reason printed (its log kept in $WORK/logs).
# AdamW lr 2e-5, weight decay 0, gradient clipping 1.0, 2 threads on every side. Ours and
# the peers run interleaved (round 1: ours first, round 2: peers first, ...); each side's step
# times of all rounds (the first step of each process not counted) give its median. Peak RSS is
# each process's maximum resident set (/usr/bin/time %M, whole process: ds_train's includes its
# end-of-run evaluation and checkpoint; the largest over the rounds).
# The training lines also give the step's useful FLOPs (GEMMs and attention, counted from the
# shapes: 6 x weights x tokens + the attention products), the GEMM peak of this machine measured
# at the start of the same run (bench_train_step --peak_only [--dtype bf16], 2048^3, 2 threads:
# the sgemm peak in fp32, the bf16 GEMM peak of the same backend with DTYPE=bf16) and each
# side's fraction of it; ratio_torch_at_peak is the most a side running at the peak could gain
# over PyTorch (torch_step_s / the FLOPs at the peak). The first lines name the CPU, its flags
# (avx2, avx512f, avx512_bf16, amx_bf16, amx_tile) and our GEMM path.
#
#   bash bench/run_families.sh                 # everything, ~25 min on a loaded 2-core machine
#   PARTS="beam" ROUNDS=3 bash bench/run_families.sh
#   DTYPE=bf16 PARTS="bert bart" PYTHON_TORCH=$VENV/bin/python bash bench/run_families.sh
#                                              # ~6 min on a quiet 2-core machine (BATCH=8 ROUNDS=2)
#
# Environment:
#   DTYPE        fp32 (default) or bf16, for the bert and bart parts (see above)
#   PARTS        which parts, default "bert bart beam"
#   ROUNDS       interleaved rounds (default 2); STEPS training steps per process (default 3, the
#                first one not timed); REPS generations per process (default 2)
#   BATCH        training micro-batch (default 8)
#   PYTHON_TORCH interpreter with torch + transformers (default python3; e.g. a venv with torch and transformers from PyPI)
#   PYTHON_DS    interpreter with deepspeed as well (default /tmp/dsvenv_bench/bin/python; absent:
#                the DeepSpeed peer is skipped). Made as in bench/RESULTS.md ("families"):
#                python3 -m venv /tmp/dsvenv_bench && echo <venv-hf site-packages> >
#                /tmp/dsvenv_bench/lib/python3.11/site-packages/venvhf.pth &&
#                /tmp/dsvenv_bench/bin/pip install deepspeed==0.19.8 (its first run builds its CPU
#                ops, a few minutes, cached in ~/.cache/torch_extensions; not in the step times)
#   WORK         scratch folder for data, models and logs (default /tmp/ds_bench_families)
#   DS_BUILD_DIR build folder (default build); SKIP_BUILD=1 does not build
#   OMP_WAIT_POLICY is passed to every side as set (see RESULTS.md: "passive" on a loaded machine)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DS_BUILD_DIR:-$REPO/build}"
PARTS="${PARTS:-bert bart beam}"
ROUNDS="${ROUNDS:-2}"
STEPS="${STEPS:-3}"
REPS="${REPS:-2}"
BATCH="${BATCH:-8}"
PY="${PYTHON_TORCH:-python3}"
DSPY="${PYTHON_DS:-/tmp/dsvenv_bench/bin/python}"
WORK="${WORK:-/tmp/ds_bench_families}"
DTYPE="${DTYPE:-fp32}"
[[ "$DTYPE" == fp32 || "$DTYPE" == bf16 ]] || { echo "DTYPE must be fp32 or bf16 (got $DTYPE)" >&2; exit 2; }
PEER="$REPO/bench/families_peer.py"
mkdir -p "$WORK/logs"
export TOKENIZERS_PARALLELISM=false PYTHONWARNINGS=ignore

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores); $(grep -q avx512f /proc/cpuinfo && echo avx512 || echo avx2)"
echo "CPU flags:$(grep -m1 '^flags' /proc/cpuinfo | grep -o -w -E 'avx2|avx512f|avx512_bf16|amx_bf16|amx_tile' | tr '\n' ' ')"
echo "start: $(date -u +%FT%TZ) $(uptime)"
echo "OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-<unset>} dtype=$DTYPE rounds=$ROUNDS steps=$STEPS reps=$REPS batch=$BATCH"
[[ "${SKIP_BUILD:-0}" == 1 ]] ||
  cmake --build "$BUILD" -j2 --target ds_train ds_prepare bench_seq2seq bench_train_step >/dev/null
peak_out=$(OMP_NUM_THREADS=2 "$BUILD/bench/bench_train_step" --threads 2 --peak_only --dtype "$DTYPE")
echo "$peak_out" | sed -n 's/^GEMM path/ours: GEMM path/p'
PEAK=$(sed -n 's/^sgemm peak.*: \([0-9.]*\) GFLOP.*/\1/p' <<<"$peak_out")
echo "sgemm peak (2048^3, 2 threads, this run): $PEAK GFLOP/s"
if [[ "$DTYPE" == bf16 ]]; then
  PEAK=$(sed -n 's/^bf16 GEMM peak.*: \([0-9.]*\) GFLOP.*/\1/p' <<<"$peak_out")
  echo "bf16 GEMM peak (2048^3, 2 threads, this run): $PEAK GFLOP/s (the peak of the bert / bart lines)"
fi
[[ -n "$PEAK" ]] || { echo "no GEMM peak from bench_train_step:" >&2; echo "$peak_out" >&2; exit 1; }

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
maxof() { tr ' ' '\n' | grep -v '^$' | sort -g | tail -1; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }
# peak_fields GFLOP OURS_S TORCH_S: the step's FLOPs against this run's GEMM peak (sgemm in fp32,
# the bf16 GEMM in bf16)
peak_fields() {
  awk -v f="$1" -v o="$2" -v t="$3" -v p="$PEAK" 'BEGIN {
    floor = f / p; printf "gflop=%.1f peak_gflops=%.1f ours_peak_fraction=%.2f torch_peak_fraction=%.2f ratio_torch_at_peak=%.2f", f, p, floor / o, floor / t, t / floor }'
}
# Useful GFLOPs of a training step (forward + backward = 3 x the forward's 2 flops per MAC).
# BERT-base classifier: L layers of 4C^2 + 2CF weights over B*T tokens, attention QK^T and AV.
bert_gflop() {  # B T
  awk -v B="$1" -v T="$2" 'BEGIN { L = 12; C = 768; F = 3072
    printf "%.1f", 6 * B * T * L * (4 * C * C + 2 * C * F) / 1e9 + 12 * B * T * T * C * L / 1e9 }'
}
# BART-base: 6 encoder layers over B*S tokens; 6 decoder layers (self-attention, cross q/o and
# the FFN over B*T tokens, cross k/v over B*S); the tied LM head (C x V) over B*T tokens.
bart_gflop() {  # B S T
  awk -v B="$1" -v S="$2" -v T="$3" 'BEGIN { L = 6; C = 768; F = 3072; V = 50265
    w = 6 * B * S * L * (4 * C * C + 2 * C * F) + 6 * B * T * L * (6 * C * C + 2 * C * F) \
      + 6 * B * S * L * 2 * C * C + 6 * B * T * C * V
    a = 12 * B * C * L * (S * S + T * T + T * S)
    printf "%.1f", (w + a) / 1e9 }'
}
# run LOG CMD...: the command's output to LOG; its peak RSS (MiB) on the last line of LOG.rss
run() {
  local log="$1"; shift
  /usr/bin/time -f "%M" -o "$log.rss" "$@" >"$log" 2>&1 || { echo "FAILED: $* (see $log)" >&2; tail -5 "$log" >&2; return 1; }
  awk '{v=$1} END {printf "%.0f", v / 1024}' "$log.rss"
}
# step times after the first of a peer's / bench_seq2seq's log
peer_steps() { sed -n 's/.*BENCH .* steps=\([0-9. ]*\) tokens_per_s.*/\1/p' "$1"; }
# ds_train's "| 4.12s/step" lines after the first
dstrain_steps() { sed -n 's/.*| \([0-9.]*\)s\/step$/\1/p' "$1" | tail -n +2 | tr '\n' ' '; }

# ---- data and models (kept in $WORK between runs) ----
if [[ " $PARTS " == *" bert "* ]]; then
  [[ -f "$WORK/pairs/tok/tokenizer.json" ]] ||
    "$PY" "$REPO/scripts/make_pair_task.py" --sotu "$REPO/.cache/data/sotu" --out "$WORK/pairs" \
      --train_tokenizer "$WORK/pairs/tok" --vocab_size 30522 >/dev/null
  [[ -f "$WORK/prepared/meta.json" ]] ||
    "$BUILD/tools/ds_prepare" --task classification --tokenizer "$WORK/pairs/tok" --seq_len 128 \
      --val_files 'dev*' --output "$WORK/prepared" "$WORK/pairs/train.tsv" "$WORK/pairs/dev.tsv" >/dev/null
  [[ -f "$WORK/bert/config.json" ]] || "$PY" "$PEER" save-bert "$WORK/bert" 2>/dev/null
fi
if [[ " $PARTS " == *" bart "* || " $PARTS " == *" beam "* ]]; then
  [[ -f "$WORK/bart/config.json" ]] || "$PY" "$PEER" save-bart "$WORK/bart" 2>/dev/null
fi

# ---- BERT-base classifier: ds_train vs torch vs DeepSpeed ZeRO-2 ----
if [[ " $PARTS " == *" bert "* ]]; then
  have_ds=0
  if "$DSPY" -c "import deepspeed" >/dev/null 2>&1; then have_ds=1; else echo "no deepspeed in $DSPY: DeepSpeed peer skipped"; fi
  cat >"$WORK/ds_z2.json" <<EOF
{"train_micro_batch_size_per_gpu": $BATCH, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
 "optimizer": {"type": "AdamW", "params": {"lr": 2e-5, "weight_decay": 0.0, "betas": [0.9, 0.999], "eps": 1e-8}},
 "zero_optimization": {"stage": 2}, "steps_per_print": 1$([[ "$DTYPE" == bf16 ]] && printf ',\n "bf16": {"enabled": true}')}
EOF
  ours_t="" torch_t="" ds_t="" ours_m="" torch_m="" ds_m=""
  bert_ours() {
    rm -rf "$WORK/out_bert"
    ours_m+=" $(run "$WORK/logs/bert_ours_$1.log" "$BUILD/tools/ds_train" --deepspeed "$WORK/ds_z2.json" \
      --train_data "$WORK/prepared" --init_from "$WORK/bert" --output_dir "$WORK/out_bert" \
      --max_steps "$STEPS" --per_device_train_batch_size "$BATCH" --learning_rate 2e-5 \
      --eval_steps 0 --eval_batches 1 --logging_steps 1 --threads 2 --export_hf none --no_shuffle)"
    ours_t+=" $(dstrain_steps "$WORK/logs/bert_ours_$1.log")"
    grep -q "ZeRO stage 2, $DTYPE params" "$WORK/logs/bert_ours_$1.log" ||
      { echo "ds_train did not train in $DTYPE (see $WORK/logs/bert_ours_$1.log)" >&2; exit 1; }
    echo "  ours  (ds_train):  $(grep -c 's\/step$' "$WORK/logs/bert_ours_$1.log") steps, timed: $(dstrain_steps "$WORK/logs/bert_ours_$1.log")s"
  }
  bert_peer() {  # $1 round, $2 engine
    local log="$WORK/logs/bert_$2_$1.log" py="$PY" m
    [[ "$2" == deepspeed ]] && py="$DSPY"
    if ! m="$(run "$log" "$py" "$PEER" train-bert "$WORK/bert" --engine "$2" --tsv "$WORK/pairs/train.tsv" \
      --tokenizer "$WORK/pairs/tok" --batch "$BATCH" --seq 128 --steps "$STEPS" --threads 2 \
      --dtype "$DTYPE" 2>&1)"; then
      # DeepSpeed's bf16 on the CPU is optional: drop that peer, say why; anything else is fatal
      [[ "$2" == deepspeed && "$DTYPE" == bf16 ]] || { echo "$m" >&2; return 1; }
      echo "  deepspeed: bf16 failed, DeepSpeed peer skipped: $(grep -v '^\s*$' "$log" | tail -1 | cut -c1-300)"
      have_ds=0; return 0
    fi
    echo "  $2: timed: $(peer_steps "$log")s"
    if [[ "$2" == torch ]]; then torch_t+=" $(peer_steps "$log")"; torch_m+=" $m"
    else ds_t+=" $(peer_steps "$log")"; ds_m+=" $m"; fi
  }
  for r in $(seq "$ROUNDS"); do
    echo "bert round $r ($(uptime | sed 's/.*load/load/'))"
    if (( r % 2 )); then
      bert_ours "$r"; bert_peer "$r" torch
      if (( have_ds )); then bert_peer "$r" deepspeed; fi
    else
      if (( have_ds )); then bert_peer "$r" deepspeed; fi
      bert_peer "$r" torch; bert_ours "$r"
    fi
  done
  tok=$((BATCH * 128))
  o=$(median <<<"$ours_t") t=$(median <<<"$torch_t")
  ot=$(awk -v s="$o" -v n="$tok" 'BEGIN{printf "%.1f", n/s}') tt=$(awk -v s="$t" -v n="$tok" 'BEGIN{printf "%.1f", n/s}')
  line="BENCH families task=bert_train dtype=$DTYPE batch=$BATCH seq=128 ours_step_s=$o ours_tokens_per_s=$ot ours_peak_rss_mib=$(maxof <<<"$ours_m") torch_step_s=$t torch_tokens_per_s=$tt torch_peak_rss_mib=$(maxof <<<"$torch_m") ratio_torch=$(ratio "$t" "$o") $(peak_fields "$(bert_gflop "$BATCH" 128)" "$o" "$t")"
  if (( have_ds )); then
    d=$(median <<<"$ds_t")
    line+=" ds_step_s=$d ds_tokens_per_s=$(awk -v s="$d" -v n="$tok" 'BEGIN{printf "%.1f", n/s}') ds_peak_rss_mib=$(maxof <<<"$ds_m") ratio_ds=$(ratio "$d" "$o")"
  fi
  echo "$line"
fi

# ---- BART-base training: bench_seq2seq vs torch ----
if [[ " $PARTS " == *" bart "* ]]; then
  ours_t="" torch_t="" ours_m="" torch_m=""
  bart_ours() {
    local log="$WORK/logs/bart_ours_$1.log"
    ours_m+=" $(run "$log" "$BUILD/bench/bench_seq2seq" --model "$WORK/bart" --threads 2 train \
      --batch "$BATCH" --src 128 --tgt 64 --steps "$STEPS" --warmup 1 --stage 2 --dtype "$DTYPE")"
    ours_t+=" $(peer_steps "$log")"
    # bf16: the engine keeps fp32 master weights beside the bf16 parameters (none in fp32)
    local kind=bf16
    grep -q "master weights 0.0, " "$log" && kind=fp32
    [[ "$kind" == "$DTYPE" ]] || { echo "bench_seq2seq did not train in $DTYPE (see $log)" >&2; exit 1; }
    echo "  ours: timed: $(peer_steps "$log")s ($(sed -n 's/.*\(forward_s=.*\)/\1/p' "$log"))"
  }
  bart_torch() {
    local log="$WORK/logs/bart_torch_$1.log"
    torch_m+=" $(run "$log" "$PY" "$PEER" train-bart "$WORK/bart" --batch "$BATCH" --src 128 --tgt 64 \
      --steps "$STEPS" --threads 2 --dtype "$DTYPE")"
    torch_t+=" $(peer_steps "$log")"
    echo "  torch: timed: $(peer_steps "$log")s"
  }
  for r in $(seq "$ROUNDS"); do
    echo "bart round $r ($(uptime | sed 's/.*load/load/'))"
    if (( r % 2 )); then bart_ours "$r"; bart_torch "$r"; else bart_torch "$r"; bart_ours "$r"; fi
  done
  tok=$((BATCH * (128 + 64)))
  o=$(median <<<"$ours_t") t=$(median <<<"$torch_t")
  echo "BENCH families task=bart_train dtype=$DTYPE batch=$BATCH src=128 tgt=64 ours_step_s=$o ours_tokens_per_s=$(awk -v s="$o" -v n="$tok" 'BEGIN{printf "%.1f", n/s}') ours_peak_rss_mib=$(maxof <<<"$ours_m") torch_step_s=$t torch_tokens_per_s=$(awk -v s="$t" -v n="$tok" 'BEGIN{printf "%.1f", n/s}') torch_peak_rss_mib=$(maxof <<<"$torch_m") ratio_torch=$(ratio "$t" "$o") $(peak_fields "$(bart_gflop "$BATCH" 128 64)" "$o" "$t")"
fi

# ---- BART-base beam search: generate_beam vs transformers generate ----
if [[ " $PARTS " == *" beam "* ]]; then
  [[ "$DTYPE" == fp32 ]] || echo "beam: fp32 (DTYPE applies to the bert and bart training parts)"
  for b in 1 4; do
    ours_t="" torch_t="" same=yes
    beam_ours() {
      local log="$WORK/logs/beam${b}_ours_$1.log"
      run "$log" "$BUILD/bench/bench_seq2seq" --model "$WORK/bart" --threads 2 beam --batch "$b" \
        --src 64 --beams 4 --new_tokens 32 --reps "$REPS" --ids_out "$WORK/beam_ids_$b.txt" \
        --out "$WORK/beam_ours_$b.txt" >/dev/null
      ours_t+=" $(sed -n 's/.* all=\([0-9. ]*\) out_len.*/\1/p' "$log")"
      echo "  ours: $(sed -n 's/.* all=\([0-9. ]*\) out_len.*/\1/p' "$log")s"
    }
    beam_torch() {
      local log="$WORK/logs/beam${b}_torch_$1.log"
      [[ -f "$WORK/beam_ids_$b.txt" ]] || return 0
      run "$log" "$PY" "$PEER" gen-bart "$WORK/bart" --ids "$WORK/beam_ids_$b.txt" --batch "$b" \
        --beams 4 --new_tokens 32 --reps "$REPS" --threads 2 --out "$WORK/beam_torch_$b.txt" >/dev/null
      torch_t+=" $(sed -n 's/.* all=\([0-9. ]*\) out_len.*/\1/p' "$log")"
      echo "  transformers: $(sed -n 's/.* all=\([0-9. ]*\) out_len.*/\1/p' "$log")s"
    }
    rm -f "$WORK/beam_ids_$b.txt"
    for r in $(seq "$ROUNDS"); do
      echo "beam batch $b round $r ($(uptime | sed 's/.*load/load/'))"
      if (( r % 2 )); then beam_ours "$r"; beam_torch "$r"; else beam_torch "$r"; beam_ours "$r"; fi
      cmp -s "$WORK/beam_ours_$b.txt" "$WORK/beam_torch_$b.txt" || same=no
    done
    rows_same=$(paste -d'|' "$WORK/beam_ours_$b.txt" "$WORK/beam_torch_$b.txt" | awk -F'|' '$1 == $2' | wc -l)
    o=$(median <<<"$ours_t") t=$(median <<<"$torch_t")
    echo "BENCH families task=bart_beam batch=$b beams=4 new_tokens=32 src=64 ours_s=$o torch_s=$t ratio_torch=$(ratio "$t" "$o") same_outputs=$same rows_equal=$rows_same/$b"
  done
fi
echo "end: $(date -u +%FT%TZ) $(uptime)"

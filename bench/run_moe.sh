#!/usr/bin/env bash
# Mixture-of-experts training on the CPU against PyTorch / transformers in the same run (issue 35):
#   moe    training steps of a Qwen3-MoE-shaped model (Qwen3MoeForCausalLM: hidden 512, 8 layers,
#          8 heads of 64, 4 KV heads, 8 experts of width 1024, top-2 with norm_topk_prob, vocab
#          32000, untied lm_head: 139.8M parameters, 64.3M active per token) by ds_train
#          --init_from (fp32, ZeRO stage 0, one process) against transformers'
#          Qwen3MoeForCausalLM + torch AdamW (bench/moe_peer.py; transformers' default experts
#          implementation, printed), same random weights (the Hugging Face folder written by
#          transformers), same batch shapes (BATCH x SEQ from the same corpus and tokenizer), the
#          router's load-balancing loss (coefficient 0.001) in the loss on both sides;
#   dense  the same on Qwen3ForCausalLM of the same shape with one dense SwiGLU MLP of width
#          2 x 1024 (top-k x the expert width): the MoE model's active parameters, for
#          tokens/s per active parameter (MoE against dense, ours and torch);
#   ep     if ds_train has --expert_parallel_size: the MoE model on 2 ranks (mpirun -np 2, one
#          thread each) with expert parallelism 2 against plain data parallelism (every expert on
#          every rank), step time and per-rank memory from each run's memory.json.
# AdamW lr 1e-4, weight decay 0, gradient clipping 1.0, 2 threads on every side. Ours and torch
# run interleaved (odd rounds: ours first; even rounds: torch first); each side's step times of all
# rounds (the first step of each process not counted) give its median. Peak RSS: ds_train's
# memory.json (peak_rss_bytes: the process's peak RSS over the whole run, its final checkpoint
# included; /usr/bin/time's %M gives the same) and its peak tensor bytes; torch: VmHWM at the end of its steps (moe_peer.py);
# both the largest over the rounds. The formula line: 16 bytes per parameter (fp32 parameters,
# gradients, AdamW m and v) plus ds_train's activation estimate.
# FLOPs of a step: 6 x the active GEMM weights (attention, router, top-k experts or the dense
# MLP, lm_head) x tokens + the attention products (12 B T^2 C L, as run_families.sh counts them,
# the causal half not subtracted), against this machine's sgemm peak measured at the start.
# The first lines name the CPU, its flags, the GEMM path, the load (uptime) and OMP_WAIT_POLICY.
#
#   OMP_WAIT_POLICY=passive PYTHON_TORCH=$VENV/bin/python bash bench/run_moe.sh
#   PARTS="moe" ROUNDS=2 bash bench/run_moe.sh
#
# Environment:
#   PARTS        default "moe dense ep"
#   ROUNDS       interleaved rounds (default 3); STEPS steps per process (default 5, the first
#                one not timed); BATCH (default 4), SEQ (default 256)
#   PYTHON_TORCH interpreter with torch + transformers (default python3)
#   WORK         scratch folder (default /tmp/ds_bench_moe); DS_BUILD_DIR (default build);
#                SKIP_BUILD=1 does not build
#   OMP_WAIT_POLICY is passed to every side as set ("passive" on a loaded machine: with spinning
#                OpenMP threads and other processes on the 2 cores an MoE step ran ~12x slower)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${DS_BUILD_DIR:-$REPO/build}"
PARTS="${PARTS:-moe dense ep}"
ROUNDS="${ROUNDS:-3}"
STEPS="${STEPS:-5}"
BATCH="${BATCH:-4}"
SEQ="${SEQ:-256}"
PY="${PYTHON_TORCH:-python3}"
WORK="${WORK:-/tmp/ds_bench_moe}"
PEER="$REPO/bench/moe_peer.py"
# the model's shape (moe_peer.py's defaults; the FLOP count below uses the same numbers)
C=512 L=8 KV=4 E=8 K=2 I=1024 V=32000
mkdir -p "$WORK/logs"
export TOKENIZERS_PARALLELISM=false PYTHONWARNINGS=ignore

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores); $(grep -q avx512f /proc/cpuinfo && echo avx512 || echo avx2)"
echo "CPU flags:$(grep -m1 '^flags' /proc/cpuinfo | grep -o -w -E 'avx2|avx512f|avx512_bf16|amx_bf16|amx_tile' | tr '\n' ' ')"
echo "start: $(date -u +%FT%TZ) $(uptime)"
echo "OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-<unset>} rounds=$ROUNDS steps=$STEPS batch=$BATCH seq=$SEQ"
[[ "${SKIP_BUILD:-0}" == 1 ]] ||
  cmake --build "$BUILD" -j2 --target ds_train ds_prepare bench_train_step >/dev/null
peak_out=$(OMP_NUM_THREADS=2 "$BUILD/bench/bench_train_step" --threads 2 --peak_only)
echo "$peak_out" | sed -n 's/^GEMM path/ours: GEMM path/p'
PEAK=$(sed -n 's/^sgemm peak.*: \([0-9.]*\) GFLOP.*/\1/p' <<<"$peak_out")
[[ -n "$PEAK" ]] || { echo "no GEMM peak from bench_train_step:" >&2; echo "$peak_out" >&2; exit 1; }
echo "sgemm peak (2048^3, 2 threads, this run): $PEAK GFLOP/s"
# On a shared machine one measurement can land in a busy moment (25 GFLOP/s against ~200 quiet):
# the peak is measured again before every round and the FLOP fractions use the largest.
PEAKS="$PEAK"
remeasure_peak() {
  local p
  p=$(OMP_NUM_THREADS=2 "$BUILD/bench/bench_train_step" --threads 2 --peak_only | sed -n 's/^sgemm peak.*: \([0-9.]*\) GFLOP.*/\1/p')
  PEAKS+=" $p"
  PEAK=$(maxof <<<"$PEAKS")
}

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
maxof() { tr ' ' '\n' | grep -v '^$' | sort -g | tail -1; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }
# Active GEMM weights per token (moe: attention + router + K experts; dense: attention + MLP;
# both + lm_head) and the step's GFLOPs.
active_gemm() {  # moe|dense
  awk -v k="$1" -v C=$C -v L=$L -v KV=$KV -v E=$E -v K=$K -v I=$I -v V=$V 'BEGIN {
    att = 2 * C * C + 2 * C * KV * 64
    mlp = (k == "moe") ? C * E + K * 3 * C * I : 3 * C * K * I
    printf "%.0f", L * (att + mlp) + C * V }'
}
step_gflop() {  # moe|dense
  awk -v w="$(active_gemm "$1")" -v B="$BATCH" -v T="$SEQ" -v C=$C -v L=$L 'BEGIN {
    printf "%.1f", (6 * w * B * T + 12 * B * T * T * C * L) / 1e9 }'
}
peak_fields() {  # GFLOP OURS_S TORCH_S
  awk -v f="$1" -v o="$2" -v t="$3" -v p="$PEAK" 'BEGIN {
    floor = f / p; printf "gflop=%.1f peak_gflops=%.1f ours_peak_fraction=%.2f torch_peak_fraction=%.2f", f, p, floor / o, floor / t }'
}
# run LOG CMD...: the command's output to LOG; its peak RSS (MiB, /usr/bin/time) printed
run() {
  local log="$1"; shift
  /usr/bin/time -f "%M" -o "$log.rss" "$@" >"$log" 2>&1 || { echo "FAILED: $* (see $log)" >&2; tail -5 "$log" >&2; return 1; }
  awk '{v=$1} END {printf "%.0f", v / 1024}' "$log.rss"
}
peer_steps() { sed -n 's/.*BENCH .* steps=\([0-9. ]*\) tokens_per_s.*/\1/p' "$1"; }
# ds_train's "| 4.12s/step |" per logged step, after the first (rank 0's lines under mpirun)
dstrain_steps() { grep -o '| [0-9.]*s/step' "$1" | tr -d '|s/tep ' | tail -n +2 | tr '\n' ' '; }
# memory.json field of rank R (MiB)
mem_field() {  # FILE FIELD [RANK]
  "$PY" -c "import json,sys; m=json.load(open(sys.argv[1])); print('%.0f' % (m['ranks'][int(sys.argv[3])][sys.argv[2]] / 2**20))" "$1" "$2" "${3:-0}"
}

# ---- tokenizer, data and models (kept in $WORK between runs) ----
SOTU="$REPO/.cache/data/sotu"
[[ -d "$SOTU" ]] || { echo "run_moe.sh: no corpus in $SOTU (bash scripts/fetch_data.sh)" >&2; exit 1; }
[[ -f "$WORK/tok/tokenizer.json" ]] || "$PY" "$PEER" save-tokenizer "$WORK/tok" --text_dir "$SOTU" --vocab $V
[[ -f "$WORK/prepared/meta.json" ]] ||
  "$BUILD/tools/ds_prepare" -q --tokenizer "$WORK/tok" --output "$WORK/prepared" "$SOTU"/*.txt
for kind in moe dense; do
  [[ -f "$WORK/$kind/config.json" ]] || "$PY" "$PEER" "save-$kind" "$WORK/$kind" 2>/dev/null
done
cat >"$WORK/ds.json" <<EOF
{"train_micro_batch_size_per_gpu": $BATCH, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.0, "betas": [0.9, 0.999], "eps": 1e-8}},
 "zero_optimization": {"stage": 0}, "steps_per_print": 1}
EOF
ds_train_args=(--train_data "$WORK/prepared" --max_steps "$STEPS" --per_device_train_batch_size "$BATCH"
  --block_size "$SEQ" --learning_rate 1e-4 --eval_steps 0 --eval_batches 1 --logging_steps 1
  --export_hf none --no_shuffle --sample_tokens 0)

# ---- ours vs torch, MoE and dense ----
declare -A OT TT OM TM OTB OL TL OR TR RR
for kind in moe dense; do OT[$kind]="" TT[$kind]="" OM[$kind]="" TM[$kind]="" OTB[$kind]="" RR[$kind]=""; done
ours() {  # round kind
  local log="$WORK/logs/${2}_ours_$1.log"
  rm -rf "$WORK/out_$2"
  run "$log" env OMP_NUM_THREADS=2 "$BUILD/tools/ds_train" --deepspeed "$WORK/ds.json" \
    --init_from "$WORK/$2" --output_dir "$WORK/out_$2" --threads 2 "${ds_train_args[@]}" >/dev/null
  OT[$2]+=" $(dstrain_steps "$log")"
  OR[$2]=$(median <<<"$(dstrain_steps "$log")")
  OM[$2]+=" $(mem_field "$WORK/out_$2/memory.json" peak_rss_bytes)"
  OTB[$2]+=" $(mem_field "$WORK/out_$2/memory.json" peak_tensor_bytes)"
  OL[$2]=$(sed -n 's/.*step 1\/[0-9]* | loss \([0-9.]*\) .*/\1/p' "$log")
  echo "  ours  $2: timed $(dstrain_steps "$log")s, first loss ${OL[$2]}"
}
torch_side() {  # round kind
  local log="$WORK/logs/${2}_torch_$1.log"
  run "$log" "$PY" "$PEER" train "$WORK/$2" --tokenizer "$WORK/tok" --text_dir "$SOTU" \
    --batch "$BATCH" --seq "$SEQ" --steps "$STEPS" --threads 2 >/dev/null
  TT[$2]+=" $(peer_steps "$log")"
  TR[$2]=$(median <<<"$(peer_steps "$log")")
  TM[$2]+=" $(sed -n 's/.*peak_rss_mib=\([0-9]*\).*/\1/p' "$log")"
  TL[$2]=$(sed -n 's/^step 0: loss \([0-9.]*\) .*/\1/p' "$log")
  echo "  torch $2: timed $(peer_steps "$log")s, first loss ${TL[$2]} ($(grep -o 'experts_impl=[a-z_]*' "$log"))"
}
kinds=""
for kind in moe dense; do [[ " $PARTS " == *" $kind "* ]] && kinds+=" $kind"; done
if [[ -n "$kinds" ]]; then
  for r in $(seq "$ROUNDS"); do
    remeasure_peak
    for kind in $kinds; do
      echo "$kind round $r ($(uptime | sed 's/.*load/load/'))"
      if (( r % 2 )); then ours "$r" "$kind"; torch_side "$r" "$kind"; else torch_side "$r" "$kind"; ours "$r" "$kind"; fi
      RR[$kind]+=" $(ratio "${TR[$kind]}" "${OR[$kind]}")"  # this round's torch / ours (medians)
    done
  done
  echo "sgemm peaks before the rounds: $PEAKS GFLOP/s (the fractions below use the largest, $PEAK)"
  tok=$((BATCH * SEQ))
  for kind in $kinds; do
    o=$(median <<<"${OT[$kind]}") t=$(median <<<"${TT[$kind]}")
    params=$(sed -n 's/.*: \([0-9.]*\)M parameters.*/\1/p' "$WORK/logs/${kind}_ours_1.log")
    act=$(awk -v w="$(active_gemm "$kind")" -v C=$C -v V=$V 'BEGIN { printf "%.2f", (w + C * V) / 1e6 }')
    states=$(awk -v p="$params" 'BEGIN { printf "%.0f", 16 * p * 1e6 / 2^20 }')
    acts=$("$PY" -c "import json,sys; print('%.0f' % (json.load(open(sys.argv[1]))['activations_estimate_bytes'] / 2**20))" "$WORK/out_$kind/memory.json")
    echo "BENCH moe task=${kind}_train batch=$BATCH seq=$SEQ params_m=$params active_params_m=$act ours_step_s=$o ours_tokens_per_s=$(awk -v s="$o" -v n="$tok" 'BEGIN{printf "%.1f", n/s}') torch_step_s=$t torch_tokens_per_s=$(awk -v s="$t" -v n="$tok" 'BEGIN{printf "%.1f", n/s}') ratio_torch=$(ratio "$t" "$o") ratio_per_round=$(tr ' ' ',' <<<"${RR[$kind]# }") median_round_ratio=$(median <<<"${RR[$kind]}") ours_peak_rss_mib=$(maxof <<<"${OM[$kind]}") ours_peak_tensor_mib=$(maxof <<<"${OTB[$kind]}") torch_peak_rss_mib=$(maxof <<<"${TM[$kind]}") formula_states_mib=$states formula_activations_mib=$acts first_loss_ours=${OL[$kind]} first_loss_torch=${TL[$kind]} $(peak_fields "$(step_gflop "$kind")" "$o" "$t")"
  done
  if [[ "$kinds" == *moe*dense* ]]; then
    om=$(median <<<"${OT[moe]}") od=$(median <<<"${OT[dense]}") tm=$(median <<<"${TT[moe]}") td=$(median <<<"${TT[dense]}")
    # the same active parameters on both models: tokens/s per active parameter compare as tokens/s
    echo "BENCH moe task=moe_vs_dense ours_moe_over_dense_tokens_per_s=$(ratio "$od" "$om") torch_moe_over_dense_tokens_per_s=$(ratio "$td" "$tm")"
  fi
fi

# ---- expert parallelism: EP 2 against EP 1 on 2 ranks ----
if [[ " $PARTS " == *" ep "* ]]; then
  help=$("$BUILD/tools/ds_train" --help 2>&1 || true)  # (grep -q on the pipe: SIGPIPE under pipefail)
  if [[ "$help" != *--expert_parallel_size* ]]; then
    echo "ep: ds_train has no --expert_parallel_size in this build: skipped"
  else
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    declare -A ET
    for ep in 1 2; do ET[$ep]=""; done
    ep_run() {  # round ep
      local log="$WORK/logs/ep$2_$1.log"
      rm -rf "$WORK/out_ep$2"
      mpirun -np 2 --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1 -x OMP_WAIT_POLICY \
        "$BUILD/tools/ds_train" --deepspeed "$WORK/ds.json" --init_from "$WORK/moe" \
        --output_dir "$WORK/out_ep$2" --threads 1 --expert_parallel_size "$2" \
        "${ds_train_args[@]}" >"$log" 2>&1 || { echo "FAILED: ep $2 (see $log)" >&2; tail -5 "$log" >&2; return 1; }
      ET[$2]+=" $(dstrain_steps "$log")"
      echo "  ep $2: timed $(dstrain_steps "$log")s; rank peak RSS $(mem_field "$WORK/out_ep$2/memory.json" peak_rss_bytes 0) / $(mem_field "$WORK/out_ep$2/memory.json" peak_rss_bytes 1) MiB, model states $(mem_field "$WORK/out_ep$2/memory.json" model_state_bytes 0) / $(mem_field "$WORK/out_ep$2/memory.json" model_state_bytes 1) MiB"
    }
    for r in $(seq "$ROUNDS"); do
      echo "ep round $r ($(uptime | sed 's/.*load/load/'))"
      if (( r % 2 )); then ep_run "$r" 1; ep_run "$r" 2; else ep_run "$r" 2; ep_run "$r" 1; fi
    done
    e1=$(median <<<"${ET[1]}") e2=$(median <<<"${ET[2]}")
    echo "BENCH moe task=ep ranks=2 batch_per_rank=$BATCH seq=$SEQ ep1_step_s=$e1 ep2_step_s=$e2 ratio_ep1_over_ep2=$(ratio "$e1" "$e2") ep1_rank0_peak_rss_mib=$(mem_field "$WORK/out_ep1/memory.json" peak_rss_bytes 0) ep2_rank0_peak_rss_mib=$(mem_field "$WORK/out_ep2/memory.json" peak_rss_bytes 0) ep1_rank0_states_mib=$(mem_field "$WORK/out_ep1/memory.json" model_state_bytes 0) ep2_rank0_states_mib=$(mem_field "$WORK/out_ep2/memory.json" model_state_bytes 0)"
  fi
fi
# the peak again: on a shared machine the load moves during the run (the FLOP fractions above use
# the start's)
echo "sgemm peak at the end: $(OMP_NUM_THREADS=2 "$BUILD/bench/bench_train_step" --threads 2 --peak_only | sed -n 's/^sgemm peak.*: \([0-9.]*\) GFLOP.*/\1/p') GFLOP/s"
echo "end: $(date -u +%FT%TZ) $(uptime)"

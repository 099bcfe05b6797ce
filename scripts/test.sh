#!/usr/bin/env bash
# Build deepspeed.cpp and run its test suite.
#
#   bash scripts/test.sh [--no-setup] [CTEST_ARGS...]
#
# 1. scripts/setup.sh --no-build: install missing dependencies, fetch the data (skip: --no-setup);
#    with DS_TEST_SLURM=1 (root), also a one-node Slurm cluster for the launcher's Slurm test.
# 2. Configure (Release) and build $DS_BUILD_DIR (default build/), $DS_BUILD_JOBS jobs (nproc).
# 3. ctest --test-dir $DS_BUILD_DIR --output-on-failure -j2 CTEST_ARGS...
# 4. With DS_TEST_ASAN=1 (CI sets it), also the data, training and offload tests in a
#    second build, $DS_ASAN_BUILD_DIR (default build-asan/), with AddressSanitizer and UBSan.
#
# Every argument other than --no-setup goes to ctest, e.g.
#   bash scripts/test.sh --no-setup -L gradcheck      # one label
#   bash scripts/test.sh --no-setup -R test_core -V   # one test, verbose
# The exit code is ctest's.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${DS_BUILD_DIR:-$REPO/build}"
JOBS="${DS_BUILD_JOBS:-$(nproc)}"

setup=1
ctest_args=()
for arg in "$@"; do
  case "$arg" in
    --no-setup) setup=0 ;;
    -h | --help)
      awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"
      exit 0
      ;;
    *) ctest_args+=("$arg") ;;
  esac
done

# Multi-process tests start `mpirun` on this one machine. CI runs as root, which Open MPI refuses
# unless told twice, and tests may start more ranks than there are cores (4 ranks on 2 cores).
# Set only when unset, so a developer's own choice wins.
if [[ "$(id -u)" == 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT="${OMPI_ALLOW_RUN_AS_ROOT:-1}"
  export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}"
fi
export OMPI_MCA_rmaps_base_oversubscribe="${OMPI_MCA_rmaps_base_oversubscribe:-1}"

# Wall time of each phase, printed at the end (also when a phase fails): CI's budget is 90 minutes
# on a 2-core machine, and these lines show where it goes.
phase_names=()
phase_secs=()
phase_name=""
phase_start=$SECONDS
phase() {  # phase NAME: ends the running phase and starts NAME ("" ends it only)
  if [[ -n "$phase_name" ]]; then
    phase_names+=("$phase_name")
    phase_secs+=($((SECONDS - phase_start)))
  fi
  phase_name="$1"
  phase_start=$SECONDS
}
print_phases() {
  phase ""
  echo "test: phase times (wall clock)"
  local i
  for i in "${!phase_names[@]}"; do
    printf 'test:   %-34s %3d min %02d s\n' "${phase_names[$i]}" $((phase_secs[i] / 60)) \
      $((phase_secs[i] % 60))
  done
  printf 'test:   %-34s %3d min %02d s\n' "total" $((SECONDS / 60)) $((SECONDS % 60))
}
trap print_phases EXIT

if [[ "$setup" == 1 ]]; then
  phase "setup (packages, data)"
  bash "$REPO/scripts/setup.sh" --no-build
fi

# The launcher's Slurm path needs a Slurm cluster; DS_TEST_SLURM=1 (CI, as root) starts a one-node
# one on this machine (scripts/slurm_local.sh). Without it, ctest's launcher_slurm skips.
if [[ "${DS_TEST_SLURM:-0}" == 1 && "$(id -u)" == 0 ]]; then
  phase "one-node Slurm cluster"
  timeout 300 bash "$REPO/scripts/slurm_local.sh" ||
    echo "test: the one-node Slurm cluster did not start; launcher_slurm will skip"
fi

phase "Release build"
echo "test: configuring $BUILD_DIR (Release)"
cmake -S "$REPO" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release </dev/null
# DS_SKIP_SOURCES is a development aid that a build folder keeps in its cache; a test run on such a
# folder builds a partial library, and its link errors would otherwise be a mystery.
skip="$(sed -n 's/^DS_SKIP_SOURCES:STRING=//p' "$BUILD_DIR/CMakeCache.txt" 2>/dev/null || true)"
if [[ -n "$skip" ]]; then
  echo "test: warning: $BUILD_DIR leaves out library sources matching '$skip' (DS_SKIP_SOURCES);"
  echo "test:          for the full library: cmake -B $BUILD_DIR -DDS_SKIP_SOURCES= (or another DS_BUILD_DIR)"
fi
echo "test: building with $JOBS job(s)"
cmake --build "$BUILD_DIR" -j"$JOBS" </dev/null

echo "test: ctest --test-dir $BUILD_DIR --output-on-failure -j2 ${ctest_args[*]}"
phase "Release tests"
rc=0
ctest --test-dir "$BUILD_DIR" --output-on-failure -j2 "${ctest_args[@]}" </dev/null || rc=$?

# Memory errors in the code that reads user files (token shards, tokenizers, configs, checkpoints)
# or moves raw bytes to and from disk (offload) do not always crash a Release build: run those
# tests once under the sanitizers. OpenMPI's own
# allocations are not ours to judge, so leak checking is off; any other report fails the test.
if [[ "${DS_TEST_ASAN:-0}" == 1 ]]; then
  phase "sanitizer build"
  ASAN_DIR="${DS_ASAN_BUILD_DIR:-$REPO/build-asan}"
  echo "test: AddressSanitizer pass: configuring $ASAN_DIR (DS_SANITIZE=ON)"
  # -O1 -g1 (line tables: stack traces keep file:line) is what the sanitizers' own docs suggest,
  # and compiles 2.4x faster here than RelWithDebInfo's -O2 -g (src/runtime/engine.cpp: 21 s
  # against 51 s): most of that time was the assembler writing full debug info.
  cmake -S "$REPO" -B "$ASAN_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDS_SANITIZE=ON \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DDS_BUILD_BENCH=OFF </dev/null
  cmake --build "$ASAN_DIR" -j"$JOBS" --target test_data test_tokenizer test_monitor test_ds_train test_trainer \
    test_offload test_hf_tokenizer test_chat_template test_to_fp32 test_sft test_lora test_lora_experts \
    test_classification test_classifier_train test_seq2seq_data test_seq2seq_train ds_train \
    ds_prepare ds_launcher ds_io </dev/null
  phase "sanitizer tests"
  echo "test: ctest --test-dir $ASAN_DIR -L 'data|train|offload' (sanitized)"
  ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1}" \
    UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}" \
    ctest --test-dir "$ASAN_DIR" --output-on-failure -j2 -L 'data|train|offload' </dev/null || rc=$?
fi
exit "$rc"

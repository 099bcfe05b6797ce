#!/usr/bin/env bash
# Packs a -DDS_WITH_CUDA=ON build's GPU checks for a machine that has a GPU but not this project's
# build dependencies (the device machine of docs/cuda.md): DIR/bin gets the test binaries,
# ds_train and bench_cuda (stripped), DIR/lib the shared libraries they load from outside the CUDA toolkit and
# glibc. scripts/cuda_device_check.sh DIR runs them there.
#
#   bash scripts/cuda_pack.sh BUILD_DIR DIR
set -euo pipefail
BUILD="${1:?usage: cuda_pack.sh BUILD_DIR DIR}"
DIR="${2:?usage: cuda_pack.sh BUILD_DIR DIR}"
rm -rf "$DIR"
mkdir -p "$DIR/bin" "$DIR/lib"
for t in tests/test_ops tests/test_gradcheck_basic tests/test_gradcheck_nn tests/test_parity \
  tests/test_core tests/test_engine tests/test_trainer tests/test_zero tests/test_tensor_parallel \
  tools/ds_train bench/bench_cuda; do
  strip -o "$DIR/bin/$(basename "$t")" "$BUILD/$t"
done
# Every library the binaries resolve here, less glibc's own and the GPU driver's; cuBLAS stays
# behind (hundreds of MiB; the GPU machine's toolkit or PyTorch has it), the CUDA runtime goes.
ldd "$DIR"/bin/* | awk '/=> \// { print $3 }' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | ld-linux* | libcuda.so*) ;;
    libcublas*) ;;
    *) cp -L "$lib" "$DIR/lib/" ;;
  esac
done
# The test binaries read fixtures at the absolute source path they were built from.
sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$BUILD/CMakeCache.txt" >"$DIR/built_at"
du -sh "$DIR/bin" "$DIR/lib"

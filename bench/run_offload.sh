#!/usr/bin/env bash
# The offload headline (bench/RESULTS.md): a GPT-2-layout model whose fp32 model states (16 bytes
# per parameter) exceed this machine's RAM trains with ZeRO-3 and the optimizer state and the
# parameters on NVMe; then the largest model that trains in RAM. In the same run, fio measures the
# swap path's sequential read and write bandwidth (O_DIRECT, 1 MiB blocks, queue depth 8: the aio
# settings bench_offload uses), which bench_offload turns into the I/O time of a step.
#
#   bash bench/run_offload.sh [--path DIR] [--steps 3] [--big "24 2560 20"] [--ram "20 1600 25"]
#
# --big / --ram: "layers embd heads" of the offloaded model (default ~2.0B parameters) and of the
# in-RAM one (default ~0.69B; 0.94B was killed by the OOM killer on 24 GiB). Needs ~30 GB free on --path (default build/offload_bench) for the
# 2B model. Prints one BENCH line per run. OFFLOAD_ARGS="--buffer_count 6" passes options to the
# offloaded run's bench_offload (its --help lists them).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${DS_BUILD_DIR:-build}"
path="$BUILD_DIR/offload_bench"
steps=3
big="24 2560 20"
ram="20 1600 25"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --path) path="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --big) big="$2"; shift 2 ;;
    --ram) ram="$2"; shift 2 ;;
    *) echo "run_offload.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
command -v fio >/dev/null || { echo "run_offload.sh: fio is missing (scripts/setup.sh installs it)" >&2; exit 1; }
cmake --build "$BUILD_DIR" --target bench_offload -j2 >/dev/null
mkdir -p "$path"
trap 'rm -rf "$path/fio.dat" "$path/ds_swap"' EXIT

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB RAM"
echo "swap path: $path ($(df -h "$path" | awk 'NR==2{print $4 " free on " $1}'), $(stat -f -c %T "$path"))"

# Disk bandwidth on the same path, same run. fio twice: with its default buffers, and with 2 MiB
# pages (GLIBC_TUNABLES=glibc.malloc.hugetlb=1), as deepspeed.cpp's I/O buffers are: on a virtio
# disk a 1 MiB transfer from scattered 4 KiB pages is split in two requests (bench/RESULTS.md,
# "ds_io vs fio"). The larger pair is the disk's bandwidth and the reference for bench_offload.
fio_gbps() {  # write|read [tunables] -> GB/s
  GLIBC_TUNABLES="${2:-}" fio --name=probe --filename="$path/fio.dat" --rw="$1" --bs=1M --iodepth=8 \
    --ioengine=io_uring --direct=1 --size=4G --numjobs=1 --output-format=json 2>/dev/null |
    python3 -c "import json, sys; print('%.3f' % (json.load(sys.stdin)['jobs'][0]['$1']['bw_bytes'] / 1e9))"
}
wbw_small=$(fio_gbps write)
rbw_small=$(fio_gbps read)
wbw=$(fio_gbps write glibc.malloc.hugetlb=1)
rbw=$(fio_gbps read glibc.malloc.hugetlb=1)
rm -f "$path/fio.dat"
echo "fio on $path: 4 KiB-page buffers read $rbw_small GB/s, write $wbw_small GB/s; 2 MiB-page buffers read $rbw GB/s, write $wbw GB/s"
python3 - "$rbw" "$wbw" "$rbw_small" "$wbw_small" <<'PY'
import sys
r, w, rs, ws = map(float, sys.argv[1:])
print("BENCH disk read_gbps=%.3f write_gbps=%.3f read_gbps_4k_pages=%.3f write_gbps_4k_pages=%.3f" % (max(r, rs), max(w, ws), rs, ws))
PY
rbw=$(python3 -c "print(max($rbw, $rbw_small))")
wbw=$(python3 -c "print(max($wbw, $wbw_small))")

read -r L C H <<<"$big"
"$BUILD_DIR/bench/bench_offload" --name "gpt-${L}x${C}" --layers "$L" --embd "$C" --heads "$H" \
  --nvme "$path" --offload both --steps "$steps" --read_gbps "$rbw" --write_gbps "$wbw" \
  ${OFFLOAD_ARGS:-}
read -r L C H <<<"$ram"
"$BUILD_DIR/bench/bench_offload" --name "gpt-${L}x${C}" --layers "$L" --embd "$C" --heads "$H" \
  --offload none --fp32_grads --steps "$steps" --read_gbps "$rbw" --write_gbps "$wbw"

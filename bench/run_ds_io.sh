#!/usr/bin/env bash
# ds_io (tools/ds_io.cpp, our aio layer) against fio on the same folder, same settings, same run:
# sequential write then read of a 2 GiB file, O_DIRECT, io_uring, 1 MiB blocks, 8 in flight, one
# job / one thread. Then `ds_io --sweep` (1 GiB) for the best settings on this disk.
#
#   bash bench/run_ds_io.sh [--path DIR] [--size 2G] [--rounds 3] [--no_sweep] [--no_thp]
#
# Each round runs fio write, fio read (fresh file, removed after) and ds_io --both --loops 1 (its
# own fresh file), fio first in odd rounds and ds_io first in even ones: interleaved, so a burst of
# other load hits one round of one tool rather than decide the comparison. Between a write and the
# read that follows, the file is fsync'ed outside the timings on both sides (`sync FILE` for fio,
# ds_io's own fsync). Neither write figure includes that fsync (fio's default).
#
# The rounds run twice, with two buffer layouts:
#   buffers=default  each program's own memory, as a user runs them (fio: 8 MiB from malloc; ds_io:
#                    one 256 MiB io::AlignedBuffer). How physically contiguous those pages happen
#                    to be depends on the machine's free memory at that moment.
#   buffers=thp      both programs under GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (glibc >= 2.35:
#                    malloc'd memory is advised MADV_HUGEPAGE), i.e. 2 MiB pages on both sides.
# The layout matters on disks that pay per scatter-gather segment (virtio-blk: a 1 MiB buffer of
# scattered 4 KiB pages is 256 segments, more than max_segments = 254, and goes out as two
# requests); see bench/RESULTS.md, "ds_io vs fio". buffers=thp is the like-for-like engine
# comparison; --no_thp skips it.
#
# Environment: DS_IO_PATH (default folder: <repo>/build/ds_io_bench), DS_BUILD_DIR (default build),
# SKIP_BUILD=1 (do not build the ds_io target first), FIO (default fio).
#
# Output: the raw lines of every run (with the block device's request counts: device-wide, so other
# jobs' I/O on that disk is counted too), then per layout and op
#   BENCH ds_io_vs_fio op=<read|write> ds_io_gbps=<a> fio_gbps=<b> ratio=<a/b> median_ratio=<..>
#         buffers=<default|thp> ...
# (a, b: best round; GB/s = 1e9 bytes/s on both sides: fio's bw_bytes), then the sweep's BENCH
# ds_io lines and its suggested "aio" section (default buffers).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
build="${DS_BUILD_DIR:-build}"
DIR="${DS_IO_PATH:-$repo/build/ds_io_bench}" SIZE=2G ROUNDS=3 SWEEP=1 LAYOUTS="default thp"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --path) DIR=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --no_sweep) SWEEP=0; shift ;;
    --no_thp) LAYOUTS=default; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_ds_io.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
FIO=${FIO:-fio}
command -v "$FIO" >/dev/null || { echo "run_ds_io.sh: fio not found (apt-get install fio)" >&2; exit 1; }
[[ "${SKIP_BUILD:-0}" == 1 ]] || cmake --build "$build" --target ds_io -j2 >/dev/null
DS_IO="$build/tools/ds_io"
[[ -x "$DS_IO" ]] || { echo "run_ds_io.sh: $DS_IO missing (build the ds_io target)" >&2; exit 1; }
mkdir -p "$DIR"
FIOFILE="$DIR/fio.$$.tmp"
trap 'rm -f "$FIOFILE"' EXIT INT TERM

echo "# $(date -Is) $(lscpu | grep 'Model name' | sed 's/  */ /g')"
echo "# path $DIR: $(df -hT "$DIR" | tail -1 | awk '{print $2, $3" size,", $5" free, on "$1}')"
echo "# uptime before: $(uptime)"

TUNE=""  # GLIBC_TUNABLES for fio and ds_io (not for the python3 helpers)
# fio_run <write|read>: one fio job, prints GB/s (bw_bytes / 1e9).
fio_run() {
  env GLIBC_TUNABLES="$TUNE" "$FIO" --name=ds_io_vs_fio --filename="$FIOFILE" --rw="$1" --bs=1M \
    --iodepth=8 --numjobs=1 --size="$SIZE" --direct=1 --ioengine=io_uring --output-format=json |
    python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]['$1']; print(f\"{j['bw_bytes']/1e9:.3f}\")"
}

# Requests the block device completed (reads, writes) while a command ran. Empty when the path is
# not on a block device listed in /proc/diskstats.
DEV=$(basename "$(df --output=source "$DIR" | tail -1)")
dstat() { awk -v d="$DEV" '$3 == d {print $4, $8}' /proc/diskstats; }
reqs() {  # reqs <before> <after> <MiB moved>
  [[ -n "$1" ]] || return 0
  echo "$1 $2" | awk -v m="$3" -v dev="$DEV" '{printf "device %s requests: %d reads, %d writes (%.2f per MiB moved)\n", dev, $3-$1, $4-$2, ($3-$1+$4-$2)/m}'
}
MIB=$(python3 -c "s='$SIZE'; u={'K':1/1024,'M':1,'G':1024,'T':1<<20}; print(int(float(s[:-1])*u[s[-1].upper()]) if s[-1].upper() in u else int(s)//(1<<20))")

declare -A vals
run_fio() {
  rm -f "$FIOFILE"
  local w rd a b c
  a=$(dstat); w=$(fio_run write); sync "$FIOFILE"; b=$(dstat)
  rd=$(fio_run read); c=$(dstat); rm -f "$FIOFILE"
  echo "$tag fio: write $w GB/s, read $rd GB/s"
  echo "$tag fio write: $(reqs "$a" "$b" "$MIB")"; echo "$tag fio read: $(reqs "$b" "$c" "$MIB")"
  vals[fio_write]+=" $w"; vals[fio_read]+=" $rd"
}
run_ds_io() {
  local out a b
  a=$(dstat)
  out=$(env GLIBC_TUNABLES="$TUNE" "$DS_IO" --path "$DIR" --size "$SIZE" --both --block_size 1M \
          --queue_depth 8 --threads 1 --engine uring --loops 1)
  b=$(dstat)
  echo "$out" | sed "s/^/$tag ds_io: /"
  echo "$tag ds_io write+read: $(reqs "$a" "$b" "$((2 * MIB))")"
  vals[ds_write]+=" $(echo "$out" | sed -n 's/^BENCH ds_io op=write gbps=\([0-9.]*\).*/\1/p')"
  vals[ds_read]+=" $(echo "$out" | sed -n 's/^BENCH ds_io op=read gbps=\([0-9.]*\).*/\1/p')"
}

summary=()
for layout in $LAYOUTS; do
  [[ $layout == thp ]] && TUNE=glibc.malloc.hugetlb=1 || TUNE=""
  vals=([fio_write]="" [fio_read]="" [ds_write]="" [ds_read]="")
  for ((r = 1; r <= ROUNDS; r++)); do  # odd rounds fio first, even rounds ds_io first
    tag="buffers=$layout round $r"
    if ((r % 2)); then run_fio; run_ds_io; else run_ds_io; run_fio; fi
  done
  for op in write read; do
    summary+=("$(python3 - "$op" "${vals[ds_$op]}" "${vals[fio_$op]}" "$layout" <<PY
import statistics, sys
op, a, b, layout = sys.argv[1], [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()], sys.argv[4]
print(f"BENCH ds_io_vs_fio op={op} ds_io_gbps={max(a):.3f} fio_gbps={max(b):.3f} ratio={max(a)/max(b):.2f} "
      f"median_ratio={statistics.median(a)/statistics.median(b):.2f} buffers={layout} block_size=1M "
      f"queue_depth=8 threads=1 size=$SIZE rounds=$ROUNDS")
PY
)")
  done
done
printf '%s\n' "${summary[@]}"

if [[ $SWEEP == 1 ]]; then
  echo "# ds_io --sweep (1 GiB per setting, default buffers)"
  "$DS_IO" --path "$DIR" --size 1G --sweep
fi
echo "# uptime after: $(uptime)"

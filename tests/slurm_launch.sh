#!/usr/bin/env bash
# The launcher's Slurm path end to end: inside a 2-task allocation, `deepspeed --launcher slurm`
# starts the ranks with srun (MPI initialised through PMIx) and runs the comm tests and ZeRO's
# same-losses test on them. Skips (exit 77) when no Slurm cluster answers here: start a one-node
# cluster with scripts/slurm_local.sh (root), as CI does.
#
#   tests/slurm_launch.sh LAUNCHER TEST_COMM TEST_ZERO
set -uo pipefail
launcher=$1 test_comm=$2 test_zero=$3
if ! command -v salloc >/dev/null || ! timeout 10 sinfo -h -o %t 2>/dev/null | grep -qE 'idle|mix'; then
  echo "slurm_launch: no Slurm cluster answers on this machine; skipping (scripts/slurm_local.sh starts one)"
  exit 77
fi
run() {
  timeout 600 salloc --immediate=60 -N1 -n2 --oversubscribe \
    "$launcher" --launcher slurm --num_procs 2 "$@" 2>&1
}
out=$(run "$test_comm" '--gtest_filter=Comm.WorldMatchesEnvironment:Comm.LauncherVariablesMatchTheWorld:Comm.ReduceToEachRootEveryDtype:Comm.AllReduceSumAndMaxEveryDtype')
rc=$?
echo "$out"
if grep -q "Unable to allocate resources\|Immediate allocation not available" <<<"$out"; then
  echo "slurm_launch: the cluster gave no allocation; skipping"
  exit 77
fi
[[ $rc == 0 ]] || { echo "slurm_launch: test_comm under srun failed (exit $rc)"; exit 1; }
grep -q "\[comm\] world: size 2, backend=mpi" <<<"$out" || { echo "slurm_launch: the ranks did not form an MPI world of 2"; exit 1; }
run "$test_zero" '--gtest_filter=Stages/Zero.SameLossesAsOneProcess/*' || { echo "slurm_launch: test_zero under srun failed"; exit 1; }
echo "slurm_launch: passed"

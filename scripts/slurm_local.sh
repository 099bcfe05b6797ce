#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for testing the launcher's `--launcher slurm` path
# (ctest -R slurm). Root only; idempotent. Installs slurm-wlm and munge from Debian, writes a
# munge key and /etc/slurm/slurm.conf (only if none exists: an existing cluster is left alone),
# starts munged, slurmctld and slurmd, and waits until `sinfo` shows the node idle.
#
#   sudo bash scripts/slurm_local.sh        # then: salloc -n2 build/tools/deepspeed --launcher slurm ...
#
# scripts/test.sh runs it when DS_TEST_SLURM=1 (CI sets that); otherwise the Slurm test skips.
set -euo pipefail
say() { echo "slurm_local: $*"; }
[[ "$(id -u)" == 0 ]] || { say "needs root (it installs packages and starts daemons)"; exit 1; }

if sinfo -h -o %t 2>/dev/null | grep -qE 'idle|mix|alloc'; then
  say "a Slurm cluster already answers: $(sinfo -h -o '%P %t %N' | head -1)"
  exit 0
fi
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  say "installing slurm-wlm and munge"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >/dev/null
fi

mkdir -p /etc/munge /var/log/munge /run/munge /var/lib/munge
[[ -s /etc/munge/munge.key ]] || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
chown -R munge:munge /etc/munge /var/log/munge /run/munge /var/lib/munge
chmod 400 /etc/munge/munge.key
pgrep -x munged >/dev/null || /usr/sbin/munged --force

host=$(hostname -s)
cpus=$(nproc)
mem=$(awk '/MemTotal/ { printf "%d", $2 / 1024 * 0.8 }' /proc/meminfo)
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
if [[ ! -e /etc/slurm/slurm.conf ]]; then
  say "writing /etc/slurm/slurm.conf (node $host, $cpus CPUs)"
  cat >/etc/slurm/slurm.conf <<CONF
# Written by deepspeed.cpp's scripts/slurm_local.sh: a one-node cluster for tests.
ClusterName=local
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
ReturnToService=2
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
fi
pgrep -x slurmctld >/dev/null || /usr/sbin/slurmctld
pgrep -x slurmd >/dev/null || /usr/sbin/slurmd
for _ in $(seq 30); do
  if sinfo -h -o %t 2>/dev/null | grep -qE 'idle|mix|alloc'; then
    say "up: $(sinfo -h -o '%P %t %N' | head -1)"
    exit 0
  fi
  sleep 1
done
say "the node did not come up; see /var/log/slurm/slurmctld.log and slurmd.log"
exit 1

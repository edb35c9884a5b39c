#!/usr/bin/env bash
# paratrain under a real Slurm: a private one-node cluster (Debian's
# slurm-wlm 22.05: slurmctld, slurmd; munged for authentication) on
# loopback, its config, state and sockets in a temporary folder, stopped by
# pid at the end. Jobs run `srun paratrain train` as a user's batch script
# would (docs/launchers.md, Slurm). Every run is the README's MLP for 120
# steps at 2 tasks, rank 0 sleeping 30 ms a step (profile.test_slow_ms: a
# run of ~4 s that a signal can reach in the middle; numerics unchanged); each case's final checkpoint must equal the
# uninterrupted run's bitwise (`paratrain checkpoint compare --rtol 0`):
#
#   requeue   `sbatch --requeue`; at step >= 30 `scancel --signal=USR2` (as
#             Slurm's --signal or a preemption does) reaches both tasks: they
#             stop at one step boundary with a checkpoint and exit 75, the
#             script runs `scontrol requeue`, the job starts again and
#             continues from the checkpoint (train.resume = "auto").
#   suspend   `scontrol suspend` at step >= 30 for 5 s (longer than
#             world.heartbeat_timeout_s = 1 and world.timeout_s = 2), then
#             `scontrol resume`: the run finishes (Note [A suspended job] in
#             launch/supervisor.cpp, Note [Deadlines that stop with the
#             process] in core/running_deadline.h).
#   packing   two jobs at once on the node, neither with MASTER_PORT: each
#             serves its store on its own port (15000 + the job id's last
#             four digits) and both finish.
#
# Root only (the daemons run as root, SlurmUser=root), and only where the
# Slurm binaries are installed (scripts/install-deps.sh installs them):
# skipped elsewhere with exit 77 and the reason.
#
#   tests/launch/slurm_test.sh BUILD_DIR SOURCE_DIR   (KEEP_SLURM_DIR=1: keep the folder, its logs)
set -uo pipefail

build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
exe=$build/paratrain
skip() {
  echo "SKIP: $*"
  exit 77
}
for b in slurmctld slurmd munged sbatch srun scontrol scancel squeue sinfo; do
  command -v "$b" >/dev/null || skip "'$b' is missing (apt-get install slurm-wlm munge; scripts/install-deps.sh does)"
done
[[ $(id -u) -eq 0 ]] || skip "the private cluster's daemons run as root (SlurmUser=root)"
[[ -x $exe ]] || { echo "no $exe: build the paratrain target first"; exit 1; }

dir=$(mktemp -d /tmp/paratrain-slurm-XXXXXX)
cleanup() {
  local f
  for f in slurmd slurmctld munged; do
    [[ -f $dir/$f.pid ]] && kill "$(cat "$dir/$f.pid")" 2>/dev/null
  done
  sleep 0.5
  [[ -n ${KEEP_SLURM_DIR:-} ]] && echo "kept $dir" || rm -rf "$dir"
}
trap cleanup EXIT

# Free TCP ports for the two daemons (a parallel test may hold the defaults).
read -r ctld_port slurmd_port < <(python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
host=$(hostname -s)
mkdir -p "$dir/state" "$dir/spool" "$dir/log" "$dir/runs"
head -c 1024 /dev/urandom >"$dir/munge.key"
chmod 400 "$dir/munge.key"
munged --key-file="$dir/munge.key" --socket="$dir/munge.sock" --pid-file="$dir/munged.pid" \
  --seed-file="$dir/munge.seed" --log-file="$dir/munged.log" --force ||
  skip "munged does not start here: $(tail -n 2 "$dir/munged.log" 2>/dev/null)"
# CPUs=4 on 2 cores (config_overrides): room for two 2-task jobs at once.
cat >"$dir/slurm.conf" <<EOF
ClusterName=paratrain-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
AuthInfo=socket=$dir/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SwitchType=switch/none
KillWait=10
NodeName=$host NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF=$dir/slurm.conf
slurmctld -f "$SLURM_CONF" || skip "slurmctld does not start: $(tail -n 3 "$dir/log/slurmctld.log")"
slurmd -f "$SLURM_CONF" || skip "slurmd does not start: $(tail -n 3 "$dir/log/slurmd.log")"
for ((t = 0; t < 60; ++t)); do
  [[ $(sinfo -h -o %T 2>/dev/null) == idle ]] && break
  sleep 0.5
done
[[ $(sinfo -h -o %T 2>/dev/null) == idle ]] ||
  skip "the private cluster's node did not come up: $(sinfo 2>&1 | tail -n 1); $(tail -n 3 "$dir/log/slurmd.log")"
echo "private Slurm cluster up: $(sinfo -h -o '%P %a %D %T %N'), controller on port $ctld_port"

export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
# fail, show and the failure count.
. "$(dirname "$0")/check_report.sh"

# The batch script of docs/launchers.md: srun the training, requeue on 75.
cat >"$dir/job.sh" <<EOF
#!/bin/sh
srun "$exe" train -c "$src/configs/fashion_mnist_mlp.toml" --set run.output_dir="$dir/runs" \\
  --set train.epochs=1 --set train.max_steps=120 --set train.checkpoint_every_steps=0 --set run.log_every=1 \\
  --set log.progress=off --set train.preempt_signals=SIGTERM,SIGUSR2 --set train.resume=auto \\
  --set world.heartbeat_s=0.25 --set world.heartbeat_timeout_s=1 \\
  --set profile.test_slow_rank=0 --set profile.test_slow_ms=30 "\$@"
code=\$?
# 75: stopped at a checkpoint on the signal; back in the queue to continue from it.
if [ "\$code" -eq 75 ]; then scontrol requeue "\$SLURM_JOB_ID"; fi
exit "\$code"
EOF
chmod +x "$dir/job.sh"

# submit NAME [sbatch flags...]: the job id. $script_args: more for job.sh.
script_args=()
submit() {
  local name=$1
  shift
  # --open-mode=append: a requeued start adds to the first start's log.
  sbatch --parsable -n 2 -J "$name" -o "$dir/$name.%j.log" --open-mode=append "$@" "$dir/job.sh" \
    --set run.name="$name" "${script_args[@]}"
}
state_of() { scontrol show job "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }
# wait_done JOB: until the job has ended (false after 240 s).
wait_done() {
  local s
  for ((t = 0; t < 480; ++t)); do
    s=$(state_of "$1")
    case $s in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | "") return 0 ;; esac
    sleep 0.5
  done
  return 1
}
# wait_step NAME STEP: until the run NAME logged STEP (false after 120 s).
wait_step() {
  local metrics=$dir/runs/$1/version_0/metrics.jsonl
  for ((t = 0; t < 240; ++t)); do
    [[ -f $metrics ]] && grep -q "\"step\":$2[,}]" "$metrics" && return 0
    sleep 0.5
  done
  return 1
}
final_of() { ls -d "$dir/runs/$1"/version_*/checkpoints/step_00000120 2>/dev/null | tail -n 1; }
# same_as_whole NAME: its step-120 checkpoint equals the uninterrupted run's, bitwise.
same_as_whole() {
  local got
  got=$(final_of "$1")
  [[ -n $got ]] || { fail "$1 has no step-120 checkpoint"; return 1; }
  "$exe" checkpoint compare "$got" "$(final_of whole)" --rtol 0 --all >"$dir/$1.compare" 2>&1 ||
    { fail "$1 differs from the uninterrupted run"; show "$dir/$1.compare"; return 1; }
}

case=whole
job=$(submit whole)
wait_done "$job" && [[ $(state_of "$job") == COMPLETED || -z $(state_of "$job") ]] && [[ -n $(final_of whole) ]] ||
  { fail "the uninterrupted job did not complete ($(state_of "$job"))"; show "$(ls "$dir"/whole.*.log | head -n 1)"; exit 1; }
echo "whole: job $job completed, $(final_of whole)"

case=requeue
job=$(submit requeue --requeue)
if wait_step requeue 30; then
  # The step the run had logged when the signal went out, and when.
  signal_step=$(grep -o '"step":[0-9]*' "$dir/runs/requeue/version_0/metrics.jsonl" | tail -n 1 | cut -d: -f2)
  signal_at=$(date +%s.%N)
  scancel --signal=USR2 "$job"
  # The job goes back to the queue (its script requeued it) and runs again.
  # Slurm holds a requeued job for about two minutes before it is eligible
  # again; the test makes it eligible at once, as an admin may.
  # (Issued again every 2 s while it waits: an update that lands before the
  # requeue has set its own begin time is overwritten by it.)
  requeued=0
  for ((t = 0; t < 480; ++t)); do
    grep -q "Restarts=[1-9]" <(scontrol show job "$job" 2>/dev/null) && requeued=1
    if [[ $requeued == 1 && $(state_of "$job") == PENDING ]] && ((t % 4 == 0)); then
      scontrol update JobId="$job" StartTime=now 2>/dev/null
    fi
    [[ $requeued == 1 && $(state_of "$job") == COMPLETED ]] && break
    sleep 0.5
  done
  [[ $requeued == 1 ]] || fail "the job was not requeued"
  [[ $(state_of "$job") == COMPLETED ]] || fail "the requeued job did not complete: $(scontrol show job "$job" | grep -o 'JobState=[^ ]*\|Reason=[^ ]*\|StartTime=[^ ]*' | tr '\n' ' ')"
  wait_done "$job"
  logs=$(ls "$dir"/requeue.*.log)
  grep -q "resumed from" $logs || fail "the requeued job did not resume from the preemption checkpoint"
  grep -q "preempted\|stopping at step" $logs || fail "no preemption logged"
  # From the signal to the tasks' exit (the stamp of srun's line about
  # exit code 75 is not there: the rank's warning, logged after its save,
  # is the last thing before the exit).
  stop_line=$(grep -h 'preempted by SIGUSR2 at step' $logs | head -n 1)
  stop_step=$(echo "$stop_line" | grep -o 'at step [0-9]*' | grep -o '[0-9]*')
  stop_clock=$(echo "$stop_line" | grep -o '^\[[0-9:.]*\]' | tr -d '[]')
  stop_seconds=$(python3 -c "
import datetime, sys
sent = datetime.datetime.fromtimestamp(float(sys.argv[1]))
h, m, s = sys.argv[2].split(':')
stop = sent.replace(hour=int(h), minute=int(m), second=int(float(s)), microsecond=int(round(float(s) % 1 * 1e6)))
print(f'{(stop - sent).total_seconds():.2f}')" "$signal_at" "$stop_clock" 2>/dev/null)
  same_as_whole requeue && echo "requeue: USR2 at step ${signal_step:-?}, checkpoint at step ${stop_step:-?} (no step lost) ${stop_seconds:-?} s after scancel; requeued, resumed, equal to the uninterrupted run"
  [[ $failures == 0 ]] || for l in $logs; do show "$l" 15; done
else
  fail "the job did not reach step 30"
  show "$(ls "$dir"/requeue.*.log | head -n 1)"
fi

case=suspend
# world.timeout_s = 2: the collectives in flight pass their wall-clock
# deadline while suspended (Note [Deadlines that stop with the process]).
script_args=(--set world.timeout_s=2)
job=$(submit suspend)
script_args=()
if wait_step suspend 30; then
  scontrol suspend "$job" || fail "scontrol suspend failed"
  sleep 5
  scontrol resume "$job" || fail "scontrol resume failed"
  wait_done "$job"
  same_as_whole suspend &&
    echo "suspend: suspended 5 s at step >= 30 (world.timeout_s = 2), resumed, equal to the uninterrupted run"
else
  fail "the job did not reach step 30"
fi
[[ $failures == 0 ]] || show "$(ls "$dir"/suspend.*.log | head -n 1)" 30

case=packing
a=$(submit pack_a)
b=$(submit pack_b)
both=0
for ((t = 0; t < 240; ++t)); do
  [[ $(state_of "$a") == RUNNING && $(state_of "$b") == RUNNING ]] && both=1 && break
  [[ $(state_of "$a") == COMPLETED || $(state_of "$b") == COMPLETED ]] && break
  sleep 0.25
done
wait_done "$a"
wait_done "$b"
[[ $both == 1 ]] || echo "packing: note: the two jobs were not seen running at the same moment"
same_as_whole pack_a && same_as_whole pack_b && echo "packing: two jobs on the node at once ($([[ $both == 1 ]] && echo "both running together" || echo "one after the other")), both equal to the uninterrupted run"
[[ $failures == 0 ]] || { show "$(ls "$dir"/pack_a.*.log | head -n 1)"; show "$(ls "$dir"/pack_b.*.log | head -n 1)"; }

if ((failures > 0)); then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all Slurm cases passed"

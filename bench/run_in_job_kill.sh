#!/usr/bin/env bash
# The CLI check of in-job recovery (elastic.in_job, docs/elastic.md): the
# same Fashion-MNIST run under `paratrain launch --keep-going --nproc-per-node
# NPROC`, undisturbed and with rank KILL_RANK SIGKILLing itself after step
# KILL_STEP (PARATRAIN_FAULT_KILL: a real kill -9 mid-epoch). The disturbed
# run must finish on NPROC-1 ranks with the test accuracy within 0.5 points
# of the undisturbed one. Prints one JSON line per run, then a summary.
# Builds nothing: build `paratrain` first.
#
#   bench/run_in_job_kill.sh                       # 3 ranks, rank 2 killed after step 150, 3 epochs
#   EPOCHS=1 KILL_STEP=100 bench/run_in_job_kill.sh
#   ZERO_STAGE=2 CHECKPOINT_EVERY=50 KILL_STEP=170 bench/run_in_job_kill.sh
#                                                  # ZeRO-2: the survivors roll back to step 150's checkpoint
#
# Environment: BUILD_DIR (build), NPROC (3), KILL_RANK (NPROC-1), KILL_STEP
# (150), EPOCHS (3), CONFIG (configs/fashion_mnist_mlp.toml), OUT_DIR,
# ZERO_STAGE (0: DDP; 1-3 roll back to the latest checkpoint, docs/elastic.md),
# CHECKPOINT_EVERY (train.checkpoint_every_steps, 0: at epoch ends only).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-build}
[[ $build = /* ]] || build=$root/$build
nproc=${NPROC:-3}
kill_rank=${KILL_RANK:-$((nproc - 1))}
kill_step=${KILL_STEP:-150}
epochs=${EPOCHS:-3}
config=${CONFIG:-$root/configs/fashion_mnist_mlp.toml}
out_dir=${OUT_DIR:-$(mktemp -d -t paratrain-in-job.XXXXXX)}
zero_stage=${ZERO_STAGE:-0}
checkpoint_every=${CHECKPOINT_EVERY:-0}
exe=$build/paratrain
[[ -x $exe ]] || { echo "run_in_job_kill.sh: $exe is missing; build it first" >&2; exit 2; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mkdir -p "$out_dir"

run() {  # name, extra env...
  local name=$1; shift
  local log=$out_dir/$name.log
  local start=$(date +%s.%N) rc=0
  env "$@" "$exe" launch --keep-going --nproc-per-node "$nproc" -- "$exe" train -c "$config" \
      --set run.output_dir="$out_dir/runs" --set run.name="$name" --set train.epochs="$epochs" \
      --set elastic.in_job=true --set log.progress=off --set zero.stage="$zero_stage" \
      --set train.checkpoint_every_steps="$checkpoint_every" >"$log" 2>&1 || rc=$?
  local end=$(date +%s.%N)
  local acc=$(grep -o 'test accuracy [0-9.]*%' "$log" | tail -1 | grep -o '[0-9.]*' || echo null)
  local metrics=$out_dir/runs/$name/version_0/metrics.jsonl
  local recovery=$(grep '"kind":"recovery"' "$metrics" 2>/dev/null | head -1)
  local steps=$(grep '"kind":"train"' "$metrics" 2>/dev/null | tail -1 | grep -o '"step":[0-9]*' | grep -o '[0-9]*$')
  printf '{"run":"%s","zero_stage":%s,"checkpoint_every_steps":%s,"exit_code":%s,"seconds":%.1f,"steps":%s,' \
      "$name" "$zero_stage" "$checkpoint_every" "$rc" "$(echo "$end - $start" | bc)" "${steps:-null}"
  printf '"test_accuracy_pct":%s,"recovery":%s}\n' "${acc:-null}" "${recovery:-null}"
  echo "$acc" >"$out_dir/$name.acc"
}

run undisturbed
run killed PARATRAIN_FAULT_KILL="$kill_rank:$kill_step"
a=$(cat "$out_dir/undisturbed.acc"); b=$(cat "$out_dir/killed.acc")
echo "in_job_kill: $nproc ranks, zero.stage $zero_stage, rank $kill_rank killed after step $kill_step: accuracy $b% vs $a% undisturbed" \
     "(diff $(echo "$b - $a" | bc) points); logs in $out_dir"

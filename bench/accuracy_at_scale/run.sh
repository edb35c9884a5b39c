#!/usr/bin/env bash
# The accuracy-at-scale study: the Fashion-MNIST CNN (base.toml) with a
# per-rank batch of 64 at 1, 2 and 4 ranks, and at global batches of 2048 and
# 4096 (2 ranks x 64 x train.accumulate 16 or 32), trained for the same number
# of epochs with plain SGD (the baseline's rate), linearly scaled rate +
# warmup (Goyal et al.), LARS and LAMB. Prints a table (final and best test
# accuracy, first epoch at >= 88%) and draws the curves with `paratrain plot`.
# Runs go in order of importance, so a cut-short study still answers.
#
#   bench/accuracy_at_scale/run.sh                      # all runs, ~60 min on 2 quiet cores
#   RUNS="b64 b2048_lars" EPOCHS=2 bench/accuracy_at_scale/run.sh
#
# Environment: BUILD_DIR (build), OUT (runs and plots; default
# bench/results/accuracy-at-scale), EPOCHS (6), RUNS (names below; default
# all), LARS_LR, LAMB_LR (global rates of LARS and LAMB; see the results for
# how they were picked).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${BUILD_DIR:-build}
[[ $build = /* ]] || build=$root/$build
out=${OUT:-$root/bench/results/accuracy-at-scale}
epochs=${EPOCHS:-6}
lars_lr=${LARS_LR:-4.0}
lamb_lr=${LAMB_LR:-0.01}
all="b64 b2048_scaled b2048_lars b2048_lamb b2048_plain b128 b256 b4096_scaled b4096_lars b4096_lamb"
runs=${RUNS:-$all}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mkdir -p "$out/runs"

# name -> ranks and extra keys. Global batch = 64 * ranks * accumulate.
spec() {
  case $1 in
    b64)          echo "1 --set ddp.mode=none" ;;
    b128)         echo "2" ;;
    b256)         echo "4" ;;
    b2048_plain)  echo "2 --set train.accumulate=16" ;;
    # Goyal et al.: k x the rate, warmup from the unscaled rate (factor 1/k).
    b2048_scaled) echo "2 --set train.accumulate=16 --set lr.scaling=linear --set lr.warmup_epochs=1 --set lr.warmup_start_factor=0.03125" ;;
    b4096_scaled) echo "2 --set train.accumulate=32 --set lr.scaling=linear --set lr.warmup_epochs=1 --set lr.warmup_start_factor=0.015625" ;;
    # LARS and LAMB set their own global rate (not scaled from the baseline).
    b2048_lars)   echo "2 --set train.accumulate=16 --set optimizer.kind=lars --set optimizer.lr=$lars_lr --set lr.base_batch=0 --set lr.warmup_epochs=1" ;;
    b4096_lars)   echo "2 --set train.accumulate=32 --set optimizer.kind=lars --set optimizer.lr=$lars_lr --set lr.base_batch=0 --set lr.warmup_epochs=1" ;;
    b2048_lamb)   echo "2 --set train.accumulate=16 --set optimizer.kind=lamb --set optimizer.lr=$lamb_lr --set lr.base_batch=0 --set lr.warmup_epochs=1" ;;
    b4096_lamb)   echo "2 --set train.accumulate=32 --set optimizer.kind=lamb --set optimizer.lr=$lamb_lr --set lr.base_batch=0 --set lr.warmup_epochs=1" ;;
    *) echo "unknown run $1 (known: $all)" >&2; return 1 ;;
  esac
}

for name in $runs; do
  read -r ranks extra <<<"$(spec "$name")"
  global=$((64 * ranks))
  [[ $extra =~ accumulate=([0-9]+) ]] && global=$((global * BASH_REMATCH[1]))
  log_every=$(( 60000 / global / 8 )); (( log_every >= 1 )) || log_every=1
  echo "== $name: $ranks rank(s), global batch $global" >&2
  # shellcheck disable=SC2086
  "$build/paratrain" launch --nproc-per-node "$ranks" -- "$build/paratrain" train -c "$root/bench/accuracy_at_scale/base.toml" \
    --set run.output_dir="$out/runs" --set run.name="$name" --set train.epochs="$epochs" \
    --set run.log_every="$log_every" $extra > "$out/runs/$name.log" 2>&1 ||
    echo "!! $name failed: see $out/runs/$name.log" >&2
done

dirs=()
for name in $all; do
  # each run's newest version (runs/<name>/version_N)
  latest=$(find "$out/runs/$name" -maxdepth 1 -name 'version_*' 2>/dev/null | sort -V | tail -1)
  [[ -n $latest && -f $latest/metrics.jsonl ]] && dirs+=("$latest")
done
(( ${#dirs[@]} > 0 )) || { echo "no run finished: nothing to tabulate" >&2; exit 1; }
python3 "$root/bench/accuracy_at_scale/table.py" "${dirs[@]}" | tee "$out/table.md"
"$build/paratrain" plot -o "$out/plots" "${dirs[@]}"

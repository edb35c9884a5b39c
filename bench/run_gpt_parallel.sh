#!/usr/bin/env bash
# The GPT parallelism benchmark, end to end: bench/gpt_parallel at each
# layout (1 process; tp = 2, 4; cp = 2, 4; tp = 2 with Megatron-SP) on
# configs/gpt_fortunes.toml with dropout 0, one JSON line per run in
# $OUT_DIR/runs.jsonl, then a table (bench/gpt_parallel_report.py): tokens/s,
# parameters per rank, bytes per step of each collective next to Megatron's
# analytic count. Builds nothing: build `paratrain` and `gpt_parallel` first.
#
#   bench/run_gpt_parallel.sh                     # ~5 min on 2 cores
#   LAYOUTS="tp2 cp2" STEPS=4 bench/run_gpt_parallel.sh
#
# Environment: BUILD_DIR (build), LAYOUTS ("single tp2 tp4 cp2 cp4 tp2sp"),
# STEPS (6), WARMUP (2), OUT_DIR (default a temp dir), EXTRA (more --set).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-build}
[[ $build = /* ]] || build=$root/$build
out_dir=${OUT_DIR:-$(mktemp -d -t paratrain-gpt-bench.XXXXXX)}
layouts=${LAYOUTS:-single tp2 tp4 cp2 cp4 tp2sp}
for f in "$build/paratrain" "$build/bench/gpt_parallel"; do
  [[ -x $f ]] || { echo "run_gpt_parallel.sh: $f is missing; build paratrain and gpt_parallel first" >&2; exit 2; }
done
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mkdir -p "$out_dir"
runs=$out_dir/runs.jsonl
cd "$root"
# shellcheck disable=SC2206
common=(-c configs/gpt_fortunes.toml --set model.dropout=0 --set run.output_dir="$out_dir/runs"
        --steps "${STEPS:-6}" --warmup "${WARMUP:-2}" --out "$runs" ${EXTRA:-})
for layout in $layouts; do
  case $layout in
    single) n=1 sets=() ;;
    tp2) n=2 sets=(--set parallel.tp=2) ;;
    tp4) n=4 sets=(--set parallel.tp=4) ;;
    cp2) n=2 sets=(--set parallel.cp=2) ;;
    cp4) n=4 sets=(--set parallel.cp=4) ;;
    tp2sp) n=2 sets=(--set parallel.tp=2 --set parallel.megatron_sp=true) ;;
    *) echo "run_gpt_parallel.sh: unknown layout '$layout'" >&2; exit 2 ;;
  esac
  log=$out_dir/$layout.log
  if ! "$build/paratrain" launch --nproc-per-node "$n" -- "$build/bench/gpt_parallel" "${common[@]}" "${sets[@]}" >"$log" 2>&1; then
    echo "run_gpt_parallel.sh: $layout failed; its output ($log):" >&2
    tail -n 20 "$log" >&2
    exit 1
  fi
  echo "run_gpt_parallel.sh: $layout done" >&2
done
/usr/bin/python3 "$root/bench/gpt_parallel_report.py" "$runs"
echo "runs: $runs" >&2

#!/usr/bin/env bash
# The pipeline benchmark, end to end: bench/pipeline_bubble under paratrain
# launch for each schedule and micro-batch count at p = 2 (a core per rank on
# this 2-core machine: the bubble is measurable) and p = 4 (4 ranks share 2
# cores: compute is shared, so idle ranks lend their core to busy ones and the
# measured bubble is informative only). Prints one JSON line per run, then a
# table: measured bubble (median over steps) next to the formula, peak
# in-flight micro-batches and activation MiB per stage, samples/s.
# Builds nothing: build `paratrain` and `pipeline_bubble` first.
#
#   bench/run_pipeline.sh                 # ~3 min on 2 quiet cores
#   MS="4 8" P4=0 bench/run_pipeline.sh
#
# Environment: BUILD_DIR (build), MS ("1 2 4 8": micro-batch counts at p=2),
# STEPS (8), P4 (1: also run p = 4), OUT (JSON lines file; default a temp file).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-build}
[[ $build = /* ]] || build=$root/$build
ms=${MS:-1 2 4 8}
steps=${STEPS:-8}
p4=${P4:-1}
out=${OUT:-$(mktemp -t paratrain-pipeline-bench.XXXXXX.jsonl)}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

run() {  # nproc, then pipeline_bubble arguments
  local n=$1; shift
  "$build/paratrain" launch --nproc-per-node "$n" -- "$build/bench/pipeline_bubble" --steps "$steps" --out "$out" "$@" \
    > /dev/null 2>&1 || echo "{\"error\": \"pipeline_bubble $* at $n ranks failed\"}" >> "$out"
}

for m in $ms; do
  run 2 --schedule gpipe --microbatches "$m"
  run 2 --schedule 1f1b --microbatches "$m"
  if (( m % 2 == 0 )); then run 2 --schedule interleaved_1f1b --virtual-stages 2 --microbatches "$m"; fi
done
run 2 --schedule 1f1b --microbatches 8 --recompute
run 2 --schedule gpipe --microbatches 8 --recompute
if [[ $p4 == 1 ]]; then
  for m in 4 8; do
    run 4 --schedule gpipe --microbatches "$m"
    run 4 --schedule 1f1b --microbatches "$m"
    run 4 --schedule interleaved_1f1b --virtual-stages 2 --microbatches "$m"
  done
fi

cat "$out"
python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("\n| p | schedule | m | v | recompute | bubble measured (median) | formula | peak in-flight per stage | activation MiB per stage | samples/s |")
print("|---|---|---|---|---|---|---|---|---|---|")
for j in rows:
    if "error" in j:
        print(f"| {j['error']} |"); continue
    mib = ", ".join(f"{b / 2**20:.1f}" for b in j["peak_activation_bytes"])
    print(f"| {j['stages']} | {j['schedule']} | {j['microbatches']} | {j['virtual_stages']} | {'yes' if j['recompute'] else 'no'} "
          f"| {j['bubble_measured_median']:.3f} | {j['bubble_formula']:.3f} | {j['peak_in_flight']} | {mib} | {j['samples_per_s']:.0f} |")
PY

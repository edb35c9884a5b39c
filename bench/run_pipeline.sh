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
#   MODEL="--width 1024 --in-features 1536 --layers 16 --rows 64" ROUNDS=3 P4=0 bench/run_pipeline.sh
#
# Environment: BUILD_DIR (build), MS ("1 2 4 8": micro-batch counts at p=2),
# STEPS (8), P4 (1: also run p = 4), RECOMPUTE (1: also the two recompute
# rows), ROUNDS (1: the whole sweep this many times, the table shows the
# spread), MODEL (extra pipeline_bubble arguments for every run), PIN (1: rank
# r on core r when there are enough cores), NICE (e.g. -19, as root: the
# ranks' priority over other processes on a shared machine), OUT (JSON lines
# file; default a temp file).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-build}
[[ $build = /* ]] || build=$root/$build
ms=${MS:-1 2 4 8}
steps=${STEPS:-8}
p4=${P4:-1}
recompute=${RECOMPUTE:-1}
rounds=${ROUNDS:-1}
read -r -a model <<< "${MODEL:-}"
pin=${PIN:-0}
nice=${NICE:-}
out=${OUT:-$(mktemp -t paratrain-pipeline-bench.XXXXXX.jsonl)}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

run() {  # nproc, then pipeline_bubble arguments
  local n=$1; shift
  # The 1-minute load before each run: other processes on the 2 cores show up here.
  echo "{\"loadavg_1min\": $(cut -d' ' -f1 /proc/loadavg)}" >> "$out"
  local rank=("$build/bench/pipeline_bubble")
  if [[ $pin == 1 ]] && (( n <= $(nproc) )); then
    # Rank r on core r: the two ranks never share a core (other processes still can).
    rank=(sh -c 'exec taskset -c "$LOCAL_RANK" "$0" "$@"' "$build/bench/pipeline_bubble")
  fi
  ${nice:+nice -n "$nice"} "$build/paratrain" launch --nproc-per-node "$n" -- "${rank[@]}" --steps "$steps" \
    --out "$out" ${model[@]+"${model[@]}"} "$@" \
    > /dev/null 2>&1 || echo "{\"error\": \"pipeline_bubble $* at $n ranks failed\"}" >> "$out"
}

for ((round = 0; round < rounds; ++round)); do
  for m in $ms; do
    run 2 --schedule gpipe --microbatches "$m"
    run 2 --schedule 1f1b --microbatches "$m"
    if (( m % 2 == 0 )); then run 2 --schedule interleaved_1f1b --virtual-stages 2 --microbatches "$m"; fi
  done
  if [[ $recompute == 1 ]]; then
    run 2 --schedule 1f1b --microbatches 8 --recompute
    run 2 --schedule gpipe --microbatches 8 --recompute
  fi
  if [[ $p4 == 1 ]]; then
    for m in 4 8; do
      run 4 --schedule gpipe --microbatches "$m"
      run 4 --schedule 1f1b --microbatches "$m"
      run 4 --schedule interleaved_1f1b --virtual-stages 2 --microbatches "$m"
    done
  fi
done

cat "$out"
python3 - "$out" <<'PY'
import json, sys
from collections import defaultdict
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for j in rows:
    if "error" in j:
        print(f"| {j['error']} |")
loads = [j["loadavg_1min"] for j in rows if "loadavg_1min" in j]
rows = [j for j in rows if "loadavg_1min" not in j]
if loads:
    print(f"1-minute load before the runs: {min(loads):.2f}-{max(loads):.2f}")
runs = defaultdict(list)  # one row per configuration, every round's run in it
for j in rows:
    if "error" not in j:
        runs[(j["stages"], j["schedule"], j["microbatches"], j["virtual_stages"], j["recompute"])].append(j)
print("\n| p | schedule | m | v | recompute | bubble measured (median of all steps) | range of the runs' medians | formula | gap (points) "
      "| peak in-flight per stage | activation MiB per stage | samples/s |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for (p, schedule, m, v, rc), js in runs.items():
    meds = sorted(j["bubble_measured_median"] for j in js)
    steps = sorted(b for j in js for b in j["bubble_measured"])  # every measured step of every round
    med = steps[len(steps) // 2]
    f = js[0]["bubble_formula"]
    mib = ", ".join(f"{b / 2**20:.1f}" for b in js[0]["peak_activation_bytes"])
    sps = sorted(j["samples_per_s"] for j in js)[len(js) // 2]
    print(f"| {p} | {schedule} | {m} | {v} | {'yes' if rc else 'no'} | {med:.3f} | {meds[0]:.3f}-{meds[-1]:.3f} "
          f"| {f:.3f} | {100 * (med - f):.1f} | {js[0]['peak_in_flight']} | {mib} | {sps:.0f} |")
PY

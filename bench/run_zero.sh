#!/usr/bin/env bash
# The ZeRO/FSDP benchmark, end to end: paratrain's DDP (stage 0), ZeRO-1/2 and
# FSDP (stage 3) via bench/zero_throughput at 1, 2 and 4 ranks, next to
# PyTorch's DDP and ZeroRedundancyOptimizer (bench/zero_pytorch.py, Debian's
# python3-torch) at 1 and 2 ranks, plus one attempt at PyTorch FSDP on CPU;
# then one JSON document and, last, a one-line summary (bench/zero_report.py).
# Runs are short and interleaved (who goes first alternates per repeat): the
# machine is shared. Builds nothing: build `paratrain` and `zero_throughput`.
#
#   bench/run_zero.sh                       # defaults, ~5 min on 2 loaded cores
#   REPEATS=5 WORLDS="1 2" bench/run_zero.sh
#
# Environment: BUILD_DIR (build), PYTHON (/usr/bin/python3), REPEATS (3),
# WORLDS ("1 2 4", paratrain), PT_WORLDS ("1 2", PyTorch), STAGES ("0 1 2 3"),
# PT_MODES ("ddp zero"), STEPS/WARMUP (40/3; per run at 1-2 ranks), STEPS4
# (16: at 4 ranks, which oversubscribe 2 cores: informative only), BATCH (64),
# FSDP_TRY (1: one PyTorch FSDP attempt at 2 ranks, its error recorded),
# OUT_DIR (runs and logs). A launch that fails is recorded as an error line
# (the report lists it) and the run goes on.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-build}
[[ $build = /* ]] || build=$root/$build
python=${PYTHON:-/usr/bin/python3}
repeats=${REPEATS:-3}
worlds=${WORLDS:-1 2 4}
pt_worlds=${PT_WORLDS:-1 2}
stages=${STAGES:-0 1 2 3}
pt_modes=${PT_MODES:-ddp zero}
steps=${STEPS:-40}
warmup=${WARMUP:-3}
steps4=${STEPS4:-16}
batch=${BATCH:-64}
fsdp_try=${FSDP_TRY:-1}
out_dir=${OUT_DIR:-$(mktemp -d -t paratrain-zero-bench.XXXXXX)}

launcher=$build/paratrain
program=$build/bench/zero_throughput
for f in "$launcher" "$program"; do
  if [[ ! -x $f ]]; then
    echo "run_zero.sh: $f is missing; build it first:" >&2
    echo "  PARATRAIN_BUILD_JOBS=2 ./scripts/build.sh --target paratrain --target zero_throughput" >&2
    exit 2
  fi
done
if ! "$python" -c 'import torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null; then
  echo "run_zero.sh: $python cannot import torch with Gloo; install python3-torch or set PYTHON" >&2
  exit 2
fi

export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
mkdir -p "$out_dir"
runs=$out_dir/runs.jsonl
: >"$runs"

# run_one IMPL MODE WORLD: one launch; rank 0 appends its JSON line.
run_one() {
  local impl=$1 mode=$2 world=$3 log n=$steps
  ((world >= 4)) && n=$steps4
  log=$out_dir/$impl-$mode-$world-$(date +%s%N).log
  local args=(--steps "$n" --warmup "$warmup" --batch "$batch" --out "$runs") cmd
  if [[ $impl = paratrain ]]; then
    cmd=("$program" --stage "$mode" "${args[@]}")
  else
    cmd=("$python" "$root/bench/zero_pytorch.py" --mode "$mode" "${args[@]}")
  fi
  local before after
  before=$(wc -l <"$runs")
  if ! timeout 300 "$launcher" launch --nproc-per-node "$world" -- "${cmd[@]}" >"$log" 2>&1; then
    # A failing cell is a result too (the report lists it under "errors");
    # the first error line of its log is its text.
    echo "run_zero.sh: $impl $mode at $world rank(s) failed; its output ($log):" >&2
    tail -n 5 "$log" >&2
    "$python" - "$impl" "$mode" "$world" "$log" >>"$runs" <<'PY'
import json, sys
impl, mode, world, log = sys.argv[1:]
lines = [l.strip() for l in open(log, errors="replace") if "error" in l.lower()]
print(json.dumps({"impl": impl, "mode": {"0": "ddp", "1": "zero1", "2": "zero2", "3": "fsdp"}.get(mode, mode),
                  "world": int(world), "error": lines[0] if lines else f"failed, see {log}"}))
PY
    return 0
  fi
  after=$(wc -l <"$runs")
  if ((after != before + 1)); then
    echo "run_zero.sh: $impl $mode at $world rank(s) wrote no result; see $log" >&2
    exit 1
  fi
  printf 'run_zero.sh: %-9s %-5s %s rank(s): %s\n' "$impl" "$mode" "$world" \
    "$(tail -n 1 "$runs" | "$python" -c 'import json,sys; j=json.load(sys.stdin); s=j.get("samples_per_s"); print("%.1f samples/s" % s if s else "error: %s" % j.get("error"))' 2>/dev/null || echo see log)" >&2
}

start=$(date +%s)
load_start=$(cut -d' ' -f1 /proc/loadavg)
if [[ $fsdp_try = 1 ]]; then
  # Expected to fail; the JSON line carries PyTorch's error text.
  run_one pytorch fsdp 2
fi
for ((rep = 1; rep <= repeats; rep++)); do
  if ((rep % 2)); then order=(paratrain pytorch); else order=(pytorch paratrain); fi
  for world in $worlds; do
    for impl in "${order[@]}"; do
      if [[ $impl = paratrain ]]; then
        for stage in $stages; do run_one paratrain "$stage" "$world"; done
      elif [[ " $pt_worlds " = *" $world "* ]]; then
        for mode in $pt_modes; do run_one pytorch "$mode" "$world"; done
      fi
    done
  done
done

meta=$("$python" - "$repeats" "$batch" "$(($(date +%s) - start))" "$load_start" "$steps" "$warmup" \
  "$steps4" <<'EOF'
import json, os, sys, platform, torch
print(json.dumps({
    # Other agents' builds load this machine: absolute figures drift, ratios
    # inside one run are what to compare. Load averages (1 min) start/end.
    "loadavg_start": float(sys.argv[4]), "loadavg_end": os.getloadavg()[0],
    "date": __import__("datetime").date.today().isoformat(),
    "host": platform.node(), "cpus": os.cpu_count(), "torch": torch.__version__,
    "repeats": int(sys.argv[1]), "batch_per_rank": int(sys.argv[2]), "wall_s": int(sys.argv[3]),
    "steps": int(sys.argv[5]), "warmup": int(sys.argv[6]), "steps_at_4_ranks": int(sys.argv[7]),
    "threads_per_rank": 1, "statistic": "median samples/s over repeats",
}))
EOF
)
"$python" "$root/bench/zero_report.py" "$runs" --meta "$meta" --markdown >"$out_dir/table.md"
"$python" "$root/bench/zero_report.py" "$runs" --meta "$meta" | tee "$out_dir/report.txt"
echo "run_zero.sh: runs and logs in $out_dir" >&2

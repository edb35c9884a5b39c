#!/usr/bin/env bash
# The DDP throughput benchmark, end to end: runs paratrain's DDP
# (bench/ddp_throughput) and PyTorch's DDP (bench/ddp_pytorch.py, Debian's
# python3-torch on the same LibTorch) on the same workloads at 1 and 2 ranks,
# then prints one JSON document and, last, a one-line summary
# (bench/ddp_report.py). This machine is shared and noisy, so runs are short,
# repeated, and each paratrain run sits next to its PyTorch twin (who goes
# first alternates). Builds nothing: build `paratrain` and `ddp_throughput`.
#
#   bench/run_ddp.sh                          # defaults, ~3 min on 2 cores
#   BUILD_DIR=build-bench REPEATS=7 bench/run_ddp.sh
#   bench/run_ddp.sh --bucket-cap-mb 4        # extra flags go to both sides
#
# Environment: BUILD_DIR (default build), PYTHON (default /usr/bin/python3),
# REPEATS (5), MODELS ("mlp cnn"; also gpt), MLP_STEPS/MLP_WARMUP (80/10),
# CNN_STEPS/CNN_WARMUP (30/4), GPT_STEPS/GPT_WARMUP (12/2), BATCH (64 per
# rank; e.g. 8 for the GPT), WORLDS ("1 2"),
# MODES ("bucketed"; also naive, paratrain only, and nocomm, DDP skipping the
# all-reduce: the ceiling, analysis only), LOCAL (0; 1 also times both sides
# without DDP at 1 rank, the compute-only baseline), OUT_DIR (runs and logs),
# PARATRAIN_ARGS (extra flags for the paratrain side only, e.g. "--comm shm"
# for the prototype shared-memory all-reduce; recorded in the document and
# flagged in the summary: such a run no longer compares like with like).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-build}
[[ $build = /* ]] || build=$root/$build
python=${PYTHON:-/usr/bin/python3}
repeats=${REPEATS:-5}
models=${MODELS:-mlp cnn}
worlds=${WORLDS:-1 2}
modes=${MODES:-bucketed}
batch=${BATCH:-64}
local_baseline=${LOCAL:-0}
out_dir=${OUT_DIR:-$(mktemp -d -t paratrain-ddp-bench.XXXXXX)}
extra=("$@")
read -r -a paratrain_extra <<<"${PARATRAIN_ARGS:-}"

launcher=$build/paratrain
program=$build/bench/ddp_throughput
for f in "$launcher" "$program"; do
  if [[ ! -x $f ]]; then
    echo "run_ddp.sh: $f is missing; build it first:" >&2
    echo "  cmake --build $build --target paratrain ddp_throughput" >&2
    exit 2
  fi
done
if ! "$python" -c 'import torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null; then
  echo "run_ddp.sh: $python cannot import torch with Gloo; install python3-torch or set PYTHON" >&2
  exit 2
fi

# One compute thread per rank on both sides, 1 rank included (the launcher
# sets these only for several ranks, as torchrun does).
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
mkdir -p "$out_dir"
runs=$out_dir/runs.jsonl
: >"$runs"

steps_for() {  # model -> "--steps N --warmup M"
  case $1 in
    mlp) echo "--steps ${MLP_STEPS:-80} --warmup ${MLP_WARMUP:-10}" ;;
    cnn) echo "--steps ${CNN_STEPS:-30} --warmup ${CNN_WARMUP:-4}" ;;
    gpt) echo "--steps ${GPT_STEPS:-12} --warmup ${GPT_WARMUP:-2}" ;;
  esac
}
for model in $models; do
  if [[ $model != mlp && $model != cnn && $model != gpt ]]; then
    echo "run_ddp.sh: unknown model '$model' in MODELS; use mlp, cnn and/or gpt" >&2
    exit 2
  fi
done
for mode in $modes; do
  if [[ ! $mode =~ ^(bucketed|naive|nocomm)$ ]]; then
    echo "run_ddp.sh: unknown mode '$mode' in MODES; use bucketed, naive and/or nocomm" >&2
    exit 2
  fi
done

# run_one IMPL MODEL MODE WORLD: one launch; rank 0 appends its JSON line.
run_one() {
  local impl=$1 model=$2 mode=$3 world=$4 log
  log=$out_dir/$impl-$model-$mode-$world-$(date +%s%N).log
  local steps
  read -r -a steps <<<"$(steps_for "$model")"
  local args=(--model "$model" --mode "$mode" --batch "$batch" "${steps[@]}" --out "$runs" "${extra[@]}")
  local cmd
  if [[ $impl = paratrain ]]; then cmd=("$program" "${args[@]}" "${paratrain_extra[@]}"); else cmd=("$python" "$root/bench/ddp_pytorch.py" "${args[@]}"); fi
  local before after
  before=$(wc -l <"$runs")
  local store=()
  [[ $impl = pytorch ]] && store=(--plain-store)  # PyTorch's TCPStore clients
  if ! "$launcher" launch --nproc-per-node "$world" "${store[@]}" -- "${cmd[@]}" >"$log" 2>&1; then
    echo "run_ddp.sh: $impl $model $mode at $world rank(s) failed; its output ($log):" >&2
    tail -n 30 "$log" >&2
    exit 1
  fi
  after=$(wc -l <"$runs")
  if ((after != before + 1)); then
    echo "run_ddp.sh: $impl $model $mode at $world rank(s) wrote no result; see $log" >&2
    exit 1
  fi
  printf 'run_ddp.sh: %-9s %s %-8s %s rank(s): %s samples/s\n' "$impl" "$model" "$mode" "$world" \
    "$(tail -n 1 "$runs" | "$python" -c 'import json,sys; print(round(json.load(sys.stdin)["samples_per_s"], 1))')" >&2
}

start=$(date +%s)
load_start=$(cut -d' ' -f1 /proc/loadavg)
for ((rep = 1; rep <= repeats; rep++)); do
  # Alternate who goes first so slow drift of the machine's load does not
  # favour one side.
  if ((rep % 2)); then order=(paratrain pytorch); else order=(pytorch paratrain); fi
  for model in $models; do
    for mode in $modes; do
      for world in $worlds; do
        for impl in "${order[@]}"; do
          [[ $mode = naive && $impl = pytorch ]] && continue  # PyTorch has no naive twin
          run_one "$impl" "$model" "$mode" "$world"
        done
      done
    done
    if [[ $local_baseline = 1 ]]; then
      for impl in "${order[@]}"; do run_one "$impl" "$model" local 1; done
    fi
  done
done

meta=$("$python" - "$repeats" "$batch" "$(($(date +%s) - start))" "${extra[*]:-}" "$load_start" \
  "${PARATRAIN_ARGS:-}" <<'EOF'
import json, os, sys, platform, torch
print(json.dumps({
    # Other work on the machine skews absolute figures; ratios inside one
    # run are what to compare. Load averages (1 min) at start and end.
    "loadavg_start": float(sys.argv[5]), "loadavg_end": os.getloadavg()[0],
    "date": __import__("datetime").date.today().isoformat(),
    "host": platform.node(), "cpus": os.cpu_count(), "torch": torch.__version__,
    "repeats": int(sys.argv[1]), "batch_per_rank": int(sys.argv[2]),
    "wall_s": int(sys.argv[3]), "extra_args": sys.argv[4], "paratrain_only_args": sys.argv[6],
    "threads_per_rank": 1, "statistic": "median samples/s over repeats",
}))
EOF
)
"$python" "$root/bench/ddp_report.py" "$runs" --meta "$meta" | tee "$out_dir/report.txt"
echo "run_ddp.sh: runs and logs in $out_dir" >&2

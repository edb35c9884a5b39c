#!/bin/sh
# Where a step's time goes for four jobs (issue 27's benchmark): the README
# job (MLP, DDP, 2 ranks), ZeRO-3, a 1F1B pipeline (deep MLP, pp=2) and the
# GPT with tp=2, each profiled over 3 steps after warm-up, plus the cost of
# profiling (profiled steps against as many unprofiled steps just before).
# Prints one JSON object per job: the mean over ranks and profiled steps of
# each part of the step (paratrain profile's columns) and the top operators.
# usage: bench/run_profile.sh [BUILD_DIR] [OUT_DIR]
set -eu
build=${1:-build}
out=${2:-/tmp/paratrain-profile-bench}
rm -rf "$out"
mkdir -p "$out"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

job() {  # NAME NPROC CONFIG FIRST LAST [--set ...]
  name=$1 np=$2 config=$3 first=$4 last=$5
  shift 5
  "$build/paratrain" launch --nproc-per-node "$np" -- "$build/paratrain" train -c "$config" \
    --set run.output_dir="$out" --set run.name="$name" --set log.progress=off --set train.eval_every_epochs=0 \
    --set profile.steps="$first-$last" --set train.max_steps=$((last + 1)) "$@" > "$out/$name.log" 2>&1
  "$build/paratrain" profile "$out/$name" --json --top 5 > "$out/$name.json"
  python3 - "$name" "$out/$name.json" <<'PY'
import json, sys
name, path = sys.argv[1], sys.argv[2]
s = json.load(open(path))
parts = ["wall_ms", "data_ms", "compute_ms", "optimizer_ms", "exposed_comm_ms", "overlapped_comm_ms", "idle_ms"]
mean = {p: round(sum(b[p] for b in s["steps"]) / len(s["steps"]), 3) for p in parts}
mean["comm_bytes_per_step"] = sum(b["comm_bytes"] for b in s["steps"]) // len(s["steps"])
cost = [(r["overhead"]["profiled_step_ms"], r["overhead"]["unprofiled_step_ms"]) for r in s["ranks"]]
print(json.dumps({"job": name, "ranks": len(s["ranks"]), "profiler": s["ranks"][0]["profiler"],
                  "skew_us": max(r["clock"]["skew_us"] for r in s["ranks"]), "mean_per_step": mean,
                  "profiled_vs_unprofiled_ms": cost,
                  "top_ops": [(o["name"], round(o["self_ms"], 2)) for o in s["top_operators"]],
                  "stragglers": [(x["step"], x["straggler"], round(x["waited_ms"], 2)) for x in s["stragglers"]]}))
PY
}

job mlp_ddp 2 configs/fashion_mnist_mlp.toml 100 102
job mlp_zero3 2 configs/fashion_mnist_mlp.toml 100 102 --set zero.stage=3
job deep_mlp_1f1b 2 configs/fashion_mnist_deep_mlp.toml 40 42 --set parallel.pp=2 --set pipeline.schedule=1f1b \
  --set pipeline.microbatches=4
job gpt_tp2 2 configs/gpt_fortunes.toml 8 10 --set parallel.tp=2 --set model.dropout=0

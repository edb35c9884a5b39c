#!/bin/sh
# Layer freezing (issue 25's benchmark): the CNN on Fashion-MNIST and the GPT
# on fortunes at 2 ranks (DDP), each with no freezing, a static frozen prefix
# and adaptive freezing, for the same number of steps and seed. Per job: the
# frozen share of parameters, samples/s over the run, the backward phase and
# the bytes all-reduced per step (from the profiler over 3 steps after the
# static prefix is frozen, or after adaptive freezing's decision when there
# is one), the test accuracy or validation perplexity at the end, and the
# adaptive decisions. Prints one JSON object per job.
# usage: bench/run_freeze.sh [BUILD_DIR] [OUT_DIR] [SEED]
set -eu
build=${1:-build}
out=${2:-/tmp/paratrain-freeze-bench}
seed=${3:-0}
rm -rf "$out"
mkdir -p "$out"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

job() {  # NAME CONFIG STEPS PROFILED [--set ...]
  name=$1 config=$2 steps=$3 profiled=$4
  shift 4
  "$build/paratrain" launch --nproc-per-node 2 -- "$build/paratrain" train -c "$config" \
    --set run.output_dir="$out" --set run.name="$name" --set run.seed="$seed" --set log.progress=off \
    --set train.max_steps="$steps" --set train.checkpoint_every_steps=0 --set profile.steps="$profiled" \
    "$@" > "$out/$name.log" 2>&1
  python3 - "$name" "$out/$name/version_0" <<'PY'
import glob, json, sys
name, run = sys.argv[1], sys.argv[2]
records = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
train = [r for r in records if r.get("kind") == "train"]
evals = [r for r in records if r.get("kind") == "eval"]
freezes = [{"step": r["step"], "layers": r["layers"], "frozen_fraction": round(r["frozen_fraction"], 4)}
           for r in records if r.get("kind") == "freeze"]
backward_ms, comm_bytes, steps = [], [], 0
for path in sorted(glob.glob(f"{run}/profile/rank_*.json")):
    p = json.load(open(path))
    for s in p["steps"]:
        steps += 1
        inside = lambda t: s["start"] <= t < s["end"]
        backward_ms.append(sum(e["dur"] for e in p["events"] if e["name"] == "backward" and inside(e["ts"])) / 1000)
        comm_bytes.append(sum(c["bytes"] for c in p["collectives"] if c["op"] == "all_reduce" and inside(c["start"])))
result = {"job": name, "steps": train[-1]["step"] if train else 0,
          "samples_per_s": round(train[-1]["samples_per_s"], 1) if train else None,
          "backward_ms_per_step": round(sum(backward_ms) / max(len(backward_ms), 1), 3),
          "allreduce_bytes_per_step": sum(comm_bytes) // max(len(comm_bytes), 1),
          "freezes": freezes}
if evals:
    last = evals[-1]
    for key in ("test_accuracy", "perplexity", "test_loss"):
        if key in last:
            result[key] = round(last[key], 4)
print(json.dumps(result))
PY
}

cnn=configs/fashion_mnist_cnn.toml
# conv0 and conv1: 4.6% of the CNN's 421k parameters, most of its FLOPs.
job cnn_none "$cnn" 936 "600-602"
job cnn_convs "$cnn" 936 "600-602" --set freeze.modules=conv0,conv1
job cnn_adaptive "$cnn" 936 "900-902" --set freeze.adaptive=true --set freeze.check_every_steps=100 \
  --set freeze.threshold=0.2 --set freeze.max_fraction=0.1
gpt=configs/gpt_fortunes.toml
# wte (tied to the head), wpe, blocks 0-1: about half of the GPT's parameters.
job gpt_none "$gpt" 300 "250-252"
job gpt_half "$gpt" 300 "250-252" --set freeze.modules=wte,wpe,blocks.0,blocks.1
job gpt_adaptive "$gpt" 300 "290-292" --set freeze.adaptive=true --set freeze.check_every_steps=50 \
  --set freeze.threshold=0.2 --set freeze.max_fraction=0.6

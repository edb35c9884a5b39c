#!/usr/bin/env bash
# `paratrain plan --measure` over a grid (issue 30's benchmark): the MLP, the
# CNN and the GPT of the shipped configs under DDP, ZeRO-1/2/3, tp=2 and
# pp=2 (GPT), with activation checkpointing off and on ("blocks"), each on 2
# processes for MEASURE_STEPS (30) steps. Per cell: the planner's prediction for the fullest
# rank (model state of the configured ZeRO stage + activations + loader +
# backward's largest new gradient) and the measured peak of tensor storage
# (counted at LibTorch's CPU allocator from the loaded data to the last
# step), and their ratio. Then the cost of activation checkpointing in step
# time next to the memory it saves: the GPT trained 40 steps with and
# without it (samples/s of the second half, from metrics.jsonl).
# Prints one JSON object per cell, then one per timing pair (SKIP_TIMING=1:
# the cells only).
# usage: bench/run_memory_plan.sh [BUILD_DIR] [OUT_DIR]
set -euo pipefail
build=${1:-build}
out=${2:-/tmp/paratrain-memory-plan-bench}
rm -rf "$out"
mkdir -p "$out"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
p=$build/paratrain
steps=${MEASURE_STEPS:-30}

cell() {  # model config, layout name, recompute, --set args...
  local model=$1 config=$2 layout=$3 recompute=$4
  shift 4
  "$p" plan -c "$config" --world 2 --measure --measure-steps "$steps" --json --set train.activation_checkpointing="$recompute" "$@" \
    >"$out/cell.json" 2>"$out/cell.err" || { cat "$out/cell.err" >&2; return 1; }
  python3 - "$out/cell.json" "$model" "$layout" "$recompute" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
m, a = d["measured"], d.get("activations", {})
print(json.dumps({"model": sys.argv[2], "layout": sys.argv[3], "activation_checkpointing": sys.argv[4],
                  "state_bytes": d["stages"][m["zero_stage"]]["total_bytes"],
                  "activation_bytes": a.get("total_bytes"), "loader_bytes": a.get("data_bytes"),
                  "gradient_bytes": a.get("transient_bytes"), "predicted_bytes": m["predicted_bytes"],
                  "measured_bytes": m["peak_bytes"], "measured_over_predicted": round(m["measured_over_predicted"], 3),
                  "ranks_bytes": [r["training_peak_bytes"] for r in m["ranks"]]}))
PY
}

for recompute in none blocks; do
  for model in mlp cnn gpt; do
    case $model in
      mlp) config=configs/fashion_mnist_mlp.toml ;;
      cnn) config=configs/fashion_mnist_cnn.toml ;;
      gpt) config=configs/gpt_fortunes.toml ;;
    esac
    cell $model $config ddp $recompute
    for z in 1 2 3; do cell $model $config zero$z $recompute --set zero.stage=$z; done
    if [ $model = gpt ]; then
      cell $model $config tp2 $recompute --set parallel.tp=2
      cell $model $config pp2 $recompute --set parallel.pp=2 --set pipeline.microbatches=4
    fi
  done
done

[ "${SKIP_TIMING:-0}" = 1 ] && exit 0
# The price of recomputation in time: GPT, 2 processes, 40 steps each way.
for layout in ddp tp2; do
  sets=()
  [ $layout = tp2 ] && sets=(--set parallel.tp=2)
  for recompute in none blocks; do
    name=${layout}_${recompute}
    "$p" launch --nproc-per-node 2 -- "$p" train -c configs/gpt_fortunes.toml --set run.output_dir="$out/runs" \
      --set run.name="$name" --set train.max_steps=40 --set train.eval_every_epochs=0 --set run.log_every=5 \
      --set train.checkpoint_every_steps=0 --set train.activation_checkpointing=$recompute "${sets[@]}" \
      >"$out/$name.log" 2>&1
  done
  python3 - "$out/runs" "$layout" <<'PY'
import glob, json, sys
runs, layout = sys.argv[1], sys.argv[2]
def rate(name):
    rows = [json.loads(l) for l in open(glob.glob(f"{runs}/{name}/version_*/metrics.jsonl")[0])]
    rows = [r for r in rows if "samples_per_s" in r and r.get("step", 0) > 20]
    return sum(r["samples_per_s"] for r in rows) / max(1, len(rows))
plain, recomputed = rate(f"{layout}_none"), rate(f"{layout}_blocks")
print(json.dumps({"timing": layout, "samples_per_second_none": round(plain, 1),
                  "samples_per_second_blocks": round(recomputed, 1),
                  "blocks_over_none": round(recomputed / plain, 3)}))
PY
done

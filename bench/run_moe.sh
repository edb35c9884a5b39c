#!/bin/sh
# Mixture of experts and expert parallelism (issue 32's benchmark): the GPT
# of configs/gpt_fortunes.toml made smaller for this host (4 layers, d 128),
# trained for STEPS steps on 4 processes (dp = 4) with the same global batch:
#   - dense: the GPT as it is;
#   - moe_ep1, moe_ep2, moe_ep4: 8 top-1 experts in every second block
#     (model.moe_every = 2), capacity 1.25, at parallel.ep = 1, 2, 4. Top-1
#     runs one expert MLP per token: the same active parameters per token as
#     the dense GPT.
# Prints one JSON object per run: tokens/s, the validation loss after STEPS
# steps, parameters per rank (`paratrain plan`, equal to the built model),
# and from the flight recorder over the profiled steps: all-to-all calls,
# bytes and milliseconds per step on rank 0 (the ep group's dispatch and
# combine, forward and backward).
# usage: bench/run_moe.sh [BUILD_DIR] [OUT_DIR] [STEPS]
set -eu
build=${1:-build}
out=${2:-/tmp/paratrain-moe-bench}
steps=${3:-200}
rm -rf "$out"
mkdir -p "$out"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
common="--set model.layers=4 --set model.d_model=128 --set model.dropout=0 --set data.global_batch_size=32
  --set train.max_steps=$steps --set train.checkpoint_every_steps=0 --set log.progress=off
  --set profile.steps=$((steps / 2))-$((steps / 2 + 4)) --set optimizer.clip_grad_norm=1.0"

run() {  # NAME [--set ...]
  name=$1
  shift
  # shellcheck disable=SC2086
  "$build/paratrain" launch --nproc-per-node 4 -- "$build/paratrain" train -c configs/gpt_fortunes.toml \
    --set run.output_dir="$out" --set run.name="$name" $common "$@" > "$out/$name.log" 2>&1
  # shellcheck disable=SC2086
  "$build/paratrain" plan -c configs/gpt_fortunes.toml $common "$@" --world 4 --json > "$out/$name.plan.json"
  python3 - "$name" "$out/$name/version_0" "$out/$name.plan.json" <<'PY'
import json, sys
name, run, plan = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))
records = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
train = [r for r in records if r.get("kind") == "train"]
evals = [r for r in records if r.get("kind") == "eval"]
moe = [r for r in records if r.get("kind") == "moe"]
rank0 = json.load(open(f"{run}/profile/rank_0.json"))
profiled = len(rank0["steps"])
a2a = [c for c in rank0["collectives"] if c["op"] == "all_to_all"]
tokens_per_step = 32 * 128
windows = train[1:] if len(train) > 1 else train  # the first window pays warm-up
rate = sum(r["samples_per_s"] for r in windows) / len(windows)
out = {"run": name, "steps": train[-1]["step"], "tokens_per_s": round(rate * 128),
       "test_loss": round(evals[-1]["test_loss"], 4) if evals else None,
       "parameters_per_rank": plan["parameters"], "parameters": plan["whole_parameters"],
       "all_to_all_per_step": round(len(a2a) / profiled, 1),
       "all_to_all_bytes_per_step": round(sum(c["bytes"] for c in a2a) / profiled),
       "all_to_all_ms_per_step": round(sum(c["end"] - c["start"] for c in a2a) / profiled / 1000, 2)}
if moe:
    layer = moe[-1]["layers"][0]
    out["dropped_share_last_window"] = round(layer["dropped"] / max(layer["tokens"], 1), 4)
print(json.dumps(out))
PY
}

run dense
for ep in 1 2 4; do
  run moe_ep$ep --set model.moe_experts=8 --set model.moe_top_k=1 --set model.moe_every=2 --set parallel.ep=$ep
done

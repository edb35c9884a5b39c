#!/usr/bin/env bash
# Speed-weighted data parallelism (issue 29's benchmark): 2 and 3 ranks on
# this host, the last rank made 2x slower per example, the README's MLP and
# CNN jobs, with
#   equal  data.batch_shares = [1, 1(, 1)]: every rank the same share (the
#          plain DDP split, measured through the same code path);
#   ideal  the static shares of the ranks' speeds: [2, 1] and [2, 2, 1];
#   auto   data.batch_shares = "auto", from equal shares.
# The slow rank: profile.test_slow_factor = 2 (after each micro-batch it
# sleeps as long as it computed, so each of its examples costs twice the
# time; a sleeping rank leaves its core to the others, as a slower machine
# would). On 2 cores, 3 ranks share them: compute times include contention.
# Prints one JSON object per run: samples/s over the second half of the run
# (auto has settled there), the whole run's samples/s, the final shares, and
# per rank the compute and the time in collectives per step over the second
# half (the fast ranks' wait for the slow one is in the latter).
# The pipeline part ("pipe" among MODELS): the deep MLP in 2 stages on 2
# ranks (1f1b, 4 micro-batches), rank 1 slowed 2x the same way, stages cut
# by pipeline.balance = "parameters", "time" and "rank_speed"; samples/s
# over the second half of the run and the layers per stage.
# usage: bench/run_heterogeneous.sh [BUILD_DIR] [OUT_DIR] [MODELS] [WORLDS]
#        (MODELS default "mlp cnn pipe", WORLDS default "2 3"; STEPS per run: 600 MLP, 200 CNN, 400 pipe)
set -euo pipefail
build=${1:-build}
out=${2:-/tmp/paratrain-heterogeneous-bench}
models=${3:-mlp cnn pipe}
worlds=${4:-2 3}
rm -rf "$out"
mkdir -p "$out"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
p=$build/paratrain

pipeline_runs() {
  for balance in parameters time rank_speed; do
    name=pipe_${balance}
    "$p" launch --nproc-per-node 2 -- "$p" train -c configs/fashion_mnist_deep_mlp.toml \
      --set run.output_dir="$out/runs" --set run.name="$name" --set train.max_steps="${STEPS:-400}" \
      --set train.eval_every_epochs=0 --set run.log_every=20 --set parallel.pp=2 --set pipeline.schedule=1f1b \
      --set pipeline.microbatches=4 --set pipeline.balance="$balance" --set profile.test_slow_rank=1 \
      --set profile.test_slow_factor=2 >"$out/$name.log" 2>&1
    python3 - "$out/runs/$name/version_0" "$balance" <<'EOF'
import glob, json, sys
run, balance = sys.argv[1], sys.argv[2]
train = [r for r in map(json.loads, open(run + "/metrics.jsonl")) if r.get("kind") == "train"]
first, last = train[len(train) // 2], train[-1]
bounds = None
for index in sorted(glob.glob(run + "/checkpoints/*/index.json")):
    text = open(index).read()
    at = text.find("pipeline.layer_bounds")
    if at >= 0:
        b = [int(x) for x in text[at:].split('"')[2].split(",")]
        bounds = [b[i + 1] - b[i] for i in range(len(b) - 1)]
print(json.dumps({"model": "deep_mlp", "pp": 2, "balance": balance, "slow_rank": 1, "slow_factor": 2,
                  "samples_per_s": round((last["samples"] - first["samples"]) / (last["time"] - first["time"])),
                  "layers_per_stage": bounds}))
EOF
  done
}

for model in $models; do
  if [ "$model" = pipe ]; then
    pipeline_runs
    continue
  fi
  case $model in
    mlp) config=configs/fashion_mnist_mlp.toml; steps=${STEPS:-600}; every=30 ;;
    cnn) config=configs/fashion_mnist_cnn.toml; steps=${STEPS:-200}; every=10 ;;
  esac
  for world in $worlds; do
    slow=$((world - 1))
    for mode in equal ideal auto; do
      case "$mode/$world" in
        equal/2) shares="[1,1]" ;; equal/3) shares="[1,1,1]" ;;
        ideal/2) shares="[2,1]" ;; ideal/3) shares="[2,2,1]" ;;
        auto/*) shares=auto ;;
      esac
      name=${model}_w${world}_${mode}
      "$p" launch --nproc-per-node "$world" -- "$p" train -c "$config" \
        --set run.output_dir="$out/runs" --set run.name="$name" --set train.max_steps="$steps" \
        --set train.eval_every_epochs=0 --set data.batch_shares="$shares" \
        --set data.rebalance_every_steps="$every" --set profile.test_slow_rank="$slow" \
        --set profile.test_slow_factor=2 >"$out/$name.log" 2>&1
      python3 - "$out/runs/$name/version_0/metrics.jsonl" "$model" "$world" "$mode" <<'EOF'
import json, sys
path, model, world, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
records = [json.loads(l) for l in open(path)]
balance = [r for r in records if r.get("kind") == "balance"]
steps = [r for r in records if "samples_per_s" in r]
global_batch = sum(balance[0]["shares"])
half = balance[len(balance) // 2:]
first, last = half[0], half[-1]
rate = (last["step"] - first["step"]) * global_batch / (last["time"] - first["time"])
mean = lambda key, r: round(sum(b[key][r] for b in half[1:]) / max(len(half) - 1, 1), 3)
print(json.dumps({
    "model": model, "world": world, "shares_mode": mode, "slow_rank": world - 1, "slow_factor": 2,
    "samples_per_s": round(rate), "run_samples_per_s": round(steps[-1]["samples_per_s"]) if steps else None,
    "final_shares": balance[-1]["new_shares"],
    "compute_ms_per_step": [mean("compute_ms", r) for r in range(world)],
    "collective_ms_per_step": [mean("collective_ms", r) for r in range(world)],
}))
EOF
    done
  done
done

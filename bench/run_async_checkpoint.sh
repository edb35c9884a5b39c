#!/usr/bin/env bash
# What checkpoints cost the training loop: samples/s of `paratrain launch
# --nproc-per-node N -- paratrain train` with no periodic checkpoint, with
# synchronous ones and with train.async_checkpoint, in interleaved rounds (the
# machine is noisy: compare within a round). A wide MLP with Adam makes each
# checkpoint ~70 MB (weights + two moments). Prints one JSON line per run and
# a summary line with the overhead of each mode against "none" per round.
# Builds nothing: build `paratrain` first.
#
#   bench/run_async_checkpoint.sh
#   ROUNDS=5 EVERY=5 bench/run_async_checkpoint.sh
#
# Environment: BUILD_DIR (build), NPROC (2), STEPS (100), EVERY (10: steps
# between checkpoints), HIDDEN ("[2048, 2048]"), ROUNDS (3), OUT_DIR,
# PYTHON (/usr/bin/python3).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-build}
[[ $build = /* ]] || build=$root/$build
python=${PYTHON:-/usr/bin/python3}
nproc=${NPROC:-2}
steps=${STEPS:-100}
every=${EVERY:-10}
hidden=${HIDDEN:-[2048, 2048]}
rounds=${ROUNDS:-3}
out_dir=${OUT_DIR:-$(mktemp -d -t paratrain-async-ckpt.XXXXXX)}
exe=$build/paratrain
[[ -x $exe ]] || { echo "run_async_checkpoint.sh: $exe is missing; build it first" >&2; exit 2; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mkdir -p "$out_dir"
runs=$out_dir/runs.jsonl
: >"$runs"

# run_one ROUND MODE: one launch; the Trainer's own samples/s (steps x global
# batch over fit's time, the checkpoints' waits included) goes to runs.jsonl.
run_one() {
  local round=$1 mode=$2 name="r$1_$2"
  local sets=(--set run.output_dir="$out_dir" --set run.name="$name" --set train.max_steps="$steps"
              --set train.epochs=1 --set train.eval_every_epochs=0 --set "model.hidden=$hidden"
              --set optimizer.kind=adam --set optimizer.lr=0.001 --set data.global_batch_size=128)
  case $mode in
    none) sets+=(--set train.checkpoint_every_steps=0) ;;
    sync) sets+=(--set train.checkpoint_every_steps="$every") ;;
    async) sets+=(--set train.checkpoint_every_steps="$every" --set train.async_checkpoint=true) ;;
  esac
  "$exe" launch --nproc-per-node "$nproc" -- "$exe" train -c "$root/configs/fashion_mnist_mlp.toml" "${sets[@]}" \
    >"$out_dir/$name.log" 2>&1 || { echo "run $name failed: $out_dir/$name.log" >&2; exit 1; }
  local rate checkpoints
  rate=$(grep -o '[0-9.]* samples/s; run dir' "$out_dir/$name.log" | tail -1 | cut -d' ' -f1)
  checkpoints=$(find "$out_dir/$name/version_0/checkpoints" -name index.json | wc -l)
  echo "{\"round\": $round, \"mode\": \"$mode\", \"samples_per_s\": $rate, \"checkpoints\": $checkpoints}" | tee -a "$runs"
}

for round in $(seq 1 "$rounds"); do
  for mode in none sync async; do run_one "$round" "$mode"; done
done
"$python" - "$runs" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault(r["round"], {})[r["mode"]] = r["samples_per_s"]
overhead = {m: [1 - v[m] / v["none"] for v in by.values()] for m in ("sync", "async")}
print(json.dumps({"summary": {m: {"overhead_per_round": [round(x, 4) for x in xs],
                                  "median_overhead": round(statistics.median(xs), 4)}
                              for m, xs in overhead.items()}}))
PY

#!/bin/sh
# The int8 gradient wire (issue 26's benchmark, communication part): the
# README's MLP job (3 epochs) and the GPT (configs/gpt_fortunes.toml, 300
# steps) at 2 ranks with fp32, bf16 and int8 gradient wires, on the shared-
# memory backend (what world.backend = "auto" picks on one host) and on Gloo
# (TCP). Prints one JSON object per run: the model, the wire, the backend, the
# gradient bytes each rank sends per step (from the run's "int8 gradient
# wire" log line: int8 and fp32; bf16 is half of fp32), the mean samples/s of
# the logged steps after the first, and the final test accuracy (MLP) or
# perplexity (GPT).
# usage: bench/run_int8_wire.sh [BUILD_DIR] [OUT_DIR] [MODELS]   (MODELS: "mlp gpt")
set -eu
build=${1:-build}
out=${2:-/tmp/paratrain-int8-wire-bench}
models=${3:-mlp gpt}
rm -rf "$out"
mkdir -p "$out"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

run() {  # MODEL WIRE BACKEND
  model=$1 wire=$2 backend=$3
  name=$model-$wire-$backend
  case $model in
    mlp) config=configs/fashion_mnist_mlp.toml extra="" ;;
    gpt) config=configs/gpt_fortunes.toml extra="--set train.checkpoint_every_steps=0" ;;
  esac
  case $wire in
    fp32) set_wire="" ;;
    *) set_wire="--set ddp.compression=$wire" ;;
  esac
  # shellcheck disable=SC2086 # the --set lists split on purpose
  "$build/paratrain" launch --nproc-per-node 2 -- "$build/paratrain" train -c "$config" \
    --set run.output_dir="$out" --set run.name="$name" --set log.progress=off \
    --set world.backend="$backend" $set_wire $extra > "$out/$name.log" 2>&1
  # The byte counts of the int8 line; another wire logs none, so ask the
  # int8 run of the same model (run first) for fp32's count.
  python3 - "$model" "$wire" "$backend" "$out" "$name" <<'PY'
import json, re, sys, glob, math
model, wire, backend, out, name = sys.argv[1:6]
int8_log = open(f"{out}/{model}-int8-{backend}.log").read()
m = re.search(r"int8 gradient wire: (\d+) bytes sent per rank and step, (\d+) with fp32", int8_log)
int8_bytes, fp32_bytes = int(m.group(1)), int(m.group(2))
bytes_per_step = {"fp32": fp32_bytes, "bf16": fp32_bytes // 2, "int8": int8_bytes}[wire]
rates, final = [], {}
for line in open(glob.glob(f"{out}/{name}/version_0/metrics.jsonl")[0]):
    r = json.loads(line)
    if r.get("kind") == "train" and "samples_per_s" in r: rates.append(r["samples_per_s"])
    if r.get("kind") == "eval": final = r
row = {"model": model, "wire": wire, "backend": backend, "grad_bytes_per_step": bytes_per_step,
       "samples_per_s": round(sum(rates[1:]) / max(1, len(rates) - 1), 1)}
if "test_accuracy" in final: row["test_accuracy"] = round(100 * final["test_accuracy"], 2)
if "test_loss" in final:
    row["test_loss"] = round(final["test_loss"], 4)
    if model == "gpt": row["perplexity"] = round(math.exp(final["test_loss"]), 3)
print(json.dumps(row))
PY
}

for model in $models; do
  for backend in shm gloo; do
    for wire in int8 fp32 bf16; do
      run "$model" "$wire" "$backend"
    done
  done
done

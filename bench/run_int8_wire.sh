#!/usr/bin/env bash
# The int8 gradient wire (issue 26's benchmark, communication part): the
# README's MLP job and the GPT (configs/gpt_fortunes.toml) at 2 ranks with
# fp32, bf16 and int8 gradient wires, on three links:
#   shm   both ranks on this host, shared memory (what world.backend = "auto"
#         picks on one host);
#   gloo  both ranks on this host, Gloo over TCP loopback;
#   net   one rank in each of two network namespaces (scripts/netns.sh),
#         Gloo over a veth pair whose both ends tc shapes to RATE (default
#         1gbit): a network slower than memory, as between machines.
# Prints one JSON object per run: the model, the wire, the link, the
# gradient bytes each rank sends per step (from the run's "int8 gradient
# wire" log line: int8 and fp32; bf16 is half of fp32), the mean samples/s
# of the logged steps after the first, and the final test accuracy (MLP) or
# perplexity (GPT). The net runs need root (namespaces, tc).
# usage: bench/run_int8_wire.sh [BUILD_DIR] [OUT_DIR] [MODELS] [LINKS]
#        (MODELS default "mlp gpt", LINKS default "shm gloo net"; RATE=1gbit)
set -euo pipefail
build=${1:-build}
out=${2:-/tmp/paratrain-int8-wire-bench}
models=${3:-mlp gpt}
links=${4:-shm gloo net}
rate=${RATE:-1gbit}
rm -rf "$out"
mkdir -p "$out"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export NETNS_PREFIX=ns-i8w NETNS_SUBNET=10.81.0
PARATRAIN_JOB_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
export PARATRAIN_JOB_TOKEN
netns=scripts/netns.sh

if [[ " $links " == *" net "* ]]; then
  "$netns" up 2 >/dev/null
  trap '"$netns" down >/dev/null 2>&1 || true' EXIT
  for i in 0 1; do
    ip netns exec "${NETNS_PREFIX}$i" tc qdisc replace dev "${NETNS_PREFIX}${i}n" root tbf rate "$rate" \
      burst 256kb latency 100ms
  done
fi

run() {  # MODEL WIRE LINK
  local model=$1 wire=$2 link=$3 name=$1-$2-$3 config extra=() set_wire=()
  case $model in
    mlp) config=configs/fashion_mnist_mlp.toml ;;
    # A third of the config's steps: the same comparison, a third of the time.
    gpt) config=configs/gpt_fortunes.toml extra=(--set train.checkpoint_every_steps=0 --set train.max_steps=100) ;;
  esac
  [[ $wire == fp32 ]] || set_wire=(--set ddp.compression="$wire")
  local train=("$build/paratrain" train -c "$config" --set run.output_dir="$out" --set run.name="$name"
    --set log.progress=off "${set_wire[@]}" "${extra[@]}")
  case $link in
    shm | gloo)
      "$build/paratrain" launch --nproc-per-node 2 -- "${train[@]}" --set world.backend="$link" \
        >"$out/$name.log" 2>&1 ;;
    net)
      local node
      for node in 1 0; do
        "$netns" exec "$node" "$build/paratrain" launch --nnodes 2 --node-rank "$node" --nproc-per-node 1 \
          --master-addr "${NETNS_SUBNET}.1" --master-port 29641 --rdzv-id "int8-$name" -- \
          "${train[@]}" --set world.backend=gloo >"$out/$name.$node.log" 2>&1 &
      done
      wait
      cp "$out/$name.0.log" "$out/$name.log" ;;
  esac
  python3 - "$model" "$wire" "$link" "$out" "$name" "$rate" <<'PY'
import json, re, sys, glob, math
model, wire, link, out, name, rate = sys.argv[1:7]
int8_log = open(f"{out}/{model}-int8-{link}.log").read()
m = re.search(r"int8 gradient wire: (\d+) bytes sent per rank and step, (\d+) with fp32", int8_log)
int8_bytes, fp32_bytes = int(m.group(1)), int(m.group(2))
row = {"model": model, "wire": wire, "link": link + (f" ({rate})" if link == "net" else ""),
       "grad_bytes_per_step": {"fp32": fp32_bytes, "bf16": fp32_bytes // 2, "int8": int8_bytes}[wire]}
rates, final = [], {}
for line in open(glob.glob(f"{out}/{name}/version_0/metrics.jsonl")[0]):
    r = json.loads(line)
    if r.get("kind") == "train" and "samples_per_s" in r: rates.append(r["samples_per_s"])
    if r.get("kind") == "eval": final = r
row["samples_per_s"] = round(sum(rates[1:]) / max(1, len(rates) - 1), 1)
if "test_accuracy" in final: row["test_accuracy"] = round(100 * final["test_accuracy"], 2)
if "test_loss" in final:
    row["test_loss"] = round(final["test_loss"], 4)
    if model == "gpt": row["perplexity"] = round(math.exp(final["test_loss"]), 3)
print(json.dumps(row))
PY
}

for model in $models; do
  for link in $links; do
    for wire in int8 fp32 bf16; do  # int8 first: its log line gives every wire's bytes
      run "$model" "$wire" "$link"
    done
  done
done

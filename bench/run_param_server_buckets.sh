#!/usr/bin/env bash
# Parameter-server buckets (ps.bucket_kb): samples/s of sync and async with
# one message per key range (bucket_kb = 0) against the default buckets,
# and the layer-wise pull (ps.overlap on vs off) on the bucketed protocol,
# for the Fashion-MNIST MLP and the GPT on Debian's fortunes, through
# `paratrain launch ... paratrain train`. Prints one JSON line per run, then
# one JSON line per variant with the median over rounds and the median of
# the per-round ratios against bucket_kb = 0 (rounds interleave every
# variant, so load changes hit all of them alike). Builds nothing: build
# `paratrain` first.
#
#   bench/run_param_server_buckets.sh
#   ROUNDS=5 MODELS=mlp LAYOUTS="1x3" bench/run_param_server_buckets.sh
#
# Environment: BUILD_DIR (build), PYTHON (/usr/bin/python3), ROUNDS (3),
# MODELS ("mlp gpt"), LAYOUTS ("1x3 2x2": servers x workers), MODES
# ("sync async"), KBS ("0 256": the bucket_kb values), OVERLAP_OFF (1: also
# sync with ps.overlap = false at the last KBS value), MLP_STEPS (300),
# GPT_STEPS (50), GPT_BATCH (16: sequences per worker), LOG_EVERY (25: must
# divide the step counts, samples/s is the last log line's, since fit start),
# OUT_DIR.
# Servers and workers share this machine's cores (and other jobs' load):
# what it hides is said in bench/results/2026-11-26-param-server-buckets.md.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-build}
[[ $build = /* ]] || build=$root/$build
python=${PYTHON:-/usr/bin/python3}
rounds=${ROUNDS:-3}
models=${MODELS:-mlp gpt}
layouts=${LAYOUTS:-1x3 2x2}
modes=${MODES:-sync async}
kbs=${KBS:-0 256}
overlap_off=${OVERLAP_OFF:-1}
out_dir=${OUT_DIR:-$(mktemp -d -t paratrain-psbucket-bench.XXXXXX)}
exe=$build/paratrain
[[ -x $exe ]] || { echo "run_param_server_buckets.sh: $exe is missing; build it first" >&2; exit 2; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mkdir -p "$out_dir"
runs=$out_dir/runs.jsonl
: >"$runs"

# run_one NAME MODEL SERVERS WORKERS KEY=VALUE...
run_one() {
  local name=$1 model=$2 servers=$3 workers=$4
  shift 4
  local sets=(--set run.output_dir="$out_dir" --set run.name="$name" --set ps.servers="$servers"
              --set run.log_every="${LOG_EVERY:-25}")
  if [[ $model = mlp ]]; then
    sets+=(-c "$root/configs/fashion_mnist_mlp.toml" --set train.max_steps="${MLP_STEPS:-300}" --set train.epochs=1
           --set train.eval_every_epochs=0 --set data.global_batch_size=$((64 * workers)) --set optimizer.lr=0.02)
  else
    # Gradient clipping across servers is refused; the rest is the config's.
    sets+=(-c "$root/configs/gpt_fortunes.toml" --set train.max_steps="${GPT_STEPS:-50}"
           --set train.checkpoint_every_steps=0 --set optimizer.clip_grad_norm=0
           --set data.global_batch_size=$((${GPT_BATCH:-16} * workers)))
  fi
  for kv in "$@"; do sets+=(--set "$kv"); done
  if ! "$exe" launch --nproc-per-node $((servers + workers)) -- "$exe" train "${sets[@]}" >"$out_dir/$name.$round.log" 2>&1; then
    echo "{\"run\": \"$name\", \"round\": $round, \"error\": \"launch failed, see $out_dir/$name.$round.log\"}" | tee -a "$runs"
    return
  fi
  "$python" - "$out_dir/$name/version_${round}/metrics.jsonl" "$name" "$round" >>"$runs" <<'PY'
import json, sys
path, name, rnd = sys.argv[1], sys.argv[2], int(sys.argv[3])
recs = [json.loads(l) for l in open(path)]
train = [r for r in recs if r.get("kind") == "train"]
ps = [r for r in recs if r.get("kind") == "ps_staleness"]
w0 = ps[0] if ps else {}
print(json.dumps({"run": name, "round": rnd, "steps": train[-1]["step"] if train else None,
                  "samples_per_s": round(train[-1]["samples_per_s"], 1) if train else None,
                  "messages_per_step": w0.get("messages_per_step"), "bucket_kb": w0.get("bucket_kb"),
                  "pull_messages_in_forward": w0.get("pull_messages_in_forward"),
                  "push_messages_in_backward": w0.get("push_messages_in_backward"),
                  "forwards_pulling": w0.get("forwards_pulling"), "pushes": [r.get("pushes") for r in ps]}))
PY
  tail -1 "$runs"
}

for ((round = 0; round < rounds; ++round)); do
  for model in $models; do
    for layout in $layouts; do
      servers=${layout%x*} workers=${layout#*x}
      for mode in $modes; do
        for kb in $kbs; do
          run_one "${model}_${mode}_s${servers}w${workers}_kb${kb}" "$model" "$servers" "$workers" ps.mode="$mode" ps.bucket_kb="$kb"
        done
      done
      if [[ $overlap_off = 1 ]]; then
        kb=${kbs##* }
        run_one "${model}_sync_s${servers}w${workers}_kb${kb}_nooverlap" "$model" "$servers" "$workers" ps.mode=sync \
          ps.bucket_kb="$kb" ps.overlap=false
      fi
    done
  done
done

"$python" - "$runs" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    if r.get("samples_per_s") is not None:
        by.setdefault(r["run"], {})[r["round"]] = r
def base_of(name):
    # the bucket_kb = 0 twin of a run, or for overlap off its overlap-on twin
    if name.endswith("_nooverlap"):
        return name[: -len("_nooverlap")]
    head, kb = name.rsplit("_kb", 1)
    return None if kb == "0" else head + "_kb0"
for name in sorted(by):
    rounds = by[name]
    rates = [r["samples_per_s"] for r in rounds.values()]
    out = {"variant": name, "median_samples_per_s": round(statistics.median(rates), 1), "runs": len(rates),
           "messages_per_step": next(iter(rounds.values()))["messages_per_step"]}
    base = base_of(name)
    if base in by:
        ratios = [rounds[k]["samples_per_s"] / by[base][k]["samples_per_s"] for k in rounds if k in by[base]]
        if ratios:
            out["vs"] = base
            out["median_ratio"] = round(statistics.median(ratios), 3)
            out["ratios"] = [round(x, 3) for x in ratios]
    print(json.dumps(out))
PY

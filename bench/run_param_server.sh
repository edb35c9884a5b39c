#!/usr/bin/env bash
# The parameter-server benchmark: Fashion-MNIST MLP through `paratrain launch
# ... paratrain train` in ps.mode sync / async / ssp (staleness 2), with and
# without one slowed worker (ps.slow_worker = 1, ps.slow_ms), next to DDP
# on the workers' ranks (same global batch). Prints one JSON line per run
# (samples/s, test accuracy per epoch with the seconds it was reached, the
# workers' staleness histograms), then a one-line summary. Builds nothing:
# build `paratrain` first.
#
#   bench/run_param_server.sh                 # 1 server, 3 workers, 1 epoch
#   SERVERS="1 2" WORKERS="2 3" EPOCHS=3 bench/run_param_server.sh
#
# Environment: BUILD_DIR (build), PYTHON (/usr/bin/python3), SERVERS ("1"),
# WORKERS ("3"; a list runs each count, DDP on each), ROUNDS (1: repeats of
# the whole matrix, interleaved, so load changes hit every variant alike),
# EPOCHS (1), SLOW_MS (20), MODES ("sync async ssp"), LR (0.02:
# the config's 0.05 with momentum 0.9 diverges under async, where every push
# is a step), OUT_DIR, PS_SETS (extra KEY=VALUE for every ps run, e.g.
# "ps.overlap=false" or "ps.push_dtype=fp16"), SLOW ("0 $SLOW_MS": the
# slowed-worker variants to run), DDP (1: also the DDP run; 0 skips it),
# PATTERN ("always": worker 1 is slowed on every step; "random": every worker
# on about 1 in WORKERS of its steps, ps.slow_pattern = "random").
# Servers and workers share this machine's cores: a server competes with
# the workers for CPU, which a real deployment would not.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-build}
[[ $build = /* ]] || build=$root/$build
python=${PYTHON:-/usr/bin/python3}
servers_list=${SERVERS:-1}
workers_list=${WORKERS:-3}
rounds=${ROUNDS:-1}
epochs=${EPOCHS:-1}
slow_ms=${SLOW_MS:-20}
lr=${LR:-0.02}
modes=${MODES:-sync async ssp}
read -r -a ps_sets <<<"${PS_SETS:-}"
slow_list=${SLOW:-0 $slow_ms}
pattern=${PATTERN:-always}
out_dir=${OUT_DIR:-$(mktemp -d -t paratrain-ps-bench.XXXXXX)}
exe=$build/paratrain
[[ -x $exe ]] || { echo "run_param_server.sh: $exe is missing; build it first" >&2; exit 2; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mkdir -p "$out_dir"
runs=$out_dir/runs.jsonl
: >"$runs"

# run_one NAME NPROC WORKERS KEY=VALUE...: one launch; its summary line goes to runs.jsonl.
run_one() {
  local name=$1 nproc=$2 workers=$3
  shift 3
  local sets=()
  for kv in "$@"; do sets+=(--set "$kv"); done
  local start end
  start=$(date +%s.%N)
  if ! "$exe" launch --nproc-per-node "$nproc" -- "$exe" train -c "$root/configs/fashion_mnist_mlp.toml" \
      --set run.output_dir="$out_dir" --set run.name="$name" --set train.epochs="$epochs" \
      --set data.global_batch_size=$((64 * workers)) --set optimizer.lr="$lr" "${sets[@]}" >"$out_dir/$name.log" 2>&1; then
    echo "{\"run\": \"$name\", \"error\": \"launch failed, see $out_dir/$name.log\"}" >>"$runs"
    return
  fi
  end=$(date +%s.%N)
  # $out_dir is fresh, so round R of a name is its version_R (runs/<name>/version_N)
  "$python" - "$out_dir/$name/version_${round}/metrics.jsonl" "$name" "$start" "$end" "$round" >>"$runs" <<'PY'
import json, sys
path, name, start, end, rnd = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
recs = [json.loads(l) for l in open(path)]
train = [r for r in recs if r.get("kind") == "train"]
evals = [r for r in recs if r.get("kind") == "eval"]
t0 = start
# fit() start (run.json): the seconds before it are process start-up and data loading, alike in every mode.
try:
    fit_start = json.load(open(path.rsplit("/", 1)[0] + "/run.json"))["started"]
except (OSError, KeyError, ValueError):
    fit_start = None
out = {"run": name, "round": rnd, "wall_s": round(end - start, 1),
       "samples_per_s": round(train[-1]["samples_per_s"], 1) if train else None,
       "accuracy": [round(e["test_accuracy"], 4) for e in evals],
       "accuracy_at_s": [round(e["time"] - t0, 1) for e in evals],
       "accuracy_at_fit_s": [round(e["time"] - fit_start, 1) for e in evals] if fit_start else None,
       "staleness": {str(r["worker"]): {"mean": round(r["mean"], 2), "max": r["max"], "histogram": r["histogram"],
                                    "pushes": r.get("pushes"), "push_bytes": r.get("push_bytes"),
                                    "ranges_in_backward": r.get("ranges_pushed_in_backward"),
                                    "ranges_pulled_in_forward": r.get("ranges_pulled_in_forward")}
                     for r in recs if r.get("kind") == "ps_staleness"}}
print(json.dumps(out))
PY
  tail -1 "$runs"
}

for ((round = 0; round < rounds; ++round)); do
  for workers in $workers_list; do
    [[ ${DDP:-1} = 1 ]] && run_one "ddp_w${workers}" "$workers" "$workers"
    for servers in $servers_list; do
      nproc=$((workers + servers))
      for mode in $modes; do
        for slow in $slow_list; do
          extra=(ps.servers="$servers" ps.mode="$mode" ps.staleness=2 "${ps_sets[@]}")
          if [[ $slow != 0 && $pattern = random ]]; then
            extra+=(ps.slow_pattern=random ps.slow_ms="$slow")
          elif [[ $slow != 0 ]]; then
            extra+=(ps.slow_worker=1 ps.slow_ms="$slow")
          fi
          run_one "ps_${mode}_s${servers}_w${workers}_slow${slow}${pattern/always/}" "$nproc" "$workers" "${extra[@]}"
        done
      done
    done
  done
done
"$python" - "$runs" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
parts = [f'{r["run"]}: {r.get("samples_per_s")} samples/s, acc {r.get("accuracy", ["-"])[-1] if r.get("accuracy") else "-"}'
         for r in rows]
print("summary: " + "; ".join(parts))
PY

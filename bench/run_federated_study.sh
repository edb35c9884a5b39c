#!/usr/bin/env bash
# The federated-learning study of issue 12: Fashion-MNIST, 100 simulated
# clients, 10 per round, through `paratrain federated -c
# configs/federated_fashion_mnist.toml --set ...` in one process. Runs
# FedAvg / FedProx / FedAdam on IID and Dirichlet(0.5, 0.1) partitions, the
# secure-aggregation variant, and DP-FedAvg at epsilon ~ 1, 4, 8; collects
# every run's metrics.jsonl into one JSON-lines file (one line per round,
# tagged with the run's name) and hands it to federated_report.py, which
# prints the table and draws the PNG curves with gnuplot. Builds nothing:
# build `paratrain` first.
#
#   bench/run_federated_study.sh                      # everything, ~15-30 min here
#   ONLY="iid-fedavg iid-fedavg-secagg" bench/run_federated_study.sh
#
# Environment: BUILD_DIR (build), ROUNDS (50), SEEDS ("0"), OUT_DIR (a
# fresh temporary folder), ONLY (run names to keep), PYTHON
# (/usr/bin/python3).
#
# The DP noise multipliers are calibrated for the runs' sampling rate
# (q = 0.1), rounds (50) and delta (1e-5) with the same RDP formulas as
# paratrain/federated/rdp_accountant.h (bench/federated_calibrate.py); each
# run prints the epsilon its own accountant reached, and the report uses that.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-build}
[[ $build = /* ]] || build=$root/$build
python=${PYTHON:-/usr/bin/python3}
rounds=${ROUNDS:-50}
seeds=${SEEDS:-0}
out_dir=${OUT_DIR:-$(mktemp -d -t paratrain-federated-study.XXXXXX)}
only=${ONLY:-}
exe=$build/paratrain
[[ -x $exe ]] || { echo "run_federated_study.sh: $exe is missing; build it first" >&2; exit 2; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mkdir -p "$out_dir"
rounds_file=$out_dir/rounds.jsonl
: >"$rounds_file"

fedprox=(federated.algorithm=fedprox federated.mu=0.01)
fedadam=(federated.server_optimizer=adam federated.server_lr=0.01)
iid=(federated.partition=iid)
dir05=(federated.partition=dirichlet federated.alpha=0.5)
dir01=(federated.partition=dirichlet federated.alpha=0.1)

# noise_for EPSILON: the noise multiplier reaching EPSILON after
# $rounds rounds at sampling rate 0.1 and delta 1e-5.
noise_for() { "$python" "$root/bench/federated_calibrate.py" --q 0.1 --rounds "$rounds" --delta 1e-5 --epsilon "$1"; }

# run_one NAME SEED KEY=VALUE...: one `paratrain federated` run; its rounds
# go to rounds.jsonl with "run" and "seed" added.
run_one() {
  local name=$1 seed=$2
  shift 2
  if [[ -n $only && " $only " != *" $name "* ]]; then return; fi
  local sets=(--set "run.output_dir=$out_dir/runs" --set "run.name=$name-s$seed" --set "run.seed=$seed"
              --set "federated.rounds=$rounds" --set federated.checkpoint_every=0)
  for kv in "$@"; do sets+=(--set "$kv"); done
  echo "== $name (seed $seed): ${*:-defaults}" >&2
  "$exe" federated -c "$root/configs/federated_fashion_mnist.toml" "${sets[@]}" >"$out_dir/$name-s$seed.log" 2>&1 ||
    { echo "run $name failed; log: $out_dir/$name-s$seed.log" >&2; tail -5 "$out_dir/$name-s$seed.log" >&2; return 1; }
  local metrics
  metrics=$(ls -d "$out_dir/runs/$name-s$seed"/*/ | tail -1)metrics.jsonl
  "$python" - "$metrics" "$name" "$seed" "$*" >>"$rounds_file" <<'PY'
import json, sys
path, name, seed, sets = sys.argv[1:5]
for line in open(path):
    record = json.loads(line)
    record.update(run=name, seed=int(seed), sets=sets)
    print(json.dumps(record))
PY
}

for seed in $seeds; do
  run_one iid-fedavg "$seed" "${iid[@]}"
  run_one iid-fedprox "$seed" "${iid[@]}" "${fedprox[@]}"
  run_one iid-fedadam "$seed" "${iid[@]}" "${fedadam[@]}"
  run_one dir0.5-fedavg "$seed" "${dir05[@]}"
  run_one dir0.5-fedprox "$seed" "${dir05[@]}" "${fedprox[@]}"
  run_one dir0.5-fedadam "$seed" "${dir05[@]}" "${fedadam[@]}"
  run_one dir0.1-fedavg "$seed" "${dir01[@]}"
  run_one dir0.1-fedprox "$seed" "${dir01[@]}" "${fedprox[@]}"
  run_one dir0.1-fedadam "$seed" "${dir01[@]}" "${fedadam[@]}"
  run_one iid-fedavg-secagg "$seed" "${iid[@]}" federated.secure_aggregation=true
  run_one dir0.1-fedavg-secagg "$seed" "${dir01[@]}" federated.secure_aggregation=true
  # DP-FedAvg: clipping alone (the control: no noise, epsilon infinite), then
  # noise for epsilon 8, 4, 1. 100 clients x 10 per round is far too few for
  # DP on a 235k-parameter model (the noise on the mean has norm
  # z * clip * sqrt(d) / 10); the "1000 clients" rows show the same epsilon
  # with 100 clients per round (60 rows each), where it starts to work.
  run_one iid-dp-clip-only "$seed" "${iid[@]}" federated.dp.clip=1.0
  for eps in 8 4 1; do
    z=$(noise_for "$eps")
    run_one "iid-dp-eps$eps" "$seed" "${iid[@]}" federated.dp.clip=1.0 "federated.dp.noise_multiplier=$z"
    run_one "iid-dp-eps$eps-1000clients" "$seed" "${iid[@]}" federated.clients=1000 federated.dp.clip=1.0 \
      "federated.dp.noise_multiplier=$z"
  done
done

"$python" "$root/bench/federated_report.py" "$rounds_file" --png-dir "$out_dir/plots"
echo "rounds: $rounds_file; plots: $out_dir/plots" >&2

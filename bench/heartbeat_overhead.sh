#!/usr/bin/env bash
# Cost of heartbeats on training throughput and CPU time: the Fashion-MNIST MLP on 2 ranks
# under `paratrain launch`, with world.heartbeat_s = 0 (off), 1 (default)
# and FAST (a stress point, default 0.05), ROUNDS rounds of the three in
# turn so that the machine's noise hits all alike. Per run, one JSON line:
# the median of the per-step samples/s that rank 0 logs (metrics.jsonl,
# training steps only: evaluation and start-up excluded) and the workers'
# CPU seconds (summed over both); then a summary with each variant's median
# over its runs and its ratio to "off".
# Builds nothing: build `paratrain` first.
#
#   ROUNDS=3 bench/heartbeat_overhead.sh
#   WATCH=peers ROUNDS=3 bench/heartbeat_overhead.sh   # the ranks' own heartbeats instead
#
# WATCH=launcher (default): the launcher's file heartbeats. WATCH=peers: the
# workers run without PARATRAIN_HEARTBEAT_DIR, as under torchrun or by hand,
# so each rank beats to the other over UDP (comm/peer_watch.h) instead.
#
# Environment: BUILD_DIR (build), PYTHON (/usr/bin/python3), ROUNDS (3),
# STEPS (400 per run), FAST (0.05), CONFIG (configs/fashion_mnist_mlp.toml),
# OUT_DIR (a fresh temporary folder, kept).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-build}
[[ $build = /* ]] || build=$root/$build
python=${PYTHON:-/usr/bin/python3}
rounds=${ROUNDS:-3}
steps=${STEPS:-400}
fast=${FAST:-0.05}
config=${CONFIG:-$root/configs/fashion_mnist_mlp.toml}
out_dir=${OUT_DIR:-$(mktemp -d -t paratrain-heartbeat.XXXXXX)}
watch=${WATCH:-launcher}
case $watch in
  launcher) unset_dir=() ;;
  peers) unset_dir=(env -u PARATRAIN_HEARTBEAT_DIR) ;;
  *) echo "heartbeat_overhead.sh: WATCH=$watch: use launcher or peers" >&2; exit 2 ;;
esac
exe=$build/paratrain
[[ -x $exe ]] || { echo "heartbeat_overhead.sh: $exe is missing; build it first" >&2; exit 2; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mkdir -p "$out_dir"
results=$out_dir/runs.jsonl
cpu_wrapper='import resource, subprocess, sys
code = subprocess.call(sys.argv[1:])
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"worker_cpu_s={r.ru_utime + r.ru_stime:.3f}", flush=True)
sys.exit(code)'
: >"$results"

for ((r = 0; r < rounds; ++r)); do
  for hb in 0 1 "$fast"; do
    name=r$r-hb$hb
    # heartbeat_timeout_s must be >= 2 beats; 15 s (the default) is, for all three.
    # Each worker runs under a wrapper that prints its CPU seconds (user +
    # system, every thread, start-up included) when it ends: CPU time is
    # what a heartbeat thread adds, and other processes on the machine
    # disturb it far less than they disturb samples/s.
    "$exe" launch --nproc-per-node 2 -- "${unset_dir[@]}" "$python" -c "$cpu_wrapper" "$exe" train -c "$config" \
      --set run.output_dir="$out_dir/$name" --set world.heartbeat_s="$hb" --set train.max_steps="$steps" \
      --set run.log_every=10 --set train.checkpoint_every_steps=0 >"$out_dir/$name.log" 2>&1
    "$python" - "$out_dir/$name/fashion_mnist_mlp/version_0/metrics.jsonl" "$hb" "$r" "$out_dir/$name.log" \
      "$watch" >>"$results" <<'EOF'
import json, re, statistics, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
sps = [r["samples_per_s"] for r in rs if r.get("kind") == "train" and "samples_per_s" in r][1:]  # first: warm-up
cpu = [float(x) for x in re.findall(r"worker_cpu_s=([0-9.]+)", open(sys.argv[4]).read())]
print(json.dumps({"heartbeat_s": float(sys.argv[2]), "round": int(sys.argv[3]), "watch": sys.argv[5],
                  "samples_per_s": round(statistics.median(sps), 1), "records": len(sps),
                  "worker_cpu_s": round(sum(cpu), 3), "workers": len(cpu)}))
EOF
    tail -n 1 "$results"
  done
done

"$python" - "$results" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
out = {"summary": True, "watch": rows[0].get("watch", "launcher")}
for key in ("samples_per_s", "worker_cpu_s"):
    by = {}
    for r in rows: by.setdefault(r["heartbeat_s"], []).append(r[key])
    off = statistics.median(by[0.0])
    out[key] = {f"hb_{k:g}": {"median": statistics.median(v), "ratio_to_off": round(statistics.median(v) / off, 4),
                              "runs": v} for k, v in sorted(by.items())}
print(json.dumps(out))
EOF
echo "runs and logs: $out_dir" >&2

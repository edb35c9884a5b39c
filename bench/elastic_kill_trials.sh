#!/usr/bin/env bash
# The issue-10 kill table, killed from outside: TRIALS times, run
#   paratrain launch --nproc-per-node 2 --max-restarts 3 -- paratrain train -c CONFIG
# and kill -9 a random worker (its pid from RUN_DIR/doctor/rank-N.pid) once
# rank 0 has logged a random step. Unlike bench/run_elastic_kill.sh (the
# worker SIGKILLs itself at an exact step, PARATRAIN_FAULT_KILL), the kill
# lands wherever the worker happens to be: in a collective, in the data
# loader, or in the middle of writing a checkpoint. Per trial, one JSON line:
#   rank, kill_at_step (rank 0's last logged step when the kill was sent),
#   resumed_step, recovery_s (kill to the first logged step of the restarted
#   generation, metrics.jsonl times), restarts, exit code, hung (the launch
#   outlived its `timeout`), torn_checkpoints (step folders without
#   index.json left behind), resumed_from_complete (the checkpoint loaded
#   had its index.json), params_equal_undisturbed (checkpoint compare --all
#   --rtol 1e-5 of the final checkpoints), test accuracy and the undisturbed
#   run's; then a summary line. Builds nothing: build `paratrain` first.
#
#   TRIALS=20 bench/elastic_kill_trials.sh > trials.jsonl
#
# Environment: BUILD_DIR (build), PYTHON (/usr/bin/python3), TRIALS (20),
# CONFIG (configs/fashion_mnist_mlp.toml), CHECKPOINT_EVERY (100 steps),
# EPOCHS (the config's), SEED (RANDOM's seed, 1), GUARD (s per launch, 900),
# OUT_DIR (a fresh temporary folder, kept).
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-build}
[[ $build = /* ]] || build=$root/$build
python=${PYTHON:-/usr/bin/python3}
trials=${TRIALS:-20}
config=${CONFIG:-$root/configs/fashion_mnist_mlp.toml}
every=${CHECKPOINT_EVERY:-100}
guard=${GUARD:-900}
RANDOM=${SEED:-1}
out_dir=${OUT_DIR:-$(mktemp -d -t paratrain-kill-trials.XXXXXX)}
exe=$build/paratrain
[[ -x $exe ]] || { echo "elastic_kill_trials.sh: $exe is missing; build it first" >&2; exit 2; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mkdir -p "$out_dir"
sets=(--set train.checkpoint_every_steps="$every" --set run.log_every=1)
[[ -n ${EPOCHS:-} ]] && sets+=(--set train.epochs="$EPOCHS")

run_dir() { echo "$out_dir/$1/fashion_mnist_mlp/version_0"; }
last_step() { "$python" -c '
import json, sys
s = 0
try:
    for l in open(sys.argv[1]):
        try: r = json.loads(l)
        except ValueError: continue
        if r.get("kind") == "train": s = r["step"]
except OSError: pass
print(s)' "$1/metrics.jsonl"; }

# The undisturbed run: accuracy reference, step count, final parameters.
"$exe" launch --nproc-per-node 2 -- "$exe" train -c "$config" --set run.output_dir="$out_dir/clean" "${sets[@]}" \
  >"$out_dir/clean.log" 2>&1 || { echo "the undisturbed run failed: $out_dir/clean.log" >&2; exit 1; }
total=$(last_step "$(run_dir clean)")
final_clean=$(ls -d "$(run_dir clean)"/checkpoints/step_* | sort | tail -1)
echo "undisturbed run: $total steps ($out_dir/clean.log)" >&2

results=$out_dir/trials.jsonl
: >"$results"
for ((i = 0; i < trials; ++i)); do
  name=trial$i
  dir=$(run_dir "$name")
  rank=$((RANDOM % 2))
  want=$((1 + RANDOM % (total - 1)))
  timeout "$guard" "$exe" launch --nproc-per-node 2 --max-restarts 3 -- "$exe" train -c "$config" \
    --set run.output_dir="$out_dir/$name" "${sets[@]}" >"$out_dir/$name.log" 2>&1 &
  launcher=$!
  kill_time="" kill_step=""
  # Poll rank 0's metrics (log_every = 1) until the chosen step, then SIGKILL
  # the chosen rank of generation 0 (its pid file names it).
  while kill -0 "$launcher" 2>/dev/null; do
    step=$(last_step "$dir")
    if ((step >= want)) && [[ -f $dir/doctor/rank-$rank.pid ]]; then
      pid=$(cut -d' ' -f1 "$dir/doctor/rank-$rank.pid")
      kill_time=$(date +%s.%N)
      kill -9 "$pid" 2>/dev/null && kill_step=$(last_step "$dir")
      break
    fi
    sleep 0.05
  done
  rc=0
  wait "$launcher" || rc=$?
  final=$(ls -d "$dir"/checkpoints/step_* 2>/dev/null | sort | tail -1)
  same=false
  [[ -n $final ]] && "$exe" checkpoint compare "$final" "$final_clean" --all --rtol 1e-5 >"$out_dir/$name.compare" 2>&1 &&
    same=true
  "$python" - "$out_dir/$name.log" "$dir" "$(run_dir clean)" "$rank" "${kill_step:-null}" "${kill_time:-null}" \
    "$rc" "$same" >>"$results" <<'EOF'
import glob, json, os, re, sys
log, run, clean, rank, kill_step, kill_time, rc, same = sys.argv[1:]
text = open(log).read()
def records(d):
    out = []
    for l in open(os.path.join(d, "metrics.jsonl")):
        try: out.append(json.loads(l))
        except ValueError: pass  # a line cut by the kill
    return out
rs = records(run) if os.path.exists(os.path.join(run, "metrics.jsonl")) else []
m = re.search(r"resumed from (\S+) at epoch \d+, batch \d+, step (\d+)", text)
resumed = int(m.group(2)) if m else 0
restarted = "generation 0 failed" in text
kill_time = None if kill_time == "null" else float(kill_time)
# The restarted generation's first step is step resumed+1 logged after the kill.
back = next((r for r in rs if r.get("kind") == "train" and kill_time is not None and r["time"] > kill_time
             and r["step"] == resumed + 1), None) if restarted else None
acc = lambda rr: next((r.get("test_accuracy") for r in reversed(rr) if "test_accuracy" in r), None)
torn = [os.path.basename(p) for p in glob.glob(os.path.join(run, "checkpoints", "step_*"))
        if not os.path.exists(os.path.join(p, "index.json"))]
m2 = re.search(r"restart (\d+) of", text)
print(json.dumps({
    "rank": int(rank), "kill_at_step": None if kill_step == "null" else int(kill_step),
    "resumed_step": resumed if restarted else None,
    "recovery_s": None if back is None else round(back["time"] - kill_time, 3),
    "restarts": len(re.findall(r"generation \d+ failed", text)), "exit_code": int(rc), "hung": int(rc) == 124,
    "torn_checkpoints": torn,
    "resumed_from_complete": None if not m else os.path.exists(os.path.join(m.group(1), "index.json")),
    "params_equal_undisturbed": same == "true",
    "test_accuracy": acc(rs), "clean_test_accuracy": acc(records(clean))}))
EOF
  tail -n 1 "$results"
done

"$python" - "$results" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
n = len(rows)
ok = sum(r["exit_code"] == 0 for r in rows)
hung = sum(r["hung"] for r in rows)
rec = sorted(r["recovery_s"] for r in rows if r["recovery_s"] is not None)
gap = [abs(r["test_accuracy"] - r["clean_test_accuracy"]) * 100 for r in rows
       if r["test_accuracy"] is not None and r["clean_test_accuracy"] is not None]
print(json.dumps({"summary": True, "trials": n, "finished": ok, "hung": hung,
                  "torn_checkpoints_left": sum(bool(r["torn_checkpoints"]) for r in rows),
                  "resumed_from_incomplete": sum(r["resumed_from_complete"] is False for r in rows),
                  "params_equal_undisturbed": sum(r["params_equal_undisturbed"] for r in rows),
                  "recovery_s_median": rec[len(rec) // 2] if rec else None, "recovery_s_max": max(rec) if rec else None,
                  "max_accuracy_gap_points": round(max(gap), 3) if gap else None}))
EOF
echo "trials and logs: $out_dir" >&2

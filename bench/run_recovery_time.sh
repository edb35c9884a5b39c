#!/usr/bin/env bash
# Recovery time of issue 10, restart-based next to in-job, with real
# processes: for each world size in WORLDS, TRIALS runs of the Fashion-MNIST
# MLP under `paratrain launch --nproc-per-node N` where the last rank
# SIGKILLs itself after step KILL_STEP (PARATRAIN_FAULT_KILL):
#   restart: `--max-restarts 1`; the launcher stops the other ranks, starts
#            a new generation, which resumes from the latest checkpoint
#            (every CHECKPOINT_EVERY steps) and redoes the steps since;
#   in_job:  `--keep-going` and elastic.in_job = true; the survivors re-form
#            the world in their processes and redo the failed step.
# Times come from metrics.jsonl (run.log_every = 1: one record per step, with
# its wall time), so both modes are measured the same way:
#   first_step_s: from the killed step's record (the kill follows it at once)
#                 to the next step record written after it: the first step
#                 after recovery;
#   back_s:       to the record of step KILL_STEP + 1: the job back where it
#                 was (restart-based: the redone steps included).
# Prints one JSON line per run, then one summary line per (mode, world).
# Builds nothing: build `paratrain` first.
#
#   bench/run_recovery_time.sh                    # worlds 2,4; 3 trials each
#   WORLDS=2 TRIALS=1 bench/run_recovery_time.sh
#
# Environment: BUILD_DIR (build), PYTHON (/usr/bin/python3), WORLDS (2,4),
# TRIALS (3), KILL_STEP (60), CHECKPOINT_EVERY (50), MAX_STEPS (80), CONFIG
# (configs/fashion_mnist_mlp.toml), OUT_DIR.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-build}
[[ $build = /* ]] || build=$root/$build
python=${PYTHON:-/usr/bin/python3}
worlds=${WORLDS:-2,4}
trials=${TRIALS:-3}
kill_step=${KILL_STEP:-60}
every=${CHECKPOINT_EVERY:-50}
max_steps=${MAX_STEPS:-80}
config=${CONFIG:-$root/configs/fashion_mnist_mlp.toml}
out_dir=${OUT_DIR:-$(mktemp -d -t paratrain-recovery-time.XXXXXX)}
exe=$build/paratrain
[[ -x $exe ]] || { echo "run_recovery_time.sh: $exe is missing; build it first" >&2; exit 2; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mkdir -p "$out_dir"
results=$out_dir/runs.jsonl
: >"$results"

for n in ${worlds//,/ }; do
  for mode in restart in_job; do
    for ((t = 0; t < trials; ++t)); do
      name=${mode}_${n}_$t
      flags=(--max-restarts 1)
      sets=()
      if [[ $mode = in_job ]]; then
        flags=(--keep-going)
        sets=(--set elastic.in_job=true)
      fi
      rc=0
      PARATRAIN_FAULT_KILL=$((n - 1)):$kill_step "$exe" launch --nproc-per-node "$n" "${flags[@]}" -- \
        "$exe" train -c "$config" --set run.output_dir="$out_dir/$name" --set run.name="$name" \
        --set run.log_every=1 --set train.max_steps="$max_steps" --set train.checkpoint_every_steps="$every" \
        --set train.eval_every_epochs=0 --set log.progress=off "${sets[@]}" >"$out_dir/$name.log" 2>&1 || rc=$?
      "$python" - "$out_dir/$name/$name/version_0/metrics.jsonl" "$mode" "$n" "$kill_step" "$rc" \
        >>"$results" <<'EOF'
import json, sys
metrics, mode, n, kill, rc = sys.argv[1:]
kill = int(kill)
train = [r for r in map(json.loads, open(metrics)) if r.get("kind") == "train"]
k = next(i for i, r in enumerate(train) if r["step"] == kill)
first = train[k + 1]
back = next(r for r in train[k + 1:] if r["step"] == kill + 1)
# Median step time before the kill (steps 11..kill: past the warm-up).
dts = sorted(b["time"] - a["time"] for a, b in zip(train[10:k], train[11:k + 1]))
print(json.dumps({"mode": mode, "world": int(n), "exit_code": int(rc), "kill_after_step": kill,
                  "first_step_after": first["step"], "first_step_s": round(first["time"] - train[k]["time"], 3),
                  "back_s": round(back["time"] - train[k]["time"], 3),
                  "median_step_ms": round(1000 * dts[len(dts) // 2], 2)}))
EOF
      tail -1 "$results"
    done
  done
done

"$python" - "$results" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for key in sorted({(r["mode"], r["world"]) for r in rows}):
    rs = [r for r in rows if (r["mode"], r["world"]) == key]
    med = lambda xs: sorted(xs)[len(xs) // 2]
    print(json.dumps({"summary": key[0], "world": key[1], "runs": len(rs),
                      "ok": sum(r["exit_code"] == 0 for r in rs),
                      "first_step_s": [r["first_step_s"] for r in rs], "first_step_s_median": med([r["first_step_s"] for r in rs]),
                      "back_s_median": med([r["back_s"] for r in rs]),
                      "median_step_ms": med([r["median_step_ms"] for r in rs])}))
EOF
echo "logs: $out_dir" >&2

#!/usr/bin/env bash
# The kill -9 table of issue 10: TRIALS times, rank R (random of the NPROC)
# SIGKILLs itself after a random step K (PARATRAIN_FAULT_KILL) of a run under
# `paratrain launch --max-restarts 1`; the launcher restarts the workers and
# the run resumes from its latest complete checkpoint S. Each trial is then
# checked against the issue's oracle: a clean run resumed by hand from the
# same checkpoint S must end with the same parameters (checkpoint compare,
# rtol 1e-5; a trial killed before the first checkpoint is compared with the
# undisturbed run, which is the run "resumed" from step 0), and its test
# accuracy is put next to an undisturbed run's (also compared tensor by
# tensor: resuming is exact here, so they are expected equal too).
# Prints one JSON line per trial (rank, kill step, resumed step, recovery
# seconds = last step before the kill to the first step after the resume,
# as metrics.jsonl timed them, parameter check, accuracies), then a summary.
# Builds nothing: build `paratrain` first.
#
#   bench/run_elastic_kill.sh                          # 20 trials, 1 epoch of Fashion-MNIST MLP
#   TRIALS=3 EPOCHS=1 CHECKPOINT_EVERY=100 bench/run_elastic_kill.sh
#
# Environment: BUILD_DIR (build), PYTHON (/usr/bin/python3), TRIALS (20),
# NPROC (2), EPOCHS (1), CHECKPOINT_EVERY (50 steps), CONFIG
# (configs/fashion_mnist_mlp.toml), SEED (RANDOM's seed, 1), OUT_DIR.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-build}
[[ $build = /* ]] || build=$root/$build
python=${PYTHON:-/usr/bin/python3}
trials=${TRIALS:-20}
nproc=${NPROC:-2}
epochs=${EPOCHS:-1}
every=${CHECKPOINT_EVERY:-50}
config=${CONFIG:-$root/configs/fashion_mnist_mlp.toml}
RANDOM=${SEED:-1}
out_dir=${OUT_DIR:-$(mktemp -d -t paratrain-elastic-kill.XXXXXX)}
exe=$build/paratrain
[[ -x $exe ]] || { echo "run_elastic_kill.sh: $exe is missing; build it first" >&2; exit 2; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mkdir -p "$out_dir"
common=(--set train.epochs="$epochs" --set train.checkpoint_every_steps="$every" --set run.log_every=1)

# train NAME LOG [launch flags...] -- [train --set ...]: one launch into $out_dir/NAME.
train() {
  local name=$1 log=$2
  shift 2
  local flags=()
  while [[ $1 != -- ]]; do flags+=("$1"); shift; done
  shift
  "$exe" launch --nproc-per-node "$nproc" "${flags[@]}" -- "$exe" train -c "$config" \
    --set run.output_dir="$out_dir/$name" "${common[@]}" "$@" >"$log" 2>&1
}

# The undisturbed run: the accuracy reference and the step count.
train clean "$out_dir/clean.log" -- || { echo "the undisturbed run failed: $out_dir/clean.log" >&2; exit 1; }
metrics() { ls "$out_dir/$1"/*/version_0/metrics.jsonl; }
total=$("$python" -c 'import json,sys; print(max(json.loads(l).get("step",0) for l in open(sys.argv[1])))' "$(metrics clean)")

final_clean=$(ls -d "$out_dir/clean"/*/version_0/checkpoints/step_* | sort | tail -1)
results=$out_dir/trials.jsonl
: >"$results"
for ((i = 0; i < trials; ++i)); do
  rank=$((RANDOM % nproc))
  step=$((1 + RANDOM % (total - 1)))
  a=trial$i
  PARATRAIN_FAULT_KILL=$rank:$step train "$a" "$out_dir/$a.log" --max-restarts 1 -- || true
  resumed=$(grep -o 'resumed from [^ ]* at' "$out_dir/$a.log" | head -1 | cut -d' ' -f3 || true)
  final_a=$(ls -d "$out_dir/$a"/*/version_0/checkpoints/step_* | sort | tail -1) || true
  if [[ -n $resumed ]]; then
    train "$a-ref" "$out_dir/$a-ref.log" -- --set train.resume="$resumed" || true
    final_b=$(ls -d "$out_dir/$a-ref"/*/version_0/checkpoints/step_* | sort | tail -1) || true
  else
    final_b=$final_clean  # nothing to resume: the restart began at step 0, as the undisturbed run did
  fi
  same=false
  "$exe" checkpoint compare "$final_a" "$final_b" --all --rtol 1e-5 >"$out_dir/$a.compare" 2>&1 && same=true
  undisturbed=false
  "$exe" checkpoint compare "$final_a" "$final_clean" --all --rtol 1e-5 >"$out_dir/$a.compare-clean" 2>&1 && undisturbed=true
  "$python" - "$out_dir/$a.log" "$(metrics "$a")" "$(metrics clean)" "$rank" "$step" "$same" "$undisturbed" \
    >>"$results" <<'EOF'
import json, re, sys
log, metrics, clean, rank, step, same, undisturbed = sys.argv[1:]
step = int(step)
text = open(log).read()
records = [json.loads(l) for l in open(metrics)]
train = [r for r in records if r.get("kind") == "train"]
m = re.search(r"resumed from \S+ at epoch \d+, batch \d+, step (\d+)", text)
s = int(m.group(1)) if m else 0
# The kill follows step K's record; the first record of step S+1 after it is
# the first step of the restarted generation (steps S+1..K are logged twice).
kill = next((i for i, r in enumerate(train) if r["step"] == step), None)
back = None if kill is None else next((r for r in train[kill + 1:] if r["step"] == s + 1), None)
recovery = back["time"] - train[kill]["time"] if back is not None else None
acc = lambda rs: next((r.get("test_accuracy") for r in reversed(rs) if "test_accuracy" in r), None)
print(json.dumps({"rank": int(rank), "kill_after_step": step, "resumed_step": s,
                  "launch_ok": "all " in text and "succeeded" in text and "(after 1 restart)" in text,
                  "recovery_s": None if recovery is None else round(recovery, 3),
                  "params_equal_resumed_run": same == "true",
                  "params_equal_undisturbed_run": undisturbed == "true",
                  "test_accuracy": acc(records),
                  "clean_test_accuracy": acc([json.loads(l) for l in open(clean)])}))
EOF
  tail -1 "$results"
done

"$python" - "$results" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ok = sum(r["launch_ok"] for r in rows)
same = sum(r["params_equal_resumed_run"] for r in rows)
clean = sum(r["params_equal_undisturbed_run"] for r in rows)
rec = sorted(r["recovery_s"] for r in rows if r["recovery_s"] is not None)
gap = [abs(r["test_accuracy"] - r["clean_test_accuracy"]) * 100 for r in rows
       if r["test_accuracy"] is not None and r["clean_test_accuracy"] is not None]
print(f"elastic kill: {ok}/{len(rows)} launches recovered, {same}/{len(rows)} equal to the run resumed from the "
      f"same checkpoint and {clean}/{len(rows)} to the undisturbed run (rtol 1e-5, model, optimizer and rng), "
      f"recovery median {rec[len(rec)//2] if rec else float('nan'):.2f} s "
      f"(max {max(rec) if rec else float('nan'):.2f} s), max accuracy gap to undisturbed "
      f"{max(gap) if gap else float('nan'):.2f} points")
EOF
echo "trials and logs: $out_dir" >&2

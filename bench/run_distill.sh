#!/bin/sh
# Knowledge distillation (issue 25's benchmark): the same small student
# trained on labels only and distilled from a teacher, at equal steps, for
# seeds 0, 1 and 2, at 2 ranks (DDP). Fashion-MNIST: the CNN of
# configs/fashion_mnist_cnn.toml teaches the 784-64-10 MLP of
# configs/distill_fashion_mnist.toml (3 epochs). Fortunes: the 4-layer GPT of
# configs/gpt_fortunes.toml teaches the 2-layer GPT of
# configs/distill_gpt_fortunes.toml (300 steps). Prints one JSON object per
# run: test accuracy or validation perplexity, samples/s (the teacher's
# forward is the difference between the two students'), and the teacher's
# own test figures.
# usage: bench/run_distill.sh [BUILD_DIR] [OUT_DIR]
set -eu
build=${1:-build}
out=${2:-/tmp/paratrain-distill-bench}
rm -rf "$out"
mkdir -p "$out"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

run() {  # NAME CONFIG [--set ...]
  name=$1 config=$2
  shift 2
  "$build/paratrain" launch --nproc-per-node 2 -- "$build/paratrain" train -c "$config" \
    --set run.output_dir="$out" --set run.name="$name" --set log.progress=off "$@" > "$out/$name.log" 2>&1
  python3 - "$name" "$out/$name/version_0" <<'PY'
import json, sys
name, run = sys.argv[1], sys.argv[2]
records = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
train = [r for r in records if r.get("kind") == "train"]
evals = [r for r in records if r.get("kind") == "eval"]
teacher = [r for r in records if r.get("kind") == "teacher"]
out = {"run": name, "steps": train[-1]["step"], "samples_per_s": round(train[-1]["samples_per_s"], 1)}
for key in ("test_accuracy", "perplexity", "test_loss"):
    if evals and key in evals[-1]:
        out[key] = round(evals[-1][key], 4)
if teacher:
    out["teacher"] = {k: round(v, 4) for k, v in teacher[0].items() if k in ("test_accuracy", "perplexity", "test_loss")}
print(json.dumps(out))
PY
}

run teacher_cnn configs/fashion_mnist_cnn.toml
for seed in 0 1 2; do
  run mlp_labels_s$seed configs/distill_fashion_mnist.toml --set run.seed=$seed --set distill.teacher=
  run mlp_distill_s$seed configs/distill_fashion_mnist.toml --set run.seed=$seed --set distill.teacher="$out/teacher_cnn"
done
run teacher_gpt configs/gpt_fortunes.toml --set train.checkpoint_every_steps=0
for seed in 0 1 2; do
  run gpt_labels_s$seed configs/distill_gpt_fortunes.toml --set run.seed=$seed --set distill.teacher=
  run gpt_distill_s$seed configs/distill_gpt_fortunes.toml --set run.seed=$seed --set distill.teacher="$out/teacher_gpt"
done

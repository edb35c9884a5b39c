#!/usr/bin/env bash
# The GPU machine's check of the CUDA path, as one run (a lent GPU machine has
# minutes, not hours): build against the local PyTorch wheel's LibTorch
# (scripts/cuda-build.sh), run the device tests one by one (each under a
# timeout, so one hang does not eat the run), then the CLI on the GPU: every
# strategy wired for world.device = cuda trained by `paratrain launch` on 2
# ranks, consolidated and compared with 1 GPU process on the same global
# batch, and the launcher's exit code checked. Logs go to $OUT (or
# /tmp/cuda-check); summary.txt is the digest.
# Needs third_party/vendor (scripts/vendor-headers.sh) and Fashion-MNIST's
# *-ubyte.gz files in $FASHION_DIR (default data/fashion-mnist).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/cuda-check}"; mkdir -p "$out"
fashion="${FASHION_DIR:-$PWD/data/fashion-mnist}"
export PARATRAIN_BUILD_JOBS="${PARATRAIN_BUILD_JOBS:-$(nproc)}" OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
step() { echo "== $* ($(date +%T))" | tee -a "$out/summary.txt"; }

step "build paratrain + test_train"
timeout "${BUILD_S:-300}" ./scripts/cuda-build.sh -k 0 paratrain test_train > "$out/build.log" 2>&1
echo "rc=$?" | tee -a "$out/summary.txt"
grep -E "error:|FAILED:" "$out/build.log" | sort | uniq -c | sort -rn | head -40 >> "$out/summary.txt"

if [ -x build-cuda/tests/test_train ]; then
  for t in Device.ResolvesOnThisBuild CudaTrainer.StrategiesNotYetOnTheGpuAreAConfigError \
           CudaTrainer.DdpOnTheGpuEqualsOneGpuProcess CudaTrainer.ZeroOnTheGpuEqualsOneGpuProcess \
           CudaTrainer.FsdpOnTheGpuEqualsOneGpuProcess \
           CudaTrainer.TensorAndContextParallelGptOnTheGpuEqualsOneGpuProcess; do
    step "test $t"
    timeout "${TEST_S:-90}" build-cuda/tests/test_train --gtest_filter="$t" > "$out/$t.log" 2>&1
    echo "rc=$?" >> "$out/summary.txt"
    grep -E "measured|OK \]|FAILED|Failure|error|Expected|Which is|hung|Skipped" "$out/$t.log" | head -12 >> "$out/summary.txt"
  done
fi

cli=build-cuda/paratrain
[ -x "$cli" ] || { step "no CLI built"; exit 0; }
steps=60
mlp=(-c configs/fashion_mnist_mlp.toml --set world.device=cuda --set data.dir="$fashion"
     --set train.max_steps=$steps --set train.eval_every_epochs=0 --set run.output_dir="$out/runs")
ckpt=$(printf 'version_0/checkpoints/step_%08d' "$steps")
# One GPU process on the global batch (128), then 2 ranks of 64 per layout.
step "CLI: 1 GPU process, global batch 128"
timeout 120 $cli train "${mlp[@]}" --set run.name=single --set data.batch_size=128 > "$out/single.log" 2>&1
echo "rc=$?" >> "$out/summary.txt"
compare() {  # name, launch exit code
  echo "$1: launch rc=$2" >> "$out/summary.txt"
  $cli checkpoint consolidate "$out/runs/$1/$ckpt" -o "$out/$1.safetensors" > "$out/$1.consolidate.log" 2>&1 || {
    tail -3 "$out/$1.consolidate.log" >> "$out/summary.txt"; return; }
  echo "$1 vs single: $($cli checkpoint compare --all "$out/$1.safetensors" "$out/runs/single/$ckpt" 2>&1 | tail -1)" \
    >> "$out/summary.txt"
}
for layout in ddp zero1 zero2 fsdp ddp_shm; do
  case $layout in
    ddp) args=() ;;
    zero1) args=(--set zero.stage=1) ;;
    zero2) args=(--set zero.stage=2) ;;
    fsdp) args=(--set zero.stage=3 --set zero.unit_min_params=30000) ;;
    ddp_shm) args=(--set world.backend=shm) ;;
  esac
  step "CLI: $layout, 2 processes on the GPU"
  timeout 150 $cli launch --nproc-per-node 2 -- $cli train "${mlp[@]}" --set run.name=$layout "${args[@]}" \
    > "$out/$layout.log" 2>&1
  rc=$?
  grep -E "error|Error|strategy" "$out/$layout.log" | head -4 >> "$out/summary.txt"
  compare $layout $rc
done

# A GPT with tensor parallelism on the GPU (no fortunes package here: the
# repository's own docs are the corpus).
cat docs/*.md docs/notes/*.md > "$out/corpus.txt"
gpt=(-c configs/gpt_fortunes.toml --set world.device=cuda --set data.path="$out/corpus.txt" --set model.dropout=0
     --set train.max_steps=20 --set train.eval_every_epochs=0 --set run.output_dir="$out/runs"
     --set optimizer.kind=sgd --set optimizer.lr=0.05 --set optimizer.momentum=0.9 --set optimizer.weight_decay=0)
gckpt=$(printf 'version_0/checkpoints/step_%08d' 20)
step "CLI: GPT 1 GPU process"
timeout 150 $cli train "${gpt[@]}" --set run.name=gpt_single > "$out/gpt_single.log" 2>&1
echo "rc=$?" >> "$out/summary.txt"
grep -E "tokens/s|samples/s|loss" "$out/gpt_single.log" | tail -2 >> "$out/summary.txt"
step "CLI: GPT tp 2, 2 processes on the GPU"
timeout 150 $cli launch --nproc-per-node 2 -- $cli train "${gpt[@]}" --set run.name=gpt_tp2 --set parallel.tp=2 \
  > "$out/gpt_tp2.log" 2>&1
rc=$?
grep -E "error|Error|strategy" "$out/gpt_tp2.log" | head -4 >> "$out/summary.txt"
echo "gpt_tp2: launch rc=$rc" >> "$out/summary.txt"
$cli checkpoint consolidate "$out/runs/gpt_tp2/$gckpt" -o "$out/gpt_tp2.safetensors" > /dev/null 2>&1 &&
  echo "gpt_tp2 vs single: $($cli checkpoint compare --all "$out/gpt_tp2.safetensors" "$out/runs/gpt_single/$gckpt" 2>&1 | tail -1)" \
    >> "$out/summary.txt"
step "done"

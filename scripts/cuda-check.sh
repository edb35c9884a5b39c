#!/usr/bin/env bash
# The GPU machine's check of the CUDA path, as one run (a lent GPU machine has
# minutes, not hours): build against the local PyTorch wheel's LibTorch
# (scripts/cuda-build.sh), run the device tests one by one (each under a
# timeout, so one hang does not eat the run), then the CLI on the GPU: every
# strategy wired for world.device = cuda trained by `paratrain launch` on 2
# ranks, consolidated and compared with 1 GPU process on the same global
# batch, and the launcher's exit code checked. Logs and runs go to $LOGS
# (default /tmp/cuda-check); $OUT (the device tool's folder), when set, gets
# summary.txt, the digest, and the logs' tails.
# Needs third_party/vendor (scripts/vendor-headers.sh) and Fashion-MNIST's
# *-ubyte.gz files in $FASHION_DIR (default data/fashion-mnist).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${LOGS:-/tmp/cuda-check}"; mkdir -p "$out"
# Whatever happens, the digest and the logs' tails reach $OUT.
finish() {
  [ -n "${OUT:-}" ] || return 0
  cp "$out/summary.txt" "$OUT/" 2>/dev/null
  for f in "$out"/*.log; do [ -f "$f" ] && tail -40 "$f" > "$OUT/tail-$(basename "$f")"; done
}
trap finish EXIT
fashion="${FASHION_DIR:-$PWD/data/fashion-mnist}"
export PARATRAIN_BUILD_JOBS="${PARATRAIN_BUILD_JOBS:-$(nproc)}" OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
step() { echo "== $* ($(date +%T))" | tee -a "$out/summary.txt"; }

step "build ${BUILD_TARGETS:-paratrain test_train}"
timeout "${BUILD_S:-300}" ./scripts/cuda-build.sh -k 0 ${BUILD_TARGETS:-paratrain test_train} > "$out/build.log" 2>&1
echo "rc=$?" | tee -a "$out/summary.txt"
grep -E "error:|FAILED:" "$out/build.log" | sort | uniq -c | sort -rn | head -40 >> "$out/summary.txt"

if [ -x build-cuda/tests/test_train ]; then
  # Thread-rank oracles hang on one GPU (tests/train/device_test.cpp says
  # why): the multi-rank GPU checks below run as processes.
  step "device tests"
  timeout "${TEST_S:-60}" build-cuda/tests/test_train --gtest_filter='Device.*:CudaTrainer.*' > "$out/device-tests.log" 2>&1
  echo "rc=$?" >> "$out/summary.txt"
  grep -E "OK \]|FAILED|Failure|Skipped" "$out/device-tests.log" | head -12 >> "$out/summary.txt"
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
for layout in ddp zero1 zero2 ddp_shm; do
  case $layout in
    ddp) args=() ;;
    zero1) args=(--set zero.stage=1) ;;
    zero2) args=(--set zero.stage=2) ;;
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
grep -E "error|Error" "$out/gpt_single.log" | head -3 >> "$out/summary.txt"
grep -E "tokens/s|samples/s|loss" "$out/gpt_single.log" | tail -2 >> "$out/summary.txt"
for layout in tp2 cp2; do
  step "CLI: GPT $layout, 2 processes on the GPU"
  timeout 150 $cli launch --nproc-per-node 2 -- $cli train "${gpt[@]}" --set run.name=gpt_$layout \
    --set parallel.${layout:0:2}=2 > "$out/gpt_$layout.log" 2>&1
  rc=$?
  grep -E "error|Error|strategy" "$out/gpt_$layout.log" | head -4 >> "$out/summary.txt"
  echo "gpt_$layout: launch rc=$rc" >> "$out/summary.txt"
  $cli checkpoint consolidate "$out/runs/gpt_$layout/$gckpt" -o "$out/gpt_$layout.safetensors" > /dev/null 2>&1 &&
    echo "gpt_$layout vs single: $($cli checkpoint compare --all "$out/gpt_$layout.safetensors" \
      "$out/runs/gpt_single/$gckpt" 2>&1 | tail -1)" >> "$out/summary.txt"
done
# Profiling on the GPU (issue 27): GPU kernels must appear in the rank files.
step "CLI: profile steps 10-11 of DDP on 2 GPUs"
timeout 120 $cli launch --nproc-per-node 2 -- $cli train "${mlp[@]}" --set run.name=profiled \
  --set train.max_steps=12 --set profile.steps=10-11 > "$out/profiled.log" 2>&1
echo "rc=$?" >> "$out/summary.txt"
$cli profile "$out/runs/profiled" --top 5 > "$out/profile.txt" 2>&1
head -4 "$out/profile.txt" >> "$out/summary.txt"
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); g=[e for e in d['events'] if e.get('gpu')]; \
print('profile rank 0: %d GPU events, e.g. %s' % (len(g), sorted({e['name'] for e in g})[:3]))" \
  "$out/runs/profiled/version_0/profile/rank_0.json" >> "$out/summary.txt" 2>&1
step "done"

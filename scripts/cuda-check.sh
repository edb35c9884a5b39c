#!/usr/bin/env bash
# The GPU machine's check of the CUDA path, as one run (a lent GPU machine has
# minutes, not hours): build against the local PyTorch wheel's LibTorch
# (scripts/cuda-build.sh), run the device tests, train the default MLP config
# on the GPU at 1 and 2 ranks (Gloo with CUDA tensors), consolidate and
# compare, then build the rest of the tree with -k 0 so every compile error of
# the 2.x port is listed at once. Logs go to $OUT (or /tmp/cuda-check).
# Needs third_party/vendor (scripts/vendor-headers.sh) and Fashion-MNIST's
# *-ubyte.gz files in $FASHION_DIR (default data/fashion-mnist).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/cuda-check}"; mkdir -p "$out"
fashion="${FASHION_DIR:-$PWD/data/fashion-mnist}"
export PARATRAIN_BUILD_JOBS="${PARATRAIN_BUILD_JOBS:-$(nproc)}" OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
step() { echo "== $* ($(date +%T))" | tee -a "$out/summary.txt"; }

step "build paratrain + test_train"
timeout "${BUILD_S:-270}" ./scripts/cuda-build.sh -k 0 paratrain test_train > "$out/build.log" 2>&1
echo "rc=$?" | tee -a "$out/summary.txt"
grep -E "error:|FAILED:" "$out/build.log" | sort | uniq -c | sort -rn | head -60 >> "$out/summary.txt"

if [ -x build-cuda/tests/test_train ]; then
  step "device tests"
  timeout 120 build-cuda/tests/test_train --gtest_filter='Device.*:CudaTrainer.*' 2>&1 | tail -25 | tee -a "$out/summary.txt"
fi
if [ -x build-cuda/paratrain ]; then
  cli=build-cuda/paratrain
  common=(-c configs/fashion_mnist_mlp.toml --set world.device=cuda --set data.dir="$fashion" --set run.output_dir="$out/runs")
  step "MLP on the GPU, 1 rank"
  timeout 120 $cli train "${common[@]}" --set run.name=gpu1 > "$out/gpu1.log" 2>&1; echo "rc=$?" >> "$out/summary.txt"
  grep -E "strategy|test accuracy|samples/s" "$out/gpu1.log" | tail -5 >> "$out/summary.txt"
  step "MLP on the GPU, 2 ranks"
  timeout 150 $cli launch --nproc-per-node 2 -- $cli train "${common[@]}" --set run.name=gpu2 > "$out/gpu2.log" 2>&1
  echo "rc=$?" >> "$out/summary.txt"
  grep -E "strategy|test accuracy|samples/s" "$out/gpu2.log" | tail -5 >> "$out/summary.txt"
fi
step "build everything else (-k 0)"
timeout "${REST_S:-150}" ./scripts/cuda-build.sh -k 0 > "$out/build-all.log" 2>&1
echo "rc=$?" | tee -a "$out/summary.txt"
grep -E "error:" "$out/build-all.log" | sort | uniq -c | sort -rn | head -80 >> "$out/summary.txt"
grep -E "FAILED:" "$out/build-all.log" | head -40 >> "$out/summary.txt"
step "done"

#!/usr/bin/env bash
# Install-and-consume: installs this build to a scratch prefix, builds
# examples/ out of tree against it with find_package(paratrain), then checks
# example (1) on 2 ranks against 1 process on the same global batch.
# Usage: install_and_consume.sh BUILD_DIR SOURCE_DIR CXX_COMPILER
#
# The oracle: DistributedSampler splits each global batch of 64 rows into
# two strided halves and DDP averages the two ranks' gradients, which is the
# gradient of the one-process batch of 64; so after 48 SGD steps both runs
# hold the same weights up to float summation order (we allow 1e-5 of each
# tensor's largest value). Without DDP each rank would step on its own half
# only: the ranks' weights would differ from each other and from the
# one-process run by percents, far above the tolerance.
set -euo pipefail
build=$(cd "$1" && pwd); src=$(cd "$2" && pwd); cxx=$3
work=$build/install-test            # fixed path: ccache hits across runs
rm -rf "$work" && mkdir -p "$work"
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" > "$work/install.log"
test -x "$prefix/bin/paratrain"
test -f "$prefix/include/paratrain/paratrain.h"
test -f "$prefix/lib/cmake/paratrain/paratrainConfig.cmake" || test -f "$prefix"/lib*/cmake/paratrain/paratrainConfig.cmake

# Same compiler and cache as the main build: one example TU including torch
# costs ~15-20 s when the cache is cold.
launcher=()
if command -v ccache > /dev/null; then
  export CCACHE_BASEDIR=$src CCACHE_SLOPPINESS=time_macros,include_file_mtime,include_file_ctime
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
linker=()
command -v ld.mold > /dev/null && linker=(-DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=mold)
cmake -S "$src/examples" -B "$work/examples" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_PREFIX_PATH="$prefix" "${launcher[@]}" "${linker[@]}" > "$work/configure.log"
cmake --build "$work/examples" -j "${PARATRAIN_BUILD_JOBS:-2}"

cli=$prefix/bin/paratrain
export OMP_NUM_THREADS=1
cd "$work"
"$cli" launch --nproc-per-node 2 -- "$work/examples/ddp_custom_model/ddp_custom_model" 64 ckpt_2ranks \
  | tee two.log
"$work/examples/ddp_custom_model/ddp_custom_model" 64 ckpt_1proc | tee one.log

# Both ranks print the same weights (the replicas stayed in sync)...
sums=$(grep -o 'params sum .*' two.log | sort -u | wc -l)
[ "$(grep -c 'params sum' two.log)" = 2 ] && [ "$sums" = 1 ] || { echo "FAIL: ranks disagree"; exit 1; }
# ...and they equal the one-process run on the global batch, tensor by tensor.
"$cli" checkpoint compare ckpt_2ranks ckpt_1proc --rtol 1e-5

# Example (3): FSDP on 2 ranks trains and its sharded checkpoint reads back.
"$cli" launch --nproc-per-node 2 -- "$work/examples/fsdp_custom_model/fsdp_custom_model" | tee fsdp.log
grep -q 'FSDP on 2 ranks' fsdp.log
"$cli" checkpoint inspect fsdp_ckpt > /dev/null

# Example (2): the Trainer on a registered model and dataset, 2 ranks, ZeRO-3.
"$cli" launch --nproc-per-node 2 -- "$work/examples/trainer_custom_model/trainer_custom_model" \
  "$src/examples/trainer_custom_model/spirals.toml" train.epochs=1 zero.stage=3 run.output_dir="$work/runs" | tee trainer.log
grep -q 'test accuracy' trainer.log
# The same registered model in 2 pipeline stages (it lists its layers()).
"$cli" launch --nproc-per-node 2 -- "$work/examples/trainer_custom_model/trainer_custom_model" \
  "$src/examples/trainer_custom_model/spirals.toml" train.epochs=1 parallel.pp=2 pipeline.microbatches=4 \
  run.name=spirals_pp run.output_dir="$work/runs" | tee trainer_pp.log
grep -q 'pipeline (1f1b, 2 stages.*test accuracy' trainer_pp.log

# The Trainer on the program's own module and loss, 2 ranks under ZeRO-2.
"$cli" launch --nproc-per-node 2 -- "$work/examples/trainer_own_loss/trainer_own_loss" \
  "$src/examples/trainer_own_loss/multitask.toml" train.epochs=1 zero.stage=2 run.output_dir="$work/runs" | tee own_loss.log
grep -q 'test value MSE' own_loss.log
grep -q '"test_value_mse"' "$work"/runs/multitask/version_0/metrics.jsonl
# The program's own transformer split by its tensor-parallel plan on 2 ranks
# equals one process (the same windows of the fortunes, the same global batch).
"$cli" launch --nproc-per-node 2 -- "$work/examples/tp_custom_model/tp_custom_model" \
  "$src/examples/tp_custom_model/tiny_lm.toml" parallel.tp=2 run.name=tiny_lm_tp2 run.output_dir="$work/runs" \
  | tee tp.log
grep -q 'megatron (parallel.tp_plan, tp 2' tp.log
"$work/examples/tp_custom_model/tp_custom_model" "$src/examples/tp_custom_model/tiny_lm.toml" \
  run.name=tiny_lm_one run.output_dir="$work/runs" | tee tp_one.log
"$cli" checkpoint compare "$work"/runs/tiny_lm_tp2/version_0/checkpoints/step_00000040 \
  "$work"/runs/tiny_lm_one/version_0/checkpoints/step_00000040 --all --rtol 1e-5
echo "install-and-consume: OK"

#!/usr/bin/env bash
# The megatron strategy against one process, as a user runs it: trains
# configs/gpt_fortunes.toml (dropout 0) for STEPS steps in one process and
# under parallel.tp=2, parallel.cp=2 and parallel.tp=2 + megatron_sp on 2
# local processes, consolidates each checkpoint and compares it with the
# one-process checkpoint (`paratrain checkpoint compare --all`: parameters,
# optimizer state, RNG). Prints one summary line per layout and the
# validation losses. Builds nothing: build `paratrain` first.
#
#   bench/run_megatron_oracle.sh                                   # AdamW (the config's optimizer), ~6 min
#   EXTRA="--set optimizer.kind=sgd --set optimizer.momentum=0.9 --set optimizer.lr=0.05" bench/run_megatron_oracle.sh
#
# Why both: under AdamW no strategy (DDP included, DDP=1 adds it) stays within
# 1e-5 of one process for 20 steps; see docs/notes/megatron.md.
# Environment: BUILD_DIR (build), STEPS (20), EXTRA (more --set options),
# OUT (run folder; default a temp dir), DDP (1: also DDP on 2 ranks).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-build}
[[ $build = /* ]] || build=$root/$build
steps=${STEPS:-20}
out=${OUT:-$(mktemp -d -t paratrain-megatron-oracle.XXXXXX)}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
cd "$root"
# shellcheck disable=SC2206
common=(-c configs/gpt_fortunes.toml --set model.dropout=0 --set train.max_steps="$steps" --set run.output_dir="$out" ${EXTRA:-})
ckpt=$(printf 'version_0/checkpoints/step_%08d' "$steps")  # $out is fresh: every run is its version_0

"$build/paratrain" train "${common[@]}" --set run.name=single > "$out/single.log" 2>&1
layouts=("tp2:--set parallel.tp=2" "cp2:--set parallel.cp=2" "tp2_sp:--set parallel.tp=2 --set parallel.megatron_sp=true")
[[ ${DDP:-0} = 1 ]] && layouts+=("ddp2:--set data.batch_size=8")
for layout in "${layouts[@]}"; do
  name=${layout%%:*}
  # shellcheck disable=SC2086
  "$build/paratrain" launch --nproc-per-node 2 -- "$build/paratrain" train "${common[@]}" --set run.name="$name" \
    ${layout#*:} > "$out/$name.log" 2>&1
  "$build/paratrain" checkpoint consolidate "$out/$name/$ckpt" -o "$out/$name.safetensors" > /dev/null
  echo "$name: $("$build/paratrain" checkpoint compare --all "$out/$name.safetensors" "$out/single/$ckpt" | tail -1 || true)"
done
grep -H "val loss" "$out"/*.log | sed 's/\[[0-9:.]*\] \[r0\] \[info\] //'
echo "runs in $out"

#!/usr/bin/env bash
# The GPT on pipeline stages against one process, as a user runs it: trains
# configs/gpt_fortunes.toml (dropout 0, SGD + momentum) for STEPS steps in one
# process with train.accumulate = 4 micro-batches of 4 windows, then under
# parallel.pp=2 (2 processes) and parallel.tp=2 x parallel.pp=2 (4 processes)
# with pipeline.microbatches = 4 and the same 16 windows per step,
# consolidates each checkpoint and compares it with the one-process checkpoint
# (`paratrain checkpoint compare --all`: parameters, momentum, RNG). Prints one
# summary line per layout and the validation losses. Builds nothing.
#
#   bench/run_gpt_pipeline_oracle.sh          # ~10 min on the shared 2-core machine
#
# SGD, not the config's AdamW: AdamW turns rounding noise into full-size
# steps for any strategy, DDP included (docs/notes/megatron.md).
# Environment: BUILD_DIR (build), STEPS (20), OUT (run folder; default a temp
# dir), LAYOUTS (default "pp2 tp2_pp2"; also dp2_tp2_pp2, tp2_pp2_cp2 and
# dp2_tp2_pp2_zero1 on 8 processes, pp2_cp2, tp2_pp2_sp, dp2_tp2_zero1,
# dp2_tp2_sp_zero2, dp2_tp2_sp_zero3 and tp2_cp2_zero3 (FSDP) on 4,
# dp2_tp2_pp2_cp2 on 16: the full mesh), MODEL (extra --set arguments,
# e.g. "--set model.d_model=64 --set model.seq_len=64" for a smaller GPT).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-build}
[[ $build = /* ]] || build=$root/$build
steps=${STEPS:-20}
out=${OUT:-$(mktemp -d -t paratrain-gpt-pipeline-oracle.XXXXXX)}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
cd "$root"
# shellcheck disable=SC2206  # MODEL is a list of arguments
common=(-c configs/gpt_fortunes.toml --set model.dropout=0 --set train.max_steps="$steps" --set run.output_dir="$out"
        --set optimizer.kind=sgd --set optimizer.lr=0.05 --set optimizer.momentum=0.9 --set optimizer.weight_decay=0
        ${MODEL:-})
ckpt=$(printf 'version_0/checkpoints/step_%08d' "$steps")  # $out is fresh: every run is its version_0

"$build/paratrain" train "${common[@]}" --set run.name=single --set data.batch_size=4 --set train.accumulate=4 \
  > "$out/single.log" 2>&1
for name in ${LAYOUTS:-pp2 tp2_pp2}; do
  case $name in
    pp2) nproc=2; args=(--set parallel.pp=2) ;;
    tp2_pp2) nproc=4; args=(--set parallel.pp=2 --set parallel.tp=2) ;;
    # 2 replicas of 8 windows each: the same 16 windows per step.
    dp2_tp2_pp2) nproc=8; args=(--set parallel.pp=2 --set parallel.tp=2 --set data.batch_size=8) ;;
    pp2_cp2) nproc=4; args=(--set parallel.pp=2 --set parallel.cp=2) ;;
    tp2_pp2_sp) nproc=4; args=(--set parallel.pp=2 --set parallel.tp=2 --set parallel.megatron_sp=true) ;;
    tp2_pp2_cp2) nproc=8; args=(--set parallel.pp=2 --set parallel.tp=2 --set parallel.cp=2) ;;
    dp2_tp2_pp2_cp2) nproc=16; args=(--set parallel.pp=2 --set parallel.tp=2 --set parallel.cp=2 --set data.batch_size=8) ;;
    dp2_tp2_pp2_zero1) nproc=8
      args=(--set parallel.pp=2 --set parallel.tp=2 --set data.batch_size=8 --set zero.stage=1) ;;
    # No stages: the same micro-batches by train.accumulate (2 x 2 ranks x 4).
    dp2_tp2_zero1) nproc=4
      args=(--set parallel.tp=2 --set data.batch_size=4 --set train.accumulate=2 --set zero.stage=1) ;;
    # ZeRO-2 and FSDP over the replicas, Megatron-SP's sums on their pieces.
    dp2_tp2_sp_zero2) nproc=4
      args=(--set parallel.tp=2 --set parallel.megatron_sp=true --set data.batch_size=4 --set train.accumulate=2
            --set zero.stage=2) ;;
    dp2_tp2_sp_zero3) nproc=4
      args=(--set parallel.tp=2 --set parallel.megatron_sp=true --set data.batch_size=4 --set train.accumulate=2
            --set zero.stage=3) ;;
    tp2_cp2_zero3) nproc=4
      args=(--set parallel.tp=2 --set parallel.cp=2 --set data.batch_size=4 --set train.accumulate=4 --set zero.stage=3) ;;
    *) echo "unknown layout $name" >&2; exit 2 ;;
  esac
  "$build/paratrain" launch --nproc-per-node "$nproc" -- "$build/paratrain" train "${common[@]}" \
    --set run.name="$name" --set pipeline.microbatches=4 "${args[@]}" > "$out/$name.log" 2>&1
  "$build/paratrain" checkpoint consolidate "$out/$name/$ckpt" -o "$out/$name.safetensors" > /dev/null
  echo "$name: $("$build/paratrain" checkpoint compare --all "$out/$name.safetensors" "$out/single/$ckpt" | tail -1 || true)"
done
grep -H "val loss" "$out"/*.log | sed 's/\[[0-9:.]*\] \[r0\] \[info\] //'
echo "runs in $out"

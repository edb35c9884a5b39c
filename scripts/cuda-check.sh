#!/usr/bin/env bash
# The GPU machine's check of the CUDA path, as one run inside a time budget
# (a lent GPU machine has minutes, not hours; BUDGET_S, default 540 s):
#  1. build the CLI and test_gpu_comm (the NCCL and staging tests) against the
#     local PyTorch wheel's LibTorch in one ninja run (scripts/cuda-build.sh;
#     NCCL backend on);
#  2. those tests (world size 1: one GPU cannot hold two NCCL ranks);
#  3. correctness, each against one GPU process on the same global batch,
#     checkpoints consolidated and compared (`checkpoint compare --all`):
#     the MLP at world size 1 over NCCL (DDP, ZeRO-1/2/3), 2 processes on the
#     GPU over Gloo (FSDP), parameter servers (1 server, 2 GPU workers), two
#     NCCL ranks on one GPU (must be a ConfigError); the GPT under FSDP on 2
#     processes (its tied embedding), a MoE GPT recomputed in backward
#     against the same without; ZeRO-2 and FSDP with the optimizer
#     offloaded to host memory (peak GPU memory, checkpoints after 3 steps);
#  4. timing, nothing else running: DDP on 2 processes against 1 (staging
#     overlapped and synchronous); the GPT in fp32, bf16 and fp16 with the
#     dynamic loss scale, paratrain next to PyTorch eager on the same GPU
#     (bench/run_pytorch_gpt.sh), both sides' profiles of the fp32 step, then
#     DDP scaling on CPU ranks (bench/run_cpu_scaling.sh) with what time is
#     left; what offloading costs per step (offload_time).
# PARTS picks the parts after the build (default "tests correctness staging
# vs profile scaling"); the build is a no-op on a machine that built already,
# so a second call on the same warm machine can run what the first skipped.
# Every figure goes to $out/figures.jsonl, a digest to summary.txt; $OUT
# (the device tool's folder), when set, gets both and logs.tgz.
# Needs third_party/vendor (scripts/vendor-headers.sh) and Fashion-MNIST's
# *-ubyte.gz files in $FASHION_DIR (default data/fashion-mnist).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${LOGS:-/tmp/cuda-check}"; mkdir -p "$out"
t0=$(date +%s); budget="${BUDGET_S:-540}"
left() { echo $(( budget - ($(date +%s) - t0) )); }
finish() {
  [ -n "${OUT:-}" ] || return 0
  cp "$out/summary.txt" "$out/figures.jsonl" "$OUT/" 2>/dev/null
  (cd "$out" && tar czf "$OUT/logs.tgz" --exclude='runs' --exclude='*.safetensors' . 2>/dev/null)
}
trap finish EXIT
say() { echo "$*" | tee -a "$out/summary.txt"; }
step() { say "== $* ($(date +%T), $(left) s left)"; finish; }  # what is done so far reaches $OUT
# A run's timeout: what it may need, but never past the budget.
cap() { local l=$(( $(left) - 20 )); [ "$l" -lt 5 ] && l=5; echo $(( $1 < l ? $1 : l )); }
fig() { echo "$1" >> "$out/figures.jsonl"; }
enough() {  # seconds needed, what
  [ "$(left)" -gt "$1" ] && return 0
  say "skipped $2: $(left) s left, needs $1"; return 1
}
fashion="${FASHION_DIR:-$PWD/data/fashion-mnist}"
export PARATRAIN_BUILD_JOBS="${PARATRAIN_BUILD_JOBS:-$(( $(nproc) + 2 ))}" OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export PARATRAIN_FAST_BUILD="${PARATRAIN_FAST_BUILD:-1}"  # -O1 -DNDEBUG: minutes count here (cuda-build.sh)
# A LibTorch error names the C++ frames that raised it: the one run of a
# failure here is all there is to learn from.
export TORCH_SHOW_CPP_STACKTRACES=1
parts=" ${PARTS:-tests correctness staging vs profile offload_time scaling} "
want() { [[ $parts == *" $1 "* ]]; }
nvidia-smi -L 2>&1 | head -2 | tee -a "$out/summary.txt"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())' \
  2>&1 | tee -a "$out/summary.txt"

# The CLI and the GPU tests' small binary in one ninja run (16 cores; the
# test binary's few sources ride along with the CLI's long tail).
step "build paratrain and test_gpu_comm"
timeout "${BUILD_S:-330}" ./scripts/cuda-build.sh -k 0 paratrain test_gpu_comm > "$out/build.log" 2>&1
say "rc=$?"
if [ ! -x build-cuda/paratrain ] && grep -q "FAILED:.*nccl_group.cpp" "$out/build.log" && enough 200 "NCCL-less rebuild"; then
  # The NCCL backend is the one part only this machine compiles: without it
  # the rest still runs (world.backend = "nccl" then says the build lacks it).
  step "rebuild without NCCL"
  cmake -DPARATRAIN_WITH_NCCL=OFF build-cuda > /dev/null 2>&1
  timeout 150 ./scripts/cuda-build.sh -k 0 paratrain > "$out/build2.log" 2>&1
  say "rc=$?"
fi
grep -E "paratrain: (NCCL|MPI) backend" "$out/build.log" | head -2 >> "$out/summary.txt"
grep -E "error:|FAILED:" "$out/build.log" | sort | uniq -c | sort -rn | head -30 >> "$out/summary.txt"
cli=build-cuda/paratrain
[ -x "$cli" ] || { step "no CLI built"; exit 0; }

if want tests && [ -x build-cuda/tests/test_gpu_comm ]; then
  step "NCCL and staging tests"
  timeout 90 build-cuda/tests/test_gpu_comm --gtest_filter='NcclGroup.*:HostStaging*' > "$out/nccl-tests.log" 2>&1
  rc=$?
  say "rc=$rc; $(grep -cE '^\[       OK \]' "$out/nccl-tests.log") passed, $(grep -cE '^\[  FAILED  \]' "$out/nccl-tests.log") failed lines, $(grep -cE '^\[  SKIPPED \]' "$out/nccl-tests.log") skipped"
  grep -E "OK \]|FAILED|Failure|SKIPPED|error" "$out/nccl-tests.log" | head -24 >> "$out/summary.txt"
  fig "{\"check\":\"test_gpu_comm\",\"rc\":$rc}"
fi

# ---- correctness: three lanes at once (none of them is timed) ----
steps=${MLP_STEPS:-60}
mlp=(-c configs/fashion_mnist_mlp.toml --set data.dir="$fashion" --set train.max_steps=$steps
     --set train.eval_every_epochs=0 --set run.output_dir="$out/runs" --set log.progress=off)
ckpt() { printf 'version_0/checkpoints/step_%08d' "$1"; }
compare() {  # run name, reference run name, steps, launch rc, what
  local rel
  $cli checkpoint consolidate "$out/runs/$1/$(ckpt "$3")" -o "$out/$1.safetensors" > "$out/$1.consolidate.log" 2>&1 || {
    say "$1 ($5): launch rc=$4, no checkpoint: $(grep -m1 -iE 'error' "$out/$1.log")"
    fig "{\"check\":\"$1\",\"what\":\"$5\",\"rc\":$4,\"ok\":false}"; return; }
  rel=$($cli checkpoint compare --all "$out/$1.safetensors" "$out/runs/$2/$(ckpt "$3")" 2>&1 | tail -1)
  say "$1 ($5) vs $2: launch rc=$4; $rel"
  fig "{\"check\":\"$1\",\"what\":\"$5\",\"rc\":$4,\"compare\":\"${rel//\"/}\"}"
}
gpu_lane() {
  # The references over Gloo (host-staged at world size 1): independent of
  # the NCCL backend the runs below check.
  timeout $(cap 120) $cli train "${mlp[@]}" --set world.device=cuda --set world.backend=gloo --set run.name=single \
    --set data.batch_size=128 > "$out/single.log" 2>&1
  echo "single: rc=$?" >> "$out/lane-gpu.txt"
  for stage in 0 1 2 3; do  # world size 1 over NCCL, the global batch
    timeout $(cap 120) $cli train "${mlp[@]}" --set world.device=cuda --set world.backend=nccl --set zero.stage=$stage \
      --set run.name=nccl_zero$stage --set data.batch_size=128 > "$out/nccl_zero$stage.log" 2>&1
    compare nccl_zero$stage single $steps $? "1 rank over NCCL, zero.stage=$stage"
  done
  timeout $(cap 150) $cli launch --nproc-per-node 2 -- $cli train "${mlp[@]}" --set world.device=cuda --set zero.stage=3 \
    --set run.name=fsdp2 > "$out/fsdp2.log" 2>&1
  compare fsdp2 single $steps $? "FSDP, 2 processes on the GPU, Gloo staged"
  # Parameter servers (sync): 1 server and 2 GPU workers of 64 = the global
  # batch of 128; the server steps SGD in host memory.
  timeout $(cap 150) $cli launch --nproc-per-node 3 -- $cli train "${mlp[@]}" --set world.device=cuda --set ps.servers=1 \
    --set run.name=ps3 > "$out/ps3.log" 2>&1
  compare ps3 single $steps $? "parameter servers: 1 server, 2 GPU workers"
  timeout $(cap 60) $cli launch --nproc-per-node 2 -- $cli train "${mlp[@]}" --set world.device=cuda --set world.backend=nccl \
    --set run.name=nccl_two > "$out/nccl_two.log" 2>&1
  local rc=$?
  say "nccl, 2 ranks on 1 GPU: rc=$rc: $(grep -m1 -oE 'world.backend = "nccl": [^(]*' "$out/nccl_two.log")"
  fig "{\"check\":\"nccl_two_ranks_one_gpu\",\"rc\":$rc,\"config_error\":$(grep -q 'NCCL refuses two ranks on one GPU' "$out/nccl_two.log" && echo true || echo false)}"
}
cat docs/*.md docs/notes/*.md > "$out/corpus.txt" 2>/dev/null
gpt=(-c configs/gpt_fortunes.toml --set data.path="$out/corpus.txt" --set model.dropout=0 --set train.max_steps=20
     --set train.eval_every_epochs=0 --set run.output_dir="$out/runs" --set log.progress=off --set world.device=cuda
     --set optimizer.kind=sgd --set optimizer.lr=0.05 --set optimizer.momentum=0.9 --set optimizer.weight_decay=0)
gpt_lane() {
  # FSDP on the GPT: its tied embedding is read by the first layer and the head.
  timeout $(cap 150) $cli train "${gpt[@]}" --set world.backend=gloo --set run.name=gpt_single \
    --set data.global_batch_size=16 > "$out/gpt_single.log" 2>&1
  echo "gpt_single: rc=$?" >> "$out/lane-gpt.txt"
  timeout $(cap 150) $cli launch --nproc-per-node 2 -- $cli train "${gpt[@]}" --set run.name=gpt_fsdp2 \
    --set data.global_batch_size=16 --set zero.stage=3 > "$out/gpt_fsdp2.log" 2>&1
  compare gpt_fsdp2 gpt_single 20 $? "GPT under FSDP, 2 processes on the GPU"
  # A MoE GPT recomputed in backward: on the GPU the recompute runs on the
  # autograd engine's thread, where only the segment's kept loss weight
  # gives the aux loss its gradient (Note [Aux losses in backward]).
  local moe=(--set model.moe_experts=4 --set model.moe_top_k=2 --set model.moe_every=1 --set world.backend=gloo)
  timeout $(cap 150) $cli train "${gpt[@]}" "${moe[@]}" --set run.name=gpt_moe > "$out/gpt_moe.log" 2>&1
  echo "gpt_moe: rc=$?" >> "$out/lane-gpt.txt"
  timeout $(cap 150) $cli train "${gpt[@]}" "${moe[@]}" --set train.activation_checkpointing=blocks \
    --set run.name=gpt_moe_recompute > "$out/gpt_moe_recompute.log" 2>&1
  compare gpt_moe_recompute gpt_moe 20 $? "MoE GPT with activation checkpointing vs without, on the GPU"
  # Expert parallelism on the GPU: 2 processes (Gloo, staged all-to-all),
  # each holding 2 of the 4 experts, against one process holding all 4.
  timeout $(cap 150) $cli train "${gpt[@]}" "${moe[@]}" --set data.global_batch_size=16 \
    --set run.name=gpt_moe_b16 > "$out/gpt_moe_b16.log" 2>&1
  echo "gpt_moe_b16: rc=$?" >> "$out/lane-gpt.txt"
  timeout $(cap 150) $cli launch --nproc-per-node 2 -- $cli train "${gpt[@]}" "${moe[@]}" --set data.global_batch_size=16 \
    --set parallel.ep=2 --set run.name=gpt_moe_ep2 > "$out/gpt_moe_ep2.log" 2>&1
  compare gpt_moe_ep2 gpt_moe_b16 20 $? "MoE GPT, ep=2 on 2 processes on the GPU vs one process"
}
offload_lane() {
  # ZeRO-Offload at world size 1 with AdamW, ZeRO-2 and FSDP, the optimizer
  # state on the GPU and in host memory: peak GPU memory (the caching
  # allocator's, logged at the end of training) and the checkpoints after 3
  # steps, before GPU-vs-host rounding in AdamW can grow (30 steps of it
  # were 4.8 apart on 2026-11-27).
  local off=(-c configs/gpt_fortunes.toml --set data.path="$out/corpus.txt" --set model.dropout=0
             --set model.d_model=512 --set model.layers=6 --set model.heads=8 --set train.max_steps=3
             --set train.eval_every_epochs=0 --set run.output_dir="$out/runs" --set log.progress=off
             --set world.device=cuda --set optimizer.kind=adamw)
  local peak stage o
  for stage in 2 3; do
    for o in none cpu; do
      timeout $(cap 150) $cli train "${off[@]}" --set zero.stage=$stage --set zero.offload=$o \
        --set run.name=offload${stage}_$o > "$out/offload${stage}_$o.log" 2>&1
      local rc=$?
      peak=$(grep -m1 -oE 'peak GPU memory on cuda[:0-9]*: [0-9.]+ MiB allocated, [0-9.]+ MiB reserved' \
        "$out/offload${stage}_$o.log")
      say "offload${stage}_$o: rc=$rc; $peak"
      fig "{\"check\":\"offload${stage}_$o\",\"rc\":$rc,\"peak\":\"$peak\"}"
    done
    compare offload${stage}_cpu offload${stage}_none 3 0 "zero.stage=$stage + AdamW, zero.offload = cpu vs none"
    # SGD with momentum: no division by a gradient's own magnitude, so the
    # host step's rounding stays at the float level over 10 steps.
    for o in none cpu; do
      timeout $(cap 150) $cli train "${off[@]}" --set zero.stage=$stage --set zero.offload=$o --set train.max_steps=10 \
        --set optimizer.kind=sgd --set optimizer.lr=0.05 --set optimizer.momentum=0.9 --set optimizer.weight_decay=0 \
        --set run.name=offsgd${stage}_$o > "$out/offsgd${stage}_$o.log" 2>&1
    done
    compare offsgd${stage}_cpu offsgd${stage}_none 10 0 "zero.stage=$stage + SGD momentum, zero.offload = cpu vs none"
  done
}
if want correctness && enough 150 "correctness"; then
  step "correctness: MLP on the GPU (NCCL, FSDP, parameter servers), GPT under FSDP, offload (three lanes at once)"
  gpu_lane & gpt_lane & offload_lane & wait
  cat "$out"/lane-*.txt >> "$out/summary.txt" 2>/dev/null
  grep -h "peak GPU memory" "$out/single.log" "$out/gpt_single.log" 2>/dev/null | head -2 >> "$out/summary.txt"
  # The first error of each failed run, with LibTorch's C++ frames.
  for f in fsdp2 nccl_zero3 gpt_fsdp2 ps3 offload3_cpu; do
    grep -q -iE "error|exception" "$out/$f.log" 2>/dev/null || continue
    say "-- $f.log, first error:"; grep -m1 -iE -A12 "error|exception" "$out/$f.log" | head -14 >> "$out/summary.txt"
  done
fi

# ---- timing: one thing at a time ----
# DDP with 2 processes on the one GPU (Gloo, staged) against 1 process on the
# global batch: samples/s between steps 100 and 400 (metrics.jsonl), the
# staging's copies overlapped (default) and synchronous
# (PARATRAIN_STAGING_OVERLAP=0, the first version: 0.61x on 2026-11-25).
rate() {  # run name -> samples/s between the train records of steps 100 and 400
  python3 - "$out/runs/$1" <<'PY'
import glob, json, sys
recs = {}
for f in glob.glob(sys.argv[1] + "/version_*/metrics.jsonl"):
    for line in open(f):
        r = json.loads(line)
        if r.get("kind") == "train": recs[r["step"]] = r
a, b = recs.get(100), recs.get(400)
print("null" if not (a and b) else round((b["samples"] - a["samples"]) / (b["time"] - a["time"])))
PY
}
if want staging && enough 100 "DDP on 2 processes with overlapped staging"; then
  step "DDP: 1 process vs 2 processes on the GPU, staging overlapped and synchronous"
  timed=("${mlp[@]}" --set world.device=cuda --set train.max_steps=400 --set run.log_every=50 --set train.epochs=100)
  timeout $(cap 60) $cli train "${timed[@]}" --set world.backend=gloo --set data.batch_size=128 --set run.name=t_one \
    > "$out/t_one.log" 2>&1
  timeout $(cap 60) $cli launch --nproc-per-node 2 -- $cli train "${timed[@]}" --set run.name=t_two \
    > "$out/t_two.log" 2>&1
  PARATRAIN_STAGING_OVERLAP=0 timeout $(cap 60) $cli launch --nproc-per-node 2 -- $cli train "${timed[@]}" \
    --set run.name=t_two_sync > "$out/t_two_sync.log" 2>&1
  one=$(rate t_one) two=$(rate t_two) sync=$(rate t_two_sync)
  say "DDP samples/s: 1 process $one, 2 processes $two (overlapped staging), $sync (synchronous)"
  fig "{\"check\":\"staging_overlap\",\"one\":$one,\"two_overlap\":$two,\"two_sync\":$sync}"
fi
if want vs && [ -x bench/run_pytorch_gpt.sh ] && enough "${VS_NEED:-100}" "paratrain vs PyTorch eager"; then
  step "GPT: paratrain vs PyTorch eager on this GPU (fp32, bf16, fp16)"
  PARATRAIN="$PWD/$cli" timeout $(( $(left) - 60 )) bench/run_pytorch_gpt.sh "$out/vs_pytorch" > "$out/vs_pytorch.log" 2>&1
  say "rc=$?"
  cat "$out"/vs_pytorch/*.jsonl >> "$out/figures.jsonl" 2>/dev/null
  cat "$out"/vs_pytorch/*.md >> "$out/summary.txt" 2>/dev/null
fi
# Where the fp32 step's time goes, both sides (issue 31: explain the gap
# from a profile): 5 steps after 20, paratrain's profiler (docs/profiling.md)
# and torch.profiler on the twin, the top operators of each.
if want profile && enough 60 "profiles of the GPT step"; then
  step "profiles: paratrain and PyTorch eager, the same GPT in fp32"
  shapes=(--set model.d_model=512 --set model.layers=6 --set model.heads=8 --set model.seq_len=256
          --set data.batch_size=32 --set model.dropout=0.1)
  timeout $(cap 60) $cli train -c configs/gpt_fortunes.toml --set world.device=cuda \
    --set data.path="$out/corpus.txt" "${shapes[@]}" --set train.max_steps=30 --set train.eval_every_epochs=0 \
    --set run.output_dir="$out/runs" --set log.progress=off --set run.name=prof --set profile.steps=21-25 \
    > "$out/prof.log" 2>&1
  $cli profile "$out/runs/prof" --top 20 > "$out/profile-paratrain.txt" 2>&1
  timeout $(cap 60) python3 bench/pytorch_gpt.py --device cuda --data "$out/corpus.txt" --d-model 512 --layers 6 \
    --heads 8 --seq-len 256 --batch-size 32 --dropout 0.1 --steps 26 --warmup-steps 20 --profile-steps 5 \
    --profile-out "$out/profile-pytorch.txt" > "$out/prof-pytorch.log" 2>&1
  head -30 "$out/profile-paratrain.txt" >> "$out/summary.txt"
  head -30 "$out/profile-pytorch.txt" >> "$out/summary.txt"
fi
# What offloading costs per step (its copies and host step are not yet
# overlapped with the backward): the GPT of the offload lane, ZeRO-2 and
# FSDP, AdamW, samples/s between steps 20 and 60, offloaded and not. The
# host step runs on LibTorch's intra-op threads: these runs get the
# machine's cores (OMP_NUM_THREADS unset; the rest of the check pins 1),
# and ZeRO-2's offloaded run once more on 1 thread (2026-11-28's 0.12x),
# then its step profiled (where the offloaded step's time goes).
rate_between() {  # run name, first step, last step -> samples/s
  python3 - "$out/runs/$1" "$2" "$3" <<'PY'
import glob, json, sys
recs = {}
for f in glob.glob(sys.argv[1] + "/version_*/metrics.jsonl"):
    for line in open(f):
        r = json.loads(line)
        if r.get("kind") == "train": recs[r["step"]] = r
a, b = recs.get(int(sys.argv[2])), recs.get(int(sys.argv[3]))
print("null" if not (a and b) else round((b["samples"] - a["samples"]) / (b["time"] - a["time"]), 1))
PY
}
if want offload_time && enough 90 "offload timing"; then
  step "offload timing: ZeRO-2 and FSDP, AdamW, offloaded and not"
  toff() {  # name, more flags
    local name=$1; shift
    timeout $(cap 60) $cli train -c configs/gpt_fortunes.toml --set data.path="$out/corpus.txt" --set model.dropout=0 \
      --set model.d_model=512 --set model.layers=6 --set model.heads=8 --set train.max_steps=60 --set run.log_every=20 \
      --set train.eval_every_epochs=0 --set run.output_dir="$out/runs" --set log.progress=off --set world.device=cuda \
      --set optimizer.kind=adamw --set run.name=$name "$@" > "$out/$name.log" 2>&1
  }
  for stage in 2 3; do
    for o in none cpu; do
      env -u OMP_NUM_THREADS bash -c "$(declare -f toff cap left); out='$out' cli='$cli' t0=$t0 budget=$budget; \
        toff toff${stage}_$o --set zero.stage=$stage --set zero.offload=$o"
    done
    a=$(rate_between toff${stage}_none 20 60) b=$(rate_between toff${stage}_cpu 20 60)
    say "zero.stage=$stage samples/s ($(nproc) host threads): optimizer on the GPU $a, offloaded $b"
    fig "{\"check\":\"offload_time\",\"stage\":$stage,\"threads\":$(nproc),\"none\":$a,\"cpu\":$b}"
  done
  toff toff2_cpu_1thread --set zero.stage=2 --set zero.offload=cpu
  c=$(rate_between toff2_cpu_1thread 20 60)
  say "zero.stage=2 offloaded, 1 host thread: $c samples/s"
  fig "{\"check\":\"offload_time\",\"stage\":2,\"threads\":1,\"cpu\":$c}"
  if enough 40 "the offloaded step's profile"; then
    env -u OMP_NUM_THREADS bash -c "$(declare -f toff cap left); out='$out' cli='$cli' t0=$t0 budget=$budget; \
      toff toff2_cpu_prof --set zero.stage=2 --set zero.offload=cpu --set profile.steps=31-35"
    $cli profile "$out/runs/toff2_cpu_prof" --top 15 > "$out/profile-offload.txt" 2>&1
    head -40 "$out/profile-offload.txt" >> "$out/summary.txt"
  fi
fi
if want scaling && [ -x bench/run_cpu_scaling.sh ] && enough 70 "CPU scaling"; then
  step "DDP scaling on CPU ranks (shm) next to PyTorch DDP (Gloo)"
  timeout $(( $(left) - 10 )) bench/run_cpu_scaling.sh "$out/scaling" "$PWD/$cli" > "$out/scaling.log" 2>&1
  say "rc=$?"
  cat "$out/scaling/scaling.jsonl" >> "$out/figures.jsonl" 2>/dev/null
  cat "$out/scaling/scaling.md" >> "$out/summary.txt" 2>/dev/null
fi
step "done"

#!/usr/bin/env bash
# paratrain against plain PyTorch eager on one GPU (issue 31, item 7): the same
# GPT trained by `paratrain train` (configs/gpt_fortunes.toml with the shapes
# below, world.device = cuda, world 1) and by its twin bench/pytorch_gpt.py,
# in fp32 and in bf16 autocast (precision.compute = bf16 / --precision bf16),
# one process at a time on the same GPU. Writes into OUT_DIR:
#   results.jsonl  one JSON line per run (impl, precision, tokens_per_s,
#                  samples_per_s, peak_mem_bytes, smi_peak_bytes, ...)
#   summary.md     the table, paratrain / PyTorch ratios
#   *.log          each run's output; runs/ paratrain's run folders
#
#   bench/run_pytorch_gpt.sh OUT_DIR        # 9 processes; estimated ~1-1.5 min on an H100 (not yet run there)
#
# Shapes (defaults; environment overrides): D_MODEL 512, LAYERS 6, HEADS 8,
# SEQ 256, BATCH 32, STEPS 220 of which WARMUP 20 untimed, DROPOUT 0.1, the
# config's AdamW (lr 1e-3, betas 0.9/0.95, eps 1e-8, weight decay 0.1) and
# clip_grad_norm 1.0: 8192 tokens per step, 19.2M parameters.
# Throughput counts steps WARMUP+1..STEPS on both sides: the twin times them
# between torch.cuda.synchronize() calls; paratrain's is read from its
# metrics.jsonl (run.log_every = WARMUP): the records at steps WARMUP and
# STEPS carry wall-clock times, each written once that step's loss.item()
# returned and its optimizer step was issued (the same offset at both ends).
#
# Memory: peak_mem_bytes is torch.cuda.max_memory_allocated() for the twin,
# and for paratrain the same statistic of the same caching allocator, from
# its log line "peak GPU memory on cuda:0: X MiB allocated" (printed when the
# training steps end). For both, smi_peak_bytes is the
# most GPU memory in use (nvidia-smi, sampled every 50 ms) minus the use
# before the run: CUDA context + caching allocator reserve + cuBLAS
# workspaces, the one figure measured the same way for both (null without
# nvidia-smi).
#
# Environment: PARATRAIN (build-cuda/paratrain, else build/paratrain), PYTHON
# (python3), DATA (a text file or folder: default /usr/share/games/fortunes,
# else a corpus made of this tree's docs and sources), DEVICE (cuda; cpu only
# to try the script), RUN_S (timeout per run, 90), EXTRA (1: three more twin
# runs in bf16 that explain gaps: --linear cpp = paratrain's unfused bias add,
# --attention sdpa = the fused attention of torch 2.x, --adamw-impl fused; 0
# = none), EQUIV (1: first, both sides train 8 steps in fp32 with dropout 0
# from the same seeded init and their per-step losses are compared, the twin
# with --linear cpp; 0 = skip), PARATRAIN_ARGS (more --set flags for the
# paratrain runs), TWIN_ARGS (more flags for the twin runs, e.g.
# "--loss-sync-every 0": no loss.item() per step; paratrain syncs every step),
# DDP_NONE (1: paratrain in fp32 once more with ddp.mode = "none"; 0 = skip).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=${1:?usage: bench/run_pytorch_gpt.sh OUT_DIR}
mkdir -p "$dir" && dir=$(cd "$dir" && pwd)
cli=${PARATRAIN:-}
if [ -z "$cli" ]; then
  cli=$root/build-cuda/paratrain
  [ -x "$cli" ] || cli=$root/build/paratrain
fi
python=${PYTHON:-python3}
device=${DEVICE:-cuda}
d_model=${D_MODEL:-512} layers=${LAYERS:-6} heads=${HEADS:-8} seq=${SEQ:-256} batch=${BATCH:-32}
steps=${STEPS:-220} warmup=${WARMUP:-20} dropout=${DROPOUT:-0.1} run_s=${RUN_S:-90} extra=${EXTRA:-1}
equiv=${EQUIV:-1}
read -r -a paratrain_extra <<<"${PARATRAIN_ARGS:-}"
read -r -a twin_extra <<<"${TWIN_ARGS:-}"
results=$dir/results.jsonl
: > "$results"

data=${DATA:-}
if [ -z "$data" ]; then
  if [ -d /usr/share/games/fortunes ]; then
    data=/usr/share/games/fortunes
  else  # no fortunes package (a GPU machine without apt): this tree's own text
    data=$dir/corpus.txt
    (cd "$root" && find docs paratrain apps tests -type f \( -name '*.md' -o -name '*.h' -o -name '*.cpp' \) \
       | LC_ALL=C sort | xargs cat) > "$data"
  fi
fi
echo "corpus $data; paratrain $cli; $("$python" -c 'import torch; print("torch", torch.__version__)' 2>&1)" \
  | tee "$dir/setup.txt"

smi() { command -v nvidia-smi > /dev/null && [ "$device" = cuda ]; }
# measure NAME CMD...: runs CMD under the timeout with nvidia-smi sampling
# GPU memory; leaves NAME.log, NAME.smi (MiB samples) and NAME.base (MiB before).
measure() {
  local name=$1; shift
  local sampler=
  rm -f "$dir/$name.smi" "$dir/$name.base"
  if smi; then
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 > "$dir/$name.base" 2>/dev/null
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 -lms 50 > "$dir/$name.smi" 2>/dev/null &
    sampler=$!
  fi
  local t0=$SECONDS
  timeout "$run_s" "$@" > "$dir/$name.log" 2>&1
  local rc=$?
  [ -n "$sampler" ] && { kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null; }
  echo "$name: rc=$rc, $((SECONDS - t0)) s" | tee -a "$dir/setup.txt"
  return $rc
}

# record NAME KIND [PRECISION]: one JSON line into results.jsonl, from the
# twin's JSON (KIND twin) or paratrain's metrics.jsonl (KIND paratrain), with
# smi_peak_bytes added.
record() {
  "$python" - "$dir" "$1" "$2" "${3:-}" "$steps" "$warmup" "$batch" "$seq" "$d_model" "$layers" "$heads" \
    "$dropout" <<'EOF'
import glob, json, os, sys
d, name, kind, precision = sys.argv[1:5]
steps, warmup, batch, seq, d_model, layers, heads = map(int, sys.argv[5:12])
dropout = float(sys.argv[12])

def smi_peak():
    try:
        base = int(open(f"{d}/{name}.base").read().split()[0])
        samples = [int(l) for l in open(f"{d}/{name}.smi").read().split() if l.strip().isdigit()]
        return (max(samples) - base) * 2**20 if samples else None
    except (OSError, ValueError, IndexError):
        return None

if kind == "twin":
    lines = [l for l in open(f"{d}/{name}.log") if l.startswith("{")]
    if not lines:
        r = {"impl": "pytorch_eager", "name": name, "error": "no result; see " + name + ".log"}
    else:
        r = json.loads(lines[-1])
else:
    import re
    peak = None
    for line in open(f"{d}/{name}.log", errors="replace"):
        m = re.search(r"peak GPU memory on \S+: ([0-9.]+) MiB allocated, ([0-9.]+) MiB reserved", line)
        if m:
            peak = int(float(m.group(1)) * 2**20)
    r = {"impl": "paratrain", "precision": precision, "tokens_per_s": None, "samples_per_s": None,
         "peak_mem_bytes": peak,
         "steps": steps, "timed_steps": steps - warmup, "final_loss": None, "window_loss": None,
         "d_model": d_model, "layers": layers, "heads": heads, "seq_len": seq, "batch_size": batch,
         "dropout": dropout}
    files = glob.glob(f"{d}/runs/{name}/version_*/metrics.jsonl")
    recs = [json.loads(l) for l in open(files[0])] if files else []
    train = {x["step"]: x for x in recs if x.get("kind") == "train"}
    if warmup in train and steps in train:
        a, b = train[warmup], train[steps]
        dt = b["time"] - a["time"]
        r.update(tokens_per_s=(steps - warmup) * batch * seq / dt, samples_per_s=(steps - warmup) * batch / dt,
                 timed_s=dt, window_loss=b["loss"], final_loss=b["loss"],
                 param_bytes=b.get("param_bytes"), grad_bytes=b.get("grad_bytes"),
                 optimizer_bytes=b.get("optimizer_bytes"))
    else:
        r["error"] = f"metrics.jsonl lacks the train records of steps {warmup} and {steps}; see {name}.log"
r["name"] = name
r["smi_peak_bytes"] = smi_peak()
with open(f"{d}/results.jsonl", "a") as f:
    f.write(json.dumps(r) + "\n")
print(json.dumps({k: r.get(k) for k in ("name", "tokens_per_s", "peak_mem_bytes", "smi_peak_bytes",
                                        "window_loss", "error") if k in r}))
EOF
}

twin() {  # NAME PRECISION [FLAGS...]
  local name=$1 precision=$2; shift 2
  measure "$name" "$python" "$root/bench/pytorch_gpt.py" --device "$device" --precision "$precision" \
    --d-model "$d_model" --layers "$layers" --heads "$heads" --seq-len "$seq" --batch-size "$batch" \
    --steps "$steps" --warmup-steps "$warmup" --dropout "$dropout" --data "$data" --loss-window "$warmup" \
    "${twin_extra[@]}" "$@"
  record "$name" twin
}

paratrain() {  # NAME PRECISION [--set FLAGS...]
  local name=$1 precision=$2; shift 2
  measure "$name" "$cli" train -c "$root/configs/gpt_fortunes.toml" --set world.device="$device" \
    --set precision.compute="$precision" --set model.d_model="$d_model" --set model.layers="$layers" \
    --set model.heads="$heads" --set model.seq_len="$seq" --set model.dropout="$dropout" \
    --set data.batch_size="$batch" --set data.path="$data" --set train.max_steps="$steps" --set train.epochs=100 \
    --set run.log_every="$warmup" --set train.checkpoint_every_steps=0 --set train.eval_every_epochs=0 \
    --set log.progress=off --set run.output_dir="$dir/runs" --set run.name="$name" "${paratrain_extra[@]}" "$@"
  record "$name" paratrain "$precision"
}

if [ "$equiv" = 1 ]; then  # the same model on this device: 8 steps, dropout 0, per-step losses
  measure equiv_twin "$python" "$root/bench/pytorch_gpt.py" --device "$device" --d-model "$d_model" \
    --layers "$layers" --heads "$heads" --seq-len "$seq" --batch-size "$batch" --steps 8 --warmup-steps 1 \
    --dropout 0 --data "$data" --linear cpp --print-losses
  steps=8 warmup=1 dropout=0 paratrain equiv_paratrain fp32 --set run.log_every=1
  "$python" - "$dir" <<'EOF' | tee -a "$dir/setup.txt"
import glob, json, sys
d = sys.argv[1]
try:
    twin = json.loads([l for l in open(f"{d}/equiv_twin.log") if l.startswith("{")][-1])["losses"]
    recs = [json.loads(l) for l in open(glob.glob(f"{d}/runs/equiv_paratrain/version_*/metrics.jsonl")[0])]
    ours = [r["loss"] for r in recs if r.get("kind") == "train"]
    diff = max(abs(a - b) / abs(a) for a, b in zip(ours, twin))
    r = {"name": "equivalence_fp32", "steps": min(len(ours), len(twin)), "max_rel_loss_diff": diff,
         "paratrain_losses": ours, "twin_losses": twin}
except (OSError, IndexError, KeyError, ValueError) as e:
    r = {"name": "equivalence_fp32", "error": f"{type(e).__name__}: {e}"}
open(f"{d}/equivalence.json", "w").write(json.dumps(r) + "\n")
print(json.dumps({k: r[k] for k in r if not k.endswith("losses")}))
EOF
  : > "$results"  # the equivalence runs are not results
fi

for precision in fp32 bf16; do
  twin "pytorch_$precision" "$precision"
  paratrain "paratrain_$precision" "$precision"
done
# One process without DDP's reducer (ddp.mode = "none"): what the bucketed
# reducer costs at world size 1 (gradients copied into buckets and back, an
# all-reduce of one rank). DDP_NONE=0 skips it.
[ "${DDP_NONE:-1}" = 1 ] && paratrain paratrain_fp32_ddp_none fp32 --set ddp.mode=none
# fp16 with the dynamic loss scale (paratrain's GradScaler; no twin run):
# its throughput against paratrain's fp32 and bf16 above.
paratrain paratrain_fp16 fp16 --set precision.loss_scale=dynamic
if [ "$extra" = 1 ]; then
  twin pytorch_bf16_linear_cpp bf16 --linear cpp
  "$python" -c 'import torch.nn.functional as F, sys; sys.exit(0 if hasattr(F, "scaled_dot_product_attention") else 1)' \
    && twin pytorch_bf16_sdpa bf16 --attention sdpa
  "$python" -c 'import inspect, sys, torch; sys.exit("fused" not in inspect.signature(torch.optim.AdamW).parameters)' \
    && twin pytorch_bf16_fused_adamw bf16 --adamw-impl fused
fi

"$python" - "$dir" <<'EOF' | tee "$dir/summary.md"
import json, sys
d = sys.argv[1]
rows = [json.loads(l) for l in open(f"{d}/results.jsonl")]
by = {r["name"]: r for r in rows}
first = next((r for r in rows if r.get("impl") == "pytorch_eager" and "error" not in r), {})
print(f"GPT d_model {first.get('d_model')}, {first.get('layers')} layers, {first.get('heads')} heads, "
      f"seq {first.get('seq_len')}, batch {first.get('batch_size')}, dropout {first.get('dropout')}; "
      f"{first.get('timed_steps')} timed steps after {first.get('steps', 0) - first.get('timed_steps', 0)}; "
      f"{first.get('device')}, torch {first.get('torch')}\n")
mib = lambda b: "n/a" if b is None else f"{b / 2**20:.0f} MiB"
print("| run | tokens/s | vs PyTorch | peak allocated | peak in use (nvidia-smi) | loss (last window) |")
print("|---|---|---|---|---|---|")
for r in rows:
    if "error" in r:
        print(f"| {r['name']} | failed: {r['error']} | | | | |")
        continue
    ref = by.get(f"pytorch_{r.get('precision')}", {})
    ratio = (f"{r['tokens_per_s'] / ref['tokens_per_s']:.2f}x"
             if ref.get("tokens_per_s") and r is not ref else "")
    loss = "n/a" if r.get("window_loss") is None else f"{r['window_loss']:.4f}"
    print(f"| {r['name']} | {r['tokens_per_s']:,.0f} | {ratio} | {mib(r.get('peak_mem_bytes'))} | "
          f"{mib(r.get('smi_peak_bytes'))} | {loss} |")
try:
    e = json.loads(open(f"{d}/equivalence.json").read())
    print(f"\nSame model on this device ({e['steps']} fp32 steps, dropout 0, seeded init, twin --linear cpp): "
          f"max relative difference of the per-step losses {e['max_rel_loss_diff']:.3e}"
          if "error" not in e else f"\nEquivalence check failed: {e['error']}")
except OSError:
    pass
for p in ("fp32", "bf16"):
    a, b = by.get(f"paratrain_{p}", {}), by.get(f"pytorch_{p}", {})
    if a.get("smi_peak_bytes") and b.get("smi_peak_bytes"):
        print(f"\n{p}: paratrain / PyTorch peak GPU memory in use (nvidia-smi): "
              f"{a['smi_peak_bytes'] / b['smi_peak_bytes']:.2f}x")
EOF

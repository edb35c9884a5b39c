#!/usr/bin/env bash
# Checks that bench/pytorch_gpt.py trains the same model as `paratrain train`
# (configs/gpt_fortunes.toml, world 1, CPU): builds nothing, runs the CLI and
# the twin on the same corpus and compares
#   1. the initial weights: paratrain's step-1 checkpoint of an SGD run whose
#      first step has rate 0 (lr.warmup_steps = 10 starts from 0) against the
#      twin's own seeded init, and the step-1 loss;
#   2. STEPS steps of AdamW + clipping (the config's), fp32, dropout 0: every
#      step's loss (paratrain's metrics.jsonl at run.log_every = 1) and the
#      final weights (consolidated checkpoint), the twin started --init-from
#      the step-1 checkpoint of (1) (the loader of a paratrain checkpoint);
#   3. the same with precision.compute = bf16 (autocast), seeded init;
#   4. the config's dropout 0.1, fp32, seeded init.
# Each twin runs with --linear python (F.linear, the default for the GPU
# comparison) and --linear cpp (LibTorch C++'s F::linear: matmul, then the bias
# added in place, which is what paratrain computes). Prints a table; exit 1
# when the twin's --linear cpp losses differ from paratrain's by more than
# TOL (default 1e-5, relative) in any case, or its weights by more than TOL.
#
#   bench/check_pytorch_gpt.sh [OUT_DIR]       # ~1 min on 2 cores
#
# Environment: PARATRAIN (default build/paratrain), PYTHON (/usr/bin/python3),
# DATA (/usr/share/games/fortunes), STEPS (10), TOL (1e-5).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cli=${PARATRAIN:-$root/build/paratrain}
python=${PYTHON:-/usr/bin/python3}
data=${DATA:-/usr/share/games/fortunes}
steps=${STEPS:-10}
tol=${TOL:-1e-5}
out=${1:-$(mktemp -d -t pytorch-gpt-check.XXXXXX)}
mkdir -p "$out"
twin=("$python" "$root/bench/pytorch_gpt.py" --data "$data" --warmup-steps 0 --print-losses)
base=(-c "$root/configs/gpt_fortunes.toml" --set run.output_dir="$out/runs" --set data.path="$data"
      --set run.log_every=1 --set train.eval_every_epochs=0 --set log.progress=off)
echo "outputs in $out" >&2

# paratrain NAME STEPS ARGS...: trains, consolidates the last step to NAME.safetensors.
paratrain() {
  local name=$1 n=$2; shift 2
  "$cli" train "${base[@]}" --set run.name="$name" --set train.max_steps="$n" \
    --set train.checkpoint_every_steps="$n" "$@" > "$out/$name.log" 2>&1
  "$cli" checkpoint consolidate "$(printf '%s/runs/%s/version_0/checkpoints/step_%08d' "$out" "$name" "$n")" \
    -o "$out/$name.safetensors" >> "$out/$name.log" 2>&1
}

paratrain init 1 --set optimizer.kind=sgd --set optimizer.momentum=0 --set lr.warmup_steps=10 \
  --set optimizer.clip_grad_norm=0 --set model.dropout=0
paratrain fp32 "$steps" --set model.dropout=0
paratrain bf16 "$steps" --set model.dropout=0 --set precision.compute=bf16
paratrain dropout "$steps"

for linear in python cpp; do
  "${twin[@]}" --linear $linear --steps 1 --lr-warmup-steps 10 --dropout 0 \
    --compare-weights "$out/init.safetensors" > "$out/twin-init-$linear.json" 2> "$out/twin-init-$linear.log"
  "${twin[@]}" --linear $linear --steps "$steps" --dropout 0 --init-from "$out/init.safetensors" --start-batch 0 \
    --compare-weights "$out/fp32.safetensors" > "$out/twin-fp32-$linear.json" 2> "$out/twin-fp32-$linear.log"
  "${twin[@]}" --linear $linear --steps "$steps" --dropout 0 --precision bf16 \
    --compare-weights "$out/bf16.safetensors" > "$out/twin-bf16-$linear.json" 2> "$out/twin-bf16-$linear.log"
  "${twin[@]}" --linear $linear --steps "$steps" --dropout 0.1 \
    --compare-weights "$out/dropout.safetensors" > "$out/twin-dropout-$linear.json" 2> "$out/twin-dropout-$linear.log"
done

"$python" - "$out" "$tol" <<'EOF'
import json, sys
out, tol = sys.argv[1], float(sys.argv[2])
def paratrain_losses(name):
    recs = [json.loads(l) for l in open(f"{out}/runs/{name}/version_0/metrics.jsonl")]
    return [r["loss"] for r in recs if r.get("kind") == "train"]
ok = True
print(f"{'case':<9} {'linear':<7} {'steps':>5} {'max rel loss diff':>18} {'step-1 loss (paratrain / twin)':>34} "
      f"{'worst weight rel diff':>22}  {'worst tensor':<26} {'without k biases':>16}")
for case, ref in (("init", "init"), ("fp32", "fp32"), ("bf16", "bf16"), ("dropout", "dropout")):
    for linear in ("python", "cpp"):
        twin = json.loads(open(f"{out}/twin-{case}-{linear}.json").read())
        a, b = paratrain_losses(ref), twin["losses"]
        n = min(len(a), len(b))
        loss_diff = max(abs(x - y) / abs(x) for x, y in zip(a[:n], b[:n]))
        diffs = twin["max_rel_diff_vs"]["worst"]
        worst = diffs[0]
        # qkv.bias[k]: a gradient that is zero up to rounding, which AdamW
        # normalizes into steps of +-lr: any rounding difference shows there.
        rest = max(r for name, r in diffs if not name.endswith("qkv.bias[k]"))
        print(f"{case:<9} {linear:<7} {n:>5} {loss_diff:>18.3e} {a[0]:>16.8f} / {b[0]:<16.8f}"
              f" {worst[1]:>22.3e}  {worst[0]:<26} {rest:>16.3e}")
        if linear == "cpp" and (loss_diff > tol or worst[1] > tol or n != len(a)):
            ok = False
if ok:
    print(f"OK: the twin's --linear cpp runs equal paratrain's within {tol} (losses and weights)")
else:
    print("FAILED: the twin differs from paratrain beyond", tol)
    sys.exit(1)
EOF

#!/usr/bin/env bash
# Issue 9's targets in one run, at 2 ranks on this host:
#   1. all-reduce busbw per backend (gloo, shm) next to memcpy measured in the
#      same processes (`paratrain bench comm`), ROUNDS times;
#   2. DDP samples/s on the MLP and the CNN for: shm with the bucket buffers
#      in symmetric memory and .grad viewing them (the default path of a shm
#      job with ddp.gradient_as_bucket_view), shm with ordinary buffers (the
#      chunked path, the A/B of the in-place all-reduce), gloo, the
#      no-communication ceiling (nocomm), and PyTorch's DDP (Gloo), each
#      round running every variant in turn (who goes first rotates), so a
#      change of the machine's load hits all alike.
# Prints the JSON lines' medians as a table and the ratios the issue names:
# shm busbw / memcpy, shm / gloo, DDP-shm / nocomm, DDP-shm / PyTorch.
# Builds nothing: build `paratrain` and `ddp_throughput` first.
#
#   bench/run_shm_targets.sh                 # ~10 min on 2 quiet cores
#   ROUNDS=5 OUT=bench/results/x.jsonl bench/run_shm_targets.sh
#
# Environment: BUILD_DIR (build), PYTHON (/usr/bin/python3), ROUNDS (3),
# MODELS ("mlp cnn"), OUT (jsonl to append to; default a temp file).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-build}
[[ $build = /* ]] || build=$root/$build
python=${PYTHON:-/usr/bin/python3}
rounds=${ROUNDS:-3}
models=${MODELS:-mlp cnn}
out=${OUT:-$(mktemp -t paratrain-shm-targets.XXXXXX.jsonl)}
logs=$(mktemp -d -t paratrain-shm-targets.XXXXXX)
for f in "$build/paratrain" "$build/bench/ddp_throughput"; do
  [[ -x $f ]] || { echo "run_shm_targets.sh: $f is missing; build paratrain and ddp_throughput first" >&2; exit 2; }
done
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1

tag() {  # run the command, tag the JSON lines it appends with variant and round
  local variant=$1 round=$2
  shift 2
  local tmp=$logs/last.jsonl
  : >"$tmp"
  if ! "$@" --out "$tmp" >"$logs/$variant-$round.log" 2>&1; then
    echo "run_shm_targets.sh: $variant (round $round) failed:" >&2
    tail -n 20 "$logs/$variant-$round.log" >&2
    exit 1
  fi
  "$python" -c '
import json, sys
for line in open(sys.argv[1]):
    if line.strip():
        j = json.loads(line); j["variant"] = sys.argv[2]; j["round"] = int(sys.argv[3]); j["loadavg"] = float(open("/proc/loadavg").read().split()[0])
        print(json.dumps(j))' "$tmp" "$variant" "$round" >>"$out"
}

steps_for() { case $1 in mlp) echo "--steps 80 --warmup 10" ;; cnn) echo "--steps 30 --warmup 4" ;; esac; }

for ((r = 1; r <= rounds; r++)); do
  tag comm "$r" "$build/paratrain" bench comm --backends gloo,shm --no-summary
  for model in $models; do
    read -r -a steps <<<"$(steps_for "$model")"
    common=(--model "$model" --batch 64 "${steps[@]}")
    variants=(shm-symmetric shm-ordinary gloo nocomm pytorch)
    # Rotate the order each round.
    for ((i = 0; i < ${#variants[@]}; i++)); do
      v=${variants[$(((i + r) % ${#variants[@]}))]}
      case $v in
        shm-symmetric) cmd=("$build/bench/ddp_throughput" "${common[@]}" --comm shm --gradient-as-bucket-view) ;;
        shm-ordinary) cmd=("$build/bench/ddp_throughput" "${common[@]}" --comm shm --gradient-as-bucket-view --no-symmetric-buffers) ;;
        gloo) cmd=("$build/bench/ddp_throughput" "${common[@]}" --comm gloo --gradient-as-bucket-view) ;;
        nocomm) cmd=("$build/bench/ddp_throughput" "${common[@]}" --mode nocomm --gradient-as-bucket-view) ;;
        pytorch) cmd=("$python" "$root/bench/ddp_pytorch.py" "${common[@]}" --gradient-as-bucket-view) ;;
      esac
      # PyTorch's TCPStore clients need the launcher's plain store.
      store=()
      [[ $v = pytorch ]] && store=(--plain-store)
      tag "$model-$v" "$r" "$build/paratrain" launch --nproc-per-node 2 "${store[@]}" -- "${cmd[@]}"
    done
  done
done

"$python" - "$out" <<'PYEOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
med = statistics.median
def pick(pred, key):
    v = [key(r) for r in rows if pred(r)]
    return (med(v), len(v)) if v else (float("nan"), 0)
print("| size | gloo busbw GB/s | shm busbw GB/s | shm-symmetric busbw GB/s | memcpy GB/s | shm/memcpy | symmetric/memcpy | symmetric/gloo |")
print("|---|---|---|---|---|---|---|---|")
sizes = sorted({r["bytes"] for r in rows if r.get("variant") == "comm" and "bytes" in r})
for b in sizes:
    g, _ = pick(lambda r: r.get("variant") == "comm" and r.get("backend") == "gloo" and r.get("bytes") == b, lambda r: r["busbw_gb_s"])
    s, n = pick(lambda r: r.get("variant") == "comm" and r.get("backend") == "shm" and r.get("bytes") == b, lambda r: r["busbw_gb_s"])
    y, _ = pick(lambda r: r.get("variant") == "comm" and r.get("backend") == "shm-symmetric" and r.get("bytes") == b, lambda r: r["busbw_gb_s"])
    m, _ = pick(lambda r: r.get("variant") == "comm" and r.get("bytes") == b, lambda r: r["memcpy_gb_s"])
    print(f"| {b} | {g:.2f} | {s:.2f} | {y:.2f} | {m:.2f} | {s / m:.2f} | {y / m:.2f} | {y / g:.1f}x |")
print()
print("| model | shm symmetric | shm ordinary | gloo | nocomm | PyTorch DDP | sym/nocomm | sym/PyTorch | sym/ordinary |")
print("|---|---|---|---|---|---|---|---|---|")
for model in sorted({r["variant"].split("-")[0] for r in rows if r.get("variant", "comm") != "comm"}):
    v = {k: pick(lambda r, k=k: r.get("variant") == f"{model}-{k}", lambda r: r["samples_per_s"])[0]
         for k in ["shm-symmetric", "shm-ordinary", "gloo", "nocomm", "pytorch"]}
    print(f"| {model} | {v['shm-symmetric']:.0f} | {v['shm-ordinary']:.0f} | {v['gloo']:.0f} | {v['nocomm']:.0f} | "
          f"{v['pytorch']:.0f} | {v['shm-symmetric'] / v['nocomm']:.3f} | {v['shm-symmetric'] / v['pytorch']:.2f}x | "
          f"{v['shm-symmetric'] / v['shm-ordinary']:.2f}x |")
loads = [r["loadavg"] for r in rows]
print(f"\nload average during the runs: {min(loads):.2f} to {max(loads):.2f}; rounds: {max(r['round'] for r in rows)}; lines in {sys.argv[1]}")
PYEOF
echo "run_shm_targets.sh: logs in $logs" >&2

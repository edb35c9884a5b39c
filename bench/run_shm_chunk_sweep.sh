#!/usr/bin/env bash
# The shm backend's chunk-size sweep (issue 9): `paratrain bench comm
# --backends shm` once per chunk size (PARATRAIN_SHM_CHUNK_KB, KiB one rank
# moves per chunk; the segment holds 2 chunks per rank), ROUNDS passes with
# the chunk order rotated each pass, so load drifts hit every size alike.
# Each run measures memcpy beside the all-reduce, so busbw/memcpy is a ratio
# inside one run. Prints every JSON line (tagged with chunk_kb), then one
# JSON summary per size and chunk (medians over rounds) and a one-line
# verdict. Builds nothing: build `paratrain` first.
#
#   bench/run_shm_chunk_sweep.sh
#   CHUNKS_KB="64 256 1024 4096" ROUNDS=5 NPROC=2 bench/run_shm_chunk_sweep.sh
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build}
chunks=(${CHUNKS_KB:-64 256 1024 4096})
rounds=${ROUNDS:-3}
nproc=${NPROC:-2}
sizes=${SIZES_BYTES:-4096,1048576,16777216,67108864}
out=$(mktemp -t paratrain-shm-chunks.XXXXXX.jsonl)
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
for ((r = 0; r < rounds; r++)); do
  for ((i = 0; i < ${#chunks[@]}; i++)); do
    kb=${chunks[$(((i + r) % ${#chunks[@]}))]}
    PARATRAIN_SHM_CHUNK_KB=$kb "$build/paratrain" bench comm --backends shm --nproc "$nproc" --sizes-bytes "$sizes" \
      2>/dev/null | grep '^{' | sed "s/^{/{\"chunk_kb\":$kb,\"round\":$r,/" >> "$out"
  done
done
cat "$out"
/usr/bin/python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
rows = [r for r in rows if r.get("benchmark") == "allreduce"]
by = {}
for r in rows:
    by.setdefault((r["bytes"], r["chunk_kb"]), []).append(r)
best = {}
for (size, kb), rs in sorted(by.items()):
    s = {"benchmark": "shm_chunk_sweep", "bytes": size, "chunk_kb": kb, "runs": len(rs),
         "median_busbw_gb_s": statistics.median(x["busbw_gb_s"] for x in rs),
         "median_busbw_over_memcpy": statistics.median(x["busbw_over_memcpy"] for x in rs),
         "median_latency_us": statistics.median(x["latency_us"] for x in rs)}
    print(json.dumps(s))
    if size not in best or s["median_busbw_gb_s"] > best[size]["median_busbw_gb_s"]:
        best[size] = s
print("summary: best shm chunk per size (median busbw, x memcpy): " + "; ".join(
    f'{b["bytes"] >> 10} KiB -> {b["chunk_kb"]} KiB chunks ({b["median_busbw_gb_s"]:.2f} GB/s, '
    f'{b["median_busbw_over_memcpy"]:.2f}x)' for b in best.values()))
PY

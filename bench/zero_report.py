#!/usr/bin/python3
# Combines the JSON lines of bench/run_zero.sh (zero_throughput and
# zero_pytorch.py, repeated) into one JSON document: per (impl, mode, world)
# median samples/s, per-rank model-state bytes next to the ZeRO formula,
# comm buffers, peak RSS; throughput ratios vs DDP; the targets; then one
# summary line. Not a runner: it reads a file of runs and measures nothing.
#
# The formula (fp32 Adam, Psi parameters, N ranks; Rajbhandari et al. 2019
# with K = 8 for Adam's two fp32 moments and no separate master copy):
#   stage 0: 16 Psi          (4 params + 4 grads + 8 state)
#   stage 1: 8 Psi + 8 Psi'/N
#   stage 2: 4 Psi + 12 Psi'/N
#   stage 3: 16 Psi'/N
# Psi' is the padded element count the engine reports: ZeRO pads every
# gradient bucket, FSDP every unit, to a multiple of N (the only padding
# accounted for; per-parameter or allocator rounding is not).
# PyTorch's ZeroRedundancyOptimizer shards by whole parameters (no padding,
# uneven shards): its cells use stage 1 with Psi' = Psi, and the largest rank.
import argparse
import json
import re
import statistics
import sys
from collections import defaultdict

STATE_TOLERANCE = 0.05   # model-state bytes within 5% of the formula
THROUGHPUT_TARGET = 0.95  # ZeRO-1/2 samples/s vs our DDP at 2 ranks


def formula(stage, psi, padded, n):
    """Per-rank bytes of params, grads and optimizer state."""
    shard = padded / n
    return {0: (4 * psi, 4 * psi, 8 * psi),
            1: (4 * psi, 4 * psi, 8 * shard),
            2: (4 * psi, 4 * shard, 8 * shard),
            3: (4 * shard, 4 * shard, 8 * shard)}[stage]


def main():
    p = argparse.ArgumentParser(description="combine ZeRO/FSDP benchmark runs")
    p.add_argument("runs", help="JSON lines, one per run (rank 0's line)")
    p.add_argument("--meta", default="{}", help="JSON object copied into the document's 'run'")
    p.add_argument("--markdown", action="store_true",
                   help="print the cells as a Markdown table instead of the JSON document")
    o = p.parse_args()
    runs = []
    with open(o.runs) as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    runs.append(json.loads(line))
                except json.JSONDecodeError as e:
                    sys.exit(f"zero_report: {o.runs}:{n}: not a JSON line ({e}); was the run interrupted?")
    if not runs:
        sys.exit(f"zero_report: {o.runs} holds no runs")
    doc = combine(runs, json.loads(o.meta))
    if o.markdown:
        print(markdown(doc))
        return
    text = json.dumps(rounded(doc), indent=2)
    text = re.sub(r"\[\s+([-0-9.,\se]+?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text)
    print(text)
    print(summary(doc))


def combine(runs, meta):
    groups = defaultdict(list)
    errors = {}
    for r in runs:
        if "error" in r or "samples_per_s" not in r:
            errors[f"{r['impl']} {r['mode']} {r['world']}r"] = r.get("error") or "no result"
            continue
        groups[(r["impl"], r["mode"], r["world"])].append(r)
    cells = {}
    for (impl, mode, world), rs in sorted(groups.items()):
        cells.setdefault(impl, {}).setdefault(mode, {})[str(world)] = cell(rs)
    doc = {"benchmark": "zero_throughput", "run": meta,
           "workload": {"model": "mlp 784-1024-1024-10", "optimizer": "adam fp32",
                        "params": runs[0]["params"], "batch_per_rank": runs[0]["batch"]},
           "cells": cells, "errors": errors}

    # Throughput relative to DDP of the same implementation, same world size;
    # also paired (repeat k against repeat k, run close together).
    ratios = {}
    for impl, modes in cells.items():
        ddp = modes.get("ddp", {})
        for mode, worlds in modes.items():
            if mode == "ddp":
                continue
            for world, c in worlds.items():
                if world in ddp:
                    a = groups[(impl, mode, int(world))]
                    b = groups[(impl, "ddp", int(world))]
                    ks = [x["samples_per_s"] / y["samples_per_s"] for x, y in zip(a, b)]
                    ratios.setdefault(impl, {}).setdefault(mode, {})[world] = {
                        "median": c["samples_per_s"] / ddp[world]["samples_per_s"],
                        "paired": statistics.median(ks), "each": ks}
    doc["vs_own_ddp"] = ratios
    cross = {}
    for mode_a, mode_b in (("ddp", "ddp"), ("zero1", "zero"), ("zero2", "zero")):
        for world in ("1", "2"):
            a = cells.get("paratrain", {}).get(mode_a, {}).get(world)
            b = cells.get("pytorch", {}).get(mode_b, {}).get(world)
            if a and b:
                cross.setdefault(f"paratrain {mode_a} / pytorch {mode_b}", {})[world] = \
                    a["samples_per_s"] / b["samples_per_s"]
    doc["vs_pytorch"] = cross
    doc["targets"] = targets(cells, ratios, errors)
    return doc


def cell(rs):
    """Median over repeats for samples/s; bytes from the median run (they do
    not vary between repeats); the largest rank for bytes and peak RSS."""
    rs = sorted(rs, key=lambda r: r["samples_per_s"])
    mid = rs[(len(rs) - 1) // 2]
    world, psi = mid["world"], mid["params"]
    ranks = mid["ranks"]
    top = max(ranks, key=lambda x: x["model_state"])
    padded = mid.get("padded_numel", psi)
    stage = 1 if mid["impl"] == "pytorch" and mid["mode"] == "zero" else mid["stage"]
    f = formula(stage, psi, padded, world)
    out = {
        "samples_per_s": statistics.median(r["samples_per_s"] for r in rs),
        "repeats": [r["samples_per_s"] for r in rs],
        "step_ms": mid["step_ms"],
        "final_loss": mid["final_loss"],
        "phase_ms": mid.get("phase_ms"),
        "bytes": {k: top[k] for k in ("params", "grads", "optimizer_state", "model_state")},
        "formula": {"params": f[0], "grads": f[1], "optimizer_state": f[2], "model_state": sum(f)},
        "model_state_ratio": top["model_state"] / sum(f),
        # What the engine holds beyond the formula, in units of Psi'/N
        # (4 = one fp32 copy of a shard).
        "excess_in_shard_fp32_copies": (top["model_state"] - sum(f)) / (4 * padded / world),
        "model_state_spread": [x["model_state"] for x in ranks],
        "comm_buffers": top["comm_buffers"],
        "peak_rss_max": max(x["peak_rss"] for x in ranks),
        "padded_numel": padded,
    }
    if "padding" in mid:
        out["padding"] = mid["padding"]
    return out


def targets(cells, ratios, errors):
    t = {"model_state_within_5pct": {}, "zero_vs_ddp_2r": {}, "stage3_on_cpu": {}}
    for mode, worlds in cells.get("paratrain", {}).items():
        for world, c in worlds.items():
            r = c["model_state_ratio"]
            t["model_state_within_5pct"][f"{mode} {world}r"] = {
                "ratio": r, "met": abs(r - 1) <= STATE_TOLERANCE}
    for key, err in errors.items():
        if key.startswith("paratrain "):
            t["model_state_within_5pct"][key.split(" ", 1)[1]] = {"error": err, "met": False}
    for mode in ("zero1", "zero2"):
        r = ratios.get("paratrain", {}).get(mode, {}).get("2")
        if r:
            t["zero_vs_ddp_2r"][mode] = {"ratio": r["median"], "paired": r["paired"],
                                          "target": THROUGHPUT_TARGET, "met": r["median"] >= THROUGHPUT_TARGET}
    pt = ratios.get("pytorch", {}).get("zero", {}).get("2")
    if pt:
        t["zero_vs_ddp_2r"]["pytorch ZeroRedundancyOptimizer (reference)"] = {
            "ratio": pt["median"], "paired": pt["paired"]}
    fsdp = cells.get("paratrain", {}).get("fsdp", {})
    t["stage3_on_cpu"] = {"paratrain_worlds_run": sorted(fsdp, key=int),
                          "pytorch_fsdp": {k: v for k, v in errors.items() if k.startswith("pytorch fsdp")} or "not tried",
                          "met": bool(fsdp)}
    return t


def rounded(x):
    if isinstance(x, float):
        return round(x, 3)
    if isinstance(x, dict):
        return {k: rounded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [rounded(v) for v in x]
    return x


def markdown(doc):
    """One row per cell: the table bench/results/*-zero-cpu.md quotes."""
    mb = lambda b: f"{b / 1e6:.2f}" if b is not None else "-"
    rows = ["| impl | mode | ranks | samples/s (median) | vs own DDP (median / paired) | params MB | "
            "grads MB | Adam state MB | model state MB | formula MB | ratio | comm buffers MB | "
            "peak RSS MiB (max rank) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    order = {"ddp": 0, "zero1": 1, "zero": 1, "zero2": 2, "fsdp": 3}
    for impl, modes in doc["cells"].items():
        for mode in sorted(modes, key=lambda m: order.get(m, 9)):
            for world, c in sorted(modes[mode].items(), key=lambda kv: int(kv[0])):
                r = doc["vs_own_ddp"].get(impl, {}).get(mode, {}).get(world)
                vs = f"{r['median']:.2f} / {r['paired']:.2f}" if r else "1 (itself)" if mode == "ddp" else "-"
                b = c["bytes"]
                rows.append(f"| {impl} | {mode} | {world} | {c['samples_per_s']:.0f} | {vs} | {mb(b['params'])} | "
                            f"{mb(b['grads'])} | {mb(b['optimizer_state'])} | {mb(b['model_state'])} | "
                            f"{mb(c['formula']['model_state'])} | {c['model_state_ratio']:.3f} | "
                            f"{mb(c['comm_buffers'])} | {c['peak_rss_max'] / 2**20:.0f} |")
    for key, err in doc["errors"].items():
        impl, mode, world = key.split(" ")
        rows.append(f"| {impl} | {mode} | {world[:-1]} | failed: {err} |" + " |" * 9)
    return "\n".join(rows)


def summary(doc):
    t = doc["targets"]
    ms = t["model_state_within_5pct"]
    met = sum(v["met"] for v in ms.values())
    measured = {k: v for k, v in ms.items() if "ratio" in v}
    worst = max(measured.items(), key=lambda kv: abs(kv[1]["ratio"] - 1)) if measured else None
    failed = [k for k, v in ms.items() if "error" in v]
    bits = [f"model state within 5%: {met}/{len(ms)} cells"
            + (f" (worst {worst[0]} {worst[1]['ratio']:.2f}x)" if worst else "")
            + (f", failed to run: {', '.join(failed)}" if failed else "")]
    z = t["zero_vs_ddp_2r"]
    bits.append("2r vs own DDP: " + ", ".join(
        f"{k.split(' ')[0]} {v['ratio']:.2f}x" + (" ok" if v.get("met") else " MISS" if "met" in v else "")
        for k, v in z.items()))
    s3 = t["stage3_on_cpu"]
    bits.append(f"stage 3 on CPU at {','.join(s3['paratrain_worlds_run']) or 'no'} ranks"
                f" (pytorch fsdp: {'fails' if isinstance(s3['pytorch_fsdp'], dict) else 'not tried'})")
    run = doc.get("run", {})
    if "loadavg_start" in run:
        bits.append(f"load {run['loadavg_start']:.1f}->{run['loadavg_end']:.1f}")
    return "zero/fsdp bench: " + "; ".join(bits)


if __name__ == "__main__":
    main()

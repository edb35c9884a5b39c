#!/usr/bin/python3
# Table of bench/gpt_parallel's JSON lines (bench/run_gpt_parallel.sh): one
# row per layout with tokens/s, parameters on rank 0, and the bytes per step
# each group's collectives moved on rank 0; for plain TP the analytic
# Megatron count next to the measured tp all-reduce bytes. Markdown on stdout.
import json
import sys


def layout(r):
    name = f"tp{r['tp']} cp{r['cp']} dp{r['dp']}"
    return name + (" +sp" if r["megatron_sp"] else "")


def main():
    rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    base = next((r["tokens_per_s"] for r in rows if r["world"] == 1), None)
    print("| layout | ranks | tokens/s | vs 1 process | params rank 0 | collectives per step, rank 0 (MB) | "
          "tp all-reduce: measured / analytic (MB) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        coll = r["collectives_per_step_rank0"]
        parts = [f"{k} {v['count']:.0f}x {v['bytes'] / 1e6:.2f}" for k, v in sorted(coll.items())]
        tp = ""
        if "analytic_tp_all_reduce_bytes_per_step" in r:
            # The mesh reuses the world group for an axis as wide as the world.
            group = "world" if r["tp"] == r["world"] else "tp"
            measured = coll.get(f"{group}/all_reduce", {}).get("bytes", 0)
            tp = f"{measured / 1e6:.2f} / {r['analytic_tp_all_reduce_bytes_per_step'] / 1e6:.2f}"
        ratio = f"{r['tokens_per_s'] / base:.2f}x" if base else ""
        print(f"| {layout(r)} | {r['world']} | {r['tokens_per_s']:.0f} | {ratio} | {r['params_rank0']} | "
              f"{'; '.join(parts) or 'none'} | {tp} |")


if __name__ == "__main__":
    main()

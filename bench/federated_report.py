#!/usr/bin/env python3
"""Table and curves of the federated study (bench/run_federated_study.sh).

Reads the study's rounds.jsonl (one metrics.jsonl record per round, tagged
with "run" and "seed"), prints a Markdown table per run (mean over seeds):
rounds to 85% test accuracy, accuracy at the last round and the best,
seconds per round, MB up and down, epsilon reached; with --png-dir, writes
one data file per run and draws accuracy-vs-round PNGs with gnuplot, one
chart per group (IID, Dirichlet 0.5, Dirichlet 0.1, secure aggregation, DP).

    bench/federated_report.py rounds.jsonl --png-dir plots
"""
import argparse
import collections
import json
import os
import statistics
import subprocess

TARGET = 0.85
CHARTS = [
    ("iid", "IID, 100 clients, 10 per round", lambda r: r.startswith("iid-fed") and "secagg" not in r),
    ("dirichlet-0.5", "Dirichlet alpha = 0.5", lambda r: r.startswith("dir0.5-")),
    ("dirichlet-0.1", "Dirichlet alpha = 0.1", lambda r: r.startswith("dir0.1-") and "secagg" not in r),
    ("secure-aggregation", "FedAvg with and without secure aggregation",
     lambda r: r in ("iid-fedavg", "iid-fedavg-secagg", "dir0.1-fedavg", "dir0.1-fedavg-secagg")),
    ("dp", "DP-FedAvg (clip 1.0), IID", lambda r: r == "iid-fedavg" or r.startswith("iid-dp")),
]


def load(path):
    runs = collections.defaultdict(lambda: collections.defaultdict(list))
    for line in open(path):
        record = json.loads(line)
        runs[record["run"]][record["seed"]].append(record)
    return runs


def summarize(seeds):
    rows = []
    for records in seeds.values():
        evals = [r for r in records if "test_accuracy" in r]
        reached = next((r["round"] for r in evals if r["test_accuracy"] >= TARGET), None)
        eps = [r["epsilon"] for r in records if "epsilon" in r]
        rows.append(dict(
            reached=reached,
            final=evals[-1]["test_accuracy"] if evals else float("nan"),
            best=max((r["test_accuracy"] for r in evals), default=float("nan")),
            seconds=statistics.mean(r["round_seconds"] for r in records),
            up=sum(r["bytes_up"] for r in records) / 1e6,
            down=sum(r["bytes_down"] for r in records) / 1e6,
            epsilon=eps[-1] if eps else None,
            rounds=len(records)))
    return rows


def fmt_reached(values):
    hits = [v for v in values if v is not None]
    if not hits:
        return "not reached"
    text = f"{statistics.mean(hits):.0f}"
    return text if len(hits) == len(values) else f"{text} ({len(hits)}/{len(values)} seeds)"


def table(runs):
    print("| run | seeds | rounds | rounds to 85% | final acc. | best acc. | s/round | MB up | MB down | epsilon |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, seeds in runs.items():
        rows = summarize(seeds)
        eps = [r["epsilon"] for r in rows if r["epsilon"] is not None]
        eps_text = "-" if not eps else (eps[0] if isinstance(eps[0], str) else f"{statistics.mean(eps):.2f}")
        print(f"| {name} | {len(rows)} | {rows[0]['rounds']} | {fmt_reached([r['reached'] for r in rows])} | "
              f"{100 * statistics.mean(r['final'] for r in rows):.2f}% | "
              f"{100 * statistics.mean(r['best'] for r in rows):.2f}% | "
              f"{statistics.mean(r['seconds'] for r in rows):.2f} | {statistics.mean(r['up'] for r in rows):.0f} | "
              f"{statistics.mean(r['down'] for r in rows):.0f} | {eps_text} |")


def plots(runs, out):
    os.makedirs(out, exist_ok=True)
    for name, seeds in runs.items():
        # Mean accuracy over seeds per round.
        by_round = collections.defaultdict(list)
        for records in seeds.values():
            for r in records:
                if "test_accuracy" in r:
                    by_round[r["round"]].append(100 * r["test_accuracy"])
        with open(os.path.join(out, f"{name}.dat"), "w") as f:
            for rnd in sorted(by_round):
                f.write(f"{rnd} {statistics.mean(by_round[rnd]):.4f}\n")
    script = ["set terminal pngcairo size 900,560 noenhanced" if has_cairo() else "set terminal png size 900,560",
              "set xlabel 'round'", "set ylabel 'test accuracy (%)'", "set grid", "set key bottom right",
              "set yrange [0:100]"]
    for chart, title, keep in CHARTS:
        names = [n for n in runs if keep(n)]
        if not names:
            continue
        script.append(f"set output '{chart}.png'")
        script.append(f"set title '{title}'")
        curves = ", ".join(f"'{n}.dat' using 1:2 with lines lw 2 title '{n}'" for n in names)
        script.append(f"plot {curves}, {100 * TARGET} with lines dt 2 lc rgb 'gray' title '85%'")
    with open(os.path.join(out, "plot.gp"), "w") as f:
        f.write("\n".join(script) + "\n")
    subprocess.run(["gnuplot", "plot.gp"], cwd=out, check=True)


def has_cairo():
    out = subprocess.run(["gnuplot", "-e", "set terminal"], capture_output=True, text=True)
    return "pngcairo" in out.stdout + out.stderr


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rounds", help="rounds.jsonl written by run_federated_study.sh")
    parser.add_argument("--png-dir", help="write the curves here")
    args = parser.parse_args()
    runs = load(args.rounds)
    table(runs)
    if args.png_dir:
        plots(runs, args.png_dir)


if __name__ == "__main__":
    main()

"""The study's table from each run's metrics.jsonl: global batch, final and
best test accuracy, first epoch at >= 88%, and the gap to the b64 baseline."""
import json
import os
import sys

rows = []
for d in sys.argv[1:]:
    evals, first = [], None
    for line in open(os.path.join(d, "metrics.jsonl")):
        j = json.loads(line)
        if j.get("kind") == "eval":
            evals.append(j)
        elif j.get("kind") == "train" and first is None:
            first = j
    if not evals:
        continue
    batch = round(first["samples"] / first["step"]) if first and first.get("step") else 0
    acc = [e["test_accuracy"] for e in evals]
    reach = next((e.get("epoch_progress", e["epoch"] + 1) for e in evals if e["test_accuracy"] >= 0.88), None)
    name = os.path.basename(d.rstrip("/"))
    if name.startswith("version_"):  # runs/<name>/version_N: the run's name
        name = os.path.basename(os.path.dirname(d.rstrip("/")))
    rows.append((name, batch, acc[-1], max(acc), reach, len(evals)))

base = next((r[2] for r in rows if r[0] == "b64"), None)
print("| run | global batch | test accuracy (final) | best | epochs to 88% | vs b64 (points) | epochs run |")
print("|---|---|---|---|---|---|---|")
for name, batch, final, best, reach, n in rows:
    gap = f"{100 * (final - base):+.2f}" if base is not None else "-"
    reached = f"{reach:.2f}" if reach is not None else "not reached"
    print(f"| {name} | {batch} | {100 * final:.2f}% | {100 * best:.2f}% | {reached} | {gap} | {n} |")

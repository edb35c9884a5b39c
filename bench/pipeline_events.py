#!/usr/bin/env python3
"""Where a pipeline step's idle time goes, from pipeline_bubble --events.

Reads the raw timeline (one JSON event a line, every rank, measured steps)
and prints one JSON line: per step the measured bubble next to a replay of
the same step with its measured compute durations and free messages (what
the schedule alone would idle with these stages), the per-rank forward and
backward times, the delay of every message a rank waited for (sender's send
start to the receiver's wait end), and time between events on each rank.

  python3 bench/pipeline_events.py EVENTS.jsonl
"""
import argparse
import json
import statistics
from collections import defaultdict

COMPUTE = ("forward", "backward", "recompute")


def replay(per_rank, p, latency_us=0.0):
    """Runs each rank's compute events in their recorded order against the
    pipeline's data dependencies, with their measured durations, every rank
    starting at 0 and each message taking `latency_us`. Returns the makespan."""
    chunks = 1 + max(e["chunk"] for evs in per_rank.values() for e in evs)
    last_mc = chunks * p - 1
    done = {}  # (kind, mb, model chunk) -> end time
    pos = {r: 0 for r in per_rank}
    clock = {r: 0.0 for r in per_rank}
    while any(pos[r] < len(per_rank[r]) for r in per_rank):
        progressed = False
        for r, evs in per_rank.items():
            while pos[r] < len(evs):
                e = evs[pos[r]]
                mc = e["chunk"] * p + r
                dep = None
                if e["kind"] == "forward" and mc > 0:
                    dep = ("forward", e["mb"], mc - 1)
                elif e["kind"] == "backward" and mc < last_mc:
                    dep = ("backward", e["mb"], mc + 1)
                ready = 0.0
                if dep is not None:
                    if dep not in done:
                        break
                    ready = done[dep] + latency_us
                start = max(clock[r], ready)
                clock[r] = start + (e["end_us"] - e["start_us"])
                done[(e["kind"], e["mb"], mc)] = clock[r]
                pos[r] += 1
                progressed = True
        if not progressed:
            raise SystemExit("replay: the recorded orders deadlock (events missing?)")
    return max(clock.values())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("events")
    args = ap.parse_args()
    events = [json.loads(line) for line in open(args.events) if line.strip()]
    by_step = defaultdict(lambda: defaultdict(list))
    for e in events:
        by_step[e["step"]][e["rank"]].append(e)
    p = 1 + max(e["rank"] for e in events)
    steps = []
    delays, untracked_share = [], []
    fb = defaultdict(lambda: defaultdict(list))  # rank -> kind -> per-(mb, chunk) durations
    for step, ranks in sorted(by_step.items()):
        for r in ranks:
            ranks[r].sort(key=lambda e: (e["start_us"], e["end_us"]))
        compute = {r: [e for e in evs if e["kind"] in COMPUTE] for r, evs in ranks.items()}
        first = min(e["start_us"] for evs in compute.values() for e in evs)
        last = max(e["end_us"] for evs in ranks.values() for e in evs)
        span = last - first
        busy = {r: sum(e["end_us"] - e["start_us"] for e in evs) for r, evs in compute.items()}
        measured = 1 - statistics.mean(busy.values()) / span
        free = replay(compute, p)
        replayed = 1 - statistics.mean(busy.values()) / free
        for r, evs in compute.items():
            for e in evs:
                fb[r][e["kind"]].append(e["end_us"] - e["start_us"])
        # Messages a rank waited for: the sender's send (right after the
        # compute that produced it) to the end of the receiver's wait.
        sends = {}
        for r, evs in ranks.items():
            prev = None
            for e in evs:
                if e["kind"] in COMPUTE:
                    prev = e["kind"]
                elif e["kind"] == "send":
                    mc = e["chunk"] * p + r
                    to_mc = mc + 1 if prev == "forward" else mc - 1
                    sends[(prev, e["mb"], to_mc)] = e
        step_delays = []
        for r, evs in ranks.items():
            for i, e in enumerate(evs):
                if e["kind"] != "recv":
                    continue
                # The recv event precedes the compute that uses it.
                user = next((x for x in evs[i + 1:] if x["kind"] in ("forward", "backward")), None)
                if user is None:
                    continue
                s = sends.get(("forward" if user["kind"] == "forward" else "backward", e["mb"], e["chunk"] * p + r))
                if s is not None and e["start_us"] <= s["start_us"]:
                    step_delays.append(e["end_us"] - s["start_us"])
        delays += step_delays
        # Time between a rank's consecutive events of the step (the
        # executor's own work between them: bookkeeping, posting receives).
        gaps = {}
        for r, evs in ranks.items():
            between, cursor = 0, evs[0]["end_us"]
            for e in evs[1:]:
                between += max(0, e["start_us"] - cursor)
                cursor = max(cursor, e["end_us"])
            gaps[r] = between / 1e3
        lat = statistics.median(step_delays) if step_delays else 0.0
        with_lat = 1 - statistics.mean(busy.values()) / replay(compute, p, lat)
        steps.append({"step": step, "span_ms": span / 1e3, "measured": round(measured, 4),
                      "replay_free_messages": round(replayed, 4),
                      "replay_median_message_delay": round(with_lat, 4),
                      "median_message_delay_us": lat, "between_events_ms": {r: round(g, 3) for r, g in gaps.items()}})
    out = {
        "stages": p,
        "steps": steps,
        "measured_median": statistics.median(s["measured"] for s in steps),
        "replay_free_messages_median": statistics.median(s["replay_free_messages"] for s in steps),
        "replay_with_delay_median": statistics.median(s["replay_median_message_delay"] for s in steps),
        "message_delay_us": {"n": len(delays), "median": statistics.median(delays) if delays else None,
                             "p90": sorted(delays)[int(0.9 * (len(delays) - 1))] if delays else None},
        "compute_ms_per_rank": {r: {k: round(statistics.mean(v) / 1e3, 3) for k, v in kinds.items()}
                                for r, kinds in sorted(fb.items())},
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()

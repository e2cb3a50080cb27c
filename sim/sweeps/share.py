#!/usr/bin/env python3
"""The table of docs/ROUTING.md, "Four router replicas sharing their
reservations", from the share-agentic sweeps (one directory per seed):
TTFT p90 of 4 round-robin replicas over 1 router (same policy, real-state
use and cache knowledge), median [min–max] over seeds, per sharing; then,
medians over seeds, the engines per session and prefix-hit rate behind them.

    python3 sim/sweeps/share.py docs/routing/share-agentic docs/routing/share-agentic-seed{2,3,4}
"""
import csv
import statistics
import sys

seeds = [list(csv.DictReader(open(f"{d}/summary.csv"))) for d in sys.argv[1:]]


def share(row):
    return row["share_delay_ms"] and f"{float(row['share_delay_ms']):g}"


def key(row):
    return (row["rate_scale"], row["policy"], row["real_state_use"], row["cache_knowledge"])


def spread(values, fmt="{:.2f}"):
    values = sorted(values)
    if not values:
        return "–"
    mid = statistics.median(values)
    if len(values) == 1:
        return fmt.format(mid)
    return f"{fmt.format(mid)} [{fmt.format(values[0])}–{fmt.format(values[-1])}]"


def cell(knowledge, sharing, rate, policy, use, field="ratio"):
    values = []
    for rows in seeds:
        one = {key(r): r for r in rows if r["routers"] == "1"}
        for r in rows:
            if (r["routers"], r["rate_scale"], r["policy"], r["real_state_use"]) != ("4", rate, policy, use):
                continue
            if r["cache_knowledge"] != knowledge or share(r) != sharing:
                continue
            if field == "ratio":
                values.append(float(r["ttft_p90_s"]) / float(one[key(r)]["ttft_p90_s"]))
            else:
                values.append(float(r[field]))
    return values


groups = []
for r in seeds[0]:
    g = (r["policy"], r["real_state_use"], r["rate_scale"])
    if r["routers"] == "4" and g not in groups:
        groups.append(g)
groups.sort(key=lambda g: (["unified", "sticky", "lmetric"].index(g[0]), g[1] != "never", g[2]))

columns = [
    ("estimated", ""),
    ("engine", ""),
    ("engine", "0"),
    ("engine", "1"),
    ("engine", "10"),
    ("engine", "50"),
    ("estimated", "0"),
]
print(f"TTFT p90, 4 round-robin replicas / 1 router, median [min–max] over {len(seeds)} seeds\n")
print("| policy / use | rate | estimated | engine | engine + shared 0 ms | 1 ms | 10 ms | 50 ms | estimated + shared 0 ms |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
for policy, use, rate in groups:
    cells = []
    for knowledge, sharing in columns:
        if use == "never" and knowledge == "engine":
            # No feed: the routers read no digest, so `engine` is the estimate.
            knowledge = "estimated"
            if not sharing:
                cells.append("(= estimated)")
                continue
        cells.append(spread(cell(knowledge, sharing, rate, policy, use)))
    print(f"| `{policy}` / {use} | {float(rate):g}× | " + " | ".join(cells) + " |")

print(f"\nMedians over {len(seeds)} seeds: TTFT p90 s, engines per session, prefix-hit rate;"
      " 1 router → 4 replicas not sharing → sharing at 0 / 50 ms (`engine`, or the estimate under `never`)\n")
print("| policy / use | rate | TTFT p90 s | engines / session | prefix hit |")
print("|---|---|---|---|---|")
for policy, use, rate in groups:
    knowledge = "estimated" if use == "never" else "engine"
    out = []
    for field, fmt in [("ttft_p90_s", "{:.2f}"), ("engines_per_session_mean", "{:.2f}"), ("prefix_hit_rate", "{:.2f}")]:
        one = statistics.median(
            float(r[field]) for rows in seeds for r in rows
            if r["routers"] == "1" and key(r) == (rate, policy, use, knowledge)
        )
        parts = [fmt.format(one)]
        for sharing in ["", "0", "50"]:
            parts.append(fmt.format(statistics.median(cell(knowledge, sharing, rate, policy, use, field))))
        out.append(" → ".join(parts))
    print(f"| `{policy}` / {use} | {float(rate):g}× | " + " | ".join(out) + " |")

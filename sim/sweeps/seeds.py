#!/usr/bin/env python3
"""Across several seeds' sweeps of the same configurations: TTFT p90 of each
configuration relative to the same seed's `never` (no feed) run, as
"median [min–max]" over seeds (1.00 = no change; < 1 better).

    python3 sim/sweeps/seeds.py docs/routing/agentic-nomig docs/routing/agentic-nomig-seed2 ...
"""
import csv
import statistics
import sys

metric = "ttft_p90_s"
runs = []
for directory in sys.argv[1:]:
    rows = list(csv.DictReader(open(f"{directory}/summary.csv")))
    never = {
        (r["rate_scale"], r["routers"], r["policy"]): float(r[metric])
        for r in rows
        if r["real_state_use"] == "never"
    }
    ratios = {}
    for r in rows:
        if r["real_state_use"] == "never":
            continue
        key = (r["rate_scale"], r["routers"], r["policy"], r["real_state_use"], r["feed"])
        ratios[key] = float(r[metric]) / never[(r["rate_scale"], r["routers"], r["policy"])]
    runs.append(ratios)

keys = list(runs[0])
feeds = []
for k in keys:
    if k[4] not in feeds:
        feeds.append(k[4])
groups = []
for k in keys:
    if (k[0], k[1]) not in groups:
        groups.append((k[0], k[1]))
print(f"TTFT p90 relative to no feed, median [min–max] over {len(runs)} seeds")
for rate, routers in groups:
    print(f"\n**{float(rate):g}× rate, {routers} router replica(s)**\n")
    print("| policy / use | " + " | ".join(f.replace("periodic:", "") + (" ms" if f.startswith("periodic") else "") for f in feeds) + " |")
    print("|---|" + "---:|" * len(feeds))
    rows = []
    for k in keys:
        if (k[0], k[1]) == (rate, routers) and (k[2], k[3]) not in rows:
            rows.append((k[2], k[3]))
    for policy, use in rows:
        if use == "placement" and policy in ("load_only", "lmetric"):
            continue  # shadow only: identical to never without migration
        cells = []
        for f in feeds:
            values = [run[(rate, routers, policy, use, f)] for run in runs]
            cells.append(f"{statistics.median(values):.2f} [{min(values):.2f}–{max(values):.2f}]")
        print(f"| {policy} / {use} | " + " | ".join(cells) + " |")

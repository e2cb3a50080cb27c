#!/usr/bin/env python3
"""Pivot an essim sweep's summary.csv (or .json) into the tables of docs/ROUTING.md:
per (rate, replicas), TTFT p90 (s) of each policy/real-state use by feed.

    python3 sim/sweeps/pivot.py docs/routing/mooncake/summary.csv [metric]
"""
import csv
import json
import sys

if sys.argv[1].endswith(".json"):
    rows = json.load(open(sys.argv[1]))
else:
    rows = []
    for row in csv.DictReader(open(sys.argv[1])):
        for key, value in row.items():
            try:
                row[key] = float(value) if value != "" else None
            except ValueError:
                pass
        rows.append(row)
metric = sys.argv[2] if len(sys.argv) > 2 else "ttft_p90_s"
feeds = []
for r in rows:
    if r["feed"] != "none" and r["feed"] not in feeds:
        feeds.append(r["feed"])
groups = []
for r in rows:
    key = (r["rate_scale"], r["routers"])
    if key not in groups:
        groups.append(key)
for rate, routers in groups:
    print(f"\n**{rate:g}× rate, {int(routers)} router replica(s)** — {metric}\n")
    print("| policy | never (no feed) | use | " + " | ".join(f.replace("periodic:", "") + (" ms" if f.startswith("periodic") else "") for f in feeds) + " |")
    print("|---|---:|---|" + "---:|" * len(feeds))
    group = [r for r in rows if r["rate_scale"] == rate and r["routers"] == routers]
    policies = []
    for r in group:
        if r["policy"] not in policies:
            policies.append(r["policy"])
    for p in policies:
        never = next((r[metric] for r in group if r["policy"] == p and r["real_state_use"] == "never"), None)
        for use in ("placement", "always"):
            cells = []
            for f in feeds:
                v = next((r[metric] for r in group if r["policy"] == p and r["real_state_use"] == use and r["feed"] == f), None)
                cells.append("–" if v is None else f"{v:.2f}")
            first = f"{never:.2f}" if (never is not None and use == "placement") else ""
            print(f"| {p if use == 'placement' else ''} | {first} | {use} | " + " | ".join(cells) + " |")

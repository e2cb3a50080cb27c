#!/usr/bin/env python3
"""Rust router vs the pure-Python baseline, same scenario, one table.

Runs ``cargo bench -p engine-state-router --bench decide`` (unless
``--skip-cargo``), reads criterion's medians from
``$CARGO_TARGET_DIR/criterion`` (default ``target/criterion``), times
``bench/router_baseline.py`` on the same cases in this process, and prints a
Markdown table (medians in microseconds per decision, block hashing included).

    python3 bench/router_compare.py
    python3 bench/router_compare.py --skip-cargo --seconds 1
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import router_baseline  # noqa: E402

POLICIES = ("unified", "lmetric")
TOKENS = (2_000, 32_000, 200_000)
INSTANCES = (8, 64, 256)


def criterion_median_us(root, policy, tokens, instances):
    path = root / f"decide_{policy}" / f"{tokens}tok" / f"{instances}inst" / "new" / "estimates.json"
    return json.loads(path.read_text())["median"]["point_estimate"] / 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--skip-cargo", action="store_true", help="reuse the last criterion run")
    parser.add_argument("--seconds", type=float, default=2.0, help="Python timing time per case")
    args = parser.parse_args()
    repo = HERE.parent
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", repo / "target"))
    if not args.skip_cargo:
        subprocess.run(
            ["cargo", "bench", "-p", "engine-state-router", "--bench", "decide", "--", "decide"],
            cwd=repo,
            check=True,
        )
    root = target / "criterion"
    print("| policy | instances | prompt tokens | Rust median (µs) | Python median (µs) | Python p99 (µs) | speed-up |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for policy in POLICIES:
        for tokens in TOKENS:
            for instances in INSTANCES:
                rust = criterion_median_us(root, policy, tokens, instances)
                py, p99, _, _ = router_baseline.time_decisions(
                    policy, instances, tokens, "builtin", args.seconds, 20
                )
                print(
                    f"| {policy} | {instances} | {tokens:,} | {rust:.2f} | {py:.1f} | {p99:.1f} | {py / rust:.0f}× |",
                    flush=True,
                )


if __name__ == "__main__":
    main()

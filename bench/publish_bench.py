#!/usr/bin/env python3
"""Cost of one publish() call: engine_state.Publisher against a JSON-file publisher.

The baseline is what research scripts and routers use today: a pure-Python
publisher that serialises the snapshot to JSON, writes a temporary file and
renames it over the last one. Both run in this process, same fields, same
machine, one after the other. Prints median and p99 per call (each call timed
alone with perf_counter_ns, the timer's own median cost subtracted).

Usage: python bench/publish_bench.py [--calls N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

from _timing import FIELDS, machine, summary, timed

from engine_state import Publisher


class JsonFilePublisher:
    """The baseline: JSON to a temp file, then an atomic rename."""

    def __init__(self, directory: str, engine_id: str) -> None:
        self.path = os.path.join(directory, engine_id + ".json")
        self.tmp = self.path + ".tmp"

    def publish(self, **fields: int) -> None:
        now = time.time_ns()
        doc = dict(fields, captured_mono_ns=time.monotonic_ns(), captured_unix_ns=now)
        with open(self.tmp, "w") as f:
            json.dump(doc, f)
        os.replace(self.tmp, self.path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000, help="calls per contender (default 200000)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args()
    overhead = int(statistics.median(timed(args.calls, lambda: None)))
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as d:
        with Publisher(uri=f"file://{d}", engine_id="bench", period_ms=50) as pub:
            def publish() -> None:
                pub.publish(**FIELDS)

            timed(10_000, publish)  # warm up
            native = summary(timed(args.calls, publish), overhead)
        baseline_pub = JsonFilePublisher(d, "bench-json")

        def publish_json() -> None:
            baseline_pub.publish(**FIELDS)

        timed(1_000, publish_json)
        baseline = summary(timed(max(args.calls // 20, 1000), publish_json), overhead)
    result = {
        "machine": machine(),
        "timer_overhead_ns": overhead,
        "engine_state.Publisher.publish": native,
        "json_file_publisher": baseline,
        "speedup_median": baseline["median_ns"] / max(native["median_ns"], 1.0),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"publish() per call, {result['machine']}, timer overhead {overhead} ns subtracted")
    for name in ("engine_state.Publisher.publish", "json_file_publisher"):
        r = result[name]
        print(f"  {name:<32} median {r['median_ns']:>9.0f} ns   p99 {r['p99_ns']:>9.0f} ns")
    print(f"  speedup (median): {result['speedup_median']:.0f}x")


if __name__ == "__main__":
    main()

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
import platform
import statistics
import tempfile
import time

from engine_state import Publisher

FIELDS = dict(step=1, num_running=12, num_waiting=3, gpu_blocks_total=20000, gpu_blocks_free=5000,
              pending_prefill_tokens=40000, ongoing_decode_tokens=90000, num_prefilling=2,
              max_prefill_remaining=31000, num_preempted=0, flags=0)


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


def timed(calls: int, fn) -> list[int]:
    out = []
    clock = time.perf_counter_ns
    for _ in range(calls):
        t0 = clock()
        fn()
        out.append(clock() - t0)
    return out


def summary(samples: list[int], overhead: int) -> dict[str, float]:
    samples = sorted(max(s - overhead, 0) for s in samples)
    q = lambda p: samples[min(len(samples) - 1, int(p * (len(samples) - 1)))]
    return {"median_ns": float(q(0.5)), "p99_ns": float(q(0.99)), "mean_ns": statistics.fmean(samples)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000, help="calls per contender (default 200000)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args()
    overhead = int(statistics.median(timed(args.calls, lambda: None)))
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as d:
        with Publisher(uri=f"file://{d}", engine_id="bench", period_ms=50) as pub:
            publish = lambda: pub.publish(**FIELDS)
            timed(10_000, publish)  # warm up
            native = summary(timed(args.calls, publish), overhead)
        baseline_pub = JsonFilePublisher(d, "bench-json")
        publish = lambda: baseline_pub.publish(**FIELDS)
        timed(1_000, publish)
        baseline = summary(timed(max(args.calls // 20, 1000), publish), overhead)
    result = {
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, {platform.python_implementation()} {platform.python_version()}",
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

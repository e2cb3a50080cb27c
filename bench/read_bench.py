#!/usr/bin/env python3
"""Cost of reading 8 engines from Python: engine_state.Reader against JSON files
(and Redis GETs on loopback when redis-server and the redis package are there).

Engines are published by engine_state.Publisher (and, for the baseline, as one
JSON file each). Each read returns every engine's fields; the Reader also
computes staleness. Prints median and p99 per full read of all engines.

Usage: python bench/read_bench.py [--engines N] [--reads N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

from _timing import FIELDS, machine, summary, timed

from engine_state import Publisher, Reader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, default=8)
    parser.add_argument("--reads", type=int, default=50_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=root) as d, tempfile.TemporaryDirectory(dir=root) as jd:
        pubs = [Publisher(uri=f"file://{d}", engine_id=f"engine-{i}") for i in range(args.engines)]
        for p in pubs:
            p.publish(**FIELDS)
        paths = []
        for i in range(args.engines):
            path = os.path.join(jd, f"engine-{i}.json")
            with open(path, "w") as f:
                json.dump(dict(FIELDS, engine_id=f"engine-{i}", captured_mono_ns=1, captured_unix_ns=1), f)
            paths.append(path)
        reader = Reader(uri=f"file://{d}")
        assert len(reader.read()) == args.engines

        def read_json():
            out = []
            for path in paths:
                with open(path) as f:
                    out.append(json.load(f))
            return out

        timed(2000, reader.read)
        native = summary(timed(args.reads, reader.read))
        timed(200, read_json)
        baseline = summary(timed(max(args.reads // 10, 500), read_json))
        for p in pubs:
            p.close()
    result = {
        "machine": machine(),
        "engines": args.engines,
        "engine_state.Reader.read": native,
        "json_files": baseline,
        "speedup_median": baseline["median_ns"] / max(native["median_ns"], 1.0),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"read all {args.engines} engines from Python, {result['machine']}")
    for name in ("engine_state.Reader.read", "json_files"):
        r = result[name]
        print(f"  {name:<26} median {r['median_ns'] / 1000:>8.2f} us   p99 {r['p99_ns'] / 1000:>8.2f} us")
    print(f"  speedup (median): {result['speedup_median']:.1f}x")


if __name__ == "__main__":
    main()

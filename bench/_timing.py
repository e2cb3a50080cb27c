"""Timing helpers shared by the Python benchmarks (each call timed alone)."""

from __future__ import annotations

import os
import platform
import statistics
import time

# The snapshot every benchmark publishes: a busy engine's numbers.
FIELDS = dict(step=1, num_running=12, num_waiting=3, gpu_blocks_total=20000, gpu_blocks_free=5000,
              pending_prefill_tokens=40000, ongoing_decode_tokens=90000, num_prefilling=2,
              max_prefill_remaining=31000, num_preempted=0, flags=0)


def timed(calls: int, fn) -> list[int]:
    """Nanoseconds of each of `calls` calls of `fn`."""
    clock, out = time.perf_counter_ns, []
    for _ in range(calls):
        t0 = clock()
        fn()
        out.append(clock() - t0)
    return out


def percentile(values, q: float):
    """The `q` quantile (0..1) of `values`, nearest rank."""
    s = sorted(values)
    return s[min(len(s) - 1, int(q * (len(s) - 1)))]


def summary(samples: list[int], overhead: int = 0) -> dict[str, float]:
    """Median, p99 and mean in ns, with the timer's own cost subtracted."""
    s = [max(x - overhead, 0) for x in samples]
    return {"median_ns": float(percentile(s, 0.5)), "p99_ns": float(percentile(s, 0.99)),
            "mean_ns": statistics.fmean(s)}


def machine() -> str:
    return f"{platform.machine()} {os.cpu_count()} cpus, {platform.python_implementation()} {platform.python_version()}"

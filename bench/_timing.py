"""Timing helpers shared by the Python benchmarks (each call timed alone)."""

from __future__ import annotations

import os
import platform
import statistics
import time

from engine_state import FIELD_NAMES

# The snapshot every benchmark publishes: a busy engine's numbers, one per
# field a caller sets, in word order (FIELD_NAMES; the capture and cache stamps
# are the publisher's).
_BUSY_ENGINE = (1, 12, 3, 20000, 5000, 40000, 90000, 2, 31000, 0, 0)
_STAMPED = ("captured_", "cache_")
FIELDS = dict(zip((n for n in FIELD_NAMES if not n.startswith(_STAMPED)), _BUSY_ENGINE, strict=True))


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

#!/usr/bin/env python3
"""Cost of the vLLM hook on the scheduler thread, against the approach in use
today (a Python daemon thread that captures the same fields and writes a JSON
file every 50 ms), in the same run. Results: BENCHMARKS.md.

    python bench/hook_bench.py            # vLLM-shaped request doubles
    <vllm-venv>/bin/python bench/hook_bench.py --vllm   # vLLM 0.33's real Scheduler and Requests

For 64, 512 and 1024 live requests (3/4 running, mostly decoding, 1/4
waiting) it measures:

1. capture: one capture + publish (``EngineStateHook.capture``), median and
   p99 over many repetitions;
2. boundary: one wrapped step boundary when no capture is due (wrapper +
   clock + three len());
3. hook per step: a 20 ms decode step emulated for ``--steps`` steps (while
   "the GPU works" the scheduler thread busy-waits on ``sched_yield()`` as
   vLLM 0.33 does, or with ``--forward sleep`` sleeps, an idle core),
   calling the hook after schedule() and after update_from_output() with the
   real 50 ms rate limit; the time spent in the hook, per step and as a share
   of 20 ms;
4. JSON daemon: the same steps with a daemon thread that every 50 ms captures
   the same fields in Python and writes them to a JSON file (write + rename);
   its time per tick and per step (the GIL it holds, stolen from the engine
   process), and how much it delays the scheduler thread's own Python work
   (the same fixed work timed with and without the daemon).

"hook per step: mean" includes every disturbance of the run (on a shared
machine, other processes preempting the thread); "from medians" is the
typical step: median capture cost x captures per step + median boundary cost
x the other boundaries.

``--breakdown STEPS`` (third table): the parts of an in-loop capture timed
one at a time: running requests, the waiting walk, the block counts and the
publish, with the full read of the same requests for comparison.

A/B (second table): the hook as shipped (incremental capture: of the waiting
requests it reads only those that may have changed, with a full recount once
a second) against the same hook forced to full captures (every request read
at every capture), alternating blocks of ``--ab-block`` steps in one run so
that both see the same machine. Before each incremental block the cache is
emptied, so every block pays for rebuilding it (as the steady state pays for
reading arrivals, which this emulation has none of); the recounts are
included.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _timing import percentile, timed  # noqa: E402

STEP_MS = 20.0
PERIOD_MS = 50


# ---- vLLM-shaped doubles (no vLLM needed) -----------------------------------
# The hook's unit-test doubles (publisher-py/tests/vllm_doubles.py: vLLM 0.33's
# attribute names), with vLLM's object size and nothing of its scheduling.


def double_setup(n: int):
    sys.path.insert(0, os.path.join(HERE, "..", "publisher-py", "tests"))
    import vllm_doubles as d

    from engine_state.vllm import _hook

    def make(i: int, prompt: int):
        request = d.Request(f"r{i}", prompt)
        for k in range(40):  # vLLM's Request has ~40 more attributes
            setattr(request, f"attr_{k}", k)
        return request

    scheduler = types.SimpleNamespace(
        running=[],
        waiting=d.FCFSRequestQueue(),
        kv_holding_waiting=d.FCFSRequestQueue(),
        kv_cache_manager=d.KVCacheManager(d.BlockPool(65_537)),
        parallel_config=d.ParallelConfig(),
    )
    status = d.RequestStatus
    fill(scheduler, n, make, status.RUNNING, status.WAITING, status.PREEMPTED)
    hook = _hook.attach(scheduler, status.PREEMPTED)
    return scheduler, hook, status.PREEMPTED


# ---- vLLM's real scheduler and requests -------------------------------------


def vllm_setup(n: int):
    sys.path.insert(0, os.path.join(HERE, "..", "publisher-py", "tests_vllm"))
    from vllm_harness import build_scheduler, make_requests, set_cpu_environment

    set_cpu_environment()
    os.environ["VLLM_PLUGINS"] = "engine_state"
    import vllm.plugins
    from vllm.v1.request import RequestStatus

    vllm.plugins.load_general_plugins()
    scheduler, _ = build_scheduler(False, num_blocks=65_537, max_num_seqs=2048, max_batched=8192)
    counter = iter(range(10**9))

    def make(i: int, prompt: int):
        [request] = make_requests(prompt_lens=(prompt,), max_tokens=4096, prefix=f"{next(counter)}-")
        return request

    fill(
        scheduler,
        n,
        make,
        RequestStatus.RUNNING,
        RequestStatus.WAITING,
        RequestStatus.PREEMPTED,
    )
    hook = scheduler.__dict__["_engine_state_hook"]
    return scheduler, hook, RequestStatus.PREEMPTED


# ---- cache residency (vLLM only) ---------------------------------------------


def residency_setup(n: int):
    """vLLM's real Scheduler with prefix caching, ``n`` requests admitted and
    prefilled by vLLM itself (3/4 running, the rest waiting on max_num_seqs):
    prompts are one of 8 shared 1,024-token system prompts plus 100..900
    tokens of their own, so the pool caches shared and private router blocks
    as in an agentic fleet. Returns (scheduler, hook, {mode: Residency})."""
    sys.path.insert(0, os.path.join(HERE, "..", "publisher-py", "tests_vllm"))
    from vllm_harness import build_scheduler, fake_output, make_request, set_cpu_environment

    set_cpu_environment()
    os.environ["VLLM_PLUGINS"] = "engine_state"
    os.environ["AGENTIC_ENGINE_STATE_RESIDENCY"] = "off"  # the bench attaches each mode itself
    import vllm.plugins

    from engine_state.vllm._residency import Residency

    vllm.plugins.load_general_plugins()
    scheduler, _ = build_scheduler(
        False, prefix_caching=True, num_blocks=131_073, max_num_seqs=max(1, n * 3 // 4),
        max_batched=8192, max_model_len=2048,
    )
    systems = [[10 + s] * 1024 for s in range(8)]
    for i in range(n):
        own = [1000 + (i * 7 + t) % 30_000 for t in range(100 + (i * 37) % 800)]
        scheduler.add_request(make_request(f"p{i}", systems[i % 8] + own, 800))
    step = 0
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in scheduler.running) or (
        len(scheduler.running) < max(1, n * 3 // 4)
    ):
        out = scheduler.schedule()
        scheduler.update_from_output(out, fake_output(scheduler, out, step))
        step += 1
    hook = scheduler.__dict__["_engine_state_hook"]
    modes = {
        mode: Residency.start(scheduler, hook.publisher, mode) for mode in ("verify", "evictions")
    }
    return scheduler, hook, modes


def caching_decode_step(scheduler) -> None:
    """``decode_step`` as vLLM does it with prefix caching: each decoding
    request's next slot is allocated by vLLM's own ``allocate_slots`` (which
    caches its full blocks, and evicts through ``get_new_blocks``) before its
    token is appended, so the pool stays what a real engine's would be."""
    manager = scheduler.kv_cache_manager
    for request in scheduler.running[8:]:
        manager.allocate_slots(request, 1)
        request.append_output_token_ids(5)
        request.num_computed_tokens += 1


def residency_run(n: int, steps: int, block: int) -> dict:
    """The hook without residency / with verify-at-capture / with the
    eviction wrap, in alternating blocks of ``block`` steps (``steps`` each),
    plus the cost of hashing and of the wrapped ``get_new_blocks``."""
    from engine_state._native import _ResidencyTracker
    from engine_state.vllm import _adapter as adapter

    scheduler, hook, modes = residency_setup(n)
    evictions = modes["evictions"]
    modes["evictions"] = None  # its pool wrapper stays: only get_new_blocks sees it
    # Cold: a fresh tracker maps every cached router block of the running requests.
    cold = _ResidencyTracker(
        kv_block_size=scheduler.block_size, mode="verify", **adapter.residency_tracker_names()
    )
    running, cached = adapter.running(scheduler), adapter.cached_block_map(scheduler)
    t0 = time.perf_counter_ns()
    cold.capture(running, cached)
    cold_us = (time.perf_counter_ns() - t0) / 1000
    out = {"off": [0.0, []], "verify": [0.0, []], "evictions": [0.0, []]}
    residencies = {"off": None, "verify": modes["verify"], "evictions": evictions}
    for residency in residencies.values():
        if residency is not None:
            hook.residency = residency
            hook.capture(scheduler)  # warm
    done = 0
    while done < steps:
        k = min(block, steps - done)
        for mode, residency in residencies.items():
            hook.residency = residency
            per_step, calls, _ = emulate_steps(scheduler, hook, k, True, caching_decode_step)
            out[mode][0] += per_step * k / steps
            out[mode][1].extend(calls)
        done += k
    # The wrapped get_new_blocks, per allocated block (32 blocks a call).
    pool = adapter.block_pool(scheduler)
    cls_get = type(pool).get_new_blocks.__get__(pool)

    def alloc(get):
        blocks = get(32)
        pool.free_blocks(reversed(blocks))

    wrapped = time_calls(lambda: alloc(pool.get_new_blocks), 5_000)
    plain = time_calls(lambda: alloc(cls_get), 5_000)
    vllm_hash_ns = vllm_block_hashing_ns_per_token()
    hook.residency = None
    result = dict(
        n=n,
        digest=len(evictions.blocks),
        entries=evictions.tracker.entries,
        cold_us=cold_us,
        cold_hashed=cold.hash_calls,
        cold_adopted=cold.adopted,
        alloc_ns=1000 * (statistics.median(wrapped) - statistics.median(plain)) / 32,
        vllm_hash_ns=vllm_hash_ns,
        modes={
            mode: dict(per_step=per_step, in_situ_med=statistics.median(calls),
                       captures_per_step=len(calls) / steps)
            for mode, (per_step, calls) in out.items()
        },
    )
    hook.close(scheduler)
    return result


def vllm_block_hashing_ns_per_token(tokens: int = 2048, repeat: int = 50) -> float:
    """What vLLM itself spends per prompt token on its own block hashes
    (``get_request_block_hasher`` with sha256, 16-token blocks, as the engine
    hashes every request's blocks), median of ``repeat``: the yardstick for
    the residency's cost per prefilled token."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher
    from vllm_harness import BLOCK_SIZE, make_request

    request = make_request("hash-yardstick", [1000 + t % 30_000 for t in range(tokens)], 1)
    hasher = get_request_block_hasher(BLOCK_SIZE, sha256)

    def rehash() -> None:
        request.block_hashes.clear()
        request.block_hashes.extend(hasher(request))

    return 1000 * statistics.median(time_calls(rehash, repeat)) / tokens


# ---- common -------------------------------------------------------------------


def fill(scheduler, n, make, running_status, waiting_status, preempted_status):
    """3/4 running (all but 8 decoding, with 1..200 output tokens), 1/4 waiting
    (a few preempted with outputs, the rest never scheduled)."""
    num_running = n * 3 // 4
    for i in range(n):
        request = make(i, 500 + (i * 37) % 1500)
        if i < num_running:
            request.status = running_status
            if i < 8:  # chunked prefill in progress
                request.num_computed_tokens = request.num_prompt_tokens // 2
            else:
                for t in range(1 + i % 200):
                    request.append_output_token_ids(100 + t)
                request.num_computed_tokens = request.num_tokens - 1
            scheduler.running.append(request)
        else:
            if i % 16 == 0:
                request.status = preempted_status
                request.append_output_token_ids(7)
            else:
                request.status = waiting_status
            scheduler.waiting.append(request)


def schedule_work(scheduler) -> int:
    """What schedule() reads of the running requests (it walks all of them)."""
    total = 0
    for request in scheduler.running:
        total += request.num_tokens - request.num_computed_tokens
    return total


def decode_step(scheduler) -> None:
    """What update_from_output() does to the requests the hook reads."""
    for request in scheduler.running[8:]:
        request.append_output_token_ids(5)
        request.num_computed_tokens += 1


def python_capture(scheduler, preempted) -> dict:
    """The same fields, captured in Python (what the JSON daemon does)."""

    def remaining(r) -> int:
        if r.num_output_tokens > 0:
            value = r.num_tokens - 1 - r.num_computed_tokens
        else:
            value = r.num_prompt_tokens - r.num_computed_tokens
        return value if value > 0 else 0

    pending = decode = prefilling = biggest = num_preempted = 0
    for r in scheduler.running:
        rem = remaining(r)
        pending += rem
        biggest = max(biggest, rem)
        if rem:
            prefilling += 1
        else:
            decode += r.num_tokens
    waiting = list(scheduler.waiting) + list(scheduler.kv_holding_waiting)
    for r in waiting:
        rem = remaining(r)
        pending += rem
        biggest = max(biggest, rem)
        num_preempted += r.status == preempted
    pool = scheduler.kv_cache_manager.block_pool
    return dict(
        captured_unix_ns=time.time_ns(),
        num_running=len(scheduler.running),
        num_waiting=len(waiting),
        gpu_blocks_total=pool.num_gpu_blocks - 1,
        gpu_blocks_free=pool.get_num_free_blocks(),
        pending_prefill_tokens=pending,
        ongoing_decode_tokens=decode,
        num_prefilling=prefilling,
        max_prefill_remaining=biggest,
        num_preempted=num_preempted,
    )


def time_calls(fn, repeat: int) -> list[float]:
    """µs of each of `repeat` calls of `fn`."""
    return [ns / 1000 for ns in timed(repeat, fn)]


def forward_sleep() -> None:
    """The forward pass as an idle wait: the thread sleeps (GIL released)."""
    time.sleep(STEP_MS / 1000)


def forward_spin() -> None:
    """The forward pass as vLLM 0.33 waits for it: its shared-memory message
    queue reader busy-loops on ``sched_yield()`` for up to 1 s after a read
    (``distributed/device_communicators/shm_broadcast.py``, ``wait()``), and
    a CUDA stream sync spins by default, so the engine core's CPU stays busy
    while the GPU works. The GIL is released between iterations."""
    end = time.perf_counter_ns() + int(STEP_MS * 1_000_000)
    while time.perf_counter_ns() < end:
        os.sched_yield()


FORWARD = {"sleep": forward_sleep, "spin": forward_spin}
BREAKDOWN_STEPS = 0  # --breakdown
forward = forward_sleep


def emulate_steps(scheduler, hook, steps: int, use_hook: bool, decode=None):
    """One emulated engine step: schedule() (reads every running request),
    hook, the forward pass (20 ms sleep, GIL released), update_from_output()
    (appends a token to every decoding request), hook. Returns (µs in the hook
    per step, [µs of each capturing hook call], µs of the scheduler thread's own
    Python work per step)."""
    in_hook = 0
    capturing_calls = []
    work = []

    def call(boundary) -> None:
        nonlocal in_hook
        before = hook.captures
        t0 = time.perf_counter_ns()
        boundary(scheduler)
        elapsed = time.perf_counter_ns() - t0
        in_hook += elapsed
        if hook.captures != before:
            capturing_calls.append(elapsed / 1000)

    for _ in range(steps):
        t0 = time.perf_counter_ns()
        schedule_work(scheduler)
        work.append(time.perf_counter_ns() - t0)
        if use_hook:
            call(hook.after_schedule)
        forward()  # the forward pass
        t0 = time.perf_counter_ns()
        (decode or decode_step)(scheduler)
        work[-1] = (work[-1] + time.perf_counter_ns() - t0) / 1000
        if use_hook:
            call(hook.after_update)
    return in_hook / steps / 1000, capturing_calls, work


class JsonDaemon(threading.Thread):
    """Today's approach: capture in Python from another thread, write JSON."""

    def __init__(self, scheduler, preempted, path: str) -> None:
        super().__init__(daemon=True)
        self.scheduler, self.preempted, self.path = scheduler, preempted, path
        self.stop = threading.Event()
        self.ticks: list[float] = []

    def run(self) -> None:
        while not self.stop.wait(PERIOD_MS / 1000):
            t0 = time.perf_counter_ns()
            try:
                fields = python_capture(self.scheduler, self.preempted)
            except RuntimeError:  # "deque mutated during iteration": another thread's data
                continue
            tmp = f"{self.path}.tmp"
            with open(tmp, "w") as f:
                json.dump(fields, f)
            os.replace(tmp, self.path)
            self.ticks.append((time.perf_counter_ns() - t0) / 1000)


def run(n: int, setup, steps: int, ab_block: int = 50) -> dict:
    scheduler, hook, preempted = setup(n)
    assert hook is not None, "the hook did not attach"
    # Check: the hook and the Python capture agree.
    hook.capture(scheduler)
    expected = python_capture(scheduler, preempted)
    got = {s.engine_id: s for s in __import__("engine_state").Reader().read()}[hook.engine_id]
    for field, value in expected.items():
        if not field.startswith("captured_"):
            assert getattr(got, field) == value, (field, getattr(got, field), value)

    repeat = max(200, 200_000 // n)
    for _ in range(50):
        hook.capture(scheduler)
    capture = time_calls(lambda: hook.capture(scheduler), repeat)
    py_capture = time_calls(lambda: python_capture(scheduler, preempted), max(100, repeat // 4))

    from engine_state.vllm import _patch

    def noop(self):
        return None

    wrapped = _patch._wrap_step(noop, "after_update")
    hook.last_capture_ns = time.monotonic_ns() + 10**12  # no capture due
    hook.busy = True
    boundary = [a - b for a, b in zip(time_calls(lambda: wrapped(scheduler), 20_000),
                                      time_calls(lambda: noop(scheduler), 20_000), strict=True)]
    hook.last_capture_ns = 0

    incremental = hook._incremental
    hook._incremental = None
    full_capture = time_calls(lambda: hook.capture(scheduler), repeat)
    hook._incremental = incremental
    ab = emulate_ab(scheduler, hook, steps, ab_block)
    hook_per_step, in_situ, work_hook = ab["incremental"]
    _, _, work_plain = emulate_steps(scheduler, hook, steps, False)
    path = os.path.join(tempfile.mkdtemp(), "engine.json")
    daemon = JsonDaemon(scheduler, preempted, path)
    daemon.start()
    _, _, work_daemon = emulate_steps(scheduler, hook, steps, False)
    daemon.stop.set()
    daemon.join()
    parts = breakdown(scheduler, hook, BREAKDOWN_STEPS) if BREAKDOWN_STEPS else None
    hook.close(scheduler)
    daemon_tick = statistics.median(daemon.ticks)
    return dict(
        n=n,
        capture_med=statistics.median(capture),
        capture_p99=percentile(capture, 0.99),
        py_capture_med=statistics.median(py_capture),
        boundary_med=statistics.median(boundary),
        hook_per_step=hook_per_step,
        captures_per_step=len(in_situ) / steps,
        in_situ_med=statistics.median(in_situ),
        typical_per_step=statistics.median(in_situ) * len(in_situ) / steps
        + statistics.median(boundary) * (2 - len(in_situ) / steps),
        daemon_tick_med=daemon_tick,
        daemon_tick_p99=percentile(daemon.ticks, 0.99),
        daemon_per_step=daemon_tick * STEP_MS / PERIOD_MS,
        work_plain=statistics.mean(work_plain),
        work_hook=statistics.mean(work_hook),
        work_daemon=statistics.mean(work_daemon),
        work_daemon_p99=percentile(work_daemon, 0.99),
        work_plain_p99=percentile(work_plain, 0.99),
        full_capture_med=statistics.median(full_capture),
        ab={
            mode: dict(
                per_step=per_step,
                in_situ_med=statistics.median(calls),
                in_situ_p90=percentile(calls, 0.9),
                captures_per_step=len(calls) / steps,
                typical_per_step=statistics.median(calls) * len(calls) / steps
                + statistics.median(boundary) * (2 - len(calls) / steps),
            )
            for mode, (per_step, calls, _) in ab.items()
        },
        recounts=hook.recounts,
        parts=parts,
        num_waiting=len(scheduler.waiting),
        mismatches=hook.recount_mismatches,
    )


def breakdown(scheduler, hook, steps: int) -> dict:
    """Where an in-loop capture's time goes: each part timed alone right after
    the emulated update_from_output() of its own step (so each meets the
    caches a capture meets), parts in rotation. Each part has its own
    _IncrementalCapture, kept warm by its own previous calls. {part: µs}."""
    from engine_state._native import _IncrementalCapture
    from engine_state.vllm import _adapter as adapter

    names = adapter.request_capture_names(True)
    running_part = _IncrementalCapture(preempted_status=hook._preempted, **names)
    waiting_part = _IncrementalCapture(preempted_status=hook._preempted, **names)
    running = adapter.running(scheduler)
    read, cached = adapter.read_waiting_queues(scheduler), adapter.cached_waiting_queue(scheduler)
    full = hook._capture
    saved = hook.last_recount_ns
    hook.last_recount_ns = time.monotonic_ns() + 10**15  # no recount inside this table
    parts = {
        "hook capture (incremental)": lambda: hook.capture(scheduler),
        "running: computed + len(token list)": lambda: running_part.capture(running, [], []),
        "running: full read (3 fields)": lambda: full.capture(running, []),
        "waiting: identity walk": lambda: waiting_part.capture([], read, cached),
        "waiting: full read (4 fields)": lambda: full.capture([], adapter.waiting_queues(scheduler)),
        "block counts": lambda: adapter.block_counts(scheduler),
        "publish": lambda: hook.publisher.publish(step=1, num_running=1, flags=0),
    }
    for part in parts.values():
        part()
    times: dict = {name: [] for name in parts}
    order = list(parts)
    for step in range(steps):
        schedule_work(scheduler)
        forward()
        decode_step(scheduler)
        name = order[step % len(order)]
        t0 = time.perf_counter_ns()
        parts[name]()
        times[name].append((time.perf_counter_ns() - t0) / 1000)
    hook.last_recount_ns = saved
    return {name: statistics.median(values) for name, values in times.items()}


def emulate_ab(scheduler, hook, steps: int, block: int) -> dict:
    """``emulate_steps`` for the incremental and the full capture, in
    alternating blocks of ``block`` steps; ``steps`` steps each. Returns
    {mode: (µs in the hook per step, [µs of each capturing call], [work])}."""
    incremental = hook._incremental
    assert incremental is not None, "the hook does not capture incrementally"
    out = {"full": [0.0, [], []], "incremental": [0.0, [], []]}
    done = 0
    while done < steps:
        n = min(block, steps - done)
        for mode in ("full", "incremental"):
            if mode == "full":
                hook._incremental = None
            else:
                incremental.clear()
                hook._incremental = incremental
            per_step, calls, work = emulate_steps(scheduler, hook, n, True)
            out[mode][0] += per_step * n / steps
            out[mode][1].extend(calls)
            out[mode][2].extend(work)
        done += n
    hook._incremental = incremental
    return {mode: tuple(v) for mode, v in out.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm", action="store_true", help="use vLLM's real Scheduler/Requests")
    parser.add_argument("--steps", type=int, default=150, help="emulated 20 ms steps per run")
    parser.add_argument("--sizes", default="64,512,1024")
    parser.add_argument("--breakdown", type=int, default=0, metavar="STEPS",
                        help="also time the parts of an in-loop capture over STEPS steps")
    parser.add_argument("--ab-block", type=int, default=50,
                        help="steps per block in the full/incremental A/B")
    parser.add_argument(
        "--forward",
        choices=sorted(FORWARD),
        default="spin",
        help="how the thread waits during the emulated forward pass: spin (sched_yield loop, "
        "as vLLM 0.33's message-queue reader and CUDA syncs do; default) or sleep (an idle core)",
    )
    parser.add_argument("--no-residency", action="store_true",
                        help="with --vllm: skip the cache residency table")
    args = parser.parse_args()
    global forward, BREAKDOWN_STEPS
    forward = FORWARD[args.forward]
    BREAKDOWN_STEPS = args.breakdown
    # The state directory on tmpfs, as deployed (/dev/shm): a file on a disk
    # file system costs every publish a write fault after each writeback.
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    state = tempfile.mkdtemp(prefix="es-hook-bench-", dir=shm)
    atexit.register(shutil.rmtree, state, True)
    os.environ["AGENTIC_ENGINE_STATE_URI"] = f"file://{state}"
    os.environ["AGENTIC_ENGINE_STATE_PERIOD_MS"] = str(PERIOD_MS)
    os.environ.pop("AGENTIC_WORKER_ID", None)
    setup = vllm_setup if args.vllm else double_setup
    kind = "vLLM 0.33 Scheduler + Request" if args.vllm else "vLLM-shaped doubles"
    print(f"# hook cost on the scheduler thread ({kind}); {os.cpu_count()} cores; "
          f"step {STEP_MS:.0f} ms (forward pass: {args.forward}), period {PERIOD_MS} ms, "
          f"{args.steps} steps per run; times in µs")
    print("| live requests | capture+publish median (p99) | same capture in Python | "
          "boundary, no capture due | capture in the step loop, median | "
          "hook per step: mean (captures/step) | share of 20 ms | from medians | share | "
          "JSON daemon per tick median (p99) | JSON daemon per step | share of 20 ms step | "
          "scheduler's own work per step: plain / hook / daemon (daemon p99 vs plain p99) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    results = []
    for n in [int(x) for x in args.sizes.split(",")]:
        r = run(n, setup, args.steps, args.ab_block)
        results.append(r)
        print(
            f"| {r['n']} | {r['capture_med']:.1f} ({r['capture_p99']:.1f}) | "
            f"{r['py_capture_med']:.1f} | {r['boundary_med']:.2f} | {r['in_situ_med']:.1f} | "
            f"{r['hook_per_step']:.1f} ({r['captures_per_step']:.2f}) | "
            f"{100 * r['hook_per_step'] / (STEP_MS * 1000):.3f} % | "
            f"{r['typical_per_step']:.1f} | {100 * r['typical_per_step'] / (STEP_MS * 1000):.3f} % | "
            f"{r['daemon_tick_med']:.1f} ({r['daemon_tick_p99']:.1f}) | {r['daemon_per_step']:.1f} | "
            f"{100 * r['daemon_per_step'] / (STEP_MS * 1000):.3f} % | "
            f"{r['work_plain']:.0f} / {r['work_hook']:.0f} / {r['work_daemon']:.0f} "
            f"({r['work_daemon_p99']:.0f} vs {r['work_plain_p99']:.0f}) |",
            flush=True,
        )
    print()
    print(f"# A/B in the same run: full capture vs incremental capture (the hook as shipped), "
          f"alternating blocks of {args.ab_block} steps, {args.steps} steps each; times in µs")
    print("| live requests | back to back: full / incremental | in the step loop, median (p90): "
          "full / incremental | hook per step from medians: full / incremental | share of 20 ms: "
          "full / incremental | hook per step, mean: full / incremental | recounts (mismatches) |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        f, i = r["ab"]["full"], r["ab"]["incremental"]
        print(
            f"| {r['n']} | {r['full_capture_med']:.1f} / {r['capture_med']:.1f} | "
            f"{f['in_situ_med']:.1f} ({f['in_situ_p90']:.1f}) / "
            f"{i['in_situ_med']:.1f} ({i['in_situ_p90']:.1f}) | "
            f"{f['typical_per_step']:.1f} / {i['typical_per_step']:.1f} | "
            f"{100 * f['typical_per_step'] / (STEP_MS * 1000):.3f} % / "
            f"{100 * i['typical_per_step'] / (STEP_MS * 1000):.3f} % | "
            f"{f['per_step']:.1f} / {i['per_step']:.1f} | {r['recounts']} ({r['mismatches']}) |",
            flush=True,
        )
    if args.vllm and not args.no_residency:
        print()
        print(f"# cache residency (vLLM 0.33 Scheduler, prefix caching, 16-token KV blocks, real "
              f"prefills): the hook without residency / verify-at-capture / eviction wrap, "
              f"alternating blocks of {args.ab_block} steps, {args.steps} steps each; times in µs")
        print("| live requests | digest (router blocks) | capture in the step loop, median: off / "
              "verify / evictions | hook per step, mean: off / verify / evictions | "
              "verify vs off | evictions vs off: capture / per step | first capture: router "
              "blocks hashed + adopted, µs, ns per hashed token | vLLM's own block hashing, ns "
              "per token | wrapped get_new_blocks, ns per allocated block |")
        print("|---|---|---|---|---|---|---|---|---|")
        for n in [int(x) for x in args.sizes.split(",")]:
            r = residency_run(n, args.steps, args.ab_block)
            m = r["modes"]
            off, ver, evi = (m[k]["in_situ_med"] for k in ("off", "verify", "evictions"))
            per = [m[k]["per_step"] for k in ("off", "verify", "evictions")]
            hashed_tokens = max(1, r["cold_hashed"] * 512)
            print(
                f"| {n} | {r['digest']} | {off:.1f} / {ver:.1f} / {evi:.1f} | "
                f"{per[0]:.1f} / {per[1]:.1f} / {per[2]:.1f} | "
                f"{100 * (ver - off) / off:+.0f} % | {100 * (evi - off) / off:+.0f} % / "
                f"{100 * (per[2] - per[0]) / per[0]:+.0f} % | "
                f"{r['cold_hashed']} + {r['cold_adopted']}, {r['cold_us']:.0f}, "
                f"{1000 * r['cold_us'] / hashed_tokens:.1f} | {r['vllm_hash_ns']:.0f} | "
                f"{r['alloc_ns']:.0f} |",
                flush=True,
            )
    if args.breakdown:
        print()
        print(f"# where an in-loop capture goes (median µs over {args.breakdown} steps, parts in "
              "rotation; per request in parentheses, in ns)")
        names = list(results[0]["parts"])
        print("| live requests (running / waiting) | " + " | ".join(names) + " |")
        print("|---" * (len(names) + 1) + "|")
        for r in results:
            n_run, n_wait = r["n"] - r["num_waiting"], r["num_waiting"]
            cells = []
            for name, value in r["parts"].items():
                count = n_run if name.startswith("running") else n_wait if name.startswith(
                    "waiting") else 0
                cells.append(f"{value:.1f}" + (f" ({1000 * value / count:.0f})" if count else ""))
            print(f"| {r['n']} ({n_run} / {n_wait}) | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

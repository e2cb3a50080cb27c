"""Contract test: the hook inside vLLM 0.33's real Scheduler and AsyncScheduler.

The plugin is loaded through vLLM's own ``load_general_plugins()``; requests
are driven through add_request / schedule / update_from_output with fake model
outputs (chunked prefills, preemptions, async output placeholders). After
every schedule() and update_from_output() every published field, read back
through the Rust reader (``engine_state.Reader``, and ``esdump --json`` at
some boundaries), must equal the value computed here, independently, from the
scheduler at the same step: requests are classified by their status (not by
queue membership) and the remaining prefill uses ``num_output_tokens`` and
``num_tokens`` (not the adapter's shortcut). vLLM's outputs must be the same
with and without the hook.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from vllm_harness import (
    build_scheduler,
    drive,
    esdump,
    fields_from_scheduler,
    make_requests,
    sleep_past,
)

import engine_state
import engine_state.vllm as hook_pkg

STATE_URI = os.environ["AGENTIC_ENGINE_STATE_URI"]
PERIOD_MS = int(os.environ["AGENTIC_ENGINE_STATE_PERIOD_MS"])
FIELDS = (
    "num_running",
    "num_waiting",
    "gpu_blocks_total",
    "gpu_blocks_free",
    "pending_prefill_tokens",
    "ongoing_decode_tokens",
    "num_prefilling",
    "max_prefill_remaining",
    "num_preempted",
)
SCENARIOS = {
    # name: (async scheduling, prefix caching, in-flight depth)
    "Scheduler": (False, False, 1),
    "AsyncScheduler": (True, True, 2),
}


def expected_fields(scheduler) -> dict:
    """The snapshot fields (docs/VLLM.md, "What each field means and how the
    hook computes it") from the scheduler, independently of the hook."""
    fields = fields_from_scheduler(scheduler)
    assert (fields["num_running"], fields["num_waiting"]) == scheduler.get_request_counts()
    total, free = fields["gpu_blocks_total"], fields["gpu_blocks_free"]
    assert abs((1 - free / total) - scheduler.get_kv_cache_usage()) < 1e-9
    return fields


def read_state(engine_id: str):
    states = {s.engine_id: s for s in engine_state.Reader(uri=STATE_URI).read()}
    return states.get(engine_id)


def read_esdump(engine_id: str) -> dict | None:
    result = subprocess.run(
        [str(esdump()), "--json", "--uri", STATE_URI], capture_output=True, text=True, check=True
    )
    return {e["engine_id"]: e for e in json.loads(result.stdout)}.get(engine_id)


@pytest.fixture(scope="module")
def baseline():
    """vLLM alone: the scenarios before the plugin is loaded."""
    import vllm.v1.core.sched.scheduler as sched_module

    assert not hook_pkg.is_installed(sched_module)
    traces = {}
    for name, (async_scheduling, prefix_caching, depth) in SCENARIOS.items():
        scheduler, _ = build_scheduler(async_scheduling, prefix_caching)
        assert type(scheduler).__name__ == name
        assert hook_pkg.HOOK_ATTR not in scheduler.__dict__
        traces[name] = drive(scheduler, make_requests(), depth)
        scheduler.shutdown()
    assert engine_state.Reader(uri=STATE_URI).read() == []
    return traces


@pytest.fixture(scope="module")
def plugin(baseline):
    """The plugin, loaded the way EngineCore.__init__ loads it."""
    from importlib.metadata import entry_points

    import vllm.plugins
    import vllm.v1.core.sched.scheduler as sched_module

    names = [e.name for e in entry_points(group=vllm.plugins.DEFAULT_PLUGINS_GROUP)]
    assert "engine_state" in names
    vllm.plugins.plugins_loaded = False
    vllm.plugins.load_general_plugins()
    assert hook_pkg.is_installed(sched_module)
    return sched_module


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_published_fields_match_the_scheduler_at_every_step(name, baseline, plugin):
    async_scheduling, prefix_caching, depth = SCENARIOS[name]
    scheduler, vllm_config = build_scheduler(async_scheduling, prefix_caching)
    assert type(scheduler).__name__ == name
    hook = scheduler.__dict__[hook_pkg.HOOK_ATTR]
    index = vllm_config.parallel_config.data_parallel_index
    assert hook.engine_id.endswith(f"-dp{index}-{os.getpid()}")
    assert hook.period_ns == PERIOD_MS * 1_000_000

    seen = dict(chunked=0, preempted=0, recompute=0, placeholders=0, esdump=0)
    boundaries = []

    def check(kind: str, schedule_calls: int) -> None:
        state = read_state(hook.engine_id)
        assert state is not None and state.status == "fresh", (kind, schedule_calls)
        expected = expected_fields(scheduler)
        got = {field: getattr(state, field) for field in FIELDS}
        assert got == expected, (kind, schedule_calls)
        assert state.step == schedule_calls
        idle = expected["num_running"] + expected["num_waiting"] == 0
        assert state.flags == (engine_state.FLAG_IDLE if idle else 0)
        if len(boundaries) % 10 == 0:  # the same through the esdump binary
            dumped = read_esdump(hook.engine_id)
            assert {f: dumped[f] for f in FIELDS} == got and dumped["step"] == state.step
            seen["esdump"] += 1
        boundaries.append(kind)
        requests = list(scheduler.requests.values())
        seen["chunked"] += any(
            0 < r.num_computed_tokens < r.num_prompt_tokens and r.num_output_tokens == 0
            for r in scheduler.running
        )
        seen["preempted"] += state.num_preempted > 0
        seen["recompute"] += any(
            r.num_preemptions > 0 and r.num_output_tokens > 0 and r.num_computed_tokens < r.num_tokens - 1
            for r in requests
        )
        seen["placeholders"] += any(r.num_output_placeholders > 0 for r in scheduler.running)

    trace = drive(
        scheduler, make_requests(), depth, on_boundary=check, before_boundary=sleep_past(PERIOD_MS)
    )
    assert trace == baseline[name], "vLLM's outputs differ with the hook"
    assert seen["chunked"] and seen["preempted"] and seen["recompute"] and seen["esdump"], seen
    if async_scheduling:
        assert seen["placeholders"], seen
    if prefix_caching:  # the recompute found its blocks cached (vLLM's own stats)
        hits = [e[3][5] for kind, u in trace if kind == "update" for e in u if e[3]]
        assert sum(hits) > 0, hits
    last = read_state(hook.engine_id)
    assert last.flags & engine_state.FLAG_IDLE and last.num_running == last.num_waiting == 0

    scheduler.shutdown()
    assert read_state(hook.engine_id) is None  # retired and removed
    assert hook.publisher.closed


def test_the_rate_limit_holds_in_vllm(plugin):
    """Without waiting out the period, a fast loop publishes far fewer times
    than it has step boundaries; vLLM's outputs are unaffected."""
    scheduler, _ = build_scheduler(False)
    hook = scheduler.__dict__[hook_pkg.HOOK_ATTR]
    hook.period_ns = 10_000 * 1_000_000  # 10 s: only idle/busy transitions publish
    drive(scheduler, make_requests(), 1)
    # construction (idle), the first schedule (busy), the last update (idle)
    assert hook.captures == 3, hook.captures
    scheduler.shutdown()


def test_scheduler_cls_subclass_publishes_once(plugin):
    """``--scheduler-cls engine_state.vllm.scheduler.EngineStateAsyncScheduler``
    with the plugin loaded as well: one hook, one file."""
    scheduler, vllm_config = build_scheduler(
        True, scheduler_cls="engine_state.vllm.scheduler.EngineStateAsyncScheduler"
    )
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    assert type(scheduler).__name__ == "EngineStateAsyncScheduler"
    assert isinstance(scheduler, AsyncScheduler)
    hook = scheduler.__dict__[hook_pkg.HOOK_ATTR]
    drive(scheduler, make_requests(prompt_lens=(30,), max_tokens=3), 2)
    assert [s.engine_id for s in engine_state.Reader(uri=STATE_URI).read()] == [hook.engine_id]
    assert hook.step > 0
    scheduler.shutdown()
    assert engine_state.Reader(uri=STATE_URI).read() == []


def test_the_hook_never_resets_vllms_prefix_cache_stats(plugin):
    """make_prefix_cache_stats() resets vLLM's counters; the hook never calls
    it, so vLLM's own stats still see every query after many captures."""
    scheduler, _ = build_scheduler(False, prefix_caching=True)
    hook = scheduler.__dict__[hook_pkg.HOOK_ATTR]
    manager = scheduler.kv_cache_manager
    calls = []
    original = manager.make_prefix_cache_stats
    manager.make_prefix_cache_stats = lambda: calls.append(1) or original()
    try:
        for request in make_requests(prompt_lens=(40, 40), prefix="pc-"):
            scheduler.add_request(request)
        hook.period_ns = 0
        before = len(calls)
        for _ in range(3):
            hook.capture(scheduler)
        assert len(calls) == before  # the hook's captures never call it
    finally:
        manager.make_prefix_cache_stats = original
    scheduler.shutdown()


def test_an_untested_vllm_version_warns_once(plugin, monkeypatch, caplog):
    import logging

    from engine_state.vllm import _adapter, _patch

    monkeypatch.setattr(sys.modules["vllm"], "__version__", "0.99.0")
    monkeypatch.setattr(_patch, "_version_checked", False)
    with caplog.at_level(logging.WARNING, logger="engine_state.vllm"):
        assert hook_pkg.install(plugin) and hook_pkg.install(plugin)
    warnings = [r.getMessage() for r in caplog.records if "untested" in r.getMessage()]
    assert len(warnings) == 1 and "0.99.0" in warnings[0] and "0.33.0" in warnings[0]
    monkeypatch.undo()
    assert _adapter.check_version()  # 0.33.0 is tested

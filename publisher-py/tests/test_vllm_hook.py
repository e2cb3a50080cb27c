"""The vLLM hook against scheduler doubles that use vLLM 0.33's names (no vLLM
needed). Every published field is read back through the Rust reader and
compared with values computed independently from the doubles."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import threading

import pytest
from vllm_doubles import (
    ParallelConfig,
    Request,
    RequestStatus,
    fake_sampled,
    make_module,
    reference_fields,
)

import engine_state
import engine_state.vllm as hook_pkg
from engine_state.vllm import _hook, _patch

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


@pytest.fixture
def module():
    """A fresh double of vllm.v1.core.sched.scheduler, wrapped."""
    module = make_module()
    assert hook_pkg.install(module)
    return module


def published(uri, engine_id):
    states = {s.engine_id: s for s in engine_state.Reader(uri=uri).read()}
    return states.get(engine_id)


def hook_of(scheduler):
    return scheduler.__dict__.get(hook_pkg.HOOK_ATTR)


def every_boundary(scheduler):
    """Removes the rate limit, so each step boundary publishes."""
    hook_of(scheduler).period_ns = 0
    return scheduler


def assert_published_matches(uri, scheduler, step):
    state = published(uri, hook_of(scheduler).engine_id)
    assert state is not None and state.status == "fresh"
    expected = reference_fields(scheduler)
    got = {name: getattr(state, name) for name in FIELDS}
    assert got == expected, f"step {step}"
    assert state.step == hook_of(scheduler).step
    idle = expected["num_running"] + expected["num_waiting"] == 0
    assert bool(state.flags & engine_state.FLAG_IDLE) == idle
    return state


def drive(scheduler, uri=None, steps=60, depth=1, check=True):
    """EngineCore.step (depth 1) or step_with_batch_queue (depth 2); checks the
    published fields after every schedule() and update_from_output()."""
    inflight = []
    outputs = []
    for step in range(steps):
        if scheduler.has_requests():
            out = scheduler.schedule()
            outputs.append(sorted(out.num_scheduled_tokens.items()))
            if check:
                assert_published_matches(uri, scheduler, step)
            if out.num_scheduled_tokens:
                inflight.append((out, fake_sampled(out)))
            if len(inflight) < depth and out.num_scheduled_tokens:
                continue
        if not inflight:
            break
        out, sampled = inflight.pop(0)
        outputs.append(scheduler.update_from_output(out, sampled))
        if check:
            assert_published_matches(uri, scheduler, step)
    return outputs


# ---- registration ----------------------------------------------------------


def _task_count():
    return len(os.listdir("/proc/self/task"))


def test_register_is_cheap_idempotent_and_starts_no_thread(shm_uri):
    threads, tasks = threading.active_count(), _task_count()
    assert "vllm.v1.core.sched.scheduler" not in sys.modules
    try:
        hook_pkg.register()
        hook_pkg.register()
        finders = [f for f in sys.meta_path if isinstance(f, _patch._PatchOnImport)]
        assert len(finders) == 1
        assert threading.active_count() == threads and _task_count() == tasks
        assert "vllm" not in sys.modules  # registering imports no vLLM
        assert not os.path.exists(shm_uri[len("file://") :])  # and creates no file
    finally:
        for finder in [f for f in sys.meta_path if isinstance(f, _patch._PatchOnImport)]:
            finder.disarm()


def test_register_wraps_the_scheduler_when_its_module_is_first_imported(tmp_path, shm_uri):
    """A fake ``vllm`` package on sys.path: register() must not import the
    scheduler module, and importing it later must wrap it."""
    package = tmp_path / "fake" / "vllm"
    sched = package / "v1" / "core" / "sched"
    sched.mkdir(parents=True)
    (package / "__init__.py").write_text("__version__ = '0.33.0'\n")
    for folder in (package / "v1", package / "v1" / "core", sched):
        (folder / "__init__.py").touch(exist_ok=True)
    (sched / "scheduler.py").write_text(
        "from vllm_doubles import make_module\n"
        "_m = make_module(__name__)\n"
        "Scheduler, RequestStatus, Request = _m.Scheduler, _m.RequestStatus, _m.Request\n"
    )
    script = textwrap.dedent(
        f"""
        import sys, os, threading
        sys.path[:0] = [{str(tmp_path / 'fake')!r}, {os.path.dirname(__file__)!r}]
        import engine_state, engine_state.vllm as h
        h.register()
        assert "vllm.v1.core.sched.scheduler" not in sys.modules
        assert threading.active_count() == 1
        from vllm.v1.core.sched.scheduler import Scheduler, Request
        assert h.is_installed(sys.modules["vllm.v1.core.sched.scheduler"])
        assert not any(type(f).__name__ == "_PatchOnImport" for f in sys.meta_path)
        s = Scheduler()
        s.add_request(Request("r0", 30))
        s.schedule()
        [state] = engine_state.Reader().read()
        assert state.engine_id == "fake-engine" and state.num_running == 1, state
        s.shutdown()
        assert engine_state.Reader().read() == []
        print("ok")
        """
    )
    env = dict(os.environ, AGENTIC_WORKER_ID="fake-engine")
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr


def test_wrapping_is_idempotent_and_reversible():
    module = make_module()
    original = module.Scheduler.__dict__["schedule"]
    assert hook_pkg.install(module) and hook_pkg.install(module)
    wrapper = module.Scheduler.__dict__["schedule"]
    assert wrapper is not original
    assert getattr(wrapper, _patch.WRAPPED_ATTR) is original  # wrapped once
    assert module.AsyncScheduler.schedule is wrapper  # the subclass inherits it
    hook_pkg.uninstall(module)
    assert module.Scheduler.__dict__["schedule"] is original
    assert not hook_pkg.is_installed(module)


def test_install_is_all_or_nothing_on_a_scheduler_missing_a_method():
    module = make_module()
    del module.Scheduler.finish_requests
    original = module.Scheduler.__dict__["schedule"]
    with pytest.raises(AttributeError, match="finish_requests"):
        hook_pkg.install(module)
    assert module.Scheduler.__dict__["schedule"] is original


# ---- the captured fields ---------------------------------------------------


def test_publisher_starts_with_the_scheduler_and_retires_at_shutdown(shm_uri, module):
    scheduler = module.Scheduler(num_blocks=33)
    hook = hook_of(scheduler)
    state = published(shm_uri, hook.engine_id)
    assert state.gpu_blocks_total == 32 and state.gpu_blocks_free == 32
    assert state.flags & engine_state.FLAG_IDLE and state.step == 0
    scheduler.shutdown()
    assert scheduler.shutdown_calls == 1
    assert published(shm_uri, hook.engine_id) is None
    assert hook_of(scheduler) is None and hook.publisher.closed
    scheduler.shutdown()  # again: vLLM's method still runs, the hook is gone
    assert scheduler.shutdown_calls == 2


def test_chunked_prefill_across_steps(shm_uri, module):
    scheduler = every_boundary(module.Scheduler(token_budget=64))
    scheduler.add_request(Request("long", 100, max_tokens=3))
    scheduler.add_request(Request("short", 40, max_tokens=3))
    uri = shm_uri
    engine = hook_of(scheduler).engine_id

    out = scheduler.schedule()  # long: 64 of 100; short: nothing
    assert out.num_scheduled_tokens == {"long": 64}
    state = assert_published_matches(uri, scheduler, 1)
    assert (state.num_prefilling, state.pending_prefill_tokens) == (1, 36 + 40)
    assert (state.max_prefill_remaining, state.ongoing_decode_tokens) == (40, 0)
    scheduler.update_from_output(out, fake_sampled(out))
    assert_published_matches(uri, scheduler, 1)

    out = scheduler.schedule()  # long: last 36 (prefill done); short: 28 of 40
    assert out.num_scheduled_tokens == {"long": 36, "short": 28}
    state = assert_published_matches(uri, scheduler, 2)
    assert (state.num_prefilling, state.pending_prefill_tokens) == (1, 12)
    assert state.ongoing_decode_tokens == 100  # long's prefill is complete
    scheduler.update_from_output(out, fake_sampled(out))  # long samples a token
    state = assert_published_matches(uri, scheduler, 2)
    assert state.ongoing_decode_tokens == 101  # its newest token is decode work

    drive(scheduler, uri)
    state = published(uri, engine)
    assert state.num_running == state.num_waiting == 0 and state.flags & engine_state.FLAG_IDLE


def test_preemption_counts_the_recompute(shm_uri, module):
    # 6 usable blocks of 16 tokens: two 40-token prompts decoding 40 tokens
    # each cannot both stay resident.
    scheduler = every_boundary(module.Scheduler(num_blocks=7, token_budget=64))
    requests = [Request(f"r{i}", 40, max_tokens=40) for i in range(2)]
    for request in requests:
        scheduler.add_request(request)
    seen = False
    for _ in range(200):
        if not scheduler.has_requests():
            break
        out = scheduler.schedule()
        state = assert_published_matches(shm_uri, scheduler, 0)
        victims = [r for r in requests if r.status == RequestStatus.PREEMPTED]
        if victims:
            seen = True
            [victim] = victims
            assert state.num_preempted == 1
            # vLLM resets the victim's computed tokens: its whole prompt and
            # its outputs but the newest are prefill again.
            assert victim.num_computed_tokens == 0 and victim.num_output_tokens > 0
            assert state.max_prefill_remaining >= victim.num_tokens - 1
        scheduler.update_from_output(out, fake_sampled(out))
        assert_published_matches(shm_uri, scheduler, 0)
    assert seen, "the scenario never preempted"
    assert all(r.status == RequestStatus.FINISHED_LENGTH_CAPPED for r in requests)


def test_async_scheduling_output_placeholders(shm_uri, module):
    scheduler = every_boundary(module.AsyncScheduler(token_budget=48))
    requests = [Request(f"r{i}", n, max_tokens=6) for i, n in enumerate((70, 20, 33))]
    for request in requests:
        scheduler.add_request(request)
    placeholders = []
    original_update = scheduler.update_from_output

    def spy(out, sampled):
        placeholders.extend(r.num_output_placeholders for r in scheduler.running)
        return original_update(out, sampled)

    scheduler.update_from_output = spy  # an instance attribute: the wrapped method runs inside
    drive(scheduler, shm_uri, depth=2)
    assert max(placeholders) >= 1, "no output placeholders in the scenario"
    assert all(r.status == RequestStatus.FINISHED_LENGTH_CAPPED for r in requests)


def test_waiting_counts_both_queues_once(shm_uri, module):
    scheduler = module.Scheduler()
    holding = Request("holding", 50)
    holding.num_computed_tokens = 32  # holds its KV blocks while waiting
    fresh = Request("fresh", 20)
    preempted = Request("preempted", 30)
    preempted.append_output_token_ids(5)
    preempted.status = RequestStatus.PREEMPTED
    scheduler.kv_holding_waiting.append(holding)
    scheduler.waiting.extend([fresh, preempted])
    scheduler.deferred_waiting.update({holding, fresh})  # a subset, not counted twice
    hook_of(scheduler).capture(scheduler)
    state = assert_published_matches(shm_uri, scheduler, 0)
    assert state.num_waiting == 3 and state.num_running == 0
    assert state.pending_prefill_tokens == 18 + 20 + 30
    assert state.max_prefill_remaining == 30 and state.num_preempted == 1
    assert state.num_prefilling == 0  # counts running requests only


class FakeClock:
    def __init__(self):
        self.now = 1_000_000_000

    def __call__(self):
        return self.now

    def advance_ms(self, ms):
        self.now += int(ms * 1_000_000)


def test_idle_busy_transitions_publish_at_once(shm_uri, module):
    scheduler = module.Scheduler()
    hook = hook_of(scheduler)
    clock = hook._clock = FakeClock()
    hook.period_ns = 60_000 * 1_000_000  # the rate limit never expires here
    assert hook.captures == 1  # at construction
    scheduler.add_request(Request("a", 20, max_tokens=50))
    out = scheduler.schedule()  # idle -> busy: published although the period has not passed
    state = published(shm_uri, hook.engine_id)
    assert hook.captures == 2 and state.num_running == 1 and not state.flags & 1
    for _ in range(5):
        scheduler.update_from_output(out, fake_sampled(out))
        out = scheduler.schedule()
        clock.advance_ms(1)
    assert hook.captures == 2  # busy -> busy within the period: nothing
    scheduler.finish_requests(["a"], RequestStatus.FINISHED_ABORTED)  # busy -> idle by abort
    state = published(shm_uri, hook.engine_id)
    assert hook.captures == 3 and state.flags & engine_state.FLAG_IDLE and state.num_running == 0
    scheduler.update_from_output(out, fake_sampled(out))  # the aborted request's late output
    assert hook.captures == 3


def test_rate_limit_captures_at_most_once_per_period(shm_uri, module):
    scheduler = module.Scheduler(token_budget=8)
    hook = hook_of(scheduler)
    clock = hook._clock = FakeClock()
    assert hook.period_ns == 50 * 1_000_000
    scheduler.add_request(Request("a", 4000, max_tokens=1))
    capture_times = []
    for _ in range(100):  # 100 steps of 10 ms, two boundaries each
        before = hook.captures
        out = scheduler.schedule()
        clock.advance_ms(5)
        scheduler.update_from_output(out, fake_sampled(out))
        clock.advance_ms(5)
        if hook.captures != before:
            capture_times.append(clock.now)
    gaps = [b - a for a, b in zip(capture_times, capture_times[1:], strict=False)]
    assert min(gaps) >= hook.period_ns
    assert 18 <= len(capture_times) <= 21  # 1 s of steps / 50 ms
    assert published(shm_uri, hook.engine_id).step <= hook.step


def test_period_comes_from_the_environment(shm_uri, module, monkeypatch):
    monkeypatch.setenv("AGENTIC_ENGINE_STATE_PERIOD_MS", "20")
    scheduler = module.Scheduler()
    assert hook_of(scheduler).period_ns == 20_000_000
    scheduler.shutdown()


# ---- never harm vLLM -------------------------------------------------------


def test_outputs_are_unchanged_by_the_hook(shm_uri, module):
    plain = make_module()  # not wrapped

    def run(mod, cls):
        scheduler = getattr(mod, cls)(num_blocks=9, token_budget=40)
        for i, n in enumerate((90, 30, 50, 10)):
            scheduler.add_request(Request(f"r{i}", n, max_tokens=12))
        if hook_of(scheduler):
            every_boundary(scheduler)
        return drive(scheduler, shm_uri, steps=300, depth=2 if cls == "AsyncScheduler" else 1,
                     check=False)

    for cls in ("Scheduler", "AsyncScheduler"):
        assert run(module, cls) == run(plain, cls)


def test_a_broken_scheduler_turns_the_hook_off_and_vllm_carries_on(shm_uri, module, caplog):
    twin_module = make_module()
    broken, twin = module.Scheduler(), twin_module.Scheduler()
    hook = hook_of(broken)
    for scheduler in (broken, twin):
        scheduler.add_request(Request("a", 30, max_tokens=4))
    broken.kv_cache_manager = object()  # the hook reads it; the double uses its own handle
    hook.period_ns = 0
    with caplog.at_level(logging.WARNING, logger="engine_state.vllm"):
        out = broken.schedule()
        assert out == twin.schedule()  # vLLM's result, unchanged
        for _ in range(3):
            assert broken.update_from_output(out, fake_sampled(out)) == twin.update_from_output(
                out, fake_sampled(out)
            )
            out = broken.schedule()
            assert out == twin.schedule()
    messages = [r.getMessage() for r in caplog.records if r.name == "engine_state.vllm"]
    assert len(messages) == 1, messages  # logged once, with the reason
    assert "hook turned off" in messages[0] and "block_pool" in messages[0]
    assert hook_of(broken) is None and hook.publisher.closed
    assert published(shm_uri, hook.engine_id) is None  # retired: readers see it gone


def test_a_bad_request_turns_the_hook_off(shm_uri, module, caplog):
    scheduler = every_boundary(module.Scheduler())
    request = Request("a", 30)
    scheduler.add_request(request)
    request.num_prompt_tokens = "thirty"  # something the capture cannot read
    with caplog.at_level(logging.WARNING, logger="engine_state.vllm"):
        scheduler.finish_requests([], RequestStatus.FINISHED_ABORTED)
    assert hook_of(scheduler) is None
    assert any("hook turned off" in r.getMessage() for r in caplog.records)


def test_vllm_exceptions_propagate_and_skip_the_hook(shm_uri, module):
    scheduler = module.Scheduler()
    hook = hook_of(scheduler)
    scheduler.add_request(Request("a", 10))

    def out_of_memory(*_):
        raise MemoryError("vLLM's own failure")

    scheduler._allocate = out_of_memory  # makes vLLM's own schedule() raise
    with pytest.raises(MemoryError, match="vLLM's own failure"):
        scheduler.schedule()
    assert hook.step == 0 and hook.depth == 0 and hook_of(scheduler) is hook


def test_a_failing_publisher_start_leaves_the_scheduler_working(tmp_path, monkeypatch, module,
                                                                caplog):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("AGENTIC_ENGINE_STATE_URI", f"file://{blocker}/x")
    with caplog.at_level(logging.WARNING, logger="engine_state.vllm"):
        scheduler = module.Scheduler()
    assert hook_of(scheduler) is None
    assert any("not publishing" in r.getMessage() for r in caplog.records)
    scheduler.add_request(Request("a", 10))
    assert scheduler.schedule().num_scheduled_tokens == {"a": 10}


def test_kill_switch(shm_uri, module, monkeypatch):
    monkeypatch.setenv("AGENTIC_ENGINE_STATE_DISABLE", "1")
    scheduler = module.Scheduler()
    assert hook_of(scheduler) is None
    assert not os.path.exists(shm_uri[len("file://") :])  # nothing created
    before = list(sys.meta_path)
    hook_pkg.register()
    assert sys.meta_path == before
    for value, off in (("0", False), ("", False), ("true", True), ("ON", True)):
        assert _hook.disabled({"AGENTIC_ENGINE_STATE_DISABLE": value}) is off


# ---- identity ----------------------------------------------------------------


def test_engine_id_defaults():
    env = {}
    assert hook_pkg.engine_id_for(0, 1, env, hostname="gpu-7.example", pid=42) == (
        "gpu-7.example-dp0-42"
    )
    assert hook_pkg.engine_id_for(3, 4, env, hostname="h/x y", pid=9) == "h_x_y-dp3-9"
    assert hook_pkg.engine_id_for(0, 1, {"AGENTIC_WORKER_ID": "w1"}) == "w1"
    # Data-parallel engines share the environment: keep them apart.
    assert hook_pkg.engine_id_for(2, 4, {"AGENTIC_WORKER_ID": "w1"}) == "w1-dp2"
    long = hook_pkg.engine_id_for(1023, 1024, env, hostname="h" * 100, pid=4194304)
    assert len(long) <= 63


def test_a_long_worker_id_is_cut_so_its_data_parallel_suffix_fits(shm_uri, module, monkeypatch):
    # 62 characters + "-dp<i>" would be 66: too long for an engine id, and
    # the hook would turn itself off. The worker id's end is cut instead.
    monkeypatch.setenv("AGENTIC_WORKER_ID", "w" * 62)
    engines = [module.Scheduler(parallel_config=ParallelConfig(i, 2)) for i in range(2)]
    assert [hook_of(e).engine_id for e in engines] == ["w" * 59 + "-dp0", "w" * 59 + "-dp1"]
    ids = sorted(s.engine_id for s in engine_state.Reader(uri=shm_uri).read())
    assert ids == ["w" * 59 + "-dp0", "w" * 59 + "-dp1"]
    for engine in engines:
        engine.shutdown()
    assert hook_pkg.engine_id_for(0, 1, {"AGENTIC_WORKER_ID": "w" * 62}) == "w" * 62


def test_a_worker_id_that_is_not_utf8_turns_the_hook_off_with_one_warning(tmp_path):
    """The variable set to bytes that are not UTF-8 (as a shell or a launcher
    can): an error logged once, the hook off, vLLM running, nothing published
    under the default id."""
    script = textwrap.dedent(
        f"""
        import logging, os, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="LOG %(message)s")
        from vllm_doubles import make_module, Request
        import engine_state.vllm as h
        assert os.environb[b"AGENTIC_WORKER_ID"] == b"w\\xff1"
        module = make_module()
        assert h.install(module)
        s = module.Scheduler()
        assert s.__dict__.get(h.HOOK_ATTR) is None
        s.add_request(Request("a", 10))
        assert s.schedule().num_scheduled_tokens == {{"a": 10}}
        try:
            h.engine_id_for(0, 1, os.environ)
        except ValueError as e:
            print("environ:", e)
        print("ok")
        """
    )
    env = {k: v for k, v in os.environb.items() if not k.startswith(b"AGENTIC_")}
    env[b"AGENTIC_WORKER_ID"] = b"w\xff1"
    env[b"AGENTIC_ENGINE_STATE_URI"] = f"file://{tmp_path}/engines".encode()
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and "ok" in result.stdout, result.stdout + result.stderr
    logged = [line for line in result.stdout.splitlines() if line.startswith("LOG ")]
    assert len(logged) == 1, result.stdout
    assert "not publishing" in logged[0], logged
    assert 'AGENTIC_WORKER_ID="w\\xff1" is not UTF-8' in logged[0], logged
    assert "environ: AGENTIC_WORKER_ID=" in result.stdout and "is not UTF-8" in result.stdout
    assert not os.path.exists(tmp_path / "engines") or not os.listdir(tmp_path / "engines")


def test_data_parallel_engines_get_their_own_files(shm_uri, module):
    engines = [module.Scheduler(parallel_config=ParallelConfig(i, 2)) for i in range(2)]
    ids = sorted(s.engine_id for s in engine_state.Reader(uri=shm_uri).read())
    host_part = hook_of(engines[0]).engine_id.rsplit("-dp", 1)[0]
    assert ids == [f"{host_part}-dp0-{os.getpid()}", f"{host_part}-dp1-{os.getpid()}"]
    for engine in engines:
        engine.shutdown()


def test_an_engine_id_clash_is_resolved_with_a_warning(shm_uri, module, monkeypatch, caplog):
    monkeypatch.setenv("AGENTIC_WORKER_ID", "same")
    first = module.Scheduler()
    with caplog.at_level(logging.WARNING, logger="engine_state.vllm"):
        second = module.Scheduler()
    assert hook_of(first).engine_id == "same"
    assert hook_of(second).engine_id == f"same-{os.getpid()}"
    assert any("already published" in r.getMessage() for r in caplog.records)
    ids = sorted(s.engine_id for s in engine_state.Reader(uri=shm_uri).read())
    assert ids == ["same", f"same-{os.getpid()}"]


def test_a_clash_of_default_ids_gets_a_random_part(shm_uri, module, monkeypatch):
    # Two engines of one process share the default id (it holds the pid).
    monkeypatch.delenv("AGENTIC_WORKER_ID", raising=False)
    first, second = module.Scheduler(), module.Scheduler()
    base = hook_of(first).engine_id
    assert base == hook_pkg.engine_id_for(0, 1)
    other = hook_of(second).engine_id
    assert other.startswith(f"{base}-{os.getpid()}-") and len(other) == len(base) + len(
        f"-{os.getpid()}-"
    ) + 4, other
    for engine in (first, second):
        engine.shutdown()


def test_the_capture_reaches_the_snapshot_by_name(shm_uri, module):
    scheduler = every_boundary(module.Scheduler())
    for i, prompt in enumerate((40, 24, 8)):
        scheduler.add_request(Request(f"r{i}", prompt))
    scheduler.schedule()
    hook = hook_of(scheduler)
    totals, state = hook.totals, published(shm_uri, hook.engine_id)
    named = [f for f in FIELDS if not f.startswith("gpu_blocks")]
    assert [getattr(totals, f) for f in named] == [getattr(state, f) for f in named]
    assert totals.busy and state.num_running + state.num_waiting > 0
    assert all(f"{f}=" in repr(totals) for f in named), repr(totals)
    # The hook's capture types are internal: not in any public list.
    internal = {"_RequestCapture", "_IncrementalCapture", "_RequestTotals"}
    assert not internal & set(engine_state.__all__)
    assert not internal & set(engine_state._native.__all__)


def test_num_tokens_fallback_when_the_token_list_disagrees(shm_uri, module, caplog):
    scheduler = every_boundary(module.Scheduler())
    request = Request("a", 30)
    request._all_token_ids = [1, 2]  # a vLLM where the list is not num_tokens
    type(request).num_tokens = property(lambda self: self.num_prompt_tokens)
    try:
        scheduler.add_request(request)
        with caplog.at_level(logging.WARNING, logger="engine_state.vllm"):
            scheduler.schedule()
        state = published(shm_uri, hook_of(scheduler).engine_id)
        assert state.ongoing_decode_tokens == 30  # from the property, not len([1, 2])
        assert any("reading the property" in r.getMessage() for r in caplog.records)
        assert hook_of(scheduler)._incremental is None  # nothing cached on such a vLLM
    finally:
        type(request).num_tokens = property(lambda self: len(self._all_token_ids))


def test_finish_requests_from_another_thread_does_not_capture(shm_uri, module):
    scheduler = module.Scheduler()
    hook = hook_of(scheduler)
    scheduler.add_request(Request("a", 20))
    scheduler.schedule()  # the scheduler thread is this one
    captures = hook.captures
    worker = threading.Thread(
        target=scheduler.finish_requests, args=(["a"], RequestStatus.FINISHED_ABORTED)
    )
    worker.start()
    worker.join()
    assert hook.captures == captures  # left to the scheduler thread
    scheduler.finish_requests([], RequestStatus.FINISHED_ABORTED)  # on this thread: captures
    assert hook.captures == captures + 1
    assert published(shm_uri, hook.engine_id).flags & engine_state.FLAG_IDLE


def test_a_recount_that_differs_falls_back_to_full_captures(shm_uri, module, caplog):
    """Once a second the incremental capture is checked by a full recount; a
    difference is logged once, counted, and the engine reads every request
    at every capture from then on (publishing the recount's values)."""
    clock = FakeClock()
    scheduler = module.Scheduler()
    hook = hook_of(scheduler)
    hook._clock = clock
    hook.last_recount_ns = None  # the next capture recounts
    waiting = [Request("a", 40), Request("b", 30)]
    for request in waiting:
        scheduler.add_request(request)
    hook.recounts = 0
    hook.capture(scheduler)  # a recount; a and b are cached
    assert hook.recounts == 1 and hook._incremental is not None
    assert hook._incremental.num_cached == 2
    assert_published_matches(shm_uri, scheduler, 0)
    # A change to a waiting request that vLLM 0.33 never makes unseen.
    waiting[0].num_computed_tokens = 16
    clock.advance_ms(100)
    hook.capture(scheduler)  # answered from the cache, no recount yet
    assert hook.recounts == 1 and hook.totals[2] == 70
    clock.advance_ms(1_000)
    with caplog.at_level(logging.WARNING, logger="engine_state.vllm"):
        hook.capture(scheduler)
        assert hook.recounts == 2 and hook.recount_mismatches == 1
        assert hook._incremental is None
        assert_published_matches(shm_uri, scheduler, 1)  # the recount's values
        waiting[1].num_computed_tokens = 16
        for _ in range(3):
            clock.advance_ms(1_000)
            hook.capture(scheduler)
            assert_published_matches(shm_uri, scheduler, 2)
    warnings = [r.getMessage() for r in caplog.records if "full recount" in r.getMessage()]
    assert len(warnings) == 1 and hook.recount_mismatches == 1, warnings


def test_a_scheduler_with_a_connector_gets_full_captures(shm_uri, module):
    class WithConnector(module.Scheduler):
        connector = "a KV connector"

    assert hook_of(module.Scheduler())._incremental is not None
    scheduler = WithConnector()
    assert hook_of(scheduler)._incremental is None
    scheduler.add_request(Request("a", 40))
    hook_of(scheduler).capture(scheduler)
    assert_published_matches(shm_uri, scheduler, 0)


def test_a_free_count_that_includes_the_null_block_is_clamped_and_publishing_goes_on(
    shm_uri, module, monkeypatch, caplog
):
    # A vLLM whose free count includes the null block: an empty engine
    # reports one more free block than it has usable ones. Unclamped,
    # publish() refuses free > total and the hook turns itself off.
    import vllm_doubles

    monkeypatch.setattr(vllm_doubles.BlockPool, "get_num_free_blocks", lambda pool: pool.free + 1)
    with caplog.at_level(logging.WARNING, logger="engine_state.vllm"):
        scheduler = every_boundary(module.Scheduler(num_blocks=33))
        hook = hook_of(scheduler)
        assert hook is not None, [r.getMessage() for r in caplog.records]
        state = published(shm_uri, hook.engine_id)
        assert (state.gpu_blocks_total, state.gpu_blocks_free) == (32, 32)
        scheduler.add_request(Request("a", 40, max_tokens=3))
        drive(scheduler, check=False)
        scheduler.add_request(Request("b", 20, max_tokens=2))
        scheduler.schedule()
    assert not [r for r in caplog.records if "hook turned off" in r.getMessage()]
    assert hook_of(scheduler) is hook and not hook.publisher.closed
    state = published(shm_uri, hook.engine_id)
    # Still published, as reported once it fits: b holds 2 of the 32 blocks.
    assert state.num_running == 1 and state.step == hook.step
    assert (state.gpu_blocks_total, state.gpu_blocks_free) == (32, 31)

"""The hook's cache residency (docs/VLLM.md, "Cache residency") against the
prefix-caching scheduler double (vllm_doubles: vLLM 0.33's names, a block
pool that caches, evicts from its free queue's head and hits on admission).

The reference is computed from the double's pool alone: a 512-token prefix of
a request is held when every one of its 16-token blocks' hashes is in the
pool's cached-hash dict; its key is ``engine_state.block_hashes``."""

from __future__ import annotations

import logging
import random

import pytest
from vllm_doubles import (
    GROUP_0,
    Request,
    RequestStatus,
    fake_sampled,
    kv_block_hash,
    make_module,
)

import engine_state
import engine_state.vllm as hook_pkg
from engine_state.vllm import _adapter, _residency

BLOCK = 512
KV = 16


@pytest.fixture(params=["evictions", "verify"])
def mode(request, monkeypatch):
    monkeypatch.setenv(_residency.MODE_ENV, request.param)
    return request.param


@pytest.fixture
def module():
    module = make_module()
    assert hook_pkg.install(module)
    return module


def hook_of(scheduler):
    return scheduler.__dict__.get(hook_pkg.HOOK_ATTR)


def held(scheduler, token_lists) -> set[int]:
    """Router blocks whose KV blocks (and their predecessors') are all cached."""
    cache = scheduler.kv_cache_manager.block_pool.cached_block_hash_to_block._cache
    result = set()
    for tokens in token_lists:
        parent = None
        routers = engine_state.block_hashes(tokens)
        for j, router in enumerate(routers):
            ok = True
            for i in range(j * BLOCK // KV, (j + 1) * BLOCK // KV):
                parent = kv_block_hash(parent, tokens[i * KV : (i + 1) * KV])
                if parent + GROUP_0 not in cache:
                    ok = False
                    break
            if not ok:
                break
            result.add(router)
    return result


def step(scheduler, sampled_token=100):
    out = scheduler.schedule()
    scheduler.update_from_output(out, fake_sampled(out, sampled_token))
    return out


def tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 30_000) for _ in range(n)]


def make(module, **kwargs):
    kwargs.setdefault("num_blocks", 257)  # 256 usable x 16 = 8 router blocks
    kwargs.setdefault("token_budget", 256)  # prefills are chunked
    return module.Scheduler(prefix_caching=True, **kwargs)


def test_a_prefix_hit_is_not_hashed_again(shm_uri, module, mode):
    scheduler = make(module)
    hook = hook_of(scheduler)
    hook.period_ns = 0
    system = tokens(1, 2 * BLOCK + 100)
    first = Request("a", 0, max_tokens=2, tokens=system)
    scheduler.add_request(first)
    while scheduler.has_requests():
        step(scheduler)
    tracker = hook.residency.tracker
    assert tracker.hash_calls == 2
    assert (
        set(hook.cache_digest)
        == held(scheduler, [system])
        == set(engine_state.block_hashes(system))
    )
    # A second request with the same 1,024 tokens and more: a prefix hit.
    second = Request("b", 0, max_tokens=2, tokens=system[: 2 * BLOCK] + tokens(2, BLOCK))
    scheduler.add_request(second)
    while scheduler.has_requests():
        step(scheduler)
    assert tracker.adopted >= 2
    assert tracker.hash_calls == 3  # only the new block
    assert set(hook.cache_digest) == set(engine_state.block_hashes(second.prompt_token_ids))


def test_chunked_prefill_crossing_boundaries_is_followed_chunk_by_chunk(shm_uri, module, mode):
    scheduler = make(module, token_budget=200)
    hook = hook_of(scheduler)
    hook.period_ns = 0
    prompt = tokens(3, 3 * BLOCK + 10)
    scheduler.add_request(Request("a", 0, max_tokens=2, tokens=prompt))
    routers = engine_state.block_hashes(prompt)
    seen = []
    while scheduler.has_requests():
        step(scheduler)
        assert set(hook.cache_digest) == held(scheduler, [prompt])
        if not seen or seen[-1] != len(hook.cache_digest):
            seen.append(len(hook.cache_digest))
    assert seen == [0, 1, 2, 3]
    assert set(hook.cache_digest) == set(routers)
    assert hook.residency.tracker.hash_calls == 3


def test_evictions_are_followed(shm_uri, module, mode):
    scheduler = make(module, num_blocks=97)  # 96 usable: 3 router blocks
    hook = hook_of(scheduler)
    hook.period_ns = 0
    prompts = [tokens(10 + i, 2 * BLOCK + 5) for i in range(3)]
    for i, prompt in enumerate(prompts):
        scheduler.add_request(Request(f"r{i}", 0, max_tokens=1, tokens=prompt))
        while scheduler.has_requests():
            step(scheduler)
            assert set(hook.cache_digest) == held(scheduler, prompts), i
    assert scheduler.kv_cache_manager.block_pool.evictions > 0
    # The latest prompt is held, the first one was evicted.
    assert set(engine_state.block_hashes(prompts[2])) <= set(hook.cache_digest)
    assert not set(engine_state.block_hashes(prompts[0])) & set(hook.cache_digest)


def test_a_reset_prefix_cache_empties_the_digest(shm_uri, module, mode):
    scheduler = make(module)
    hook = hook_of(scheduler)
    hook.period_ns = 0
    scheduler.add_request(Request("a", 0, max_tokens=1, tokens=tokens(4, BLOCK + 3)))
    while scheduler.has_requests():
        step(scheduler)
    assert len(hook.cache_digest) == 1
    scheduler.kv_cache_manager.block_pool.reset_prefix_cache()
    hook.capture(scheduler)
    assert hook.cache_digest == []


def test_randomized_sessions_preemption_and_aborts(shm_uri, module, mode):
    """Captures every 1 to ~6 boundaries (requests are admitted, preempted,
    aborted and finish between two captures); at each the digest equals the
    pool's."""
    scheduler = make(module, num_blocks=161, token_budget=300, max_num_seqs=4)
    hook = hook_of(scheduler)
    rng = random.Random(5)
    clock = [0]
    hook._clock = lambda: clock[0]
    hook.period_ns = 10
    systems = [tokens(100 + i, BLOCK + 50) for i in range(2)]
    sessions: list[list[int]] = []
    everything: list[list[int]] = []
    live = {}
    state = {"captures": hook.captures, "checked": 0, "preempted": 0}

    def after(where):
        if hook.captures != state["captures"]:
            state["captures"] = hook.captures
            current = everything + [list(r._all_token_ids) for r in live.values()]
            assert set(hook.cache_digest) == held(scheduler, current), where
            state["checked"] += 1

    for n in range(600):
        if len(scheduler.running) + len(scheduler.waiting) < 6 and rng.random() < 0.3:
            base = rng.choice(sessions) if sessions and rng.random() < 0.5 else rng.choice(systems)
            prompt = (base + tokens(rng.randrange(10**6), rng.randrange(1, 400)))[:1800]
            salt = "t" if rng.random() < 0.1 else None
            request = Request(
                f"q{n}", 0, max_tokens=rng.randrange(1, 40), tokens=prompt, cache_salt=salt
            )
            scheduler.add_request(request)
            if salt is None:
                everything.append(prompt)
                live[request.request_id] = request
        if live and rng.random() < 0.03:
            scheduler.finish_requests([rng.choice(list(live))], RequestStatus.FINISHED_ABORTED)
            after("finish_requests")
        if not scheduler.has_requests():
            continue
        clock[0] += rng.choice((0, 0, 10))
        out = scheduler.schedule()
        state["preempted"] += len(out.preempted_req_ids)
        after("schedule")
        clock[0] += rng.choice((0, 0, 10))
        scheduler.update_from_output(out, fake_sampled(out, 100 + n % 50))
        after("update_from_output")
        for rid in list(live):
            request = live[rid]
            if request.status > RequestStatus.PREEMPTED:
                everything.append(list(request._all_token_ids))
                sessions.append(list(request._all_token_ids))
                del live[rid]
    assert state["checked"] > 100, (
        state,
        len(everything),
        len(scheduler.requests),
        len(scheduler.running),
        len(scheduler.waiting),
    )
    assert state["preempted"] > 0
    assert scheduler.kv_cache_manager.block_pool.evictions > 0
    assert hook.residency.tracker.adopted > 0
    assert hook.residency.tracker.full_scans == 0


def test_many_running_requests_leaving_at_once(shm_uri, module, mode):
    """48 running requests; a run of 20 adjacent ones, then every third, are
    aborted between two captures, and new ones admitted: the digest stays
    the pool's, and the tracker finds those that left from the changes."""
    scheduler = make(module, num_blocks=6000, token_budget=8192, max_num_seqs=64)
    hook = hook_of(scheduler)
    clock = [0]
    hook._clock = lambda: clock[0]
    hook.period_ns = 10
    system = tokens(7, BLOCK + 30)
    prompts = [system + tokens(1000 + i, 500 + 7 * i) for i in range(48)]
    live = {}
    for i, prompt in enumerate(prompts):
        request = Request(f"m{i}", 0, max_tokens=400, tokens=prompt)
        scheduler.add_request(request)
        live[request.request_id] = request

    def check(where):
        clock[0] += 10
        out = scheduler.schedule()
        scheduler.update_from_output(out, fake_sampled(out, 100))
        current = prompts + [list(r._all_token_ids) for r in live.values()]
        assert set(hook.cache_digest) == held(scheduler, current), where

    for _ in range(12):
        check("prefill")
        if len(scheduler.running) == 48 and not scheduler.waiting:
            break
    assert len(scheduler.running) == 48
    running = [r.request_id for r in scheduler.running]
    scheduler.finish_requests(running[10:30], RequestStatus.FINISHED_ABORTED)
    check("20 adjacent aborted")
    running = [r.request_id for r in scheduler.running]
    scheduler.finish_requests(running[::3], RequestStatus.FINISHED_ABORTED)
    for i in range(8):
        prompt = system + tokens(5000 + i, 600)
        prompts.append(prompt)
        request = Request(f"n{i}", 0, max_tokens=400, tokens=prompt)
        scheduler.add_request(request)
        live[request.request_id] = request
    check("every third aborted, 8 admitted")
    for _ in range(3):
        check("decode")
    assert hook.residency.held > 48
    assert hook.residency.tracker.full_scans == 0


def test_requests_keyed_by_more_than_tokens_are_left_out(shm_uri, module, mode):
    scheduler = make(module)
    hook = hook_of(scheduler)
    hook.period_ns = 0
    prompt = tokens(6, BLOCK + 1)
    scheduler.add_request(Request("salted", 0, max_tokens=1, tokens=prompt, cache_salt="x"))
    scheduler.add_request(Request("lora", 0, max_tokens=1, tokens=prompt, lora_request="adapter"))
    while scheduler.has_requests():
        step(scheduler)
    assert hook.cache_digest == [] and hook.residency.tracker.hash_calls == 0


@pytest.mark.parametrize(
    "kwargs, reason",
    [
        (dict(block_size=24), "does not divide 512"),
        (dict(groups=2), "2 groups"),
    ],
)
def test_an_unsupported_engine_warns_once_and_publishes_nothing(
    shm_uri, module, mode, caplog, kwargs, reason
):
    with caplog.at_level(logging.WARNING, logger="engine_state.vllm"):
        scheduler = make(module, **kwargs)
        hook = hook_of(scheduler)
        hook.period_ns = 0
        scheduler.add_request(Request("a", 0, max_tokens=1, tokens=tokens(7, BLOCK + 1)))
        while scheduler.has_requests():
            step(scheduler)
    messages = [r.getMessage() for r in caplog.records if "cache residency" in r.getMessage()]
    assert len(messages) == 1 and reason in messages[0], messages
    assert hook.residency is None and hook.cache_digest is None
    assert hook_of(scheduler) is hook  # snapshots go on


def test_prefix_caching_off_publishes_no_digest_without_a_warning(shm_uri, module, caplog):
    with caplog.at_level(logging.WARNING, logger="engine_state.vllm"):
        scheduler = module.Scheduler()
    assert hook_of(scheduler).residency is None
    assert not [r for r in caplog.records if "residency" in r.getMessage()]


def test_an_error_inside_turns_residency_off_and_vllm_goes_on(
    shm_uri, module, mode, caplog, monkeypatch
):
    scheduler = make(module)
    hook = hook_of(scheduler)
    hook.period_ns = 0
    prompt = tokens(8, BLOCK + 1)
    scheduler.add_request(Request("a", 0, max_tokens=3, tokens=prompt))
    step(scheduler)
    pool = scheduler.kv_cache_manager.block_pool

    def broken(scheduler):
        raise RuntimeError("a vLLM that moved its cached-hash map")

    monkeypatch.setattr(_adapter, "cached_block_map", broken)
    with caplog.at_level(logging.WARNING, logger="engine_state.vllm"):
        while scheduler.has_requests():
            step(scheduler)
            step(scheduler)
    messages = [r.getMessage() for r in caplog.records if "residency turned off" in r.getMessage()]
    assert len(messages) == 1, messages
    assert hook.cache_digest is None
    assert hook_of(scheduler) is hook and not hook.publisher.closed  # snapshots go on
    assert "get_new_blocks" not in pool.__dict__  # the pool is unwrapped
    state = {s.engine_id: s for s in engine_state.Reader(uri=shm_uri).read()}[hook.engine_id]
    assert state.step == hook.step


def test_the_eviction_wrap_reports_only_blocks_it_takes(shm_uri, module):
    """The wrapped get_new_blocks is the pool's own method plus a report."""
    scheduler = make(module)
    pool = scheduler.kv_cache_manager.block_pool
    assert "get_new_blocks" in pool.__dict__
    free = pool.get_num_free_blocks()
    blocks = pool.get_new_blocks(3)
    assert len(blocks) == 3 and pool.get_num_free_blocks() == free - 3
    hook_of(scheduler).close(scheduler)
    assert "get_new_blocks" not in pool.__dict__


def test_a_kv_cache_larger_than_a_digest_holds_is_capped_not_fatal(shm_uri, module):
    """The capacity is the format's default (engine_state.default_cache_capacity):
    at most the entries a digest may hold. Computed without that bound, a huge
    KV cache asked the publisher for more and turned residency off."""
    scheduler = make(module)
    hook = hook_of(scheduler)
    hook.period_ns = 0
    scheduler.add_request(Request("a", 0, max_tokens=2, tokens=tokens(3, BLOCK + 10)))
    while scheduler.has_requests():
        step(scheduler)
    residency = hook.residency
    published = residency.published
    huge = 10**12  # KV blocks: 16 x 10^12 tokens
    residency.capture(scheduler, huge)
    assert residency.tracker is not None, "residency turned itself off"
    capacity = engine_state.default_cache_capacity(huge, KV)
    assert residency.capacity == capacity < huge * KV // BLOCK
    assert residency.published == published + 1  # rewritten at the new capacity
    assert engine_state.default_cache_capacity(256, KV) == 256 * KV // BLOCK


def test_the_tracker_publishes_its_digest_to_the_native_publisher(shm_uri, module, mode):
    # Tracker.publish hands its blocks to the Publisher without a Python
    # list: what the reader reads back is the tracker's digest, cut to the
    # capacity by the format's rule, and an unchanged digest writes nothing.
    scheduler = make(module)
    hook = hook_of(scheduler)
    hook.period_ns = 0
    prompt = tokens(7, 3 * BLOCK + 10)
    scheduler.add_request(Request("a", 0, max_tokens=2, tokens=prompt))
    while scheduler.has_requests():
        step(scheduler)
    tracker = hook.residency.tracker
    routers = engine_state.block_hashes(prompt)
    assert tracker.blocks() == sorted(routers)
    capacity = hook.residency.capacity
    assert tracker.publish(hook.publisher, capacity) is False  # already published
    assert tracker.publish(hook.publisher, 2) is True  # a cut: the first two blocks
    assert tracker.blocks(2) == sorted(routers[:2])
    hook.capture(scheduler)  # a snapshot names the new version (digest unchanged since)
    reader = engine_state.Reader(cache_digests=True)
    reader.read()
    assert reader.read_cache(hook.engine_id) == sorted(routers[:2])
    with pytest.raises(TypeError):
        tracker.publish(object(), capacity)

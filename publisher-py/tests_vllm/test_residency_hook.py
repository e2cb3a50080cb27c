"""The hook's cache residency against vLLM 0.33's real Scheduler (prefix
caching on, one full-attention group, 16-token KV blocks).

Multi-turn sessions over shared system prompts (each turn's prompt extends
the previous prompt and its output), a block pool small enough to evict and
preempt, chunked prefills, random aborts. The plugin's hook captures on a
fake clock every 1 to ~8 boundaries (so requests are admitted, finish and
are preempted between two captures). At each capture its digest must equal
the set computed independently: for every 512-token prefix of every request
ever added, would vLLM's own prefix lookup (``BlockPool.get_cached_block``
over the block hashes vLLM computes for that prefix) find all its KV blocks,
with the router hash from ``engine_state.block_hashes``. Also: a request with
a ``cache_salt`` is left out, and every router block is hashed at most once
per stay in the cache (a prefix hit adopts it).
"""

from __future__ import annotations

import json
import os
import random
import subprocess

import pytest
from vllm_harness import build_scheduler, esdump, fake_output, make_request

from engine_state import block_hashes
from engine_state.vllm import _hook

BLOCK = 512
KV_BLOCK = 16


_chains: dict[tuple, tuple[list, list[int]]] = {}


def chains(tokens: list[int]) -> tuple[list, list[int]]:
    """vLLM's block hashes (sha256, chained, no extra keys) of every full KV
    block of ``tokens``, and the router hashes of its 512-token blocks."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import hash_block_tokens

    key = tuple(tokens[: len(tokens) // BLOCK * BLOCK])
    if key not in _chains:
        parent = None
        kv = []
        for i in range(len(key) // KV_BLOCK):
            parent = hash_block_tokens(sha256, parent, key[i * KV_BLOCK : (i + 1) * KV_BLOCK], None)
            kv.append(parent)
        _chains[key] = (kv, block_hashes(list(key)))
    return _chains[key]


def expected_digest(scheduler, prompts: list[list[int]]) -> set[int]:
    """Router blocks vLLM would hit, from vLLM's own hashes and lookup."""
    pool = scheduler.kv_cache_manager.block_pool
    per = BLOCK // KV_BLOCK
    held: set[int] = set()
    for tokens in prompts:
        kv, routers = chains(tokens)
        for j, router in enumerate(routers):
            if any(pool.get_cached_block(h, [0]) is None for h in kv[j * per : (j + 1) * per]):
                break
            held.add(router)
    return held


@pytest.mark.parametrize("mode", ["evictions", "verify"])
def test_the_digest_is_what_vllms_prefix_lookup_would_hit(mode, loaded_plugin, monkeypatch):
    monkeypatch.setenv("AGENTIC_ENGINE_STATE_RESIDENCY", mode)
    scheduler, _ = build_scheduler(
        False,
        prefix_caching=True,
        num_blocks=400,  # 399 usable x 16 = 12 router blocks
        max_num_seqs=6,
        max_batched=384,
        max_model_len=2048,
    )
    hook = getattr(scheduler, _hook.HOOK_ATTR)
    assert hook.residency is not None and hook.residency.mode == mode
    hook.period_ns = 1 << 62  # captures only when the test moves the clock (or idle/busy)
    clock = [1 << 62]
    hook._clock = lambda: clock[0]
    rng = random.Random(7)
    systems = [[rng.randrange(3, 900) for _ in range(BLOCK + 200)] for _ in range(3)]
    sessions: list[list[int]] = []
    prompts: list[list[int]] = []
    live: dict[str, object] = {}
    state = {"captures": hook.captures, "checked": 0}

    def after_call(where: str) -> None:
        if hook.captures == state["captures"]:
            return
        state["captures"] = hook.captures
        seen = [list(r.all_token_ids) for r in live.values()]
        expected = expected_digest(scheduler, prompts + seen)
        assert set(hook.cache_digest) == expected, f"step {step}, after {where}"
        assert hook.residency.held == len(expected)
        state["checked"] += 1

    from vllm.v1.request import RequestStatus

    counter = 0
    for step in range(1_500):
        if len(scheduler.requests) < 8 and rng.random() < 0.3:
            counter += 1
            if sessions and rng.random() < 0.5:
                base = rng.choice(sessions)
                prompt = base + [rng.randrange(3, 900) for _ in range(rng.randrange(1, 300))]
            else:
                base = rng.choice(systems)
                prompt = base + [rng.randrange(3, 900) for _ in range(rng.randrange(1, 700))]
            prompt = prompt[:1900]
            salt = {"cache_salt": "tenant"} if rng.random() < 0.05 else {}
            request = make_request(f"q{counter}", prompt, rng.randrange(1, 80), **salt)
            scheduler.add_request(request)
            if not salt:  # a salted request's blocks are not the prompt's
                prompts.append(prompt)
                live[request.request_id] = request
        if live and rng.random() < 0.02:
            scheduler.finish_requests([rng.choice(list(live))], RequestStatus.FINISHED_ABORTED)
            after_call("finish_requests")
        if not scheduler.has_requests():
            continue
        if rng.random() < 0.4:
            clock[0] += 1 << 62  # the next boundary captures
        out = scheduler.schedule()
        after_call("schedule")
        if rng.random() < 0.4:
            clock[0] += 1 << 62
        if out.total_num_scheduled_tokens:
            scheduler.update_from_output(out, fake_output(scheduler, out, step))
            after_call("update_from_output")
        for rid in list(live):
            request = live[rid]
            if request.is_finished():
                sessions.append(list(request.all_token_ids))
                prompts.append(list(request.all_token_ids))
                del live[rid]
    tracker = hook.residency.tracker
    assert state["checked"] > 300
    assert hook.residency.held > 0 and tracker.hash_calls > 0 and tracker.adopted > 0
    # A prefix hit adopts the router hash: far fewer hashes than blocks reached.
    assert tracker.hash_calls < tracker.adopted
    # The digest's header names the engine's KV block size (esdump reads it).
    dump = subprocess.run(
        [str(esdump()), "--uri", os.environ["AGENTIC_ENGINE_STATE_URI"], "--cache",
         hook.engine_id, "--json"],
        capture_output=True, text=True, timeout=60,
    )
    assert dump.returncode == 0, dump.stderr
    header = json.loads(dump.stdout)
    assert header["kv_block_size"] == scheduler.block_size == 16
    assert header["held"] == hook.residency.held

"""The incremental capture against the full capture, in vLLM 0.33's real
Scheduler and AsyncScheduler, under a randomized workload (issue 13).

Requests arrive at random (prompts drawn from a few shared prefixes, so the
prefix cache hits; random priorities under the priority policy), prefills
are chunked (small token budget), the block pool is small (requests are
preempted and recomputed, and with async scheduling a preempted request still
receives its in-flight token while it waits), and random requests are
aborted, waiting or running. Two hooks watch the same scheduler:

- the plugin's hook, called by vLLM's wrapped methods as in an engine, on a
  fake clock that makes it capture every 1 to ~10 step boundaries (so
  requests are scheduled, preempted and re-queued between two of its
  captures, the case identity alone cannot see);
- a second hook, called by the test, that captures at every boundary.

At every boundary (after schedule(), update_from_output() and each abort) a
full capture (``RequestCapture``, every request read) is taken and checked
against an independent Python computation; each incremental capture taken
at that boundary must equal it exactly. The once-a-second recount is pushed
out of the way so that the cache alone is tested, and must never have
fallen back.
"""

from __future__ import annotations

import random
from collections import deque

import pytest
from vllm_harness import (
    BLOCK_SIZE,
    EOS_TOKEN_ID,
    MAX_MODEL_LEN,
    build_scheduler,
    fake_output,
    fields_from_scheduler,
)

import engine_state.vllm as hook_pkg
from engine_state import Publisher
from engine_state.vllm import _adapter as adapter
from engine_state.vllm import _hook

SCENARIOS = {
    # name: (async scheduling, policy, in-flight depth, seed)
    "Scheduler-fcfs": (False, "fcfs", 1, 1),
    "Scheduler-priority": (False, "priority", 1, 2),
    "AsyncScheduler-fcfs": (True, "fcfs", 2, 3),
    "AsyncScheduler-priority": (True, "priority", 2, 4),
}
STEPS = 5_000  # loop iterations (engine steps) per scenario
PERIOD = 50  # the plugin hook's period, in fake-clock units


def python_fields(scheduler) -> tuple:
    """The snapshot fields (docs/VLLM.md, "What each field means and how the
    hook computes it"), independently of the hook (status, not queue
    membership)."""
    f = fields_from_scheduler(scheduler)
    return (
        f["num_running"],
        f["num_waiting"],
        f["pending_prefill_tokens"],
        f["ongoing_decode_tokens"],
        f["num_prefilling"],
        f["max_prefill_remaining"],
        f["num_preempted"],
    )


class Workload:
    """Random requests: a few prompt families share their first blocks."""

    def __init__(self, rng: random.Random, priorities: bool) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

        init_none_hash(sha256)
        self.hasher = get_request_block_hasher(BLOCK_SIZE, sha256)
        self.params = SamplingParams
        self.rng = rng
        self.priorities = priorities
        self.count = 0
        self.arrivals = 0
        self.families = [[20 + f] * 48 + [30 + f] * 16 for f in range(4)]

    def request(self, session: bool = False):
        rng = self.rng
        family = rng.choice(self.families)
        prompt = family[: rng.randint(1, len(family))] + [
            100 + rng.randrange(800) for _ in range(rng.choice((0, 1, 8, 40, 90)))
        ]
        max_tokens = rng.randint(1, min(40, MAX_MODEL_LEN - len(prompt) - 1))
        self.count += 1
        return self._request(f"{'s' if session else 'w'}{self.count}", prompt, max_tokens, session)

    def chunk(self, session, end: bool):
        """The next input of a streaming session (vLLM appends it to the
        session's prompt), or its end."""
        size = self.rng.choice((self.rng.randint(1, 12), self.rng.randint(70, 100)))  # chunked
        prompt = [100 + self.rng.randrange(800) for _ in range(size)]
        return self._request(session.request_id, prompt, self.rng.randint(1, 8), not end)

    def _request(self, request_id: str, prompt: list, max_tokens: int, resumable: bool):
        from vllm.v1.request import Request

        params = self.params(max_tokens=max_tokens, ignore_eos=True)
        params.update_from_generation_config({}, EOS_TOKEN_ID)
        self.arrivals += 1
        return Request(
            request_id=request_id,
            prompt_token_ids=prompt,
            sampling_params=params,
            pooling_params=None,
            arrival_time=float(self.arrivals),
            priority=self.rng.randrange(4) if self.priorities else 0,
            block_hasher=self.hasher,
            resumable=resumable,
        )


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_incremental_capture_equals_full_capture_at_every_boundary(name, loaded_plugin, monkeypatch):
    from vllm.v1.request import RequestStatus

    async_scheduling, policy, depth, seed = SCENARIOS[name]
    monkeypatch.setattr(_hook, "RECOUNT_PERIOD_NS", 10**18)  # the cache alone
    rng = random.Random(seed)
    scheduler, _ = build_scheduler(
        async_scheduling, prefix_caching=True, num_blocks=20, max_num_seqs=6, policy=policy
    )
    assert type(scheduler).__name__ == name.split("-")[0]
    gap_hook = scheduler.__dict__[hook_pkg.HOOK_ATTR]  # the plugin's, on a fake clock
    fake_now = [0]
    gap_hook._clock = lambda: fake_now[0]
    gap_hook.period_ns = PERIOD
    gap_hook.last_recount_ns = 0  # with the recount period pushed out: never again
    every_hook = _hook.EngineStateHook(Publisher(engine_id=f"every-{name}"), RequestStatus.PREEMPTED)
    every_hook.period_ns = 0
    assert gap_hook._incremental is not None and every_hook._incremental is not None
    full = gap_hook._capture
    workload = Workload(rng, priorities=policy == "priority")

    seen = dict(boundaries=0, gap_captures=0, preemptions=0, aborts=0, chunked=0,
                prefix_hits=0, returned=0, schedule_calls=0, stale_to_waiting=0, session_inputs=0,
                prompt_changed_while_away=0)
    queued_at_capture: set = set()  # gap hook: ids in `waiting` at its last capture
    left_since_capture: set = set()  # ... and admitted to running since
    last_tokens_waiting: dict = {}
    prompts_seen_running: dict = {}

    def advance() -> int:
        """Before a wrapped vLLM call: time passes; the gap hook's captures."""
        fake_now[0] += rng.choice((2, 5, 10, 20, 45))
        return gap_hook.captures

    def boundary(kind: str, before: int, output=None) -> None:
        """After a wrapped vLLM call (which may have made the gap hook capture)."""
        nonlocal queued_at_capture
        seen["boundaries"] += 1
        if kind == "schedule":
            every_hook.after_schedule(scheduler, output)
        elif kind == "update":
            every_hook.after_update(scheduler)
        else:  # an abort (finish_requests) or a session's input (add_request)
            every_hook.capture(scheduler)
        for r in scheduler.running:  # a running request whose prompt grew since it last ran
            old = prompts_seen_running.get(r.request_id)
            seen["prompt_changed_while_away"] += old is not None and old != r.num_prompt_tokens
            prompts_seen_running[r.request_id] = r.num_prompt_tokens
        expected = full.capture(adapter.running(scheduler), adapter.waiting_queues(scheduler))
        assert expected == python_fields(scheduler), (kind, seen)
        assert every_hook.totals == expected, (kind, seen, every_hook.totals)
        if gap_hook.captures != before:
            seen["gap_captures"] += 1
            assert gap_hook.totals == expected, (kind, seen, gap_hook.totals)
            now_queued = {r.request_id for r in scheduler.waiting}
            seen["returned"] += len(now_queued & queued_at_capture & left_since_capture)
            queued_at_capture = now_queued
            left_since_capture.clear()
        # A request that waits and gained tokens since the last boundary:
        # a preempted request receiving its in-flight output.
        for r in scheduler.waiting:
            old = last_tokens_waiting.get(r.request_id)
            seen["stale_to_waiting"] += old is not None and r.num_tokens > old
        last_tokens_waiting.clear()
        last_tokens_waiting.update((r.request_id, r.num_tokens) for r in scheduler.waiting)

    inflight: deque = deque()
    backlog = 12  # live requests the arrivals aim at; changes every 200 steps
    for step in range(STEPS):
        if step % 200 == 0:
            backlog = rng.choice((3, 12, 24))
        for _ in range(rng.choice((0, 0, 1, 1, 2, 3))):
            if len(scheduler.requests) < backlog:
                scheduler.add_request(workload.request(session=rng.random() < 0.08))
        sessions = [r for r in scheduler.requests.values() if r.resumable and not r.is_finished()]
        if sessions and rng.random() < 0.2:
            # A streaming session's next input: vLLM extends its prompt in place
            # (at once if it waits for input, else when its turn stops).
            session = rng.choice(sessions)
            end = session.num_tokens > MAX_MODEL_LEN - 120 or rng.random() < 0.2
            before = advance()
            scheduler.add_request(workload.chunk(session, end))
            seen["session_inputs"] += 1
            boundary("session", before)
        if rng.random() < 0.08 and scheduler.requests:
            victim = rng.choice(list(scheduler.requests))
            before = advance()
            if scheduler.finish_requests(victim, RequestStatus.FINISHED_ABORTED):
                seen["aborts"] += 1
            boundary("abort", before)
        if scheduler.has_requests():
            before = advance()
            out = scheduler.schedule()
            seen["schedule_calls"] += 1
            seen["preemptions"] += len(out.preempted_req_ids or ())
            left_since_capture.update(r.req_id for r in out.scheduled_new_reqs)
            left_since_capture.update(out.scheduled_cached_reqs.resumed_req_ids)
            seen["chunked"] += any(
                0 < r.num_computed_tokens < r.num_prompt_tokens for r in scheduler.running
            )
            boundary("schedule", before, out)
            if out.total_num_scheduled_tokens > 0:
                inflight.appendleft((out, fake_output(scheduler, out, step)))
            if len(inflight) < depth and out.total_num_scheduled_tokens > 0:
                continue
        if not inflight:
            continue
        out, model_output = inflight.pop()
        before = advance()
        outputs = scheduler.update_from_output(out, model_output)
        for o in outputs.values():
            stats = o.scheduler_stats
            if stats is not None:
                seen["prefix_hits"] += stats.prefix_cache_stats.hits
        boundary("update", before)

    assert gap_hook._incremental is not None and gap_hook.recount_mismatches == 0
    assert every_hook._incremental is not None and every_hook.recount_mismatches == 0
    assert gap_hook.recounts == 1 and every_hook.recounts == 1  # their first capture only
    print(name, seen)
    # The cases the cache must get right did happen.
    for key in ("preemptions", "aborts", "chunked", "prefix_hits", "returned",
                "session_inputs", "prompt_changed_while_away"):
        assert seen[key] > 0, seen
    assert seen["gap_captures"] > STEPS // 5 and seen["schedule_calls"] > STEPS * 0.9, seen
    if async_scheduling:
        assert seen["stale_to_waiting"] > 0, seen
    every_hook.close(scheduler)
    scheduler.shutdown()

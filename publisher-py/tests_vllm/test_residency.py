"""Cache residency against vLLM 0.33's real Scheduler and AsyncScheduler
(issue 21, item 6).

A seeded randomized workload (``SEED``, or ``ENGINE_STATE_RESIDENCY_SEED``; the
scenario and seed are in every failure message) drives the real scheduler on
CPU for ``STEPS`` steps: shared system prompts; multi-turn sessions whose next
prompt is the previous prompt, its output and a new message (answers often run
past a 512-token boundary, so router blocks holding output tokens are cached
and reused); regenerated turns (the same prompt again: a full prefix hit, then
another output); one-off requests; prompts of whole router blocks sent twice
(the second computes its last KV block again: vLLM then caches that hash in
two blocks, and evicting one leaves the router block held); decode-heavy bursts; a small KV pool
(evictions, preemptions, router blocks partly evicted); a small token budget
(chunked prefills); random aborts of waiting and running requests (the session
goes on with the partial output); now and then a prefix-cache reset that
preempts the running requests (``Scheduler.reset_prefix_cache``). Every request is tokens-only (no LoRA,
multimodal input, ``cache_salt`` or prompt embeddings). Each scheduler runs
with both of the hook's ways of following evictions (``_residency.MODE_ENV``).

The plugin's hook publishes as in an engine, on a fake clock that makes it
capture every 1 to ~10 step boundaries. At each capture the test computes,
without the hook, the router blocks vLLM's prefix lookup would find
(``ResidencyOracle``): the candidates are every 512-token boundary of every
request's token ids seen so far (prompt and output), keyed by
``engine_state.block_hashes``; a candidate is held when the block pool's cached
lookup (``BlockPool.get_cached_block``, as ``find_longest_cache_hit`` calls it)
finds all of its KV blocks and those of every earlier router block of its
prefix, by vLLM's block hashes (``Request.block_hashes``, recomputed here with
the engine's hash function and compared). The oracle is checked on its own
(prefix-closed; every hash the pool caches belongs to a request seen; the
leading run of each live and recently finished request equals
``KVCacheManager.get_computed_blocks``'s hit in whole router blocks), then
compared with the published digest (``compare``: equal up to the digest's
capacity, the prefix-closed depth-first cut past it). Finally the test asserts
that each case it claims to cover happened (counts printed with ``-s``).
"""

from __future__ import annotations

import os
import random
import time
from collections import deque
from dataclasses import dataclass, field

import pytest
from vllm_harness import BLOCK_SIZE, build_scheduler, make_request

import engine_state
import engine_state.vllm as hook_pkg
from engine_state.vllm import _residency

SEED = int(os.environ.get("ENGINE_STATE_RESIDENCY_SEED", "21"))
STEPS = 2_500  # schedule() calls
ROUTER_BLOCK = 512  # engine_state.block_hashes's block (docs/FORMAT.md, BLOCK_TOKENS)
KV_PER_ROUTER = ROUTER_BLOCK // BLOCK_SIZE
NUM_BLOCKS = 384  # 383 usable KV blocks: 6,128 tokens, 11 router blocks
MAX_MODEL_LEN = 3072
MAX_SEQS = 8
MAX_BATCHED = 384  # token budget per step: prompts of a few thousand tokens are chunked
#: The digest's default capacity: gpu_blocks_total x kv_block_size / 512 (docs/FORMAT.md).
CAPACITY = (NUM_BLOCKS - 1) * BLOCK_SIZE // ROUTER_BLOCK
PERIOD = 50  # the hook's period, in fake-clock units
VOCAB = (3, 999)  # token ids drawn (the tiny model's vocabulary is 1,000)


SCENARIOS = {
    # name: (async scheduling, the hook's residency mode, seed)
    "Scheduler-evictions": (False, "evictions", SEED),
    "Scheduler-verify": (False, "verify", SEED + 1),
    "AsyncScheduler-evictions": (True, "evictions", SEED + 2),
    "AsyncScheduler-verify": (True, "verify", SEED + 3),
}


@dataclass
class Candidate:
    """A router block some request's token ids reached."""

    parent: int | None  # the router hash of the block before it (None: the first block)
    depth: int  # 0 for a prompt's first block
    kv: tuple  # vLLM's 32 block hashes of its tokens (the chain over the whole prefix)
    from_output: bool  # first reached by a request whose output tokens are inside it
    reprompted: bool = False  # later part of another request's prompt
    children: list = field(default_factory=list)


class ResidencyOracle:
    """The router blocks vLLM's prefix lookup would find, from the block pool
    alone (docs/VLLM.md; issue 21: a router block is held when all of its KV
    blocks are cached, in use or free and not evicted, and so are those of
    every earlier block of its prefix)."""

    def __init__(self, scheduler) -> None:
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import hash_block_tokens, make_block_hash_with_group_id

        self.scheduler = scheduler
        self.pool = scheduler.kv_cache_manager.block_pool
        self.candidates: dict[int, Candidate] = {}
        self.roots: list[int] = []
        self.kv_known: set = set()  # every (hash, group 0) key of a request seen
        self.partial = 0  # walks that met a router block only partly cached
        self._reached: dict[str, tuple[int, list]] = {}  # request id -> (router blocks, KV hashes)
        self._hash = lambda parent, tokens: hash_block_tokens(sha256, parent, tokens, None)
        self._key = lambda h: make_block_hash_with_group_id(h, 0)

    def observe(self, request) -> None:
        """Registers the router blocks and KV hashes ``request``'s tokens reached."""
        tokens = request.all_token_ids
        done, kv = self._reached.get(request.request_id, (0, []))
        # vLLM's hashes, recomputed with the engine's function, must be the request's.
        for k in range(len(kv), len(tokens) // BLOCK_SIZE):
            kv.append(
                self._hash(kv[-1] if kv else None, tokens[k * BLOCK_SIZE : (k + 1) * BLOCK_SIZE])
            )
            self.kv_known.add(self._key(kv[-1]))
        assert list(request.block_hashes) == kv, request.request_id
        n = len(tokens) // ROUTER_BLOCK
        self._reached[request.request_id] = (max(done, n), kv)
        if n <= done:
            return
        router = engine_state.block_hashes(list(tokens[: n * ROUTER_BLOCK]))
        assert len(router) == n
        for b in range(done, n):
            h = router[b]
            blocks = tuple(kv[b * KV_PER_ROUTER : (b + 1) * KV_PER_ROUTER])
            end = (b + 1) * ROUTER_BLOCK
            known = self.candidates.get(h)
            if known is not None:  # the same tokens: the same vLLM hashes
                assert known.kv == blocks and known.depth == b, (request.request_id, b)
                known.reprompted |= end <= request.num_prompt_tokens and known.from_output
                continue
            parent = router[b - 1] if b else None
            self.candidates[h] = Candidate(parent, b, blocks, end > request.num_prompt_tokens)
            (self.candidates[parent].children if parent is not None else self.roots).append(h)

    def forget(self, request_id: str) -> None:
        self._reached.pop(request_id, None)

    def held(self) -> set[int]:
        """The held router blocks: a walk down the prefix tree, each block
        looked up in the pool KV block by KV block (a miss ends its subtree)."""
        found = self.pool.get_cached_block
        held: set[int] = set()
        stack = list(self.roots)
        while stack:
            h = stack.pop()
            c = self.candidates[h]
            cached = sum(found(kv, [0]) is not None for kv in c.kv)
            if cached == len(c.kv):
                held.add(h)
                stack.extend(c.children)
            elif cached:  # some of its KV blocks evicted, not all: not held
                self.partial += 1
        return held

    def leading(self, request, held: set[int]) -> int:
        """Leading router blocks of ``request``'s token ids in ``held``."""
        n = 0
        for h in engine_state.block_hashes(list(request.all_token_ids)):
            if h not in held:
                break
            n += 1
        return n

    def check(self, held: set[int], probes) -> None:
        """The oracle's own invariants."""
        for h in held:  # prefix-closed, and a subset of the candidates
            parent = self.candidates[h].parent
            assert parent is None or parent in held, h
        cached = set(self.pool.cached_block_hash_to_block._cache)
        assert cached <= self.kv_known, "the pool caches a block of no request seen"
        manager = self.scheduler.kv_cache_manager
        for request in probes:  # vLLM's own lookup agrees, in whole router blocks
            _, hit, _ = manager.get_computed_blocks(
                request, max_cache_hit_length=request.num_tokens
            )
            assert hit // ROUTER_BLOCK == self.leading(request, held), (request.request_id, hit)


class Workload:
    """Sessions on shared system prompts, regenerated turns, one-off requests."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.systems = [
            self.tokens(rng.randint(lo, hi)) for lo, hi in ((300, 700), (700, 1200), (1100, 1700))
        ]
        self.count = 0
        self.sessions: dict[int, dict] = {}  # session -> {"next": step, "prompt": previous prompt}
        self.session_count = 0
        self.target = 4  # live sessions aimed at
        self.burst = 0.0  # chance of a decode-heavy request per step
        self.again: list = []  # (step, prompt) sent again then

    def tokens(self, n: int) -> list[int]:
        return [self.rng.randint(*VOCAB) for _ in range(n)]

    def max_tokens(self, prompt_len: int) -> int:
        """Mostly a short answer; often one that runs past the next router
        block boundary (so that blocks holding output tokens are cached and
        the next turn's prompt reaches them)."""
        rng = self.rng
        room = MAX_MODEL_LEN - prompt_len - 1
        to_boundary = ROUTER_BLOCK - prompt_len % ROUTER_BLOCK
        if rng.random() < 0.35:
            wanted = to_boundary + rng.randint(1, 80)
        else:
            wanted = rng.randint(1, 40)
        return max(1, min(wanted, room))

    def request(self, prompt: list[int]):
        self.count += 1
        return make_request(f"q{self.count}", prompt, self.max_tokens(len(prompt)))

    def new_session(self, step: int) -> None:
        self.session_count += 1
        self.sessions[self.session_count] = {"next": step, "prompt": None, "last": None}

    def due(self, step: int, live: set[str]):
        """The requests arriving at ``step``: (session or None, request)."""
        rng = self.rng
        while len(self.sessions) < self.target:
            self.new_session(step + rng.randint(0, 20))
        arrivals = []
        for sid, s in list(self.sessions.items()):
            last = s["last"]
            if s["next"] > step or (last is not None and last.request_id in live):
                continue
            if last is None:  # the first turn
                prompt = rng.choice(self.systems) + self.tokens(rng.randint(20, 500))
            elif rng.random() < 0.12:  # regenerate: the same prompt again
                prompt = list(s["prompt"])
            else:  # the next turn: everything so far, and a new message
                prompt = list(last.all_token_ids) + self.tokens(rng.randint(10, 400))
            if len(prompt) > MAX_MODEL_LEN - 64 or (last is not None and rng.random() < 0.06):
                del self.sessions[sid]  # the session ends
                continue
            request = self.request(prompt)
            s.update(prompt=prompt, last=request, next=step + rng.randint(1, 30))
            arrivals.append(request)
        if rng.random() < 0.02:  # a one-off: a system prompt and a question, or nothing shared
            prefix = rng.choice(self.systems) if rng.random() < 0.6 else []
            arrivals.append(self.request(prefix + self.tokens(rng.randint(30, 1500))))
        if rng.random() < 0.02:
            # A prompt of whole router blocks, sent again a little later: vLLM's
            # lookup stops one token short of it, so the second computes its
            # last KV block again and the pool holds that hash twice.
            prompt = self.tokens(ROUTER_BLOCK * rng.randint(1, 2))
            arrivals.append(self.request(prompt))
            for _ in range(rng.randint(1, 2)):
                self.again.append((step + rng.randint(30, 150), prompt))
        for when, prompt in list(self.again):
            if when <= step:
                self.again.remove((when, prompt))
                arrivals.append(self.request(prompt))
        if rng.random() < self.burst:  # a short question, a long answer: decodes outgrow the pool
            prompt = rng.choice(self.systems) + self.tokens(rng.randint(5, 60))
            self.count += 1
            arrivals.append(make_request(f"q{self.count}", prompt, rng.randint(200, 600)))
        return arrivals


def fake_output(scheduler, out):
    """One sampled token per request not in the middle of its prefill; the
    token depends on the request and its position only."""
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(out.num_scheduled_tokens)
    tokens = []
    for rid in ids:
        r = scheduler.requests[rid]
        salt = int(rid[1:]) * 2_654_435_761 + r.num_tokens * 40_503
        tokens.append([] if r.is_prefill_chunk else [VOCAB[0] + salt % (VOCAB[1] - VOCAB[0])])
    return ModelRunnerOutput(
        req_ids=ids, req_id_to_index={rid: i for i, rid in enumerate(ids)}, sampled_token_ids=tokens
    )


def published_digest(hook) -> tuple[str, set[int] | None]:
    """The digest the hook published, read back through the reader from the
    published file: (where it was read, its blocks). Its entries are strictly
    ascending (docs/FORMAT.md's digest layout)."""
    reader = getattr(published_digest, "reader", None)
    if reader is None:
        reader = published_digest.reader = engine_state.Reader(cache_digests=True)
    if hasattr(reader, "read_cache"):
        reader.read()
        source, blocks = "reader", reader.read_cache(hook.engine_id)
    else:  # until the reader binding exists: the hook's digest of its last capture
        source, blocks = "hook", hook.cache_digest
    if blocks is None:
        return source, None
    assert blocks == sorted(set(blocks)), (source, "not strictly ascending")
    return source, set(blocks)


def snapshot_cache_words(hook) -> tuple[int, int] | None:
    """The engine's published snapshot's ``cache_blocks`` and ``cache_version``,
    read back through the reader (None while the binding has no such fields)."""
    for engine in published_digest.reader.read():
        if engine.engine_id == hook.engine_id:
            fields = engine.to_dict()
            if "cache_version" not in fields:
                return None
            return fields["cache_blocks"], fields["cache_version"]
    raise AssertionError(f"engine {hook.engine_id!r} not published")


def compare(digest: set[int], held: set[int], oracle: ResidencyOracle, kind: str) -> bool:
    """The published digest against the oracle's held set. Up to the digest's
    capacity they are equal; past it (router blocks of different prompts can
    share KV blocks, so more can be held than the capacity) the digest keeps
    ``CAPACITY`` of them by depth first (docs/FORMAT.md's overflow rule): it is
    prefix-closed and holds every held block shallower than its deepest one.
    Returns whether the capacity was exceeded."""
    if len(held) <= CAPACITY:
        assert digest == held, (kind, sorted(digest - held), sorted(held - digest))
        return False
    assert len(digest) == CAPACITY and digest <= held, (kind, len(digest), sorted(digest - held))
    deepest = max(oracle.candidates[h].depth for h in digest)
    for h in held:
        c = oracle.candidates[h]
        assert c.depth >= deepest or h in digest, (kind, "a shallower block was cut", c.depth)
        if h in digest:
            assert c.parent is None or c.parent in digest, (kind, "not prefix-closed")
    return True


def run(async_scheduling: bool, seed: int, steps: int = STEPS) -> dict:
    """Drives one scheduler for ``steps`` loop iterations (EngineCore.step,
    or step_with_batch_queue with async scheduling: one step in flight)."""
    from vllm.v1.request import RequestStatus

    rng = random.Random(seed)
    depth = 2 if async_scheduling else 1
    scheduler, _ = build_scheduler(
        async_scheduling,
        prefix_caching=True,
        num_blocks=NUM_BLOCKS,
        max_num_seqs=MAX_SEQS,
        max_batched=MAX_BATCHED,
        max_model_len=MAX_MODEL_LEN,
    )
    assert type(scheduler).__name__ == ("AsyncScheduler" if async_scheduling else "Scheduler")
    hook = scheduler.__dict__[hook_pkg.HOOK_ATTR]
    fake_now = [0]
    hook._clock = lambda: fake_now[0]
    hook.period_ns = PERIOD
    oracle = ResidencyOracle(scheduler)
    workload = Workload(rng)
    seen = dict(
        boundaries=0,
        captures=0,
        compared=0,
        preemptions=0,
        aborts=0,
        chunked=0,
        prefix_hit_tokens=0,
        router_prefix_hits=0,
        kv_evictions=0,
        router_evictions=0,
        output_blocks_held=0,
        output_blocks_reused=0,
        max_held=0,
        running=0,
        schedule_calls=0,
        prefix_cache_resets=0,
        copy_evicted_hash_kept=0,
        versions_checked=0,
        over_capacity=0,
        probes=0,
    )
    live: dict[str, object] = {}
    finished: deque = deque(maxlen=12)  # recent finished requests: probes of evicted blocks
    output_held: set[int] = set()
    output_reused: set[int] = set()
    state = dict(held=set(), cached=set(), copies={})
    inflight: deque = deque()

    def advance() -> int:
        fake_now[0] += rng.choice((0, 2, 5, 10, 20, 45, 60))
        return hook.captures

    def boundary(kind: str, captures_before: int) -> None:
        seen["boundaries"] += 1
        for r in list(live.values()):
            oracle.observe(r)
            if r.is_finished():
                del live[r.request_id]
                finished.append(r)
        table = oracle.pool.cached_block_hash_to_block._cache
        cached = set(table)
        seen["kv_evictions"] += len(state["cached"] - cached)
        for key, copies in state["copies"].items():  # a hash cached in several blocks
            now = table.get(key)
            now = 0 if now is None else len(now) if isinstance(now, dict) else 1
            seen["copy_evicted_hash_kept"] += 0 < now < copies
        state.update(
            cached=cached, copies={k: len(v) for k, v in table.items() if isinstance(v, dict)}
        )
        if hook.captures == captures_before:
            return
        seen["captures"] += 1
        held = oracle.held()
        seen["router_evictions"] += len(state["held"] - held)
        state["held"] = held
        seen["max_held"] = max(seen["max_held"], len(held))
        for h in held:
            c = oracle.candidates[h]
            if c.from_output:
                output_held.add(h)
                if c.reprompted:
                    output_reused.add(h)
        probes = list(live.values()) + list(finished)
        seen["probes"] += len(probes)
        oracle.check(held, probes)
        source, digest = published_digest(hook)
        assert digest is not None, f"no digest published ({source})"
        seen["compared"] += 1
        seen["compared_via"] = source
        seen["over_capacity"] += compare(digest, held, oracle, kind)
        words = snapshot_cache_words(hook) if source == "reader" else None
        if words is not None:  # the snapshot names the digest it goes with
            blocks, version = words
            assert blocks == len(digest), (kind, "cache_blocks", blocks, len(digest))
            last = state.get("published")
            if last is not None:
                moved = version - last[1]
                assert moved == (digest != last[0]), (kind, "cache_version moved by", moved)
            assert version >= 1, (kind, "cache_version", version)
            state["published"] = (digest, version)
            seen["versions_checked"] += 1

    for step in range(steps):
        if step % 300 == 0:
            workload.target = rng.choice((3, 6, 10))
            workload.burst = rng.choice((0.0, 0.0, 0.1))
        for request in workload.due(step, set(live)):
            before = advance()
            scheduler.add_request(request)
            live[request.request_id] = request
            boundary("add", before)
        if live and rng.random() < 0.02:
            victim = rng.choice(sorted(live))
            before = advance()
            scheduler.finish_requests(victim, RequestStatus.FINISHED_ABORTED)
            seen["aborts"] += 1
            boundary("abort", before)
        if rng.random() < 0.002:
            # The prefix cache dropped at once (vLLM's /reset_prefix_cache, or an
            # RL weight update): running requests are preempted, every hash goes.
            before = advance()
            if scheduler.reset_prefix_cache(reset_running_requests=True):
                seen["prefix_cache_resets"] += 1
            boundary("reset", before)
        if scheduler.has_requests():
            before = advance()
            out = scheduler.schedule()
            seen["schedule_calls"] += 1
            seen["preemptions"] += len(out.preempted_req_ids or ())
            seen["chunked"] += sum(
                scheduler.requests[rid].is_prefill_chunk for rid in out.num_scheduled_tokens
            )
            seen["router_prefix_hits"] += sum(
                r.num_computed_tokens >= ROUTER_BLOCK for r in out.scheduled_new_reqs
            )
            seen["running"] += len(scheduler.running)
            boundary("schedule", before)
            if out.total_num_scheduled_tokens > 0:
                inflight.appendleft((out, fake_output(scheduler, out)))
            if len(inflight) < depth and out.total_num_scheduled_tokens > 0:
                continue  # async: the next schedule() runs before this step's output
        if not inflight:
            continue
        out, model_output = inflight.pop()
        before = advance()
        outputs = scheduler.update_from_output(out, model_output)
        for o in outputs.values():
            if o.scheduler_stats is not None:
                seen["prefix_hit_tokens"] += o.scheduler_stats.prefix_cache_stats.hits
        boundary("update", before)

    assert scheduler.__dict__.get(hook_pkg.HOOK_ATTR) is hook, "the hook turned itself off"
    seen["output_blocks_held"] = len(output_held)
    seen["output_blocks_reused"] = len(output_reused)
    seen["partly_cached"] = oracle.partial
    seen["candidates"] = len(oracle.candidates)
    seen["requests"] = workload.count
    scheduler.shutdown()
    return seen


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_published_digest_equals_vllms_block_pool_at_every_capture(name, loaded_plugin, monkeypatch):
    async_scheduling, mode, seed = SCENARIOS[name]
    monkeypatch.setenv(_residency.MODE_ENV, mode)  # read when the scheduler is built
    started = time.monotonic()
    try:
        seen = run(async_scheduling, seed)
    except AssertionError as error:
        raise AssertionError(
            f"{name}, seed {seed} (ENGINE_STATE_RESIDENCY_SEED={SEED}): {error}"
        ) from error
    seen["seconds"] = round(time.monotonic() - started, 1)
    print(name, f"seed {seed}", seen)
    # The scenario did exercise what it claims.
    for key in (
        "preemptions",
        "aborts",
        "chunked",
        "prefix_hit_tokens",
        "router_prefix_hits",
        "kv_evictions",
        "router_evictions",
        "output_blocks_held",
        "output_blocks_reused",
        "partly_cached",
        "prefix_cache_resets",
        "copy_evicted_hash_kept",
    ):
        assert seen[key] > 0, (name, seed, key, seen)
    assert seen["captures"] > STEPS // 5 and seen["schedule_calls"] > STEPS * 0.9, seen
    assert seen["compared"] == seen["captures"], seen

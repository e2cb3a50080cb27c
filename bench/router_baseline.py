#!/usr/bin/env python3
"""A straightforward pure-Python router: the baseline for router/benches/decide.rs.

The same concepts and policies as the Rust crate `engine-state-router`
(docs/ROUTING.md, "The router"), written the way a Python proxy would write
them, with no tricks: chained 512-token block hashes (builtin ``hash`` of a
tuple, or ``--hash sha256`` as vLLM's prefix cache does), an ``OrderedDict``
LRU per instance, shadow counters, ``max(shadow, real)`` merge with fresh real
state, ``load_only`` / ``lmetric`` / ``sticky`` / ``unified``, the migration
trigger and target scorer, one lock held across pick and reserve. Simplified
where timing does not depend on it: real state ages from when it was given
(the Rust router ages it from the read) and there is no shutting-down check
(one branch per instance in Rust).

Timing mode (the same scenario as the Rust benchmark)::

    python3 bench/router_baseline.py --instances 8 --tokens 200000
    python3 bench/router_baseline.py --all            # 8/64/256 x 2k/32k/200k
    python3 bench/router_baseline.py --self-test      # hand-computed policy checks

prints the median and p99 microseconds per decision (pick + reserve +
release, block hashing included).
"""

from __future__ import annotations

import argparse
import hashlib
import pickle
import statistics
import threading
import time
from collections import OrderedDict

BLOCK_TOKENS = 512
CHAIN_SEED = 0x65732D726F757465
FIELDS = (
    "num_requests",
    "ongoing_tokens",
    "pending_prefill_tokens",
    "ongoing_decode_tokens",
    "num_prefilling",
    "max_prefill_remaining",
)

DEFAULTS = dict(
    policy="unified",
    real_state_use="always",
    overload_factor=2.0,
    decode_weight=0.0,
    affinity_min_hit_ratio=0.5,
    prefix_cache_blocks=1024,
    real_state_expiry_s=2.0,
    ttft_slo_s=2.5,
    rel_hi=1.5,
    prefill_tokens_per_s=7_000.0,
    big_prefill_threshold=16_384,
    kv_wall_frac=0.9,
)


def block_hashes(tokens, algo="builtin"):
    """One chained hash per full 512-token block."""
    hashes = []
    prev = CHAIN_SEED
    for start in range(0, len(tokens) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
        block = tuple(tokens[start : start + BLOCK_TOKENS])
        if algo == "sha256":
            prev = hashlib.sha256(pickle.dumps((prev, block))).digest()
        else:
            prev = hash((prev, block))
        hashes.append(prev)
    return hashes


class Instance:
    def __init__(self, instance_id, cache_blocks):
        self.id = instance_id
        self.counters = dict.fromkeys(FIELDS[:5], 0)
        self.prefills = []  # pending prefill of each request before prefill_done
        self.cache = OrderedDict()
        self.cache_blocks = cache_blocks
        self.real = None  # (snapshot dict, fresh, capture_age_s, received_monotonic)

    def shadow(self):
        shadow = dict(self.counters)
        shadow["max_prefill_remaining"] = max(self.prefills, default=0)
        return shadow

    def cache_hit_tokens(self, blocks):
        run = 0
        for h in blocks:
            if h not in self.cache:
                break
            run += 1
        return run * BLOCK_TOKENS

    def remember_prefix(self, blocks):
        for h in reversed(blocks):
            if h in self.cache:
                self.cache.move_to_end(h)
            else:
                self.cache[h] = True
                if len(self.cache) > self.cache_blocks:
                    self.cache.popitem(last=False)


def merge(shadow, real):
    """max(shadow, real) per field when real is fresh; shadow alone otherwise."""
    effective = dict(shadow, kv_used_frac=None, real_fields=[], real_age_ms=None)
    if real is None or not real["fresh"]:
        return effective
    snap = real["snapshot"]
    for field, value in (
        ("num_requests", snap["num_running"] + snap["num_waiting"]),
        ("pending_prefill_tokens", snap["pending_prefill_tokens"]),
        ("ongoing_decode_tokens", snap["ongoing_decode_tokens"]),
        ("num_prefilling", snap["num_prefilling"]),
        ("max_prefill_remaining", snap["max_prefill_remaining"]),
    ):
        if value > effective[field]:
            effective[field] = value
            effective["real_fields"].append(field)
    if snap["gpu_blocks_total"]:
        free = min(snap["gpu_blocks_free"], snap["gpu_blocks_total"])
        effective["kv_used_frac"] = 1.0 - free / snap["gpu_blocks_total"]
        effective["real_fields"].append("kv_used_frac")
    effective["real_age_ms"] = real["capture_age_s"] * 1e3
    return effective


class Reservation:
    def __init__(self, router, instance, input_len, new_prefill):
        self.router, self.instance = router, instance
        self.input_len, self.new_prefill = input_len, new_prefill
        self.phase = "prefill"

    def prefill_done(self):
        with self.router.lock:
            if self.phase != "prefill":
                return
            self.phase = "decode"
            c = self.instance.counters
            c["pending_prefill_tokens"] -= self.new_prefill
            c["num_prefilling"] -= 1
            self.instance.prefills.remove(self.new_prefill)
            c["ongoing_decode_tokens"] += self.input_len

    def release(self):
        with self.router.lock:
            if self.phase == "released":
                return
            c = self.instance.counters
            if self.phase == "decode":
                c["ongoing_decode_tokens"] -= self.input_len
            else:
                c["pending_prefill_tokens"] -= self.new_prefill
                c["num_prefilling"] -= 1
                self.instance.prefills.remove(self.new_prefill)
            c["num_requests"] -= 1
            c["ongoing_tokens"] -= self.input_len
            self.phase = "released"

    complete = fail = release

    def __del__(self):
        if self.phase != "released":
            self.release()


class Router:
    def __init__(self, instance_ids, hash_algo="builtin", **settings):
        self.s = dict(DEFAULTS, **settings)
        self.hash_algo = hash_algo
        self.instances = [Instance(i, self.s["prefix_cache_blocks"]) for i in instance_ids]
        self.by_id = {inst.id: inst for inst in self.instances}
        self.sessions = {}  # session id -> Instance
        self.cursor = 0
        self.lock = threading.Lock()

    def update_real_state(self, states):
        now = time.monotonic()
        with self.lock:
            for instance_id, snapshot, fresh, capture_age_s in states:
                if instance_id in self.by_id:
                    self.by_id[instance_id].real = (snapshot, fresh, capture_age_s, now)

    def _real(self, inst, now):
        if inst.real is None:
            return None
        snapshot, fresh, age, given = inst.real
        since = now - given
        return {
            "snapshot": snapshot,
            "fresh": fresh and since <= self.s["real_state_expiry_s"],
            "capture_age_s": age + since,
        }

    def _argmin(self, keys):
        """Least key (None = excluded), ties round-robin from the cursor."""
        present = [k for k in keys if k is not None]
        if not present:
            return None
        best = min(present)
        n = len(keys)
        for i in list(range(min(self.cursor, n), n)) + list(range(n)):
            if keys[i] is not None and keys[i] == best:
                self.cursor = i + 1
                return i

    def _candidates(self, consult_real, blocks, now):
        out = []
        for inst in self.instances:
            real = self._real(inst, now) if consult_real else None
            effective = merge(inst.shadow(), real)
            hit = inst.cache_hit_tokens(blocks) if blocks is not None else 0
            out.append((effective, hit))
        return out

    def pick(self, request_id, tokens, session_id=None):
        blocks = block_hashes(tokens, self.hash_algo)
        input_len = len(tokens)
        s = self.s
        with self.lock:
            now = time.monotonic()
            policy = s["policy"]
            sessions_matter = policy in ("sticky", "unified")
            bound_inst = self.sessions.get(session_id) if sessions_matter and session_id else None
            bound = self.instances.index(bound_inst) if bound_inst in self.instances else None
            mode = s["real_state_use"]
            # `placement`: only the decision that first binds a session
            # (docs/ROUTING.md, "Where real state is used").
            binds = sessions_matter and session_id is not None and bound is None
            consult = mode == "always" or (mode == "placement" and binds)
            need_hits = policy in ("lmetric", "unified")
            cands = self._candidates(consult, blocks if need_hits else None, now)

            def new_prefill(i):
                return max(input_len - cands[i][1], 0)

            reason = None
            if policy == "load_only":
                index = self._argmin([e["num_requests"] for e, _ in cands])
                reason = "least_loaded"
            elif policy == "lmetric":
                keys = [
                    (e["pending_prefill_tokens"] + new_prefill(i)) * e["num_requests"]
                    for i, (e, _) in enumerate(cands)
                ]
                index, reason = self._argmin(keys), "lmetric"
            elif policy == "sticky":
                if bound is not None:
                    index, reason = bound, "affinity"
                else:
                    index = self._argmin([e["num_requests"] for e, _ in cands])
                    reason = "placement"
            else:  # unified
                index, reason = self._unified(cands, input_len, bound, new_prefill)

            inst = self.instances[index]
            hit = cands[index][1] if need_hits else inst.cache_hit_tokens(blocks)
            reserved_prefill = max(input_len - hit, 0)
            c = inst.counters
            c["num_requests"] += 1
            c["ongoing_tokens"] += input_len
            c["pending_prefill_tokens"] += reserved_prefill
            c["num_prefilling"] += 1
            inst.prefills.append(reserved_prefill)
            inst.remember_prefix(blocks)
            if sessions_matter and session_id:
                self.sessions[session_id] = inst
            decision = {
                "request_id": request_id,
                "session_id": session_id,
                "instance_id": inst.id,
                "reason": reason,
                "input_len": input_len,
                "cache_hit_tokens": hit,
                "new_prefill_tokens": reserved_prefill,
            }
            return decision, Reservation(self, inst, input_len, reserved_prefill)

    def _unified(self, cands, input_len, bound, new_prefill):
        s = self.s
        reason = "placement"
        if bound is not None:
            e, hit = cands[bound]
            ratio = hit / input_len if input_len else 0.0
            mean = sum(e2["num_requests"] for e2, _ in cands) / len(cands)
            limit = max(mean, 1.0) * s["overload_factor"]
            warm = ratio > s["affinity_min_hit_ratio"]
            if warm and e["num_requests"] <= limit:
                return bound, "affinity"
            reason = "fallback_overloaded" if warm else "fallback_cold_cache"
        keys = []
        for i, (e, _) in enumerate(cands):
            work = (
                e["pending_prefill_tokens"]
                + new_prefill(i)
                + s["decode_weight"] * e["ongoing_decode_tokens"]
            )
            keys.append((work * max(e["num_requests"], 1), new_prefill(i), e["num_requests"]))
        return self._argmin(keys), reason

    def migration_advice(self, tokens, source_id):
        """The trigger's verdict and the scorer's target (changes nothing)."""
        blocks = block_hashes(tokens, self.hash_algo)
        s = self.s
        with self.lock:
            consult = s["real_state_use"] != "never"
            cands = self._candidates(consult, blocks, time.monotonic())
            source = self.instances.index(self.by_id[source_id])
            e, hit = cands[source]
            pending = e["pending_prefill_tokens"]
            projected = (pending + max(len(tokens) - hit, 0)) / s["prefill_tokens_per_s"]
            median = statistics.median(e2["pending_prefill_tokens"] for e2, _ in cands)
            keys = []
            for i, (e2, hit2) in enumerate(cands):
                kv = e2["kv_used_frac"]
                avoided = (
                    i == source
                    or e2["max_prefill_remaining"] >= s["big_prefill_threshold"]
                    or (kv is not None and kv >= s["kv_wall_frac"])
                )
                keys.append(
                    None if avoided else (-hit2, e2["num_requests"], e2["pending_prefill_tokens"])
                )
            saved = self.cursor
            target = self._argmin(keys)
            self.cursor = saved
            slo = projected > s["ttft_slo_s"]
            above = pending > s["rel_hi"] * median
            return {
                "projected_prefill_s": projected,
                "slo_exceeded": slo,
                "above_fleet": above,
                "target_instance": None if target is None else self.instances[target].id,
                "migrate": slo and above and target is not None,
            }


# ---------------------------------------------------------------- benchmark
# The scenario of router/benches/decide.rs, built the same way.

SYSTEM_TOKENS = 1024
NEW_TOKENS = 256


def tokens(seed, length):
    """xorshift64 token ids below 150,000 (same generator as the Rust bench)."""
    mask = (1 << 64) - 1
    state = ((seed * 0x9E3779B97F4A7C15) & mask) | 1
    out = []
    for _ in range(length):
        state ^= (state << 13) & mask
        state ^= state >> 7
        state ^= (state << 17) & mask
        out.append(state % 150_000)
    return out


def snapshot(i):
    return {
        "num_running": i % 5,
        "num_waiting": i % 3,
        "pending_prefill_tokens": (i * 997) % 20_000,
        "ongoing_decode_tokens": (i * 7919) % 100_000,
        "num_prefilling": 0,
        "max_prefill_remaining": (i * 997) % 20_000,
        "gpu_blocks_total": 10_000,
        "gpu_blocks_free": 10_000 - (i * 131) % 10_000,
    }


def scenario(policy, instances, prompt_tokens, hash_algo="builtin"):
    ids = [f"engine-{i}" for i in range(instances)]
    router = Router(ids, hash_algo=hash_algo, policy=policy, real_state_expiry_s=86_400.0)
    system = tokens(0, SYSTEM_TOKENS)
    history_len = prompt_tokens - SYSTEM_TOKENS - NEW_TOKENS
    head_len = min(BLOCK_TOKENS, history_len)
    body = tokens(1_000_000, history_len - head_len)

    def history(i):
        # A distinct first block per session; chaining makes every later block distinct.
        return system + tokens(i + 1, head_len) + body

    held = []
    for i, instance_id in enumerate(ids):
        inst = router.by_id[instance_id]
        blocks = block_hashes(history(i), hash_algo)
        # reserve_on: the warm-up request lands on its instance.
        reservation = Reservation(router, inst, prompt_tokens - NEW_TOKENS, prompt_tokens - NEW_TOKENS)
        c = inst.counters
        c["num_requests"] += 1
        c["ongoing_tokens"] += reservation.input_len
        c["pending_prefill_tokens"] += reservation.new_prefill
        c["num_prefilling"] += 1
        inst.prefills.append(reservation.new_prefill)
        inst.remember_prefix(blocks)
        router.sessions[f"s{i}"] = inst
        if i % 2 == 1:
            held.append(reservation)
        else:
            reservation.release()
    router.update_real_state(
        (instance_id, snapshot(i), True, 0.020) for i, instance_id in enumerate(ids)
    )
    k = instances // 2
    prompt = history(k) + tokens(999_999, NEW_TOKENS)
    assert len(prompt) == prompt_tokens
    return router, held, prompt, f"s{k}"


def time_decisions(policy, instances, prompt_tokens, hash_algo, min_seconds, min_iterations):
    router, held, prompt, session = scenario(policy, instances, prompt_tokens, hash_algo)
    samples = []
    first = None
    started = time.perf_counter()
    while len(samples) < min_iterations or time.perf_counter() - started < min_seconds:
        t0 = time.perf_counter_ns()
        decision, reservation = router.pick("bench", prompt, session)
        reservation.release()
        samples.append((time.perf_counter_ns() - t0) / 1e3)
        first = first or decision
    samples.sort()
    p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))]
    return statistics.median(samples), p99, len(samples), first


# ---------------------------------------------------------------- self-test
# The hand-computed examples of router/src/policy_tests.rs, end to end.


def self_test():
    def fresh(n):
        snap = dict(snapshot(0), num_running=n, num_waiting=0, pending_prefill_tokens=0)
        snap.update(ongoing_decode_tokens=0, max_prefill_remaining=0, gpu_blocks_total=0)
        return snap

    r = Router(["a", "b", "c"], policy="load_only")
    picks = []
    for i in range(4):
        d, res = r.pick(str(i), [1] * 10)
        picks.append(d["instance_id"])
        res.release()
    assert picks == ["a", "b", "c", "a"], picks

    r = Router(["a", "b"], policy="unified", overload_factor=1.3)
    history = tokens(3, 8 * BLOCK_TOKENS)
    d, keep = r.pick("1", history + tokens(1, 100), "s")
    assert (d["instance_id"], d["reason"]) == ("a", "placement"), d
    d2, keep2 = r.pick("2", history + tokens(2, 100), "s")
    assert (d2["instance_id"], d2["reason"]) == ("a", "affinity"), d2
    assert d2["cache_hit_tokens"] == 8 * BLOCK_TOKENS
    r.update_real_state([("a", fresh(9), True, 0.01)])
    d3, keep3 = r.pick("3", history + tokens(3, 100), "s")
    assert (d3["instance_id"], d3["reason"]) == ("b", "fallback_overloaded"), d3
    for res in (keep, keep2, keep3):
        res.release()
    assert all(v == 0 for inst in r.instances for v in inst.shadow().values())

    r = Router(["src", "b", "c"], policy="load_only")
    src = dict(fresh(4), pending_prefill_tokens=60_000)
    r.update_real_state([("src", src, True, 0.01), ("b", fresh(10), True, 0.01)])
    _, c1 = r.pick("x", [1] * 10)  # lands on c (b is busy, src is busy)
    advice = r.migration_advice(tokens(5, 4096), "src")
    assert advice["migrate"] and advice["target_instance"] == "c", advice
    print("self-test: 6 passed, 0 failed")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--instances", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=200_000)
    parser.add_argument("--policy", default="unified", choices=["unified", "lmetric", "load_only", "sticky"])
    parser.add_argument("--hash", default="builtin", choices=["builtin", "sha256"], dest="hash_algo")
    parser.add_argument("--seconds", type=float, default=2.0, help="minimum timing time per case")
    parser.add_argument("--min-iterations", type=int, default=20)
    parser.add_argument("--all", action="store_true", help="8/64/256 instances x 2k/32k/200k tokens")
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        self_test()
        return
    cases = (
        [(n, t) for t in (2_000, 32_000, 200_000) for n in (8, 64, 256)]
        if args.all
        else [(args.instances, args.tokens)]
    )
    for instances, prompt_tokens in cases:
        median, p99, count, decision = time_decisions(
            args.policy, instances, prompt_tokens, args.hash_algo, args.seconds, args.min_iterations
        )
        print(
            f"python {args.policy} hash={args.hash_algo} instances={instances} tokens={prompt_tokens}: "
            f"median {median:.1f} us, p99 {p99:.1f} us per decision ({count} decisions; "
            f"first chose {decision['instance_id']} by {decision['reason']})"
        )


if __name__ == "__main__":
    main()

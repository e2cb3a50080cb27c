#!/usr/bin/env python3
"""Demo engines: simulated vLLM schedulers publishing through the real Publisher.

Each engine runs a small model of vLLM's V1 scheduler at 20 ms steps: requests
arrive (Poisson, with an occasional huge prompt), prefills are chunked under a
token budget, finished prefills decode one token per step, KV blocks fill up
and the newest request is preempted (and recomputed) when they run out. Every
50 ms the engine's state goes out through ``engine_state.Publisher``, exactly
as the vLLM hook publishes it. Used by ``make demo``.
"""

from __future__ import annotations

import argparse
import math
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass, field

from engine_state import Publisher

# The vLLM hook's own request capture (internal to engine_state.vllm, not an
# API for users): the demo's requests are read through it, so the demo
# publishes exactly what the hook would make of the same queues. Req below
# has the attributes it reads.
from engine_state._native import _RequestCapture

CAPTURE = _RequestCapture(
    prompt_attr="prompt",
    computed_attr="computed",
    tokens_attr="num_tokens",
    tokens_is_sequence=False,
    status_attr="preempted",
    preempted_status=True,
)

BLOCK_TOKENS = 16
STEP_S = 0.02


@dataclass
class Req:
    prompt: int
    max_out: int
    computed: int = 0
    out: int = 0
    preempted: bool = False

    @property
    def num_tokens(self) -> int:
        return self.prompt + self.out

    def remaining_prefill(self) -> int:
        # The rest of the prompt, or the whole recompute after a preemption
        # (the capture's rule, docs/FORMAT.md "Snapshot words").
        target = self.num_tokens - 1 if self.out else self.prompt
        return max(target - self.computed, 0)


@dataclass
class Engine:
    name: str
    rate: float  # requests per second
    blocks_total: int = 4000
    budget: int = 2048
    max_running: int = 64
    rng: random.Random = field(default_factory=random.Random)
    waiting: list[Req] = field(default_factory=list)
    running: list[Req] = field(default_factory=list)
    step_no: int = 0

    def blocks_used(self) -> int:
        return sum(math.ceil(max(r.computed, 1) / BLOCK_TOKENS) for r in self.running)

    def step(self) -> None:
        self.step_no += 1
        for _ in range(self._arrivals()):
            big = self.rng.random() < 0.04
            prompt = self.rng.randint(8_000, 20_000) if big else int(self.rng.lognormvariate(7.0, 0.8))
            self.waiting.append(Req(prompt=max(prompt, 16), max_out=self.rng.randint(20, 300)))
        budget = self.budget
        # Decode: one token per running request whose prefill is done.
        for r in list(self.running):
            if r.remaining_prefill() == 0 and budget > 0:
                r.computed = r.num_tokens
                r.out += 1
                budget -= 1
                if r.out >= r.max_out:
                    self.running.remove(r)
        # Chunked prefill of running requests, then admission from waiting.
        for r in self.running:
            if budget <= 0:
                break
            chunk = min(r.remaining_prefill(), budget)
            r.computed += chunk
            budget -= chunk
        while self.waiting and budget > 0 and len(self.running) < self.max_running:
            r = self.waiting.pop(0)
            r.preempted = False
            chunk = min(r.remaining_prefill(), budget)
            r.computed += chunk
            budget -= chunk
            self.running.append(r)
        # Out of KV blocks: preempt the newest request (vLLM recomputes it).
        while self.running and self.blocks_used() > self.blocks_total:
            victim = self.running.pop()
            victim.computed = 0
            victim.preempted = True
            self.waiting.insert(0, victim)

    def _arrivals(self) -> int:
        # Load that swings like a real day, compressed into seconds.
        rate = self.rate * (1.0 + 0.8 * math.sin(self.step_no / 150.0))
        lam, k, p = rate * STEP_S, 0, self.rng.random()
        threshold = math.exp(-lam)
        while p > threshold:
            k += 1
            p *= self.rng.random()
        return k

    def publish(self, publisher: Publisher) -> None:
        """Publishes the engine's state as the vLLM hook does: its capture
        sums the requests (shm-format's aggregation), the scheduler-wide
        fields are added, the publisher stamps it."""
        used = min(self.blocks_used(), self.blocks_total)
        totals = CAPTURE.capture(self.running, [self.waiting])
        totals.publish(
            publisher,
            step=self.step_no,
            gpu_blocks_total=self.blocks_total,
            gpu_blocks_free=self.blocks_total - used,
            flags=0,
        )


def run_engine(engine: Engine, uri: str, period_s: float, stop: threading.Event) -> None:
    with Publisher(uri=uri, engine_id=engine.name, period_ms=int(period_s * 1000)) as publisher:
        next_publish = 0.0
        while not stop.is_set():
            started = time.monotonic()
            engine.step()
            if started >= next_publish:
                engine.publish(publisher)
                next_publish = started + period_s
            time.sleep(max(0.0, STEP_S - (time.monotonic() - started)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", default=None, help="where to publish (default: AGENTIC_ENGINE_STATE_URI)")
    parser.add_argument("--engines", type=int, default=4, help="how many engines (default 4)")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds to run (default 15)")
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    args = parser.parse_args(argv)
    if args.engines < 1 or args.duration <= 0:
        parser.error("--engines must be at least 1 and --duration positive")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    engines = [
        Engine(name=f"demo-{i}", rate=3.0 + 2.5 * i, rng=random.Random(args.seed * 100 + i))
        for i in range(args.engines)
    ]
    threads = [threading.Thread(target=run_engine, args=(e, args.uri, 0.05, stop)) for e in engines]
    for t in threads:
        t.start()
    try:
        stop.wait(args.duration)
    except KeyboardInterrupt:
        pass
    stop.set()
    for t in threads:
        t.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())

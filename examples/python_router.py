#!/usr/bin/env python3
"""Linking the router into a Python proxy: poll engine state, pick, reserve, release.

Run it next to ``make demo`` (or any publishers):
    AGENTIC_ENGINE_STATE_URI=file:///dev/shm/engine_state_demo python examples/python_router.py
"""

import sys
import time

from engine_state import Reader, Router


def forward(instance_id: str, tokens: list[int]) -> None:
    """Stand-in for the HTTP call to the chosen engine."""


def main() -> int:
    reader = Reader()
    engines = [s.engine_id for s in reader.read()]
    if not engines:
        print(f"no engines publish at {reader.uri}; start some (make demo) first", file=sys.stderr)
        return 1
    router = Router(engines, policy="unified", settings={"decode_weight": 0.01})
    for i in range(10):
        router.update_real_state(reader.read())  # in a proxy: every 50 ms on a timer
        tokens = [t * (i % 3 + 1) for t in range(4096)]
        decision, reservation = router.pick(f"req-{i}", tokens=tokens, session_id=f"chat-{i % 3}")
        print(f"{decision.request_id} -> {decision.instance_id} ({decision.reason})")
        with reservation:  # completes on success, fails (releases) on an exception
            forward(decision.instance_id, tokens)
            reservation.prefill_done()
        time.sleep(0.02)
    return 0


if __name__ == "__main__":
    sys.exit(main())

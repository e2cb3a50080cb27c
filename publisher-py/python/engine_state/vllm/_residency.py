"""Cache residency of one engine: which 512-token router blocks its prefix
cache holds, published as the engine's digest (docs/VLLM.md, "Cache
residency").

``Residency`` wraps one ``engine_state._native._ResidencyTracker`` (Rust: the
hashing, the maps, the checks) for one scheduler; every vLLM name it touches
is in ``_adapter``. ``EngineStateHook`` calls ``note`` after each
``schedule()`` with the requests it admitted and ``capture`` after each
snapshot capture. Any exception here turns residency off for that engine
(logged once; the digest is published one last time,
empty, so that no reader trusts a digest nobody updates) and the hook goes
on publishing snapshots.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from engine_state._native import _ResidencyTracker, default_cache_capacity
from engine_state.vllm import _adapter as adapter

logger = logging.getLogger("engine_state.vllm")

#: How evictions are followed: "verify" (every digest block's KV blocks are
#: looked up in the cached-hash map at each capture), "evictions" (the block
#: pool's ``get_new_blocks`` reports the blocks it evicts; a capture checks
#: only those), or "off".
MODE_ENV = "AGENTIC_ENGINE_STATE_RESIDENCY"
MODES = ("verify", "evictions", "off")
DEFAULT_MODE = "evictions"


def mode_from_env(environ: dict | None = None) -> str:
    value = (environ if environ is not None else os.environ).get(MODE_ENV, "").strip().lower()
    if not value:
        return DEFAULT_MODE
    if value not in MODES:
        logger.warning(
            "engine-state: %s=%r is not one of %s; using %r",
            MODE_ENV,
            value,
            ", ".join(MODES),
            DEFAULT_MODE,
        )
        return DEFAULT_MODE
    return value


class Residency:
    """One engine's residency tracking; ``start`` returns None when the
    engine cannot be tracked (warned once)."""

    __slots__ = (
        "tracker",
        "mode",
        "engine_id",
        "capacity",
        "started",
        "held",
        "published",
        "_publisher",
        "_pool",
        "_wrapped",
    )

    def __init__(self, tracker: Any, mode: str, publisher: Any, pool: Any) -> None:
        self.tracker = tracker
        self.mode = mode
        self.engine_id: str = publisher.engine_id
        self.capacity = 0
        self.started = False  # a capture derived the digest
        self.held = 0
        #: Digest versions the publisher accepted (publish_cache returned True).
        self.published = 0
        self._publisher = publisher
        self._pool = pool
        self._wrapped: list[str] = []

    @classmethod
    def start(cls, scheduler: Any, publisher: Any, mode: str | None = None) -> Residency | None:
        mode = mode_from_env() if mode is None else mode
        if mode == "off":
            return None
        block_size, why_not = adapter.residency_block_size(scheduler)
        if block_size is None:
            # Without prefix caching the engine holds nothing a request could
            # hit: no digest, and nothing to warn about.
            log = logger.info if why_not == adapter.NO_PREFIX_CACHING else logger.warning
            log(
                "engine-state: engine %r publishes no cache residency: %s (see the section "
                "on cache residency in docs/VLLM.md); its snapshots are published as usual",
                publisher.engine_id,
                why_not,
            )
            return None
        tracker = _ResidencyTracker(
            kv_block_size=block_size, mode=mode, **adapter.residency_tracker_names()
        )
        residency = cls(tracker, mode, publisher, adapter.block_pool(scheduler))
        if mode == "evictions":
            residency._wrap_pool()
        return residency

    def _wrap_pool(self) -> None:
        """Instance attributes on the block pool that report evictions to the
        tracker before vLLM's own method runs (``stop`` removes them)."""
        pool = self._pool
        tracker = self.tracker
        get_new_blocks = getattr(pool, adapter.GET_NEW_BLOCKS)
        evict_blocks = getattr(pool, adapter.EVICT_BLOCKS, None)
        note_allocation = tracker.note_allocation
        first_free_block = adapter.first_free_block
        residency = self

        def reported_get_new_blocks(num_blocks: int) -> Any:
            if residency.tracker is not None:
                try:
                    note_allocation(first_free_block(pool), num_blocks)
                except Exception as error:
                    residency.fail(error, adapter.GET_NEW_BLOCKS)
            return get_new_blocks(num_blocks)

        setattr(pool, adapter.GET_NEW_BLOCKS, reported_get_new_blocks)
        self._wrapped.append(adapter.GET_NEW_BLOCKS)
        if evict_blocks is not None:

            def reported_evict_blocks(block_ids: Any) -> Any:
                if residency.tracker is not None:
                    tracker.note_all_suspect()
                return evict_blocks(block_ids)

            setattr(pool, adapter.EVICT_BLOCKS, reported_evict_blocks)
            self._wrapped.append(adapter.EVICT_BLOCKS)

    def note(self, requests: list) -> None:
        """Requests ``schedule()`` admitted (followed until the next capture)."""
        if self.tracker is not None and requests:
            try:
                self.tracker.note(requests)
            except Exception as error:
                self.fail(error, "note")

    def capture(
        self, scheduler: Any, gpu_blocks_total: int, running: Any = None, reads: Any = None
    ) -> None:
        """Follows the engine up to now and publishes the digest when it
        changed. ``running``: the scheduler's running list, when the caller
        has it; ``reads``: the hook's ``_IncrementalCapture`` when it has just
        read ``running`` (the tracker takes the computed tokens it read)."""
        tracker = self.tracker
        if tracker is None:
            return
        try:
            if running is None:
                running = adapter.running(scheduler)
            changed = tracker.capture(running, adapter.cached_block_map(scheduler), reads)
            capacity = default_cache_capacity(gpu_blocks_total, tracker.kv_block_size)
            if not changed and capacity == self.capacity and self.started:
                return
            self.started = True
            self.capacity = capacity
            self.held = tracker.held
            # The tracker hands its blocks to the native publisher itself
            # (Publisher.publish_cache, without a Python list).
            if tracker.publish(self._publisher, capacity):
                self.published += 1
        except Exception as error:
            self.fail(error, "capture")

    def fail(self, error: BaseException, where: str) -> None:
        """Turns residency off for this engine; never raises."""
        logger.warning(
            "engine-state: cache residency turned off for engine %r after an error in %s: "
            "%s: %s. vLLM keeps running and the engine's snapshots are still published; "
            "its digest is no longer updated.",
            self.engine_id,
            where,
            type(error).__name__,
            error,
            exc_info=error,
        )
        self.stop()
        try:
            self.held = 0
            if self.published and not self._publisher.closed:
                self._publish([], 0, self.capacity)
        except Exception:
            pass

    @property
    def blocks(self) -> list[int]:
        """The digest as of the last capture (ascending router block hashes,
        at most ``capacity``); [] once residency is off."""
        tracker = self.tracker
        return [] if tracker is None else tracker.blocks(self.capacity)

    def _publish(self, blocks: list, held: int, capacity: int) -> None:
        # Publisher.publish_cache (docs/FORMAT.md, "Cache residency").
        if self._publisher.publish_cache(blocks, held, capacity):
            self.published += 1

    def stop(self) -> None:
        """Stops tracking; removes the pool's wrappers. Idempotent."""
        self.tracker = None
        for name in self._wrapped:
            try:
                self._pool.__dict__.pop(name, None)
            except Exception:
                pass
        self._wrapped = []

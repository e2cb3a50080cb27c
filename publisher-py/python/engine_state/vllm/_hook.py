"""The per-engine hook: captures a scheduler's state on the scheduler thread
and publishes it (docs/VLLM.md, "When it captures" and "What each field means
and how the hook computes it").

One ``EngineStateHook`` lives on each scheduler object (attribute
``HOOK_ATTR``), created by the wrapped ``Scheduler.__init__`` in the
engine-core process. The wrapped methods call ``after_schedule``,
``after_update``, ``after_finish`` and ``close``; each call costs a clock read
and three ``len()`` calls unless a capture is due: at most once per period,
and at once when the engine turns idle or busy (``after_schedule`` also notes
the requests its ``SchedulerOutput`` reports preempted or admitted). A capture reads the
requests through ``engine_state._native._IncrementalCapture`` (Rust, names from
the adapter): every running request, and of the waiting ones only those that
may have changed since the last capture (docs/VLLM.md, "What the capture
caches"); then it publishes one snapshot (``_RequestTotals.publish``: the
capture's sums reach the snapshot by name, in Rust). Once per
``RECOUNT_PERIOD_NS`` it reads every request instead and compares; on a
difference it logs once and this engine uses full captures
(``_RequestCapture``) from then on, as it does when a connector is configured.

With cache residency on (docs/VLLM.md, "Cache residency"), each capture
also follows which router blocks the engine's prefix cache holds and
publishes the digest when it changed (``_residency.Residency``); an error
there turns residency off only.

Any exception here turns the hook off for that engine (``fail``): it logs the
reason once, retires the engine's file and detaches, and vLLM carries on.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from engine_state._native import (
    FLAG_SHUTTING_DOWN,
    EngineIdInUse,
    Publisher,
    _fallback_engine_id,
    _IncrementalCapture,
    _RequestCapture,
    _RequestTotals,
)
from engine_state._native import _engine_id_for as engine_id_for
from engine_state.vllm import _adapter as adapter
from engine_state.vllm._residency import Residency

logger = logging.getLogger("engine_state.vllm")

#: The scheduler attribute holding its hook.
HOOK_ATTR = "_engine_state_hook"
#: Kill switch: "1", "true", "yes" or "on" turns the hook off entirely.
DISABLE_ENV = "AGENTIC_ENGINE_STATE_DISABLE"

#: How often the incremental capture is cross-checked by a full recount.
RECOUNT_PERIOD_NS = 1_000_000_000


def disabled(environ: dict | None = None) -> bool:
    """True when the kill switch is set."""
    value = (environ if environ is not None else os.environ).get(DISABLE_ENV, "")
    return value.strip().lower() in ("1", "true", "yes", "on")


def start_publisher(
    engine_id: str, publisher_cls: Callable[..., Any] = Publisher, pid: int | None = None
) -> Any:
    """Starts a publisher for ``engine_id``; if a live process already
    publishes that id, warns and uses ``<engine_id>-<pid>`` instead (with a
    random part more when ``engine_id`` already ends with the pid)."""
    try:
        return publisher_cls(engine_id=engine_id)
    except EngineIdInUse as error:
        fallback = _fallback_engine_id(engine_id, pid)
        logger.warning(
            "engine-state: engine id %r is already published by another live engine (in this "
            "directory or Redis prefix); publishing as %r instead. Give each engine its own "
            "AGENTIC_WORKER_ID to choose the names. (%s)",
            engine_id,
            fallback,
            error,
        )
        return publisher_cls(engine_id=fallback)


class EngineStateHook:
    """Captures one scheduler's state and publishes it."""

    __slots__ = (
        "publisher",
        "engine_id",
        "period_ns",
        "step",
        "busy",
        "last_capture_ns",
        "depth",
        "captures",
        "totals",
        "recounts",
        "recount_mismatches",
        "last_recount_ns",
        "_preempted",
        "_capture",
        "_incremental",
        "_tokens_checked",
        "_clock",
        "_thread",
        "residency",
    )

    def __init__(
        self,
        publisher: Any,
        preempted_status: Any,
        clock: Callable[[], int] = time.monotonic_ns,
        incremental: bool = True,
    ) -> None:
        self.publisher = publisher
        self.engine_id: str = publisher.engine_id
        self.period_ns: int = int(publisher.period_ms) * 1_000_000
        self.step = 0  # schedule() calls seen
        self.busy: bool | None = None  # unknown until the first capture
        self.last_capture_ns = 0
        self.depth = 0  # > 0 inside schedule() / update_from_output()
        self.captures = 0
        #: The request-dependent fields of the last capture.
        self.totals: _RequestTotals | None = None
        self.recounts = 0  # full recounts that cross-checked the incremental capture
        self.recount_mismatches = 0
        self.last_recount_ns: int | None = None
        self._preempted = preempted_status
        self._capture = _RequestCapture(
            preempted_status=preempted_status, **adapter.request_capture_names(True)
        )
        # None: full captures (a connector is configured, or a recount differed).
        self._incremental: _IncrementalCapture | None = (
            _IncrementalCapture(
                preempted_status=preempted_status, **adapter.request_capture_names(True)
            )
            if incremental
            else None
        )
        self._tokens_checked = False
        self._clock = clock
        self._thread: int | None = None  # the scheduler thread, from the first schedule()
        #: Cache residency (None: off, or this engine cannot be tracked).
        self.residency: Residency | None = None

    # -- called by the wrapped scheduler methods (always on its thread) --------

    def after_schedule(self, scheduler: Any, output: Any = None) -> None:
        if self._thread is None:
            self._thread = threading.get_ident()
        self.step += 1
        residency = self.residency
        if output is not None and (self._incremental is not None or residency is not None):
            if self._incremental is not None:
                preempted = adapter.preempted_in(output)
                if preempted:
                    self._mark_volatile(scheduler, preempted)
            admitted = adapter.admitted_in(output)
            if admitted:
                requests = adapter.requests_by_id(scheduler)
                objects = [requests[i] for i in admitted if i in requests]
                if self._incremental is not None:
                    self._incremental.forget_running(objects)
                if residency is not None:
                    residency.note(objects)
        self.maybe_capture(scheduler)

    def after_update(self, scheduler: Any, outputs: Any = None) -> None:
        # (``outputs``: what update_from_output() returned; not needed.)
        self.maybe_capture(scheduler)

    def after_finish(self, scheduler: Any) -> None:
        # An abort can empty an engine between steps, and an idle engine has
        # no next step: publish the transition now. Inside update_from_output()
        # (which finishes failed requests itself) wait for its end instead.
        # vLLM 0.33 finishes requests on the scheduler thread only; should
        # another thread ever do it, leave the capture to the scheduler thread
        # (docs/VLLM.md, "When it captures": scheduler structures are read on
        # that thread only).
        if self.depth == 0 and self._thread in (None, threading.get_ident()):
            self.maybe_capture(scheduler)

    def maybe_capture(self, scheduler: Any) -> None:
        """Captures when the period has passed or idle/busy changed."""
        now = self._clock()
        if (
            now - self.last_capture_ns < self.period_ns
            and adapter.has_requests(scheduler) is self.busy
        ):
            return
        self.capture(scheduler, now)

    def capture(self, scheduler: Any, now: int | None = None, flags: int = 0) -> None:
        """Captures every snapshot field (docs/VLLM.md, "What each field means
        and how the hook computes it") and publishes them."""
        running = adapter.running(scheduler)
        if not self._tokens_checked:
            self._check_tokens(running, adapter.waiting_queues(scheduler))
        now = self._clock() if now is None else now
        self.totals = totals = self._capture_requests(scheduler, running, now)
        blocks_total, blocks_free = adapter.block_counts(scheduler)
        # The digest first: the snapshot published next names its version
        # (docs/FORMAT.md, "Cache residency").
        if self.residency is not None:
            # The incremental capture has just read `running`: the tracker
            # takes its reads instead of reading every request again.
            self.residency.capture(scheduler, blocks_total, running, self._incremental)
        totals.publish(
            self.publisher,
            step=self.step,
            gpu_blocks_total=blocks_total,
            gpu_blocks_free=blocks_free,
            flags=flags,
        )
        self.busy = totals.busy
        self.last_capture_ns = now
        self.captures += 1

    @property
    def cache_digest(self) -> list[int] | None:
        """The residency digest as of the last capture (ascending router block
        hashes), or None when residency is off for this engine."""
        residency = self.residency
        if residency is None or residency.tracker is None:
            return None
        return residency.blocks

    def _capture_requests(self, scheduler: Any, running: Any, now: int) -> _RequestTotals:
        """The request-dependent fields: incrementally, cross-checked by a
        full recount once per ``RECOUNT_PERIOD_NS``; or in full."""
        incremental = self._incremental
        if incremental is None:
            return self._capture.capture(running, adapter.waiting_queues(scheduler))
        preempted = adapter.preempted_since_schedule(scheduler)
        if preempted:
            self._mark_volatile(scheduler, preempted)
        read = adapter.read_waiting_queues(scheduler)
        cached = adapter.cached_waiting_queue(scheduler)
        if self.last_recount_ns is not None and now - self.last_recount_ns < RECOUNT_PERIOD_NS:
            return incremental.capture(running, read, cached)
        self.last_recount_ns = now
        self.recounts += 1
        counted, full = incremental.recount(running, read, cached)
        if counted != full:
            self.recount_mismatches += 1
            self._incremental = None
            incremental.clear()
            logger.warning(
                "engine-state: the incremental capture of engine %r differed from a full recount "
                "(%r instead of %r); this engine reads every request at every capture from now "
                "on. This capture publishes the recount's values; those of the last second may "
                "have been off. "
                "Please report this with your vLLM version.",
                self.engine_id,
                counted,
                full,
            )
        return full

    def _mark_volatile(self, scheduler: Any, request_ids: Any) -> None:
        """Requests preempted since they last ran: read at every capture while
        they wait (a preempted request can still receive in-flight output)."""
        requests = adapter.requests_by_id(scheduler)
        for request_id in request_ids:
            request = requests.get(request_id)
            if request is not None:
                self._incremental.mark_volatile(request)

    def close(self, scheduler: Any) -> None:
        """Publishes a last snapshot flagged shutting-down, then retires the
        file. Idempotent."""
        if self.publisher.closed:
            return
        try:
            self.capture(scheduler, flags=FLAG_SHUTTING_DOWN)
        finally:
            if self.residency is not None:
                self.residency.stop()
            self.publisher.close()

    def fail(self, scheduler: Any, error: BaseException, where: str) -> None:
        """Turns the hook off for this engine after ``error``; never raises."""
        logger.warning(
            "engine-state: hook turned off for engine %r after an error in %s: %s: %s. vLLM "
            "keeps running; the engine's state is no longer published (its file is retired).",
            self.engine_id,
            where,
            type(error).__name__,
            error,
            exc_info=error,
        )
        if self.residency is not None:
            self.residency.stop()
        try:
            if getattr(scheduler, HOOK_ATTR, None) is self:
                delattr(scheduler, HOOK_ATTR)
        except Exception:
            pass
        try:
            self.publisher.close()
        except Exception:
            pass

    def _check_tokens(self, running: Any, waiting: list) -> None:
        """Once per engine, with a request at hand: is ``len(_all_token_ids)``
        this vLLM's ``num_tokens``? If not, read the property instead."""
        request = (
            running[0] if len(running) else next((r for queue in waiting for r in queue), None)
        )
        if request is None:
            return
        self._tokens_checked = True
        if not adapter.tokens_from_list_matches(request):
            logger.warning(
                "engine-state: this vLLM's Request.%s is not len(%s); reading the property "
                "(slower)",
                adapter.NUM_TOKENS,
                adapter.ALL_TOKEN_IDS,
            )
            self._capture = _RequestCapture(
                preempted_status=self._preempted, **adapter.request_capture_names(False)
            )
            # What the incremental capture may cache was proven for vLLM 0.33,
            # where the shortcut holds: on a vLLM that differs, read everything.
            self._incremental = None


def start_residency(scheduler: Any, publisher: Any) -> Residency | None:
    """Cache residency for ``scheduler``'s engine, or None (off, or the
    engine cannot be tracked: warned once). An error here leaves the
    snapshots alone."""
    try:
        return Residency.start(scheduler, publisher)
    except Exception as error:
        logger.warning(
            "engine-state: engine %r publishes no cache residency after an error: %s: %s; "
            "its snapshots are published as usual",
            publisher.engine_id,
            type(error).__name__,
            error,
            exc_info=error,
        )
        return None


def attach(scheduler: Any, preempted_status: Any) -> EngineStateHook | None:
    """Starts publishing ``scheduler``'s state (called at the end of its
    ``__init__``). Returns None when the kill switch is set."""
    if disabled():
        return None
    dp_index, dp_size = adapter.data_parallel(scheduler)
    publisher = start_publisher(engine_id_for(dp_index, dp_size))
    try:
        hook = EngineStateHook(
            publisher, preempted_status, incremental=adapter.waiting_cache_safe(scheduler)
        )
        hook.residency = start_residency(scheduler, publisher)
        hook.capture(scheduler)
    except BaseException:
        publisher.close()
        raise
    setattr(scheduler, HOOK_ATTR, hook)
    logger.info(
        "engine-state: publishing engine %r to %s every %d ms",
        hook.engine_id,
        publisher.uri,
        publisher.period_ms,
    )
    return hook

"""Test doubles of vLLM 0.33's V1 scheduler, request and block pool.

They use vLLM 0.33's attribute names (``running``, ``waiting``,
``kv_holding_waiting``, ``kv_cache_manager.block_pool``, ``num_prompt_tokens``,
``num_computed_tokens``, ``_all_token_ids``/``num_tokens``,
``num_output_placeholders``, ``status``, ``RequestStatus.PREEMPTED``) and a
small scheduler that chunks prefills within a token budget, preempts the
newest running request when blocks run out (resetting its computed tokens to
0, as vLLM does) and, when ``async_scheduling``, schedules with output
placeholders. They need no vLLM. ``make_module()`` returns a fresh module
(fresh classes) so that wrapping in one test never leaks into another.
"""

from __future__ import annotations

import enum
import types
from collections import deque
from dataclasses import dataclass, field

MODULE_NAME = "engine_state_test_doubles.sched.scheduler"


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    WAITING_FOR_STREAMING_REQ = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()


class Request:
    def __init__(self, request_id: str, prompt_len: int, max_tokens: int = 8) -> None:
        self.request_id = request_id
        self.prompt_token_ids = [7] * prompt_len
        self.num_prompt_tokens = prompt_len
        self._output_token_ids: list[int] = []
        self._all_token_ids = list(self.prompt_token_ids)
        self.num_computed_tokens = 0
        self.num_output_placeholders = 0
        self.num_preemptions = 0
        self.is_prefill_chunk = False
        self.status = RequestStatus.WAITING
        self.max_tokens = max_tokens
        self.blocks = 0

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self._output_token_ids)

    def append_output_token_ids(self, token: int) -> None:
        self._output_token_ids.append(token)
        self._all_token_ids.append(token)


class FCFSRequestQueue(deque):
    pass


class BlockPool:
    def __init__(self, num_gpu_blocks: int) -> None:
        self.num_gpu_blocks = num_gpu_blocks  # includes the null block
        self.free = num_gpu_blocks - 1

    def get_num_free_blocks(self) -> int:
        return self.free


class KVCacheManager:
    def __init__(self, block_pool: BlockPool) -> None:
        self.block_pool = block_pool


@dataclass
class ParallelConfig:
    data_parallel_index: int = 0
    data_parallel_size: int = 1


@dataclass
class SchedulerOutput:
    num_scheduled_tokens: dict = field(default_factory=dict)
    preempted_req_ids: set = field(default_factory=set)
    prefill_chunks: set = field(default_factory=set)


def make_module(name: str = MODULE_NAME) -> types.ModuleType:
    """A fresh scheduler module: ``Scheduler``, ``AsyncScheduler``, ``RequestStatus``."""

    class Scheduler:
        def __init__(
            self,
            num_blocks: int = 64,
            block_size: int = 16,
            token_budget: int = 64,
            max_num_seqs: int = 8,
            parallel_config: ParallelConfig | None = None,
        ) -> None:
            self.parallel_config = parallel_config or ParallelConfig()
            self.block_size = block_size
            self.token_budget = token_budget
            self.max_num_seqs = max_num_seqs
            self.waiting = FCFSRequestQueue()
            self.kv_holding_waiting = FCFSRequestQueue()
            self.deferred_waiting: set = set()
            self.running: list[Request] = []
            self.requests: dict[str, Request] = {}
            self._pool = BlockPool(num_blocks)  # its own handle, for the error test
            self.kv_cache_manager = KVCacheManager(self._pool)
            self.shutdown_calls = 0

        # -- vLLM's entry points ------------------------------------------------

        def add_request(self, request: Request) -> None:
            self.requests[request.request_id] = request
            self.waiting.append(request)

        def has_requests(self) -> bool:
            return bool(self.running or self.waiting or self.kv_holding_waiting)

        def get_request_counts(self) -> tuple[int, int]:
            return len(self.running), len(self.waiting) + len(self.kv_holding_waiting)

        def schedule(self) -> SchedulerOutput:
            out = SchedulerOutput()
            budget = self.token_budget
            index = 0
            while index < len(self.running) and budget > 0:
                request = self.running[index]
                todo = request.num_tokens + request.num_output_placeholders
                num_new = min(budget, todo - request.num_computed_tokens)
                if num_new <= 0:
                    index += 1
                    continue
                while not self._allocate(request, request.num_computed_tokens + num_new):
                    victim = self.running.pop()
                    self._preempt(victim, out)
                    if victim is request:
                        break
                else:
                    out.num_scheduled_tokens[request.request_id] = num_new
                    budget -= num_new
                    index += 1
            for queue in (self.kv_holding_waiting, self.waiting):
                while queue and budget > 0 and len(self.running) < self.max_num_seqs:
                    request = queue[0]
                    num_new = min(budget, request.num_tokens - request.num_computed_tokens)
                    if not self._allocate(request, request.num_computed_tokens + num_new):
                        break
                    queue.popleft()
                    request.status = RequestStatus.RUNNING
                    self.running.append(request)
                    out.num_scheduled_tokens[request.request_id] = num_new
                    budget -= num_new
            self._update_after_schedule(out)
            return out

        def _update_after_schedule(self, out: SchedulerOutput) -> None:
            for request_id, num_new in out.num_scheduled_tokens.items():
                request = self.requests[request_id]
                request.num_computed_tokens += num_new
                request.is_prefill_chunk = request.num_computed_tokens < request.num_tokens
                if request.is_prefill_chunk:
                    out.prefill_chunks.add(request_id)

        def update_from_output(self, out: SchedulerOutput, sampled: dict) -> dict:
            """``sampled``: request id -> sampled tokens (empty for a prefill chunk)."""
            outputs = []
            for request_id, tokens in sampled.items():
                request = self.requests.get(request_id)
                if request is None or request.status != RequestStatus.RUNNING:
                    continue  # finished or preempted meanwhile: a stale output
                request.num_output_placeholders = max(
                    0, request.num_output_placeholders - len(tokens)
                )
                for token in tokens:
                    request.append_output_token_ids(token)
                outputs.append((request_id, list(tokens)))
                if request.num_output_tokens >= request.max_tokens:
                    request.status = RequestStatus.FINISHED_LENGTH_CAPPED
                    self.running.remove(request)
                    self._free(request)
            return {0: outputs}

        def finish_requests(self, request_ids, finished_status) -> list:
            finished = []
            for request_id in [request_ids] if isinstance(request_ids, str) else request_ids:
                request = self.requests.get(request_id)
                if request is None or request.status > RequestStatus.PREEMPTED:
                    continue
                for queue in (self.running, self.waiting, self.kv_holding_waiting):
                    if request in queue:
                        queue.remove(request)
                request.status = finished_status
                self._free(request)
                finished.append(request_id)
            return finished

        def shutdown(self) -> None:
            self.shutdown_calls += 1

        # -- helpers --------------------------------------------------------------

        def _allocate(self, request: Request, num_tokens: int) -> bool:
            needed = -(-num_tokens // self.block_size) - request.blocks
            if needed > self._pool.free:
                return False
            if needed > 0:
                self._pool.free -= needed
                request.blocks += needed
            return True

        def _free(self, request: Request) -> None:
            self._pool.free += request.blocks
            request.blocks = 0

        def _preempt(self, request: Request, out: SchedulerOutput) -> None:
            self._free(request)
            request.status = RequestStatus.PREEMPTED
            request.num_computed_tokens = 0
            request.num_output_placeholders = 0
            request.num_preemptions += 1
            request.is_prefill_chunk = False
            out.num_scheduled_tokens.pop(request.request_id, None)
            out.preempted_req_ids.add(request.request_id)
            self.waiting.appendleft(request)

    class AsyncScheduler(Scheduler):
        """Schedules the next step before the last one's output arrives: a
        decoding request gets an output placeholder per scheduled token."""

        def _update_after_schedule(self, out: SchedulerOutput) -> None:
            super()._update_after_schedule(out)
            for request_id in out.num_scheduled_tokens:
                request = self.requests[request_id]
                if not request.is_prefill_chunk:
                    request.num_output_placeholders += 1

    module = types.ModuleType(name)
    module.Scheduler = Scheduler
    module.AsyncScheduler = AsyncScheduler
    module.RequestStatus = RequestStatus
    module.Request = Request
    Scheduler.__module__ = AsyncScheduler.__module__ = name
    return module


def fake_sampled(out: SchedulerOutput, token: int = 100) -> dict:
    """One sampled token per request that finished its prefill, like a model."""
    return {
        request_id: ([] if request_id in out.prefill_chunks else [token])
        for request_id in out.num_scheduled_tokens
    }


def reference_fields(scheduler) -> dict:
    """The snapshot fields (docs/VLLM.md, "What each field means and how the
    hook computes it"), computed in plain Python from the doubles' public
    names (independent of the hook's adapter and of the Rust capture)."""

    def remaining(request) -> int:
        if request.num_output_tokens > 0:
            value = request.num_tokens - 1 - request.num_computed_tokens
        else:
            value = request.num_prompt_tokens - request.num_computed_tokens
        return max(value, 0)

    waiting = list(scheduler.waiting) + list(scheduler.kv_holding_waiting)
    live = list(scheduler.running) + waiting
    pool = scheduler.kv_cache_manager.block_pool
    return dict(
        num_running=len(scheduler.running),
        num_waiting=len(waiting),
        gpu_blocks_total=pool.num_gpu_blocks - 1,
        gpu_blocks_free=pool.get_num_free_blocks(),
        pending_prefill_tokens=sum(remaining(r) for r in live),
        ongoing_decode_tokens=sum(r.num_tokens for r in scheduler.running if remaining(r) == 0),
        num_prefilling=sum(1 for r in scheduler.running if remaining(r) > 0),
        max_prefill_remaining=max((remaining(r) for r in live), default=0),
        num_preempted=sum(1 for r in live if r.status == RequestStatus.PREEMPTED),
    )

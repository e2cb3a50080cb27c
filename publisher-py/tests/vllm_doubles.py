"""Test doubles of vLLM 0.33's V1 scheduler, request and block pool.

They use vLLM 0.33's attribute names (``running``, ``waiting``,
``kv_holding_waiting``, ``kv_cache_manager.block_pool``, ``num_prompt_tokens``,
``num_computed_tokens``, ``_all_token_ids``/``num_tokens``,
``num_output_placeholders``, ``status``, ``RequestStatus.PREEMPTED``) and a
small scheduler that chunks prefills within a token budget, preempts the
newest running request when blocks run out (resetting its computed tokens to
0, as vLLM does) and, when ``async_scheduling``, schedules with output
placeholders. With ``prefix_caching=True`` the scheduler keeps a prefix cache
as vLLM 0.33's ``BlockPool`` does (``CachingBlockPool``: chained block hashes
per request, a cached-hash dict, a free queue whose head is evicted first,
prefix hits on admission). They need no vLLM. ``make_module()`` returns a fresh module
(fresh classes) so that wrapping in one test never leaks into another.
"""

from __future__ import annotations

import enum
import hashlib
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


#: KV block size of the caching doubles' block hashes.
HASH_BLOCK_SIZE = 16


def kv_block_hash(parent: bytes | None, tokens, extra=None) -> bytes:
    """A chained block hash in the spirit of vLLM's (``hash_block_tokens``)."""
    return hashlib.sha256(repr((parent, tuple(tokens), extra)).encode()).digest()


class Request:
    def __init__(
        self,
        request_id: str,
        prompt_len: int,
        max_tokens: int = 8,
        tokens: list | None = None,
        cache_salt: str | None = None,
        lora_request: object = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(tokens) if tokens is not None else [7] * prompt_len
        prompt_len = len(self.prompt_token_ids)
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
        self.cache_salt = cache_salt
        self.lora_request = lora_request
        self.mm_features: list = []
        self.prompt_embeds = None
        self.kv_blocks: list = []  # the caching scheduler's blocks
        self.block_hashes: list[bytes] = []
        self._update_block_hashes()

    def _update_block_hashes(self) -> None:
        n = HASH_BLOCK_SIZE
        while (len(self.block_hashes) + 1) * n <= len(self._all_token_ids):
            i = len(self.block_hashes)
            parent = self.block_hashes[-1] if self.block_hashes else None
            extra = (self.cache_salt,) if i == 0 and self.cache_salt else None
            if self.lora_request is not None:
                extra = (extra, self.lora_request)
            self.block_hashes.append(
                kv_block_hash(parent, self._all_token_ids[i * n : (i + 1) * n], extra)
            )

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self._output_token_ids)

    def append_output_token_ids(self, token: int) -> None:
        self._output_token_ids.append(token)
        self._all_token_ids.append(token)
        self._update_block_hashes()


class FCFSRequestQueue(deque):
    pass


class BlockPool:
    def __init__(self, num_gpu_blocks: int) -> None:
        self.num_gpu_blocks = num_gpu_blocks  # includes the null block
        self.free = num_gpu_blocks - 1

    def get_num_free_blocks(self) -> int:
        return self.free


class KVCacheManager:
    def __init__(self, block_pool, enable_caching: bool = False, groups: int = 1) -> None:
        self.block_pool = block_pool
        self.enable_caching = enable_caching
        self.num_kv_cache_groups = groups


class KVCacheBlock:
    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self._block_hash: bytes | None = None
        self.prev_free_block: KVCacheBlock | None = None
        self.next_free_block: KVCacheBlock | None = None


class FreeKVCacheBlockQueue:
    """A doubly linked list between two fake blocks; the head is taken first."""

    def __init__(self, blocks: list) -> None:
        self.fake_free_list_head = KVCacheBlock(-1)
        self.fake_free_list_tail = KVCacheBlock(-1)
        self.fake_free_list_head.next_free_block = self.fake_free_list_tail
        self.fake_free_list_tail.prev_free_block = self.fake_free_list_head
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    def append(self, block) -> None:
        last = self.fake_free_list_tail.prev_free_block
        last.next_free_block = block
        block.prev_free_block = last
        block.next_free_block = self.fake_free_list_tail
        self.fake_free_list_tail.prev_free_block = block
        self.num_free_blocks += 1

    def remove(self, block) -> None:
        block.prev_free_block.next_free_block = block.next_free_block
        block.next_free_block.prev_free_block = block.prev_free_block
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def popleft(self):
        block = self.fake_free_list_head.next_free_block
        self.remove(block)
        return block


class BlockHashToBlockMap:
    def __init__(self) -> None:
        self._cache: dict = {}


GROUP_0 = (0).to_bytes(4, "big")


class CachingBlockPool:
    """vLLM 0.33's ``BlockPool`` as the hook sees it: ``cached_block_hash_to_block.
    _cache`` maps block hash + group id to a block; ``get_new_blocks`` takes
    blocks from the free queue's head and evicts what they cached; freed
    blocks go to the tail (a request's last block first)."""

    def __init__(self, num_gpu_blocks: int, hash_block_size: int = HASH_BLOCK_SIZE) -> None:
        self.num_gpu_blocks = num_gpu_blocks
        self.hash_block_size = hash_block_size
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.null_block = self.free_block_queue.popleft()
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        self.evictions = 0

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_new_blocks(self, num_blocks: int) -> list:
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        taken = []
        for _ in range(num_blocks):
            block = self.free_block_queue.popleft()
            self._evict(block)
            block.ref_cnt = 1
            taken.append(block)
        return taken

    def _evict(self, block) -> None:
        if block._block_hash is not None:
            cache = self.cached_block_hash_to_block._cache
            if cache.get(block._block_hash) is block:
                del cache[block._block_hash]
            block._block_hash = None
            self.evictions += 1

    def evict_blocks(self, block_ids) -> None:
        for block_id in block_ids:
            self._evict(self.blocks[block_id])

    def touch(self, blocks) -> None:
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks) -> None:
        for block in ordered_blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_block_queue.append(block)

    def cache_block(self, block, block_hash: bytes) -> None:
        key = block_hash + GROUP_0
        if block._block_hash is None:
            block._block_hash = key
            self.cached_block_hash_to_block._cache.setdefault(key, block)

    def reset_prefix_cache(self) -> bool:
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        for block in self.blocks:
            block._block_hash = None
        return True


@dataclass
class ParallelConfig:
    data_parallel_index: int = 0
    data_parallel_size: int = 1


@dataclass
class NewRequestData:
    req_id: str


@dataclass
class SchedulerOutput:
    num_scheduled_tokens: dict = field(default_factory=dict)
    scheduled_new_reqs: list = field(default_factory=list)
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
            prefix_caching: bool = False,
            groups: int = 1,
        ) -> None:
            self.parallel_config = parallel_config or ParallelConfig()
            self.block_size = block_size
            self.hash_block_size = block_size
            self.prefix_caching = prefix_caching
            self.token_budget = token_budget
            self.max_num_seqs = max_num_seqs
            self.waiting = FCFSRequestQueue()
            self.kv_holding_waiting = FCFSRequestQueue()
            self.deferred_waiting: set = set()
            self.running: list[Request] = []
            self.requests: dict[str, Request] = {}
            if prefix_caching:
                self._pool = CachingBlockPool(num_blocks, block_size)
            else:
                self._pool = BlockPool(num_blocks)  # its own handle, for the error test
            self.kv_cache_manager = KVCacheManager(self._pool, prefix_caching, groups)
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
                    if self.prefix_caching and request.num_computed_tokens == 0:
                        self._prefix_hit(request)
                    num_new = min(budget, request.num_tokens - request.num_computed_tokens)
                    if not self._allocate(request, request.num_computed_tokens + num_new):
                        if self.prefix_caching:  # the hit is applied on admission only
                            self._free(request)
                            request.num_computed_tokens = 0
                        break
                    queue.popleft()
                    out.scheduled_new_reqs.append(NewRequestData(request.request_id))
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

        def _prefix_hit(self, request: Request) -> None:
            """vLLM's lookup: the leading blocks whose hashes are cached, at
            most ``num_tokens - 1`` tokens."""
            cache = self._pool.cached_block_hash_to_block._cache
            hits = []
            limit = (request.num_tokens - 1) // self.block_size
            for block_hash in request.block_hashes[:limit]:
                block = cache.get(block_hash + GROUP_0)
                if block is None:
                    break
                hits.append(block)
            self._pool.touch(hits)
            request.kv_blocks = hits
            request.num_computed_tokens = len(hits) * self.block_size

        def _allocate(self, request: Request, num_tokens: int) -> bool:
            if self.prefix_caching:
                needed = -(-num_tokens // self.block_size) - len(request.kv_blocks)
                if needed > self._pool.get_num_free_blocks():
                    return False
                if needed > 0:
                    request.kv_blocks += self._pool.get_new_blocks(needed)
                full = min(num_tokens, request.num_tokens) // self.block_size
                for i in range(min(full, len(request.block_hashes))):
                    self._pool.cache_block(request.kv_blocks[i], request.block_hashes[i])
                return True
            needed = -(-num_tokens // self.block_size) - request.blocks
            if needed > self._pool.free:
                return False
            if needed > 0:
                self._pool.free -= needed
                request.blocks += needed
            return True

        def _free(self, request: Request) -> None:
            if self.prefix_caching:
                self._pool.free_blocks(reversed(request.kv_blocks))
                request.kv_blocks = []
                return
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

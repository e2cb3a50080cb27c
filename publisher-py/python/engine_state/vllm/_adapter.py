"""Every vLLM name the engine-state hook touches, and nothing else.

Read from vLLM 0.33.0 (the PyPI wheel), files inside the ``vllm`` package:

- ``v1/core/sched/scheduler.py``: ``class Scheduler`` with
  ``running: list[Request]``; ``waiting`` and ``kv_holding_waiting``
  (``RequestQueue``: FCFS deque or priority heap, iterable, ``len``; a waiting
  request is in exactly one of them -- ``deferred_waiting`` is a subset of the
  two and is not read); ``kv_cache_manager.block_pool``; ``parallel_config``.
  The module imports ``RequestStatus`` from ``v1/request.py``.
  ``EngineCore`` (``v1/engine/core.py``) calls ``schedule()`` then
  ``update_from_output()`` on its busy-loop thread, ``finish_requests()`` for
  aborts on the same thread, and ``shutdown()`` at teardown.
  ``requests`` (id -> Request); ``reset_preempted_req_ids`` (ids preempted
  since the last ``schedule()``, handed to the next ``SchedulerOutput``);
  ``connector``, ``ec_connector``, ``aux_output_connector`` (None unless a
  KV / encoder-cache / aux-output connector is configured).
- ``v1/core/sched/request_queue.py``: ``PriorityRequestQueue`` keeps its
  requests in the list ``_heap``; its ``__iter__`` pops a copy of the heap
  (every comparison reads two requests), so the hook walks ``_heap`` instead
  (the sums do not depend on order). ``FCFSRequestQueue`` is a ``deque``.
- ``v1/core/sched/output.py``: ``SchedulerOutput.preempted_req_ids`` (the
  ids preempted in or since the previous ``schedule()``);
  ``scheduled_new_reqs`` (``NewRequestData`` with ``req_id``) and
  ``scheduled_cached_reqs.resumed_req_ids``: every request ``schedule()``
  moved from a waiting queue to ``running`` (the only way into ``running``).
- ``v1/core/block_pool.py``: ``BlockPool.num_gpu_blocks`` counts the null
  block 0 too; ``get_num_free_blocks()`` (free + evictable cached blocks) only
  reads a counter.
- ``v1/request.py``: ``Request.num_prompt_tokens``, ``num_computed_tokens``,
  ``status`` are plain attributes; ``num_tokens`` is the property
  ``len(self._all_token_ids)`` (prompt + output tokens). The hook reads the
  list's length directly -- no Python call per request -- and checks once per
  engine that it equals ``num_tokens`` (see ``tokens_from_list_matches``).
- Cache residency (docs/VLLM.md, "Cache residency"), from
  ``v1/core/kv_cache_manager.py``, ``block_pool.py``, ``kv_cache_utils.py``:
  ``KVCacheManager.enable_caching`` and ``num_kv_cache_groups``;
  ``Scheduler.block_size`` and ``hash_block_size`` (one group: equal, the
  granularity of ``Request.block_hashes``); ``Request.block_hashes`` (one
  ``bytes`` hash per full KV block, each chained over the whole prefix,
  extended as tokens arrive); ``BlockPool.cached_block_hash_to_block``
  (``BlockHashToBlockMap``) whose dict ``_cache`` is keyed by
  ``make_block_hash_with_group_id(hash, group)`` = hash + the group id in 4
  big-endian bytes, holding exactly the blocks a prefix lookup can find;
  ``reset_prefix_cache`` replaces the map object. Evictions happen in
  ``BlockPool.get_new_blocks(n)`` (the ``n`` blocks at the head of
  ``free_block_queue``, from ``fake_free_list_head.next_free_block`` along
  ``next_free_block``, lose their ``_block_hash``) and ``evict_blocks``
  (connectors). Requests whose KV is not keyed by tokens alone carry
  ``lora_request``, ``mm_features``, ``cache_salt`` or ``prompt_embeds``
  (``generate_block_hash_extra_keys``).
- ``config/parallel.py``: ``ParallelConfig.data_parallel_index`` (the
  engine's index, = the Prometheus ``engine`` label; not
  ``data_parallel_rank``, which dense models reset to 0) and
  ``data_parallel_size``.

Never call ``kv_cache_manager.make_prefix_cache_stats()``: it resets the
numbers vLLM exports to Prometheus. Nothing here calls a method that changes
vLLM's state.

On a vLLM version other than the ones in ``TESTED_VLLM_VERSIONS`` the hook
still runs (a missing name turns it off with a logged reason) but warns once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from engine_state._native import BLOCK_TOKENS

logger = logging.getLogger("engine_state.vllm")

#: vLLM versions this module was read from and the contract test runs against.
TESTED_VLLM_VERSIONS = ("0.33.0",)

#: The module and class whose methods the hook wraps (subclasses such as
#: ``AsyncScheduler`` inherit the wrapped methods).
SCHEDULER_MODULE = "vllm.v1.core.sched.scheduler"
SCHEDULER_CLASS = "Scheduler"
#: ``AsyncScheduler`` (``v1/core/sched/async_scheduler.py``) overrides only
#: ``__init__`` (calling ``super().__init__``) and ``_update_after_schedule``.
ASYNC_SCHEDULER_MODULE = "vllm.v1.core.sched.async_scheduler"
ASYNC_SCHEDULER_CLASS = "AsyncScheduler"

#: Scheduler methods the hook wraps, in the order of a request's life.
INIT = "__init__"
SCHEDULE = "schedule"
UPDATE_FROM_OUTPUT = "update_from_output"
FINISH_REQUESTS = "finish_requests"
SHUTDOWN = "shutdown"

# Scheduler attributes.
RUNNING = "running"
WAITING = "waiting"
KV_HOLDING_WAITING = "kv_holding_waiting"
KV_CACHE_MANAGER = "kv_cache_manager"
BLOCK_POOL = "block_pool"
NUM_GPU_BLOCKS = "num_gpu_blocks"
GET_NUM_FREE_BLOCKS = "get_num_free_blocks"
PARALLEL_CONFIG = "parallel_config"
DATA_PARALLEL_INDEX = "data_parallel_index"
DATA_PARALLEL_SIZE = "data_parallel_size"

REQUESTS = "requests"
RESET_PREEMPTED_REQ_IDS = "reset_preempted_req_ids"
CONNECTORS = ("connector", "ec_connector", "aux_output_connector")
PRIORITY_HEAP = "_heap"  # PriorityRequestQueue's list

# SchedulerOutput attributes.
PREEMPTED_REQ_IDS = "preempted_req_ids"
SCHEDULED_NEW_REQS = "scheduled_new_reqs"  # of NewRequestData
REQ_ID = "req_id"  # NewRequestData's
SCHEDULED_CACHED_REQS = "scheduled_cached_reqs"
RESUMED_REQ_IDS = "resumed_req_ids"  # CachedRequestData's

# Request attributes.
NUM_PROMPT_TOKENS = "num_prompt_tokens"
NUM_COMPUTED_TOKENS = "num_computed_tokens"
ALL_TOKEN_IDS = "_all_token_ids"  # len() == num_tokens
NUM_TOKENS = "num_tokens"
STATUS = "status"
REQUEST_STATUS = "RequestStatus"  # the enum, as imported by SCHEDULER_MODULE
PREEMPTED = "PREEMPTED"

# Cache residency.
ENABLE_CACHING = "enable_caching"  # KVCacheManager's
NUM_KV_CACHE_GROUPS = "num_kv_cache_groups"  # KVCacheManager's
SCHEDULER_BLOCK_SIZE = "block_size"  # Scheduler's
HASH_BLOCK_SIZE = "hash_block_size"  # Scheduler's
CACHED_BLOCK_MAP = "cached_block_hash_to_block"  # BlockPool's
CACHED_BLOCK_DICT = "_cache"  # BlockHashToBlockMap's
FREE_BLOCK_QUEUE = "free_block_queue"  # BlockPool's
FREE_LIST_HEAD = "fake_free_list_head"  # FreeKVCacheBlockQueue's
NEXT_FREE_BLOCK = "next_free_block"  # KVCacheBlock's
BLOCK_HASH_KEY = "_block_hash"  # KVCacheBlock's: its cached-map key, or None
GET_NEW_BLOCKS = "get_new_blocks"  # BlockPool's
EVICT_BLOCKS = "evict_blocks"  # BlockPool's
BLOCK_HASHES = "block_hashes"  # Request's
#: Request attributes that key its KV by more than tokens (None or empty: not).
NAMESPACE_ATTRS = ("lora_request", "mm_features", "cache_salt", "prompt_embeds")
#: The suffix ``make_block_hash_with_group_id`` appends for group 0.
GROUP_0_SUFFIX = (0).to_bytes(4, "big", signed=False)

_EMPTY: tuple = ()


def vllm_version() -> str | None:
    """The installed vLLM's version, or None when it cannot be read."""
    import sys

    vllm = sys.modules.get("vllm")
    version = getattr(vllm, "__version__", None)
    if isinstance(version, str):
        return version
    try:
        from importlib.metadata import version as dist_version

        return dist_version("vllm")
    except Exception:
        return None


def check_version() -> bool:
    """True on a tested vLLM version; otherwise warns (the caller warns once)."""
    version = vllm_version()
    if version in TESTED_VLLM_VERSIONS:
        return True
    logger.warning(
        "engine-state: vLLM %s is untested (the hook was read from vLLM %s); it keeps "
        "running and turns itself off if a scheduler attribute it reads is missing",
        version or "(unknown version)",
        ", ".join(TESTED_VLLM_VERSIONS),
    )
    return False


def scheduler_class(module: Any) -> type:
    """The base scheduler class of the (already imported) scheduler module."""
    return getattr(module, SCHEDULER_CLASS)


def preempted_status(module: Any) -> Any:
    """``RequestStatus.PREEMPTED``, as seen by the scheduler module."""
    return getattr(getattr(module, REQUEST_STATUS), PREEMPTED)


def running(scheduler: Any) -> Sequence[Any]:
    """The running requests (a list)."""
    return getattr(scheduler, RUNNING)


def queue_items(queue: Any) -> Any:
    """What to iterate for a waiting queue's requests, in any order: a
    priority queue's heap list, otherwise the queue itself."""
    heap = getattr(queue, PRIORITY_HEAP, None)
    return heap if isinstance(heap, list) else queue


def waiting_queues(scheduler: Any) -> list:
    """The waiting queues; together they hold every waiting request once.
    (vLLM before ``kv_holding_waiting`` existed had only ``waiting``.)"""
    return [cached_waiting_queue(scheduler), *read_waiting_queues(scheduler)]


def cached_waiting_queue(scheduler: Any) -> Any:
    """The waiting queue whose requests the incremental capture may cache
    (``waiting``; see docs/VLLM.md, "What the capture caches")."""
    return queue_items(getattr(scheduler, WAITING))


def read_waiting_queues(scheduler: Any) -> list:
    """The waiting queues read in full at every capture
    (``kv_holding_waiting``: remote-KV loads, streaming sessions)."""
    return [queue_items(getattr(scheduler, KV_HOLDING_WAITING, _EMPTY))]


def preempted_in(output: Any) -> Any:
    """The request ids a ``SchedulerOutput`` reports preempted (may be empty
    or None)."""
    return getattr(output, PREEMPTED_REQ_IDS, None)


def admitted_in(output: Any) -> list:
    """The ids of the requests a ``SchedulerOutput`` reports moved from a
    waiting queue to ``running`` (new and resumed)."""
    new = getattr(output, SCHEDULED_NEW_REQS, None)
    resumed = getattr(getattr(output, SCHEDULED_CACHED_REQS, None), RESUMED_REQ_IDS, None)
    if not new and not resumed:
        return []
    return [getattr(data, REQ_ID) for data in new or ()] + list(resumed or ())


def preempted_since_schedule(scheduler: Any) -> Any:
    """Ids preempted since the last ``schedule()`` (``reset_prefix_cache``);
    the next ``SchedulerOutput`` reports them too."""
    return getattr(scheduler, RESET_PREEMPTED_REQ_IDS, None)


def requests_by_id(scheduler: Any) -> Any:
    """The scheduler's ``requests`` dict (id -> Request)."""
    return getattr(scheduler, REQUESTS)


def waiting_cache_safe(scheduler: Any) -> bool:
    """True when no connector is configured. Connectors run their own code on
    waiting requests (NIXL's scheduler trims ``_all_token_ids``) and move them
    between the two waiting queues (remote-KV loads, failed loads, invalid
    blocks), which the hook cannot observe; with one the hook reads every
    request at every capture."""
    return all(getattr(scheduler, name, None) is None for name in CONNECTORS)


def has_requests(scheduler: Any) -> bool:
    """True when a request is running or waiting; three ``len()`` calls."""
    return bool(
        len(getattr(scheduler, RUNNING))
        or len(getattr(scheduler, WAITING))
        or len(getattr(scheduler, KV_HOLDING_WAITING, _EMPTY))
    )


def block_counts(scheduler: Any) -> tuple[int, int]:
    """(usable KV blocks, free KV blocks); the null block is not usable.

    Free is clamped to usable: ``num_gpu_blocks`` counts the null block and
    vLLM 0.33 takes it out of the free queue, but a vLLM that counts it as
    free too (free = usable + 1 on an empty engine) would make every
    ``publish()`` fail its free <= total check and turn the hook off; one
    block of ~thousands is not worth that.
    """
    pool = getattr(getattr(scheduler, KV_CACHE_MANAGER), BLOCK_POOL)
    total = max(int(getattr(pool, NUM_GPU_BLOCKS)) - 1, 0)
    free = int(getattr(pool, GET_NUM_FREE_BLOCKS)())
    return total, min(max(free, 0), total)


def data_parallel(scheduler: Any) -> tuple[int, int]:
    """(data_parallel_index, data_parallel_size) of the scheduler's engine."""
    config = getattr(scheduler, PARALLEL_CONFIG)
    index = getattr(config, DATA_PARALLEL_INDEX, 0) or 0
    size = getattr(config, DATA_PARALLEL_SIZE, 1) or 1
    return int(index), int(size)


def request_capture_names(tokens_from_list: bool) -> dict:
    """Keyword arguments for ``engine_state._native._RequestCapture`` (minus the
    status value): the request attribute names, in one place."""
    return dict(
        prompt_attr=NUM_PROMPT_TOKENS,
        computed_attr=NUM_COMPUTED_TOKENS,
        tokens_attr=ALL_TOKEN_IDS if tokens_from_list else NUM_TOKENS,
        tokens_is_sequence=tokens_from_list,
        status_attr=STATUS,
    )


def tokens_from_list_matches(request: Any) -> bool:
    """True when ``len(request._all_token_ids) == request.num_tokens`` -- the
    shortcut the capture takes is valid for this vLLM."""
    tokens = getattr(request, ALL_TOKEN_IDS, None)
    return tokens is not None and len(tokens) == getattr(request, NUM_TOKENS)


NO_PREFIX_CACHING = "prefix caching is off"


def residency_block_size(scheduler: Any) -> tuple[int | None, str]:
    """(the engine's KV block size, "") when its cache residency can be
    tracked; otherwise (None, why not)."""
    manager = getattr(scheduler, KV_CACHE_MANAGER)
    if not getattr(manager, ENABLE_CACHING, False):
        return None, NO_PREFIX_CACHING
    groups = getattr(manager, NUM_KV_CACHE_GROUPS, None)
    if groups != 1:
        return None, f"its KV cache has {groups} groups (a hybrid model)"
    block_size = int(getattr(scheduler, SCHEDULER_BLOCK_SIZE))
    hash_block_size = int(getattr(scheduler, HASH_BLOCK_SIZE, block_size))
    if hash_block_size != block_size:
        return None, f"its block hashes cover {hash_block_size} tokens, its KV blocks {block_size}"
    if block_size <= 0 or BLOCK_TOKENS % block_size:
        return None, f"its KV block size ({block_size} tokens) does not divide {BLOCK_TOKENS}"
    if not isinstance(cached_block_map(scheduler), dict):
        return None, "its block pool has no cached-hash dict"
    return block_size, ""


def residency_tracker_names() -> dict:
    """Keyword arguments for ``engine_state._native._ResidencyTracker``
    (minus the block size and the mode): the names, in one place."""
    return dict(
        group_suffix=GROUP_0_SUFFIX,
        block_hashes_attr=BLOCK_HASHES,
        tokens_attr=ALL_TOKEN_IDS,
        computed_attr=NUM_COMPUTED_TOKENS,
        namespace_attrs=list(NAMESPACE_ATTRS),
        next_attr=NEXT_FREE_BLOCK,
        hash_attr=BLOCK_HASH_KEY,
    )


def block_pool(scheduler: Any) -> Any:
    """The scheduler's block pool."""
    return getattr(getattr(scheduler, KV_CACHE_MANAGER), BLOCK_POOL)


def cached_block_map(scheduler: Any) -> Any:
    """The block pool's cached-hash dict (key: block hash + group id)."""
    return getattr(getattr(block_pool(scheduler), CACHED_BLOCK_MAP), CACHED_BLOCK_DICT)


def first_free_block(pool: Any) -> Any:
    """The block ``get_new_blocks`` takes first (the free queue's head)."""
    return getattr(getattr(getattr(pool, FREE_BLOCK_QUEUE), FREE_LIST_HEAD), NEXT_FREE_BLOCK)

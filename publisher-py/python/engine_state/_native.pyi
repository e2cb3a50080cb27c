"""Type stubs of the compiled module (checked against it by tests/test_stubs.py and by
mypy's stubtest in `make lint`)."""

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, TypedDict, final

__all__ = [
    "BLOCK_TOKENS",
    "Decision",
    "EngineIdInUse",
    "EngineState",
    "EngineStateError",
    "FIELD_NAMES",
    "FLAG_IDLE",
    "FLAG_SHUTTING_DOWN",
    "JSON_KEYS",
    "LAYOUT_VERSION",
    "Publisher",
    "Reader",
    "Reservation",
    "Router",
    "__version__",
    "block_hashes",
    "default_cache_capacity",
]

BLOCK_TOKENS: int
FIELD_NAMES: list[str]
FLAG_IDLE: int
FLAG_SHUTTING_DOWN: int
JSON_KEYS: list[str]
LAYOUT_VERSION: int
__version__: str

class EngineStateError(Exception): ...
class EngineIdInUse(EngineStateError): ...

# What Publisher.stats() returns: every key on both backends, 0 where it does
# not apply (stub-only name; tests/test_stubs.py checks the keys).
_PublisherStats = TypedDict(
    "_PublisherStats",
    {
        "files_lost": int,
        "files_recreated": int,
        "written": int,
        "replaced": int,
        "errors": int,
        "refused": int,
        "registry_errors": int,
    },
)

@final
class Publisher:
    def __new__(
        cls,
        uri: str | None = None,
        engine_id: str | None = None,
        period_ms: int | None = None,
        file_mode: int | None = None,
    ) -> Publisher: ...
    def publish(
        self,
        *,
        step: int = 0,
        num_running: int = 0,
        num_waiting: int = 0,
        gpu_blocks_total: int = 0,
        gpu_blocks_free: int = 0,
        pending_prefill_tokens: int = 0,
        ongoing_decode_tokens: int = 0,
        num_prefilling: int = 0,
        max_prefill_remaining: int = 0,
        num_preempted: int = 0,
        flags: int = 0,
    ) -> None: ...
    def publish_cache(
        self, blocks: Sequence[int], held: int, capacity: int, kv_block_size: int | None = None
    ) -> bool: ...
    def stats(self) -> _PublisherStats: ...
    def close(self) -> None: ...
    @property
    def engine_id(self) -> str: ...
    @property
    def uri(self) -> str: ...
    @property
    def path(self) -> str | None: ...
    @property
    def period_ms(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    def __enter__(self) -> Publisher: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> bool: ...

@final
class EngineState:
    engine_id: str
    status: str
    captured_mono_ns: int
    captured_unix_ns: int
    step: int
    num_running: int
    num_waiting: int
    gpu_blocks_total: int
    gpu_blocks_free: int
    pending_prefill_tokens: int
    ongoing_decode_tokens: int
    num_prefilling: int
    max_prefill_remaining: int
    num_preempted: int
    flags: int
    cache_blocks: int
    cache_version: int
    heartbeat_age_ms: float
    capture_age_ms: float
    gpu_kv_used_frac: float | None
    generation: int
    @property
    def fresh(self) -> bool: ...
    def to_dict(self) -> dict[str, object]: ...

@final
class Reader:
    def __new__(
        cls,
        uri: str | None = None,
        stale_after_ms: int | None = None,
        max_capture_age_ms: int | None = None,
        *,
        cache_digests: bool = False,
    ) -> Reader: ...
    def read(self) -> list[EngineState]: ...
    def read_cache(self, engine_id: str) -> list[int] | None: ...
    @property
    def errors(self) -> list[str]: ...
    @property
    def uri(self) -> str: ...

def block_hashes(tokens: Sequence[int]) -> list[int]: ...
def default_cache_capacity(gpu_blocks_total: int, kv_block_size: int) -> int: ...

@final
class Decision:
    request_id: str
    session_id: str | None
    instance_id: str
    reason: str
    input_len: int
    cache_hit_tokens: int
    cache_knowledge: str
    new_prefill_tokens: int
    consulted_real_state: bool

@final
class Reservation:
    def prefill_done(self) -> None: ...
    def complete(self) -> None: ...
    def fail(self) -> None: ...
    @property
    def instance_id(self) -> str: ...
    @property
    def router_id(self) -> int: ...
    @property
    def released(self) -> bool: ...
    def __enter__(self) -> Reservation: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None = None,
        _exc_value: BaseException | None = None,
        _traceback: TracebackType | None = None,
    ) -> bool: ...

@final
class Router:
    def __new__(
        cls,
        instances: Sequence[str],
        *,
        policy: str | None = None,
        settings: dict[str, Any] | None = None,
        decision_log: str | None = None,
    ) -> Router: ...
    @property
    def id(self) -> int: ...
    def pick(
        self,
        request_id: str,
        *,
        tokens: Sequence[int] | None = None,
        block_hashes: Sequence[int] | None = None,
        input_len: int | None = None,
        session_id: str | None = None,
    ) -> tuple[Decision, Reservation]: ...
    def update_real_state(self, states: Sequence[EngineState]) -> int: ...
    def share_reservations(self, replica_id: str, uri: str | None = None) -> None: ...
    def update_peers(self) -> int: ...
    def peer_errors(self) -> list[str]: ...
    def sharing_stats(self) -> dict[str, Any] | None: ...
    def stop_sharing(self) -> None: ...
    # Raises ValueError while a reservation for request_id is live on source:
    # ask migration_advice_for(reservation, ...) for a reserved request.
    def migration_advice(
        self,
        source: str,
        request_id: str,
        *,
        tokens: Sequence[int] | None = None,
        block_hashes: Sequence[int] | None = None,
        input_len: int | None = None,
        session_id: str | None = None,
    ) -> dict[str, Any]: ...
    def migration_advice_for(
        self,
        reservation: Reservation,
        request_id: str,
        *,
        tokens: Sequence[int] | None = None,
        block_hashes: Sequence[int] | None = None,
        input_len: int | None = None,
        session_id: str | None = None,
    ) -> dict[str, Any]: ...
    def migrate(
        self,
        reservation: Reservation,
        request_id: str,
        *,
        tokens: Sequence[int] | None = None,
        block_hashes: Sequence[int] | None = None,
        input_len: int | None = None,
        session_id: str | None = None,
    ) -> Decision | None: ...
    def add_instance(self, instance_id: str) -> None: ...
    def remove_instance(self, instance_id: str) -> None: ...
    def end_session(self, session_id: str) -> bool: ...
    def instances(self) -> list[dict[str, Any]]: ...
    def stats(self) -> dict[str, int]: ...
    def settings(self) -> dict[str, Any]: ...

# The vLLM hook's engine id and capture (engine_state.vllm), internal: not part of the API.

def _engine_id_for(
    dp_index: int,
    dp_size: int,
    environ: Mapping[str, str] | None = None,
    hostname: str | None = None,
    pid: int | None = None,
) -> str: ...
def _fallback_engine_id(engine_id: str, pid: int | None = None) -> str: ...

@final
class _RequestTotals:
    num_running: int
    num_waiting: int
    pending_prefill_tokens: int
    ongoing_decode_tokens: int
    num_prefilling: int
    max_prefill_remaining: int
    num_preempted: int
    def publish(
        self,
        publisher: Publisher,
        *,
        step: int,
        gpu_blocks_total: int,
        gpu_blocks_free: int,
        flags: int,
    ) -> None: ...
    @property
    def busy(self) -> bool: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __len__(self) -> int: ...
    def __getitem__(self, index: int, /) -> int: ...

@final
class _RequestCapture:
    def __new__(
        cls,
        *,
        prompt_attr: str,
        computed_attr: str,
        tokens_attr: str,
        tokens_is_sequence: bool,
        status_attr: str,
        preempted_status: object,
    ) -> _RequestCapture: ...
    def capture(self, running: object, waiting_queues: list[object]) -> _RequestTotals: ...
    def remaining_prefill(self, request: object) -> int: ...

@final
class _IncrementalCapture:
    def __new__(
        cls,
        *,
        prompt_attr: str,
        computed_attr: str,
        tokens_attr: str,
        tokens_is_sequence: bool,
        status_attr: str,
        preempted_status: object,
    ) -> _IncrementalCapture: ...
    def capture(
        self, running: object, read_queues: list[object], cached_queue: object
    ) -> _RequestTotals: ...
    def recount(
        self, running: object, read_queues: list[object], cached_queue: object
    ) -> tuple[_RequestTotals, _RequestTotals]: ...
    def mark_volatile(self, request: object) -> None: ...
    def forget_running(self, requests: list[object]) -> None: ...
    def clear(self) -> None: ...
    @property
    def num_cached(self) -> int: ...
    @property
    def num_volatile(self) -> int: ...
    @property
    def last_reads(self) -> int: ...

@final
class _ResidencyTracker:
    def __new__(
        cls,
        *,
        kv_block_size: int,
        group_suffix: bytes,
        mode: str,
        block_hashes_attr: str,
        tokens_attr: str,
        computed_attr: str,
        namespace_attrs: list[str],
        next_attr: str,
        hash_attr: str,
    ) -> _ResidencyTracker: ...
    def note(self, requests: object) -> None: ...
    def note_allocation(self, first: object, count: int) -> None: ...
    def note_all_suspect(self) -> None: ...
    def capture(
        self, running: object, cached: dict, reads: _IncrementalCapture | None = None
    ) -> bool: ...
    def blocks(self, capacity: int | None = None) -> list[int]: ...
    def publish(self, publisher: Publisher, capacity: int) -> bool: ...
    def clear(self) -> None: ...
    @property
    def held(self) -> int: ...
    @property
    def entries(self) -> int: ...
    @property
    def changed(self) -> bool: ...
    @property
    def hash_calls(self) -> int: ...
    @property
    def adopted(self) -> int: ...
    @property
    def lookups(self) -> int: ...
    @property
    def full_scans(self) -> int: ...
    @property
    def followed(self) -> int: ...
    @property
    def kv_block_size(self) -> int: ...

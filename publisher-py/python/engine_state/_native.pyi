"""Type stubs of the compiled module (checked against it by tests/test_stubs.py)."""

from types import TracebackType
from typing import Any, Optional, Sequence, Type, TypedDict

FIELD_NAMES: list[str]
FLAG_IDLE: int
FLAG_SHUTTING_DOWN: int
JSON_KEYS: list[str]
LAYOUT_VERSION: int
__version__: str

class EngineStateError(Exception): ...

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

class Publisher:
    def __init__(
        self,
        uri: Optional[str] = None,
        engine_id: Optional[str] = None,
        period_ms: Optional[int] = None,
        file_mode: Optional[int] = None,
    ) -> None: ...
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
    def stats(self) -> _PublisherStats: ...
    def close(self) -> None: ...
    @property
    def engine_id(self) -> str: ...
    @property
    def uri(self) -> str: ...
    @property
    def path(self) -> Optional[str]: ...
    @property
    def period_ms(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    def __enter__(self) -> "Publisher": ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]] = None,
        exc_value: Optional[BaseException] = None,
        traceback: Optional[TracebackType] = None,
    ) -> bool: ...

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
    heartbeat_age_ms: float
    capture_age_ms: float
    gpu_kv_used_frac: Optional[float]
    generation: int
    @property
    def fresh(self) -> bool: ...
    def to_dict(self) -> dict[str, object]: ...

class Reader:
    def __init__(
        self,
        uri: Optional[str] = None,
        stale_after_ms: Optional[int] = None,
        max_capture_age_ms: Optional[int] = None,
    ) -> None: ...
    def read(self) -> list[EngineState]: ...
    @property
    def errors(self) -> list[str]: ...
    @property
    def uri(self) -> str: ...

def block_hashes(tokens: Sequence[int]) -> list[int]: ...

class Decision:
    request_id: str
    session_id: Optional[str]
    instance_id: str
    reason: str
    input_len: int
    cache_hit_tokens: int
    new_prefill_tokens: int
    consulted_real_state: bool

class Reservation:
    def prefill_done(self) -> None: ...
    def complete(self) -> None: ...
    def fail(self) -> None: ...
    @property
    def instance_id(self) -> str: ...
    @property
    def released(self) -> bool: ...
    def __enter__(self) -> "Reservation": ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]] = None,
        _exc_value: Optional[BaseException] = None,
        _traceback: Optional[TracebackType] = None,
    ) -> bool: ...

class Router:
    def __init__(
        self,
        instances: Sequence[str],
        *,
        policy: Optional[str] = None,
        settings: Optional[dict[str, Any]] = None,
        decision_log: Optional[str] = None,
    ) -> None: ...
    def pick(
        self,
        request_id: str,
        *,
        tokens: Optional[Sequence[int]] = None,
        block_hashes: Optional[Sequence[int]] = None,
        input_len: Optional[int] = None,
        session_id: Optional[str] = None,
    ) -> tuple[Decision, Reservation]: ...
    def update_real_state(self, states: Sequence[EngineState]) -> int: ...
    def migration_advice(
        self,
        source: str,
        request_id: str,
        *,
        tokens: Optional[Sequence[int]] = None,
        block_hashes: Optional[Sequence[int]] = None,
        input_len: Optional[int] = None,
        session_id: Optional[str] = None,
    ) -> dict[str, Any]: ...
    def migration_advice_for(
        self,
        reservation: Reservation,
        request_id: str,
        *,
        tokens: Optional[Sequence[int]] = None,
        block_hashes: Optional[Sequence[int]] = None,
        input_len: Optional[int] = None,
        session_id: Optional[str] = None,
    ) -> dict[str, Any]: ...
    def migrate(
        self,
        reservation: Reservation,
        request_id: str,
        *,
        tokens: Optional[Sequence[int]] = None,
        block_hashes: Optional[Sequence[int]] = None,
        input_len: Optional[int] = None,
        session_id: Optional[str] = None,
    ) -> Optional[Decision]: ...
    def add_instance(self, instance_id: str) -> None: ...
    def remove_instance(self, instance_id: str) -> None: ...
    def end_session(self, session_id: str) -> bool: ...
    def instances(self) -> list[dict[str, Any]]: ...
    def stats(self) -> dict[str, int]: ...
    def settings(self) -> dict[str, Any]: ...

class RequestCapture:
    def __init__(
        self,
        *,
        prompt_attr: str,
        computed_attr: str,
        tokens_attr: str,
        tokens_is_sequence: bool,
        status_attr: str,
        preempted_status: object,
    ) -> None: ...
    def capture(
        self, running: object, waiting_queues: list[object]
    ) -> tuple[int, int, int, int, int, int, int]: ...
    def remaining_prefill(self, request: object) -> int: ...

class IncrementalCapture:
    def __init__(
        self,
        *,
        prompt_attr: str,
        computed_attr: str,
        tokens_attr: str,
        tokens_is_sequence: bool,
        status_attr: str,
        preempted_status: object,
    ) -> None: ...
    def capture(
        self, running: object, read_queues: list[object], cached_queue: object
    ) -> tuple[int, int, int, int, int, int, int]: ...
    def recount(
        self, running: object, read_queues: list[object], cached_queue: object
    ) -> tuple[tuple[int, int, int, int, int, int, int], tuple[int, int, int, int, int, int, int]]: ...
    def mark_volatile(self, request: object) -> None: ...
    def forget_running(self, requests: list[object]) -> None: ...
    def clear(self) -> None: ...
    @property
    def num_cached(self) -> int: ...
    @property
    def num_volatile(self) -> int: ...
    @property
    def last_reads(self) -> int: ...

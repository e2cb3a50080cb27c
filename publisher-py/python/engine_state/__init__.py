"""engine-state: real-time engine-state telemetry for LLM routers.

Publish a vLLM engine's scheduler state with :class:`Publisher`, read every
engine's state lock-free with :class:`Reader`, and route requests with
:class:`Router` (shadow counters merged with fresh engine state). Both default to the settings in
``AGENTIC_ENGINE_STATE_URI`` (default ``file:///dev/shm/agentic_engine_state``),
``AGENTIC_WORKER_ID`` and ``AGENTIC_ENGINE_STATE_PERIOD_MS`` (default 50).
The vLLM hook is the subpackage :mod:`engine_state.vllm` (a vLLM plugin).
"""

from engine_state._native import (
    BLOCK_TOKENS,
    FIELD_NAMES,
    FLAG_IDLE,
    FLAG_SHUTTING_DOWN,
    JSON_KEYS,
    LAYOUT_VERSION,
    Decision,
    EngineIdInUse,
    EngineState,
    EngineStateError,
    Publisher,
    Reader,
    Reservation,
    Router,
    __version__,
    block_hashes,
    default_cache_capacity,
)

__all__ = [
    "BLOCK_TOKENS",
    "FIELD_NAMES",
    "FLAG_IDLE",
    "FLAG_SHUTTING_DOWN",
    "JSON_KEYS",
    "LAYOUT_VERSION",
    "Decision",
    "EngineIdInUse",
    "EngineState",
    "EngineStateError",
    "Publisher",
    "Reader",
    "Reservation",
    "Router",
    "__version__",
    "block_hashes",
    "default_cache_capacity",
]

"""engine-state's vLLM hook: publishes the V1 scheduler's state from inside vLLM.

Installing the ``engine-state`` distribution into vLLM's environment is the
whole installation: vLLM loads the plugin ``engine_state`` (entry-point group
``vllm.general_plugins``) in each of its processes and calls :func:`register`,
which wraps the base ``vllm.v1.core.sched.scheduler.Scheduler`` (so
``AsyncScheduler`` and other subclasses are covered). The engine-core process
then publishes its state when its scheduler is constructed and retires its
file at shutdown. No vLLM source is patched.

For ``--scheduler-cls`` users: ``engine_state.vllm.scheduler.EngineStateScheduler``
and ``EngineStateAsyncScheduler`` do the same without the plugin.

Settings (environment): ``AGENTIC_ENGINE_STATE_URI``, ``AGENTIC_WORKER_ID``,
``AGENTIC_ENGINE_STATE_PERIOD_MS``, ``AGENTIC_ENGINE_STATE_FILE_MODE`` and the
kill switch ``AGENTIC_ENGINE_STATE_DISABLE=1``. See docs/VLLM.md.

Importing this package does not import vLLM.
"""

from engine_state.vllm._hook import DISABLE_ENV, HOOK_ATTR, EngineStateHook, engine_id_for
from engine_state.vllm._patch import install, is_installed, register, uninstall

__all__ = [
    "DISABLE_ENV",
    "HOOK_ATTR",
    "EngineStateHook",
    "engine_id_for",
    "install",
    "is_installed",
    "register",
    "uninstall",
]

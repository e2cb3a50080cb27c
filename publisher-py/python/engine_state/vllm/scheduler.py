"""Scheduler classes for ``--scheduler-cls``, for those who prefer naming the
hook explicitly to loading it as a plugin::

    vllm serve MODEL --scheduler-cls engine_state.vllm.scheduler.EngineStateAsyncScheduler

``EngineStateAsyncScheduler`` keeps vLLM's async scheduling (vLLM turns async
scheduling off for a subclass of the plain ``Scheduler``); use
``EngineStateScheduler`` where vLLM would use ``Scheduler``. Both only make
sure the base ``Scheduler`` is wrapped (the same, idempotent, wrapping the
plugin does), so loading the plugin as well never hooks an engine twice.
Importing this module imports vLLM.
"""

import sys

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from engine_state.vllm._patch import install

install(sys.modules[Scheduler.__module__])


class EngineStateScheduler(Scheduler):
    """vLLM's ``Scheduler``, publishing its state through engine-state."""


class EngineStateAsyncScheduler(AsyncScheduler):
    """vLLM's ``AsyncScheduler``, publishing its state through engine-state."""


__all__ = ["EngineStateAsyncScheduler", "EngineStateScheduler"]

"""Wrapping vLLM's base ``Scheduler`` and the plugin entry point.

``register()`` is what vLLM calls (entry point ``vllm.general_plugins`` /
``engine_state``) in every process it starts: API server, engine core,
workers, the model-inspection subprocess. It must be cheap, idempotent and
start no thread (vLLM forks engine processes after loading plugins). So it
only arranges for the base ``Scheduler`` class to be wrapped: at once when its
module is already imported, otherwise right after the module is first
imported (a one-shot import hook; importing the scheduler module costs ~1.5 s,
which processes that never build a scheduler should not pay). The publisher
starts only when a scheduler is constructed, i.e. in the engine-core process.

Each wrapper calls vLLM's method first and returns its result unchanged; the
hook runs afterwards, inside ``try``, and an exception in it turns the hook
off for that engine (``EngineStateHook.fail``). Exceptions of vLLM's own
method propagate untouched and skip the hook.
"""

from __future__ import annotations

import functools
import importlib.abc
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

from engine_state.vllm import _adapter as adapter
from engine_state.vllm import _hook

logger = logging.getLogger("engine_state.vllm")

#: Set on each wrapper: the vLLM function it wraps (makes wrapping idempotent).
WRAPPED_ATTR = "__engine_state_wrapped__"

_lock = threading.Lock()
_version_checked = False


def register() -> None:
    """The vLLM plugin entry point (``vllm.general_plugins``: ``engine_state``)."""
    try:
        if _hook.disabled():
            logger.info("engine-state: %s is set; the hook is off", _hook.DISABLE_ENV)
            return
        module = sys.modules.get(adapter.SCHEDULER_MODULE)
        if module is not None:
            install(module)
        else:
            _PatchOnImport.arm()
    except Exception as error:  # never break vLLM's plugin loading
        logger.warning("engine-state: the vLLM plugin did not load: %s", error, exc_info=True)


def install(module: Any) -> bool:
    """Wraps the base scheduler class of ``module`` (vLLM's
    ``vllm.v1.core.sched.scheduler``, or a test double). Idempotent; returns
    True when the class is (now or already) wrapped."""
    global _version_checked
    with _lock:
        if not _version_checked and module.__name__ == adapter.SCHEDULER_MODULE:
            _version_checked = True
            adapter.check_version()
        cls = adapter.scheduler_class(module)
        preempted = adapter.preempted_status(module)
        wrappers: dict[str, Callable[[Callable], Callable]] = {
            adapter.INIT: lambda f: _wrap_init(f, preempted),
            adapter.SCHEDULE: lambda f: _wrap_step(f, "after_schedule"),
            adapter.UPDATE_FROM_OUTPUT: lambda f: _wrap_step(f, "after_update"),
            adapter.FINISH_REQUESTS: _wrap_finish,
            adapter.SHUTDOWN: _wrap_shutdown,
        }
        # Check every method before replacing any: all or nothing.
        originals = {name: cls.__dict__.get(name) for name in wrappers}
        missing = [name for name, f in originals.items() if f is None]
        if missing:
            raise AttributeError(
                f"{cls.__module__}.{cls.__qualname__} has no {', '.join(missing)}; "
                f"engine-state's hook was read from vLLM {', '.join(adapter.TESTED_VLLM_VERSIONS)}"
            )
        for name, wrap in wrappers.items():
            original = originals[name]
            if getattr(original, WRAPPED_ATTR, None) is not None:
                continue
            wrapper = wrap(original)
            setattr(wrapper, WRAPPED_ATTR, original)
            setattr(cls, name, wrapper)
        return True


def uninstall(module: Any) -> None:
    """Restores the wrapped methods (for tests)."""
    with _lock:
        cls = adapter.scheduler_class(module)
        for name, value in list(cls.__dict__.items()):
            original = getattr(value, WRAPPED_ATTR, None)
            if original is not None:
                setattr(cls, name, original)


def is_installed(module: Any) -> bool:
    """True when the scheduler class of ``module`` is wrapped."""
    cls = adapter.scheduler_class(module)
    return getattr(cls.__dict__.get(adapter.SCHEDULE), WRAPPED_ATTR, None) is not None


def _hook_of(scheduler: Any) -> _hook.EngineStateHook | None:
    try:
        return scheduler.__dict__.get(_hook.HOOK_ATTR)
    except Exception:
        return None


def _wrap_init(original: Callable, preempted: Any) -> Callable:
    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if _hook_of(self) is not None:  # a subclass ran the base __init__ twice
            return
        try:
            _hook.attach(self, preempted)
        except Exception as error:
            logger.warning(
                "engine-state: not publishing this engine's state: %s: %s. vLLM is unaffected.",
                type(error).__name__,
                error,
                exc_info=True,
            )

    return __init__


def _wrap_step(original: Callable, action: str) -> Callable:
    @functools.wraps(original)
    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        hook = _hook_of(self)
        if hook is None:
            return original(self, *args, **kwargs)
        hook.depth += 1
        try:
            result = original(self, *args, **kwargs)
        finally:
            hook.depth -= 1
        try:
            getattr(hook, action)(self, result)
        except Exception as error:
            hook.fail(self, error, original.__name__)
        return result

    return step


def _wrap_finish(original: Callable) -> Callable:
    @functools.wraps(original)
    def finish_requests(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        hook = _hook_of(self)
        if hook is not None:
            try:
                hook.after_finish(self)
            except Exception as error:
                hook.fail(self, error, original.__name__)
        return result

    return finish_requests


def _wrap_shutdown(original: Callable) -> Callable:
    @functools.wraps(original)
    def shutdown(self: Any, *args: Any, **kwargs: Any) -> Any:
        hook = _hook_of(self)
        if hook is not None:
            try:
                self.__dict__.pop(_hook.HOOK_ATTR, None)
                hook.close(self)
            except Exception as error:
                hook.fail(self, error, original.__name__)
        return original(self, *args, **kwargs)

    return shutdown


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Wraps the scheduler class right after its module is first imported,
    then removes itself from ``sys.meta_path``."""

    _armed: _PatchOnImport | None = None

    @classmethod
    def arm(cls) -> None:
        with _lock:
            if cls._armed is None or cls._armed not in sys.meta_path:
                cls._armed = cls()
                sys.meta_path.insert(0, cls._armed)

    def __init__(self) -> None:
        self._finding = False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != adapter.SCHEDULER_MODULE or self._finding:
            return None
        self._finding = True
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return spec
            exec_module = spec.loader.exec_module

            def exec_then_install(module: Any) -> None:
                exec_module(module)
                self.disarm()
                try:
                    install(module)
                except Exception as error:
                    logger.warning(
                        "engine-state: cannot hook vLLM's scheduler: %s: %s. vLLM is unaffected.",
                        type(error).__name__,
                        error,
                        exc_info=True,
                    )

            spec.loader.exec_module = exec_then_install  # this spec's loader only
            return spec
        except Exception:
            return None  # let the import system find the module as usual
        finally:
            self._finding = False

    def disarm(self) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass

"""The vLLM contract tests run in one pytest session with the vLLM venv's
Python (``make test-vllm``). The environment is set here, before anything
imports vLLM: CPU, offline, only the engine_state plugin, a private
engine-state directory and a short period (so that every step boundary may
publish once the test has waited out the period)."""

import os
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from vllm_harness import set_cpu_environment  # noqa: E402

set_cpu_environment()
os.environ["VLLM_PLUGINS"] = "engine_state"
STATE_DIR = tempfile.mkdtemp(prefix="engine-state-vllm-contract-")
os.environ["AGENTIC_ENGINE_STATE_URI"] = f"file://{STATE_DIR}"
os.environ["AGENTIC_ENGINE_STATE_PERIOD_MS"] = "2"
for name in ("AGENTIC_WORKER_ID", "AGENTIC_ENGINE_STATE_DISABLE"):
    os.environ.pop(name, None)


@pytest.fixture(scope="module")
def loaded_plugin():
    """The engine_state plugin, loaded through vLLM's ``load_general_plugins()``
    as EngineCore loads it; uninstalled afterwards unless it was installed
    before (test_contract's baseline runs without it)."""
    import vllm.plugins
    import vllm.v1.core.sched.scheduler as sched_module

    import engine_state.vllm as hook_pkg
    from engine_state.vllm import _patch

    installed_before = hook_pkg.is_installed(sched_module)
    vllm.plugins.plugins_loaded = False
    vllm.plugins.load_general_plugins()
    assert hook_pkg.is_installed(sched_module)
    yield sched_module
    if not installed_before:
        _patch.uninstall(sched_module)

"""The vLLM contract tests run in one pytest session with the vLLM venv's
Python (``make test-vllm``). The environment is set here, before anything
imports vLLM: CPU, offline, only the engine_state plugin, a private
engine-state directory and a short period (so that every step boundary may
publish once the test has waited out the period)."""

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))

from vllm_harness import set_cpu_environment  # noqa: E402

set_cpu_environment()
os.environ["VLLM_PLUGINS"] = "engine_state"
STATE_DIR = tempfile.mkdtemp(prefix="engine-state-vllm-contract-")
os.environ["AGENTIC_ENGINE_STATE_URI"] = f"file://{STATE_DIR}"
os.environ["AGENTIC_ENGINE_STATE_PERIOD_MS"] = "2"
for name in ("AGENTIC_WORKER_ID", "AGENTIC_ENGINE_STATE_DISABLE"):
    os.environ.pop(name, None)

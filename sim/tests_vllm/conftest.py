"""The engine model against vLLM 0.33's real scheduler, in the vLLM venv
(``make test-vllm``). vLLM runs on CPU, offline, with no plugin: the
engine-state hook is not under test here, the scheduler is. The scheduler is
built by the contract tests' harness (publisher-py/tests_vllm/vllm_harness.py)."""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "publisher-py" / "tests_vllm"))

from vllm_harness import set_cpu_environment  # noqa: E402

set_cpu_environment()
os.environ["VLLM_PLUGINS"] = ""  # a list naming no plugin: load none

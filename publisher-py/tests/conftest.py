import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture
def shm_uri(tmp_path, monkeypatch):
    """A private engine-state directory, used through the environment the way
    vLLM's processes would see it."""
    uri = f"file://{tmp_path}/engines"
    monkeypatch.setenv("AGENTIC_ENGINE_STATE_URI", uri)
    monkeypatch.delenv("AGENTIC_ENGINE_STATE_DISABLE", raising=False)
    monkeypatch.delenv("AGENTIC_ENGINE_STATE_PERIOD_MS", raising=False)
    monkeypatch.delenv("AGENTIC_WORKER_ID", raising=False)
    return uri

import os
import pathlib
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))


def wait_until(condition, what, timeout=10.0):
    """Polls `condition` (every 5 ms) until it returns something true, and
    returns that; fails naming `what` after `timeout` seconds. Tests wait on
    the event they need with this, never a fixed sleep."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.005)
    return value


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


@pytest.fixture
def state_dir(tmp_path: pathlib.Path) -> pathlib.Path:
    d = tmp_path / "state"
    d.mkdir()
    return d


@pytest.fixture
def uri(state_dir: pathlib.Path) -> str:
    return f"file://{state_dir}"


@pytest.fixture
def bin_dir() -> pathlib.Path:
    """Directory of the Rust binaries (esdump, espublish); `make test-py` sets it."""
    d = pathlib.Path(os.environ.get("ENGINE_STATE_BIN", pathlib.Path(__file__).parents[2] / "target/release"))
    if not (d / "esdump").exists():
        pytest.fail(f"{d}/esdump is missing: run `cargo build --release --bins` (make test-py does)")
    return d

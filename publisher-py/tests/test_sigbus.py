"""How the SIGBUS handler of engine_state (shm-format/src/sigbus.rs) chains
with the default action and with Python's faulthandler (docs/ARCHITECTURE.md,
"A file truncated under a mapping"). Each case runs in its own interpreter:
some of them must end with SIGBUS."""

import os
import signal
import subprocess
import sys

import pytest

SCRIPT = r"""
import faulthandler, mmap, os, signal, sys
from engine_state import Publisher, Reader
directory, when, fault = sys.argv[1:]
if when == "before":
    faulthandler.enable()
publisher = Publisher(uri="file://" + directory, engine_id="e", period_ms=20)
reader = Reader(uri="file://" + directory)
assert [s.status for s in reader.read()] == ["fresh"]
if when == "after":
    faulthandler.enable()
print("touching", flush=True)
if fault == "engine":
    os.truncate(os.path.join(directory, "e"), 0)
    reader.read()
    publisher.publish(num_running=1)
elif fault == "foreign":
    path = os.path.join(directory, ".foreign")
    with open(path, "wb") as f:
        f.write(b"x" * 4096)
    with open(path, "r+b") as f:
        mapped = mmap.mmap(f.fileno(), 4096)
    os.truncate(path, 0)
    mapped[0]
else:
    os.kill(os.getpid(), signal.SIGBUS)
print("survived", flush=True)
"""


def run(directory, when, fault):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"}
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, str(directory), when, fault],
        capture_output=True, text=True, timeout=60, env=env,
    )


@pytest.mark.parametrize("when", ["never", "before"])
def test_a_truncated_engine_file_is_survived(state_dir, when):
    done = run(state_dir, when, "engine")
    assert (done.returncode, done.stdout) == (0, "touching\nsurvived\n"), done.stderr
    assert "Fatal Python error" not in done.stderr


@pytest.mark.parametrize("when", ["never", "before", "after"])
@pytest.mark.parametrize("fault", ["foreign", "sent"])
def test_a_sigbus_that_is_not_ours_still_ends_the_process(state_dir, when, fault):
    done = run(state_dir, when, fault)
    assert done.returncode == -signal.SIGBUS, (done.returncode, done.stdout, done.stderr)
    assert done.stdout == "touching\n"
    assert ("Fatal Python error: Bus error" in done.stderr) == (when != "never"), done.stderr


def test_faulthandler_enabled_after_the_first_mapping_takes_the_protection_away(state_dir):
    # The documented limit: faulthandler runs first, then re-raises SIGBUS as
    # a sent signal, which is not a fault of ours.
    done = run(state_dir, "after", "engine")
    assert done.returncode == -signal.SIGBUS, (done.returncode, done.stdout, done.stderr)
    assert "Fatal Python error: Bus error" in done.stderr

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import wait_until

import engine_state
from engine_state import EngineStateError, Publisher, Reader


def test_publish_then_read_round_trip(uri, state_dir):
    with Publisher(uri=uri, engine_id="e0", period_ms=20) as pub:
        assert pub.engine_id == "e0"
        assert pub.path == str(state_dir / "e0")
        assert pub.period_ms == 20
        pub.publish(step=5, num_running=3, num_waiting=1, gpu_blocks_total=100, gpu_blocks_free=25,
                    pending_prefill_tokens=4096, ongoing_decode_tokens=700, num_prefilling=1,
                    max_prefill_remaining=4000, num_preempted=2)
        (state,) = Reader(uri=uri).read()
        assert state.engine_id == "e0"
        assert state.status == "fresh" and state.fresh
        assert (state.step, state.num_running, state.num_waiting) == (5, 3, 1)
        assert (state.gpu_blocks_total, state.gpu_blocks_free) == (100, 25)
        assert state.gpu_kv_used_frac == pytest.approx(0.75)
        assert (state.pending_prefill_tokens, state.ongoing_decode_tokens) == (4096, 700)
        assert (state.num_prefilling, state.max_prefill_remaining, state.num_preempted) == (1, 4000, 2)
        assert state.flags == 0
        assert state.captured_unix_ns > 1_600_000_000 * 10**9
        assert 0 <= state.capture_age_ms < 1000
        d = state.to_dict()
        assert list(d) == list(engine_state.JSON_KEYS)
        assert d["status"] == "fresh"
    assert pub.closed
    assert not (state_dir / "e0").exists()


def test_fields_not_given_are_zero_and_idle_follows_counts(uri):
    with Publisher(uri=uri, engine_id="idle") as pub:
        pub.publish(gpu_blocks_total=10, gpu_blocks_free=10)
        (s,) = Reader(uri=uri).read()
        assert s.flags & 1, "no running or waiting requests: idle"
        assert (s.num_running, s.pending_prefill_tokens, s.step) == (0, 0, 0)
        pub.publish(num_waiting=1, flags=1)
        (s,) = Reader(uri=uri).read()
        assert s.flags & 1 == 0, "the idle bit follows the counts, not the caller"


def test_positional_fields_and_bad_values_are_refused(uri):
    with Publisher(uri=uri, engine_id="strict") as pub:
        with pytest.raises(TypeError):
            pub.publish(3)  # keyword-only: a positional count is a bug
        with pytest.raises(TypeError):
            pub.publish(num_runing=3)  # misspelt field
        with pytest.raises(OverflowError):
            pub.publish(num_running=-1)


def test_defaults_come_from_the_environment(state_dir, monkeypatch):
    monkeypatch.setenv("AGENTIC_ENGINE_STATE_URI", f"file://{state_dir}")
    monkeypatch.setenv("AGENTIC_WORKER_ID", "from-env")
    monkeypatch.setenv("AGENTIC_ENGINE_STATE_PERIOD_MS", "25")
    with Publisher() as pub:
        assert (pub.engine_id, pub.period_ms) == ("from-env", 25)
        assert (state_dir / "from-env").exists()
        assert [s.engine_id for s in Reader().read()] == ["from-env"]
    # Arguments win over the environment.
    with Publisher(engine_id="explicit", period_ms=10) as pub:
        assert (pub.engine_id, pub.period_ms) == ("explicit", 10)


def test_default_engine_id_is_host_unique(uri, monkeypatch):
    monkeypatch.delenv("AGENTIC_WORKER_ID", raising=False)
    with Publisher(uri=uri) as pub:
        assert pub.engine_id.endswith(f"-{os.getpid()}")


@pytest.mark.parametrize("bad,says", [
    ("../x", "characters outside"),
    ("", "empty"),
    ("x" * 64, "longer than 63"),
    (".hidden", "starts with '.'"),
])
def test_invalid_engine_ids_are_value_errors(uri, state_dir, bad, says):
    with pytest.raises(ValueError, match="invalid engine id") as info:
        Publisher(uri=uri, engine_id=bad)
    assert says in str(info.value)
    assert list(state_dir.iterdir()) == []


@pytest.mark.parametrize("kwargs,says", [
    (dict(uri="http://x"), "bad engine-state URI"),
    (dict(uri="file://relative"), "absolute path"),
    (dict(period_ms=0), "1..=60000"),
    (dict(file_mode=0o400), "at least 600"),
])
def test_bad_settings_are_value_errors(uri, kwargs, says):
    kwargs = {"uri": uri, "engine_id": "e", **kwargs}
    with pytest.raises(ValueError, match=says.replace(".", r"\.")):
        Publisher(**kwargs)


def test_bad_environment_is_a_value_error(uri, monkeypatch):
    monkeypatch.setenv("AGENTIC_ENGINE_STATE_PERIOD_MS", "fast")
    with pytest.raises(ValueError, match="AGENTIC_ENGINE_STATE_PERIOD_MS"):
        Publisher(uri=uri, engine_id="e")


def test_second_live_publisher_same_id_is_refused(uri):
    with Publisher(uri=uri, engine_id="dup"):
        with pytest.raises(EngineStateError, match="already published by a live process"):
            Publisher(uri=uri, engine_id="dup")


def test_an_id_in_use_is_a_typed_error_on_both_backends_alike(uri):
    # EngineIdInUse (a kind of EngineStateError, so older handlers still
    # catch it); the vLLM hook tells a clash by this type, not by the text.
    assert issubclass(engine_state.EngineIdInUse, EngineStateError)
    with Publisher(uri=uri, engine_id="dup-typed"):
        with pytest.raises(engine_state.EngineIdInUse, match="already published"):
            Publisher(uri=uri, engine_id="dup-typed")
    with Publisher(uri=uri, engine_id="dup-typed") as again:  # free once closed
        assert again.engine_id == "dup-typed"
    with pytest.raises(ValueError) as bad:
        Publisher(uri=uri, engine_id="../x")
    assert not isinstance(bad.value, EngineStateError)


def test_the_default_id_follows_the_one_rule(uri, monkeypatch):
    # The rule of the vLLM hook (engine_id_for), without the data-parallel part.
    import engine_state.vllm as hook_pkg

    monkeypatch.delenv("AGENTIC_WORKER_ID", raising=False)
    with Publisher(uri=uri) as pub:
        in_vllm = hook_pkg.engine_id_for(0, 1)
        assert in_vllm.endswith(f"-dp0-{os.getpid()}")
        assert pub.engine_id == in_vllm.replace("-dp0-", "-")
    monkeypatch.setenv("AGENTIC_WORKER_ID", " w-7 ")
    with Publisher(uri=uri) as pub:
        assert pub.engine_id == hook_pkg.engine_id_for(0, 1) == "w-7"


def test_unwritable_location_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(EngineStateError, match="cannot create the engine-state directory"):
        Publisher(uri=f"file://{blocker}/sub", engine_id="e")


def test_directory_that_is_a_regular_file_is_an_engine_state_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(EngineStateError, match="not a directory; remove that file"):
        Publisher(uri=f"file://{blocker}", engine_id="e")
    with pytest.raises(EngineStateError, match="Not a directory"):
        Reader(uri=f"file://{blocker}")


def test_publish_after_close_raises(uri):
    pub = Publisher(uri=uri, engine_id="closed")
    pub.close()
    pub.close()  # idempotent
    with pytest.raises(EngineStateError, match="closed"):
        pub.publish(num_running=1)


def test_forked_child_never_writes_the_parents_file(uri, state_dir):
    pub = Publisher(uri=uri, engine_id="parent", period_ms=20)
    pub.publish(num_running=7)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        code = 0
        try:
            pub.publish(num_running=99)
            code = 2  # must not get here
        except EngineStateError as e:
            code = 0 if "before a fork()" in str(e) else 3
        pub.close()  # must not retire or remove the parent's file
        del pub
        os.write(w, bytes([code]))
        os._exit(0)
    os.close(w)
    code = os.read(r, 1)[0]
    os.waitpid(pid, 0)
    assert code == 0
    (state,) = Reader(uri=uri).read()
    assert state.num_running == 7
    assert state.status == "fresh"
    assert (state_dir / "parent").exists()
    # The parent's heartbeat thread still runs: a new stamp comes. Each
    # reading's stamp, estimated on this clock as now minus its age, is at
    # least half a period (20 ms) later than the one seen now.
    reader = Reader(uri=uri)

    def stamped_at(state):
        return time.monotonic() * 1e3 - state.heartbeat_age_ms

    at_fork = stamped_at(reader.read()[0])
    wait_until(lambda: stamped_at(reader.read()[0]) >= at_fork + 10,
               "a heartbeat stamped after the fork")
    pub.close()


def test_killed_publisher_reads_as_dead(uri):
    code = (
        "import signal\nfrom engine_state import Publisher\n"
        f"p = Publisher(uri={uri!r}, engine_id='victim', period_ms=20)\n"
        "p.publish(num_running=2)\nprint('ready', flush=True)\nsignal.pause()\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"ready"
        reader = Reader(uri=uri)
        assert reader.read()[0].status == "fresh"
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        wait_until(lambda: reader.read()[0].status == "dead", "the killed writer to read as dead", timeout=5)
        assert reader.read()[0].num_running == 2
    finally:
        child.kill()
        child.wait()


def test_snapshots_that_break_the_layout_rules_are_refused(uri):
    with Publisher(uri=uri, engine_id="strict") as pub:
        with pytest.raises(ValueError, match=r"gpu_blocks_free \(12\) is above gpu_blocks_total \(10\)"):
            pub.publish(gpu_blocks_total=10, gpu_blocks_free=12)
        with pytest.raises(ValueError, match=r"flags 0x4 has bits"):
            pub.publish(flags=4)
        (s,) = Reader(uri=uri).read()
        assert (s.gpu_blocks_free, s.flags & ~1) == (0, 0), "nothing was published"


def test_a_removed_directory_is_recreated_with_a_new_generation(tmp_path):
    """rm -rf DIR under a live Publisher, then mkdir DIR: the heartbeat
    thread recreates the file (new generation, latest snapshot), publish()
    never raises, and the gap is counted once."""
    import shutil
    d = tmp_path / "engines"
    uri = f"file://{d}"
    with Publisher(uri=uri, engine_id="phoenix", period_ms=10) as pub:
        pub.publish(step=1, num_running=2)
        (before,) = Reader(uri=uri).read()
        assert pub.stats().items() >= {"files_lost": 0, "files_recreated": 0}.items()
        shutil.rmtree(d)
        wait_until(lambda: pub.stats()["files_lost"] > 0, "the loss to be noticed", timeout=5)
        pub.publish(step=2, num_running=2)  # no error: the hook must not fail
        d.mkdir()
        reader = Reader(uri=uri)
        wait_until(reader.read, "the file to be recreated", timeout=5)
        (after,) = reader.read()
        assert after.fresh and after.generation > before.generation
        assert (after.step, after.num_running) == (2, 2)
        pub.publish(step=3, num_running=2)
        assert reader.read()[0].step == 3
        assert pub.stats().items() >= {"files_lost": 1, "files_recreated": 1}.items()
    assert list(d.iterdir()) == []

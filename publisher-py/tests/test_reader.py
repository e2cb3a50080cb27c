import json
import subprocess

import pytest
from conftest import wait_until

from engine_state import EngineStateError, Publisher, Reader


def test_rust_writer_is_read_by_the_python_reader(uri, bin_dir):
    writer = subprocess.Popen(
        [str(bin_dir / "espublish"), "--uri", uri, "--engine-id", "rust-0", "--period-ms", "20",
         "--set", "num_running=6", "--set", "num_waiting=2", "--set", "gpu_blocks_total=800",
         "--set", "gpu_blocks_free=200", "--set", "max_prefill_remaining=31000", "--duration", "30"],
        stdout=subprocess.PIPE,
    )
    try:
        assert b"publishing rust-0" in writer.stdout.readline()
        reader = Reader(uri=uri)
        (s,) = reader.read()
        assert (s.engine_id, s.status) == ("rust-0", "fresh")
        assert (s.num_running, s.num_waiting, s.max_prefill_remaining) == (6, 2, 31000)
        assert s.gpu_kv_used_frac == pytest.approx(0.75)
        first_step = s.step
        (s,) = wait_until(lambda: (r := reader.read()) and r[0].step > first_step and r,
                          "the writer to publish again")
        assert s.step > first_step, "the writer keeps publishing"
        assert s.heartbeat_age_ms < 200
    finally:
        writer.kill()
        writer.wait()


def test_reader_matches_esdump_json(uri, bin_dir):
    with Publisher(uri=uri, engine_id="a") as a, Publisher(uri=uri, engine_id="b") as b:
        a.publish(num_running=1, pending_prefill_tokens=10)
        b.publish(num_running=2, pending_prefill_tokens=20)
        dumped = json.loads(subprocess.check_output([str(bin_dir / "esdump"), "--json", "--uri", uri]))
        read = [s.to_dict() for s in Reader(uri=uri).read()]
    assert [d["engine_id"] for d in dumped] == [d["engine_id"] for d in read] == ["a", "b"]
    for x, y in zip(dumped, read, strict=True):
        assert list(x) == list(y)
        for key in x:
            if key.endswith("_age_ms"):
                continue
            assert x[key] == y[key], key


def test_bad_files_are_listed_and_others_still_read(uri, state_dir):
    (state_dir / "junk").write_bytes(b"hello")
    with Publisher(uri=uri, engine_id="ok") as pub:
        pub.publish(num_running=4)
        reader = Reader(uri=uri)
        states = reader.read()
        assert [s.engine_id for s in states] == ["ok"]
        (error,) = reader.errors
        assert "junk" in error and "4096 bytes" in error


def test_stale_after_is_a_setting(uri):
    with Publisher(uri=uri, engine_id="slow", period_ms=1000) as pub:
        pub.publish(num_running=1)
        reader = Reader(uri=uri, stale_after_ms=50)
        assert reader.read()[0].status == "fresh"
        # The reading the wait ended on: a read after it could see a new stamp.
        (s,) = wait_until(lambda: (r := reader.read())[0].heartbeat_age_ms >= 150 and r,
                          "a heartbeat 150 ms old")
        assert s.status == "stale" and not s.fresh
        assert s.heartbeat_age_ms >= 150


def test_missing_directory_and_bad_uri(tmp_path):
    with pytest.raises(EngineStateError, match="cannot read engine-state directory"):
        Reader(uri=f"file://{tmp_path}/missing")
    with pytest.raises(ValueError, match="bad engine-state URI"):
        Reader(uri="gopher://x")


def test_errors_escape_control_characters_in_file_names_as_esdump_does(uri, state_dir, bin_dir):
    hostile = "evil\x1b[31m\nforged line"
    (state_dir / hostile).write_bytes(b"hello")
    reader = Reader(uri=uri)
    assert reader.read() == []
    (error,) = reader.errors
    assert "\x1b" not in error and "\n" not in error, repr(error)
    assert "evil\\u{1b}[31m\\nforged line" in error, error
    dumped = subprocess.run(
        [bin_dir / "esdump", "--json", "--uri", uri], capture_output=True, text=True, check=True
    )
    assert dumped.stderr == f"esdump: {error}\n"

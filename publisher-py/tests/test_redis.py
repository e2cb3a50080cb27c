"""The Python surface over Redis: Publisher(uri="redis://…") and
Reader(uri="redis://…") go through the same Rust code as shared memory (no
Python Redis client). Each test starts its own redis-server on a free port."""

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time

import pytest
from conftest import wait_until

from engine_state import EngineStateError, Publisher, Reader


def _free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago (bound on port 0, then
    closed): for a server to start on, or as one nobody answers on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_redis(tmp_path, password=None):
    exe = os.environ.get("REDIS_SERVER") or shutil.which("redis-server")
    if exe is None:
        pytest.fail("redis-server is not installed: apt-get install redis-server (.ci/run does)")
    port = _free_port()
    args = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(tmp_path)]
    if password:
        args += ["--requirepass", password]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
                s.sendall(b"PING\r\n")
                if s.recv(64):
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"redis-server did not start on port {port}")
        time.sleep(0.01)
    return proc, port


@pytest.fixture
def redis_port(tmp_path):
    proc, port = _start_redis(tmp_path)
    yield port
    proc.kill()
    proc.wait()


def test_publisher_to_reader_and_esdump_over_redis(redis_port, bin_dir):
    uri = f"redis://127.0.0.1:{redis_port}/0?prefix=py:"
    with Publisher(uri=uri, engine_id="r0", period_ms=20) as pub:
        assert pub.path is None and pub.uri == uri
        pub.publish(num_running=3, num_waiting=1, gpu_blocks_total=100, gpu_blocks_free=40)
        reader = Reader(uri=uri)
        wait_until(lambda: [s.num_running for s in reader.read()] == [3], "the engine via Redis")
        (s,) = reader.read()
        assert (s.engine_id, s.status, s.fresh) == ("r0", "fresh", True)
        assert s.gpu_kv_used_frac == pytest.approx(0.6)
        assert s.heartbeat_age_ms < 1000
        dumped = json.loads(subprocess.check_output([str(bin_dir / "esdump"), "--json", "--uri", uri]))
        assert [d["engine_id"] for d in dumped] == ["r0"]
        assert list(dumped[0]) == list(s.to_dict())
        assert dumped[0]["num_running"] == 3
    wait_until(lambda: reader.read() == [], "the closed engine to leave the registry")


def test_heartbeat_and_staleness_over_redis(redis_port):
    uri = f"redis://127.0.0.1:{redis_port}/0"
    with Publisher(uri=uri, engine_id="slow", period_ms=1000) as pub:
        pub.publish(num_running=1)
        reader = Reader(uri=uri, stale_after_ms=50)
        wait_until(lambda: [s.status for s in reader.read()] == ["fresh"], "fresh")
        # The reading the wait ended on: a read after it could see a new stamp.
        (s,) = wait_until(lambda: (r := reader.read())[0].heartbeat_age_ms >= 150 and r,
                          "a heartbeat 150 ms old")
        assert s.status == "stale" and s.heartbeat_age_ms >= 100


def test_wrong_password_is_a_clear_error_without_the_password(tmp_path):
    proc, port = _start_redis(tmp_path, password="right-pass-123")
    try:
        bad = f"redis://:wrong-pass-456@127.0.0.1:{port}/0"
        with pytest.raises(EngineStateError) as publisher_error:
            Publisher(uri=bad, engine_id="x")
        with pytest.raises(EngineStateError) as reader_error:
            Reader(uri=bad)
        for error in (publisher_error, reader_error):
            text = str(error.value)
            assert "check the user and password" in text
            assert "wrong-pass-456" not in text
        good = f"redis://:right-pass-123@127.0.0.1:{port}/0"
        with Publisher(uri=good, engine_id="ok") as pub:
            pub.publish(num_running=2)
            reader = Reader(uri=good)
            wait_until(lambda: [s.num_running for s in reader.read()] == [2], "the engine")
            assert "right-pass-123" not in reader.uri and "right-pass-123" not in repr(pub)
    finally:
        proc.kill()
        proc.wait()


def test_malformed_redis_uris_are_value_errors():
    for uri in ["redis://:pw-secret@h:1/notadb", "redis://h:1/0?prefix=a b", "redis://h/0?nope=1"]:
        with pytest.raises(ValueError) as error:
            Reader(uri=uri)
        assert "pw-secret" not in str(error.value)
        with pytest.raises(ValueError):
            Publisher(uri=uri, engine_id="x")


def test_a_stalled_redis_does_not_hold_the_gil_and_a_read_says_timed_out(tmp_path):
    """With redis-server SIGSTOPped, read() and Reader() wait for the URI's
    timeout (500 ms by default) — once per read, however many engines are
    registered (each read used to wait it for every reply: 2 per engine) —
    without the GIL: a publisher thread in the same process keeps
    publishing meanwhile. The read after it, during the reconnection
    backoff, returns at once."""
    proc, port = _start_redis(tmp_path)
    uri = f"redis://127.0.0.1:{port}/0"
    stop = threading.Event()
    published = [0]

    def publish_loop():
        with Publisher(uri=f"file://{tmp_path}/shm", engine_id="busy", period_ms=50) as pub:
            while not stop.is_set():
                pub.publish(step=published[0], num_running=1)
                published[0] += 1

    worker = threading.Thread(target=publish_loop)
    engines = [Publisher(uri=uri, engine_id=f"e{i}", period_ms=50) for i in range(8)]
    try:
        for pub in engines:
            pub.publish(num_running=1)
        reader = Reader(uri=uri)
        wait_until(lambda: len(reader.read()) == 8, "the 8 engines")
        assert reader.errors == []
        worker.start()
        wait_until(lambda: published[0] > 100, "the publisher thread to run")
        # How many publishes the thread makes in 0.5 s while this thread
        # sleeps (without the GIL): the pace a non-blocking read keeps.
        before = published[0]
        time.sleep(0.5)
        pace = (published[0] - before) / 0.5

        def kept_pace(call):
            """Runs `call`; true when the publisher kept at least a quarter
            of its pace meanwhile (holding the GIL, it gets one 5 ms switch
            interval at most, about 1 % of a 500 ms wait)."""
            before, t = published[0], time.monotonic()
            try:
                call()
            finally:
                waited, during = time.monotonic() - t, published[0] - before
            return waited, during, during >= 0.25 * pace * waited

        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(0.3)  # past the 250 ms rescan interval: the read asks Redis
        started = []
        waited, during, kept = kept_pace(lambda: (started.append(time.monotonic()), reader.read()))
        (error,) = reader.errors
        t = time.monotonic()
        # The backoff (50 ms first, RECONNECT_FIRST) started when the 0.5 s
        # wait ended: this overestimates the time since it started.
        in_backoff = t - (started[0] + 0.5) < 0.05
        during_backoff = reader.read()
        second = time.monotonic() - t
        # 0.3 s of slack for a busy 2-core host; one more wait would be 0.5 s.
        assert 0.45 <= waited < 0.8, waited
        # At once: a read that asked the server again would wait 0.5 s. On a
        # loaded host this read may start after the backoff: then it rightly
        # asks again, and only "known engines stay listed" holds.
        assert not in_backoff or second < 0.45, second
        assert len(during_backoff) == 8
        assert kept, f"{during} publishes while read() waited {waited:.2f} s (pace {pace:.0f}/s)"
        assert "timed out after 500 ms" in error and "Resource temporarily" not in error, error

        def open_paused():
            with pytest.raises(EngineStateError, match="timed out after 200 ms"):
                Reader(uri=f"{uri}?timeout_ms=200")

        waited, during, kept = kept_pace(open_paused)
        assert waited < 0.5 and kept, (waited, during, pace)
    finally:
        stop.set()
        os.kill(proc.pid, signal.SIGCONT)
        if worker.is_alive():
            worker.join()
        for pub in engines:
            pub.close()
        proc.kill()
        proc.wait()


def test_a_second_live_publisher_of_an_id_is_refused_over_redis(redis_port):
    uri = f"redis://127.0.0.1:{redis_port}/0"
    with Publisher(uri=uri, engine_id="dup-0", period_ms=20) as first:
        first.publish(num_running=1)
        with pytest.raises(EngineStateError, match="already published by a live process"):
            Publisher(uri=uri, engine_id="dup-0")
        reader = Reader(uri=uri)
        wait_until(lambda: [s.num_running for s in reader.read()] == [1], "the first publisher")
    # Closed cleanly: the id is free at once.
    with Publisher(uri=uri, engine_id="dup-0") as second:
        second.publish(num_running=2)
        wait_until(lambda: [s.num_running for s in reader.read()] == [2], "the second publisher")


@pytest.mark.parametrize(
    "uri",
    [
        "redis://127.0.0.1:UNREACHABLE/0?password=PW-s3cret",
        "redis://127.0.0.1:UNREACHABLE/0?pass=PW-s3cret",
        "redis+unix:///tmp/redis.sock?pass=PW-s3cret",
        "redis://127.0.0.1:UNREACHABLE/0?prefix=p:&token=PW-s3cret",
        "redis://:PW-s3cret@127.0.0.1:UNREACHABLE/notadb",
        "redis://user:PW-s3cret@127.0.0.1:notaport/0",
        "redis://:PW-s3cret@127.0.0.1:UNREACHABLE/0",
    ],
)
def test_no_exception_or_repr_shows_a_credential(uri):
    # A port nobody listens on (bound, then closed), never a fixed one.
    uri = uri.replace("UNREACHABLE", str(_free_port()))
    for make in (lambda: Reader(uri=uri), lambda: Publisher(uri=uri, engine_id="x")):
        try:
            made = make()
        except Exception as error:  # noqa: BLE001 - every kind is checked
            for text in (str(error), repr(error)):
                assert "PW-s3cret" not in text, text
        else:
            # A publisher starts even when Redis is unreachable.
            for text in (repr(made), made.uri):
                assert "PW-s3cret" not in text, text
            made.close()

"""Publisher.stats() over Redis (refused writes, said once on stderr) and
close() racing a publish() from another thread."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

from conftest import wait_until
from test_redis import _free_port, _start_redis, redis_port  # noqa: F401 - a fixture

from engine_state import EngineStateError, Publisher, Reader

SECRET = "PW-s3cret-77"

# A publisher in its own process, driven through stdin: "stats" prints its
# stats() as JSON, "close" closes it, prints them again and exits.
CHILD = textwrap.dedent(
    """
    import json, sys
    from engine_state import Publisher
    publisher = Publisher(uri=sys.argv[1], engine_id="dup", period_ms=20)
    publisher.publish(num_running=1)
    print("started", flush=True)
    for line in sys.stdin:
        if line.strip() == "stats":
            print(json.dumps(publisher.stats()), flush=True)
        elif line.strip() == "close":
            publisher.close()
            print(json.dumps(publisher.stats()), flush=True)
            break
    """
)


def _wait(condition, what):
    return wait_until(condition, what, timeout=20)


def test_a_publisher_whose_key_another_process_took_counts_refused_and_says_so_once(tmp_path):
    redis, port = _start_redis(tmp_path, password=SECRET)
    uri = f"redis://:{SECRET}@127.0.0.1:{port}/0?ttl_ms=1000"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, uri],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    taker = None
    try:
        assert child.stdout.readline() == "started\n"

        def ask(command):
            child.stdin.write(command + "\n")
            child.stdin.flush()
            return json.loads(child.stdout.readline())

        stats = _wait(lambda: (s := ask("stats"))["written"] >= 1 and s, "a first write")
        assert stats["refused"] == 0, stats
        # The child hangs (stopped) longer than its key's ttl: the key
        # expires and this process takes the id, as a restarted engine would.
        os.kill(child.pid, signal.SIGSTOP)

        def take():
            try:
                return Publisher(uri=uri, engine_id="dup", period_ms=20)
            except EngineStateError as error:
                assert "already published by a live process" in str(error)
                return None

        taker = _wait(take, "the child's key to expire")
        taker.publish(num_running=7)
        os.kill(child.pid, signal.SIGCONT)
        # The child's heartbeats are refused (and counted) while the taker lives.
        stats = _wait(lambda: (s := ask("stats"))["refused"] >= 3 and s, "refused writes")
        reader = Reader(uri=uri)
        for _ in range(20):
            assert [(s.engine_id, s.num_running) for s in reader.read()] == [("dup", 7)]
            time.sleep(0.01)
        final = ask("close")
        assert final["refused"] >= stats["refused"] and final["errors"] == 0, final
        assert child.wait(timeout=10) == 0
        stderr = child.stderr.read()
        # Said once, with what to do, and without the password.
        assert stderr.count("is written by another live process") == 1, stderr
        assert f"pid {os.getpid()} on its host" in stderr and "AGENTIC_WORKER_ID" in stderr, stderr
        assert SECRET not in stderr, stderr
        # The child's close left the taker's key alone.
        assert [(s.engine_id, s.num_running) for s in reader.read()] == [("dup", 7)]
        assert taker.stats()["refused"] == 0
    finally:
        if taker is not None:
            taker.close()
        if child.poll() is None:
            os.kill(child.pid, signal.SIGCONT)
            child.kill()
            child.wait()
        redis.kill()
        redis.wait()


def test_stats_have_the_same_keys_on_both_backends(uri):
    with Publisher(uri=uri, engine_id="keys") as shm:
        shm_stats = shm.stats()
    with Publisher(uri=f"redis://127.0.0.1:{_free_port()}/0", engine_id="keys") as redis:
        redis_stats = redis.stats()
    assert set(shm_stats) == set(redis_stats)
    assert shm_stats == dict.fromkeys(shm_stats, 0)
    # Kept after close: the counts when close() began.
    assert shm.stats() == shm_stats and redis.closed


def test_publish_from_another_thread_while_close_runs_gets_the_closed_error():
    # Redis is unreachable: close() waits (without the GIL) up to 1 s for the
    # sink to delete the key, long enough for the other thread to publish.
    publisher = Publisher(
        uri=f"redis://127.0.0.1:{_free_port()}/0", engine_id="closing", period_ms=20
    )
    published = threading.Event()
    raised = []

    def publish_until_it_raises():
        while True:
            try:
                publisher.publish(num_running=1)
            except Exception as error:  # noqa: BLE001 - the kind is the test
                raised.append(error)
                return
            published.set()

    thread = threading.Thread(target=publish_until_it_raises)
    thread.start()
    assert published.wait(10)
    started = time.monotonic()
    publisher.close()
    closing = time.monotonic() - started
    thread.join(10)
    (error,) = raised
    assert isinstance(error, EngineStateError) and "is closed" in str(error), repr(error)
    assert closing >= 0.5, f"close() took {closing:.2f} s: too short to race"
    assert publisher.closed


def test_a_registry_key_of_the_wrong_type_is_counted_and_said_once(redis_port):  # noqa: F811
    # The registry (a set) is a string: registrations fail, records are written.
    import socket

    with socket.create_connection(("127.0.0.1", redis_port)) as s:
        s.sendall(b"SET bad:engines not-a-set\r\n")
        assert s.recv(64) == b"+OK\r\n"
    uri = f"redis://127.0.0.1:{redis_port}/0?prefix=bad:"
    script = textwrap.dedent(
        f"""
        import json, time
        from engine_state import Publisher
        publisher = Publisher(uri={uri!r}, engine_id="unlisted", period_ms=20)
        deadline = time.monotonic() + 20
        while publisher.stats()["registry_errors"] < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        print(json.dumps(publisher.stats()))
        publisher.close()
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout)
    assert stats["registry_errors"] >= 2 and stats["written"] >= 1 and stats["errors"] == 0, stats
    assert done.stderr.count("is not a set") == 1, done.stderr
    assert "Delete that key" in done.stderr, done.stderr

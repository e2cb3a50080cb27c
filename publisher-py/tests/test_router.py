import json
import subprocess
import sys
import time

import pytest
from conftest import wait_until

from engine_state import Publisher, Reader, Router, block_hashes

PROMPT = list(range(2048))  # four 512-token blocks


def test_load_only_spreads_and_reservations_release():
    router = Router(["a", "b"], policy="load_only")
    d1, r1 = router.pick("r1", tokens=PROMPT)
    d2, r2 = router.pick("r2", tokens=PROMPT)
    assert {d1.instance_id, d2.instance_id} == {"a", "b"}
    assert d1.reason == "least_loaded"
    loads = {i["instance_id"]: i["shadow"]["num_requests"] for i in router.instances()}
    assert loads == {"a": 1, "b": 1}
    r1.prefill_done()
    r1.complete()
    r2.fail()
    assert r1.released and r2.released
    assert all(i["shadow"]["num_requests"] == 0 for i in router.instances())
    stats = router.stats()
    assert (stats["decisions"], stats["completed"], stats["failed"]) == (2, 1, 1)


def test_dropped_reservation_releases_its_load():
    router = Router(["a"])
    _, r = router.pick("r", tokens=PROMPT)
    del r
    assert router.instances()[0]["shadow"]["num_requests"] == 0
    assert router.stats()["dropped"] == 1


def test_reservation_context_manager_fails_on_exception():
    router = Router(["a"])
    _, r = router.pick("r", tokens=PROMPT)
    with pytest.raises(RuntimeError):
        with r:
            raise RuntimeError("upstream error")
    assert router.stats()["failed"] == 1
    _, r = router.pick("r2", tokens=PROMPT)
    with r:
        pass
    assert router.stats()["completed"] == 1


def test_fresh_engine_state_steers_the_pick(tmp_path):
    uri = f"file://{tmp_path}"
    with Publisher(uri=uri, engine_id="busy") as busy, Publisher(uri=uri, engine_id="idle") as idle:
        busy.publish(num_running=12, pending_prefill_tokens=50_000)
        idle.publish(num_running=0)
        router = Router(["busy", "idle"], policy="lmetric")
        assert router.update_real_state(Reader(uri=uri).read()) == 2
        decision, _ = router.pick("r", tokens=PROMPT)
        assert decision.instance_id == "idle"
        assert decision.consulted_real_state
        # No digest published: the router's own estimate.
        assert decision.cache_knowledge == "estimated"
        assert router.settings()["cache_knowledge"] == "engine"
        eff = {i["instance_id"]: i["effective"] for i in router.instances()}
        assert eff["busy"]["num_requests"] == 12
        assert eff["busy"]["pending_prefill_tokens"] == 50_000


def test_stale_engine_state_is_ignored(tmp_path):
    uri = f"file://{tmp_path}"
    with Publisher(uri=uri, engine_id="a", period_ms=60_000) as a:
        a.publish(num_running=30)
        reader = Reader(uri=uri, stale_after_ms=1)
        states = wait_until(lambda: (r := reader.read())[0].status == "stale" and r,
                            "a heartbeat older than 1 ms")
        assert states[0].status == "stale"
        router = Router(["a"])
        router.update_real_state(states)
        assert router.instances()[0]["effective"]["num_requests"] == 0


def test_sessions_stick_with_unified():
    router = Router(["a", "b"], policy="unified")
    d1, r1 = router.pick("t1", tokens=PROMPT, session_id="chat")
    r1.complete()
    d2, _ = router.pick("t2", tokens=PROMPT + list(range(512)), session_id="chat")
    assert d2.instance_id == d1.instance_id
    assert d2.reason == "affinity"
    assert d2.cache_hit_tokens == 2048


def test_block_hashes_and_precomputed_requests():
    hashes = block_hashes(PROMPT)
    assert len(hashes) == 4
    assert block_hashes(PROMPT[:1024]) == hashes[:2], "chained: a prefix has the same leading hashes"
    router = Router(["a"])
    d, _ = router.pick("r", block_hashes=hashes, input_len=2048)
    assert d.input_len == 2048


def test_settings_and_bad_input_are_clear_errors(tmp_path):
    router = Router(["a"], settings={"decode_weight": 0.01, "migration": {"rel_hi": 2.0}})
    assert router.settings()["decode_weight"] == 0.01
    assert router.settings()["migration"]["rel_hi"] == 2.0
    with pytest.raises(ValueError, match="invalid router settings"):
        Router(["a"], settings={"decode_wieght": 1})
    with pytest.raises(ValueError):
        Router(["a"], policy="random")
    with pytest.raises(ValueError, match="overload_factor"):
        Router(["a"], settings={"overload_factor": -1})
    with pytest.raises(ValueError, match="tokens"):
        router.pick("r")
    with pytest.raises(ValueError, match="unknown instance"):
        router.migration_advice("nope", "r", tokens=PROMPT)
    with pytest.raises(RuntimeError, match="no instances"):
        Router([]).pick("r", tokens=PROMPT)


def test_decision_log_writes_json_lines(tmp_path):
    log = tmp_path / "decisions.jsonl"
    router = Router(["a", "b"], decision_log=str(log))
    for i in range(3):
        router.pick(f"r{i}", tokens=PROMPT, session_id="s")
    del router
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["request_id"] for r in records] == ["r0", "r1", "r2"]
    assert {"time_unix_ns", "reason", "instance", "session_id", "candidates"} <= set(records[0])
    assert {c["instance"] for c in records[0]["candidates"]} == {"a", "b"}


def test_migration_advice_is_a_dict():
    router = Router(["a", "b"], settings={"migration": {"prefill_tokens_per_s": 1000.0}})
    _, big = router.pick("big", tokens=list(range(40_000)))
    advice = router.migration_advice(big.instance_id, "new", tokens=PROMPT)
    assert advice["source_instance"] == big.instance_id
    assert advice["target_instance"] not in (None, big.instance_id)
    # PROMPT is the first four blocks of the big prompt: cached on the source, no new prefill.
    assert advice["projected_prefill_s"] == pytest.approx(40_000 / 1000.0)
    assert advice["slo_exceeded"] is True


def test_readme_python_example_runs(tmp_path, monkeypatch):
    import pathlib
    import runpy

    monkeypatch.setenv("AGENTIC_ENGINE_STATE_URI", f"file://{tmp_path}")
    with Publisher(engine_id="e0") as a, Publisher(engine_id="e1") as b:
        a.publish(num_running=1)
        b.publish(num_running=1)
        example = pathlib.Path(__file__).parents[2] / "examples" / "python_router.py"
        module = runpy.run_path(str(example))
        assert module["main"]() == 0


def _held_then_fresh_busy(tmp_path, policy, real_state_use):
    """A 600-token request held on e0, then e1 published fresh with 5 running:
    where does a second 600-token request without a session go?"""
    uri = f"file://{tmp_path}"
    router = Router(["e0", "e1"], policy=policy, settings={"real_state_use": real_state_use})
    first, held = router.pick("r1", tokens=list(range(600)))
    assert first.instance_id == "e0"
    with Publisher(uri=uri, engine_id="e1") as e1:
        e1.publish(num_running=5)
        assert router.update_real_state(Reader(uri=uri).read()) == 1
        second, _ = router.pick("r2", tokens=list(range(1000, 1600)))
    held.complete()
    return second


@pytest.mark.parametrize("policy", ["load_only", "lmetric", "sticky", "unified"])
def test_placement_mode_uses_shadow_for_decisions_that_bind_no_session(tmp_path, policy):
    second = _held_then_fresh_busy(tmp_path, policy, "placement")
    assert (second.instance_id, second.consulted_real_state) == ("e1", False)
    second = _held_then_fresh_busy(tmp_path, policy, "always")
    assert (second.instance_id, second.consulted_real_state) == ("e0", True)


def test_placement_mode_consults_real_state_when_a_session_is_first_bound(tmp_path):
    uri = f"file://{tmp_path}"
    router = Router(["e0", "e1"], policy="sticky", settings={"real_state_use": "placement"})
    with Publisher(uri=uri, engine_id="e0") as e0:
        e0.publish(num_running=5)
        router.update_real_state(Reader(uri=uri).read())
        first, _ = router.pick("t1", tokens=PROMPT, session_id="chat")
        later, _ = router.pick("t2", tokens=PROMPT, session_id="chat")
    assert (first.instance_id, first.consulted_real_state) == ("e1", True)
    assert (later.instance_id, later.reason, later.consulted_real_state) == ("e1", "affinity", False)


def test_an_old_reading_handed_over_late_is_stale(tmp_path):
    uri = f"file://{tmp_path}"
    router = Router(["e0", "e1"], policy="load_only")
    with Publisher(uri=uri, engine_id="e0") as e0:
        e0.publish(num_running=9)
        states = Reader(uri=uri).read()
    assert states[0].status == "fresh"
    # A reading just taken is merged, aged from the read.
    router.update_real_state(states)
    assert router.instances()[0]["effective"]["num_requests"] == 9
    # The same (old) reading, handed over again until its age from the read
    # passes real_state_expiry_s (2 s): stale by then, never merged again.
    def handed_over_again():
        router.update_real_state(states)
        return router.instances()[0]["effective"]["real"] is None

    wait_until(handed_over_again, "the reading to age past real_state_expiry_s")
    eff = router.instances()[0]["effective"]
    assert (eff["num_requests"], eff["real"]) == (0, None)


def test_advice_for_a_reserved_request_does_not_count_it_against_itself():
    router = Router(["e0", "e1"], policy="load_only")
    big = list(range(30_000))
    before = router.migration_advice("e0", "big", tokens=big)
    assert before["migrate"] is False
    decision, held = router.pick("big", tokens=big)
    assert decision.instance_id == "e0"
    # Asked by name, it would count against itself: refused.
    with pytest.raises(ValueError, match="migration_advice_for"):
        router.migration_advice("e0", "big", tokens=big)
    after = router.migration_advice_for(held, "big", tokens=big)
    assert after == before
    assert router.migrate(held, "big", tokens=big) is None
    assert held.instance_id == "e0"
    held.complete()
    with pytest.raises(ValueError, match="already released"):
        router.migration_advice_for(held, "big", tokens=big)


def test_migrate_moves_a_reserved_request(tmp_path):
    uri = f"file://{tmp_path}"
    router = Router(["src", "b"], policy="load_only")
    prompt = list(range(4096))
    _, held = router.pick("m", tokens=prompt)
    assert held.instance_id == "src"
    with Publisher(uri=uri, engine_id="src") as src:
        src.publish(num_running=4, pending_prefill_tokens=60_000)
        router.update_real_state(Reader(uri=uri).read())
        moved = router.migrate(held, "m", tokens=prompt)
    assert (moved.instance_id, moved.reason) == ("b", "migration")
    assert held.instance_id == "b"
    shadow = {i["instance_id"]: i["shadow"]["num_requests"] for i in router.instances()}
    assert shadow == {"src": 0, "b": 1}
    held.complete()
    stats = router.stats()
    assert (stats["decisions"], stats["migrated"], stats["completed"]) == (2, 1, 1)


def test_an_engine_shutting_down_gets_no_new_requests(tmp_path):
    from engine_state import EngineStateError

    uri = f"file://{tmp_path}"
    router = Router(["a", "b"], policy="load_only")
    with Publisher(uri=uri, engine_id="a") as a, Publisher(uri=uri, engine_id="b") as b:
        _, on_a = router.pick("r0", tokens=PROMPT)
        a.publish(flags=2)  # bit 1: shutting down
        b.publish(num_running=3)
        router.update_real_state(Reader(uri=uri).read())
        for i in range(3):
            decision, _ = router.pick(f"r{i + 1}", tokens=PROMPT)
            assert decision.instance_id == "b"
        on_a.complete()  # its running request still completes normally
        b.publish(flags=2)
        router.update_real_state(Reader(uri=uri).read())
        with pytest.raises(EngineStateError, match="every instance is shutting down"):
            router.pick("r9", tokens=PROMPT)
        assert router.migration_advice("a", "m", tokens=PROMPT)["target_instance"] is None


#: Every numeric router setting and its range, as the error states it.
SETTING_RANGES = {
    "overload_factor": "a number > 0 and <= 1000",
    "decode_weight": "a number in [0, 1000]",
    "affinity_min_hit_ratio": "a number in [0, 1]",
    "prefix_cache_blocks": "a whole number in [1, 4294967294]",
    "max_sessions": "a whole number in [1, 4294967294]",
    "real_state_expiry_s": "a number in [0, 3600]",
    "migration.ttft_slo_s": "a number in [0, 3600]",
    "migration.rel_hi": "a number in [0, 1000]",
    "migration.prefill_tokens_per_s": "a number > 0 and <= 1000000000",
    "migration.big_prefill_threshold": "a whole number in [0, 1000000000000000000]",
    "migration.kv_wall_frac": "a number in [0, 1]",
}


def _nested(name, value):
    if name.startswith("migration."):
        return {"migration": {name.removeprefix("migration."): value}}
    return {name: value}


def test_every_setting_is_listed():
    named = {"policy", "real_state_use", "cache_knowledge", "migration"}
    listed = set(SETTING_RANGES) | named
    settings = Router(["a"]).settings()
    names = set(settings) | {f"migration.{k}" for k in settings["migration"]}
    assert names - named <= listed
    assert names >= set(SETTING_RANGES)


@pytest.mark.parametrize("name", sorted(SETTING_RANGES))
@pytest.mark.parametrize(
    "bad",
    [float("nan"), float("inf"), float("-inf"), -1, -0.5, 1e20, 1e300, 2**64, 10**400],
    ids=["nan", "inf", "-inf", "-1", "-0.5", "1e20", "1e300", "2**64", "10**400"],
)
def test_bad_settings_are_value_errors_naming_setting_and_range(name, bad):
    # Not a PanicException (a BaseException): a ValueError with the name and range.
    with pytest.raises(ValueError) as raised:
        Router(["a"], settings=_nested(name, bad))
    text = str(raised.value)
    assert f"invalid router setting {name} = " in text, text
    assert SETTING_RANGES[name] in text, text


@pytest.mark.parametrize("name", [n for n, r in SETTING_RANGES.items() if "whole" in r])
@pytest.mark.parametrize("value", [1.5, 2.0])
def test_a_float_for_an_integer_setting_is_a_value_error_naming_it(name, value):
    with pytest.raises(ValueError, match=f"invalid router setting {name} = .*whole number"):
        Router(["a"], settings=_nested(name, value))


def test_a_self_referential_settings_dict_is_an_error_not_a_crash():
    # It recursed without end and overflowed the stack (the process died):
    # run in a child so a regression fails this test instead of killing pytest.
    code = (
        "from engine_state import Router\n"
        "d = {}\n"
        "d['migration'] = d\n"
        "try:\n"
        "    Router(['a'], settings=d)\n"
        "except ValueError as e:\n"
        "    print('ValueError', e)\n"
    )
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    assert child.stdout.startswith("ValueError"), child.stdout


def test_routers_and_reservations_say_whose_they_are():
    r1, r2 = Router(["a"]), Router(["a"])
    assert isinstance(r1.id, int) and r1.id != r2.id
    _, held = r1.pick("r", tokens=list(range(600)))
    assert held.router_id == r1.id != r2.id
    held.complete()


def test_a_reservation_from_another_router_is_refused_and_changes_nothing(tmp_path):
    uri = f"file://{tmp_path}"
    r1 = Router(["src", "b"], policy="load_only")
    r2 = Router(["src", "b"], policy="load_only")
    prompt = list(range(4096))
    _, held = r1.pick("m", tokens=prompt)
    _, r2_own = r2.pick("o", tokens=prompt)
    with Publisher(uri=uri, engine_id="src") as src:
        src.publish(num_running=4, pending_prefill_tokens=60_000)
        reading = Reader(uri=uri).read()
    for router in (r1, r2):
        router.update_real_state(reading)

    def shadows(router):
        return [(i["instance_id"], i["shadow"]) for i in router.instances()], router.stats()

    before = shadows(r1), shadows(r2)
    with pytest.raises(ValueError, match="made by another router.*pass it to the router"):
        r2.migrate(held, "m", tokens=prompt)
    with pytest.raises(ValueError, match="made by another router"):
        r2.migration_advice_for(held, "m", tokens=prompt)
    assert (shadows(r1), shadows(r2)) == before
    assert held.instance_id == "src" and not held.released
    assert r1.migration_advice_for(held, "m", tokens=prompt)["migrate"] is True
    held.complete()
    assert r1.instances()[0]["shadow"]["num_requests"] == 0
    assert r2.instances()[0]["shadow"]["num_requests"] == 1
    r2_own.complete()


def test_reader_and_publisher_durations_at_their_extremes_are_not_panics(tmp_path):
    uri = f"file://{tmp_path}"
    with Publisher(uri=uri, engine_id="e") as publisher:
        publisher.publish(num_running=1)
        longest = 2**64 - 1  # the largest value the u64 parameters take
        reader = Reader(uri=uri, stale_after_ms=longest, max_capture_age_ms=longest)
        assert [e.status for e in reader.read()] == ["fresh"]
        assert [e.status for e in Reader(uri=uri, stale_after_ms=0).read()] in (
            [["fresh"], ["stale"]]
        )
    for period_ms in (0, 60_001, 2**64 - 1):
        with pytest.raises(ValueError, match="outside 1..=60000 ms"):
            Publisher(uri=uri, engine_id="p", period_ms=period_ms)
    for bad in (-1, 2**64):  # beyond u64: Python's OverflowError, never a panic
        with pytest.raises(OverflowError):
            Reader(uri=uri, stale_after_ms=bad)
        with pytest.raises(OverflowError):
            Publisher(uri=uri, engine_id="p", period_ms=bad)


def test_two_routers_share_their_reservations(uri, state_dir):
    a = Router(["e0", "e1"], policy="load_only")
    b = Router(["e0", "e1"], policy="load_only")
    with pytest.raises(RuntimeError, match="share_reservations"):
        a.update_peers()
    a.share_reservations("router-a", uri=uri)
    b.share_reservations("router-b", uri=uri)
    assert (state_dir.parent / "state.routers" / "router-a").exists()
    held = [a.pick(f"r{i}", tokens=PROMPT)[1] for i in range(2)]
    assert b.update_peers() == 2, "a's record lists both engines"
    peers = {i["instance_id"]: i["peers"]["num_requests"] for i in b.instances()}
    assert peers == {"e0": 1, "e1": 1}
    # b sees a's load: its pick goes where a has least (both 1), its own
    # view counts 2 on the engine it chose.
    decision, mine = b.pick("b1", tokens=PROMPT)
    effective = {i["instance_id"]: i["effective"]["num_requests"] for i in b.instances()}
    assert effective[decision.instance_id] == 2
    # a opened its peers before b existed: b is found at a's next listing
    # (every 250 ms).
    wait_until(lambda: a.update_peers() == 2, "b listed by a")
    assert sum(i["peers"]["num_requests"] for i in a.instances()) == 1
    for r in held:
        r.complete()
    b.update_peers()
    assert all(i["peers"]["num_requests"] == 0 for i in b.instances())
    assert b.peer_errors() == []
    # A second router cannot take a live replica id.
    from engine_state import EngineIdInUse

    with pytest.raises(EngineIdInUse):
        Router(["e0"]).share_reservations("router-a", uri=uri)
    a.stop_sharing()
    assert not (state_dir.parent / "state.routers" / "router-a").exists()
    mine.complete()


def test_sharing_from_many_threads_does_not_deadlock(uri):
    import threading

    a = Router(["e0", "e1"])
    b = Router(["e0", "e1"])
    a.share_reservations("router-a", uri=uri)
    b.share_reservations("router-b", uri=uri)
    stop = time.monotonic() + 1.0
    errors = []

    def poll(call):
        try:
            while time.monotonic() < stop:
                call()
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    threads = [
        threading.Thread(target=poll, args=(call,))
        for call in [b.update_peers, b.peer_errors, b.sharing_stats, b.update_peers, b.instances]
    ]
    for t in threads:
        t.start()
    _, held = a.pick("x", tokens=PROMPT)
    for t in threads:
        t.join(timeout=30)
        assert not t.is_alive(), "a sharing call hung"
    assert errors == []
    stats = a.sharing_stats()
    assert stats["published"] >= 3 and stats["errors"] == 0 and stats["last_error"] is None
    assert Router(["e0"]).sharing_stats() is None
    held.complete()
    b.stop_sharing()

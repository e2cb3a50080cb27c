//! The router end to end: accounting through handles, real state, sessions,
//! migration and the decision log.

use std::io::Write;
use std::sync::{Arc, Mutex};

use engine_state_shm_format::Snapshot;

use super::*;
use crate::effective::RealFields;
use crate::settings::{Policy, RealStateUse};
use crate::{Reason, Request};
use engine_state_shm_format::blocks::BLOCK_TOKENS;

fn router(policy: Policy, ids: &[&str]) -> Router {
    let settings = RouterSettings {
        policy,
        ..RouterSettings::default()
    };
    Router::with_instances(settings, ids.iter().copied()).unwrap()
}

fn shadow(router: &Router, id: &str) -> ShadowCounters {
    router.instance(id).unwrap().shadow
}

fn tokens(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| i.wrapping_mul(2_654_435_761) ^ seed)
        .collect()
}

fn fresh(snapshot: Snapshot) -> RealState {
    RealState::fresh(snapshot, Duration::from_millis(10))
}

#[test]
fn a_reservation_moves_and_releases_exactly_what_it_reserved() {
    let r = router(Policy::LoadOnly, &["a"]);
    let (decision, mut held) = r.pick(&Request::from_tokens("1", tokens(1, 1500))).unwrap();
    assert_eq!(
        (
            decision.input_len,
            decision.cache_hit_tokens,
            decision.new_prefill_tokens
        ),
        (1500, 0, 1500)
    );
    let c = shadow(&r, "a");
    assert_eq!(
        (c.num_requests, c.ongoing_tokens, c.pending_prefill_tokens),
        (1, 1500, 1500)
    );

    held.prefill_done();
    held.prefill_done(); // idempotent
    let c = shadow(&r, "a");
    assert_eq!(
        (
            c.pending_prefill_tokens,
            c.ongoing_decode_tokens,
            c.num_prefilling
        ),
        (0, 1500, 0)
    );

    held.complete();
    held.fail(); // already released: no-op
    assert!(held.is_released());
    drop(held);
    assert_eq!(shadow(&r, "a"), ShadowCounters::default());
    let stats = r.stats();
    assert_eq!(
        (
            stats.decisions,
            stats.completed,
            stats.failed,
            stats.dropped
        ),
        (1, 1, 0, 0)
    );
}

#[test]
fn dropping_or_failing_a_reservation_releases_it() {
    let r = router(Policy::LoadOnly, &["a"]);
    let (_, held) = r.pick(&Request::from_tokens("1", tokens(1, 100))).unwrap();
    let (_, mut failed) = r.pick(&Request::from_tokens("2", tokens(2, 100))).unwrap();
    assert_eq!(shadow(&r, "a").num_requests, 2);
    failed.fail();
    drop(held); // e.g. an error path that returned early
    assert_eq!(shadow(&r, "a"), ShadowCounters::default());
    assert_eq!((r.stats().failed, r.stats().dropped), (1, 1));
}

#[test]
fn a_chosen_instance_remembers_the_prefix_for_the_next_turn() {
    let r = router(Policy::LMetric, &["a", "b"]);
    let turn1 = tokens(7, 3 * BLOCK_TOKENS + 10);
    let (first, held) = r.pick(&Request::from_tokens("1", turn1.clone())).unwrap();
    drop(held);
    let mut turn2 = turn1;
    turn2.extend(tokens(8, 2 * BLOCK_TOKENS));
    // Both idle: lmetric scores are (0 + new) × 0 = 0, a tie; round-robin
    // would move on, so reserve explicitly on the first instance to check the hit.
    let (second, _held) = r
        .reserve_on(&Request::from_tokens("2", turn2), &first.instance_id)
        .unwrap();
    assert_eq!(second.cache_hit_tokens, 3 * BLOCK_TOKENS as u64);
    assert_eq!(
        second.new_prefill_tokens,
        5 * BLOCK_TOKENS as u64 + 10 - 3 * BLOCK_TOKENS as u64
    );
    assert_eq!(second.reason, Reason::Forced);
}

#[test]
fn unified_session_sticks_while_warm_and_leaves_when_overloaded() {
    let r = router(Policy::Unified, &["a", "b"]);
    let history = tokens(3, 8 * BLOCK_TOKENS);
    let request = |id: &str, extra: u32| {
        let mut prompt = history.clone();
        prompt.extend(tokens(extra, 100));
        Request::from_tokens(id, prompt).with_session("s")
    };
    let (first, _h1) = r.pick(&request("1", 1)).unwrap();
    assert_eq!(
        (first.instance_id.as_str(), first.reason),
        ("a", Reason::Placement)
    );

    // Warm (8 of 8 blocks ≈ 0.98 hit) and 1 ≤ max(0.5, 1) × 2: affinity.
    let (second, _h2) = r.pick(&request("2", 2)).unwrap();
    assert_eq!(
        (second.instance_id.as_str(), second.reason),
        ("a", Reason::Affinity)
    );
    assert_eq!(second.cache_hit_tokens, 8 * BLOCK_TOKENS as u64);

    // A session whose instance is overloaded by its real state (another
    // router's load): with the tuned factor 1.3, 9 > max(4.5, 1) × 1.3 = 5.85.
    let tuned = RouterSettings {
        policy: Policy::Unified,
        overload_factor: 1.3,
        ..RouterSettings::default()
    };
    let busy_a = Snapshot {
        num_running: 9,
        ..Snapshot::default()
    };
    let r2 = Router::with_instances(tuned, ["a", "b"]).unwrap();
    let (p, _k1) = r2.pick(&request("1", 1)).unwrap();
    assert_eq!(p.instance_id, "a");
    r2.update_real_state([("a", fresh(busy_a))]);
    // Fallback: a = (4196 + 100) × 9, b = 4196 × 1: b, which becomes the session's.
    let (moved, _k2) = r2.pick(&request("2", 2)).unwrap();
    assert_eq!(
        (moved.instance_id.as_str(), moved.reason),
        ("b", Reason::FallbackOverloaded)
    );
    r2.clear_real_state();
    // b was given the whole prompt, so the next turn is warm there.
    let (next, _k3) = r2.pick(&request("3", 3)).unwrap();
    assert_eq!(
        (next.instance_id.as_str(), next.reason),
        ("b", Reason::Affinity)
    );
}

#[test]
fn fresh_real_state_steers_and_state_that_is_not_fresh_does_not() {
    let r = router(Policy::LoadOnly, &["a", "b"]);
    let busy = Snapshot {
        num_running: 5,
        num_waiting: 2,
        ..Snapshot::default()
    };
    assert_eq!(
        r.update_real_state([("a", fresh(busy)), ("ghost", fresh(busy))]),
        1
    );
    let (d, _h) = r.pick(&Request::from_tokens("1", vec![1; 10])).unwrap();
    assert_eq!(d.instance_id, "b");
    assert!(d.consulted_real_state);
    let view = r.instance("a").unwrap();
    assert_eq!(view.effective.num_requests, 7);
    assert!(view
        .effective
        .real
        .unwrap()
        .fields
        .contains(RealFields::NUM_REQUESTS));

    // Stale: a has 0 shadow requests again, b has 1: a wins.
    r.update_real_state([("a", RealState::not_fresh(busy, Duration::from_secs(9)))]);
    let (d, _h2) = r.pick(&Request::from_tokens("2", vec![1; 10])).unwrap();
    assert_eq!(d.instance_id, "a");
}

#[test]
fn real_state_expires_when_no_update_follows() {
    let settings = RouterSettings {
        policy: Policy::LoadOnly,
        real_state_expiry_s: 0.0,
        ..RouterSettings::default()
    };
    // Time passed in (the router's clock), not slept.
    use std::sync::atomic::{AtomicU64, Ordering};
    let now = Arc::new(AtomicU64::new(1_000_000_000));
    let clock = crate::Clock::from_fn({
        let now = Arc::clone(&now);
        move || now.load(Ordering::Relaxed)
    });
    let r = Router::with_clock(settings, clock).unwrap();
    r.add_instance("a").unwrap();
    r.add_instance("b").unwrap();
    let busy = Snapshot {
        num_running: 5,
        ..Snapshot::default()
    };
    let read_ns = now.load(Ordering::Relaxed);
    r.update_real_state([("a", fresh(busy).read_at(read_ns, Duration::ZERO))]);
    now.fetch_add(2_000_000, Ordering::Relaxed);
    assert_eq!(
        r.instance("a").unwrap().effective.num_requests,
        0,
        "expired: shadow alone"
    );
}

#[test]
fn placement_mode_consults_real_state_only_for_a_sessions_first_request() {
    let settings = RouterSettings {
        policy: Policy::Sticky,
        real_state_use: RealStateUse::Placement,
        ..RouterSettings::default()
    };
    let r = Router::with_instances(settings, ["a", "b"]).unwrap();
    r.update_real_state([(
        "a",
        fresh(Snapshot {
            num_running: 3,
            ..Snapshot::default()
        }),
    )]);
    let (first, _h1) = r
        .pick(&Request::from_tokens("1", vec![1; 10]).with_session("s"))
        .unwrap();
    assert_eq!(
        (first.instance_id.as_str(), first.consulted_real_state),
        ("b", true)
    );
    let (later, _h2) = r
        .pick(&Request::from_tokens("2", vec![1; 10]).with_session("s"))
        .unwrap();
    assert_eq!(
        (later.reason, later.consulted_real_state),
        (Reason::Affinity, false)
    );

    let never = RouterSettings {
        real_state_use: RealStateUse::Never,
        ..RouterSettings::default()
    };
    let r = Router::with_instances(never, ["a"]).unwrap();
    let (d, _h) = r.pick(&Request::from_tokens("1", vec![1; 10])).unwrap();
    assert!(!d.consulted_real_state);
}

#[test]
fn a_removed_instance_takes_its_counters_and_sessions_with_it() {
    let r = router(Policy::Sticky, &["a", "b"]);
    let (d, held) = r
        .pick(&Request::from_tokens("1", vec![1; 10]).with_session("s"))
        .unwrap();
    assert_eq!(d.instance_id, "a");
    r.remove_instance("a").unwrap();
    drop(held); // releases nothing, panics nothing
    r.add_instance("a").unwrap(); // same id, new instance: starts at zero
    assert_eq!(shadow(&r, "a"), ShadowCounters::default());
    // The binding was to the removed instance, not to the name: placed anew.
    let (again, _h) = r
        .pick(&Request::from_tokens("2", vec![1; 10]).with_session("s"))
        .unwrap();
    assert_eq!(again.reason, Reason::Placement);
}

#[test]
fn errors_say_what_to_do() {
    let empty = Router::new(RouterSettings::default()).unwrap();
    let err = empty.pick(&Request::from_tokens("1", vec![])).unwrap_err();
    assert!(err.to_string().contains("add_instance"), "{err}");
    let r = router(Policy::LoadOnly, &["a"]);
    assert!(matches!(
        r.add_instance("a"),
        Err(Error::DuplicateInstance(_))
    ));
    assert!(matches!(
        r.reserve_on(&Request::from_tokens("1", vec![]), "z"),
        Err(Error::UnknownInstance(_))
    ));
    assert!(r
        .migration_advice(&Request::from_tokens("1", vec![]), "z")
        .is_err());
}

#[test]
fn migration_prefers_real_load_over_a_stale_shadow() {
    let settings = RouterSettings {
        policy: Policy::LoadOnly,
        ..RouterSettings::default()
    };
    let r = Router::with_instances(settings, ["src", "b", "c"]).unwrap();
    // The router's shadow: c has 2 requests of its own, b none.
    let (_, _c1) = r
        .reserve_on(&Request::from_tokens("x", vec![1; 10]), "c")
        .unwrap();
    let (_, _c2) = r
        .reserve_on(&Request::from_tokens("y", vec![1; 10]), "c")
        .unwrap();
    // Real state: src is drowning in prefill; b is really running 10 requests
    // (another router's), which the shadow cannot know.
    let src = Snapshot {
        num_running: 4,
        pending_prefill_tokens: 60_000,
        ..Snapshot::default()
    };
    let b = Snapshot {
        num_running: 10,
        ..Snapshot::default()
    };
    r.update_real_state([("src", fresh(src)), ("b", fresh(b))]);

    let request = Request::from_tokens("m", tokens(5, 4096));
    let advice = r.migration_advice(&request, "src").unwrap();
    assert!(advice.slo_exceeded && advice.above_fleet && advice.migrate);
    assert_eq!(advice.target_instance.as_deref(), Some("c"));

    // The same real state, stale: shadow alone ranks b first — but src's own
    // pending prefill is then unknown too, so the trigger does not fire.
    let stale = |s| RealState::not_fresh(s, Duration::from_secs(10));
    r.update_real_state([("src", stale(src)), ("b", stale(b))]);
    let advice = r.migration_advice(&request, "src").unwrap();
    assert_eq!(advice.target_instance.as_deref(), Some("b"));
    assert!(
        !advice.migrate,
        "without real state the shadow sees no backlog on src"
    );
}

#[test]
fn migrate_reserves_on_the_target_and_moves_the_session() {
    let r = router(Policy::Unified, &["src", "b", "c"]);
    let history = tokens(9, 16 * BLOCK_TOKENS);
    let (first, mut on_src) = r
        .pick(&Request::from_tokens("1", history.clone()).with_session("s"))
        .unwrap();
    assert_eq!(first.instance_id, "src");
    let big = Snapshot {
        max_prefill_remaining: 30_000,
        ..Snapshot::default()
    };
    let src = Snapshot {
        num_running: 3,
        pending_prefill_tokens: 90_000,
        ..Snapshot::default()
    };
    r.update_real_state([("src", fresh(src)), ("b", fresh(big))]);

    let request = Request::from_tokens("2", history).with_session("s");
    let out = Captured::default();
    r.set_decision_log(Some(DecisionLog::new(out.clone())));
    let (moved, _on_c) = r.migrate(&request, "src").unwrap().expect("trigger fires");
    assert_eq!(
        (moved.instance_id.as_str(), moved.reason),
        ("c", Reason::Migration)
    );
    // The record says why: the trigger's numbers and what each target avoided.
    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    let record: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap();
    assert_eq!(record["reason"], "migration");
    assert_eq!(record["migration"]["migrate"], true);
    assert_eq!(record["migration"]["source_instance"], "src");
    assert_eq!(record["candidates"][0]["avoided"], "source");
    assert_eq!(record["candidates"][1]["avoided"], "big_prefill");
    assert!(record["candidates"][2].get("avoided").is_none());
    r.set_decision_log(None);
    on_src.fail(); // the caller releases the source
    assert_eq!(shadow(&r, "src").num_requests, 0);
    // The session now lives on c.
    r.clear_real_state();
    let (next, _h) = r.pick(&request).unwrap();
    assert_eq!(
        (next.instance_id.as_str(), next.reason),
        ("c", Reason::Affinity)
    );

    // No backlog anywhere: no migration, nothing reserved.
    let calm = router(Policy::Unified, &["x", "y"]);
    assert!(calm
        .migrate(&Request::from_tokens("3", vec![1; 10]), "x")
        .unwrap()
        .is_none());
    assert_eq!(calm.stats().decisions, 0);
}

/// A `Write` the test can read back.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn the_decision_log_records_scores_state_and_real_provenance() {
    let r = router(Policy::Unified, &["a", "b"]);
    let out = Captured::default();
    r.set_decision_log(Some(DecisionLog::new(out.clone())));
    let busy = Snapshot {
        num_running: 2,
        pending_prefill_tokens: 700,
        ..Snapshot::default()
    };
    r.update_real_state([("a", fresh(busy))]);
    let (_, _h1) = r
        .pick(&Request::from_tokens("r1", tokens(1, 1024)).with_session("s1"))
        .unwrap();
    r.set_decision_log(None);
    let (_, _h2) = r.pick(&Request::from_tokens("r2", vec![1; 10])).unwrap();

    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "one record per logged decision: {text}");
    let record: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(record["request_id"], "r1");
    assert_eq!(record["session_id"], "s1");
    assert_eq!(record["instance"], "b");
    assert_eq!(record["reason"], "placement");
    assert_eq!(record["policy"], "unified");
    assert!(record["time_unix_ns"].as_u64().unwrap() > 0);
    assert!(record["clock_ns"].as_u64().unwrap() > 0);
    let a = &record["candidates"][0];
    assert_eq!(a["instance"], "a");
    // (700 + 1024) × max(2, 1) = 3448
    assert_eq!(a["score"], 3448.0);
    assert_eq!(a["effective"]["num_requests"], 2);
    assert_eq!(a["effective"]["real"]["fields"][0], "num_requests");
    assert!(a["effective"]["real"]["age_ms"].as_f64().unwrap() >= 10.0);
    assert!(record["candidates"][1]["effective"]["real"].is_null());
}

#[test]
fn a_failing_log_writer_never_fails_a_decision() {
    struct Broken;
    impl Write for Broken {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("disk full"))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let r = router(Policy::LoadOnly, &["a"]);
    r.set_decision_log(Some(DecisionLog::new(Broken)));
    assert!(r.pick(&Request::from_tokens("1", vec![1])).is_ok());
    assert_eq!(r.stats().decision_log_errors, 1);
}

/// A 600-token request held on `a`, then `b` fresh with 5 running: the pick
/// of a second request without a session, under `placement`.
fn second_pick_after_real_state(policy: Policy, use_: RealStateUse) -> Decision {
    let settings = RouterSettings {
        policy,
        real_state_use: use_,
        ..RouterSettings::default()
    };
    let r = Router::with_instances(settings, ["a", "b"]).unwrap();
    let (first, held) = r.pick(&Request::from_tokens("1", tokens(1, 600))).unwrap();
    assert_eq!(first.instance_id, "a");
    r.update_real_state([(
        "b",
        fresh(Snapshot {
            num_running: 5,
            ..Snapshot::default()
        }),
    )]);
    let (second, _h) = r.pick(&Request::from_tokens("2", tokens(2, 600))).unwrap();
    drop(held);
    second
}

#[test]
fn placement_mode_leaves_decisions_that_bind_no_session_to_the_shadow() {
    for policy in [
        Policy::LoadOnly,
        Policy::LMetric,
        Policy::Sticky,
        Policy::Unified,
    ] {
        let d = second_pick_after_real_state(policy, RealStateUse::Placement);
        assert_eq!(
            (d.instance_id.as_str(), d.consulted_real_state),
            ("b", false),
            "{policy}: shadow alone sees b idle"
        );
        // The same under `always` consults the real state and avoids b.
        let d = second_pick_after_real_state(policy, RealStateUse::Always);
        assert_eq!(
            (d.instance_id.as_str(), d.consulted_real_state),
            ("a", true),
            "{policy}: always"
        );
    }
}

#[test]
fn a_reading_ages_from_when_it_was_read_not_from_when_it_was_given() {
    let r = router(Policy::LoadOnly, &["a", "b"]);
    let busy = Snapshot {
        num_running: 9,
        ..Snapshot::default()
    };
    let now = engine_state_shm_format::monotonic_ns();
    // Read 2.3 s ago with a fresh heartbeat, handed over only now: stale.
    let old = fresh(busy).read_at(now - 2_300_000_000, Duration::from_millis(5));
    r.update_real_state([("a", old)]);
    assert_eq!(r.instance("a").unwrap().effective.num_requests, 0);
    assert_eq!(r.instance("a").unwrap().effective.real, None);
    // Read 1 s ago with a heartbeat 0.5 s old: merged, and 1 s older than
    // its capture age says.
    let recent = fresh(busy).read_at(now - 1_000_000_000, Duration::from_millis(500));
    r.update_real_state([("a", recent)]);
    let view = r.instance("a").unwrap().effective;
    assert_eq!(view.num_requests, 9);
    let age = view.real.unwrap().age;
    assert!(
        age >= Duration::from_millis(1010) && age < Duration::from_millis(1500),
        "capture age 10 ms + ~1 s since the read: {age:?}"
    );
    // Read just now, but with a heartbeat already 2.1 s old: stale.
    let late = fresh(busy).read_at(now, Duration::from_millis(2100));
    r.update_real_state([("a", late)]);
    assert_eq!(r.instance("a").unwrap().effective.num_requests, 0);
}

#[test]
fn advice_for_a_reserved_request_leaves_its_own_reservation_out() {
    let r = router(Policy::LoadOnly, &["e0", "e1"]);
    let request = Request::from_tokens("big", tokens(3, 30_000));
    let before = r.migration_advice(&request, "e0").unwrap();
    assert!(before.slo_exceeded && !before.migrate);
    let (placed, mut held) = r.pick(&request).unwrap();
    assert_eq!(placed.instance_id, "e0");
    let after = r.migration_advice_for(&request, &held).unwrap();
    assert_eq!(after, before, "the request does not count against itself");
    assert!(r
        .migrate_reservation(&request, &mut held)
        .unwrap()
        .is_none());
    assert_eq!(held.instance_id(), "e0");
    assert_eq!(shadow(&r, "e0").num_requests, 1);
    // The question that would count it against itself (asked by name, which
    // would then advise moving it) is refused, and so is `migrate` by name.
    let refused = r.migration_advice(&request, "e0").unwrap_err();
    assert!(
        refused.to_string().contains("migration_advice_for"),
        "{refused}"
    );
    assert!(r.migrate(&request, "e0").is_err());
    assert_eq!(
        shadow(&r, "e0").num_requests,
        1,
        "a refusal changes nothing"
    );
    // Asked about another instance, the name is no misuse.
    assert!(!r.migration_advice(&request, "e1").unwrap().migrate);
    held.complete();
    assert!(r.migration_advice_for(&request, &held).is_err());
    // Released, the request holds nothing: asking by name is right again
    // (its prompt now in e0's prefix cache, so the advice differs).
    assert!(r.migration_advice(&request, "e0").is_ok());
}

#[test]
fn advice_by_name_counts_reservations_not_ids_seen() {
    let r = router(Policy::LoadOnly, &["e0", "e1"]);
    let request = Request::from_tokens("twice", tokens(3, 1024));
    let (_, mut first) = r.reserve_on(&request, "e0").unwrap();
    let (_, mut second) = r.reserve_on(&request, "e0").unwrap();
    first.complete();
    assert!(
        r.migration_advice(&request, "e0").is_err(),
        "one reservation of the id is still live"
    );
    second.complete();
    assert!(r.migration_advice(&request, "e0").is_ok());
    // A reservation migrated away is no longer on its old instance.
    let (_, mut moved) = r.reserve_on(&request, "e0").unwrap();
    let big = Snapshot {
        num_running: 4,
        pending_prefill_tokens: 60_000,
        ..Snapshot::default()
    };
    r.update_real_state([("e0", fresh(big))]);
    r.migrate_reservation(&request, &mut moved)
        .unwrap()
        .expect("the trigger fires on a drowning e0");
    assert_eq!(moved.instance_id(), "e1");
    assert!(r.migration_advice(&request, "e0").is_ok());
    assert!(r.migration_advice(&request, "e1").is_err());
}

#[test]
fn migrate_reservation_moves_the_request_in_one_step() {
    let r = router(Policy::LoadOnly, &["src", "b"]);
    let request = Request::from_tokens("m", tokens(4, 4096)).with_session("s");
    let (placed, mut held) = r.pick(&request).unwrap();
    assert_eq!(placed.instance_id, "src");
    // src is drowning in other routers' prefill.
    let src = Snapshot {
        num_running: 4,
        pending_prefill_tokens: 60_000,
        ..Snapshot::default()
    };
    r.update_real_state([("src", fresh(src))]);
    let advice = r.migration_advice_for(&request, &held).unwrap();
    assert_eq!(advice.source_pending_prefill_tokens, 60_000);
    let moved = r
        .migrate_reservation(&request, &mut held)
        .unwrap()
        .expect("trigger fires");
    assert_eq!(
        (moved.instance_id.as_str(), moved.reason),
        ("b", Reason::Migration)
    );
    assert_eq!(held.instance_id(), "b");
    assert_eq!(
        shadow(&r, "src"),
        ShadowCounters::default(),
        "released on src"
    );
    assert_eq!(shadow(&r, "b").num_requests, 1);
    held.prefill_done();
    held.complete();
    assert_eq!(shadow(&r, "b"), ShadowCounters::default());
    let stats = r.stats();
    assert_eq!(
        (
            stats.decisions,
            stats.migrated,
            stats.completed,
            stats.dropped
        ),
        (2, 1, 1, 0)
    );
}

#[test]
fn an_instance_shutting_down_gets_no_new_requests() {
    for policy in [
        Policy::LoadOnly,
        Policy::LMetric,
        Policy::Sticky,
        Policy::Unified,
    ] {
        for use_ in [
            RealStateUse::Never,
            RealStateUse::Placement,
            RealStateUse::Always,
        ] {
            let settings = RouterSettings {
                policy,
                real_state_use: use_,
                ..RouterSettings::default()
            };
            let r = Router::with_instances(settings, ["a", "b"]).unwrap();
            let session = Request::from_tokens("1", tokens(1, 600)).with_session("s");
            let (first, mut on_a) = r.pick(&session).unwrap();
            assert_eq!(first.instance_id, "a");
            // b carries more load than a, so every policy would pick a.
            let on_b: Vec<_> = (0..3)
                .map(|i| {
                    r.reserve_on(&Request::from_tokens(format!("b{i}"), tokens(2, 600)), "b")
                        .unwrap()
                        .1
                })
                .collect();
            let leaving = Snapshot {
                flags: engine_state_shm_format::FLAG_SHUTTING_DOWN,
                ..Snapshot::default()
            };
            r.update_real_state([("a", fresh(leaving))]);
            let mut held = Vec::new();
            for i in 0..4 {
                let (d, h) = r
                    .pick(&Request::from_tokens(i.to_string(), tokens(1, 600)))
                    .unwrap();
                assert_eq!(d.instance_id, "b", "{policy}/{use_}");
                held.push(h);
            }
            // The session bound to a is placed anew.
            let (d, _h) = r.pick(&session).unwrap();
            assert_eq!(d.instance_id, "b", "{policy}/{use_}: session");
            // a's running reservation still completes normally.
            on_a.complete();
            assert_eq!(shadow(&r, "a"), ShadowCounters::default());
            // Its state going stale (the engine exited) keeps it out, though
            // its shadow is now the lightest.
            r.update_real_state([("a", RealState::not_fresh(leaving, Duration::from_secs(5)))]);
            let (d, _h) = r.pick(&Request::from_tokens("z", tokens(1, 600))).unwrap();
            assert_eq!(d.instance_id, "b", "{policy}/{use_}: exited");
            // Everyone shutting down: a clear error, not a pick.
            r.update_real_state([("b", fresh(leaving))]);
            let err = r
                .pick(&Request::from_tokens("x", tokens(1, 600)))
                .unwrap_err();
            assert!(matches!(err, Error::AllShuttingDown), "{err}");
            assert!(err.to_string().contains("shutting down"), "{err}");
            // A forced placement is the caller's call.
            assert!(r.reserve_on(&session, "a").is_ok());
            // A fresh state without the flag (a restarted engine) takes a back.
            r.update_real_state([("a", fresh(Snapshot::default()))]);
            let (d, _h) = r.pick(&Request::from_tokens("y", tokens(1, 600))).unwrap();
            assert_eq!(d.instance_id, "a", "{policy}/{use_}: restarted");
            drop((on_b, held));
        }
    }
}

#[test]
fn migrate_reservation_refuses_a_decoding_or_mismatched_reservation() {
    let r = router(Policy::LoadOnly, &["src", "b", "c"]);
    let request = Request::from_tokens("m", tokens(4, 4096));
    let (_, mut held) = r.pick(&request).unwrap();
    let other = Request::from_tokens("m", tokens(4, 1024));
    let err = r.migrate_reservation(&other, &mut held).unwrap_err();
    assert!(err.to_string().contains("1024 prompt tokens"), "{err}");
    held.prefill_done();
    let err = r.migrate_reservation(&request, &mut held).unwrap_err();
    assert!(err.to_string().contains("prefill is done"), "{err}");
    assert_eq!(held.instance_id(), "src");
    r.remove_instance("src").unwrap();
    let (placed, mut elsewhere) = r.pick(&request).unwrap();
    r.remove_instance(&placed.instance_id).unwrap();
    let err = r.migrate_reservation(&request, &mut elsewhere).unwrap_err();
    assert!(err.to_string().contains("was removed"), "{err}");
}

#[test]
fn an_injected_clock_ages_real_state_by_its_own_time() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let now = Arc::new(AtomicU64::new(1_000_000_000));
    let clock = crate::Clock::from_fn({
        let now = Arc::clone(&now);
        move || now.load(Ordering::Relaxed)
    });
    let settings = RouterSettings {
        policy: Policy::LoadOnly,
        ..RouterSettings::default()
    };
    let r = Router::with_clock(settings, clock).unwrap();
    r.add_instance("a").unwrap();
    let busy = Snapshot {
        num_running: 9,
        ..Snapshot::default()
    };
    let read = fresh(busy).read_at(now.load(Ordering::Relaxed), Duration::ZERO);
    r.update_real_state([("a", read)]);
    assert_eq!(r.instance("a").unwrap().effective.num_requests, 9);
    // 2.5 simulated seconds later the reading is past the 2 s expiry.
    now.fetch_add(2_500_000_000, Ordering::Relaxed);
    assert_eq!(r.instance("a").unwrap().effective.num_requests, 0);
}

#[test]
fn the_shadow_comparison_reports_whether_real_state_changed_a_pick() {
    let busy = |n| Snapshot {
        num_running: n,
        ..Snapshot::default()
    };
    let r = router(Policy::LoadOnly, &["a", "b"]);
    // Shadow: b holds one request, a none.
    let (_, _on_b) = r
        .reserve_on(&Request::from_tokens("0", vec![1; 10]), "b")
        .unwrap();
    r.update_real_state([("a", fresh(busy(7)))]);
    let (off, _h0) = r.pick(&Request::from_tokens("1", vec![1; 10])).unwrap();
    assert_eq!(
        (off.instance_id.as_str(), off.real_state_changed()),
        ("b", None)
    );

    r.set_shadow_comparison(true);
    let out = Captured::default();
    r.set_decision_log(Some(DecisionLog::new(out.clone())));
    // Real: a runs 7 → b (2 now); the shadow alone: a (0) < b (2).
    let (changed, _h1) = r.pick(&Request::from_tokens("2", vec![1; 10])).unwrap();
    assert_eq!(changed.instance_id, "b");
    assert_eq!(changed.shadow_only_instance_id.as_deref(), Some("a"));
    assert_eq!(changed.real_state_changed(), Some(true));
    r.set_decision_log(None);
    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    let record: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(
        (&record["instance"], &record["shadow_only_instance"]),
        (&"b".into(), &"a".into())
    );

    // Real state that agrees with the shadow changes nothing.
    r.update_real_state([("a", fresh(busy(0))), ("b", fresh(busy(9)))]);
    let (same, _h2) = r.pick(&Request::from_tokens("3", vec![1; 10])).unwrap();
    assert_eq!(
        (same.instance_id.as_str(), same.real_state_changed()),
        ("a", Some(false))
    );

    // No real state at all: evaluated, never changed.
    r.clear_real_state();
    let (none, _h3) = r.pick(&Request::from_tokens("4", vec![1; 10])).unwrap();
    assert_eq!(none.real_state_changed(), Some(false));

    // Not consulted (real_state_use = never): not evaluated.
    let never = RouterSettings {
        real_state_use: RealStateUse::Never,
        ..RouterSettings::default()
    };
    let r = Router::with_instances(never, ["a", "b"]).unwrap();
    r.set_shadow_comparison(true);
    r.update_real_state([("a", fresh(busy(7)))]);
    let (d, _h) = r.pick(&Request::from_tokens("1", vec![1; 10])).unwrap();
    assert_eq!(d.real_state_changed(), None);
}

#[test]
fn the_shadow_comparison_leaves_the_picks_themselves_unchanged() {
    // Every pick is a tie (requests complete at once), so the round-robin
    // cursor decides: the shadow-only evaluation must not move it. The
    // shadow alone ties a, b and c; with c busy, real state ties a and b.
    let picks = |compare: bool| {
        let r = router(Policy::LoadOnly, &["a", "b", "c"]);
        r.set_shadow_comparison(compare);
        r.update_real_state([(
            "c",
            fresh(Snapshot {
                num_running: 4,
                ..Snapshot::default()
            }),
        )]);
        (0..6)
            .map(|i| {
                let (d, mut held) = r
                    .pick(&Request::from_tokens(format!("{i}"), vec![1; 10]))
                    .unwrap();
                held.complete();
                d.instance_id
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(picks(false), ["a", "b", "a", "b", "a", "b"]);
    assert_eq!(picks(true), picks(false));
}

#[test]
fn a_simulated_clock_stamps_the_decision_log_with_simulated_time() {
    let now = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let clock = crate::Clock::from_fn({
        let now = Arc::clone(&now);
        move || now.load(std::sync::atomic::Ordering::Relaxed)
    });
    let r = Router::with_clock(RouterSettings::default(), clock).unwrap();
    r.add_instance("a").unwrap();
    let out = Captured::default();
    r.set_decision_log(Some(DecisionLog::new(out.clone())));
    let mut held = Vec::new();
    for (i, t) in [1_500_000_000u64, 2_750_000_000].into_iter().enumerate() {
        now.store(t, std::sync::atomic::Ordering::Relaxed);
        held.push(
            r.pick(&Request::from_tokens(format!("{i}"), vec![1; 10]))
                .unwrap(),
        );
    }
    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    let records: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records[0]["clock_ns"], 1_500_000_000u64);
    assert_eq!(records[1]["clock_ns"], 2_750_000_000u64);
    assert!(
        records.iter().all(|r| r.get("time_unix_ns").is_none()),
        "no wall-clock time in a simulation: {text}"
    );
}

#[test]
fn a_reservation_from_another_router_is_refused_and_changes_nothing() {
    // Two routers over the same instance ids: r1 placed the request, r2
    // must not take r1's reservation (it would release load it never gave
    // out, and r1 would leak the request).
    let r1 = router(Policy::LoadOnly, &["src", "b"]);
    let r2 = router(Policy::LoadOnly, &["src", "b"]);
    let request = Request::from_tokens("m", tokens(4, 4096));
    let (_, mut held) = r1.pick(&request).unwrap();
    let (_, _r2_own) = r2
        .pick(&Request::from_tokens("o", tokens(5, 4096)))
        .unwrap();
    // On both routers the trigger would fire for src.
    let drowning = Snapshot {
        num_running: 4,
        pending_prefill_tokens: 60_000,
        ..Snapshot::default()
    };
    for r in [&r1, &r2] {
        r.update_real_state([("src", fresh(drowning))]);
    }
    // The shadows and counters (effective state carries the real state's age).
    let snapshot = |r: &Router| {
        let shadows: Vec<_> = r
            .instances()
            .into_iter()
            .map(|i| (i.instance_id, i.shadow, i.cached_blocks))
            .collect();
        (shadows, r.stats())
    };
    let before = (snapshot(&r1), snapshot(&r2));
    let refused = |err: Error| {
        assert!(matches!(err, Error::ForeignReservation { .. }), "{err}");
        let text = err.to_string();
        assert!(text.contains("another router"), "{text}");
        assert!(text.contains("pass it to the router whose pick"), "{text}");
    };
    refused(r2.migrate_reservation(&request, &mut held).unwrap_err());
    refused(r2.migration_advice_for(&request, &held).unwrap_err());
    assert_eq!(held.instance_id(), "src");
    assert!(!held.is_released());
    assert_eq!(
        (snapshot(&r1), snapshot(&r2)),
        before,
        "a refused call changes nothing on either router"
    );
    // Its own router still takes it, and completing it releases it there.
    assert!(r1.migration_advice_for(&request, &held).unwrap().migrate);
    held.complete();
    assert_eq!(shadow(&r1, "src"), ShadowCounters::default());
    assert_eq!(
        shadow(&r2, "src").num_requests,
        1,
        "r2 keeps its own request"
    );
    // A clone is the same router: its reservations are its own.
    let clone = r1.clone();
    let (_, held) = clone.pick(&request).unwrap();
    assert!(r1.migration_advice_for(&request, &held).is_ok());
    assert_eq!(r1.id(), clone.id());
    assert_ne!(r1.id(), r2.id());
}

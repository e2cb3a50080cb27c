//! `cache_knowledge`: cache hits from the engines' digests, the fallback to
//! the router's estimate, and session adoption (docs/ROUTING.md, "Where real
//! state is used", "The policies").

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use engine_state_shm_format::blocks::{block_hashes, BLOCK_TOKENS};
use engine_state_shm_format::{CacheDigest, Snapshot};

use crate::{
    CacheKnowledge, Clock, DecisionLog, Policy, RealState, RealStateUse, Reason, Request, Router,
    RouterSettings,
};

/// A router on a clock the test moves (ns).
fn router(settings: RouterSettings, ids: &[&str]) -> (Router, Arc<AtomicU64>) {
    let now = Arc::new(AtomicU64::new(1_000_000_000));
    let clock = Clock::from_fn({
        let now = Arc::clone(&now);
        move || now.load(Ordering::Relaxed)
    });
    let router = Router::with_clock(settings, clock).unwrap();
    for id in ids {
        router.add_instance(id).unwrap();
    }
    (router, now)
}

fn settings(policy: Policy, cache_knowledge: CacheKnowledge) -> RouterSettings {
    RouterSettings {
        policy,
        cache_knowledge,
        ..RouterSettings::default()
    }
}

fn tokens(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| i.wrapping_mul(2_654_435_761) ^ seed)
        .collect()
}

/// Idle, fresh real state read now, with a digest of `blocks`.
fn with_digest(now: &AtomicU64, blocks: &[u64]) -> RealState {
    RealState::fresh(Snapshot::default(), Duration::from_millis(5))
        .read_at(now.load(Ordering::Relaxed), Duration::ZERO)
        .with_cache(CacheDigest::new(1, 0, blocks.to_vec()))
}

#[test]
fn engine_knowledge_is_the_leading_run_of_the_prompt_in_the_digest() {
    let prompt = tokens(1, 4 * BLOCK_TOKENS + 100);
    let blocks = block_hashes(&prompt);
    for knowledge in [CacheKnowledge::Engine, CacheKnowledge::Estimated] {
        let (r, now) = router(settings(Policy::Unified, knowledge), &["a", "b"]);
        // b's engine holds the first three blocks (and one block of nothing
        // this prompt has); the router sent nothing anywhere.
        let mut held = blocks[..3].to_vec();
        held.push(0xdead);
        r.update_real_state([("b", with_digest(&now, &held))]);
        let (decision, _held) = r.pick(&Request::from_tokens("r1", prompt.clone())).unwrap();
        match knowledge {
            CacheKnowledge::Engine => {
                assert_eq!(decision.instance_id, "b", "the smaller new prefill");
                assert_eq!(decision.cache_hit_tokens, 3 * BLOCK_TOKENS as u64);
                assert_eq!(decision.cache_knowledge, CacheKnowledge::Engine);
                let reserved = r.instance("b").unwrap().shadow.pending_prefill_tokens;
                assert_eq!(reserved, BLOCK_TOKENS as u64 + 100, "the reserved prefill");
            }
            CacheKnowledge::Estimated => {
                assert_eq!(decision.instance_id, "a", "a tie: round-robin");
                assert_eq!(decision.cache_hit_tokens, 0);
                assert_eq!(decision.cache_knowledge, CacheKnowledge::Estimated);
            }
        }
    }
}

#[test]
fn an_engine_without_a_fresh_digest_falls_back_to_the_estimate() {
    let prompt = tokens(2, 3 * BLOCK_TOKENS);
    let blocks = block_hashes(&prompt);
    let (r, now) = router(settings(Policy::LMetric, CacheKnowledge::Engine), &["a"]);
    // The router sent the prompt to a: its estimate holds all three blocks.
    drop(r.pick(&Request::from_tokens("r0", prompt.clone())).unwrap());
    let hit = |id: &str| {
        let (d, _held) = r.pick(&Request::from_tokens(id, prompt.clone())).unwrap();
        (d.cache_hit_tokens / BLOCK_TOKENS as u64, d.cache_knowledge)
    };
    assert_eq!(hit("no state"), (3, CacheKnowledge::Estimated));

    // Fresh state without a digest (an engine that publishes none).
    let plain = RealState::fresh(Snapshot::default(), Duration::ZERO)
        .read_at(now.load(Ordering::Relaxed), Duration::ZERO);
    r.update_real_state([("a", plain)]);
    assert_eq!(hit("no digest"), (3, CacheKnowledge::Estimated));

    // A fresh digest wins, even where it holds less than the estimate.
    r.update_real_state([("a", with_digest(&now, &blocks[..1]))]);
    assert_eq!(hit("fresh"), (1, CacheKnowledge::Engine));

    // The same reading once its heartbeat is older than real_state_expiry_s.
    now.fetch_add(2_000_000_001, Ordering::Relaxed);
    assert_eq!(hit("expired"), (3, CacheKnowledge::Estimated));

    // A digest with state the reader judged stale is never used.
    let stale = RealState {
        fresh: false,
        ..with_digest(&now, &blocks[..1])
    };
    r.update_real_state([("a", stale)]);
    assert_eq!(hit("stale"), (3, CacheKnowledge::Estimated));
}

/// `real_state_use = never` is about load: the engines' load is never
/// merged, but with `cache_knowledge = engine` their digests still give
/// the cache hits; with `estimated` nothing of the engines is read.
#[test]
fn real_state_use_never_reads_digests_but_never_load() {
    let prompt = tokens(3, 2 * BLOCK_TOKENS);
    let blocks = block_hashes(&prompt);
    for (knowledge, want) in [
        (CacheKnowledge::Engine, ("b", 2 * BLOCK_TOKENS as u64)),
        (CacheKnowledge::Estimated, ("a", 0)),
    ] {
        let settings = RouterSettings {
            real_state_use: RealStateUse::Never,
            ..settings(Policy::Unified, knowledge)
        };
        let (r, now) = router(settings, &["a", "b"]);
        // b is busy by its own account: never merged under `never`.
        let busy = RealState {
            snapshot: Snapshot {
                num_running: 50,
                pending_prefill_tokens: 500_000,
                ..Snapshot::default()
            },
            ..with_digest(&now, &blocks)
        };
        r.update_real_state([("b", busy)]);
        let (d, _held) = r.pick(&Request::from_tokens("r", prompt.clone())).unwrap();
        assert_eq!(
            (d.instance_id.as_str(), d.cache_hit_tokens),
            want,
            "{knowledge}"
        );
        assert_eq!(d.cache_knowledge, knowledge);
        // b chosen for its cache although it is drowning: load not merged.
        assert!(!d.consulted_real_state);
    }
}

#[test]
fn the_migration_target_is_scored_by_the_digest() {
    let prompt = tokens(4, 8 * BLOCK_TOKENS);
    let blocks = block_hashes(&prompt);
    let (r, now) = router(
        settings(Policy::Unified, CacheKnowledge::Engine),
        &["a", "b", "c"],
    );
    let busy = Snapshot {
        num_running: 4,
        pending_prefill_tokens: 100_000,
        ..Snapshot::default()
    };
    let at = now.load(Ordering::Relaxed);
    r.update_real_state([
        (
            "a",
            RealState::fresh(busy, Duration::ZERO).read_at(at, Duration::ZERO),
        ),
        ("c", with_digest(&now, &blocks[..6])),
    ]);
    let advice = r
        .migration_advice(&Request::from_tokens("r", prompt), "a")
        .unwrap();
    assert!(advice.migrate, "{advice:?}");
    assert_eq!(
        advice.target_instance.as_deref(),
        Some("c"),
        "the most cached"
    );
}

/// One replica bound the session; another, which has never seen it, adopts
/// it where the digests say its cache is.
#[test]
fn a_session_bound_elsewhere_is_adopted_where_its_cache_is() {
    for policy in [Policy::Sticky, Policy::Unified] {
        let prompt = tokens(5, 4 * BLOCK_TOKENS);
        let blocks = block_hashes(&prompt);
        let (r, now) = router(settings(policy, CacheKnowledge::Engine), &["a", "b"]);
        // b is the busier by this replica's own count: placement would choose a.
        let (_, _other) = r
            .reserve_on(&Request::from_tokens("other", tokens(9, 100)), "b")
            .unwrap();
        r.update_real_state([("b", with_digest(&now, &blocks[..3]))]);
        let turn = |id: &str| {
            let request = Request::from_tokens(id, prompt.clone()).with_session("s");
            r.pick(&request).unwrap()
        };
        let (first, _h1) = turn("t1");
        assert_eq!(
            (first.instance_id.as_str(), first.reason),
            ("b", Reason::Adoption),
            "{policy:?}"
        );
        let (second, _h2) = turn("t2");
        assert_eq!(
            (second.instance_id.as_str(), second.reason),
            ("b", Reason::Affinity),
            "{policy:?}: bound by the adoption"
        );
    }
}

#[test]
fn adoption_needs_more_than_half_of_the_prompt_and_engine_knowledge() {
    let prompt = tokens(6, 4 * BLOCK_TOKENS);
    let blocks = block_hashes(&prompt);
    for (knowledge, held, adopted) in [
        (CacheKnowledge::Engine, 2, false), // exactly half
        (CacheKnowledge::Engine, 3, true),
        (CacheKnowledge::Estimated, 4, false),
    ] {
        let (r, now) = router(settings(Policy::Sticky, knowledge), &["a", "b"]);
        let (_, _other) = r
            .reserve_on(&Request::from_tokens("other", tokens(9, 100)), "b")
            .unwrap();
        r.update_real_state([("b", with_digest(&now, &blocks[..held]))]);
        let request = Request::from_tokens("t1", prompt.clone()).with_session("s");
        let (d, _h) = r.pick(&request).unwrap();
        let want = match adopted {
            true => ("b", Reason::Adoption),
            false => ("a", Reason::Placement),
        };
        assert_eq!(
            (d.instance_id.as_str(), d.reason),
            want,
            "{knowledge:?}, {held} blocks"
        );
    }
}

#[test]
fn adoption_prefers_the_longest_prefix_and_skips_engines_shutting_down() {
    let prompt = tokens(7, 6 * BLOCK_TOKENS);
    let blocks = block_hashes(&prompt);
    let (r, now) = router(
        settings(Policy::Sticky, CacheKnowledge::Engine),
        &["a", "b", "c"],
    );
    let closing = RealState {
        snapshot: Snapshot {
            flags: engine_state_shm_format::FLAG_SHUTTING_DOWN,
            ..Snapshot::default()
        },
        ..with_digest(&now, &blocks)
    };
    r.update_real_state([
        ("a", closing),
        ("b", with_digest(&now, &blocks[..4])),
        ("c", with_digest(&now, &blocks[..5])),
    ]);
    let request = Request::from_tokens("t1", prompt).with_session("s");
    let (d, _h) = r.pick(&request).unwrap();
    assert_eq!((d.instance_id.as_str(), d.reason), ("c", Reason::Adoption));
}

/// An adopted session's instance still has to pass unified's overload check.
#[test]
fn unified_falls_back_from_an_overloaded_adopted_instance() {
    let prompt = tokens(8, 4 * BLOCK_TOKENS);
    let blocks = block_hashes(&prompt);
    let (r, now) = router(
        settings(Policy::Unified, CacheKnowledge::Engine),
        &["a", "b", "c"],
    );
    // 10 requests against a limit of max(10 / 3, 1) × 2.
    let busy = Snapshot {
        num_running: 10,
        pending_prefill_tokens: 50_000,
        ..Snapshot::default()
    };
    let state = RealState {
        snapshot: busy,
        ..with_digest(&now, &blocks)
    };
    r.update_real_state([("b", state)]);
    let request = Request::from_tokens("t1", prompt).with_session("s");
    let (d, _h) = r.pick(&request).unwrap();
    assert_eq!(
        (d.instance_id.as_str(), d.reason),
        ("a", Reason::FallbackOverloaded)
    );
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
fn the_decision_log_says_which_knowledge_each_hit_came_from() {
    let prompt = tokens(9, 2 * BLOCK_TOKENS);
    let blocks = block_hashes(&prompt);
    let (r, now) = router(
        settings(Policy::Unified, CacheKnowledge::Engine),
        &["a", "b"],
    );
    let out = Captured::default();
    r.set_decision_log(Some(DecisionLog::new(out.clone())));
    r.update_real_state([("b", with_digest(&now, &blocks))]);
    let (_, _h) = r.pick(&Request::from_tokens("r", prompt)).unwrap();
    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    let record: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(record["cache_knowledge_setting"], "engine");
    assert_eq!(record["instance"], "b");
    assert_eq!(record["cache_knowledge"], "engine");
    assert_eq!(record["candidates"][0]["cache_knowledge"], "estimated");
    assert_eq!(record["candidates"][1]["cache_knowledge"], "engine");
    assert_eq!(record["candidates"][1]["cache_hit_tokens"], 1024);
}

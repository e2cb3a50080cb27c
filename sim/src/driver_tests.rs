//! The driver end to end: conservation, determinism, and what one engine or
//! one session must give whatever the policy.

use engine_state_router::{CacheKnowledge, Policy, RealStateUse};

use super::*;
use crate::agentic::AgenticSpec;
use crate::metrics::Summary;

const POLICIES: [Policy; 4] = [
    Policy::LoadOnly,
    Policy::LMetric,
    Policy::Sticky,
    Policy::Unified,
];

fn agentic(sessions: usize, seed: u64) -> Trace {
    AgenticSpec {
        sessions,
        seed,
        session_interarrival_s: 0.5,
        ..AgenticSpec::default()
    }
    .generate()
}

fn config(policy: Policy, engines: usize, feed: &str, routers: usize) -> RunConfig {
    RunConfig {
        engines,
        routers,
        feed: feed.parse().unwrap(),
        router: RouterSettings {
            policy,
            real_state_use: RealStateUse::Always,
            ..RouterSettings::default()
        },
        ..RunConfig::default()
    }
}

fn assert_conserved(trace: &Trace, config: &RunConfig, result: &RunResult) {
    let name = config.name();
    let served = result.requests.iter().filter(|r| !r.rejected).count();
    assert_eq!(
        served,
        trace.requests.len(),
        "{name}: nothing rejected here"
    );
    for (i, r) in result.requests.iter().enumerate() {
        assert!(
            r.arrival_ns <= r.first_token_ns && r.first_token_ns <= r.finish_ns && r.finish_ns > 0,
            "{name}: request {i} did not finish in order: {r:?}"
        );
    }
    let total = result
        .router_stats
        .iter()
        .fold(RouterStats::default(), |mut sum, s| {
            sum.decisions += s.decisions;
            sum.completed += s.completed;
            sum.failed += s.failed;
            sum.dropped += s.dropped;
            sum.migrated += s.migrated;
            sum
        });
    assert_eq!(
        total.completed, served as u64,
        "{name}: every request completed once"
    );
    assert_eq!((total.failed, total.dropped), (0, 0), "{name}");
    assert_eq!(total.migrated, result.migrations, "{name}");
    assert_eq!(total.decisions, served as u64 + result.migrations, "{name}");
    assert_eq!(
        result.leaked_shadows, 0,
        "{name}: every shadow counter back to zero"
    );
    let samples = &result.engine_load;
    assert!(
        samples
            .windows(2)
            .all(|w| w[1].0 == w[0].0 + LOAD_SAMPLE_NS),
        "{name}"
    );
    assert!(
        samples.iter().all(|(_, load)| load.len() == config.engines),
        "{name}"
    );
}

#[test]
fn every_request_finishes_once_and_every_router_counter_returns_to_zero() {
    let trace = agentic(40, 3);
    for policy in POLICIES {
        for (feed, routers) in [
            ("none", 1),
            ("periodic:50+5", 1),
            ("periodic:250", 4),
            ("scraped:30000", 2),
        ] {
            let config = config(policy, 4, feed, routers);
            let result = simulate(&trace, &config).unwrap();
            assert_conserved(&trace, &config, &result);
        }
    }
}

#[test]
fn the_same_seed_gives_identical_output() {
    let run = |seed| {
        let trace = agentic(30, seed);
        let config = RunConfig {
            split: Split::Session,
            ..config(Policy::Unified, 3, "periodic:50", 2)
        };
        let result = simulate(&trace, &config).unwrap();
        (result.requests.clone(), Summary::of(&config, &result))
    };
    assert_eq!(run(5), run(5));
    assert_ne!(run(5).0, run(6).0);
}

#[test]
fn with_one_engine_every_policy_gives_identical_latencies() {
    let trace = agentic(25, 4);
    let latencies = |policy| {
        let result = simulate(&trace, &config(policy, 1, "periodic:50", 1)).unwrap();
        assert_eq!(result.migrations, 0, "nowhere to migrate to");
        result.requests
    };
    let reference = latencies(Policy::LoadOnly);
    for policy in POLICIES {
        assert_eq!(latencies(policy), reference, "{policy}");
    }
}

#[test]
fn with_one_session_sticky_and_unified_place_every_turn_on_one_engine() {
    // Turns far apart and small tool results: the session's instance is never
    // overloaded and its cache stays warm (hit ratio > 0.5), so unified sticks too.
    let trace = AgenticSpec {
        sessions: 1,
        turns_min: 12.0,
        think_s: 120.0,
        tool_result_tokens: (100, 500),
        ..AgenticSpec::default()
    }
    .generate();
    assert!(trace.requests.len() >= 10);
    for policy in [Policy::Sticky, Policy::Unified] {
        for feed in ["none", "periodic:50"] {
            let config = config(policy, 4, feed, 1);
            let result = simulate(&trace, &config).unwrap();
            assert_eq!(
                engines_per_session(&result.requests),
                vec![1],
                "{}",
                config.name()
            );
        }
    }
}

#[test]
fn a_request_too_long_for_the_kv_cache_is_rejected_not_routed() {
    let mut trace = agentic(3, 1);
    trace.requests[0].input_len = 10_000_000;
    let config = config(Policy::LoadOnly, 2, "none", 1);
    let result = simulate(&trace, &config).unwrap();
    assert!(result.requests[0].rejected);
    assert_eq!(
        result.router_stats[0].completed,
        trace.requests.len() as u64 - 1
    );
}

#[test]
fn the_decision_log_gets_one_record_per_decision_per_replica() {
    let trace = agentic(5, 2);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("decisions.jsonl");
    let config = RunConfig {
        decision_log: Some(path.clone()),
        ..config(Policy::Unified, 2, "periodic:50", 2)
    };
    let result = simulate(&trace, &config).unwrap();
    let arrivals: HashSet<u64> = result.requests.iter().map(|r| r.arrival_ns).collect();
    let mut lines = 0;
    for replica in 0..2 {
        let text = std::fs::read_to_string(format!("{}.r{replica}", path.display())).unwrap();
        let mut last = 0;
        for line in text.lines() {
            let record: serde_json::Value = serde_json::from_str(line).unwrap();
            assert!(
                record["instance"].is_string() && record["seq"].is_u64(),
                "{line}"
            );
            // Simulated time: each decision happens at an arrival.
            let at = record["clock_ns"].as_u64().unwrap();
            assert!(arrivals.contains(&at) && at >= last, "{line}");
            assert!(record.get("time_unix_ns").is_none(), "{line}");
            last = at;
            lines += 1;
        }
    }
    assert_eq!(lines as u64, result.decisions + result.migrations);
}

#[test]
fn late_completions_still_release_everything_and_keep_the_shadow_high_meanwhile() {
    let trace = agentic(30, 7);
    let exact = config(Policy::LoadOnly, 4, "none", 1);
    let late = RunConfig {
        late_completion_fraction: 0.5,
        late_completion_ns: 60_000_000_000,
        ..exact.clone()
    };
    let result = simulate(&trace, &late).unwrap();
    assert_conserved(&trace, &late, &result);
    let baseline = simulate(&trace, &exact).unwrap();
    assert_ne!(
        result.requests, baseline.requests,
        "an over-counting shadow places differently"
    );
}

#[test]
fn real_state_changes_decisions_only_where_it_reaches_the_router() {
    let trace = agentic(40, 3);
    let changed = |config: &RunConfig| {
        let result = simulate(&trace, config).unwrap();
        let summary = Summary::of(config, &result);
        assert_eq!(
            summary.decisions_real_changed,
            result.decisions_real_changed as f64 / result.decisions as f64
        );
        result.decisions_real_changed
    };
    // No feed: nothing to consult, nothing changed.
    assert_eq!(changed(&config(Policy::LoadOnly, 4, "none", 4)), 0);
    // Real state never used: nothing changed.
    let never = RunConfig {
        router: RouterSettings {
            policy: Policy::LoadOnly,
            real_state_use: RealStateUse::Never,
            ..RouterSettings::default()
        },
        ..config(Policy::LoadOnly, 4, "periodic:50", 4)
    };
    assert_eq!(changed(&never), 0);
    // Four replicas: each shadow sees a quarter of the traffic, so the
    // engines' real load must overrule it for some picks.
    assert!(changed(&config(Policy::LoadOnly, 4, "periodic:50", 4)) > 0);
}

/// With `cache_knowledge = engine` and a periodic feed, the engines' digests
/// reach the replicas and steer them: hits come from the engine, sessions
/// bound by another replica are adopted, and the router's believed hits
/// match the engines' at admission more closely than the replicas' own
/// estimates do. Without a periodic feed no digest is read.
#[test]
fn engine_digests_reach_the_replicas_and_are_used() {
    let trace = agentic(40, 3);
    let run = |feed: &str, knowledge: CacheKnowledge| {
        let mut config = config(Policy::Unified, 4, feed, 4);
        config.router.cache_knowledge = knowledge;
        config.router.real_state_use = RealStateUse::Placement;
        let result = simulate(&trace, &config).unwrap();
        assert_conserved(&trace, &config, &result);
        (Summary::of(&config, &result), result)
    };
    let (engine, engine_result) = run("periodic:50+1", CacheKnowledge::Engine);
    let (estimated, estimated_result) = run("periodic:50+1", CacheKnowledge::Estimated);
    assert_eq!(engine.config, "unified/placement/periodic:50+1/engine/r4");
    assert_eq!(engine.cache_knowledge, "engine");
    assert_eq!(estimated.cache_knowledge, "estimated");
    assert!(engine.decisions_engine_knowledge > 0.5, "{engine:?}");
    assert!(engine_result.adoptions > 0, "{engine:?}");
    assert_eq!(estimated_result.decisions_engine_knowledge, 0);
    assert_eq!(estimated_result.adoptions, 0);
    let miscounted = |s: &Summary| s.hit_overcounted + s.hit_undercounted;
    assert!(
        miscounted(&engine) < miscounted(&estimated),
        "{engine:?} vs {estimated:?}"
    );
    assert!(engine.engines_per_session_mean < estimated.engines_per_session_mean);

    let (scraped, scraped_result) = run("scraped:1000", CacheKnowledge::Engine);
    assert_eq!(
        scraped.cache_knowledge, "estimated",
        "scrapes carry no digest"
    );
    assert_eq!(scraped_result.decisions_engine_knowledge, 0);
}

/// `config` with migration off and real state used as `real_state_use`,
/// the replicas sharing their reservations `share` ns late (None: not).
fn sharing(
    policy: Policy,
    real_state_use: RealStateUse,
    routers: usize,
    share: Option<u64>,
) -> RunConfig {
    let mut config = config(policy, 4, "periodic:50", routers);
    config.router.real_state_use = real_state_use;
    config.migration = false;
    config.share_delay_ns = share;
    config
}

#[test]
fn shared_reservations_reach_every_replica_and_return_to_zero() {
    let trace = agentic(40, 3);
    for share in [0, 1_000_000, 50_000_000] {
        for (policy, real_state_use) in [
            (Policy::Unified, RealStateUse::Placement),
            (Policy::LMetric, RealStateUse::Never),
        ] {
            let config = sharing(policy, real_state_use, 4, Some(share));
            let result = simulate(&trace, &config).unwrap();
            assert_conserved(&trace, &config, &result);
            let name = config.name();
            assert!(
                name.ends_with(&format!("/share:{}", share / 1_000_000)),
                "{name}"
            );
            // Before each pick, 3 peers × 4 engines once each has published.
            assert!(
                result.peer_entries >= 12 * (result.decisions - 4),
                "{name}: {} entries for {} picks",
                result.peer_entries,
                result.decisions
            );
            assert_eq!(
                result.leaked_peer_reservations, 0,
                "{name}: every replica's view of its peers back to zero"
            );
            let summary = Summary::of(&config, &result);
            assert_eq!(summary.share_delay_ms, Some(share as f64 / 1e6));
        }
    }
    let unshared = sharing(Policy::Unified, RealStateUse::Placement, 4, None);
    let result = simulate(&trace, &unshared).unwrap();
    assert_eq!(result.peer_entries, 0);
    assert_eq!(Summary::of(&unshared, &result).share_delay_ms, None);
    assert_eq!(unshared.name(), "unified/placement/periodic:50/engine/r4");
}

#[test]
fn with_one_router_sharing_changes_nothing() {
    let trace = agentic(40, 3);
    for policy in POLICIES {
        let alone = simulate(&trace, &config(policy, 4, "periodic:50", 1)).unwrap();
        for share in [0, 10_000_000] {
            let config = RunConfig {
                share_delay_ns: Some(share),
                ..config(policy, 4, "periodic:50", 1)
            };
            let result = simulate(&trace, &config).unwrap();
            assert_eq!(result.requests, alone.requests, "{}", config.name());
            assert_eq!(result.peer_entries, 0, "no peer to read");
        }
    }
}

/// The claim in small: replicas that see each other's reservations
/// at once come close to one router, where without them they are far off.
#[test]
fn sharing_brings_four_replicas_close_to_one_router() {
    for seed in [1, 3] {
        let trace = agentic(40, seed);
        for (policy, real_state_use, margin) in [
            (Policy::Unified, RealStateUse::Placement, 0.5),
            (Policy::LMetric, RealStateUse::Never, 1.0),
        ] {
            let ttft = |routers, share| {
                let config = sharing(policy, real_state_use, routers, share);
                let summary = Summary::of(&config, &simulate(&trace, &config).unwrap());
                (summary.ttft_mean_s, summary.ttft_p90_s)
            };
            let one = ttft(1, None);
            let unshared = ttft(4, None);
            let shared = ttft(4, Some(0));
            let gap = |(mean, p90): (f64, f64)| ((mean - one.0).abs(), (p90 - one.1).abs());
            let (shared_gap, unshared_gap) = (gap(shared), gap(unshared));
            let what = format!(
                "seed {seed} {policy}: 1 router {one:?}, 4 replicas {unshared:?}, shared {shared:?}"
            );
            assert!(
                unshared.0 > one.0 * 1.3,
                "replicas alone are far off: {what}"
            );
            assert!(shared_gap.0 < margin * unshared_gap.0, "TTFT mean: {what}");
            assert!(shared_gap.1 < margin * unshared_gap.1, "TTFT p90: {what}");
        }
    }
}

//! Hand-computed examples for every policy (docs/ROUTING.md, "The policies"),
//! edge cases included.

use super::*;

const INPUT: u64 = 4096;

fn cand(num_requests: u64, pending: u64, decode: u64, hit: u64) -> Candidate {
    let state = EffectiveState {
        num_requests,
        pending_prefill_tokens: pending,
        ongoing_decode_tokens: decode,
        ..EffectiveState::default()
    };
    Candidate {
        state,
        cache_hit_tokens: hit,
        cache_knowledge: crate::CacheKnowledge::Estimated,
        shutting_down: false,
    }
}

/// [`super::choose`] where some candidate is open (every example but the
/// shutting-down ones).
fn choose(
    s: &RouterSettings,
    c: &[Candidate],
    input_len: u64,
    bound: Option<usize>,
    round_robin: &mut RoundRobin,
) -> Choice {
    super::choose(s, c, input_len, bound, round_robin)
        .expect("an instance that is not shutting down")
}

fn settings(policy: Policy) -> RouterSettings {
    RouterSettings {
        policy,
        ..RouterSettings::default()
    }
}

fn pick(s: &RouterSettings, c: &[Candidate], bound: Option<usize>) -> Choice {
    choose(s, c, INPUT, bound, &mut RoundRobin::default())
}

#[test]
fn load_only_takes_the_fewest_requests() {
    let c = [cand(3, 0, 0, 0), cand(1, 90_000, 0, 0), cand(2, 0, 0, 0)];
    let choice = pick(&settings(Policy::LoadOnly), &c, None);
    assert_eq!((choice.index, choice.reason), (1, Reason::LeastLoaded));
}

#[test]
fn ties_cycle_round_robin_in_instance_order() {
    let s = settings(Policy::LoadOnly);
    let idle = [cand(0, 0, 0, 0); 3];
    let mut round_robin = RoundRobin::default();
    let picks: Vec<_> = (0..4)
        .map(|_| choose(&s, &idle, INPUT, None, &mut round_robin).index)
        .collect();
    assert_eq!(picks, [0, 1, 2, 0]);

    // Tied {0, 1} and the cursor at 3: nothing tied at or after it, so wrap to 0.
    let mut round_robin = RoundRobin { cursor: 3 };
    let c = [cand(1, 0, 0, 0), cand(1, 0, 0, 0), cand(5, 0, 0, 0)];
    assert_eq!(choose(&s, &c, INPUT, None, &mut round_robin).index, 0);
    assert_eq!(choose(&s, &c, INPUT, None, &mut round_robin).index, 1);
}

#[test]
fn lmetric_hand_computed() {
    // A: (1000 + 4096) × 2 = 10,192
    // B: (3000 + 2048) × 1 =  5,048  ← least
    // C: (1000 + 1024) × 4 =  8,096
    let c = [
        cand(2, 1000, 0, 0),
        cand(1, 3000, 0, 2048),
        cand(4, 1000, 0, 3072),
    ];
    let s = settings(Policy::LMetric);
    assert_eq!(lmetric(&c[0], INPUT), 10_192);
    assert_eq!(lmetric(&c[1], INPUT), 5_048);
    assert_eq!(lmetric(&c[2], INPUT), 8_096);
    let choice = pick(&s, &c, None);
    assert_eq!((choice.index, choice.reason), (1, Reason::Lmetric));
    assert_eq!(score(&s, &c[1], INPUT), 5048.0);
}

#[test]
fn zero_requests_with_heavy_decode_lmetric_is_blind_unified_is_not() {
    // A: no requests but 500k decode tokens (e.g. real state lagging); B: one request.
    let c = [cand(0, 0, 500_000, 0), cand(1, 0, 0, 0)];
    // lmetric: A = (0 + 4096) × 0 = 0, B = 4096 × 1: A, as docs/ROUTING.md,
    // "The policies" defines it.
    assert_eq!(pick(&settings(Policy::LMetric), &c, None).index, 0);

    // unified, decode_weight 0.01: A = (4096 + 5000) × max(0, 1) = 9096, B = 4096 × 1.
    let s = RouterSettings {
        decode_weight: 0.01,
        ..settings(Policy::Unified)
    };
    assert_eq!(unified(&c[0], INPUT, 0.01), 9096.0);
    assert_eq!(pick(&s, &c, None).index, 1);

    // unified, decode_weight 0 (default): both 4096 and equal new prefill;
    // fewer requests wins: A.
    assert_eq!(pick(&settings(Policy::Unified), &c, None).index, 0);
}

#[test]
fn unified_sticks_to_a_warm_instance_within_the_overload_limit() {
    // Session on 1: hit 3072/4096 = 0.75 > 0.5; mean requests (2+3+1)/3 = 2,
    // limit max(2, 1) × 2.0 = 4 ≥ 3: affinity, though 2 has the lower score.
    let c = [cand(2, 0, 0, 0), cand(3, 8000, 0, 3072), cand(1, 0, 0, 0)];
    let choice = pick(&settings(Policy::Unified), &c, Some(1));
    assert_eq!((choice.index, choice.reason), (1, Reason::Affinity));
    let check = choice.affinity.unwrap();
    assert_eq!(
        (check.hit_ratio, check.num_requests, check.limit),
        (0.75, 3, 4.0)
    );
}

#[test]
fn unified_leaves_an_overloaded_session_instance() {
    // Session on 1 (warm, 0.75) with 5 requests; mean (1+5+0)/3 = 2, limit 4 < 5.
    // Fallback: A = 4096 × 1 = 4096, B = 1024 × 5 = 5120, C = 4096 × max(0,1) = 4096;
    // A and C tie on score and new prefill (4096); C has fewer requests.
    let c = [cand(1, 0, 0, 0), cand(5, 0, 0, 3072), cand(0, 0, 0, 0)];
    let choice = pick(&settings(Policy::Unified), &c, Some(1));
    assert_eq!(
        (choice.index, choice.reason),
        (2, Reason::FallbackOverloaded)
    );

    // With the tuned overload_factor 1.3 the limit is 2.6: 3 requests overload.
    let c = [cand(2, 0, 0, 0), cand(3, 0, 0, 3072), cand(1, 0, 0, 0)];
    let tuned = RouterSettings {
        overload_factor: 1.3,
        ..settings(Policy::Unified)
    };
    assert_eq!(pick(&tuned, &c, Some(1)).reason, Reason::FallbackOverloaded);
}

#[test]
fn unified_limit_uses_at_least_one_request_as_the_mean() {
    // Mean (0+2+0)/3 = 0.67 → max(0.67, 1) × 2 = 2: exactly at the limit sticks.
    let c = [cand(0, 0, 0, 0), cand(2, 0, 0, 4096), cand(0, 0, 0, 0)];
    assert_eq!(
        pick(&settings(Policy::Unified), &c, Some(1)).reason,
        Reason::Affinity
    );
    let c = [cand(0, 0, 0, 0), cand(3, 0, 0, 4096), cand(0, 0, 0, 0)];
    assert_eq!(
        pick(&settings(Policy::Unified), &c, Some(1)).reason,
        Reason::FallbackOverloaded
    );
}

#[test]
fn unified_leaves_a_session_instance_with_a_cold_cache() {
    // Session on 0 with no requests at all but no cache: ratio 0 → fallback.
    let c = [cand(0, 0, 0, 0), cand(1, 0, 0, 4096), cand(0, 0, 0, 0)];
    // Fallback: 0 = 4096 × 1; 1 = 0 × 1 = 0 ← least; 2 = 4096.
    let choice = pick(&settings(Policy::Unified), &c, Some(0));
    assert_eq!(
        (choice.index, choice.reason),
        (1, Reason::FallbackColdCache)
    );

    // A ratio of exactly 0.5 is not above 0.5: still cold.
    let c = [cand(0, 0, 0, 2048), cand(0, 0, 0, 0)];
    assert_eq!(
        pick(&settings(Policy::Unified), &c, Some(0)).reason,
        Reason::FallbackColdCache
    );
    // An empty prompt has no cache ratio: cold, never a division by zero.
    let choice = choose(
        &settings(Policy::Unified),
        &c,
        0,
        Some(0),
        &mut RoundRobin::default(),
    );
    assert_eq!(choice.reason, Reason::FallbackColdCache);
}

#[test]
fn unified_ranks_by_score_then_new_prefill_then_requests() {
    // A: (0 + 2048) × 2 = 4096; B: (0 + 4096) × 1 = 4096: tie; A has less new prefill.
    let c = [cand(1, 0, 0, 0), cand(2, 0, 0, 2048)];
    let choice = pick(&settings(Policy::Unified), &c, None);
    assert_eq!((choice.index, choice.reason), (1, Reason::Placement));
}

#[test]
fn unified_full_ties_cycle_round_robin() {
    let s = settings(Policy::Unified);
    let c = [cand(1, 100, 0, 0); 3];
    let mut round_robin = RoundRobin::default();
    let picks: Vec<_> = (0..3)
        .map(|_| choose(&s, &c, INPUT, None, &mut round_robin).index)
        .collect();
    assert_eq!(picks, [0, 1, 2]);
}

#[test]
fn sticky_follows_the_session_whatever_the_load() {
    let c = [cand(100, 90_000, 0, 0), cand(0, 0, 0, 0)];
    let s = settings(Policy::Sticky);
    assert_eq!(pick(&s, &c, Some(0)).reason, Reason::Affinity);
    assert_eq!(pick(&s, &c, Some(0)).index, 0);
    let first = pick(&s, &c, None);
    assert_eq!((first.index, first.reason), (1, Reason::Placement));
}

#[test]
fn no_policy_chooses_an_instance_that_is_shutting_down() {
    // Instance 1 is the least loaded by every score, but shutting down.
    let mut c = [
        cand(3, 9000, 0, 0),
        cand(0, 0, 0, 4096),
        cand(2, 5000, 0, 0),
    ];
    c[1].shutting_down = true;
    for policy in [
        Policy::LoadOnly,
        Policy::LMetric,
        Policy::Sticky,
        Policy::Unified,
    ] {
        let choice = pick(&settings(policy), &c, None);
        assert_eq!(choice.index, 2, "{policy}");
    }
    for open in &mut c {
        open.shutting_down = true;
    }
    for policy in [
        Policy::LoadOnly,
        Policy::LMetric,
        Policy::Sticky,
        Policy::Unified,
    ] {
        let none = super::choose(
            &settings(policy),
            &c,
            INPUT,
            None,
            &mut RoundRobin::default(),
        );
        assert_eq!(none, None, "{policy}: every instance shutting down");
    }
}

//! Property tests: shadow accounting, the merge, and stale state.

use std::collections::HashMap;
use std::time::Duration;

use engine_state_router::{
    EffectiveState, Error, Policy, RealState, RealStateUse, Request, Reservation, Router,
    RouterSettings, ShadowCounters,
};
use engine_state_shm_format::{Snapshot, FLAG_SHUTTING_DOWN};
use proptest::prelude::*;

const IDS: [&str; 3] = ["a", "b", "c"];

fn policy() -> impl Strategy<Value = Policy> {
    prop_oneof![
        Just(Policy::LoadOnly),
        Just(Policy::LMetric),
        Just(Policy::Sticky),
        Just(Policy::Unified)
    ]
}

/// A prompt from a small family (shared prefixes, so caches hit) in one of a
/// few sessions.
#[derive(Clone, Debug)]
struct Ask {
    family: u32,
    blocks: usize,
    tail: usize,
    session: Option<u8>,
}

fn ask() -> impl Strategy<Value = Ask> {
    (
        0u32..3,
        0usize..6,
        0usize..512,
        proptest::option::of(0u8..4),
    )
        .prop_map(|(family, blocks, tail, session)| Ask {
            family,
            blocks,
            tail,
            session,
        })
}

fn request(id: usize, ask: &Ask) -> Request {
    let tokens = vec![ask.family; ask.blocks * 512 + ask.tail];
    let request = Request::from_tokens(id.to_string(), tokens);
    match ask.session {
        Some(s) => request.with_session(format!("s{s}")),
        None => request,
    }
}

#[derive(Clone, Debug)]
enum Op {
    Pick(Ask),
    PrefillDone(usize),
    Complete(usize),
    Fail(usize),
    Drop(usize),
    /// `migrate_reservation` of a held request still in prefill.
    Migrate(usize),
    /// Real state: instance, running, pending prefill, fresh, shutting down.
    Real(usize, u64, u64, bool, bool),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => ask().prop_map(Op::Pick),
        2 => any::<usize>().prop_map(Op::PrefillDone),
        1 => any::<usize>().prop_map(Op::Complete),
        1 => any::<usize>().prop_map(Op::Fail),
        1 => any::<usize>().prop_map(Op::Drop),
        1 => any::<usize>().prop_map(Op::Migrate),
        1 => (0..IDS.len(), 0u64..20, 0u64..50_000, any::<bool>(), proptest::bool::weighted(0.2))
            .prop_map(|(i, n, p, f, s)| Op::Real(i, n, p, f, s)),
    ]
}

fn snapshot(num_running: u64, pending: u64) -> Snapshot {
    Snapshot {
        num_running,
        pending_prefill_tokens: pending,
        max_prefill_remaining: pending,
        ..Snapshot::default()
    }
}

/// What the shadow of each instance must be, from the live reservations.
fn expected(held: &[(Reservation, bool, Request)]) -> HashMap<String, ShadowCounters> {
    let mut want: HashMap<String, ShadowCounters> = IDS
        .iter()
        .map(|id| (id.to_string(), ShadowCounters::default()))
        .collect();
    for (r, decoding, _) in held {
        let c = want.get_mut(r.instance_id()).unwrap();
        c.num_requests += 1;
        c.ongoing_tokens += r.input_len();
        if *decoding {
            c.ongoing_decode_tokens += r.input_len();
        } else {
            c.pending_prefill_tokens += r.new_prefill_tokens();
            c.num_prefilling += 1;
            c.max_prefill_remaining = c.max_prefill_remaining.max(r.new_prefill_tokens());
        }
    }
    want
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// After every step each instance's shadow equals the sum of its live
    /// reservations (so no counter ever underflows — debug builds would also
    /// panic on one), and once every request has completed, failed or been
    /// dropped every counter is back to zero.
    #[test]
    fn counters_match_live_reservations_and_return_to_zero(
        policy in policy(),
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        let settings = RouterSettings { policy, prefix_cache_blocks: 8, ..RouterSettings::default() };
        let router = Router::with_instances(settings, IDS).unwrap();
        let mut held: Vec<(Reservation, bool, Request)> = Vec::new();
        for (step, op) in ops.iter().enumerate() {
            let len = held.len();
            let at = |i: &usize| i % len.max(1);
            match op {
                Op::Pick(ask) => {
                    let request = request(step, ask);
                    match router.pick(&request) {
                        Ok((_, reservation)) => held.push((reservation, false, request)),
                        Err(Error::AllShuttingDown) => {}
                        Err(error) => panic!("{error}"),
                    }
                }
                Op::Migrate(i) if !held.is_empty() && !held[at(i)].1 => {
                    let (reservation, _, request) = &mut held[at(i)];
                    router.migrate_reservation(request, reservation).unwrap();
                }
                Op::PrefillDone(i) if !held.is_empty() => {
                    let entry = &mut held[at(i)];
                    entry.0.prefill_done();
                    entry.1 = true;
                }
                Op::Complete(i) if !held.is_empty() => held.swap_remove(at(i)).0.complete(),
                Op::Fail(i) if !held.is_empty() => held.swap_remove(at(i)).0.fail(),
                Op::Drop(i) if !held.is_empty() => drop(held.swap_remove(at(i))),
                Op::Real(i, n, p, fresh, leaving) => {
                    let mut snapshot = snapshot(*n, *p);
                    if *leaving {
                        snapshot.flags = FLAG_SHUTTING_DOWN;
                    }
                    let real = RealState { fresh: *fresh, ..RealState::fresh(snapshot, Duration::ZERO) };
                    router.update_real_state([(IDS[*i], real)]);
                }
                _ => {}
            }
            let want = expected(&held);
            for view in router.instances() {
                prop_assert_eq!(&view.shadow, &want[&view.instance_id], "after {:?}", op);
            }
        }
        let outstanding = held.len() as u64;
        let stats = router.stats();
        prop_assert_eq!(
            stats.decisions,
            stats.completed + stats.failed + stats.dropped + stats.migrated + outstanding
        );
        held.clear();
        for view in router.instances() {
            prop_assert_eq!(view.shadow, ShadowCounters::default());
        }
    }

    /// Fresh: every merged field is at least the shadow's and the snapshot's.
    /// Not fresh: exactly the shadow.
    #[test]
    fn merge_never_reports_less_than_either_input(
        s in proptest::array::uniform6(0u64..1 << 40),
        r in proptest::array::uniform7(0u64..1 << 40),
        fresh in any::<bool>(),
    ) {
        let shadow = ShadowCounters {
            num_requests: s[0], ongoing_tokens: s[1], pending_prefill_tokens: s[2],
            ongoing_decode_tokens: s[3], num_prefilling: s[4], max_prefill_remaining: s[5],
        };
        let snap = Snapshot {
            num_running: r[0], num_waiting: r[1], pending_prefill_tokens: r[2],
            ongoing_decode_tokens: r[3], num_prefilling: r[4], max_prefill_remaining: r[5],
            gpu_blocks_total: r[6], gpu_blocks_free: r[6] / 2, ..Snapshot::default()
        };
        let real = RealState { fresh, ..RealState::fresh(snap, Duration::from_millis(5)) };
        let e = EffectiveState::merge(&shadow, Some(&real));
        if !fresh {
            prop_assert_eq!(e, EffectiveState::shadow_only(&shadow));
            return Ok(());
        }
        let pairs = [
            (e.num_requests, shadow.num_requests, snap.num_running + snap.num_waiting),
            (e.ongoing_tokens, shadow.ongoing_tokens, 0),
            (e.pending_prefill_tokens, shadow.pending_prefill_tokens, snap.pending_prefill_tokens),
            (e.ongoing_decode_tokens, shadow.ongoing_decode_tokens, snap.ongoing_decode_tokens),
            (e.num_prefilling, shadow.num_prefilling, snap.num_prefilling),
            (e.max_prefill_remaining, shadow.max_prefill_remaining, snap.max_prefill_remaining),
        ];
        for (merged, from_shadow, from_real) in pairs {
            prop_assert!(merged >= from_shadow && merged >= from_real);
            prop_assert_eq!(merged, from_shadow.max(from_real), "the max, not more");
        }
        prop_assert_eq!(e.kv_used_frac, snap.gpu_kv_used_frac());
    }

    /// A router fed stale, dead or torn state (not fresh) decides exactly as
    /// one fed nothing, in every policy and every real-state mode.
    #[test]
    fn stale_state_never_changes_a_decision(
        policy in policy(),
        mode in prop_oneof![Just(RealStateUse::Always), Just(RealStateUse::Placement), Just(RealStateUse::Never)],
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        let settings = RouterSettings { policy, real_state_use: mode, prefix_cache_blocks: 8, ..RouterSettings::default() };
        let plain = Router::with_instances(settings.clone(), IDS).unwrap();
        let fed = Router::with_instances(settings, IDS).unwrap();
        let mut held: Vec<(Reservation, Reservation)> = Vec::new();
        for (step, op) in ops.iter().enumerate() {
            match op {
                Op::Pick(ask) => {
                    let (d1, r1) = plain.pick(&request(step, ask)).unwrap();
                    let (d2, r2) = fed.pick(&request(step, ask)).unwrap();
                    prop_assert_eq!(&d1.instance_id, &d2.instance_id);
                    prop_assert_eq!(d1.reason, d2.reason);
                    prop_assert_eq!(d1.new_prefill_tokens, d2.new_prefill_tokens);
                    held.push((r1, r2));
                }
                Op::Real(i, n, p, _, leaving) => {
                    // Not even a shutting-down flag counts when stale.
                    let mut snapshot = snapshot(*n, *p);
                    if *leaving {
                        snapshot.flags = FLAG_SHUTTING_DOWN;
                    }
                    let stale = RealState::not_fresh(snapshot, Duration::from_secs(3));
                    fed.update_real_state([(IDS[*i], stale)]);
                }
                Op::PrefillDone(i) | Op::Complete(i) | Op::Fail(i) | Op::Drop(i) if !held.is_empty() => {
                    let at = i % held.len();
                    if matches!(op, Op::PrefillDone(_)) {
                        held[at].0.prefill_done();
                        held[at].1.prefill_done();
                    } else {
                        held.swap_remove(at);
                    }
                }
                _ => {}
            }
        }
    }
}

//! Shared reservations: the sink sees every change, peers' reservations
//! steer the pick, and drop out when stale.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::*;
use crate::{Clock, Policy, RealState, Request, RouterSettings};
use engine_state_shm_format::Snapshot;

/// A sink that keeps the last counters published per instance.
#[derive(Debug, Default, Clone)]
struct Recorder(Arc<Mutex<Vec<Published>>>);

/// An instance and its counters as published (`None`: removed).
type Published = (String, Option<ShadowCounters>);

impl Recorder {
    fn last(&self, id: &str) -> Option<Option<ShadowCounters>> {
        let log = self.0.lock().unwrap();
        log.iter().rev().find(|(i, _)| i == id).map(|(_, c)| *c)
    }
    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

impl ReservationSink for Recorder {
    fn reservations_changed(&mut self, instance_id: &str, counters: &ShadowCounters) {
        self.0
            .lock()
            .unwrap()
            .push((instance_id.to_owned(), Some(*counters)));
    }
    fn instance_removed(&mut self, instance_id: &str) {
        self.0.lock().unwrap().push((instance_id.to_owned(), None));
    }
}

/// A router on a clock the test moves.
fn router(policy: Policy, ids: &[&str]) -> (Router, Arc<AtomicU64>) {
    let now = Arc::new(AtomicU64::new(1_000_000_000));
    let clock = {
        let now = now.clone();
        Clock::from_fn(move || now.load(Ordering::Relaxed))
    };
    let settings = RouterSettings {
        policy,
        ..RouterSettings::default()
    };
    let router = Router::with_clock(settings, clock).unwrap();
    for id in ids {
        router.add_instance(id).unwrap();
    }
    (router, now)
}

fn busy(requests: u64, prefill: u64) -> ShadowCounters {
    ShadowCounters {
        num_requests: requests,
        ongoing_tokens: prefill,
        pending_prefill_tokens: prefill,
        num_prefilling: requests,
        max_prefill_remaining: prefill / requests.max(1),
        ..ShadowCounters::default()
    }
}

fn peer(id: &str, now_ns: u64, engines: &[(&str, ShadowCounters)]) -> PeerReservations {
    PeerReservations::fresh(
        id,
        engines.iter().map(|(e, c)| (Arc::from(*e), *c)).collect(),
    )
    .read_at(now_ns, Duration::ZERO)
}

#[test]
fn every_change_to_the_shadow_reaches_the_sink() {
    let (r, _) = router(Policy::LoadOnly, &["a", "b"]);
    let sink = Recorder::default();
    r.set_reservation_sink(Some(Box::new(sink.clone())));
    assert_eq!(
        sink.len(),
        2,
        "both instances published when the sink is set"
    );
    assert_eq!(sink.last("a"), Some(Some(ShadowCounters::default())));

    let (decision, mut held) = r.pick(&Request::from_tokens("1", vec![7; 1500])).unwrap();
    let on = decision.instance_id.clone();
    assert_eq!(sink.last(&on), Some(Some(r.instance(&on).unwrap().shadow)));
    assert_eq!(sink.last(&on).unwrap().unwrap().num_requests, 1);

    held.prefill_done();
    let after_prefill = sink.last(&on).unwrap().unwrap();
    assert_eq!(
        (
            after_prefill.pending_prefill_tokens,
            after_prefill.ongoing_decode_tokens
        ),
        (0, 1500)
    );
    held.complete();
    assert_eq!(sink.last(&on), Some(Some(ShadowCounters::default())));

    // Dropped unreleased: released, and published.
    let (decision, held) = r.pick(&Request::from_tokens("2", vec![8; 600])).unwrap();
    drop(held);
    assert_eq!(
        sink.last(&decision.instance_id),
        Some(Some(ShadowCounters::default()))
    );

    r.remove_instance("b").unwrap();
    assert_eq!(sink.last("b"), Some(None));
    r.set_reservation_sink(None);
    let before = sink.len();
    let _kept = r.pick(&Request::from_tokens("3", vec![9; 600])).unwrap();
    assert_eq!(sink.len(), before, "no sink, nothing published");
}

/// Peers' prefill drowns the instance, the trigger moves the request, and
/// both instances' counters are published.
#[test]
fn peers_load_triggers_migration_and_both_instances_are_published() {
    let (r, now) = router(Policy::LoadOnly, &["a", "b"]);
    let sink = Recorder::default();
    r.set_reservation_sink(Some(Box::new(sink.clone())));
    let request = Request::from_tokens("m", (0..4096).collect());
    let (decision, mut held) = r.reserve_on(&request, "a").unwrap();
    assert_eq!(decision.instance_id, "a");
    assert!(r
        .migrate_reservation(&request, &mut held)
        .unwrap()
        .is_none());
    let t = now.load(Ordering::Relaxed);
    r.update_peer_reservations(&[peer("p1", t, &[("a", busy(4, 60_000))])]);
    let moved = r
        .migrate_reservation(&request, &mut held)
        .unwrap()
        .expect("the trigger fires on an instance drowning in peers' prefill");
    assert_eq!(moved.instance_id, "b");
    assert_eq!(sink.last("a"), Some(Some(ShadowCounters::default())));
    assert_eq!(sink.last("b").unwrap().unwrap().num_requests, 1);
}

#[test]
fn peers_reservations_are_added_to_the_shadow_and_steer_the_pick() {
    let (r, now) = router(Policy::LoadOnly, &["a", "b"]);
    let t = now.load(Ordering::Relaxed);
    let stored = r.update_peer_reservations(&[
        peer("p1", t, &[("a", busy(3, 9000)), ("zz", busy(1, 1))]),
        peer("p2", t, &[("a", busy(2, 1000)), ("b", busy(1, 100))]),
    ]);
    assert_eq!(stored, 3, "the unknown engine zz is ignored");
    let a = r.instance("a").unwrap();
    assert_eq!(a.shadow, ShadowCounters::default(), "own shadow untouched");
    assert_eq!(a.peers.num_requests, 5);
    assert_eq!(a.peers.pending_prefill_tokens, 10_000);
    assert_eq!(a.peers.max_prefill_remaining, 3000, "the max, not the sum");
    assert_eq!(a.effective.num_requests, 5);
    let (decision, _held) = r.pick(&Request::from_tokens("1", vec![7; 600])).unwrap();
    assert_eq!(decision.instance_id, "b", "a is loaded by its peers");
    let b = r.instance("b").unwrap();
    assert_eq!(b.effective.num_requests, 2, "own 1 + peer 1");

    // A new poll replaces the old one: p1 gone, p2 lighter.
    r.update_peer_reservations(&[peer("p2", t, &[("a", busy(1, 10))])]);
    assert_eq!(r.instance("a").unwrap().peers.num_requests, 1);
    assert_eq!(r.instance("b").unwrap().peers, ShadowCounters::default());
    r.clear_peer_reservations();
    assert_eq!(r.instance("a").unwrap().peers, ShadowCounters::default());
}

#[test]
fn the_merge_is_the_max_of_the_fleet_shadow_and_real_state() {
    let (r, now) = router(Policy::LoadOnly, &["a"]);
    let t = now.load(Ordering::Relaxed);
    r.update_peer_reservations(&[peer("p1", t, &[("a", busy(4, 4000))])]);
    let real = |running: u64, pending: u64| {
        RealState::fresh(
            Snapshot {
                num_running: running,
                pending_prefill_tokens: pending,
                ..Snapshot::default()
            },
            Duration::from_millis(5),
        )
        .read_at(t, Duration::ZERO)
    };
    // Real state shows the same 4 requests the peer reserved: not 8.
    r.update_real_state([("a", real(4, 4000))]);
    let e = r.instance("a").unwrap().effective;
    assert_eq!((e.num_requests, e.pending_prefill_tokens), (4, 4000));
    // Real state above the fleet's shadow wins.
    r.update_real_state([("a", real(9, 100))]);
    let e = r.instance("a").unwrap().effective;
    assert_eq!((e.num_requests, e.pending_prefill_tokens), (9, 4000));
}

#[test]
fn stale_dead_or_late_peers_drop_out() {
    let (r, now) = router(Policy::LoadOnly, &["a"]);
    let expiry = r.settings().real_state_expiry_s;
    let t = now.load(Ordering::Relaxed);
    let mut stale = peer("stale", t, &[("a", busy(100, 1))]);
    stale.fresh = false;
    let too_old = peer("old", t, &[("a", busy(100, 1))]).read_at(
        t,
        Duration::from_secs_f64(expiry) + Duration::from_millis(1),
    );
    let young = peer("young", t, &[("a", busy(1, 10))]);
    let aging = peer("aging", t, &[("a", busy(2, 20))]).read_at(
        t,
        Duration::from_secs_f64(expiry) - Duration::from_millis(100),
    );
    assert_eq!(
        r.update_peer_reservations(&[stale, too_old, young, aging]),
        2
    );
    assert_eq!(r.instance("a").unwrap().peers.num_requests, 3);

    // 100 ms later the aging peer's heartbeat is past the expiry: it drops
    // out at the next decision (or view) without a new poll.
    now.fetch_add(100_000_001, Ordering::Relaxed);
    assert_eq!(r.instance("a").unwrap().peers.num_requests, 1);
    let (decision, _held) = r.pick(&Request::from_tokens("1", vec![7; 600])).unwrap();
    assert_eq!(decision.instance_id, "a");
    assert_eq!(r.instance("a").unwrap().effective.num_requests, 2);

    // And the young one once its own expiry passes.
    now.fetch_add((expiry * 1e9) as u64, Ordering::Relaxed);
    assert_eq!(r.instance("a").unwrap().peers, ShadowCounters::default());
}

/// N replicas sharing instantly see the same load one router would: their
/// picks are one router's (lmetric: prompts of distinct sizes leave no ties
/// for each replica's own round-robin cursor to break differently).
#[test]
fn replicas_sharing_reservations_place_like_one_router() {
    let ids = ["a", "b", "c", "d"];
    let (one, _) = router(Policy::LMetric, &ids);
    let replicas: Vec<Router> = (0..4).map(|_| router(Policy::LMetric, &ids).0).collect();
    let sinks: Vec<Recorder> = replicas
        .iter()
        .map(|r| {
            let sink = Recorder::default();
            r.set_reservation_sink(Some(Box::new(sink.clone())));
            sink
        })
        .collect();
    let mut held_one = Vec::new();
    let mut held_many = Vec::new();
    for i in 0..16 {
        let request = Request::from_tokens(i.to_string(), vec![i; 600 + 100 * i as usize]);
        let (d, h) = one.pick(&request).unwrap();
        held_one.push(h);
        let replica = i as usize % 4;
        let peers: Vec<PeerReservations> = (0..4)
            .filter(|&p| p != replica)
            .map(|p| {
                let engines = ids
                    .iter()
                    .filter_map(|id| sinks[p].last(id).flatten().map(|c| (Arc::from(*id), c)))
                    .collect();
                PeerReservations::fresh(&p.to_string(), engines)
                    .read_at(replicas[replica].shared.clock.now_ns(), Duration::ZERO)
            })
            .collect();
        replicas[replica].update_peer_reservations(&peers);
        let (dm, hm) = replicas[replica].pick(&request).unwrap();
        assert_eq!(dm.instance_id, d.instance_id, "request {i}");
        held_many.push(hm);
        // Some finish their prefill, the same on both sides.
        if i % 3 == 2 {
            held_one[i as usize - 1].prefill_done();
            held_many[i as usize - 1].prefill_done();
        }
    }
    let placed: std::collections::HashSet<_> = held_one
        .iter()
        .map(|h| h.instance_id().to_owned())
        .collect();
    assert_eq!(placed.len(), 4, "the load spread over every instance");
}

/// A sink whose drop blocks until the test lets it go (a Redis sink's
/// close waits on the network).
#[derive(Debug)]
struct SlowToClose {
    closing: std::sync::mpsc::Sender<()>,
    release: std::sync::mpsc::Receiver<()>,
}

impl ReservationSink for SlowToClose {
    fn reservations_changed(&mut self, _instance_id: &str, _counters: &ShadowCounters) {}
    fn instance_removed(&mut self, _instance_id: &str) {}
}

impl Drop for SlowToClose {
    fn drop(&mut self) {
        let _ = self.closing.send(());
        let _ = self.release.recv();
    }
}

/// Replacing a sink never closes the old one under the router's lock: picks
/// in other threads go on while it closes.
#[test]
fn a_sink_closes_outside_the_routers_lock() {
    let (r, _) = router(Policy::LoadOnly, &["a"]);
    let (release, wait) = std::sync::mpsc::channel();
    let (closing_now, entered) = std::sync::mpsc::channel();
    r.set_reservation_sink(Some(Box::new(SlowToClose {
        closing: closing_now,
        release: wait,
    })));
    let closing = {
        let r = r.clone();
        std::thread::spawn(move || r.set_reservation_sink(None))
    };
    // Once the old sink is closing, pick from another thread.
    entered.recv().unwrap();
    let (picked, done) = std::sync::mpsc::channel();
    let picker = {
        let r = r.clone();
        std::thread::spawn(move || {
            let result = r
                .pick(&Request::from_tokens("1", vec![1; 600]))
                .map(|(d, _)| d);
            let _ = picked.send(result.is_ok());
        })
    };
    let outcome = done.recv_timeout(Duration::from_secs(10));
    release.send(()).unwrap();
    closing.join().unwrap();
    picker.join().unwrap();
    assert_eq!(outcome, Ok(true), "a pick waited for the old sink to close");
}

/// A peer record with this router's own replica id (a reader opened
/// without the own id) is never merged: it would count every own
/// reservation twice.
#[test]
fn the_own_record_among_the_peers_is_left_out() {
    #[derive(Debug)]
    struct Named;
    impl ReservationSink for Named {
        fn reservations_changed(&mut self, _: &str, _: &ShadowCounters) {}
        fn instance_removed(&mut self, _: &str) {}
        fn replica_id(&self) -> Option<&str> {
            Some("me")
        }
    }
    let (r, now) = router(Policy::LoadOnly, &["a"]);
    r.set_reservation_sink(Some(Box::new(Named)));
    let t = now.load(Ordering::Relaxed);
    let stored = r.update_peer_reservations(&[
        peer("me", t, &[("a", busy(7, 700))]),
        peer("other", t, &[("a", busy(1, 100))]),
    ]);
    assert_eq!(stored, 1, "only the other replica's entry");
    assert_eq!(r.instance("a").unwrap().peers.num_requests, 1);
}

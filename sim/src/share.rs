//! Router replicas sharing their reservations, modelled through the router's
//! own API (docs/ROUTING.md, "Four router replicas sharing their
//! reservations").
//!
//! Every replica's `Router` gets a [`LogSink`] (its `ReservationSink`) that
//! appends each change of its own shadow, stamped with simulated time, to a
//! [`ShareLog`] the driver holds. Before a pick, the driver hands the
//! replica, through `Router::update_peer_reservations`, every other
//! replica's latest counters per instance published at or before `now − D`
//! ([`ShareLog::peers`]): `D = 0` is the shared-memory path (a seqlock write
//! is visible at the next pick), 1, 10 and 50 ms model Redis-like paths.
//!
//! The log keeps, per (replica, instance), only the records a read can
//! still need: the latest at or before `now − D` and those after it. Time
//! only moves forward, so a record older than that is dropped for good.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use engine_state_router::{PeerReservations, ReservationSink, ShadowCounters};

/// One published change: when, and the counters (`None`: the instance was
/// removed from the replica, so it lists it no more).
type Record = (u64, Option<ShadowCounters>);

/// Every replica's published reservations per instance, as of a delay.
#[derive(Debug)]
pub struct ShareLog {
    /// Propagation delay, ns: a record published at `t` is read from `t + delay`.
    delay_ns: u64,
    /// Instance ids, by index (as the engines are numbered).
    instances: Vec<Arc<str>>,
    /// Replica ids, by index.
    replicas: Vec<Arc<str>>,
    /// `[replica][instance]` → its records, oldest first.
    history: Vec<Vec<VecDeque<Record>>>,
}

impl ShareLog {
    /// A log for `replicas` replicas routing to `instances`, read `delay_ns` late.
    pub fn new(replicas: usize, instances: &[String], delay_ns: u64) -> ShareLog {
        ShareLog {
            delay_ns,
            instances: instances.iter().map(|id| Arc::from(id.as_str())).collect(),
            replicas: (0..replicas).map(|r| Arc::from(format!("r{r}"))).collect(),
            history: vec![vec![VecDeque::new(); instances.len()]; replicas],
        }
    }

    /// The propagation delay, ns.
    pub fn delay_ns(&self) -> u64 {
        self.delay_ns
    }

    /// Replica `replica` published `counters` for instance `instance` at `now_ns`.
    pub fn publish(
        &mut self,
        now_ns: u64,
        replica: usize,
        instance: usize,
        counters: Option<ShadowCounters>,
    ) {
        let delay_ns = self.delay_ns;
        let records = &mut self.history[replica][instance];
        records.push_back((now_ns, counters));
        trim(records, now_ns.saturating_sub(delay_ns));
    }

    /// Records held for (replica, instance) (for tests of the trimming).
    pub fn held(&self, replica: usize, instance: usize) -> usize {
        self.history[replica][instance].len()
    }

    /// What replica `reader` reads of every other replica at `now_ns`: per
    /// peer, its latest counters per instance published at or before
    /// `now_ns − delay` (an instance it had not published by then, or had
    /// removed, is not listed), read now with a heartbeat just stamped.
    pub fn peers(&mut self, reader: usize, now_ns: u64) -> Vec<PeerReservations> {
        let Some(cutoff) = now_ns.checked_sub(self.delay_ns) else {
            return Vec::new(); // nothing published early enough yet
        };
        let mut peers = Vec::with_capacity(self.replicas.len().saturating_sub(1));
        for (replica, instances) in self.history.iter_mut().enumerate() {
            if replica == reader {
                continue;
            }
            let mut engines = Vec::with_capacity(instances.len());
            for (instance, records) in instances.iter_mut().enumerate() {
                trim(records, cutoff);
                if let Some(&(at, Some(counters))) = records.front() {
                    if at <= cutoff {
                        engines.push((Arc::clone(&self.instances[instance]), counters));
                    }
                }
            }
            peers.push(
                PeerReservations::fresh(&self.replicas[replica], engines)
                    .read_at(now_ns, std::time::Duration::ZERO),
            );
        }
        peers
    }
}

/// Drop every record older than the latest one at or before `cutoff`: no
/// later read (at a later cutoff) can need them.
fn trim(records: &mut VecDeque<Record>, cutoff: u64) {
    while records.len() >= 2 && records[1].0 <= cutoff {
        records.pop_front();
    }
}

/// A replica's `ReservationSink`: appends its changes to the shared log,
/// stamped with the simulation's clock.
#[derive(Debug)]
pub struct LogSink {
    log: Arc<Mutex<ShareLog>>,
    now: Arc<AtomicU64>,
    replica: usize,
}

impl LogSink {
    /// Replica `replica`'s sink into `log`, on the clock `now` (ns).
    pub fn new(log: Arc<Mutex<ShareLog>>, now: Arc<AtomicU64>, replica: usize) -> LogSink {
        LogSink { log, now, replica }
    }

    fn record(&mut self, instance_id: &str, counters: Option<ShadowCounters>) {
        let now_ns = self.now.load(Ordering::Relaxed);
        let mut log = lock(&self.log);
        let instance = log
            .instances
            .iter()
            .position(|id| &**id == instance_id)
            .expect("the simulated routers route only to the simulated engines");
        log.publish(now_ns, self.replica, instance, counters);
    }
}

impl ReservationSink for LogSink {
    fn reservations_changed(&mut self, instance_id: &str, counters: &ShadowCounters) {
        self.record(instance_id, Some(*counters));
    }

    fn instance_removed(&mut self, instance_id: &str) {
        self.record(instance_id, None);
    }
}

/// The log, locked (a run is one thread: never contended, never poisoned
/// unless a sink panicked, and then the run is lost anyway).
pub(crate) fn lock(log: &Mutex<ShareLog>) -> MutexGuard<'_, ShareLog> {
    log.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(requests: u64) -> ShadowCounters {
        ShadowCounters {
            num_requests: requests,
            ongoing_tokens: 1000 * requests,
            ..ShadowCounters::default()
        }
    }

    /// Peer `peer`'s counters on instance `e0` as replica 0 reads them at `now`.
    fn seen(log: &mut ShareLog, now: u64) -> Vec<(String, Option<u64>)> {
        log.peers(0, now)
            .into_iter()
            .map(|p| {
                let e0 = p.engines.iter().find(|(e, _)| &**e == "e0");
                (p.replica_id.to_string(), e0.map(|(_, c)| c.num_requests))
            })
            .collect()
    }

    #[test]
    fn a_record_published_at_t_is_read_from_t_plus_the_delay_never_earlier() {
        let ms = 1_000_000;
        let mut log = ShareLog::new(2, &["e0".to_owned(), "e1".to_owned()], 10 * ms);
        assert!(log.peers(0, 5 * ms).is_empty(), "before the first delay");
        log.publish(100 * ms, 1, 0, Some(load(1)));
        log.publish(103 * ms, 1, 0, Some(load(2)));
        log.publish(104 * ms, 1, 0, Some(load(3)));
        // Not listed before 110 ms, then each record exactly from t + 10 ms.
        assert_eq!(seen(&mut log, 109 * ms), [("r1".to_owned(), None)]);
        assert_eq!(seen(&mut log, 110 * ms - 1), [("r1".to_owned(), None)]);
        assert_eq!(seen(&mut log, 110 * ms), [("r1".to_owned(), Some(1))]);
        assert_eq!(seen(&mut log, 113 * ms - 1), [("r1".to_owned(), Some(1))]);
        assert_eq!(seen(&mut log, 113 * ms), [("r1".to_owned(), Some(2))]);
        assert_eq!(seen(&mut log, 114 * ms), [("r1".to_owned(), Some(3))]);
        assert_eq!(seen(&mut log, 500 * ms), [("r1".to_owned(), Some(3))]);
        // A reader never reads itself.
        assert!(log
            .peers(1, 500 * ms)
            .iter()
            .all(|p| &*p.replica_id != "r1"));
        // Removed: listed no more, once the removal is 10 ms old.
        log.publish(600 * ms, 1, 0, None);
        assert_eq!(seen(&mut log, 609 * ms), [("r1".to_owned(), Some(3))]);
        assert_eq!(seen(&mut log, 610 * ms), [("r1".to_owned(), None)]);
    }

    #[test]
    fn with_no_delay_every_change_is_read_at_once() {
        let mut log = ShareLog::new(3, &["e0".to_owned()], 0);
        log.publish(7, 2, 0, Some(load(4)));
        assert_eq!(
            seen(&mut log, 7),
            [("r1".to_owned(), None), ("r2".to_owned(), Some(4))]
        );
        let peer = &log.peers(0, 7)[1];
        assert!(peer.fresh && peer.heartbeat_age.is_zero() && peer.read_mono_ns == 7);
    }

    #[test]
    fn the_log_keeps_only_what_a_later_read_can_need() {
        let ms = 1_000_000;
        let mut log = ShareLog::new(2, &["e0".to_owned()], 50 * ms);
        for t in 0..10_000u64 {
            log.publish(t * ms, 1, 0, Some(load(t)));
        }
        // The latest at or before now − 50 ms, and the 50 after it.
        assert_eq!(log.held(1, 0), 51);
        assert_eq!(seen(&mut log, 9_999 * ms), [("r1".to_owned(), Some(9_949))]);
        assert_eq!(log.held(1, 0), 51);
        assert_eq!(
            seen(&mut log, 20_000 * ms),
            [("r1".to_owned(), Some(9_999))]
        );
        assert_eq!(log.held(1, 0), 1);
    }
}

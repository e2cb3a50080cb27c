//! Shared reservations between router replicas (docs/ROUTING.md, "Shared
//! reservations"): what a replica publishes of its own shadow
//! ([`ReservationSink`]), what it merges of its peers' ([`PeerReservations`]),
//! and the per-instance sum the merge reads.
//!
//! Each request is reserved by exactly one replica, so the replicas' shadows
//! are disjoint and their sum is the shadow one router would hold for the
//! whole fleet. The merge is `max(own + Σ fresh peers, real)` per field
//! (`max_prefill_remaining`: the max of all): real state already counts
//! every replica's requests the engine has seen, and the max, not a sum,
//! with it keeps them from counting twice.

use std::sync::Arc;
use std::time::Duration;

use engine_state_reader::heartbeat_recent;

use crate::router::Router;
use crate::shadow::ShadowCounters;

/// Where a router replica publishes its own reservations: a shared-memory
/// file or a Redis sink (`engine_state_publisher::ReplicaPublisher`), or a
/// simulator's log.
///
/// Called under the router's lock, so it must be quick and never block: a
/// seqlock write on shared memory, a hand-off to a sink thread for Redis.
pub trait ReservationSink: Send + std::fmt::Debug {
    /// The router's own reservations on `instance_id` are now `counters`:
    /// called after every reservation, `prefill_done`, release and migration
    /// that changed them, and for every instance when the sink is set.
    fn reservations_changed(&mut self, instance_id: &str, counters: &ShadowCounters);

    /// The instance was removed from the router: its reservations are gone.
    fn instance_removed(&mut self, instance_id: &str);

    /// The replica id this sink publishes under, if it has one: a peer
    /// record of that id is this router's own and is never merged
    /// ([`Router::update_peer_reservations`]).
    fn replica_id(&self) -> Option<&str> {
        None
    }
}

/// One peer replica's reservations as a reader read them.
///
/// Aged like an engine's [`RealState`](crate::RealState): merged while it
/// is `fresh` and its heartbeat, aged from `read_mono_ns`, is within
/// `real_state_expiry_s`; a peer that stopped publishing drops out then.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerReservations {
    /// The peer's replica id.
    pub replica_id: Arc<str>,
    /// The reader judged it fresh (a stale, dead or torn record is never merged).
    pub fresh: bool,
    /// How old the peer's heartbeat was when it was read.
    pub heartbeat_age: Duration,
    /// `CLOCK_MONOTONIC` ns (the router's clock) when it was read.
    pub read_mono_ns: u64,
    /// Its reservations per engine id; engines this router does not route
    /// to are ignored.
    pub engines: Vec<(Arc<str>, ShadowCounters)>,
}

impl PeerReservations {
    /// A fresh record read just now with a heartbeat just stamped.
    pub fn fresh(replica_id: &str, engines: Vec<(Arc<str>, ShadowCounters)>) -> PeerReservations {
        PeerReservations {
            replica_id: replica_id.into(),
            fresh: true,
            heartbeat_age: Duration::ZERO,
            read_mono_ns: engine_state_shm_format::monotonic_ns(),
            engines,
        }
    }

    /// The same record, read at `read_mono_ns` with the given heartbeat age.
    pub fn read_at(self, read_mono_ns: u64, heartbeat_age: Duration) -> PeerReservations {
        PeerReservations {
            read_mono_ns,
            heartbeat_age,
            ..self
        }
    }

    /// Until when (`CLOCK_MONOTONIC` ns, inclusive) it may be merged under
    /// `expiry`; `None` if never (not fresh, or already too old when read).
    fn merge_until(&self, expiry: Duration) -> Option<u64> {
        if !self.fresh || !heartbeat_recent(self.heartbeat_age, expiry) {
            return None;
        }
        let left = (expiry - self.heartbeat_age).as_nanos();
        Some(
            self.read_mono_ns
                .saturating_add(u64::try_from(left).unwrap_or(u64::MAX)),
        )
    }
}

/// `own + peers`, field by field as the merge counts them: sums, but the
/// largest pending prefill of one request is the max.
pub(crate) fn plus(own: &ShadowCounters, peers: &ShadowCounters) -> ShadowCounters {
    ShadowCounters {
        num_requests: own.num_requests.saturating_add(peers.num_requests),
        ongoing_tokens: own.ongoing_tokens.saturating_add(peers.ongoing_tokens),
        pending_prefill_tokens: own
            .pending_prefill_tokens
            .saturating_add(peers.pending_prefill_tokens),
        ongoing_decode_tokens: own
            .ongoing_decode_tokens
            .saturating_add(peers.ongoing_decode_tokens),
        num_prefilling: own.num_prefilling.saturating_add(peers.num_prefilling),
        max_prefill_remaining: own.max_prefill_remaining.max(peers.max_prefill_remaining),
    }
}

/// One peer's reservations on one instance, with until when they count.
#[derive(Clone, Copy, Debug)]
struct PeerEntry {
    counters: ShadowCounters,
    until_ns: u64,
}

/// The peers' reservations on one instance: every fresh peer's entry, and
/// their sum as of the last refresh, so that a decision reads one sum per
/// instance instead of adding every peer (BENCHMARKS.md, "Targets").
#[derive(Clone, Debug, Default)]
pub(crate) struct PeerLoad {
    entries: Vec<PeerEntry>,
    /// The sum of the entries that were mergeable at the last refresh.
    sum: ShadowCounters,
    /// The earliest `until_ns` of the summed entries: after it the sum is
    /// redone without the expired ones (`u64::MAX` with none).
    until_ns: u64,
}

impl PeerLoad {
    pub(crate) fn new() -> PeerLoad {
        PeerLoad {
            until_ns: u64::MAX,
            ..PeerLoad::default()
        }
    }

    /// The peers' sum as of the last refresh.
    #[inline]
    pub(crate) fn sum(&self) -> &ShadowCounters {
        &self.sum
    }

    /// Whether the sum is out of date at `now_ns` (an entry in it expired).
    #[inline]
    pub(crate) fn expired(&self, now_ns: u64) -> bool {
        now_ns > self.until_ns
    }

    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.sum = ShadowCounters::default();
        self.until_ns = u64::MAX;
    }

    fn push(&mut self, counters: ShadowCounters, until_ns: u64) {
        self.entries.push(PeerEntry { counters, until_ns });
    }

    /// Redo the sum over the entries still mergeable at `now_ns`, dropping
    /// the others for good (a later read replaces them all).
    pub(crate) fn refresh(&mut self, now_ns: u64) {
        self.entries.retain(|entry| now_ns <= entry.until_ns);
        self.sum = ShadowCounters::default();
        self.until_ns = u64::MAX;
        for entry in &self.entries {
            self.sum = plus(&self.sum, &entry.counters);
            self.until_ns = self.until_ns.min(entry.until_ns);
        }
    }
}

impl Router {
    /// Publish this router's reservations to `sink` from now on (`None`:
    /// stop). Every instance's current counters are published to it at once,
    /// so a sink set on a busy router starts complete.
    ///
    /// The old sink is dropped (closed: a Redis sink's last write, a file
    /// retired) after the router's lock is released, so picks and releases
    /// in other threads never wait for it.
    pub fn set_reservation_sink(&self, sink: Option<Box<dyn ReservationSink>>) {
        let mut state = self.shared.lock();
        let old = std::mem::replace(&mut state.sink, sink);
        for position in 0..state.instances.len() {
            state.publish(position);
        }
        drop(state);
        drop(old);
    }

    /// Replace the peers' reservations with those read in one poll of every
    /// peer. Returns how many (peer, engine) entries were taken: entries of
    /// engines this router does not route to are ignored, and so are peers
    /// that are not fresh or whose heartbeat, aged from the reading, is past
    /// `real_state_expiry_s`. Peers not given are forgotten. The router's own
    /// record (the reader leaves it out when told the own id) would count
    /// every own reservation twice: a peer with the sink's
    /// [`ReservationSink::replica_id`] is ignored too.
    pub fn update_peer_reservations<'a>(
        &self,
        peers: impl IntoIterator<Item = &'a PeerReservations>,
    ) -> usize {
        let expiry = self.shared.real_state_expiry;
        let now_ns = self.shared.clock.now_ns();
        let mut state = self.shared.lock();
        for instance in &mut state.instances {
            instance.peers.clear();
        }
        let own: Option<Arc<str>> = state
            .sink
            .as_ref()
            .and_then(|sink| sink.replica_id())
            .map(Arc::from);
        let mut stored = 0;
        for peer in peers {
            if own.as_deref() == Some(&*peer.replica_id) {
                continue;
            }
            let Some(until_ns) = peer.merge_until(expiry) else {
                continue;
            };
            for (engine_id, counters) in &peer.engines {
                if let Ok(position) = state.position(engine_id) {
                    stored += 1;
                    if *counters != ShadowCounters::default() {
                        state.instances[position].peers.push(*counters, until_ns);
                    }
                }
            }
        }
        for instance in &mut state.instances {
            instance.peers.refresh(now_ns);
        }
        stored
    }

    /// Forget every peer's reservations (own shadow alone until the next update).
    pub fn clear_peer_reservations(&self) {
        for instance in &mut self.shared.lock().instances {
            instance.peers.clear();
        }
    }
}

#[cfg(test)]
#[path = "peers_tests.rs"]
mod tests;

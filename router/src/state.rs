//! The router's shared state, only ever touched under its one mutex.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use std::hash::{BuildHasherDefault, DefaultHasher, Hash, Hasher};

use engine_state_reader::heartbeat_recent;
use engine_state_shm_format::blocks::BLOCK_TOKENS;
use engine_state_shm_format::CacheDigest;

use crate::effective::{EffectiveState, RealLoad, RealState};
use crate::error::Error;
use crate::lru::Lru;
use crate::peers::{plus, PeerLoad, ReservationSink};
use crate::policy::{Candidate, RoundRobin};
use crate::reservation::HeldReservation;
use crate::settings::{CacheKnowledge, RouterSettings};
use crate::shadow::{InstanceShadow, Load, ShadowCounters};

/// One routed-to instance.
#[derive(Debug)]
pub(crate) struct Instance {
    pub id: String,
    /// Never reused: a reservation or session binding made before an instance
    /// was removed (and maybe re-added under the same id) must not touch the
    /// new one's counters.
    pub uid: u64,
    pub shadow: InstanceShadow,
    /// The last real state given, if it was fresh (state that is not fresh
    /// is never merged, so it is stored as `None`).
    pub real: Option<StoredReal>,
    /// The last *fresh* state given said the engine is shutting down. Sticky:
    /// only a fresh reading without the flag (a restarted engine's first
    /// snapshot) clears it, so an engine that went on to exit — its state
    /// now stale or dead, its shadow drained to zero — does not become the
    /// least-loaded instance of every policy.
    pub shutting_down: bool,
    /// Request-id key ([`request_key`]) → reservations live on this
    /// instance, so that a question asked by instance name about a request
    /// reserved here (which would count it against itself) is refused.
    reserved_requests: HashMap<u64, u32, BuildHasherDefault<KeyHasher>>,
    /// Fresh peer replicas' reservations here (docs/ROUTING.md, "Shared
    /// reservations"), added to the shadow before the merge.
    pub peers: PeerLoad,
}

/// The keys of `Instance::reserved_requests` are already hashes
/// ([`request_key`]): used as they are, not hashed again (this map is
/// touched by every reservation and release).
#[derive(Default)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used (the key type is u64); folded in anyway.
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }

    fn write_u64(&mut self, key: u64) {
        self.0 = key;
    }
}

/// Fresh real state as stored: reduced to what the merge reads, with the
/// reading's ages and the time of the reading, so that a decision ages every
/// instance's state from when it was read (docs/ROUTING.md, "The merge"),
/// not from when it was handed over.
#[derive(Clone, Debug)]
pub(crate) struct StoredReal {
    load: RealLoad,
    capture_age: Duration,
    heartbeat_age: Duration,
    /// `CLOCK_MONOTONIC` ns of the reading.
    read_ns: u64,
    /// The engine's cache digest as of the snapshot, if it publishes one.
    cache: Option<Arc<CacheDigest>>,
}

impl StoredReal {
    /// The time since the reading, if the engine's heartbeat aged from the
    /// reading is still recent under `expiry` (`real_state_expiry_s`): the
    /// heartbeat half of the reader's staleness rule
    /// ([`engine_state_reader::heartbeat_recent`]) applied again at decision
    /// time, the one rule the router adds (docs/ARCHITECTURE.md, "Multi-node
    /// and routing"); `None` once it is not.
    #[inline]
    fn since_read(&self, now_ns: u64, expiry: Duration) -> Option<Duration> {
        let since = Duration::from_nanos(now_ns.saturating_sub(self.read_ns));
        heartbeat_recent(self.heartbeat_age + since, expiry).then_some(since)
    }
}

impl Instance {
    /// Whether a reservation for the request with this key ([`request_key`])
    /// is live on this instance.
    pub(crate) fn holds_request(&self, request_key: u64) -> bool {
        self.reserved_requests.contains_key(&request_key)
    }

    /// A reservation for the request with this key ended (or moved away).
    pub(crate) fn forget_request(&mut self, request_key: u64) {
        if let std::collections::hash_map::Entry::Occupied(mut live) =
            self.reserved_requests.entry(request_key)
        {
            *live.get_mut() -= 1;
            if *live.get() == 0 {
                live.remove();
            }
        }
    }

    /// Its cache hit for a prompt's blocks, in tokens, and where it came
    /// from: with `digests` (`cache_knowledge = engine`, real state not
    /// `never` used), the leading run of the blocks in the engine's digest
    /// while its state is fresh (docs/ROUTING.md, "Where real state is
    /// used"); the shadow estimate otherwise.
    #[inline]
    pub(crate) fn cache_hit(
        &self,
        blocks: &[u64],
        digests: bool,
        now_ns: u64,
        expiry: Duration,
    ) -> (u64, CacheKnowledge) {
        match self.fresh_digest(digests, now_ns, expiry) {
            Some(digest) => (
                (digest.leading_blocks(blocks) * BLOCK_TOKENS) as u64,
                CacheKnowledge::Engine,
            ),
            None => (
                self.shadow.cache_hit_tokens(blocks),
                CacheKnowledge::Estimated,
            ),
        }
    }

    /// The engine's digest, if `digests` and its stored state is fresh at `now_ns`.
    #[inline]
    pub(crate) fn fresh_digest(
        &self,
        digests: bool,
        now_ns: u64,
        expiry: Duration,
    ) -> Option<&CacheDigest> {
        let real = self.real.as_ref().filter(|_| digests)?;
        let digest = real.cache.as_deref()?;
        real.since_read(now_ns, expiry).map(|_| digest)
    }

    /// Its effective state at `now_ns` (`CLOCK_MONOTONIC`). Inlined into the
    /// loop over every instance that each decision runs.
    #[inline]
    fn effective(&self, consult_real: bool, now_ns: u64, expiry: Duration) -> EffectiveState {
        self.effective_with(&self.shadow.counters(), consult_real, now_ns, expiry)
    }

    /// The same with the given shadow counters (the peers' reservations
    /// added: [`RouterState::refresh_peers`] keeps their sum current).
    #[inline]
    fn effective_with(
        &self,
        own: &ShadowCounters,
        consult_real: bool,
        now_ns: u64,
        expiry: Duration,
    ) -> EffectiveState {
        let shadow = &plus(own, self.peers.sum());
        match &self.real {
            Some(real) if consult_real => match real.since_read(now_ns, expiry) {
                Some(since) => {
                    EffectiveState::merge_fresh(shadow, &real.load, real.capture_age + since)
                }
                None => EffectiveState::shadow_only(shadow),
            },
            _ => EffectiveState::shadow_only(shadow),
        }
    }
}

/// Counts for [`crate::RouterStats`].
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Counts {
    pub decisions: u64,
    pub completed: u64,
    pub failed: u64,
    pub dropped: u64,
    pub migrated: u64,
}

#[derive(Debug)]
pub(crate) struct RouterState {
    pub instances: Vec<Instance>,
    positions: HashMap<String, usize>,
    /// Session id hash → instance uid, and the instance's position when
    /// bound (a hint: positions only shift when an instance is removed).
    sessions: Lru<(u64, usize)>,
    pub round_robin: RoundRobin,
    next_uid: u64,
    /// Effective state of every instance for the decision in progress; kept
    /// to reuse its allocation.
    pub candidates: Vec<Candidate>,
    pub logging: bool,
    /// Evaluate each pick that consults real state a second time on the
    /// shadow counters alone (`Router::set_shadow_comparison`).
    pub compare_shadow: bool,
    pub counts: Counts,
    /// Where this replica publishes its own reservations, if it shares them.
    pub sink: Option<Box<dyn ReservationSink>>,
}

/// Session ids are kept as 64-bit hashes: fixed-size keys, no per-binding
/// allocation; a collision (odds ~n²/2⁶⁴) only misplaces one session.
pub(crate) fn session_key(session_id: &str) -> u64 {
    // `DefaultHasher::new()` has fixed keys: the same id always maps the same.
    let mut hasher = DefaultHasher::new();
    session_id.hash(&mut hasher);
    hasher.finish()
}

/// Request ids are kept as 64-bit hashes too (the same hasher), for the
/// live-reservation check of `Instance::holds_request`: a collision only
/// makes a question asked by name about another request an error.
pub(crate) fn request_key(request_id: &str) -> u64 {
    session_key(request_id)
}

impl RouterState {
    pub(crate) fn new(settings: &RouterSettings) -> RouterState {
        RouterState {
            instances: Vec::new(),
            positions: HashMap::new(),
            sessions: Lru::new(settings.max_sessions),
            round_robin: RoundRobin::default(),
            next_uid: 0,
            candidates: Vec::new(),
            logging: false,
            compare_shadow: false,
            counts: Counts::default(),
            sink: None,
        }
    }

    pub(crate) fn position(&self, id: &str) -> Result<usize, Error> {
        self.positions
            .get(id)
            .copied()
            .ok_or_else(|| Error::UnknownInstance(id.to_owned()))
    }

    /// Position of the instance with `uid`, trying `hint` (its position when
    /// last seen) first: positions only shift when an instance is removed.
    pub(crate) fn position_of_uid(&self, uid: u64, hint: usize) -> Option<usize> {
        match self.instances.get(hint) {
            Some(instance) if instance.uid == uid => Some(hint),
            _ => self
                .instances
                .iter()
                .position(|instance| instance.uid == uid),
        }
    }

    pub(crate) fn add_instance(&mut self, id: &str, cache_blocks: usize) -> Result<(), Error> {
        if self.positions.contains_key(id) {
            return Err(Error::DuplicateInstance(id.to_owned()));
        }
        self.positions.insert(id.to_owned(), self.instances.len());
        self.instances.push(Instance {
            id: id.to_owned(),
            uid: self.next_uid,
            shadow: InstanceShadow::new(cache_blocks),
            real: None,
            shutting_down: false,
            reserved_requests: HashMap::default(),
            peers: PeerLoad::new(),
        });
        self.next_uid += 1;
        Ok(())
    }

    /// Outstanding reservations on it become no-ops; its sessions are placed
    /// anew on their next request.
    pub(crate) fn remove_instance(&mut self, id: &str) -> Result<(), Error> {
        let position = self.position(id)?;
        self.instances.remove(position);
        if let Some(sink) = &mut self.sink {
            sink.instance_removed(id);
        }
        self.positions.clear();
        for (position, instance) in self.instances.iter().enumerate() {
            self.positions.insert(instance.id.clone(), position);
        }
        Ok(())
    }

    pub(crate) fn set_real_state(&mut self, id: &str, real: &RealState) -> bool {
        let stored = real.fresh.then(|| StoredReal {
            load: RealLoad::of(&real.snapshot),
            capture_age: real.capture_age,
            heartbeat_age: real.heartbeat_age,
            read_ns: real.read_mono_ns,
            cache: real.cache.clone(),
        });
        match self.positions.get(id) {
            Some(&position) => {
                let instance = &mut self.instances[position];
                instance.real = stored;
                if real.fresh {
                    instance.shutting_down = real.snapshot.is_shutting_down();
                }
                true
            }
            None => false,
        }
    }

    pub(crate) fn effective(
        &self,
        position: usize,
        consult_real: bool,
        now_ns: u64,
        expiry: Duration,
    ) -> EffectiveState {
        self.instances[position].effective(consult_real, now_ns, expiry)
    }

    /// Make the candidate at `position` what it would be without the held
    /// reservation: its load left out of the shadow, and its cache hit the
    /// one estimated when it was reserved (its own blocks are in the cache
    /// since).
    pub(crate) fn leave_out(
        &mut self,
        position: usize,
        held: HeldReservation,
        consult_real: bool,
        now_ns: u64,
        expiry: Duration,
    ) {
        let instance = &self.instances[position];
        let shadow = instance.shadow.counters_without(held.load, held.decoding);
        let candidate = &mut self.candidates[position];
        candidate.state = instance.effective_with(&shadow, consult_real, now_ns, expiry);
        candidate.cache_hit_tokens = held.load.input_len - held.load.new_prefill;
    }

    /// Release a migrated request's reservation on its old instance.
    pub(crate) fn release_migrated(&mut self, position: usize, held: HeldReservation) {
        let instance = &mut self.instances[position];
        instance.shadow.release(held.load, held.decoding);
        instance.forget_request(held.request_key);
        self.counts.migrated += 1;
        self.publish(position);
    }

    /// Hand the instance's own counters to the sink, if this replica shares
    /// its reservations: after every change to them.
    #[inline]
    pub(crate) fn publish(&mut self, position: usize) {
        if let Some(sink) = &mut self.sink {
            let instance = &self.instances[position];
            sink.reservations_changed(&instance.id, &instance.shadow.counters());
        }
    }

    /// Redo the peers' sum of every instance where one of its entries
    /// expired by `now_ns`: once per decision or view, before any is read.
    #[inline]
    pub(crate) fn refresh_peers(&mut self, now_ns: u64) {
        for instance in &mut self.instances {
            if instance.peers.expired(now_ns) {
                instance.peers.refresh(now_ns);
            }
        }
    }

    /// Fill `candidates` for one decision. Cache hits are only found when
    /// `blocks` is given: `load_only` and `sticky` never read them, and on a
    /// long prompt the estimate costs more than the rest of the decision.
    /// `digests`: from fresh engine digests where there are some
    /// ([`Instance::cache_hit`]).
    pub(crate) fn fill_candidates(
        &mut self,
        consult_real: bool,
        digests: bool,
        blocks: Option<&[u64]>,
        now_ns: u64,
        expiry: Duration,
    ) {
        self.refresh_peers(now_ns);
        self.candidates.clear();
        self.candidates
            .extend(self.instances.iter().map(|instance| {
                let (cache_hit_tokens, cache_knowledge) = match blocks {
                    Some(blocks) => instance.cache_hit(blocks, digests, now_ns, expiry),
                    None => (0, CacheKnowledge::Estimated),
                };
                Candidate {
                    state: instance.effective(consult_real, now_ns, expiry),
                    cache_hit_tokens,
                    cache_knowledge,
                    shutting_down: instance.shutting_down,
                }
            }));
    }

    /// The position of the session's instance, if it is bound to one still routed to.
    pub(crate) fn bound(&self, session: u64) -> Option<usize> {
        let &(uid, hint) = self.sessions.peek(session)?;
        self.position_of_uid(uid, hint)
    }

    pub(crate) fn bind(&mut self, session: u64, position: usize) {
        self.sessions
            .insert(session, (self.instances[position].uid, position));
    }

    pub(crate) fn end_session(&mut self, session: u64) -> bool {
        self.sessions.remove(session)
    }

    pub(crate) fn reserve(
        &mut self,
        position: usize,
        load: Load,
        blocks: &[u64],
        request_key: u64,
    ) {
        let instance = &mut self.instances[position];
        instance.shadow.reserve(load);
        instance.shadow.remember_prefix(blocks);
        *instance.reserved_requests.entry(request_key).or_insert(0) += 1;
        self.publish(position);
    }
}

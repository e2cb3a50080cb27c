//! The router: instances, real state, and pick-and-reserve as one step.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::Serialize;

use crate::clock::Clock;
use crate::decide::{MigrationSource, Placement};
use crate::decision::Decision;
use crate::decision_log::DecisionLog;
use crate::effective::{EffectiveState, RealState};
use crate::error::Error;
use crate::migration::MigrationAdvice;
use crate::request::Request;
use crate::reservation::{Ending, Reservation};
use crate::settings::RouterSettings;
use crate::shadow::{InstanceShadow, ShadowCounters};
use crate::state::{session_key, RouterState};

/// The next [`Router::id`]: ids are unique in the process, never reused.
static NEXT_ROUTER_ID: AtomicU64 = AtomicU64::new(1);

/// State shared by a router, its clones and its reservations.
#[derive(Debug)]
pub(crate) struct Shared {
    /// This router's [`Router::id`]; a reservation carries it (through its
    /// `Arc<Shared>`), and every call that takes a reservation checks it.
    pub(crate) router_id: u64,
    pub(crate) settings: RouterSettings,
    pub(crate) real_state_expiry: Duration,
    /// Read once per decision, view or advice (real state ages by it).
    pub(crate) clock: Clock,
    /// Held across choosing an instance and adding the request to its
    /// counters, so no two picks can both see an instance as free.
    pub(crate) state: Mutex<RouterState>,
    /// A separate lock, taken only after `state` is released: a slow log
    /// writer must not hold up other picks' choose-and-reserve.
    pub(crate) log: Mutex<Option<DecisionLog>>,
    pub(crate) log_errors: AtomicU64,
}

impl Shared {
    /// A panic under the lock can only come from a debug assertion; the state
    /// is still consistent for releases, so poisoning is ignored rather than
    /// turned into a panic in every later `Drop`.
    pub(crate) fn lock(&self) -> MutexGuard<'_, RouterState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn with_shadow(&self, uid: u64, hint: usize, f: impl FnOnce(&mut InstanceShadow)) {
        let mut state = self.lock();
        // A removed instance is gone with its counters: nothing to update.
        if let Some(position) = state.position_of_uid(uid, hint) {
            f(&mut state.instances[position].shadow);
            state.publish(position);
        }
    }

    pub(crate) fn end_reservation(
        &self,
        uid: u64,
        hint: usize,
        request_key: u64,
        ending: Ending,
        f: impl FnOnce(&mut InstanceShadow),
    ) {
        let mut state = self.lock();
        let counts = &mut state.counts;
        match ending {
            Ending::Completed => counts.completed += 1,
            Ending::Failed => counts.failed += 1,
            Ending::Dropped => counts.dropped += 1,
        }
        if let Some(position) = state.position_of_uid(uid, hint) {
            let instance = &mut state.instances[position];
            f(&mut instance.shadow);
            instance.forget_request(request_key);
            state.publish(position);
        }
    }
}

/// Counters for spotting leaks and log trouble.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RouterStats {
    /// Reservations made (picks, migrations, `reserve_on`).
    pub decisions: u64,
    /// Released by `complete`.
    pub completed: u64,
    /// Released by `fail`.
    pub failed: u64,
    /// Released by being dropped unreleased.
    pub dropped: u64,
    /// Released on their instance by [`Router::migrate_reservation`] (the
    /// request's new reservation on the target counts as a decision).
    pub migrated: u64,
    /// Decision records that could not be written.
    pub decision_log_errors: u64,
}

/// One instance as the router sees it now.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InstanceView {
    /// The instance id.
    pub instance_id: String,
    /// The router's own counters.
    pub shadow: ShadowCounters,
    /// The sum of fresh peer replicas' reservations here
    /// ([`Router::update_peer_reservations`]; zero without peers).
    pub peers: ShadowCounters,
    /// `max(shadow + peers, real)` with the stored real state if it is fresh now.
    pub effective: EffectiveState,
    /// Prefix blocks in its shadow cache.
    pub cached_blocks: usize,
}

/// The embedded router. Cheap to clone (clones share state); `Send + Sync`,
/// every method takes `&self`.
#[derive(Clone)]
pub struct Router {
    pub(crate) shared: Arc<Shared>,
}

/// Not derived: that would print every instance's prefix cache.
impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router")
            .field("id", &self.shared.router_id)
            .field("policy", &self.shared.settings.policy)
            .field("instances", &self.shared.lock().instances.len())
            .finish_non_exhaustive()
    }
}

impl Router {
    /// A router with no instances yet; refuses invalid settings.
    pub fn new(settings: RouterSettings) -> Result<Router, Error> {
        Router::with_clock(settings, Clock::monotonic())
    }

    /// A router with no instances yet that reads the time from `clock` (a
    /// simulator's simulated time); [`Router::new`] uses `CLOCK_MONOTONIC`.
    /// Real state given to it must carry `read_mono_ns` on the same clock.
    pub fn with_clock(settings: RouterSettings, clock: Clock) -> Result<Router, Error> {
        settings.validate()?;
        let state = RouterState::new(&settings);
        Ok(Router {
            shared: Arc::new(Shared {
                // Relaxed: only uniqueness is needed; pairs with no other access.
                router_id: NEXT_ROUTER_ID.fetch_add(1, Ordering::Relaxed),
                real_state_expiry: Duration::from_secs_f64(settings.real_state_expiry_s),
                clock,
                settings,
                state: Mutex::new(state),
                log: Mutex::new(None),
                log_errors: AtomicU64::new(0),
            }),
        })
    }

    /// A router over the given instances.
    pub fn with_instances<S: AsRef<str>>(
        settings: RouterSettings,
        instance_ids: impl IntoIterator<Item = S>,
    ) -> Result<Router, Error> {
        let router = Router::new(settings)?;
        for id in instance_ids {
            router.add_instance(id.as_ref())?;
        }
        Ok(router)
    }

    /// This router's id, unique in the process (clones share it). Its
    /// reservations carry it: a call given a reservation another router
    /// made fails with [`Error::ForeignReservation`] and changes nothing.
    pub fn id(&self) -> u64 {
        self.shared.router_id
    }

    /// The settings it was made with.
    pub fn settings(&self) -> &RouterSettings {
        &self.shared.settings
    }

    /// Start routing to an instance (new instances come last in tie order).
    pub fn add_instance(&self, instance_id: &str) -> Result<(), Error> {
        let blocks = self.shared.settings.prefix_cache_blocks;
        self.shared.lock().add_instance(instance_id, blocks)
    }

    /// Stop routing to an instance. Its outstanding reservations release
    /// nothing; its sessions are placed anew on their next request.
    pub fn remove_instance(&self, instance_id: &str) -> Result<(), Error> {
        self.shared.lock().remove_instance(instance_id)
    }

    /// Instance ids in tie-break order.
    pub fn instance_ids(&self) -> Vec<String> {
        self.shared
            .lock()
            .instances
            .iter()
            .map(|i| i.id.clone())
            .collect()
    }

    /// Store the latest real state of instances, in one call (one lock).
    ///
    /// Each entry replaces that instance's stored state; instances not named
    /// keep theirs until it expires. State ages from when it was *read*
    /// ([`RealState::read_mono_ns`]), not from this call: it is merged while
    /// the engine's heartbeat, so aged, is within `real_state_expiry_s`, so a
    /// reading handed over late is as stale as it really is. Ids the router
    /// does not route to are ignored; the count of entries stored is
    /// returned. Only fresh state is ever merged.
    pub fn update_real_state<S: AsRef<str>>(
        &self,
        states: impl IntoIterator<Item = (S, RealState)>,
    ) -> usize {
        let mut state = self.shared.lock();
        states
            .into_iter()
            .filter(|(id, real)| state.set_real_state(id.as_ref(), real))
            .count()
    }

    /// Forget all stored real state (shadow alone until the next update),
    /// shutting-down flags included.
    pub fn clear_real_state(&self) {
        for instance in &mut self.shared.lock().instances {
            instance.real = None;
            instance.shutting_down = false;
        }
    }

    /// Forget a session's instance; its next request is placed anew.
    pub fn end_session(&self, session_id: &str) -> bool {
        self.shared.lock().end_session(session_key(session_id))
    }

    /// Every instance's counters and effective state, in tie-break order.
    pub fn instances(&self) -> Vec<InstanceView> {
        let now_ns = self.shared.clock.now_ns();
        let mut state = self.shared.lock();
        state.refresh_peers(now_ns);
        (0..state.instances.len())
            .map(|position| {
                let instance = &state.instances[position];
                InstanceView {
                    instance_id: instance.id.clone(),
                    shadow: instance.shadow.counters(),
                    peers: *instance.peers.sum(),
                    effective: state.effective(
                        position,
                        true,
                        now_ns,
                        self.shared.real_state_expiry,
                    ),
                    cached_blocks: instance.shadow.cached_blocks(),
                }
            })
            .collect()
    }

    /// One instance's view, if routed to.
    pub fn instance(&self, instance_id: &str) -> Option<InstanceView> {
        self.instances()
            .into_iter()
            .find(|view| view.instance_id == instance_id)
    }

    /// Counters for spotting leaks and log trouble.
    pub fn stats(&self) -> RouterStats {
        let counts = self.shared.lock().counts;
        RouterStats {
            decisions: counts.decisions,
            completed: counts.completed,
            failed: counts.failed,
            dropped: counts.dropped,
            migrated: counts.migrated,
            decision_log_errors: self.shared.log_errors.load(Ordering::Relaxed),
        }
    }

    /// Start (`Some`) or stop (`None`) the decision log.
    pub fn set_decision_log(&self, log: Option<DecisionLog>) {
        let enabled = log.is_some();
        *self
            .shared
            .log
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = log;
        self.shared.lock().logging = enabled;
    }

    /// Start or stop comparing each pick that consults real state with the
    /// pick the shadow counters alone would make: the same policy, run a
    /// second time under the same lock hold on the shadow-only state (a copy
    /// of its round-robin cursor, so the real pick is unaffected), reported
    /// as [`Decision::shadow_only_instance_id`]. Off by default: it doubles
    /// the cost of those picks. For measuring what real state changes (essim).
    pub fn set_shadow_comparison(&self, enabled: bool) {
        self.shared.lock().compare_shadow = enabled;
    }

    /// Choose an instance by the policy and reserve the request on it, as one
    /// step: the choice and the reservation happen under one lock hold, so a
    /// concurrent pick always sees this one's reservation.
    ///
    /// Instances whose last fresh state said they are shutting down are never
    /// chosen (a session bound to one is placed anew) until a fresh state
    /// without the flag arrives — a restarted engine's — or the instance is
    /// removed; when every instance is shutting down the pick fails with
    /// [`Error::AllShuttingDown`].
    pub fn pick(&self, request: &Request) -> Result<(Decision, Reservation), Error> {
        let (decision, reservation) = self
            .decide(request, Placement::Policy)?
            .expect("a policy decision either places or fails");
        Ok((decision, reservation))
    }

    /// Reserve the request on a named instance (the caller decided, even if
    /// the instance is shutting down), with the same accounting and logging
    /// as a pick; the session moves there.
    pub fn reserve_on(
        &self,
        request: &Request,
        instance_id: &str,
    ) -> Result<(Decision, Reservation), Error> {
        let made = self.decide(request, Placement::Forced(instance_id))?;
        Ok(made.expect("a forced placement always places"))
    }

    /// The migration trigger's verdict for a request that would run on
    /// `source_instance` and holds no reservation yet, and the target the
    /// scorer would pick. Changes nothing.
    ///
    /// Advise before reserving: a request already reserved on the source
    /// would count against itself (its own prefill in the source's pending
    /// prefill), so that question fails with [`Error::InvalidRequest`] while
    /// a reservation for the same request id is live on `source_instance`.
    /// For a request that holds a reservation — every request a
    /// [`pick`](Router::pick) placed — ask
    /// [`migration_advice_for`](Router::migration_advice_for) instead.
    pub fn migration_advice(
        &self,
        request: &Request,
        source_instance: &str,
    ) -> Result<MigrationAdvice, Error> {
        self.advice(request, MigrationSource::Named(source_instance))
    }

    /// The migration trigger's verdict for a request reserved by `reservation`
    /// (the source is its instance), with that reservation left out of the
    /// source's load (docs/ROUTING.md, "Migration"), and the target the scorer
    /// would pick. Changes nothing. Ask before sending the request to the
    /// engine: once the engine has queued it, its real state counts it too, and
    /// only the shadow's share is left out. Fails for a released reservation or
    /// one made for a prompt of another length.
    pub fn migration_advice_for(
        &self,
        request: &Request,
        reservation: &Reservation,
    ) -> Result<MigrationAdvice, Error> {
        self.advice(request, self.reserved_source(request, reservation)?)
    }

    fn advice(
        &self,
        request: &Request,
        source: MigrationSource<'_>,
    ) -> Result<MigrationAdvice, Error> {
        let prompt = request.hashed()?;
        let mut state = self.shared.lock();
        let source = self.migration_candidates(
            &mut state,
            request,
            source,
            &prompt,
            self.shared.clock.now_ns(),
        )?;
        // A copy of the cursor: advice must not move the round-robin.
        let mut round_robin = state.round_robin;
        Ok(self.advise(&state, source, prompt.input_len, &mut round_robin))
    }

    /// For a request that holds no reservation yet: if the trigger fires for
    /// it on `source_instance` and a target exists, reserve it on the target
    /// (one step, as [`pick`](Router::pick)) and move its session there.
    /// `None`: it stays. For a request already reserved, use
    /// [`migrate_reservation`](Router::migrate_reservation): this fails, as
    /// [`migration_advice`](Router::migration_advice) does, while a
    /// reservation for the same request id is live on `source_instance`.
    pub fn migrate(
        &self,
        request: &Request,
        source_instance: &str,
    ) -> Result<Option<(Decision, Reservation)>, Error> {
        self.decide(
            request,
            Placement::Migration(MigrationSource::Named(source_instance)),
        )
    }

    /// For a request reserved by `reservation`: if the trigger fires (with
    /// the reservation left out of its instance's load) and a target exists,
    /// reserve the request on the target, release it on the old instance
    /// (counted in [`RouterStats::migrated`]), and make `reservation` the new
    /// one — all under one lock hold, so no decision sees the request on both
    /// instances or on neither. The session moves too. `None`: it stays, and
    /// `reservation` is unchanged. Fails for a reservation that is released,
    /// past `prefill_done`, made for a prompt of another length, or made by
    /// another router ([`Error::ForeignReservation`]); a failure changes
    /// nothing on either router.
    pub fn migrate_reservation(
        &self,
        request: &Request,
        reservation: &mut Reservation,
    ) -> Result<Option<Decision>, Error> {
        let source = self.reserved_source(request, reservation)?;
        let Some((decision, migrated)) = self.decide(request, Placement::Migration(source))? else {
            return Ok(None);
        };
        reservation.replace_by_migrated(migrated);
        Ok(Some(decision))
    }

    /// The migration source of a request's own reservation, made by this
    /// router. Every method that takes a reservation goes through here.
    fn reserved_source<'a>(
        &self,
        request: &Request,
        reservation: &'a Reservation,
    ) -> Result<MigrationSource<'a>, Error> {
        // Checked first: another router's instance uids and positions mean
        // nothing here, and migrating it would release load this router
        // never gave out while the other router's share leaks.
        if reservation.router_id() != self.shared.router_id {
            return Err(Error::ForeignReservation {
                request_id: request.request_id.clone(),
                reservation_router: reservation.router_id(),
                router: self.shared.router_id,
            });
        }
        reserved_source(request, reservation)
    }
}

/// The migration source of a request's own reservation (its router checked).
fn reserved_source<'a>(
    request: &Request,
    reservation: &'a Reservation,
) -> Result<MigrationSource<'a>, Error> {
    let invalid = |reason: String| Error::InvalidRequest {
        request_id: request.request_id.clone(),
        reason,
    };
    let held = reservation.held().ok_or_else(|| {
        invalid(
            "its reservation is already released: ask migration_advice (before reserving) \
             or keep the reservation until the request is placed"
                .to_owned(),
        )
    })?;
    if held.decoding {
        return Err(invalid(
            "its prefill is done (prefill_done was called): migration moves a request \
             before its prefill, so ask before the first token"
                .to_owned(),
        ));
    }
    if request.input_len() != held.load.input_len {
        return Err(invalid(format!(
            "it has {} prompt tokens but the reservation holds {}: pass the request \
             the reservation was made for",
            request.input_len(),
            held.load.input_len
        )));
    }
    Ok(MigrationSource::Reserved {
        instance_id: reservation.instance_id(),
        held,
    })
}

const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Router>();
    send_sync::<Reservation>();
};

#[cfg(test)]
#[path = "router_tests.rs"]
mod tests;

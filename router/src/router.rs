//! The router: instances, real state, and pick-and-reserve as one step.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::decide::How;
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

/// State shared by a router, its clones and its reservations.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) settings: RouterSettings,
    pub(crate) real_state_expiry: Duration,
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
        }
    }

    pub(crate) fn end_reservation(
        &self,
        uid: u64,
        hint: usize,
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
            f(&mut state.instances[position].shadow);
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
    /// `max(shadow, real)` with the stored real state if it is fresh now.
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
            .field("policy", &self.shared.settings.policy)
            .field("instances", &self.shared.lock().instances.len())
            .finish_non_exhaustive()
    }
}

impl Router {
    /// A router with no instances yet; refuses invalid settings.
    pub fn new(settings: RouterSettings) -> Result<Router, Error> {
        settings.validate()?;
        let state = RouterState::new(&settings);
        Ok(Router {
            shared: Arc::new(Shared {
                real_state_expiry: Duration::from_secs_f64(settings.real_state_expiry_s),
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
    /// keep theirs until it expires (`real_state_expiry_s` after it was
    /// given). Ids the router does not route to are ignored; the count of
    /// entries stored is returned. Only fresh state is ever merged.
    pub fn update_real_state<S: AsRef<str>>(
        &self,
        states: impl IntoIterator<Item = (S, RealState)>,
    ) -> usize {
        let now = Instant::now();
        let mut state = self.shared.lock();
        states
            .into_iter()
            .filter(|(id, real)| state.set_real_state(id.as_ref(), *real, now))
            .count()
    }

    /// Forget all stored real state (shadow alone until the next update).
    pub fn clear_real_state(&self) {
        for instance in &mut self.shared.lock().instances {
            instance.real = None;
        }
    }

    /// Forget a session's instance; its next request is placed anew.
    pub fn end_session(&self, session_id: &str) -> bool {
        self.shared.lock().end_session(session_key(session_id))
    }

    /// Every instance's counters and effective state, in tie-break order.
    pub fn instances(&self) -> Vec<InstanceView> {
        let now = Instant::now();
        let state = self.shared.lock();
        (0..state.instances.len())
            .map(|position| {
                let instance = &state.instances[position];
                InstanceView {
                    instance_id: instance.id.clone(),
                    shadow: instance.shadow.counters(),
                    effective: state.effective(position, true, now, self.shared.real_state_expiry),
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

    /// Choose an instance by the policy and reserve the request on it, as one
    /// step: the choice and the reservation happen under one lock hold, so a
    /// concurrent pick always sees this one's reservation.
    pub fn pick(&self, request: &Request) -> Result<(Decision, Reservation), Error> {
        let (decision, reservation) = self
            .decide(request, How::Policy)?
            .expect("policies always choose");
        Ok((decision, reservation))
    }

    /// Reserve the request on a named instance (the caller decided), with the
    /// same accounting and logging as a pick; the session moves there.
    pub fn reserve_on(
        &self,
        request: &Request,
        instance_id: &str,
    ) -> Result<(Decision, Reservation), Error> {
        let made = self.decide(request, How::Forced(instance_id))?;
        Ok(made.expect("a forced placement always places"))
    }

    /// The migration trigger's verdict for a request on `source_instance`, and
    /// the target the scorer would pick. Changes nothing.
    pub fn migration_advice(
        &self,
        request: &Request,
        source_instance: &str,
    ) -> Result<MigrationAdvice, Error> {
        let prompt = request.hashed()?;
        let mut state = self.shared.lock();
        let source = state.position(source_instance)?;
        state.fill_candidates(
            self.consults_real_for_migration(),
            Some(&prompt.blocks),
            Instant::now(),
            self.shared.real_state_expiry,
        );
        // A copy of the cursor: advice must not move the round-robin.
        let mut rr = state.rr;
        Ok(self.advise(&state, source, prompt.input_len, &mut rr))
    }

    /// If the trigger fires and a target exists, reserve the request on the
    /// target (one step, as [`pick`](Router::pick)) and move its session
    /// there. The caller then releases its reservation on the source.
    pub fn migrate(
        &self,
        request: &Request,
        source_instance: &str,
    ) -> Result<Option<(Decision, Reservation)>, Error> {
        self.decide(request, How::Migration(source_instance))
    }
}

const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Router>();
    send_sync::<Reservation>();
};

#[cfg(test)]
#[path = "router_tests.rs"]
mod tests;

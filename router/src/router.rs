//! The router: instances, real state, and pick-and-reserve as one step.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::decision::{Decision, Reason};
use crate::decision_log::{render, DecisionLog, RecordInput, Scoring};
use crate::effective::{EffectiveState, RealState};
use crate::error::Error;
use crate::migration::{self, MigrationAdvice};
use crate::policy::{self, AffinityCheck};
use crate::request::{HashedPrompt, Request};
use crate::reservation::{Ending, Reservation};
use crate::settings::{Policy, RealStateUse, RouterSettings};
use crate::shadow::{InstanceShadow, Load, ShadowCounters};
use crate::state::{session_key, RouterState};

/// State shared by a router, its clones and its reservations.
#[derive(Debug)]
pub(crate) struct Shared {
    settings: RouterSettings,
    real_state_expiry: Duration,
    /// Held across choosing an instance and adding the request to its
    /// counters, so no two picks can both see an instance as free.
    state: Mutex<RouterState>,
    /// A separate lock, taken only after `state` is released: a slow log
    /// writer must not hold up other picks' choose-and-reserve.
    log: Mutex<Option<DecisionLog>>,
    log_errors: AtomicU64,
}

impl Shared {
    /// A panic under the lock can only come from a debug assertion; the state
    /// is still consistent for releases, so poisoning is ignored rather than
    /// turned into a panic in every later `Drop`.
    fn lock(&self) -> MutexGuard<'_, RouterState> {
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

/// How an instance is chosen.
#[derive(Clone, Copy, Debug)]
enum How<'a> {
    Policy,
    Forced(&'a str),
    Migration(&'a str),
}

/// What one decision produced before the log line is written.
type Made = (Decision, Reservation, Option<String>);

/// The embedded router. Cheap to clone (clones share state); `Send + Sync`,
/// every method takes `&self`.
#[derive(Clone, Debug)]
pub struct Router {
    shared: Arc<Shared>,
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

    fn consults_real_for_migration(&self) -> bool {
        // A migration is a fresh placement of the request: it consults real
        // state unless real state is never used.
        self.shared.settings.real_state_use != RealStateUse::Never
    }

    fn advise(
        &self,
        state: &RouterState,
        source: usize,
        input_len: u64,
        rr: &mut policy::RoundRobin,
    ) -> MigrationAdvice {
        let settings = &self.shared.settings.migration;
        let mut advice = migration::trigger(settings, &state.candidates, source, input_len);
        advice.source_instance = state.instances[source].id.clone();
        let target = migration::best_target(settings, &state.candidates, source, rr);
        advice.target_instance = target.map(|t| state.instances[t].id.clone());
        advice.migrate = advice.slo_exceeded && advice.above_fleet && target.is_some();
        advice
    }

    fn decide(
        &self,
        request: &Request,
        how: How<'_>,
    ) -> Result<Option<(Decision, Reservation)>, Error> {
        // Hash before locking: the slowest part of a decision needs no shared state.
        let prompt = request.hashed()?;
        let made = {
            let mut state = self.shared.lock();
            self.decide_locked(&mut state, request, &prompt, how)?
        };
        let Some((decision, reservation, line)) = made else {
            return Ok(None);
        };
        if let Some(line) = line {
            let mut log = self
                .shared
                .log
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(Err(_)) = log.as_mut().map(|log| log.write_line(&line)) {
                self.shared.log_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(Some((decision, reservation)))
    }

    fn decide_locked(
        &self,
        state: &mut RouterState,
        request: &Request,
        prompt: &HashedPrompt<'_>,
        how: How<'_>,
    ) -> Result<Option<Made>, Error> {
        let settings = &self.shared.settings;
        if state.instances.is_empty() {
            return Err(Error::NoInstances);
        }
        let now = Instant::now();
        let session = request.session_id.as_deref().map(session_key);
        let sessions_matter = matches!(settings.policy, Policy::Sticky | Policy::Unified);
        let bound = session
            .filter(|_| sessions_matter)
            .and_then(|key| state.bound(key));
        let consult_real = match (how, settings.real_state_use) {
            (How::Migration(_), _) => self.consults_real_for_migration(),
            (_, RealStateUse::Never) => false,
            (_, RealStateUse::Always) => true,
            (_, RealStateUse::Placement) => bound.is_none(),
        };
        let hits_needed = state.logging
            || matches!(how, How::Migration(_))
            || matches!(
                (how, settings.policy),
                (How::Policy, Policy::LMetric | Policy::Unified)
            );
        let blocks = hits_needed.then_some(&prompt.blocks[..]);
        state.fill_candidates(consult_real, blocks, now, self.shared.real_state_expiry);

        let mut affinity: Option<AffinityCheck> = None;
        let mut advice = None;
        let (position, reason, scoring) = match how {
            How::Policy => {
                let choice = policy::choose(
                    settings,
                    &state.candidates,
                    prompt.input_len,
                    bound,
                    &mut state.rr,
                );
                affinity = choice.affinity;
                (choice.index, choice.reason, Scoring::Policy)
            }
            How::Forced(id) => (state.position(id)?, Reason::Forced, Scoring::None),
            How::Migration(source_id) => {
                let source = state.position(source_id)?;
                let mut rr = state.rr;
                let verdict = self.advise(state, source, prompt.input_len, &mut rr);
                if !verdict.migrate {
                    return Ok(None);
                }
                state.rr = rr;
                let target = state.position(
                    verdict
                        .target_instance
                        .as_deref()
                        .expect("migrate has a target"),
                )?;
                advice = Some(verdict);
                (
                    target,
                    Reason::Migration,
                    Scoring::Migration {
                        settings: &settings.migration,
                        source,
                    },
                )
            }
        };

        let cache_hit_tokens = match blocks {
            Some(_) => state.candidates[position].cache_hit_tokens,
            None => state.instances[position]
                .shadow
                .cache_hit_tokens(&prompt.blocks),
        };
        let load = Load {
            input_len: prompt.input_len,
            new_prefill: prompt.input_len.saturating_sub(cache_hit_tokens),
        };
        state.reserve(position, load, &prompt.blocks);
        if let (Some(key), true) = (session, sessions_matter) {
            state.bind(key, position);
        }
        state.counts.decisions += 1;
        let instance = &state.instances[position];
        let decision = Decision {
            request_id: request.request_id.clone(),
            session_id: request.session_id.clone(),
            instance_id: instance.id.clone(),
            reason,
            input_len: prompt.input_len,
            cache_hit_tokens,
            new_prefill_tokens: load.new_prefill,
            consulted_real_state: consult_real,
        };
        let line = state.logging.then(|| {
            render(&RecordInput {
                time_unix_ns: engine_state_shm_format::unix_ns(),
                seq: state.counts.decisions,
                settings,
                decision: &decision,
                instances: &state.instances,
                candidates: &state.candidates,
                scoring,
                affinity,
                migration: advice.as_ref(),
            })
        });
        let reservation = Reservation::new(
            Arc::clone(&self.shared),
            instance.id.clone(),
            instance.uid,
            position,
            load,
        );
        Ok(Some((decision, reservation, line)))
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

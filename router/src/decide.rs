//! One decision under the lock: effective state, the policy (or a forced or
//! migration placement), the reservation, and the decision record.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::Instant;

use crate::decision::{Decision, Reason};
use crate::decision_log::{render, RecordInput, Scoring};
use crate::error::Error;
use crate::migration::{self, MigrationAdvice};
use crate::policy::{self, AffinityCheck};
use crate::request::{HashedPrompt, Request};
use crate::reservation::Reservation;
use crate::router::Router;
use crate::settings::{Policy, RealStateUse};
use crate::shadow::Load;
use crate::state::{session_key, RouterState};

/// How an instance is chosen.
#[derive(Clone, Copy, Debug)]
pub(crate) enum How<'a> {
    Policy,
    Forced(&'a str),
    Migration(&'a str),
}

/// What one decision produced before the log line is written.
pub(crate) type Made = (Decision, Reservation, Option<String>);

impl Router {
    pub(crate) fn consults_real_for_migration(&self) -> bool {
        // A migration is a fresh placement of the request: it consults real
        // state unless real state is never used.
        self.shared.settings.real_state_use != RealStateUse::Never
    }

    pub(crate) fn advise(
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

    pub(crate) fn decide(
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

//! One decision under the lock: effective state, the policy (or a forced or
//! migration placement), the reservation, and the decision record.

use std::cmp::Reverse;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use crate::decision::{Decision, Reason};
use crate::decision_log::{render, RecordInput, Scoring};
use crate::error::Error;
use crate::migration::{self, MigrationAdvice};
use crate::policy::{self, AffinityCheck, Candidate};
use crate::request::{HashedPrompt, Request};
use crate::reservation::{HeldReservation, Reservation};
use crate::router::Router;
use crate::settings::{CacheKnowledge, Policy, RealStateUse};
use crate::shadow::Load;
use crate::state::{request_key, session_key, RouterState};

/// What kind of placement a decision is.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Placement<'a> {
    /// The configured policy chooses.
    Policy,
    /// The caller named the instance (`reserve_on`).
    Forced(&'a str),
    /// The migration scorer chooses, if the trigger fires for the request on
    /// this source.
    Migration(MigrationSource<'a>),
}

/// The instance a migration would move a request off.
#[derive(Clone, Copy, Debug)]
pub(crate) enum MigrationSource<'a> {
    /// Named: the request holds no reservation (advice before reserving).
    Named(&'a str),
    /// The instance of the request's own reservation, which is left out of
    /// that instance's load (and released there if the request migrates).
    Reserved {
        instance_id: &'a str,
        held: HeldReservation,
    },
}

/// One decision's result, with its decision-log line when logging.
pub(crate) struct Placed {
    pub decision: Decision,
    pub reservation: Reservation,
    pub log_line: Option<String>,
}

impl Router {
    pub(crate) fn consults_real_for_migration(&self) -> bool {
        // A migration is a fresh placement of the request: it consults real
        // state unless real state is never used.
        self.shared.settings.real_state_use != RealStateUse::Never
    }

    /// Whether cache hits come from fresh engine digests where there are
    /// some: `cache_knowledge = engine`, whatever `real_state_use` says
    /// (docs/ROUTING.md, "Where real state is used"): that setting is about
    /// engine load, and a digest says where a prefix is, not how loaded an
    /// engine is, so reading it at every decision cannot herd.
    pub(crate) fn uses_digests(&self) -> bool {
        self.shared.settings.cache_knowledge == CacheKnowledge::Engine
    }

    /// Fill the candidates for a migration question and return the source's
    /// position. A held reservation is left out of its instance's load: the
    /// request must not count against itself (docs/ROUTING.md, "Migration").
    pub(crate) fn migration_candidates(
        &self,
        state: &mut RouterState,
        request: &Request,
        source: MigrationSource<'_>,
        prompt: &HashedPrompt<'_>,
        now_ns: u64,
    ) -> Result<usize, Error> {
        let consult_real = self.consults_real_for_migration();
        let expiry = self.shared.real_state_expiry;
        state.fill_candidates(
            consult_real,
            self.uses_digests(),
            Some(&prompt.blocks),
            now_ns,
            expiry,
        );
        match source {
            MigrationSource::Named(id) => {
                let position = state.position(id)?;
                // Asked by name, the request's own reservation on the source
                // would count against it (its prefill in the source's
                // pending prefill): refused, never silently answered.
                if state.instances[position].holds_request(request_key(&request.request_id)) {
                    return Err(Error::InvalidRequest {
                        request_id: request.request_id.clone(),
                        reason: format!(
                            "it holds a reservation on {id:?}, which asked by instance name \
                             would count against it: pass the reservation instead \
                             (migration_advice_for; to move it: migrate_reservation in Rust, \
                             migrate(reservation, ...) in Python)"
                        ),
                    });
                }
                Ok(position)
            }
            MigrationSource::Reserved { instance_id, held } => {
                let position = state
                    .position_of_uid(held.uid, held.position_hint)
                    .ok_or_else(|| Error::InvalidRequest {
                        request_id: request.request_id.clone(),
                        reason: format!(
                            "its reservation's instance {instance_id:?} was removed from the \
                             router: place the request anew with pick"
                        ),
                    })?;
                state.leave_out(position, held, consult_real, now_ns, expiry);
                Ok(position)
            }
        }
    }

    pub(crate) fn advise(
        &self,
        state: &RouterState,
        source: usize,
        input_len: u64,
        round_robin: &mut policy::RoundRobin,
    ) -> MigrationAdvice {
        let settings = &self.shared.settings.migration;
        let mut advice = migration::trigger(settings, &state.candidates, source, input_len);
        advice.source_instance = state.instances[source].id.clone();
        let target = migration::best_target(settings, &state.candidates, source, round_robin);
        advice.target_instance = target.map(|t| state.instances[t].id.clone());
        advice.migrate = advice.slo_exceeded && advice.above_fleet && target.is_some();
        advice
    }

    pub(crate) fn decide(
        &self,
        request: &Request,
        placement: Placement<'_>,
    ) -> Result<Option<(Decision, Reservation)>, Error> {
        // Hash before locking: the slowest part of a decision needs no shared
        // state (nor does the request id's key).
        let prompt = request.hashed()?;
        let request_key = request_key(&request.request_id);
        let placed = {
            let mut state = self.shared.lock();
            self.decide_locked(&mut state, request, request_key, &prompt, placement)?
        };
        let Some(placed) = placed else {
            return Ok(None);
        };
        if let Some(line) = placed.log_line {
            let mut log = self
                .shared
                .log
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(Err(_)) = log.as_mut().map(|log| log.write_line(&line)) {
                self.shared.log_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(Some((placed.decision, placed.reservation)))
    }

    fn decide_locked(
        &self,
        state: &mut RouterState,
        request: &Request,
        request_key: u64,
        prompt: &HashedPrompt<'_>,
        placement: Placement<'_>,
    ) -> Result<Option<Placed>, Error> {
        let settings = &self.shared.settings;
        if state.instances.is_empty() {
            return Err(Error::NoInstances);
        }
        let now_ns = self.shared.clock.now_ns();
        let expiry = self.shared.real_state_expiry;
        let session = request.session_id.as_deref().map(session_key);
        let sessions_matter = matches!(settings.policy, Policy::Sticky | Policy::Unified);
        // A session whose instance is shutting down is placed anew.
        let bound = session
            .filter(|_| sessions_matter)
            .and_then(|key| state.bound(key))
            .filter(|&position| !state.instances[position].shutting_down);
        // `placement`: only the decision that first binds a session to an
        // instance (docs/ROUTING.md, "Where real state is used"); session-less
        // requests and the session-less policies never consult real state in
        // that mode.
        let binds_a_session = sessions_matter && session.is_some() && bound.is_none();
        let consult_real = match (placement, settings.real_state_use) {
            (Placement::Migration(_), _) => self.consults_real_for_migration(),
            (_, RealStateUse::Never) => false,
            (_, RealStateUse::Always) => true,
            (_, RealStateUse::Placement) => binds_a_session,
        };
        let digests = self.uses_digests();
        // Session adoption (docs/ROUTING.md, "The policies"): a session this
        // replica has not bound may be bound already by another replica, or
        // by this one before it forgot: the engines' digests say where its
        // cache is.
        let adopting = matches!(placement, Placement::Policy) && binds_a_session && digests;
        let hits_needed = state.logging
            || adopting
            || matches!(placement, Placement::Migration(_))
            || matches!(
                (placement, settings.policy),
                (Placement::Policy, Policy::LMetric | Policy::Unified)
            );
        let blocks = hits_needed.then_some(&prompt.blocks[..]);
        // The counterfactual first, so that the real candidates stay in
        // `state.candidates` for the choice and its log record.
        let shadow_only = match placement {
            Placement::Policy if consult_real && state.compare_shadow => {
                state.fill_candidates(false, false, blocks, now_ns, expiry);
                // A copy of the cursor: the counterfactual must not move it.
                let mut round_robin = state.round_robin;
                policy::choose(
                    settings,
                    &state.candidates,
                    prompt.input_len,
                    bound,
                    &mut round_robin,
                )
                .map(|choice| choice.index)
            }
            _ => None,
        };
        if !matches!(placement, Placement::Migration(_)) {
            state.fill_candidates(consult_real, digests, blocks, now_ns, expiry);
        }
        let adopted = match adopting {
            true => adoption(&state.candidates, prompt.input_len),
            false => None,
        };

        let mut affinity: Option<AffinityCheck> = None;
        let mut advice = None;
        let mut migrated_from = None;
        let (position, reason, scoring) = match placement {
            Placement::Policy => {
                // An adopted session is bound before the policy's own
                // placement rule: the policy treats it as the session's
                // instance (unified still checks it is warm and not
                // overloaded).
                let choice = policy::choose(
                    settings,
                    &state.candidates,
                    prompt.input_len,
                    bound.or(adopted),
                    &mut state.round_robin,
                )
                .ok_or(Error::AllShuttingDown)?;
                affinity = choice.affinity;
                let reason = match choice.reason {
                    Reason::Affinity if adopted.is_some() => Reason::Adoption,
                    reason => reason,
                };
                (choice.index, reason, Scoring::Policy)
            }
            Placement::Forced(id) => (state.position(id)?, Reason::Forced, Scoring::None),
            Placement::Migration(source) => {
                let source_position =
                    self.migration_candidates(state, request, source, prompt, now_ns)?;
                let mut round_robin = state.round_robin;
                let verdict =
                    self.advise(state, source_position, prompt.input_len, &mut round_robin);
                if !verdict.migrate {
                    return Ok(None);
                }
                state.round_robin = round_robin;
                let target = state.position(
                    verdict
                        .target_instance
                        .as_deref()
                        .expect("migrate has a target"),
                )?;
                advice = Some(verdict);
                if let MigrationSource::Reserved { held, .. } = source {
                    migrated_from = Some((source_position, held));
                }
                (
                    target,
                    Reason::Migration,
                    Scoring::Migration {
                        settings: &settings.migration,
                        source: source_position,
                    },
                )
            }
        };

        let (cache_hit_tokens, cache_knowledge) = match blocks {
            Some(_) => {
                let chosen = &state.candidates[position];
                (chosen.cache_hit_tokens, chosen.cache_knowledge)
            }
            None => state.instances[position].cache_hit(&prompt.blocks, digests, now_ns, expiry),
        };
        let load = Load {
            input_len: prompt.input_len,
            new_prefill: prompt.input_len.saturating_sub(cache_hit_tokens),
        };
        state.reserve(position, load, &prompt.blocks, request_key);
        if let Some((source, held)) = migrated_from {
            // Under the same lock hold as the new reservation: no decision
            // ever sees the request on both instances, or on neither.
            state.release_migrated(source, held);
        }
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
            cache_knowledge,
            new_prefill_tokens: load.new_prefill,
            consulted_real_state: consult_real,
            shadow_only_instance_id: shadow_only.map(|p| state.instances[p].id.clone()),
        };
        let log_line = state.logging.then(|| {
            render(&RecordInput {
                clock_ns: now_ns,
                time_unix_ns: self.shared.clock.unix_ns(),
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
            request_key,
        );
        Ok(Some(Placed {
            decision,
            reservation,
            log_line,
        }))
    }
}

/// The instance a session no replica-local binding names is adopted by: the
/// open one whose engine digest holds the longest leading run of the prompt,
/// if that covers more than half of the prompt (docs/ROUTING.md, "The
/// policies"). Ties go to the fewer requests, then to instance order.
/// Estimated hits never adopt: this replica's own estimate would only find
/// where it sent the session itself, and then it is bound already.
pub(crate) fn adoption(candidates: &[Candidate], input_len: u64) -> Option<usize> {
    candidates
        .iter()
        .enumerate()
        .filter(|(_, c)| {
            !c.shutting_down
                && c.cache_knowledge == CacheKnowledge::Engine
                && u128::from(c.cache_hit_tokens) * 2 > u128::from(input_len)
        })
        .min_by_key(|(index, c)| (Reverse(c.cache_hit_tokens), c.state.num_requests, *index))
        .map(|(index, _)| index)
}

#[cfg(test)]
#[path = "cache_knowledge_tests.rs"]
mod cache_knowledge_tests;

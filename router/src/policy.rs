//! The routing policies (docs/ROUTING.md, "The policies") as pure functions
//! over effective state.
//!
//! Nothing here locks or mutates shared state except the round-robin cursor
//! passed in, so every policy is tested on hand-built instances.

use crate::decision::Reason;
use crate::effective::EffectiveState;
use crate::settings::{CacheKnowledge, Policy, RouterSettings};

/// One instance as a policy sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Candidate {
    pub state: EffectiveState,
    /// Tokens of the prompt's leading blocks this instance caches.
    pub cache_hit_tokens: u64,
    /// Where `cache_hit_tokens` came from (the engine's digest or the estimate).
    pub cache_knowledge: CacheKnowledge,
    /// Its fresh snapshot says it is shutting down: no policy or migration
    /// chooses it (its reservations still complete normally).
    pub shutting_down: bool,
}

impl Candidate {
    /// `input_len − estimate_cache_hit`.
    pub(crate) fn new_prefill(&self, input_len: u64) -> u64 {
        input_len.saturating_sub(self.cache_hit_tokens)
    }
}

/// Deterministic round-robin tie-breaking: of the tied instances, the first
/// at or after the cursor (in instance order, wrapping); the cursor then moves
/// just past the instance chosen. Repeated ties thus cycle through the tied
/// instances in order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RoundRobin {
    pub cursor: usize,
}

impl RoundRobin {
    /// The instance with the least key (`None` keys are excluded), ties broken
    /// round-robin. `None` when every instance is excluded.
    pub(crate) fn argmin<K: PartialOrd>(
        &mut self,
        len: usize,
        key: impl Fn(usize) -> Option<K>,
    ) -> Option<usize> {
        let mut best: Option<K> = None;
        for index in 0..len {
            if let Some(k) = key(index) {
                if best.as_ref().is_none_or(|b| k < *b) {
                    best = Some(k);
                }
            }
        }
        let best = best?;
        let tied = |index: &usize| key(*index).is_some_and(|k| k == best);
        let chosen = (self.cursor.min(len)..len)
            .find(tied)
            .or_else(|| (0..len).find(tied))?;
        self.cursor = chosen + 1;
        Some(chosen)
    }
}

/// The `unified` affinity check, for the decision log.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct AffinityCheck {
    pub instance: usize,
    pub hit_ratio: f64,
    pub num_requests: u64,
    /// `max(mean num_requests, 1) × overload_factor`.
    pub limit: f64,
}

/// A policy's choice.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Choice {
    pub index: usize,
    pub reason: Reason,
    pub affinity: Option<AffinityCheck>,
}

/// The policy's ranking score of one candidate (lower is better), as logged.
pub(crate) fn score(settings: &RouterSettings, c: &Candidate, input_len: u64) -> f64 {
    match settings.policy {
        Policy::LoadOnly | Policy::Sticky => c.state.num_requests as f64,
        Policy::LMetric => lmetric(c, input_len) as f64,
        Policy::Unified => unified(c, input_len, settings.decode_weight),
    }
}

/// `(pending_prefill + new_prefill) × num_requests`, exact in integers.
pub(crate) fn lmetric(c: &Candidate, input_len: u64) -> u128 {
    let prefill = u128::from(c.state.pending_prefill_tokens) + u128::from(c.new_prefill(input_len));
    prefill * u128::from(c.state.num_requests)
}

/// `(pending_prefill + new_prefill + decode_weight × ongoing_decode) × max(num_requests, 1)`.
pub(crate) fn unified(c: &Candidate, input_len: u64, decode_weight: f64) -> f64 {
    let s = &c.state;
    let work = s.pending_prefill_tokens as f64
        + c.new_prefill(input_len) as f64
        + decode_weight * s.ongoing_decode_tokens as f64;
    work * s.num_requests.max(1) as f64
}

/// Choose an instance. `bound` is the position of the request's session
/// instance, if the session has one that is still routed to and not shutting
/// down. `None` when every candidate is shutting down (or there are none).
pub(crate) fn choose(
    settings: &RouterSettings,
    candidates: &[Candidate],
    input_len: u64,
    bound: Option<usize>,
    round_robin: &mut RoundRobin,
) -> Option<Choice> {
    let n = candidates.len();
    // Instances shutting down are no candidates for any policy.
    let open = |i: usize| (!candidates[i].shutting_down).then_some(&candidates[i]);
    let least_loaded =
        |round_robin: &mut RoundRobin| round_robin.argmin(n, |i| Some(open(i)?.state.num_requests));
    let plain = |index, reason| Choice {
        index,
        reason,
        affinity: None,
    };
    Some(match settings.policy {
        Policy::LoadOnly => plain(least_loaded(round_robin)?, Reason::LeastLoaded),
        Policy::LMetric => {
            let index = round_robin.argmin(n, |i| Some(lmetric(open(i)?, input_len)))?;
            plain(index, Reason::Lmetric)
        }
        Policy::Sticky => match bound {
            Some(index) => plain(index, Reason::Affinity),
            None => plain(least_loaded(round_robin)?, Reason::Placement),
        },
        Policy::Unified => unified_choice(settings, candidates, input_len, bound, round_robin)?,
    })
}

fn unified_choice(
    settings: &RouterSettings,
    candidates: &[Candidate],
    input_len: u64,
    bound: Option<usize>,
    round_robin: &mut RoundRobin,
) -> Option<Choice> {
    let mut reason = Reason::Placement;
    let mut affinity = None;
    if let Some(instance) = bound {
        let c = &candidates[instance];
        let hit_ratio = if input_len == 0 {
            0.0
        } else {
            c.cache_hit_tokens as f64 / input_len as f64
        };
        let total: f64 = candidates.iter().map(|c| c.state.num_requests as f64).sum();
        let mean = total / candidates.len() as f64;
        let limit = mean.max(1.0) * settings.overload_factor;
        let num_requests = c.state.num_requests;
        let check = AffinityCheck {
            instance,
            hit_ratio,
            num_requests,
            limit,
        };
        affinity = Some(check);
        let warm = hit_ratio > settings.affinity_min_hit_ratio;
        if warm && num_requests as f64 <= limit {
            return Some(Choice {
                index: instance,
                reason: Reason::Affinity,
                affinity,
            });
        }
        reason = if warm {
            Reason::FallbackOverloaded
        } else {
            Reason::FallbackColdCache
        };
    }
    let index = round_robin.argmin(candidates.len(), |i| {
        let c = &candidates[i];
        if c.shutting_down {
            return None;
        }
        let score = unified(c, input_len, settings.decode_weight);
        Some((score, c.new_prefill(input_len), c.state.num_requests))
    })?;
    Some(Choice {
        index,
        reason,
        affinity,
    })
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;

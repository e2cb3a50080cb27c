//! Migration: when to move a request off its instance, and where to
//! (docs/ROUTING.md, "Migration").

use serde::Serialize;

use crate::policy::{Candidate, RoundRobin};
use crate::settings::MigrationSettings;

/// The trigger's inputs and verdict, and the target scorer's pick.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MigrationAdvice {
    /// The instance the request would leave.
    pub source_instance: String,
    /// `(source pending_prefill + new_prefill) / prefill_tokens_per_s`, seconds.
    pub projected_prefill_s: f64,
    /// The source's effective pending prefill tokens.
    pub source_pending_prefill_tokens: u64,
    /// Median effective pending prefill over all instances (source included).
    pub fleet_median_pending_prefill_tokens: f64,
    /// `projected_prefill_s > ttft_slo_s`.
    pub slo_exceeded: bool,
    /// Source pending prefill `> rel_hi ×` the fleet median.
    pub above_fleet: bool,
    /// The best target, whether or not the trigger fired; `None` when every
    /// other instance is avoided (big prefill, KV wall) or there is none.
    pub target_instance: Option<String>,
    /// Both trigger conditions hold and there is a target.
    pub migrate: bool,
}

/// Why an instance cannot be a migration target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Avoided {
    /// It is the source.
    Source,
    /// Its fresh snapshot says it is shutting down.
    ShuttingDown,
    /// `max_prefill_remaining ≥ big_prefill_threshold`: the request would
    /// wait behind a prefill that stalls the engine's other work.
    BigPrefill,
    /// `kv_used_frac ≥ kv_wall_frac`: a new request would force preemptions.
    KvWall,
}

/// Whether a candidate is avoided as a target (a shutting-down instance
/// always is). Without fresh real state the
/// KV fraction is unknown and never avoids; `max_prefill_remaining` then
/// comes from the shadow's own reservations.
pub(crate) fn avoided(
    settings: &MigrationSettings,
    c: &Candidate,
    index: usize,
    source: usize,
) -> Option<Avoided> {
    if index == source {
        Some(Avoided::Source)
    } else if c.shutting_down {
        Some(Avoided::ShuttingDown)
    } else if c.state.max_prefill_remaining >= settings.big_prefill_threshold {
        Some(Avoided::BigPrefill)
    } else if c
        .state
        .kv_used_frac
        .is_some_and(|used| used >= settings.kv_wall_frac)
    {
        Some(Avoided::KvWall)
    } else {
        None
    }
}

/// The best target: most cache hit, then least effective `num_requests`, then
/// least effective pending prefill (what the request would queue behind),
/// then round-robin.
pub(crate) fn best_target(
    settings: &MigrationSettings,
    candidates: &[Candidate],
    source: usize,
    round_robin: &mut RoundRobin,
) -> Option<usize> {
    round_robin.argmin(candidates.len(), |i| {
        let c = &candidates[i];
        if avoided(settings, c, i, source).is_some() {
            return None;
        }
        Some((
            std::cmp::Reverse(c.cache_hit_tokens),
            c.state.num_requests,
            c.state.pending_prefill_tokens,
        ))
    })
}

/// The trigger's numbers (`target_instance`/`migrate` are filled by the caller).
pub(crate) fn trigger(
    settings: &MigrationSettings,
    candidates: &[Candidate],
    source: usize,
    input_len: u64,
) -> MigrationAdvice {
    let c = &candidates[source];
    let pending = c.state.pending_prefill_tokens;
    let projected =
        (pending as f64 + c.new_prefill(input_len) as f64) / settings.prefill_tokens_per_s;
    let median = median(candidates.iter().map(|c| c.state.pending_prefill_tokens));
    MigrationAdvice {
        source_instance: String::new(),
        projected_prefill_s: projected,
        source_pending_prefill_tokens: pending,
        fleet_median_pending_prefill_tokens: median,
        slo_exceeded: projected > settings.ttft_slo_s,
        above_fleet: pending as f64 > settings.rel_hi * median,
        target_instance: None,
        migrate: false,
    }
}

/// Median (mean of the middle two for an even count); 0 for none.
fn median(values: impl Iterator<Item = u64>) -> f64 {
    let mut values: Vec<u64> = values.collect();
    if values.is_empty() {
        return 0.0;
    }
    values.sort_unstable();
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid] as f64
    } else {
        (values[mid - 1] as f64 + values[mid] as f64) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::effective::EffectiveState;

    fn cand(num_requests: u64, pending: u64, max_prefill: u64, hit: u64) -> Candidate {
        let state = EffectiveState {
            num_requests,
            pending_prefill_tokens: pending,
            max_prefill_remaining: max_prefill,
            ..EffectiveState::default()
        };
        Candidate {
            state,
            cache_hit_tokens: hit,
            cache_knowledge: crate::CacheKnowledge::Estimated,
            shutting_down: false,
        }
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median([3, 1, 2].into_iter()), 2.0);
        assert_eq!(median([4, 1, 2, 3].into_iter()), 2.5);
        assert_eq!(median(std::iter::empty()), 0.0);
    }

    #[test]
    fn trigger_needs_both_a_missed_slo_and_a_source_above_the_fleet() {
        // 2.5 s, rel_hi 1.5, at 10,000 tokens/s for round numbers.
        let s = MigrationSettings {
            prefill_tokens_per_s: 10_000.0,
            ..MigrationSettings::default()
        };
        // Source 0: (30,000 + 4,096) / 10,000 = 3.41 s > 2.5; median of
        // [30,000, 1,000, 2,000] is 2,000, × 1.5 = 3,000 < 30,000: migrate.
        let fleet = [
            cand(4, 30_000, 0, 0),
            cand(1, 1000, 0, 0),
            cand(1, 2000, 0, 0),
        ];
        let t = trigger(&s, &fleet, 0, 4096);
        assert!((t.projected_prefill_s - 3.4096).abs() < 1e-12);
        assert_eq!(t.fleet_median_pending_prefill_tokens, 2000.0);
        assert!(t.slo_exceeded && t.above_fleet);

        // Everyone equally busy: slow, but moving would not help.
        let busy = [
            cand(4, 30_000, 0, 0),
            cand(4, 30_000, 0, 0),
            cand(4, 30_000, 0, 0),
        ];
        let t = trigger(&s, &busy, 0, 4096);
        assert!(t.slo_exceeded && !t.above_fleet);

        // Above the fleet but well within the SLO: (5,000 + 4,096) / 10k = 0.91 s.
        let light = [cand(1, 5000, 0, 0), cand(0, 0, 0, 0), cand(0, 0, 0, 0)];
        let t = trigger(&s, &light, 0, 4096);
        assert!(!t.slo_exceeded && t.above_fleet);
    }

    #[test]
    fn new_prefill_on_the_source_counts_its_cache() {
        let s = MigrationSettings {
            prefill_tokens_per_s: 10_000.0,
            ..MigrationSettings::default()
        };
        // 24,000 pending + (4,096 − 4,096 cached) = 2.4 s: within the SLO.
        let fleet = [cand(1, 24_000, 0, 4096), cand(0, 0, 0, 0)];
        assert!(!trigger(&s, &fleet, 0, 4096).slo_exceeded);
        let cold = [cand(1, 24_000, 0, 0), cand(0, 0, 0, 0)];
        assert!(trigger(&s, &cold, 0, 4096).slo_exceeded);
    }

    #[test]
    fn target_avoids_a_big_prefill_even_with_the_lowest_load() {
        let s = MigrationSettings::default();
        let fleet = [
            cand(9, 50_000, 0, 0),
            cand(0, 20_000, 20_000, 0),
            cand(3, 1000, 1000, 0),
        ];
        assert_eq!(
            best_target(&s, &fleet, 0, &mut RoundRobin::default()),
            Some(2)
        );
        assert_eq!(avoided(&s, &fleet[1], 1, 0), Some(Avoided::BigPrefill));
    }

    #[test]
    fn target_prefers_cache_then_load_then_pending() {
        let s = MigrationSettings::default();
        let fleet = [cand(9, 0, 0, 0), cand(5, 0, 0, 4096), cand(0, 0, 0, 0)];
        assert_eq!(
            best_target(&s, &fleet, 0, &mut RoundRobin::default()),
            Some(1)
        );
        let fleet = [
            cand(9, 0, 0, 0),
            cand(2, 900, 0, 0),
            cand(2, 800, 0, 0),
            cand(3, 0, 0, 0),
        ];
        assert_eq!(
            best_target(&s, &fleet, 0, &mut RoundRobin::default()),
            Some(2)
        );
    }

    #[test]
    fn target_avoids_the_kv_wall_and_may_find_none() {
        let s = MigrationSettings::default();
        let mut walled = cand(0, 0, 0, 8192);
        walled.state.kv_used_frac = Some(0.95);
        let fleet = [cand(9, 0, 0, 0), walled, cand(4, 0, 0, 0)];
        assert_eq!(
            best_target(&s, &fleet, 0, &mut RoundRobin::default()),
            Some(2)
        );
        assert_eq!(
            best_target(&s, &fleet[..2], 0, &mut RoundRobin::default()),
            None
        );
    }

    #[test]
    fn target_avoids_an_instance_that_is_shutting_down() {
        let s = MigrationSettings::default();
        let mut fleet = [cand(9, 0, 0, 0), cand(0, 0, 0, 8192), cand(4, 0, 0, 0)];
        fleet[1].shutting_down = true;
        assert_eq!(avoided(&s, &fleet[1], 1, 0), Some(Avoided::ShuttingDown));
        assert_eq!(
            best_target(&s, &fleet, 0, &mut RoundRobin::default()),
            Some(2)
        );
    }

    #[test]
    fn without_real_state_the_kv_wall_is_unknown_and_shadow_ranks() {
        let s = MigrationSettings::default();
        // kv_used_frac None (no fresh real state): not avoided.
        let fleet = [cand(9, 0, 0, 0), cand(1, 0, 0, 0), cand(2, 0, 0, 0)];
        assert_eq!(
            best_target(&s, &fleet, 0, &mut RoundRobin::default()),
            Some(1)
        );
    }
}

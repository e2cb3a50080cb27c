//! One configuration's result reduced to the numbers a report shows.

use serde::{Deserialize, Serialize};

use crate::driver::{engines_per_session, policy_label, RunConfig, RunResult};

/// The `q`-quantile (nearest rank) of sorted values; NaN when empty.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub(crate) fn sorted(mut values: Vec<f64>) -> Vec<f64> {
    values.sort_by(f64::total_cmp);
    values
}

pub(crate) fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

/// One row of the report. It reads back from its own CSV
/// ([`crate::read_csv`]): a column it lacks takes [`Summary::default`]'s value.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Summary {
    /// Configuration name.
    pub config: String,
    /// Policy (with unified's non-default settings).
    pub policy: String,
    /// Real-state use.
    pub real_state_use: String,
    /// Feed.
    pub feed: String,
    /// Where the routers' cache hits came from: `engine` (the engines'
    /// digests, where fresh) or `estimated` (their own estimate; also every
    /// run whose routers read no digest: no periodic feed, or `never`).
    pub cache_knowledge: String,
    /// Feed period in ms (0 for none).
    pub feed_period_ms: f64,
    /// Router replicas.
    pub routers: usize,
    /// With shared reservations, their propagation delay in ms (0: shared
    /// memory); `None` (an empty CSV cell) when the replicas do not share
    /// them, as in every CSV from before the column.
    pub share_delay_ms: Option<f64>,
    /// Requests served (rejected ones excluded).
    pub requests: usize,
    /// Requests too long for the KV cache.
    pub rejected: usize,
    /// TTFT seconds.
    pub ttft_p50_s: f64,
    /// TTFT p90, seconds.
    pub ttft_p90_s: f64,
    /// TTFT p99, seconds.
    pub ttft_p99_s: f64,
    /// TTFT mean, seconds.
    pub ttft_mean_s: f64,
    /// Time per output token after the first, ms (requests with ≥ 2 tokens).
    pub tpot_p50_ms: f64,
    /// TPOT p90, ms.
    pub tpot_p90_ms: f64,
    /// End-to-end latency p50, seconds.
    pub e2e_p50_s: f64,
    /// E2E p90, seconds.
    pub e2e_p90_s: f64,
    /// Output tokens per second over the run.
    pub throughput_tok_s: f64,
    /// Requests per second over the run.
    pub throughput_req_s: f64,
    /// Engine prefix-cache hit tokens / queried tokens at first admissions
    /// (vLLM's `prefix_cache_hits / prefix_cache_queries`: recomputes after a
    /// preemption are not counted).
    pub prefix_hit_rate: f64,
    /// Preemptions.
    pub preemptions: u64,
    /// Migrations.
    pub migrations: u64,
    /// Requests on the busiest engine.
    pub requests_per_engine_max: usize,
    /// Median requests per engine.
    pub requests_per_engine_median: f64,
    /// Mean distinct engines per session.
    pub engines_per_session_mean: f64,
    /// Share of decisions whose cache hit came from an engine's digest.
    pub decisions_engine_knowledge: f64,
    /// Share of decisions (picks) that adopted a session by the digests.
    pub adoptions: f64,
    /// Router-believed cache hit above the engine's real one at first
    /// admissions, as a share of their prompt tokens.
    pub hit_overcounted: f64,
    /// The engine's real hit above the router-believed one, likewise.
    pub hit_undercounted: f64,
    /// Share of decisions that consulted real state.
    pub decisions_consulting_real: f64,
    /// Share of decisions (picks) that real state changed: the same policy
    /// on the shadow counters alone would have chosen another engine.
    pub decisions_real_changed: f64,
    /// Age of the chosen engine's real state at those decisions, p50 ms.
    pub real_state_age_p50_ms: f64,
    /// Same, p99 ms.
    pub real_state_age_p99_ms: f64,
    /// Engine steps simulated.
    pub steps: u64,
    /// Arrival-rate factor of the trace.
    pub rate_scale: f64,
    /// Wall-clock seconds the simulation took.
    pub wall_s: f64,
    /// Simulated seconds (first arrival to last token).
    pub simulated_s: f64,
}

impl Default for Summary {
    /// Empty text, zero counts, and NaN (no value; an empty CSV cell) for
    /// every measure, except `rate_scale` 1.
    fn default() -> Summary {
        Summary {
            config: String::new(),
            policy: String::new(),
            real_state_use: String::new(),
            cache_knowledge: String::new(),
            feed: String::new(),
            feed_period_ms: f64::NAN,
            routers: 0,
            share_delay_ms: None,
            requests: 0,
            rejected: 0,
            ttft_p50_s: f64::NAN,
            ttft_p90_s: f64::NAN,
            ttft_p99_s: f64::NAN,
            ttft_mean_s: f64::NAN,
            tpot_p50_ms: f64::NAN,
            tpot_p90_ms: f64::NAN,
            e2e_p50_s: f64::NAN,
            e2e_p90_s: f64::NAN,
            throughput_tok_s: f64::NAN,
            throughput_req_s: f64::NAN,
            prefix_hit_rate: f64::NAN,
            preemptions: 0,
            migrations: 0,
            requests_per_engine_max: 0,
            requests_per_engine_median: f64::NAN,
            engines_per_session_mean: f64::NAN,
            decisions_engine_knowledge: f64::NAN,
            adoptions: f64::NAN,
            hit_overcounted: f64::NAN,
            hit_undercounted: f64::NAN,
            decisions_consulting_real: f64::NAN,
            decisions_real_changed: f64::NAN,
            real_state_age_p50_ms: f64::NAN,
            real_state_age_p99_ms: f64::NAN,
            steps: 0,
            rate_scale: 1.0,
            wall_s: f64::NAN,
            simulated_s: f64::NAN,
        }
    }
}

impl Summary {
    /// Reduce a run.
    pub fn of(config: &RunConfig, result: &RunResult) -> Summary {
        let served: Vec<_> = result.requests.iter().filter(|r| !r.rejected).collect();
        let secs = |ns: u64| ns as f64 / 1e9;
        let ttft = sorted(
            served
                .iter()
                .map(|r| secs(r.first_token_ns - r.arrival_ns))
                .collect(),
        );
        let e2e = sorted(
            served
                .iter()
                .map(|r| secs(r.finish_ns - r.arrival_ns))
                .collect(),
        );
        let tpot = sorted(
            served
                .iter()
                .filter(|r| r.output_len >= 2)
                .map(|r| (r.finish_ns - r.first_token_ns) as f64 / 1e6 / (r.output_len - 1) as f64)
                .collect(),
        );
        let start = served.iter().map(|r| r.arrival_ns).min().unwrap_or(0);
        let end = served.iter().map(|r| r.finish_ns).max().unwrap_or(0);
        let span = secs(end - start).max(1e-9);
        let mut per_engine = vec![0usize; config.engines];
        for r in &served {
            per_engine[r.engine] += 1;
        }
        per_engine.sort_unstable();
        let per_engine_f: Vec<f64> = per_engine.iter().map(|&n| n as f64).collect();
        let eps: Vec<f64> = engines_per_session(&result.requests)
            .into_iter()
            .map(|n| n as f64)
            .collect();
        let ages = sorted(
            result
                .decision_real_age_ns
                .iter()
                .map(|&ns| ns as f64 / 1e6)
                .collect(),
        );
        Summary {
            config: config.name(),
            policy: policy_label(&config.router),
            real_state_use: config.router.real_state_use.to_string(),
            feed: config.feed.to_string(),
            cache_knowledge: config.effective_cache_knowledge().to_string(),
            feed_period_ms: config.feed.period_ns().map_or(0.0, |ns| ns as f64 / 1e6),
            routers: config.routers,
            share_delay_ms: config.share_delay_ms(),
            requests: served.len(),
            rejected: result.requests.len() - served.len(),
            ttft_p50_s: quantile(&ttft, 0.5),
            ttft_p90_s: quantile(&ttft, 0.9),
            ttft_p99_s: quantile(&ttft, 0.99),
            ttft_mean_s: mean(&ttft),
            tpot_p50_ms: quantile(&tpot, 0.5),
            tpot_p90_ms: quantile(&tpot, 0.9),
            e2e_p50_s: quantile(&e2e, 0.5),
            e2e_p90_s: quantile(&e2e, 0.9),
            throughput_tok_s: served.iter().map(|r| r.output_len).sum::<u64>() as f64 / span,
            throughput_req_s: served.len() as f64 / span,
            prefix_hit_rate: result.prefix_hit_tokens as f64
                / result.prefix_query_tokens.max(1) as f64,
            preemptions: result.preemptions,
            migrations: result.migrations,
            requests_per_engine_max: per_engine.last().copied().unwrap_or(0),
            requests_per_engine_median: quantile(&per_engine_f, 0.5),
            engines_per_session_mean: if eps.is_empty() { f64::NAN } else { mean(&eps) },
            decisions_engine_knowledge: result.decisions_engine_knowledge as f64
                / result.decisions.max(1) as f64,
            adoptions: result.adoptions as f64 / result.decisions.max(1) as f64,
            hit_overcounted: result.hit_overcounted_tokens as f64
                / result.admitted_prompt_tokens.max(1) as f64,
            hit_undercounted: result.hit_undercounted_tokens as f64
                / result.admitted_prompt_tokens.max(1) as f64,
            decisions_consulting_real: result.decisions_consulting_real as f64
                / result.decisions.max(1) as f64,
            decisions_real_changed: result.decisions_real_changed as f64
                / result.decisions.max(1) as f64,
            real_state_age_p50_ms: quantile(&ages, 0.5),
            real_state_age_p99_ms: quantile(&ages, 0.99),
            steps: result.steps,
            rate_scale: 1.0,
            wall_s: 0.0,
            simulated_s: span,
        }
    }
}

/// Sorted TTFTs in seconds (for CDF plots).
pub fn ttft_seconds(result: &RunResult) -> Vec<f64> {
    sorted(
        result
            .requests
            .iter()
            .filter(|r| !r.rejected)
            .map(|r| (r.first_token_ns - r.arrival_ns) as f64 / 1e9)
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::quantile;

    #[test]
    fn nearest_rank_quantiles() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 5.0);
        assert_eq!(quantile(&v, 0.9), 9.0);
        assert_eq!(quantile(&v, 0.99), 10.0);
        assert!(quantile(&[], 0.5).is_nan());
    }
}

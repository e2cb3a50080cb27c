//! Which trace to load, and a sweep: the cross product of policies,
//! real-state uses, feeds, cache knowledge, router replicas, shared
//! reservations and rates, read from TOML.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Instant;

use engine_state_router::{CacheKnowledge, Policy, RealStateUse, RouterSettings};
use serde::Deserialize;

use crate::agentic::AgenticSpec;
use crate::driver::{simulate, RunConfig, Split};
use crate::error::SimError;
use crate::feed::FeedSpec;
use crate::metrics::{ttft_seconds, Summary};
use crate::profile::EngineProfile;
use crate::trace::Trace;

/// Trace file formats and the generator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum TraceFormat {
    /// Mooncake JSONL.
    #[default]
    Mooncake,
    /// Azure LLM inference CSV.
    Azure,
    /// The built-in agentic generator.
    Agentic,
}

/// Which trace, and its transforms (`--limit`, `--sessions-max-turns`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TraceSpec {
    /// File format, or the generator.
    pub format: TraceFormat,
    /// The file (Mooncake, Azure).
    pub path: Option<PathBuf>,
    /// Skip and count malformed lines instead of failing.
    pub skip_bad: bool,
    /// Keep each session's first N turns.
    pub sessions_max_turns: Option<usize>,
    /// Keep the first N requests.
    pub limit: Option<usize>,
    /// Generator parameters (format = agentic).
    pub agentic: AgenticSpec,
}

impl TraceSpec {
    /// Load (or generate) the trace, then apply the transforms and `rate_scale`.
    pub fn load(&self, rate_scale: f64) -> Result<Trace, SimError> {
        let path = || {
            self.path.as_deref().ok_or_else(|| {
                SimError::Config(format!("trace format {:?} needs a path", self.format))
            })
        };
        let mut trace = match self.format {
            TraceFormat::Mooncake => Trace::mooncake(path()?, self.skip_bad)?,
            TraceFormat::Azure => Trace::azure(path()?, self.skip_bad)?,
            TraceFormat::Agentic => self.agentic.generate(),
        };
        if let Some(turns) = self.sessions_max_turns {
            trace.sessions_max_turns(turns);
        }
        if let Some(limit) = self.limit {
            trace.limit(limit);
        }
        trace.rate_scale(rate_scale)?;
        Ok(trace)
    }
}

/// A sweep file.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Sweep {
    /// The trace.
    pub trace: TraceSpec,
    /// Engines.
    pub engines: usize,
    /// Arrival-rate factors.
    pub rate_scales: Vec<f64>,
    /// Router replica counts.
    pub routers: Vec<usize>,
    /// How arrivals are split between replicas.
    pub split: Split,
    /// Ask the migration trigger at every arrival.
    pub migration: bool,
    /// Router settings per policy (their `real_state_use` is overridden
    /// unless `real_state_uses` is empty).
    pub policies: Vec<RouterSettings>,
    /// Real-state uses; `never` runs once without a feed. Empty: each
    /// policy's own `real_state_use` (list a policy twice for two uses).
    pub real_state_uses: Vec<RealStateUse>,
    /// Feeds for the other uses (`periodic:50`, `scraped:30000`, …).
    pub feeds: Vec<String>,
    /// Cache knowledge (`estimated`, `engine`; overrides the policies'
    /// own). Runs whose routers read no digest (no periodic feed, or
    /// `never`) run once, as `estimated`.
    pub cache_knowledge: Vec<CacheKnowledge>,
    /// The engine profile.
    pub profile: EngineProfile,
    /// Share of completions the routers learn of late (see [`RunConfig`]).
    pub late_completion_fraction: f64,
    /// How late, seconds.
    pub late_completion_s: f64,
    /// Whether replicas share their reservations, and how late they see
    /// each other's: `"off"` or a delay in ms (`"0"`: shared memory; `"1"`,
    /// `"10"`, `"50"`: Redis-like paths). One router has no peers: it runs
    /// once, without.
    pub share_reservations: Vec<String>,
}

/// A `share_reservations` entry: `None` for `"off"`, else the delay in ns.
fn parse_share(text: &str) -> Result<Option<u64>, SimError> {
    if text == "off" {
        return Ok(None);
    }
    match text.parse::<f64>() {
        Ok(ms) if ms >= 0.0 && ms.is_finite() => Ok(Some((ms * 1e6).round() as u64)),
        _ => Err(SimError::Config(format!(
            "sweep file: share_reservations entry {text:?}: expected \"off\" or a delay in ms \
             (\"0\" for shared memory, \"10\", …)"
        ))),
    }
}

impl Default for Sweep {
    /// The issue-12 sweep on 8 engines: every policy (unified also at
    /// 1.3/0.01) × never/placement/always × feed periods 10 ms–30 s and the
    /// scraped-metrics baseline, 1 and 4 replicas.
    fn default() -> Self {
        let policy = |policy| RouterSettings {
            policy,
            ..RouterSettings::default()
        };
        Sweep {
            trace: TraceSpec::default(),
            engines: 8,
            rate_scales: vec![1.0],
            routers: vec![1, 4],
            split: Split::RoundRobin,
            migration: true,
            policies: vec![
                policy(Policy::LoadOnly),
                policy(Policy::LMetric),
                policy(Policy::Sticky),
                policy(Policy::Unified),
                RouterSettings {
                    overload_factor: 1.3,
                    decode_weight: 0.01,
                    ..policy(Policy::Unified)
                },
            ],
            real_state_uses: vec![
                RealStateUse::Never,
                RealStateUse::Placement,
                RealStateUse::Always,
            ],
            feeds: [
                "periodic:10",
                "periodic:50",
                "periodic:250",
                "periodic:1000",
                "periodic:5000",
                "periodic:30000",
                "scraped:30000",
            ]
            .map(String::from)
            .to_vec(),
            cache_knowledge: vec![CacheKnowledge::default()],
            profile: EngineProfile::default(),
            late_completion_fraction: 0.0,
            late_completion_s: 0.0,
            share_reservations: vec!["off".to_owned()],
        }
    }
}

/// One configuration of a sweep, at one rate.
#[derive(Clone, Debug)]
pub struct SweepRun {
    /// Arrival-rate factor.
    pub rate_scale: f64,
    /// The configuration.
    pub config: RunConfig,
}

impl Sweep {
    /// Parse a sweep file's text.
    pub fn from_toml(text: &str) -> Result<Sweep, SimError> {
        toml::from_str(text).map_err(|e| SimError::Config(format!("sweep file: {e}")))
    }

    /// Every configuration, rate-major (each rate's trace is loaded once).
    pub fn runs(&self) -> Result<Vec<SweepRun>, SimError> {
        let feeds = self
            .feeds
            .iter()
            .map(|f| f.parse::<FeedSpec>())
            .collect::<Result<Vec<_>, _>>()?;
        if self.cache_knowledge.is_empty() {
            return Err(SimError::Config(
                "sweep file: cache_knowledge is empty: list at least one of \"estimated\", \"engine\""
                    .to_owned(),
            ));
        }
        let shares = self
            .share_reservations
            .iter()
            .map(|s| parse_share(s))
            .collect::<Result<Vec<_>, _>>()?;
        if shares.is_empty() {
            return Err(SimError::Config(
                "sweep file: share_reservations is empty: list at least \"off\"".to_owned(),
            ));
        }
        let mut runs = Vec::new();
        for &rate_scale in &self.rate_scales {
            for &routers in &self.routers {
                // One router has no peer to share with: once, without.
                let run_shares = match routers {
                    1 => vec![None],
                    _ => shares.clone(),
                };
                for settings in &self.policies {
                    let uses = match self.real_state_uses.is_empty() {
                        true => vec![settings.real_state_use],
                        false => self.real_state_uses.clone(),
                    };
                    for real_state_use in uses {
                        // (feed, cache knowledge) pairs: digests come with a
                        // periodic feed (as the hook publishes them) and are
                        // read whatever `real_state_use` says; under `never` a
                        // feed only carries digests, so it runs only with them.
                        let mut combos: Vec<(FeedSpec, CacheKnowledge)> = Vec::new();
                        match real_state_use {
                            RealStateUse::Never => {
                                combos.push((FeedSpec::None, CacheKnowledge::Estimated));
                                if self.cache_knowledge.contains(&CacheKnowledge::Engine) {
                                    combos.extend(
                                        feeds
                                            .iter()
                                            .filter(|f| matches!(f, FeedSpec::Periodic { .. }))
                                            .map(|&f| (f, CacheKnowledge::Engine)),
                                    );
                                }
                            }
                            _ => {
                                for &feed in &feeds {
                                    match feed {
                                        FeedSpec::Periodic { .. } => combos.extend(
                                            self.cache_knowledge.iter().map(|&k| (feed, k)),
                                        ),
                                        _ => combos.push((feed, CacheKnowledge::Estimated)),
                                    }
                                }
                            }
                        }
                        for (feed, knowledge) in combos {
                            let knowledge = vec![knowledge];
                            for (cache_knowledge, &share_delay_ns) in knowledge
                                .into_iter()
                                .flat_map(|k| run_shares.iter().map(move |s| (k, s)))
                            {
                                let router = RouterSettings {
                                    real_state_use,
                                    cache_knowledge,
                                    ..settings.clone()
                                };
                                router.validate()?;
                                runs.push(SweepRun {
                                    rate_scale,
                                    config: RunConfig {
                                        label: String::new(),
                                        engines: self.engines,
                                        profile: self.profile.clone(),
                                        router,
                                        feed,
                                        routers,
                                        split: self.split,
                                        migration: self.migration,
                                        decision_log: None,
                                        late_completion_fraction: self.late_completion_fraction,
                                        late_completion_ns: (self.late_completion_s * 1e9) as u64,
                                        share_delay_ns,
                                    },
                                });
                            }
                        }
                    }
                }
            }
        }
        Ok(runs)
    }
}

/// One finished configuration.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Its report row.
    pub summary: Summary,
    /// Sorted TTFTs, seconds (for CDF plots).
    pub ttft_s: Vec<f64>,
    /// Requests per engine over time (see [`crate::RunResult::engine_load`]).
    pub engine_load: Vec<(u64, Vec<u32>)>,
}

/// Simulate one configuration over a trace loaded at `rate_scale`, timed.
pub fn run_one(trace: &Trace, config: &RunConfig, rate_scale: f64) -> Result<Outcome, SimError> {
    let started = Instant::now();
    let result = simulate(trace, config)?;
    let wall_s = started.elapsed().as_secs_f64();
    let mut summary = Summary::of(config, &result);
    summary.rate_scale = rate_scale;
    summary.wall_s = wall_s;
    if rate_scale != 1.0 {
        summary.config = format!("{}@{rate_scale}x", summary.config);
    }
    Ok(Outcome {
        summary,
        ttft_s: ttft_seconds(&result),
        engine_load: result.engine_load,
    })
}

impl Sweep {
    /// Run every configuration on `jobs` threads, calling `done` (on this
    /// thread) as each finishes; results come back in configuration order.
    /// Each rate's trace is loaded once.
    pub fn execute(
        &self,
        jobs: usize,
        done: impl FnMut(&Outcome),
    ) -> Result<Vec<Outcome>, SimError> {
        self.execute_first(usize::MAX, jobs, done)
    }

    /// The same for the first `count` configurations only.
    pub fn execute_first(
        &self,
        count: usize,
        jobs: usize,
        mut done: impl FnMut(&Outcome),
    ) -> Result<Vec<Outcome>, SimError> {
        let runs: Vec<SweepRun> = self.runs()?.into_iter().take(count).collect();
        let mut traces: Vec<(f64, Trace)> = Vec::new();
        for run in &runs {
            if !traces.iter().any(|(rate, _)| *rate == run.rate_scale) {
                traces.push((run.rate_scale, self.trace.load(run.rate_scale)?));
            }
        }
        let next = AtomicUsize::new(0);
        let (sender, receiver) = mpsc::channel::<(usize, Result<Outcome, SimError>)>();
        let mut slots: Vec<Option<Outcome>> = (0..runs.len()).map(|_| None).collect();
        std::thread::scope(|scope| -> Result<(), SimError> {
            for _ in 0..jobs.clamp(1, runs.len().max(1)) {
                let sender = sender.clone();
                let (runs, traces, next) = (&runs, &traces, &next);
                scope.spawn(move || loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    let Some(run) = runs.get(index) else {
                        break;
                    };
                    let (_, trace) = traces
                        .iter()
                        .find(|(rate, _)| *rate == run.rate_scale)
                        .expect("loaded above");
                    let outcome = run_one(trace, &run.config, run.rate_scale);
                    if sender.send((index, outcome)).is_err() {
                        break;
                    }
                });
            }
            drop(sender);
            for (index, outcome) in receiver {
                let outcome = outcome?;
                done(&outcome);
                slots[index] = Some(outcome);
            }
            Ok(())
        })?;
        Ok(slots
            .into_iter()
            .map(|o| o.expect("every run reported"))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sweep_file_expands_to_its_cross_product() {
        let sweep = Sweep::from_toml(
            r#"
            routers = [1, 4]
            real_state_uses = ["never", "always"]
            feeds = ["periodic:50", "scraped:30000"]
            [trace]
            format = "agentic"
            [[policies]]
            policy = "sticky"
            [[policies]]
            policy = "unified"
            overload_factor = 1.3
            "#,
        )
        .unwrap();
        let runs = sweep.runs().unwrap();
        // 2 replicas × 2 policies × (never without a feed, never with the
        // periodic feed's digests (cache knowledge `engine`, the default),
        // and 2 feeds).
        assert_eq!(runs.len(), 16);
        assert_eq!(runs[0].config.name(), "sticky/never/none/r1");
        assert_eq!(runs[1].config.name(), "sticky/never/periodic:50/engine/r1");
        assert_eq!(
            runs[7].config.name(),
            "unified(1.3,0)/always/scraped:30000/r1"
        );
        let sweep = Sweep::from_toml(
            r#"
            routers = [1]
            real_state_uses = ["never", "placement"]
            feeds = ["periodic:50", "scraped:30000"]
            cache_knowledge = ["estimated", "engine"]
            [[policies]]
            policy = "unified"
            "#,
        )
        .unwrap();
        let names: Vec<String> = sweep
            .runs()
            .unwrap()
            .iter()
            .map(|run| run.config.name())
            .collect();
        // Digests are read only with a periodic feed: the rest run once;
        // under `never` a feed runs only to carry digests.
        assert_eq!(
            names,
            [
                "unified/never/none/r1",
                "unified/never/periodic:50/engine/r1",
                "unified/placement/periodic:50/estimated/r1",
                "unified/placement/periodic:50/engine/r1",
                "unified/placement/scraped:30000/r1",
            ]
        );
        let empty = Sweep::from_toml("cache_knowledge = []").unwrap().runs();
        assert!(empty.unwrap_err().to_string().contains("cache_knowledge"));
        assert!(Sweep::from_toml("engine = 8")
            .unwrap_err()
            .to_string()
            .contains("engine"));
        assert!(Sweep::default().runs().unwrap().len() >= 36);
    }

    #[test]
    fn shared_reservations_multiply_the_replica_runs_only() {
        let sweep = Sweep::from_toml(
            r#"
            routers = [1, 4]
            real_state_uses = []
            feeds = ["periodic:50"]
            cache_knowledge = ["engine"]
            share_reservations = ["off", "0", "10"]
            [[policies]]
            policy = "unified"
            real_state_use = "placement"
            [[policies]]
            policy = "lmetric"
            real_state_use = "never"
            "#,
        )
        .unwrap();
        let names: Vec<String> = sweep
            .runs()
            .unwrap()
            .iter()
            .map(|run| run.config.name())
            .collect();
        // Each policy with its own use; 1 router once, without sharing.
        assert_eq!(
            names,
            [
                "unified/placement/periodic:50/engine/r1",
                "lmetric/never/none/r1",
                "lmetric/never/periodic:50/engine/r1",
                "unified/placement/periodic:50/engine/r4",
                "unified/placement/periodic:50/engine/r4/share:0",
                "unified/placement/periodic:50/engine/r4/share:10",
                "lmetric/never/none/r4",
                "lmetric/never/none/r4/share:0",
                "lmetric/never/none/r4/share:10",
                "lmetric/never/periodic:50/engine/r4",
                "lmetric/never/periodic:50/engine/r4/share:0",
                "lmetric/never/periodic:50/engine/r4/share:10",
            ]
        );
        let runs = sweep.runs().unwrap();
        assert_eq!(runs[5].config.share_delay_ns, Some(10_000_000));
        assert_eq!(runs[0].config.share_delay_ns, None);
        for bad in ["[\"fast\"]", "[\"-1\"]", "[]"] {
            let err = Sweep::from_toml(&format!("share_reservations = {bad}"))
                .unwrap()
                .runs()
                .unwrap_err()
                .to_string();
            assert!(err.contains("share_reservations"), "{err}");
        }
    }
}

//! `essim`: replay a request trace through modelled vLLM 0.33 engines and the
//! project's own router, to measure what the engine-state feed is worth —
//! per policy, real-state use, feed period and number of router replicas.
//!
//! - [`Engine`]: one engine with V1 scheduler semantics (continuous batching,
//!   FCFS, token budget, chunked prefill, 16-token KV blocks with prefix
//!   caching, preemption by recompute); pure — [`Engine::schedule`] returns a
//!   [`ScheduledStep`] with its modelled duration, [`Engine::finish_step`]
//!   applies it, [`Engine::snapshot`] is the snapshot the hook would capture
//!   (docs/VLLM.md, "What each field means and how the hook computes it"),
//!   [`Engine::cache_digest`] the cache digest it would publish.
//! - [`EngineProfile`]: scheduler limits and the step-time formula; the
//!   default is calibrated to Qwen3-Coder-30B-A3B on one H20.
//! - [`FeedSpec`]: how snapshots reach routers (`none`, `periodic`, `scraped`).
//! - [`Trace`] (Mooncake JSONL, Azure CSV) and [`AgenticSpec`] (a seeded
//!   synthetic agentic workload).
//! - [`simulate`]: the discrete-event driver over a [`RunConfig`]; every
//!   placement is made by `engine_state_router::Router` on simulated time.
//! - [`Summary`], [`markdown`], [`write_report`], [`plots`], [`Sweep`]: reports.
//!
//! - [`serve`]: `essim serve`, a fake vLLM fleet in real time over HTTP.
//! - [`replay`]: `essim replay`, a trace sent to such URLs in real time,
//!   latencies measured by the client.
//!
//! Layout: `profile`, `kv`, `residency` and `engine` (the engine model), `feed`, `trace`
//! and `agentic` (inputs), `driver` (the event loop), `share` (replicas
//! sharing their reservations through the router's API), `metrics`, `output`,
//! `plots` and `sweep` (reports).
//!
//! ```
//! use engine_state_sim::{simulate, AgenticSpec, FeedSpec, RunConfig, Summary};
//!
//! let trace = AgenticSpec { sessions: 5, ..AgenticSpec::default() }.generate();
//! let config = RunConfig { engines: 2, feed: "periodic:50".parse()?, ..RunConfig::default() };
//! let result = simulate(&trace, &config)?;
//! let summary = Summary::of(&config, &result);
//! assert_eq!(summary.requests, trace.requests.len());
//! assert!(summary.ttft_p50_s > 0.0);
//! assert_eq!(result.leaked_shadows, 0);
//! # Ok::<(), engine_state_sim::SimError>(())
//! ```

mod agentic;
mod driver;
mod engine;
mod error;
mod feed;
mod kv;
mod metrics;
mod output;
pub mod plots;
mod profile;
pub mod replay;
mod residency;
pub mod serve;
mod share;
mod step_trace;
mod sweep;
mod trace;

pub use crate::agentic::AgenticSpec;
pub use crate::driver::{
    engines_per_session, policy_label, simulate, RequestRecord, RunConfig, RunResult, Split,
    LOAD_SAMPLE_NS,
};
pub use crate::engine::{
    Admission, Engine, EngineCounters, EngineRequest, ScheduledStep, StepOutput,
};
pub use crate::error::SimError;
pub use crate::feed::{FeedSpec, HEARTBEAT_PERIOD_NS};
pub use crate::metrics::{quantile, ttft_seconds, Summary};
pub use crate::output::{
    csv, markdown, read_csv, write_files, write_report, write_summary_plots, HEADLINE_FEED,
};
pub use crate::profile::{EngineProfile, KV_BLOCK_TOKENS};
pub use crate::share::{LogSink, ShareLog};
pub use crate::step_trace::{step_trace, ScenarioRequest, StepRecord, StepScenario};
pub use crate::sweep::{run_one, Outcome, Sweep, SweepRun, TraceFormat, TraceSpec};
pub use crate::trace::{Content, Trace, TraceRequest};

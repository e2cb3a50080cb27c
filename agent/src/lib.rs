//! The engine-state node agent (`esagent`): relays every engine that
//! publishes into a host's shared-memory directory to Redis, so engines need
//! no network client of their own, and serves Prometheus metrics about them;
//! without a Redis ([`AgentConfig::redis`] `None`, no `--redis`) it only
//! serves the metrics (metrics-only mode). Logs go through `tracing` (the
//! binary installs a subscriber on stderr, `RUST_LOG`, `info` by default).
//!
//! - [`Args`] → [`AgentConfig`]: flags and environment (README.md,
//!   "Configuration").
//! - [`Agent`] / [`run`]: binds `/metrics` and `/healthz`, then, on a relay
//!   thread, every poll interval (1 ms) probes each engine's sequence and
//!   heartbeat words through the reader crate's `ShmDir` and relays new
//!   snapshots and heartbeats at once, and every 500 ms reads the whole
//!   directory (restarts, removals, errors, gauges), writing through the
//!   engine-state-redis crate's `InlineSink` from that same thread (one
//!   pipeline per pass, its replies collected on the next pass; reconnects
//!   with its `Backoff`).
//!   Stops when its [`CancellationToken`] is cancelled, within
//!   [`SHUTDOWN_LIMIT`]. The HTTP side is capped (a quarter of the open-file
//!   limit in connections, idle clients dropped after 2 s, failed accepts
//!   backed off) so that it never takes the descriptors the relay needs;
//!   `/healthz` is 503 while the directory cannot be listed.
//! - [`Relay`]: the two passes ([`Relay::poll`], [`Relay::tick`]), usable on their own.
//! - [`Cleanup`]: optional removal of files whose writer is gone.
//!
//! Module layout: `config` (flags), `relay` (change detection → sink),
//! `telemetry` (metric names, recorder), `http` (the tiny responder),
//! `health` (what `/healthz` says), `cleanup`, `run` (the loop).
//!
//! ```no_run
//! use engine_state_agent::{run, Args};
//! use clap::Parser;
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let args = Args::parse_from(["esagent", "--uri", "file:///dev/shm/agentic_engine_state",
//!                              "--redis", "redis://127.0.0.1:6379/0"]);
//! let shutdown = CancellationToken::new();
//! run(args.into_config()?, shutdown.clone()).await?; // until shutdown.cancel()
//! # Ok(()) }
//! ```
//!
//! ```
//! // Flags become a configuration; cleanup of dead writers' files is off by default.
//! use engine_state_agent::Args;
//! use clap::Parser;
//! let config = Args::parse_from(["esagent", "--uri", "/tmp/engines", "--redis", "redis://h/0"])
//!     .into_config()?;
//! assert_eq!(config.cleanup_grace, None);
//! assert_eq!(config.period, std::time::Duration::from_millis(50));
//! // Without --redis: metrics only.
//! let metrics_only = Args::parse_from(["esagent", "--uri", "/tmp/engines"]).into_config()?;
//! assert!(metrics_only.redis.is_none());
//! # Ok::<(), engine_state_agent::Error>(())
//! ```

mod cleanup;
mod config;
mod error;
mod health;
mod http;
mod relay;
mod run;
mod telemetry;

pub use crate::cleanup::Cleanup;
pub use crate::config::{AgentConfig, Args, DEFAULT_LISTEN, DEFAULT_POLL_US};
pub use crate::error::Error;
pub use crate::relay::{Relay, TickReport};
pub use crate::run::{run, Agent, SHUTDOWN_LIMIT};
pub use crate::telemetry::{
    READ_ERRORS, REGISTRY_ERRORS, RELAYED, RELAY_ERRORS, RELAY_LAG, RELAY_REFUSED, SNAPSHOT_AGE,
};
pub use tokio_util::sync::CancellationToken;

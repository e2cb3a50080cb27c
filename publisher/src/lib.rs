//! Publishes one engine's scheduler state for engine-state readers.
//!
//! - [`PublisherConfig`]: where (URI), who (engine id), how often (period);
//!   explicit values win over `AGENTIC_ENGINE_STATE_URI`, `AGENTIC_WORKER_ID`,
//!   `AGENTIC_ENGINE_STATE_PERIOD_MS` (README.md, "Configuration").
//! - [`Publisher`]: the file's single writer plus a heartbeat thread. The
//!   Python `engine_state.Publisher` and the vLLM hook are thin layers over it.
//!   With a `redis://` URI it hands records to an
//!   `engine_state_redis::RedisSink` instead (the Redis writers, the key
//!   schema and the backoff are the `engine-state-redis` crate's).
//!
//! ```
//! use engine_state_publisher::{Publisher, PublisherConfig};
//! use engine_state_shm_format::Snapshot;
//!
//! let dir = tempfile::tempdir()?;
//! let uri = format!("file://{}", dir.path().display());
//! let config = PublisherConfig::resolve(Some(&uri), Some("engine-0"), Some(50), None)?;
//! let mut publisher = Publisher::start(config)?;
//! publisher.publish(Snapshot { num_running: 4, num_waiting: 2, ..Snapshot::default() })?;
//! assert!(dir.path().join("engine-0").exists());
//! publisher.close(); // retires and removes the file
//! assert!(!dir.path().join("engine-0").exists());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod cache;
mod config;
mod error;
mod heartbeat;
mod publisher;
mod recreate;
mod redis_backend;
mod replica;
mod shm_backend;
mod stamp;
mod validate;

pub use crate::config::{
    default_engine_id, PublisherConfig, DEFAULT_PERIOD, ENGINE_ID_ENV, FILE_MODE_ENV, PERIOD_ENV,
};
pub use crate::error::Error;
pub use crate::publisher::Publisher;
pub use crate::recreate::PublisherStats;
pub use crate::replica::{ReplicaOptions, ReplicaPublisher, ReplicaStats};
/// The counters of [`Publisher::redis_stats`].
pub use engine_state_redis::SinkStats;

#[cfg(test)]
mod publisher_cache_tests;
#[cfg(test)]
mod publisher_tests;

//! Lock-free readers of engine-state: every engine's latest scheduler
//! snapshot, how old it is, and whether it may be used.
//!
//! - [`Source`]: one API over every backend; [`open`] picks the backend a
//!   [`StateUri`] names. [`ShmDir`] reads a shared-memory directory,
//!   [`RedisSource`] a Redis server ([`RedisTarget`]: server, database, key
//!   prefix; [`RedisRecord`]: the key schema every Redis writer and reader uses;
//!   [`decode_fetched`], [`heartbeat_age_at_fetch`], [`record_state`]: one
//!   fetched record judged, for programs that fetch with their own client).
//! - [`EngineState`]: per engine, the [`Snapshot`], `heartbeat_age`,
//!   `capture_age`, `gpu_kv_used_frac()` and a [`Status`]
//!   (`fresh | stale | dead | torn`).
//! - [`Freshness`]: the staleness rule of DESIGN §6, the one place it lives.
//! - [`Reading`]: the engines of one read plus per-engine errors: a bad file
//!   never stops the others from being read.
//!
//! ```
//! use engine_state_reader::{open, ReaderOptions, StateUri, Status};
//! use engine_state_shm_format::{EngineId, ShmWriter, Snapshot, WriterOptions, monotonic_ns};
//!
//! let dir = tempfile::tempdir()?;
//! let first = Snapshot { captured_mono_ns: monotonic_ns(), num_running: 2, ..Snapshot::default() };
//! let _writer = ShmWriter::create(dir.path(), &EngineId::new("e0")?, &WriterOptions::default(), &first)?;
//!
//! let uri = StateUri::parse(&format!("file://{}", dir.path().display()))?;
//! let mut source = open(&uri, ReaderOptions::default())?;
//! let reading = source.read()?;
//! assert_eq!(reading.engines[0].snapshot.num_running, 2);
//! assert_eq!(reading.engines[0].status, Status::Fresh);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod error;
mod freshness;
mod redis_fetch;
mod redis_schema;
mod redis_source;
mod redis_target;
mod shm_dir;
mod source;
mod state;
mod uri;

pub use crate::error::{EngineError, Error, FormatError};
pub use crate::freshness::{
    Freshness, Observation, Status, DEFAULT_MAX_CAPTURE_AGE, DEFAULT_STALE_AFTER,
};
pub use crate::redis_fetch::{decode_fetched, heartbeat_age_at_fetch, record_state};
pub use crate::redis_schema::{
    engine_key, registry_key, RedisRecord, DELETE_IF_OWNER_SCRIPT, RECORD_HEADER_SIZE,
    RECORD_MAGIC, RECORD_SIZE, SET_IF_OWNER_SCRIPT, STATE_ACTIVE, STATE_RETIRED,
};
pub use crate::redis_source::{RedisSource, PRUNE_AFTER, RECONNECT_CAP, RECONNECT_FIRST};
pub use crate::redis_target::{
    RedisTarget, DEFAULT_PREFIX, DEFAULT_TTL, NETWORK_TIMEOUT, READ_TIMEOUT,
};
pub use crate::shm_dir::ShmDir;
pub use crate::source::{open, ReaderOptions, Source};
pub use crate::state::{millis, EngineState, Reading, JSON_KEYS};
pub use crate::uri::{is_secret_parameter, redact, StateUri, DEFAULT_URI, URI_ENV};
pub use engine_state_shm_format::{Snapshot, FLAG_IDLE, FLAG_SHUTTING_DOWN};

#[cfg(test)]
mod shm_dir_hostile_tests;
#[cfg(test)]
mod shm_dir_tests;

//! Lock-free readers of engine-state: every engine's latest scheduler
//! snapshot, how old it is, and whether it may be used.
//!
//! - [`Source`]: one API over every backend; [`open`] picks the backend a
//!   [`StateUri`] names. [`ShmDir`] reads a shared-memory directory,
//!   `RedisSource` a Redis server (with the default `redis` feature; the key
//!   schema, the target and the protocol are the `engine-state-redis`
//!   crate's, re-exported as [`redis`]); `state_at_fetch`: one fetch of a
//!   key judged, for programs that fetch with their own client.
//! - [`EngineState`]: per engine, the [`Snapshot`], `heartbeat_age`,
//!   `capture_age`, `gpu_kv_used_frac()`, a [`Status`]
//!   (`fresh | stale | dead | torn`) and the [`Writer`]'s stamps.
//! - [`judge`]: what a source observed of one engine ([`Observation`])
//!   becomes its [`EngineState`], for every source (shared memory, Redis,
//!   the simulator), by [`Freshness`]: the staleness rule (docs/FORMAT.md,
//!   "Liveness and staleness"), the one place it lives.
//! - [`Reading`]: the engines of one read plus per-engine errors: a bad file
//!   never stops the others from being read.
//! - Cache digests (docs/FORMAT.md, "Cache residency"): with
//!   [`ReaderOptions::cache_digests`] (off by default) every source fills
//!   [`EngineState::cache`] for an engine whose snapshot names a digest
//!   (`cache_version` ≠ 0): shared memory maps `<dir>.cache/<id>` at the
//!   first version it needs, Redis fetches `<prefix>cache:<id>`
//!   (docs/REDIS.md, "The cache digest key"); either reads a digest again
//!   only when the version moves, and hands out the same `Arc` until then.
//!   A damaged digest is that engine's [`Error::CorruptCache`] (class
//!   `corrupt_cache`, at every read); one that is not there for it (not
//!   written yet, of another run) its [`Error::MissingCache`] (class
//!   `missing_cache`, said once per version; [`Source::cache_fault`] asks
//!   again). The engine's state is read all the same, with `cache: None`.
//!
//! ```
//! use engine_state_reader::{ReaderOptions, ShmDir};
//! use engine_state_shm_format::{
//!     monotonic_ns, CacheDigest, DigestOptions, DigestWriter, EngineId, ShmWriter, Snapshot,
//!     WriterOptions,
//! };
//!
//! let tmp = tempfile::tempdir()?;
//! let dir = tmp.path().join("engines");
//! std::fs::create_dir(&dir)?;
//! let id = EngineId::new("e0")?;
//! // What a publisher's `publish_cache` and `publish` do: the digest first,
//! // then a snapshot that names its version.
//! let mut engine = ShmWriter::create(&dir, &id, &WriterOptions::default(), &Snapshot::default())?;
//! let options = DigestOptions { capacity: 16, generation: engine.generation(), ..DigestOptions::default() };
//! let _digest = DigestWriter::create(&dir, &id, &options, &CacheDigest::new(1, 0, vec![7, 3]), 2, 0)?;
//! engine.publish(&Snapshot { captured_mono_ns: monotonic_ns(), cache_blocks: 2, cache_version: 1, ..Snapshot::default() })?;
//!
//! let mut source = ShmDir::open(&dir, ReaderOptions::default().with_cache_digests(true))?;
//! let digest = source.read_engine("e0")?.unwrap().cache.expect("a digest");
//! assert_eq!(digest.blocks(), &[3, 7]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
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
mod judge;
mod liveness;
mod printable;
#[cfg(feature = "redis")]
mod redis_fetch;
#[cfg(feature = "redis")]
mod redis_source;
mod replicas;
mod shm_dir;
mod source;
mod state;
mod uri;

pub use crate::error::{EngineError, Error, FormatError};
pub use crate::freshness::{
    heartbeat_recent, max_ahead, Ages, ClockAhead, Freshness, Stamp, Status, CLOCK_AHEAD_SLACK,
    DEFAULT_MAX_CAPTURE_AGE, DEFAULT_STALE_AFTER,
};
pub use crate::judge::{judge, Clocks, Observation};
pub use crate::printable::printable;
#[cfg(feature = "redis")]
pub use crate::redis_fetch::{record_state, state_at_fetch};
#[cfg(feature = "redis")]
pub use crate::redis_source::RedisSource;
#[cfg(feature = "redis")]
pub use crate::replicas::RedisReplicaSource;
pub use crate::replicas::{
    open_replicas, ReplicaReading, ReplicaSource, ReplicaState, ShmReplicas,
};
pub use crate::shm_dir::ShmDir;
pub use crate::source::{open, ReaderOptions, Source};
pub use crate::state::{millis, EngineState, Reading, Writer, JSON_KEYS};
pub use crate::uri::{BadUri, StateUri, DEFAULT_URI, URI_ENV};
/// The Redis crate (schema, target, fetch helpers), for programs that read
/// Redis records with their own client.
#[cfg(feature = "redis")]
pub use engine_state_redis as redis;
#[cfg(feature = "redis")]
pub use engine_state_redis::{RedisTarget, READ_TIMEOUT};
pub use engine_state_shm_format::{Snapshot, FLAG_IDLE, FLAG_SHUTTING_DOWN};

#[cfg(test)]
mod shm_dir_cache_tests;
#[cfg(test)]
mod shm_dir_hostile_tests;
#[cfg(test)]
mod shm_dir_tests;

//! engine-state in Redis (docs/REDIS.md): everything that knows a
//! Redis command, key or record byte.
//!
//! - [`RedisTarget`]: the server, database, key prefix and timeouts a
//!   `redis://` URI names, and how to connect to it ([`redact`] hides its
//!   credentials in everything shown); [`StateUri`]: an engine-state URI
//!   whose Redis part is a `RedisTarget` (the parser is
//!   `engine-state-settings`'; the reader re-exports this type).
//! - [`RedisRecord`] / [`RecordHeader`]: the key schema ([`engine_key`],
//!   [`registry_key`], [`cache_key`] for an engine's cache digest) and the bytes of a value ([`RedisRecord::active`]
//!   makes every record a writer sends); the owner-check scripts, and
//!   [`claim`]: a publisher's first, owner-checked write.
//! - [`Backoff`]: the one reconnection backoff of every client here.
//! - [`RedisSink`]: a thread that owns a connection and writes the latest
//!   [`SinkOp`] of each engine, pipelined (callers hand ops over through a
//!   [`SinkHandle`]); [`InlineSink`]: the same writes driven by the caller's
//!   thread, in the caller's order per engine ([`RelayWrite`]: an op or a
//!   cache digest value). Both count in [`SinkStats`].
//! - [`RedisSource`]: reads every engine of a prefix in one round trip per
//!   read; the reader crate turns what it saw into engine states.
//! - Router replicas' reservations ([`router_key`], [`router_registry_key`]):
//!   [`RouterValue`] is a value's bytes, [`ReplicaSink`] a thread that writes
//!   one replica's value (owner-checked, batched), [`RedisReplicas`] reads
//!   every replica's in one round trip per read.

mod backoff;
mod claim;
mod encoder;
mod error;
mod fetch;
mod inline_sink;
mod log;
mod mailbox;
mod ops;
mod redact;
mod registry;
mod replica_sink;
mod replica_source;
mod replies;
mod router_value;
mod schema;
mod sink;
mod source;
mod stats;
mod target;

pub use crate::backoff::{Backoff, RECONNECT_CAP, RECONNECT_FIRST};
pub use crate::claim::{claim, Claim};
pub use crate::error::Error;
pub use crate::fetch::{
    decode_fetched, decode_fetched_cache, decode_fetched_router, heartbeat_age_at_fetch,
    router_heartbeat_age_at_fetch, CacheRefused, CACHE_FETCH_END,
};
pub use crate::inline_sink::InlineSink;
pub use crate::mailbox::SinkHandle;
pub use crate::ops::{AckLagObserver, RelayWrite, SinkOp};
pub use crate::redact::{is_secret_parameter, redact};
pub use crate::replica_sink::{ReplicaSink, ReplicaSinkOptions, DEFAULT_FLUSH_INTERVAL};
pub use crate::replica_source::{
    RedisReplicas, ReplicaReading, ReplicaValue, DEFAULT_RESCAN_INTERVAL,
};
pub use crate::replies::holder_pid;
pub use crate::router_value::{
    RouterValue, RouterValueHeader, DELETE_ROUTER_IF_OWNER_SCRIPT, MAX_ROUTER_VALUE_SIZE,
    ROUTER_VALUE_HEADER_SIZE, ROUTER_VALUE_MAGIC, SET_ROUTER_IF_OWNER_SCRIPT,
    SET_ROUTER_IF_OWNER_SCRIPT_SHA1,
};
pub use crate::schema::{
    cache_key, engine_key, registry_key, router_key, router_registry_key, RecordHeader,
    RecordWriter, RedisRecord, DELETE_CACHE_IF_OWNER_SCRIPT, DELETE_IF_OWNER_SCRIPT,
    RECORD_HEADER_SIZE, RECORD_MAGIC, RECORD_SIZE, SET_CACHE_IF_OWNER_SCRIPT, SET_IF_OWNER_SCRIPT,
    SET_IF_OWNER_SCRIPT_SHA1,
};
pub use crate::sink::RedisSink;
pub use crate::source::{CacheFault, EngineView, RedisSource, PRUNE_AFTER};
pub use crate::stats::SinkStats;
pub use crate::target::{
    is_permission_error, RedisTarget, StateUri, DEFAULT_PREFIX, DEFAULT_TTL, NETWORK_TIMEOUT,
    READ_TIMEOUT,
};
/// A record's `state` values are the shared-memory file's.
pub use engine_state_shm_format::layout::{STATE_ACTIVE, STATE_RETIRED};

use std::sync::{Mutex, MutexGuard};

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain data behind the lock: a panic elsewhere leaves it usable.
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

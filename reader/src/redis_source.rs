//! The Redis source: every engine of one key prefix, in one round trip per read
//! (docs/REDIS.md, "One round trip per read"). The protocol (registry,
//! pipelined reads, reconnection, pruning) is
//! `engine_state_redis::RedisSource`'s; this file turns what it saw into engine
//! states through the staleness rule.

use std::time::Instant;

use engine_state_redis::{CacheFault, EngineView, RedisTarget};
use engine_state_shm_format::monotonic_ns;

use crate::error::{EngineError, Error};
use crate::redis_fetch::record_state;
use crate::source::{ReaderOptions, Source};
use crate::state::{EngineState, Reading};

/// Every engine published under one key prefix of one Redis server.
///
/// A read is one pipeline: a bounded step of a scan of `<prefix>engines`
/// (`SSCAN … COUNT 1000`; a scan starts at most every
/// [`ReaderOptions::rescan_interval`]), then per engine whose key exists a
/// `GETRANGE key 0 192` and a `PTTL` (see `engine_state_redis::RedisSource`);
/// with [`ReaderOptions::cache_digests`], one more round trip fetches the
/// digests of the engines whose record names a `cache_version` past the one
/// held (`GETRANGE <prefix>cache:<id>`, size-bounded), none when no digest
/// moved.
/// A read as a whole — reconnecting, and every reply — takes at most
/// [`RedisTarget::timeout`] (`?timeout_ms=`, default
/// [`crate::READ_TIMEOUT`], 500 ms); after a failure, reads during the
/// reconnection backoff return at once.
///
/// Staleness uses no clock of another host: the time since a record was
/// written is `ttl_ms - PTTL` (the server's clock) plus the writer's own
/// write delay (the writer's clock); from then on this reader's clock counts,
/// and it only restarts when the record's heartbeat counter advances. A key
/// that expired on the server is a dead engine. When Redis is unreachable the
/// engines already known are still reported — their heartbeat ages grow, so
/// they turn stale — with the connection error in [`Reading::errors`].
#[derive(Debug)]
pub struct RedisSource {
    records: engine_state_redis::RedisSource,
    options: ReaderOptions,
}

impl RedisSource {
    /// Connects and reads the registry; connection and authentication
    /// failures are errors here (later they only make engines stale).
    pub fn open(target: RedisTarget, options: ReaderOptions) -> Result<RedisSource, Error> {
        let mut records = engine_state_redis::RedisSource::open(target, options.rescan_interval)?;
        // From the first read on (the open's fetch read the registry).
        records.read_cache_digests(options.cache_digests);
        Ok(RedisSource { records, options })
    }

    /// The server, database and prefix read.
    pub fn target(&self) -> &RedisTarget {
        self.records.target()
    }
}

/// The error of engine `id`'s digest fault: damaged (`corrupt_cache`) or
/// not there for its record (`missing_cache`).
fn cache_error(id: &str, fault: CacheFault<'_>) -> EngineError {
    let (engine_id, location, what) = (
        id.to_owned(),
        format!("Redis key {:?}", fault.key),
        fault.what.to_owned(),
    );
    let error = Error::cache_fault(fault.damaged, engine_id, location, what);
    EngineError::new(id, error)
}

/// The state of one engine the Redis source lists (None: nothing read yet).
fn state(
    engine: &EngineView<'_>,
    now: Instant,
    now_ns: u64,
    options: &ReaderOptions,
) -> Option<EngineState> {
    let (record, heartbeat_age) = match (engine.record, engine.heartbeat_at) {
        (Some(record), Some(heartbeat_at)) => (Some(record), now.duration_since(heartbeat_at)),
        _ if engine.expired => (None, options.freshness.stale_after),
        _ => return None,
    };
    Some(record_state(
        engine.id.clone(),
        record,
        heartbeat_age,
        engine.expired,
        &options.freshness,
        now_ns,
    ))
}

impl Source for RedisSource {
    fn read_into(&mut self, out: &mut Reading) -> Result<(), Error> {
        out.clear();
        self.records.refresh(Instant::now());
        // Ages as of after the refresh (which may have waited on the
        // network), stamped with the same moment: consumers age them from it.
        let now = Instant::now();
        let now_ns = monotonic_ns();
        for engine in self.records.engines() {
            if let Some(fault) = engine.fault {
                out.errors
                    .push(EngineError::new(engine.id.to_string(), fault.clone()));
            } else if let Some(mut state) = state(&engine, now, now_ns, &self.options) {
                if let Some(fault) = engine.cache_fault {
                    out.errors.push(cache_error(engine.id, fault));
                }
                state.cache = engine.cache.cloned();
                out.engines.push(state);
            }
        }
        if let Some(error) = self.records.invalid_members() {
            out.errors.push(EngineError::new(
                self.records.registry().to_owned(),
                error.clone(),
            ));
        }
        if let Some(error) = self.records.unkeyed_members() {
            out.errors
                .push(EngineError::new(self.records.registry().to_owned(), error));
        }
        if let Some(error) = self.records.connection_error() {
            out.errors.push(EngineError::new(
                self.records.target().to_string(),
                error.clone(),
            ));
        }
        Ok(())
    }

    fn uri(&self) -> String {
        self.records.target().to_string()
    }

    fn cache_fault(&self, state: &EngineState) -> Option<EngineError> {
        if state.cache.is_some() {
            return None;
        }
        let fault = self
            .records
            .cache_fault_of(&state.engine_id, state.snapshot.cache_version)?;
        Some(cache_error(&state.engine_id, fault))
    }
}

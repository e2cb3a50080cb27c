//! The publisher: one engine's snapshots to its backend (a shared-memory
//! file or Redis) plus its heartbeat thread. Each concept has its file:
//! `validate.rs` (what a snapshot must satisfy), `stamp.rs` (the capture
//! clocks, idle flag and cache words), `cache.rs` (what a cache digest must
//! satisfy, and whether it changed), `shm_backend.rs`, `redis_backend.rs`,
//! `heartbeat.rs` (the thread), `recreate.rs` (a lost file recreated).

use std::path::Path;

use engine_state_redis::StateUri;
use engine_state_shm_format::{fork_generation, Clock, Snapshot};

use crate::cache::CacheState;
use crate::config::PublisherConfig;
use crate::error::Error;
use crate::heartbeat::{HeartbeatThread, Ticks};
use crate::recreate::PublisherStats;
use crate::redis_backend::RedisBackend;
use crate::shm_backend::ShmBackend;
use crate::validate;

/// Publishes one engine's snapshots.
///
/// [`Publisher::publish`] is the hot path (called on vLLM's scheduler thread):
/// it stamps the capture clocks and the idle flag and does one seqlock write,
/// with no allocation, lock or system call beyond `clock_gettime` (vDSO).
/// A native heartbeat thread stamps `heartbeat_mono_ns` every period, so an
/// idle engine, or one inside a long forward pass, still shows as alive; it
/// never touches Python. Fork-safe: in a child process `publish` returns
/// [`Error::WrongProcess`] and dropping does nothing to the parent's file.
///
/// A file removed under a live publisher (with its directory or alone) is
/// noticed by the heartbeat thread within a few periods and recreated, in a
/// new generation, as soon as the directory exists again (the directory
/// itself is not recreated); the gap is logged once on stderr and counted
/// in [`Publisher::stats`]. `publish` never fails because of it.
///
/// With a `redis://` URI the same calls fill a one-slot mailbox instead, and a
/// sink thread writes the record to Redis (docs/REDIS.md, "Writing: the sink"):
/// `publish` never waits on the network, and an outage only means older records
/// are replaced by newer ones before they are sent.
#[derive(Debug)]
pub struct Publisher {
    config: PublisherConfig,
    backend: Option<Backend>,
    heartbeat: Option<HeartbeatThread>,
    /// Stamps snapshots and heartbeats (`CLOCK_MONOTONIC` unless a test
    /// passes one in: [`Publisher::start_with_clock`]).
    clock: Clock,
    fork_generation: u64,
    owner_pid: u32,
    /// The last cache digest published, whose words every later snapshot
    /// carries.
    cache: CacheState,
}

#[derive(Debug)]
enum Backend {
    Shm(ShmBackend),
    Redis(RedisBackend),
}

impl Publisher {
    /// Creates the engine's file (and its directory when missing), or for a
    /// `redis://` URI connects and starts the sink thread; then starts the
    /// heartbeat thread.
    ///
    /// A second live publisher of the same engine id is refused with
    /// [`Error::AlreadyPublished`], on either backend. Shared memory: the
    /// file's writer is alive (a dead writer's file is taken over). Redis:
    /// the engine's key holds another writer's unexpired record (one round
    /// trip, [`engine_state_redis::SET_IF_OWNER_SCRIPT`]); a restarted
    /// engine takes the id over once its predecessor's key expired
    /// (`ttl_ms`, 2 s by default, after its last write).
    ///
    /// Redis: a wrong password or missing permission is an error here; an
    /// unreachable server is not (the engine must not fail to start because
    /// telemetry is down): the sink keeps reconnecting with backoff, and
    /// its writes claim the key the same way.
    pub fn start(config: PublisherConfig) -> Result<Publisher, Error> {
        Publisher::start_with_clock(config, Clock::monotonic())
    }

    /// [`Publisher::start`] with the time read from `clock` (tests pass
    /// time in instead of sleeping; `Clock::monotonic()` is `start`'s).
    pub fn start_with_clock(config: PublisherConfig, clock: Clock) -> Result<Publisher, Error> {
        let ticks = Ticks::Every(config.period);
        Publisher::start_ticked(config, clock, ticks)
    }

    /// [`Publisher::start_with_clock`] with a heartbeat thread that beats only
    /// when [`Publisher::heartbeat_tick`] asks: with a `Clock::from_fn`, a
    /// test sets the time and ticks instead of sleeping for periods.
    #[cfg(test)]
    pub(crate) fn start_driven(config: PublisherConfig, clock: Clock) -> Result<Publisher, Error> {
        Publisher::start_ticked(config, clock, Ticks::Driven)
    }

    /// One heartbeat-thread period, done when this returns (a publisher from
    /// [`Publisher::start_driven`]): the stamp and, every few periods, the
    /// file check and recreation; for Redis the record re-sent.
    #[cfg(test)]
    pub(crate) fn heartbeat_tick(&self) {
        self.heartbeat.as_ref().expect("an open publisher").tick();
    }

    fn start_ticked(
        config: PublisherConfig,
        clock: Clock,
        ticks: Ticks,
    ) -> Result<Publisher, Error> {
        let (backend, heartbeat) = match &config.uri {
            StateUri::Shm { dir } => {
                let (shm, heartbeat) = ShmBackend::start(dir, &config, &clock, ticks)?;
                (Backend::Shm(shm), heartbeat)
            }
            StateUri::Redis { target } => {
                let (redis, heartbeat) = RedisBackend::start(target, &config, &clock, ticks)?;
                (Backend::Redis(redis), heartbeat)
            }
        };
        Ok(Publisher {
            config,
            backend: Some(backend),
            heartbeat: Some(heartbeat),
            clock,
            fork_generation: fork_generation(),
            owner_pid: std::process::id(),
            cache: CacheState::default(),
        })
    }

    /// Publishes `snapshot`: `captured_mono_ns`, `captured_unix_ns`, the idle
    /// flag, `cache_blocks` and `cache_version` (the last digest of
    /// [`Publisher::publish_cache`]; 0 before it) are set here, whatever the
    /// caller passed; the rest as given.
    ///
    /// Refused with [`Error::InvalidSnapshot`] (two comparisons): more free
    /// than total KV blocks (readers would clamp `gpu_kv_used_frac` to 0 and
    /// hide the bug), and flag bits the layout does not define.
    #[inline]
    pub fn publish(&mut self, snapshot: Snapshot) -> Result<(), Error> {
        if !validate::is_valid(&snapshot) {
            return Err(self.invalid(&snapshot));
        }
        match self.backend.as_mut() {
            None => Err(Error::Closed {
                engine_id: self.config.engine_id.to_string(),
            }),
            Some(Backend::Shm(shm)) => shm
                .publish(
                    snapshot,
                    &self.clock,
                    self.cache.words,
                    self.fork_generation,
                )
                .map_err(|_| self.wrong_process()),
            Some(Backend::Redis(redis)) => {
                if fork_generation() != self.fork_generation {
                    return Err(self.wrong_process());
                }
                redis.publish(snapshot, &self.clock, self.cache.words);
                Ok(())
            }
        }
    }

    /// The engine's KV block size in tokens, written into the header of
    /// every digest from the next [`Publisher::publish_cache`] on (a change
    /// writes the digest again even for an unchanged set). 0, the default:
    /// not given.
    pub fn set_cache_kv_block_size(&mut self, tokens: u32) {
        self.cache.kv_block_size = tokens;
    }

    /// Publishes the engine's cache digest (docs/FORMAT.md, "Cache
    /// residency"): `blocks`, the router block hashes
    /// (`engine_state_shm_format::blocks`) it holds in full, in any order
    /// (duplicates count once), prefix-closed; `held`, how many it held
    /// (more than `blocks` when the list was cut to `capacity`); `capacity`,
    /// the entries its digest holds (`default_cache_capacity`).
    ///
    /// Writes a new digest version and returns true when the set differs
    /// from the last one published (or the digest must be rewritten: a new
    /// capacity, or a file recreated in a new generation); returns false
    /// and writes nothing otherwise, so calling it at every capture costs a
    /// sort and a compare. Every later [`Publisher::publish`] names the
    /// digest in its `cache_blocks` and `cache_version` words; the digest is
    /// in place before any snapshot names it. Shared memory: a file in
    /// `<dir>.cache` (created at the first call, replaced when `capacity`
    /// changes). Redis: the key `<prefix>cache:<id>`, handed to the sink
    /// like a record (never waits on the network).
    ///
    /// Refused with [`Error::InvalidCache`]: more distinct blocks than
    /// `capacity`, `capacity` above `MAX_DIGEST_ENTRIES`, `held` below the
    /// blocks listed. An engine that cannot publish residency simply never
    /// calls this (its `cache_version` stays 0).
    pub fn publish_cache(
        &mut self,
        blocks: &[u64],
        held: u64,
        capacity: usize,
    ) -> Result<bool, Error> {
        if self.backend.is_some() && fork_generation() != self.fork_generation {
            return Err(self.wrong_process());
        }
        let current = match self.backend.as_mut() {
            None => {
                return Err(Error::Closed {
                    engine_id: self.config.engine_id.to_string(),
                })
            }
            Some(Backend::Shm(shm)) => shm.digest_current(capacity, self.cache.kv_block_size),
            Some(Backend::Redis(_)) => true,
        };
        let digest = match self.cache.prepare(blocks, held, capacity, current) {
            Ok(Some(digest)) => digest,
            Ok(None) => return Ok(false),
            Err(what) => {
                return Err(Error::InvalidCache {
                    engine_id: self.config.engine_id.to_string(),
                    what,
                })
            }
        };
        match self.backend.as_mut().expect("checked above") {
            Backend::Shm(shm) => shm.publish_cache(&digest, current, &self.clock, &self.config)?,
            Backend::Redis(redis) => redis.publish_cache(&digest, &self.clock),
        }
        self.cache.published();
        Ok(true)
    }

    #[cold]
    fn invalid(&self, snapshot: &Snapshot) -> Error {
        Error::InvalidSnapshot {
            engine_id: self.config.engine_id.to_string(),
            what: validate::what_is_wrong(snapshot),
        }
    }

    #[cold]
    fn wrong_process(&self) -> Error {
        Error::WrongProcess {
            engine_id: self.config.engine_id.to_string(),
            owner_pid: self.owner_pid,
        }
    }

    /// Stops the heartbeat, retires the file and removes it. Idempotent; in a
    /// forked child it only forgets the parent's resources.
    pub fn close(&mut self) {
        if fork_generation() != self.fork_generation {
            // The heartbeat thread does not exist in a child; joining it would
            // hang, and the file is the parent's.
            if let Some(heartbeat) = self.heartbeat.take() {
                std::mem::forget(heartbeat);
            }
            match self.backend.take() {
                Some(Backend::Shm(shm)) => std::mem::forget(shm),
                Some(Backend::Redis(redis)) => redis.forget(),
                None => {}
            }
            return;
        }
        if let Some(heartbeat) = self.heartbeat.take() {
            heartbeat.stop();
        }
        match self.backend.take() {
            Some(Backend::Shm(shm)) => shm.close(),
            Some(Backend::Redis(redis)) => redis.close(),
            None => {}
        }
    }

    /// False once closed.
    pub fn is_open(&self) -> bool {
        self.backend.is_some()
    }

    /// Counters of the Redis sink (None for shared memory or once closed).
    pub fn redis_stats(&self) -> Option<&engine_state_redis::SinkStats> {
        match &self.backend {
            Some(Backend::Redis(redis)) => Some(redis.stats()),
            _ => None,
        }
    }

    /// Counters: files lost and recreated (shared memory; zero for Redis).
    pub fn stats(&self) -> PublisherStats {
        match &self.backend {
            Some(Backend::Shm(shm)) => shm.stats(),
            _ => PublisherStats::default(),
        }
    }

    /// The engine id.
    pub fn engine_id(&self) -> &str {
        self.config.engine_id.as_str()
    }

    /// The settings in use.
    pub fn config(&self) -> &PublisherConfig {
        &self.config
    }

    /// The file being published (None once closed, and for Redis).
    pub fn path(&self) -> Option<&Path> {
        match &self.backend {
            Some(Backend::Shm(shm)) => Some(shm.path()),
            _ => None,
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.close();
    }
}

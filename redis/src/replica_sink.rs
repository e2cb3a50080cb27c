//! A router replica's reservations, written to Redis by a thread of their
//! own (docs/REDIS.md, "Router replicas' reservations").
//!
//! The router calls [`ReplicaSink::set`] and [`ReplicaSink::remove`] under
//! its lock, after every change of its own reservations on an engine: they
//! store the counters in a small map behind a mutex, mark it dirty and wake
//! the thread only when it was clean (at most one wake-up per write), so the
//! caller never waits on the network. The thread writes the whole map as one
//! value (every engine's counters in one `EVAL`), owner-checked
//! ([`SET_ROUTER_IF_OWNER_SCRIPT`]): on change, at most every
//! `flush_interval` (5 ms), and every `heartbeat_period` (50 ms) otherwise,
//! each with `PX ttl_ms` (the target's, 2 s by default: a killed router's
//! key expires then). A lost connection is retried with the crate's
//! [`Backoff`], the counters kept (only the latest matter). [`ReplicaSink::close`]
//! deletes the key and the registration, unless another writer holds it.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use engine_state_shm_format::heartbeat::DEFAULT_PUBLISH_PERIOD;
use engine_state_shm_format::layout::STATE_ACTIVE;
use engine_state_shm_format::{monotonic_ns, unix_ns, EngineId, Reservations, MAX_ROUTER_ENGINES};
use redis::Value;

use crate::backoff::Backoff;
use crate::error::Error;
use crate::lock;
use crate::replies::holder_pid;
use crate::router_value::{
    RouterValue, DELETE_ROUTER_IF_OWNER_SCRIPT, ROUTER_VALUE_HEADER_SIZE,
    SET_ROUTER_IF_OWNER_SCRIPT, SET_ROUTER_IF_OWNER_SCRIPT_SHA1,
};
use crate::schema::{router_key, router_registry_key};
use crate::stats::SinkStats;
use crate::target::RedisTarget;

/// How long a change may wait for the next write at most, and the shortest
/// time between two writes: changes within it share one write.
pub const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_millis(5);

/// How a [`ReplicaSink`] writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaSinkOptions {
    /// Shortest time between two writes ([`DEFAULT_FLUSH_INTERVAL`]): a
    /// change is written at most this long after it happened (plus a round
    /// trip), and changes within it share one write.
    pub flush_interval: Duration,
    /// The value is written again after this long without a change (the
    /// heartbeat; default shm-format's `DEFAULT_PUBLISH_PERIOD`, 50 ms).
    pub heartbeat_period: Duration,
    /// The writer's pid, as its value names it (default this process's).
    pub writer_pid: u32,
    /// Differs between two runs of the replica id (default the start's
    /// `CLOCK_REALTIME` in ns); with `writer_pid`, what the owner check
    /// compares.
    pub generation: u64,
}

impl Default for ReplicaSinkOptions {
    fn default() -> Self {
        ReplicaSinkOptions {
            flush_interval: DEFAULT_FLUSH_INTERVAL,
            heartbeat_period: DEFAULT_PUBLISH_PERIOD,
            writer_pid: std::process::id(),
            generation: unix_ns(),
        }
    }
}

/// One router replica's reservations in Redis, written by a thread (see
/// the module docs). Dropping it closes it ([`ReplicaSink::close`]).
pub struct ReplicaSink {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    replica_id: EngineId,
}

impl std::fmt::Debug for ReplicaSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaSink")
            .field("replica_id", &self.replica_id)
            .field("stats", &self.shared.stats)
            .finish_non_exhaustive()
    }
}

/// What the callers and the thread share.
struct Shared {
    pending: Mutex<Pending>,
    /// The thread waits here for a change, its next write or close.
    wake: Condvar,
    /// [`ReplicaSink::flush`] waits here for a write to end.
    written: Condvar,
    stats: SinkStats,
}

/// The replica's counters as the router last set them.
#[derive(Default)]
struct Pending {
    /// Per engine its counters, in slot order.
    slots: Vec<(EngineId, Reservations)>,
    /// Engine id → index in `slots`.
    index: HashMap<String, usize, foldhash::fast::RandomState>,
    /// Changed since the thread last took `slots`.
    dirty: bool,
    /// The thread sleeps on `wake` (only then is a notify worth it).
    waiting: bool,
    /// The thread is writing what it took.
    busy: bool,
    closing: bool,
}

impl ReplicaSink {
    /// Starts replica `replica_id`'s sink on `target`. Connects and claims
    /// the replica's key with a first value (no engines) in one owner-checked
    /// write: another live writer's key is [`Error::ReplicaInUse`], and so
    /// are bad credentials or missing permissions an error; an unreachable
    /// server is not (a router must not fail to start because Redis is down:
    /// the thread connects, with backoff, and its first write claims the key).
    pub fn start(
        target: RedisTarget,
        replica_id: &EngineId,
        options: ReplicaSinkOptions,
    ) -> Result<ReplicaSink, Error> {
        let mut writer = Writer::new(target, replica_id, options);
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending::default()),
            wake: Condvar::new(),
            written: Condvar::new(),
            stats: SinkStats::default(),
        });
        match writer.target.connect() {
            Ok(con) => {
                writer.con = Some(con);
                match writer.write(&shared.stats) {
                    Ok(Written::Yes) => {
                        writer.settle(&Written::Yes, &shared.stats);
                        writer.last_write = Some(Instant::now());
                    }
                    Ok(Written::Refused(holder_pid)) => {
                        return Err(Error::ReplicaInUse {
                            replica_id: replica_id.to_string(),
                            key: writer.key.clone(),
                            holder_pid,
                        })
                    }
                    Err(e) if e.is_auth_error() => return Err(e),
                    Err(e) => writer.failed(&shared.stats, &e),
                }
            }
            Err(e) if e.is_auth_error() => return Err(e),
            Err(e) => writer.failed(&shared.stats, &e),
        }
        let uri = writer.target.to_string();
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("es-rep-{replica_id}").chars().take(15).collect())
            .spawn(move || writer.run(&thread_shared))
            .map_err(|e| Error::Redis {
                uri,
                error: format!("cannot start the replica sink thread: {e}"),
                hint: "check the process's thread limit (ulimit -u)",
            })?;
        Ok(ReplicaSink {
            shared,
            thread: Some(thread),
            replica_id: replica_id.clone(),
        })
    }

    /// The replica's reservations on `engine_id` are now `counters`. Never
    /// blocks on the network (a lock shared only with the sink thread, a map
    /// update, and a wake-up when the thread had nothing to write). An
    /// engine id that is not one, or a new engine beyond
    /// [`MAX_ROUTER_ENGINES`], is refused with shm-format's error (as the
    /// shared-memory writer refuses them), and nothing changes.
    pub fn set(
        &self,
        engine_id: &str,
        counters: &Reservations,
    ) -> Result<(), engine_state_shm_format::Error> {
        let mut pending = lock(&self.shared.pending);
        match pending.index.get(engine_id) {
            Some(&at) => {
                if pending.slots[at].1 == *counters {
                    return Ok(());
                }
                pending.slots[at].1 = *counters;
            }
            None => {
                let id = EngineId::new(engine_id)?;
                if pending.slots.len() >= MAX_ROUTER_ENGINES {
                    return Err(engine_state_shm_format::Error::RouterCapacity {
                        replica_id: self.replica_id.to_string(),
                        engine_id: engine_id.to_owned(),
                        capacity: MAX_ROUTER_ENGINES,
                    });
                }
                let at = pending.slots.len();
                pending.slots.push((id, *counters));
                pending.index.insert(engine_id.to_owned(), at);
            }
        }
        self.changed(pending);
        Ok(())
    }

    /// The router no longer holds `engine_id` (it was removed): its slot
    /// leaves the next value. Returns whether it was there.
    pub fn remove(&self, engine_id: &str) -> bool {
        let mut pending = lock(&self.shared.pending);
        let Some(at) = pending.index.remove(engine_id) else {
            return false;
        };
        pending.slots.swap_remove(at);
        if let Some((moved, _)) = pending.slots.get(at) {
            let moved = moved.as_str().to_owned();
            pending.index.insert(moved, at);
        }
        self.changed(pending);
        true
    }

    /// Marks `pending` dirty; wakes the thread when this is the first
    /// change since its last write and it sleeps (a burst of changes costs
    /// one wake-up).
    fn changed(&self, mut pending: std::sync::MutexGuard<'_, Pending>) {
        if pending.dirty {
            self.shared.stats.replaced.fetch_add(1, Ordering::Relaxed);
            return;
        }
        pending.dirty = true;
        if pending.waiting {
            pending.waiting = false;
            drop(pending);
            self.shared.wake.notify_one();
        }
    }

    /// The replica id.
    pub fn replica_id(&self) -> &EngineId {
        &self.replica_id
    }

    /// The sink's counters: `written` (values acknowledged), `replaced`
    /// (changes that joined a write already due), `errors`, `refused`
    /// (writes refused because another live writer holds the key),
    /// `registry_errors`, `connected`, `last_error`.
    pub fn stats(&self) -> &SinkStats {
        &self.shared.stats
    }

    /// Waits until every change so far was written, or a write of it failed,
    /// at most `timeout`; true when nothing is left to write.
    pub fn flush(&self, timeout: Duration) -> bool {
        let pending = lock(&self.shared.pending);
        let (pending, _) = self
            .shared
            .written
            .wait_timeout_while(pending, timeout, |p| (p.dirty || p.busy) && !p.closing)
            .unwrap_or_else(|p| p.into_inner());
        !pending.dirty && !pending.busy
    }

    /// Stops the thread and deletes the replica's key and registration
    /// unless another writer holds it ([`DELETE_ROUTER_IF_OWNER_SCRIPT`];
    /// one attempt, bounded by the network timeout). Idempotent; `drop`
    /// calls it.
    pub fn close(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        lock(&self.shared.pending).closing = true;
        self.shared.wake.notify_all();
        let _ = thread.join();
    }
}

impl Drop for ReplicaSink {
    fn drop(&mut self) {
        self.close();
    }
}

/// What one write did.
enum Written {
    Yes,
    /// Another live writer holds the key (its pid).
    Refused(u32),
}

/// The thread's side: the connection, the value and when to write it.
struct Writer {
    target: RedisTarget,
    replica_id: EngineId,
    key: String,
    registry: String,
    ttl_ms: u32,
    flush_interval: Duration,
    heartbeat_period: Duration,
    con: Option<redis::Connection>,
    /// `EVALSHA` was refused on this connection (an ACL granting `+eval`
    /// alone): `EVAL` from now on.
    eval_only: bool,
    value: RouterValue,
    last_write: Option<Instant>,
    /// No attempt before this (backoff after a failure).
    retry_at: Instant,
    backoff: Backoff,
    /// Another writer held the key at the last write (logged once per change).
    refused: bool,
    /// Writes are failing (the server unreachable, an error reply): logged
    /// once when it starts, and once when a write goes through again.
    failing: bool,
}

impl Writer {
    fn new(target: RedisTarget, replica_id: &EngineId, options: ReplicaSinkOptions) -> Writer {
        let ttl_ms = target.ttl().as_millis().min(u128::from(u32::MAX)) as u32;
        Writer {
            key: router_key(target.prefix(), replica_id.as_str()),
            registry: router_registry_key(target.prefix()),
            target,
            replica_id: replica_id.clone(),
            ttl_ms,
            flush_interval: options.flush_interval,
            heartbeat_period: options.heartbeat_period,
            con: None,
            eval_only: false,
            value: RouterValue {
                writer_pid: options.writer_pid,
                heartbeat_period_us: options.heartbeat_period.as_micros().min(u32::MAX as u128)
                    as u32,
                state: STATE_ACTIVE,
                generation: options.generation,
                heartbeat_seq: 0,
                heartbeat_mono_ns: 0,
                ttl_ms,
                engines: Vec::new(),
            },
            last_write: None,
            retry_at: Instant::now(),
            backoff: Backoff::default(),
            refused: false,
            failing: false,
        }
    }

    /// When the next write is due: `flush_interval` after the last write
    /// when something changed, `heartbeat_period` after it otherwise, never
    /// before the backoff's end.
    fn due(&self, dirty: bool) -> Instant {
        let after = if dirty {
            self.flush_interval
        } else {
            self.heartbeat_period
        };
        let due = self.last_write.map_or(self.retry_at, |t| t + after);
        due.max(self.retry_at)
    }

    fn run(mut self, shared: &Shared) {
        loop {
            let mut pending = lock(&shared.pending);
            loop {
                if pending.closing {
                    drop(pending);
                    self.delete(&shared.stats);
                    shared.written.notify_all();
                    return;
                }
                let now = Instant::now();
                let due = self.due(pending.dirty);
                if now >= due {
                    break;
                }
                pending.waiting = true;
                pending = shared
                    .wake
                    .wait_timeout(pending, due - now)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
                pending.waiting = false;
            }
            self.value.engines.clone_from(&pending.slots);
            let was_dirty = std::mem::take(&mut pending.dirty);
            pending.busy = true;
            drop(pending);
            let result = self.write(&shared.stats);
            let mut pending = lock(&shared.pending);
            pending.busy = false;
            match result {
                Ok(written) => {
                    self.settle(&written, &shared.stats);
                    self.last_write = Some(Instant::now());
                }
                Err(error) => {
                    // Written again once reconnected (the latest counters).
                    pending.dirty |= was_dirty;
                    self.failed(&shared.stats, &error);
                }
            }
            drop(pending);
            shared.written.notify_all();
        }
    }

    /// After a failed connection or write: the connection is dropped, the
    /// next attempt waits for the backoff.
    fn failed(&mut self, stats: &SinkStats, error: &Error) {
        self.con = None;
        stats.failed(error);
        if !std::mem::replace(&mut self.failing, true) {
            crate::log::warn(format_args!(
                "engine-state: router replica {:?} cannot write its reservations ({error}); its \
                 peers stop counting them once its key expires (ttl_ms); retrying with backoff",
                self.replica_id.as_str()
            ));
        }
        self.retry_at = Instant::now() + self.backoff.failed();
    }

    /// Connects when needed, then writes the value with the next heartbeat,
    /// owner-checked, and registers the id (one command).
    fn write(&mut self, stats: &SinkStats) -> Result<Written, Error> {
        if self.con.is_none() {
            self.con = Some(self.target.connect()?);
            self.eval_only = false;
        }
        self.value.heartbeat_seq += 1;
        self.value.heartbeat_mono_ns = monotonic_ns();
        let bytes = self.value.encode();
        let con = self.con.as_mut().expect("connected above");
        let (key, registry, ttl_ms, id) = (
            &self.key,
            &self.registry,
            self.ttl_ms,
            self.replica_id.as_str(),
        );
        let run = |con: &mut redis::Connection, command: &str, script: &str| {
            redis::cmd(command)
                .arg(script)
                .arg(2)
                .arg(key)
                .arg(registry)
                .arg(&bytes[..])
                .arg(ttl_ms)
                .arg(id)
                .query::<Value>(con)
        };
        let reply = if self.eval_only {
            run(con, "EVAL", SET_ROUTER_IF_OWNER_SCRIPT)
        } else {
            match run(con, "EVALSHA", SET_ROUTER_IF_OWNER_SCRIPT_SHA1) {
                // A server's refusal (NOSCRIPT, NOPERM): EVAL, which caches
                // the script; a NOPERM means an ACL with `+eval` alone, so
                // EVAL from now on.
                Err(e) if e.code().is_some() => {
                    self.eval_only = e.code() != Some("NOSCRIPT");
                    run(con, "EVAL", SET_ROUTER_IF_OWNER_SCRIPT)
                }
                reply => reply,
            }
        }
        .map_err(|e| self.target.error("cannot write the router replica", &e))?;
        self.backoff.succeeded();
        stats.succeeded();
        Ok(match reply {
            Value::BulkString(header) => Written::Refused(holder_pid(&header)),
            Value::Int(2) => {
                self.registry_refused(stats);
                Written::Yes
            }
            _ => Written::Yes,
        })
    }

    /// Counts a write of the thread, and says once on stderr when another
    /// writer starts or stops holding the key.
    fn settle(&mut self, written: &Written, stats: &SinkStats) {
        let id = self.replica_id.as_str();
        match *written {
            Written::Yes => {
                stats.written.fetch_add(1, Ordering::Relaxed);
                if std::mem::take(&mut self.failing) {
                    crate::log::warn(format_args!(
                        "engine-state: router replica {id:?} writes its reservations again ({})",
                        self.target
                    ));
                }
                if std::mem::take(&mut self.refused) {
                    crate::log::warn(format_args!(
                        "engine-state: router replica {id:?}: the other writer's key is gone \
                         (it closed, or its key expired); this process writes it again ({})",
                        self.target
                    ));
                }
            }
            Written::Refused(pid) => {
                stats.refused.fetch_add(1, Ordering::Relaxed);
                if !std::mem::replace(&mut self.refused, true) {
                    // The target prints without its password.
                    crate::log::warn(format_args!(
                        "engine-state: router replica id {id:?} is written by another live \
                         process (pid {pid} on its host) at Redis key {:?} ({}); this process's \
                         reservations are not written until that key expires (ttl_ms after the \
                         other writer's last write). Give each router its own replica id, or \
                         stop the other router",
                        self.key, self.target
                    ));
                }
            }
        }
    }

    /// The registry key is not a set: counted, logged once.
    fn registry_refused(&self, stats: &SinkStats) {
        if stats.registry_errors.fetch_add(1, Ordering::Relaxed) == 0 {
            crate::log::warn(format_args!(
                "engine-state: Redis at {}: the router registry key {:?} is not a set; router \
                 replica {:?} is written but not registered, so other routers will not find \
                 it. Delete that key, or give this fleet its own ?prefix= in the URI",
                self.target,
                self.registry,
                self.replica_id.as_str()
            ));
        }
    }

    /// A clean close: the key and the registration go, unless another
    /// writer holds the key (one attempt).
    fn delete(&mut self, stats: &SinkStats) {
        if self.con.is_none() && Instant::now() < self.retry_at {
            // The last attempt failed just now: a close does not wait for
            // another connection timeout; the key expires in `ttl_ms`.
            return;
        }
        if self.con.is_none() {
            match self.target.connect() {
                Ok(con) => self.con = Some(con),
                Err(error) => return stats.failed(&error),
            }
        }
        let con = self.con.as_mut().expect("connected above");
        let mine = self.value.header();
        let result = redis::cmd("EVAL")
            .arg(DELETE_ROUTER_IF_OWNER_SCRIPT)
            .arg(2)
            .arg(&self.key)
            .arg(&self.registry)
            .arg(&bytemuck::bytes_of(&mine)[..ROUTER_VALUE_HEADER_SIZE])
            .arg(self.replica_id.as_str())
            .query::<Value>(con);
        if let Err(e) = result {
            stats.failed(&self.target.error("cannot delete the router replica", &e));
        }
    }
}

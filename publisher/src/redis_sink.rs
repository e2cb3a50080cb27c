//! The Redis sink: a thread that owns the Redis connection, so that no caller
//! ever waits on the network (DESIGN §7).
//!
//! Callers hand records over through a mailbox that holds at most one pending
//! write per engine: a newer record replaces the older one (drop-oldest, so
//! the hand-off is bounded by the number of engines, never by the outage's
//! length). The thread takes the whole mailbox at once and writes it as one
//! pipeline. When Redis is unreachable it reconnects with exponential backoff
//! (50 ms doubling to 5 s) while callers keep overwriting their slot.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use engine_state_reader::{
    engine_key, registry_key, RedisRecord, RedisTarget, DELETE_IF_OWNER_SCRIPT, RECONNECT_CAP,
    RECONNECT_FIRST, RECORD_SIZE, SET_IF_OWNER_SCRIPT,
};
use engine_state_shm_format::monotonic_ns;
use redis::{ConnectionLike, Value};

use crate::error::Error;

/// How often an engine's id is re-added to the registry while it is written
/// (heals a registry entry a reader pruned during a long outage).
const REREGISTER_EVERY: Duration = Duration::from_secs(1);

/// One pending write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SinkOp {
    /// `SET <prefix>engine:<id> <record> PX <ttl>` (and register the id).
    Set(RedisRecord),
    /// `DEL` the key and remove the id from the registry (a clean close).
    Delete,
}

/// Called after each acknowledged `SET` with the time from the record's
/// heartbeat stamp to the acknowledgement (same host clock).
pub type WrittenObserver = Box<dyn Fn(Duration) + Send + Sync>;

/// Counters of a sink, readable from any thread.
#[derive(Debug, Default)]
pub struct SinkStats {
    /// Records acknowledged by Redis.
    pub written: AtomicU64,
    /// Records replaced in the mailbox by a newer one before they were sent.
    pub replaced: AtomicU64,
    /// Failed connection attempts and failed pipelines.
    pub errors: AtomicU64,
    /// Whether the last attempt succeeded.
    pub connected: AtomicBool,
    /// Records not written because another live publisher holds the
    /// engine's key (an owner-checked sink only, see [`RedisSink::start`]).
    pub refused: AtomicU64,
    /// Registrations (`SADD`/`SREM` of `<prefix>engines`) the server refused
    /// because that key is not a set: readers cannot discover engines
    /// written here. Logged once (`log::warn!`).
    pub registry_errors: AtomicU64,
    last_error: Mutex<Option<String>>,
}

impl SinkStats {
    /// The last error (password hidden), cleared by the next success.
    pub fn last_error(&self) -> Option<String> {
        lock(&self.last_error).clone()
    }

    /// Records a successful connection or write.
    pub(crate) fn succeeded(&self) {
        self.connected.store(true, Ordering::Relaxed);
        *lock(&self.last_error) = None;
    }

    /// Counts a registration the server refused with `WRONGTYPE`; logs the
    /// first one (the registry key must be deleted by hand).
    pub(crate) fn registry_refused(&self, target: &RedisTarget, reply: &str) {
        if self.registry_errors.fetch_add(1, Ordering::Relaxed) == 0 {
            log::warn!(
                "engine-state: Redis at {target}: the registry key {:?} is not a set ({reply}); \
                 engines written there are not registered, so readers will not find them. \
                 Delete the key, or give this fleet its own ?prefix=",
                registry_key(target.prefix())
            );
        }
    }

    /// Records a failed connection attempt or write.
    pub(crate) fn failed(&self, error: &dyn std::fmt::Display) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        self.connected.store(false, Ordering::Relaxed);
        *lock(&self.last_error) = Some(error.to_string());
    }
}

struct Shared {
    mailbox: Mutex<Mailbox>,
    /// The sink thread waits here for work (and during backoff, for stop).
    wake: Condvar,
    /// `flush` waits here for an empty mailbox.
    drained: Condvar,
    stats: SinkStats,
    on_written: Option<WrittenObserver>,
}

#[derive(Default)]
struct Mailbox {
    pending: HashMap<Arc<str>, SinkOp>,
    /// The thread sleeps on `wake` for work: only then is it worth a notify.
    waiting: bool,
    /// The thread holds a batch taken from `pending`.
    busy: bool,
    stop: bool,
}

/// A cheap handle to hand records to a [`RedisSink`] from any thread.
#[derive(Clone)]
pub struct SinkHandle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SinkHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SinkHandle").finish_non_exhaustive()
    }
}

impl SinkHandle {
    /// Queues `op` for `engine_id`, replacing its pending write if any.
    /// Never blocks on the network: one uncontended lock and a map insert.
    #[inline]
    pub fn send(&self, engine_id: &Arc<str>, op: SinkOp) {
        let mut mailbox = lock(&self.shared.mailbox);
        if mailbox.pending.insert(engine_id.clone(), op).is_some() {
            self.shared.stats.replaced.fetch_add(1, Ordering::Relaxed);
        }
        if mailbox.waiting {
            mailbox.waiting = false;
            drop(mailbox);
            self.shared.wake.notify_one();
        }
    }

    /// Queues every op of `ops` (emptying it) under one lock with at most
    /// one wake-up, so the sink writes them as one pipeline: cheaper than
    /// [`SinkHandle::send`] per record, which may wake the sink for the first
    /// record while the others are still being queued.
    pub fn send_all(&self, ops: &mut Vec<(Arc<str>, SinkOp)>) {
        if ops.is_empty() {
            return;
        }
        let mut mailbox = lock(&self.shared.mailbox);
        let mut replaced = 0;
        for (engine_id, op) in ops.drain(..) {
            replaced += u64::from(mailbox.pending.insert(engine_id, op).is_some());
        }
        if replaced > 0 {
            self.shared
                .stats
                .replaced
                .fetch_add(replaced, Ordering::Relaxed);
        }
        if mailbox.waiting {
            mailbox.waiting = false;
            drop(mailbox);
            self.shared.wake.notify_one();
        }
    }

    /// The sink's counters.
    pub fn stats(&self) -> &SinkStats {
        &self.shared.stats
    }
}

/// The sink thread and its mailbox. Dropping it writes what is pending (one
/// attempt, bounded by the network timeout) and stops the thread.
pub struct RedisSink {
    handle: SinkHandle,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for RedisSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSink")
            .field("stats", self.handle.stats())
            .finish_non_exhaustive()
    }
}

impl RedisSink {
    /// Starts the sink thread. `connection` is an already open connection
    /// (None: the thread connects itself, with backoff).
    ///
    /// With `owner` (the writer's record: its `writer_pid` and `generation`
    /// are its identity), every write is owner-checked
    /// ([`SET_IF_OWNER_SCRIPT`]): a key that holds another live writer's
    /// record is left alone, counted in [`SinkStats::refused`] and logged
    /// once, until that key expires; a delete only removes the key while it
    /// is the owner's ([`DELETE_IF_OWNER_SCRIPT`]). The [`crate::Publisher`]
    /// uses this; without `owner` writes are plain `SET`s.
    pub fn start(
        target: RedisTarget,
        connection: Option<redis::Connection>,
        on_written: Option<WrittenObserver>,
        thread_name: &str,
        owner: Option<RedisRecord>,
    ) -> Result<RedisSink, Error> {
        let shared = Arc::new(Shared {
            mailbox: Mutex::new(Mailbox::default()),
            wake: Condvar::new(),
            drained: Condvar::new(),
            stats: SinkStats::default(),
            on_written,
        });
        shared
            .stats
            .connected
            .store(connection.is_some(), Ordering::Relaxed);
        let worker = Worker {
            shared: shared.clone(),
            encoder: PipelineEncoder::new(&target).owned_by(owner),
            target,
            con: connection,
            spare: HashMap::new(),
            backoff: RECONNECT_FIRST,
        };
        let thread = std::thread::Builder::new()
            .name(thread_name.chars().take(15).collect())
            .spawn(move || worker.run())
            .map_err(|e| Error::Config {
                what: format!("cannot start the Redis sink thread: {e}"),
            })?;
        Ok(RedisSink {
            handle: SinkHandle { shared },
            thread: Some(thread),
        })
    }

    /// A handle for other threads.
    pub fn handle(&self) -> SinkHandle {
        self.handle.clone()
    }

    /// Queues `op` (see [`SinkHandle::send`]).
    #[inline]
    pub fn send(&self, engine_id: &Arc<str>, op: SinkOp) {
        self.handle.send(engine_id, op)
    }

    /// Queues many ops at once (see [`SinkHandle::send_all`]).
    pub fn send_all(&self, ops: &mut Vec<(Arc<str>, SinkOp)>) {
        self.handle.send_all(ops)
    }

    /// The sink's counters.
    pub fn stats(&self) -> &SinkStats {
        self.handle.stats()
    }

    /// Waits until everything queued so far was written (or failed), at most
    /// `timeout`; true when the mailbox is empty.
    pub fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut mailbox = lock(&self.handle.shared.mailbox);
        while !mailbox.pending.is_empty() || mailbox.busy {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            mailbox = self
                .handle
                .shared
                .drained
                .wait_timeout(mailbox, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }

    /// Writes what is pending (one attempt) and stops the thread. Idempotent.
    pub fn stop(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        lock(&self.handle.shared.mailbox).stop = true;
        self.handle.shared.wake.notify_all();
        let _ = thread.join();
    }

    /// Forgets the thread without joining it (a forked child has no such thread).
    pub(crate) fn forget(mut self) {
        if let Some(thread) = self.thread.take() {
            std::mem::forget(thread);
        }
        std::mem::forget(self);
    }
}

impl Drop for RedisSink {
    fn drop(&mut self) {
        self.stop();
    }
}

struct Worker {
    shared: Arc<Shared>,
    target: RedisTarget,
    con: Option<redis::Connection>,
    encoder: PipelineEncoder,
    /// The previous batch's map, emptied, swapped into the mailbox next time
    /// (so neither side reallocates in the steady state).
    spare: HashMap<Arc<str>, SinkOp>,
    backoff: Duration,
}

/// Encodes [`SinkOp`]s as one RESP pipeline, keeping per engine what makes
/// the next `SET` cheap (its encoded key) and when its id was last added to
/// the registry. Used by the sink thread and by [`crate::InlineSink`].
#[derive(Debug)]
pub(crate) struct PipelineEncoder {
    prefix: String,
    registry: String,
    ttl_ms: u32,
    /// `PX <ttl>` of every `SET`, encoded once.
    set_tail: Vec<u8>,
    /// Per engine written: its encoded command prefix and registration time.
    engines: HashMap<Arc<str>, Written, foldhash::fast::RandomState>,
    /// The pipeline being built (kept for its allocation).
    pub(crate) request: Vec<u8>,
    /// Commands in `request`.
    pub(crate) commands: usize,
    /// Heartbeat stamps of the records in `request`.
    pub(crate) sent: Vec<u64>,
    /// Owner-checked writes: the record whose identity every write claims
    /// (None: plain `SET`s).
    owner: Option<[u8; RECORD_SIZE]>,
    /// Per owner-checked `SET` in `request`: its command index, its index in
    /// `sent` and its engine.
    claims: Vec<(usize, usize, Arc<str>)>,
    /// When the pipeline was begun (both clocks).
    began: Instant,
    began_mono_ns: u64,
}

/// What the encoder keeps per engine, so a `SET` costs no formatting.
#[derive(Debug)]
struct Written {
    /// `*5 $3 SET $n <key> $<RECORD_SIZE>` in RESP, up to the record's bytes.
    set_head: Vec<u8>,
    /// When the id was last added to the registry (None: not since connecting).
    registered: Option<Instant>,
    /// Another writer held the key at the last owner-checked write (logged
    /// once per change).
    refused: bool,
}

/// The RESP bytes of a `SET` after the value: `PX <ttl_ms>`.
fn set_tail(ttl_ms: u32) -> Vec<u8> {
    let ttl = ttl_ms.to_string();
    format!("\r\n$2\r\nPX\r\n${}\r\n{ttl}\r\n", ttl.len()).into_bytes()
}

/// The RESP bytes of `SET <key> ` up to the value's bytes.
fn set_head(key: &str) -> Vec<u8> {
    format!(
        "*5\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${RECORD_SIZE}\r\n",
        key.len()
    )
    .into_bytes()
}

impl Worker {
    fn run(mut self) {
        loop {
            let (batch, stopping) = {
                let mut mailbox = lock(&self.shared.mailbox);
                while mailbox.pending.is_empty() && !mailbox.stop {
                    mailbox.waiting = true;
                    mailbox = self
                        .shared
                        .wake
                        .wait(mailbox)
                        .unwrap_or_else(|p| p.into_inner());
                }
                mailbox.waiting = false;
                if mailbox.pending.is_empty() {
                    return; // stopping, nothing left
                }
                mailbox.busy = true;
                let mut batch = std::mem::take(&mut self.spare);
                std::mem::swap(&mut batch, &mut mailbox.pending);
                (batch, mailbox.stop)
            };
            let result = self.write(&batch);
            let failed = result.is_err();
            let mut batch = batch;
            {
                let mut mailbox = lock(&self.shared.mailbox);
                if failed && !stopping {
                    // Keep what no newer record replaced meanwhile.
                    for (id, op) in batch.drain() {
                        mailbox.pending.entry(id).or_insert(op);
                    }
                }
                mailbox.busy = false;
            }
            batch.clear();
            self.spare = batch;
            self.shared.drained.notify_all();
            match result {
                Ok(()) => {
                    self.backoff = RECONNECT_FIRST;
                    self.shared.stats.succeeded();
                }
                Err(error) => {
                    self.con = None;
                    self.encoder.connection_lost();
                    self.shared.stats.failed(&error);
                    if stopping || self.sleep_unless_stopped(self.backoff) {
                        lock(&self.shared.mailbox).pending.clear();
                        self.shared.drained.notify_all();
                        return;
                    }
                    self.backoff = (self.backoff * 2).min(RECONNECT_CAP);
                }
            }
        }
    }

    /// Sleeps `duration` unless asked to stop first; true when stopping.
    fn sleep_unless_stopped(&self, duration: Duration) -> bool {
        let deadline = Instant::now() + duration;
        let mut mailbox = lock(&self.shared.mailbox);
        loop {
            if mailbox.stop {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            mailbox = self
                .shared
                .wake
                .wait_timeout(mailbox, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Writes one batch as one pipeline.
    fn write(
        &mut self,
        batch: &HashMap<Arc<str>, SinkOp>,
    ) -> Result<(), engine_state_reader::Error> {
        if self.con.is_none() {
            self.con = Some(self.target.connect()?);
        }
        self.encoder.begin();
        for (id, op) in batch {
            self.encoder.push(id, op);
        }
        let con = self.con.as_mut().expect("connected above");
        let replies = con
            .req_packed_commands(&self.encoder.request, 0, self.encoder.commands)
            .map_err(|e| self.target.error("cannot write engines", &e))?;
        check_replies(&self.target, &replies, &self.shared.stats)?;
        self.encoder
            .settle_claims(&replies, &self.target, &self.shared.stats);
        self.shared.acknowledged(&self.encoder.sent);
        Ok(())
    }
}

impl Shared {
    /// Counts the records whose heartbeat stamps are `sent` as written.
    fn acknowledged(&self, sent: &[u64]) {
        acknowledged(&self.stats, self.on_written.as_ref(), sent);
    }
}

/// Counts the records whose heartbeat stamps are `sent` as written and
/// reports their age to `on_written`.
pub(crate) fn acknowledged(stats: &SinkStats, on_written: Option<&WrittenObserver>, sent: &[u64]) {
    stats
        .written
        .fetch_add(sent.len() as u64, Ordering::Relaxed);
    if let Some(observe) = on_written {
        let acked = monotonic_ns();
        for heartbeat in sent {
            observe(Duration::from_nanos(acked.saturating_sub(*heartbeat)));
        }
    }
}

/// The first server error among a pipeline's replies, as an error.
///
/// `WRONGTYPE` is not one: of the commands a sink sends only `SADD`/`SREM`
/// of the registry can get it (`SET` replaces any type, the scripts read
/// with `pcall`), and a registry of the wrong type is not a connection
/// problem that reconnecting would fix. It is counted and logged once
/// ([`SinkStats::registry_errors`]); the records are written all the same.
pub(crate) fn check_replies(
    target: &RedisTarget,
    replies: &[Value],
    stats: &SinkStats,
) -> Result<(), engine_state_reader::Error> {
    for reply in replies {
        if let Value::ServerError(e) = reply {
            if e.code() == "WRONGTYPE" {
                stats.registry_refused(target, &format!("{e:?}"));
                continue;
            }
            let error: redis::RedisError = e.clone().into();
            return Err(target.error("cannot write engines", &error));
        }
    }
    Ok(())
}

impl PipelineEncoder {
    pub(crate) fn new(target: &RedisTarget) -> PipelineEncoder {
        let ttl_ms = target.ttl().as_millis() as u32;
        PipelineEncoder {
            prefix: target.prefix().to_owned(),
            registry: registry_key(target.prefix()),
            ttl_ms,
            set_tail: set_tail(ttl_ms),
            engines: HashMap::default(),
            request: Vec::new(),
            commands: 0,
            sent: Vec::new(),
            owner: None,
            claims: Vec::new(),
            began: Instant::now(),
            began_mono_ns: 0,
        }
    }

    /// Owner-checked writes as `owner` (see [`RedisSink::start`]); None: plain.
    pub(crate) fn owned_by(mut self, owner: Option<RedisRecord>) -> PipelineEncoder {
        self.owner = owner.map(|record| record.encode());
        self
    }

    /// After an owner-checked pipeline's replies: counts (and logs, once per
    /// change) the records refused because another writer holds their key,
    /// and leaves only the written ones in `sent`.
    pub(crate) fn settle_claims(
        &mut self,
        replies: &[Value],
        target: &RedisTarget,
        stats: &SinkStats,
    ) {
        if self.claims.is_empty() {
            return;
        }
        let mut refused_sent = Vec::new();
        for (command, sent, id) in self.claims.drain(..) {
            let holder = match replies.get(command) {
                Some(Value::BulkString(header)) => Some(holder_pid(header)),
                _ => None,
            };
            let Some(written) = self.engines.get_mut(&id) else {
                continue;
            };
            match holder {
                Some(pid) => {
                    stats.refused.fetch_add(1, Ordering::Relaxed);
                    refused_sent.push(sent);
                    if !written.refused {
                        log::warn!(
                            "engine-state: engine id {id:?} is published by another live \
                             process (pid {pid} on its host) at Redis key {:?} ({target}); \
                             this publisher's records are not written until that key expires",
                            engine_key(&self.prefix, &id)
                        );
                    }
                    written.refused = true;
                }
                None if written.refused => {
                    log::warn!(
                        "engine-state: engine id {id:?}: the other publisher's key expired; \
                         this publisher writes it again ({target})"
                    );
                    written.refused = false;
                }
                None => {}
            }
        }
        for sent in refused_sent.into_iter().rev() {
            self.sent.remove(sent);
        }
    }

    /// Starts a new pipeline.
    pub(crate) fn begin(&mut self) {
        self.request.clear();
        self.commands = 0;
        self.sent.clear();
        self.claims.clear();
        self.began = Instant::now();
        self.began_mono_ns = monotonic_ns();
    }

    /// A new connection may reach a server that lost the registry: register
    /// every engine again with its next write.
    pub(crate) fn connection_lost(&mut self) {
        for written in self.engines.values_mut() {
            written.registered = None;
        }
    }

    /// Appends `op` for `id` to the pipeline.
    pub(crate) fn push(&mut self, id: &Arc<str>, op: &SinkOp) {
        match op {
            SinkOp::Set(record) => {
                let now = self.began;
                let prefix = &self.prefix;
                let written = self.engines.entry(id.clone()).or_insert_with(|| Written {
                    set_head: set_head(&engine_key(prefix, id)),
                    registered: None,
                    refused: false,
                });
                let mut record = *record;
                record.ttl_ms = self.ttl_ms;
                record.write_delay_us =
                    (self.began_mono_ns.saturating_sub(record.heartbeat_mono_ns) / 1000)
                        .min(u64::from(u32::MAX)) as u32;
                if self.owner.is_some() {
                    // Written only while no other live writer holds the key.
                    self.claims
                        .push((self.commands, self.sent.len(), id.clone()));
                    redis::cmd("EVAL")
                        .arg(SET_IF_OWNER_SCRIPT)
                        .arg(1)
                        .arg(engine_key(prefix, id))
                        .arg(&record.encode()[..])
                        .arg(self.ttl_ms)
                        .write_packed_command(&mut self.request);
                } else {
                    // SET <key> <record> PX <ttl>, from the cached prefix.
                    self.request.extend_from_slice(&written.set_head);
                    self.request.extend_from_slice(&record.encode());
                    self.request.extend_from_slice(&self.set_tail);
                }
                self.commands += 1;
                let due = written
                    .registered
                    .is_none_or(|t| now.duration_since(t) >= REREGISTER_EVERY);
                if due {
                    redis::cmd("SADD")
                        .arg(&self.registry)
                        .arg(&**id)
                        .write_packed_command(&mut self.request);
                    self.commands += 1;
                    written.registered = Some(now);
                }
                self.sent.push(record.heartbeat_mono_ns);
            }
            SinkOp::Delete => {
                let key = engine_key(&self.prefix, id);
                if let Some(owner) = &self.owner {
                    // Only the owner's key: another writer's stays.
                    redis::cmd("EVAL")
                        .arg(DELETE_IF_OWNER_SCRIPT)
                        .arg(2)
                        .arg(&key)
                        .arg(&self.registry)
                        .arg(&owner[..])
                        .arg(&**id)
                        .write_packed_command(&mut self.request);
                    self.commands += 1;
                } else {
                    redis::cmd("DEL")
                        .arg(&key)
                        .write_packed_command(&mut self.request);
                    redis::cmd("SREM")
                        .arg(&self.registry)
                        .arg(&**id)
                        .write_packed_command(&mut self.request);
                    self.commands += 2;
                }
                self.engines.remove(id);
            }
        }
    }
}

/// The `writer_pid` in a record header (0 if too short to hold one).
pub(crate) fn holder_pid(header: &[u8]) -> u32 {
    header
        .get(16..20)
        .map_or(0, |b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain data behind the lock: a panic elsewhere leaves it usable.
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_set_encoding_is_the_packed_command() {
        let record = RedisRecord {
            generation: 3,
            ..RedisRecord::default()
        };
        let key = engine_key("p:", "engine-7");
        let mut ours = set_head(&key);
        ours.extend_from_slice(&record.encode());
        ours.extend_from_slice(&set_tail(2000));
        let theirs = redis::cmd("SET")
            .arg(&key)
            .arg(&record.encode()[..])
            .arg("PX")
            .arg(2000u32)
            .get_packed_command();
        assert_eq!(ours, theirs);
    }
}

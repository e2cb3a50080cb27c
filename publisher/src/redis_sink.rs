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

use engine_state_reader::{registry_key, RedisRecord, RedisTarget, RECONNECT_CAP, RECONNECT_FIRST};
use engine_state_shm_format::monotonic_ns;
use redis::ConnectionLike;

use crate::error::Error;
use crate::pipeline::{check_replies, PipelineEncoder};

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
    /// Records not written because another live writer holds the engine's
    /// key (an owner-checked sink only, see [`RedisSink::start`] and
    /// [`crate::InlineSink::owner_checked`]). Logged on stderr once per
    /// engine each time it starts being refused.
    pub refused: AtomicU64,
    /// Registrations (`SADD`/`SREM` of `<prefix>engines`) the server refused
    /// because that key is not a set: readers cannot discover engines
    /// written here. Logged once per sink on stderr.
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
    ///
    /// On stderr, not through `log`: no binary of ours, nor the Python
    /// module, installs a `log` logger, so a `log::warn!` would go nowhere
    /// (like `recreate.rs`'s messages). `target` prints with its password
    /// hidden; `reply` is the server's error text.
    pub(crate) fn registry_refused(&self, target: &RedisTarget, reply: &str) {
        if self.registry_errors.fetch_add(1, Ordering::Relaxed) == 0 {
            eprintln!(
                "engine-state: Redis at {target}: the registry key {:?} is not a set ({reply}); \
                 engines written there are not registered, so readers will not find them. \
                 Delete that key, or give this fleet its own ?prefix= in the URI",
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
    /// ([`engine_state_reader::SET_IF_OWNER_SCRIPT`]): a key that holds
    /// another live writer's record is left alone, counted in
    /// [`SinkStats::refused`] and logged once on stderr, until that key
    /// expires; a delete only removes the key while it is the owner's
    /// ([`engine_state_reader::DELETE_IF_OWNER_SCRIPT`]). The
    /// [`crate::Publisher`] uses this; without `owner` writes are plain
    /// `SET`s.
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
            encoder: PipelineEncoder::for_owner(&target, owner),
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

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain data behind the lock: a panic elsewhere leaves it usable.
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

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
    engine_key, registry_key, RedisRecord, RedisTarget, RECONNECT_CAP, RECONNECT_FIRST,
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
    last_error: Mutex<Option<String>>,
}

impl SinkStats {
    /// The last error (password hidden), cleared by the next success.
    pub fn last_error(&self) -> Option<String> {
        lock(&self.last_error).clone()
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
    pub fn start(
        target: RedisTarget,
        connection: Option<redis::Connection>,
        on_written: Option<WrittenObserver>,
        thread_name: &str,
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
            registry: registry_key(target.prefix()),
            ttl_ms: target.ttl().as_millis() as u32,
            target,
            con: connection,
            registered: HashMap::new(),
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
    registry: String,
    ttl_ms: u32,
    con: Option<redis::Connection>,
    registered: HashMap<Arc<str>, Instant>,
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
                (std::mem::take(&mut mailbox.pending), mailbox.stop)
            };
            let result = self.write(&batch);
            let failed = result.is_err();
            {
                let mut mailbox = lock(&self.shared.mailbox);
                if failed && !stopping {
                    // Keep what no newer record replaced meanwhile.
                    for (id, op) in batch {
                        mailbox.pending.entry(id).or_insert(op);
                    }
                }
                mailbox.busy = false;
            }
            self.shared.drained.notify_all();
            match result {
                Ok(()) => {
                    self.backoff = RECONNECT_FIRST;
                    self.shared.stats.connected.store(true, Ordering::Relaxed);
                    *lock(&self.shared.stats.last_error) = None;
                }
                Err(error) => {
                    self.con = None;
                    self.registered.clear();
                    self.shared.stats.errors.fetch_add(1, Ordering::Relaxed);
                    self.shared.stats.connected.store(false, Ordering::Relaxed);
                    *lock(&self.shared.stats.last_error) = Some(error.to_string());
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
        let now = Instant::now();
        let now_mono = monotonic_ns();
        let mut request = Vec::with_capacity(batch.len() * 300);
        let mut count = 0;
        let mut sent = Vec::with_capacity(batch.len());
        for (id, op) in batch {
            let key = engine_key(self.target.prefix(), id);
            match op {
                SinkOp::Set(record) => {
                    let mut record = *record;
                    record.ttl_ms = self.ttl_ms;
                    record.write_delay_us =
                        (now_mono.saturating_sub(record.heartbeat_mono_ns) / 1000)
                            .min(u64::from(u32::MAX)) as u32;
                    request.extend(
                        redis::cmd("SET")
                            .arg(&key)
                            .arg(&record.encode()[..])
                            .arg("PX")
                            .arg(self.ttl_ms)
                            .get_packed_command(),
                    );
                    count += 1;
                    let due = self
                        .registered
                        .get(id)
                        .is_none_or(|t| now.duration_since(*t) >= REREGISTER_EVERY);
                    if due {
                        request.extend(
                            redis::cmd("SADD")
                                .arg(&self.registry)
                                .arg(&**id)
                                .get_packed_command(),
                        );
                        count += 1;
                        self.registered.insert(id.clone(), now);
                    }
                    sent.push(record.heartbeat_mono_ns);
                }
                SinkOp::Delete => {
                    request.extend(redis::cmd("DEL").arg(&key).get_packed_command());
                    request.extend(
                        redis::cmd("SREM")
                            .arg(&self.registry)
                            .arg(&**id)
                            .get_packed_command(),
                    );
                    count += 2;
                    self.registered.remove(id);
                }
            }
        }
        let con = self.con.as_mut().expect("connected above");
        let replies = con
            .req_packed_commands(&request, 0, count)
            .map_err(|e| self.target.error("cannot write engines", &e))?;
        if let Some(Value::ServerError(e)) =
            replies.iter().find(|v| matches!(v, Value::ServerError(_)))
        {
            let error: redis::RedisError = e.clone().into();
            return Err(self.target.error("cannot write engines", &error));
        }
        self.shared
            .stats
            .written
            .fetch_add(sent.len() as u64, Ordering::Relaxed);
        if let Some(observe) = &self.shared.on_written {
            let acked = monotonic_ns();
            for heartbeat in sent {
                observe(Duration::from_nanos(acked.saturating_sub(heartbeat)));
            }
        }
        Ok(())
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain data behind the lock: a panic elsewhere leaves it usable.
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

//! The Redis sink: a thread that owns the Redis connection, so that no caller
//! ever waits on the network (docs/REDIS.md, "Writing: the sink").
//!
//! Callers hand records over through a mailbox (`crate::mailbox`) that holds
//! at most one pending write per engine: a newer record replaces the older
//! one (drop-oldest, so the hand-off is bounded by the number of engines,
//! never by the outage's length). The thread takes the whole mailbox at once
//! and writes it as one pipeline. When Redis is unreachable it reconnects
//! with [`Backoff`] while callers keep overwriting their slot.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use redis::ConnectionLike;

use crate::backoff::Backoff;
use crate::encoder::PipelineEncoder;
use crate::error::Error;
use crate::lock;
use crate::mailbox::{Mailbox, Shared, SinkHandle};
use crate::ops::{AckLagObserver, SinkOp};
use crate::replies::check_replies;
use crate::schema::RedisRecord;
use crate::stats::SinkStats;
use crate::target::RedisTarget;

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
    /// ([`crate::SET_IF_OWNER_SCRIPT`]): a key that holds
    /// another live writer's record is left alone, counted in
    /// [`SinkStats::refused`] and logged once on stderr, until that key
    /// expires; a delete only removes the key while it is the owner's
    /// ([`crate::DELETE_IF_OWNER_SCRIPT`]). The
    /// publisher (`engine_state_publisher::Publisher`) uses this; without `owner` writes are plain
    /// `SET`s.
    pub fn start(
        target: RedisTarget,
        connection: Option<redis::Connection>,
        on_ack_lag: Option<AckLagObserver>,
        thread_name: &str,
        owner: Option<RedisRecord>,
    ) -> std::io::Result<RedisSink> {
        let shared = Arc::new(Shared {
            mailbox: Mutex::new(Mailbox::default()),
            wake: Condvar::new(),
            drained: Condvar::new(),
            stats: SinkStats::default(),
            on_ack_lag,
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
            spare_cache: HashMap::new(),
            backoff: Backoff::default(),
        };
        let thread = std::thread::Builder::new()
            .name(thread_name.chars().take(15).collect())
            .spawn(move || worker.run())?;
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

    /// Queues a cache digest value (see [`SinkHandle::send_cache`]).
    pub fn send_cache(&self, engine_id: &Arc<str>, value: Arc<[u8]>) {
        self.handle.send_cache(engine_id, value)
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
        let mailbox = lock(&self.handle.shared.mailbox);
        let (mailbox, _) = self
            .handle
            .shared
            .drained
            .wait_timeout_while(mailbox, timeout, |m| !m.is_empty() || m.busy)
            .unwrap_or_else(|p| p.into_inner());
        mailbox.is_empty() && !mailbox.busy
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
    pub fn forget(mut self) {
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
    /// The same for cache digests.
    spare_cache: HashMap<Arc<str>, Arc<[u8]>>,
    backoff: Backoff,
}

impl Worker {
    fn run(mut self) {
        loop {
            let (batch, caches, stopping) = {
                let mut mailbox = lock(&self.shared.mailbox);
                while mailbox.is_empty() && !mailbox.stop {
                    mailbox.waiting = true;
                    mailbox = self
                        .shared
                        .wake
                        .wait(mailbox)
                        .unwrap_or_else(|p| p.into_inner());
                }
                mailbox.waiting = false;
                if mailbox.is_empty() {
                    return; // stopping, nothing left
                }
                mailbox.busy = true;
                let mut batch = std::mem::take(&mut self.spare);
                std::mem::swap(&mut batch, &mut mailbox.pending);
                let mut caches = std::mem::take(&mut self.spare_cache);
                std::mem::swap(&mut caches, &mut mailbox.pending_cache);
                (batch, caches, mailbox.stop)
            };
            let result = self.write(&batch, &caches);
            let failed = result.is_err();
            let (mut batch, mut caches) = (batch, caches);
            {
                let mut mailbox = lock(&self.shared.mailbox);
                if failed && !stopping {
                    // Keep what no newer record or digest replaced meanwhile.
                    for (id, op) in batch.drain() {
                        mailbox.pending.entry(id).or_insert(op);
                    }
                    for (id, value) in caches.drain() {
                        mailbox.pending_cache.entry(id).or_insert(value);
                    }
                }
                mailbox.busy = false;
            }
            batch.clear();
            caches.clear();
            self.spare = batch;
            self.spare_cache = caches;
            self.shared.drained.notify_all();
            match result {
                Ok(()) => {
                    self.backoff.succeeded();
                    self.shared.stats.succeeded();
                }
                Err(error) => {
                    self.con = None;
                    self.encoder.connection_lost();
                    self.shared.stats.failed(&error);
                    let wait = self.backoff.failed();
                    if stopping || self.sleep_unless_stopped(wait) {
                        let mut mailbox = lock(&self.shared.mailbox);
                        mailbox.pending.clear();
                        mailbox.pending_cache.clear();
                        drop(mailbox);
                        self.shared.drained.notify_all();
                        return;
                    }
                }
            }
        }
    }

    /// Sleeps `duration` unless asked to stop first; true when stopping.
    fn sleep_unless_stopped(&self, duration: Duration) -> bool {
        let mailbox = lock(&self.shared.mailbox);
        let (mailbox, _) = self
            .shared
            .wake
            .wait_timeout_while(mailbox, duration, |m| !m.stop)
            .unwrap_or_else(|p| p.into_inner());
        mailbox.stop
    }

    /// Writes one batch as one pipeline: the cache digests first, so that
    /// a record naming a digest's version never lands before it.
    fn write(
        &mut self,
        batch: &HashMap<Arc<str>, SinkOp>,
        caches: &HashMap<Arc<str>, Arc<[u8]>>,
    ) -> Result<(), Error> {
        if self.con.is_none() {
            self.con = Some(self.target.connect()?);
        }
        self.encoder.begin();
        for (id, value) in caches {
            self.encoder.push_cache(id, value);
        }
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

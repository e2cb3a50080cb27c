//! The hand-off between callers and the sink thread: at most one pending op
//! per engine (a newer one replaces the older), so it is bounded by the
//! number of engines, never by an outage's length.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};

use crate::lock;
use crate::ops::{AckLagObserver, SinkOp};
use crate::stats::{acknowledged, SinkStats};

/// What callers and the sink thread share.
pub(crate) struct Shared {
    pub(crate) mailbox: Mutex<Mailbox>,
    /// The sink thread waits here for work (and during backoff, for stop).
    pub(crate) wake: Condvar,
    /// `flush` waits here for an empty mailbox.
    pub(crate) drained: Condvar,
    pub(crate) stats: SinkStats,
    pub(crate) on_ack_lag: Option<AckLagObserver>,
}

/// The pending ops and the thread's state, under one lock.
#[derive(Default)]
pub(crate) struct Mailbox {
    pub(crate) pending: HashMap<Arc<str>, SinkOp>,
    /// Per engine, the latest cache digest value to write (a slot apart
    /// from the record's: a newer record must not replace a digest that
    /// it names). Written before the records of the same batch.
    pub(crate) pending_cache: HashMap<Arc<str>, Arc<[u8]>>,
    /// The thread sleeps on `wake` for work: only then is it worth a notify.
    pub(crate) waiting: bool,
    /// The thread holds a batch taken from `pending`.
    pub(crate) busy: bool,
    pub(crate) stop: bool,
}

/// A cheap handle to hand records to a [`crate::RedisSink`] from any thread.
#[derive(Clone)]
pub struct SinkHandle {
    pub(crate) shared: Arc<Shared>,
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

    /// Queues the cache digest value `value` (docs/FORMAT.md, "Cache
    /// residency") for `engine_id`'s `<prefix>cache:<id>` key, replacing
    /// a digest still pending for it. The sink writes it before any record
    /// queued after it, owner-checked
    /// ([`crate::SET_CACHE_IF_OWNER_SCRIPT`]); from then on every record it
    /// writes of the engine refreshes the digest key's expiry, and a delete
    /// of the engine deletes it too.
    pub fn send_cache(&self, engine_id: &Arc<str>, value: Arc<[u8]>) {
        let mut mailbox = lock(&self.shared.mailbox);
        if mailbox
            .pending_cache
            .insert(engine_id.clone(), value)
            .is_some()
        {
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

impl Mailbox {
    /// Nothing to write.
    pub(crate) fn is_empty(&self) -> bool {
        self.pending.is_empty() && self.pending_cache.is_empty()
    }
}

impl Shared {
    /// Counts the records whose heartbeat stamps are `sent` as written.
    pub(crate) fn acknowledged(&self, sent: &[u64]) {
        acknowledged(&self.stats, self.on_ack_lag.as_ref(), sent);
    }
}

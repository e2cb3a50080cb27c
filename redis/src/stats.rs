//! A sink's counters, readable from any thread.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use engine_state_shm_format::monotonic_ns;

use crate::lock;
use crate::ops::AckLagObserver;
use crate::schema::registry_key;
use crate::target::RedisTarget;

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
    /// Through `crate::log` (tracing where a subscriber is installed, else
    /// stderr). `target` prints with its password hidden; `reply` is the
    /// server's error text.
    pub(crate) fn registry_refused(&self, target: &RedisTarget, reply: &str) {
        if self.registry_errors.fetch_add(1, Ordering::Relaxed) == 0 {
            crate::log::warn(format_args!(
                "engine-state: Redis at {target}: the registry key {:?} is not a set ({reply}); \
                 engines written there are not registered, so readers will not find them. \
                 Delete that key, or give this fleet its own ?prefix= in the URI",
                registry_key(target.prefix())
            ));
        }
    }

    /// Records a failed connection attempt or write.
    pub(crate) fn failed(&self, error: &dyn std::fmt::Display) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        self.connected.store(false, Ordering::Relaxed);
        *lock(&self.last_error) = Some(error.to_string());
    }
}

/// Counts the records whose heartbeat stamps are `sent` as written and
/// reports their age to `on_ack_lag`.
pub(crate) fn acknowledged(stats: &SinkStats, on_ack_lag: Option<&AckLagObserver>, sent: &[u64]) {
    stats
        .written
        .fetch_add(sent.len() as u64, Ordering::Relaxed);
    if let Some(observe) = on_ack_lag {
        let acked = monotonic_ns();
        for heartbeat in sent {
            observe(Duration::from_nanos(acked.saturating_sub(*heartbeat)));
        }
    }
}

//! Clocks and process identity recorded in snapshots and headers, and
//! [`Clock`]: time passed in to the components that read it.

use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, OnceLock};

use nix::time::{clock_gettime, ClockId};

fn now_ns(clock: ClockId) -> u64 {
    // clock_gettime cannot fail for these two clock ids on Linux.
    let ts = clock_gettime(clock).expect("clock_gettime on a standard clock");
    (ts.tv_sec() as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec() as u64)
}

/// `CLOCK_MONOTONIC` in ns: same-host ages (`heartbeat_mono_ns`, `captured_mono_ns`).
#[inline]
pub fn monotonic_ns() -> u64 {
    now_ns(ClockId::CLOCK_MONOTONIC)
}

/// `CLOCK_REALTIME` in ns since the Unix epoch: display and cross-host use.
#[inline]
pub fn unix_ns() -> u64 {
    now_ns(ClockId::CLOCK_REALTIME)
}

/// Inode of this process's pid namespace (`/proc/self/ns/pid`), 0 when unknown.
///
/// A pid in a header is only meaningful to a reader in the same namespace.
pub fn pid_namespace() -> u64 {
    static NS: OnceLock<u64> = OnceLock::new();
    *NS.get_or_init(|| {
        std::fs::metadata("/proc/self/ns/pid")
            .map(|m| m.ino())
            .unwrap_or(0)
    })
}

/// A time source passed in: `CLOCK_MONOTONIC` (with the wall clock beside
/// it) in production, any nanosecond source in a test or a simulation, so
/// that tests advance time instead of sleeping. The one clock type of the
/// workspace: the router reads it once per decision (to age stored real
/// state, on the clock of `RealState::read_mono_ns`) and once per view or
/// advice; the publisher stamps snapshots and heartbeats with it, and its
/// keeper its recreated files.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
/// use engine_state_shm_format::Clock;
///
/// let now = Arc::new(AtomicU64::new(5));
/// let simulated = Clock::from_fn({
///     let now = Arc::clone(&now);
///     move || now.load(Ordering::Relaxed)
/// });
/// now.store(7, Ordering::Relaxed);
/// assert_eq!(simulated.now_ns(), 7);
/// ```
#[derive(Clone, Default)]
pub struct Clock {
    /// `None`: `CLOCK_MONOTONIC` ([`monotonic_ns`]).
    source: Option<Arc<dyn Fn() -> u64 + Send + Sync>>,
}

impl Clock {
    /// `CLOCK_MONOTONIC`, the clock writers stamp and readers age with (the default).
    pub fn monotonic() -> Clock {
        Clock { source: None }
    }

    /// Any source of nanoseconds standing in for `CLOCK_MONOTONIC` (a
    /// simulator's simulated time, a test's). It must never go backwards.
    pub fn from_fn(source: impl Fn() -> u64 + Send + Sync + 'static) -> Clock {
        Clock {
            source: Some(Arc::new(source)),
        }
    }

    /// The wall-clock time (Unix ns) for records a person reads alongside
    /// other logs: `Some` for the real clock, `None` for a clock given by
    /// [`Clock::from_fn`] (simulated time has no wall-clock counterpart).
    #[inline]
    pub fn unix_ns(&self) -> Option<u64> {
        self.source.is_none().then(unix_ns)
    }

    /// Now, in nanoseconds.
    #[inline]
    pub fn now_ns(&self) -> u64 {
        match &self.source {
            None => monotonic_ns(),
            Some(source) => source(),
        }
    }
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.source {
            None => "Clock::monotonic",
            Some(_) => "Clock::from_fn",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clocks_advance_and_namespace_is_known() {
        let (m0, u0) = (monotonic_ns(), unix_ns());
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(monotonic_ns() >= m0 + 2_000_000);
        assert!(unix_ns() > u0);
        assert!(
            u0 > 1_600_000_000_000_000_000,
            "realtime clock in ns since 1970"
        );
        assert_ne!(pid_namespace(), 0);
    }
}

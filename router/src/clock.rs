//! Where the router reads the time: `CLOCK_MONOTONIC` in production, any
//! nanosecond source in a simulation.

use std::fmt;
use std::sync::Arc;

/// The time source of a [`crate::Router`]: nanoseconds on the same clock as
/// [`crate::RealState::read_mono_ns`]. The router reads it once per decision
/// (to age stored real state) and once per view or advice; nothing else in
/// its decisions depends on time.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
/// use engine_state_router::Clock;
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
    /// `None`: `CLOCK_MONOTONIC` ([`engine_state_shm_format::monotonic_ns`]).
    source: Option<Arc<dyn Fn() -> u64 + Send + Sync>>,
}

impl Clock {
    /// `CLOCK_MONOTONIC`, the clock readers stamp `read_mono_ns` with (the default).
    pub fn monotonic() -> Clock {
        Clock { source: None }
    }

    /// Any source of nanoseconds on the clock the caller stamps `read_mono_ns`
    /// with (a simulator's simulated time). It must never go backwards.
    pub fn from_fn(source: impl Fn() -> u64 + Send + Sync + 'static) -> Clock {
        Clock {
            source: Some(Arc::new(source)),
        }
    }

    /// The wall-clock time (Unix ns) for records a person reads alongside
    /// other logs: `Some` for the real clock, `None` for a clock given by
    /// [`Clock::from_fn`] (simulated time has no wall-clock counterpart).
    pub fn unix_ns(&self) -> Option<u64> {
        self.source.is_none().then(engine_state_shm_format::unix_ns)
    }

    /// Now, in nanoseconds.
    #[inline]
    pub fn now_ns(&self) -> u64 {
        match &self.source {
            None => engine_state_shm_format::monotonic_ns(),
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

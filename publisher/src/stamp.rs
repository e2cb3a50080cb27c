//! What the publisher sets on every snapshot, whatever the caller passed:
//! the capture clocks and the idle flag (docs/FORMAT.md, "Snapshot words").

use engine_state_shm_format::{unix_ns, Clock, Snapshot};

/// Sets the capture clocks from `clock` and derives the idle flag from the
/// counts. `captured_unix_ns` (display only) is the wall clock's, also under
/// a clock given by `Clock::from_fn`, which has none.
#[inline]
pub(crate) fn stamp(mut snapshot: Snapshot, clock: &Clock) -> Snapshot {
    snapshot.captured_mono_ns = clock.now_ns();
    snapshot.captured_unix_ns = clock.unix_ns().unwrap_or_else(unix_ns);
    snapshot.set_idle_from_counts();
    snapshot
}

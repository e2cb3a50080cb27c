//! What the publisher sets on every snapshot, whatever the caller passed:
//! the capture clocks, the idle flag (docs/FORMAT.md, "Snapshot words") and
//! the cache digest's words, `cache_blocks` and `cache_version`, from the
//! last digest published (docs/FORMAT.md, "Cache residency").

use engine_state_shm_format::{unix_ns, Clock, Snapshot};

/// The snapshot words that name the engine's latest cache digest: what
/// [`crate::Publisher::publish_cache`] last wrote (both 0 until it is first
/// called: the engine publishes no digest).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CacheWords {
    /// Entries in the latest digest.
    pub(crate) blocks: u64,
    /// Its version (≥ 1 once one was published).
    pub(crate) version: u64,
}

/// Sets the capture clocks from `clock`, derives the idle flag from the
/// counts and names the latest digest (`cache`). `captured_unix_ns`
/// (display only) is the wall clock's, also under a clock given by
/// `Clock::from_fn`, which has none.
#[inline]
pub(crate) fn stamp(mut snapshot: Snapshot, clock: &Clock, cache: CacheWords) -> Snapshot {
    snapshot.captured_mono_ns = clock.now_ns();
    snapshot.captured_unix_ns = clock.unix_ns().unwrap_or_else(unix_ns);
    snapshot.cache_blocks = cache.blocks;
    snapshot.cache_version = cache.version;
    snapshot.set_idle_from_counts();
    snapshot
}

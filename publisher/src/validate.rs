//! What a snapshot must satisfy before it is published (docs/FORMAT.md,
//! "Snapshot words"): free KV blocks at most the total, and no flag bit layout
//! version 1 does not define. Two comparisons on the hot path; the message
//! is built only for a refused snapshot.

use engine_state_shm_format::{Snapshot, FLAG_IDLE, FLAG_SHUTTING_DOWN};

/// The flag bits of layout version 1; the others are reserved.
const KNOWN_FLAGS: u64 = FLAG_IDLE | FLAG_SHUTTING_DOWN;

/// Whether `snapshot` may be published.
#[inline]
pub(crate) fn is_valid(snapshot: &Snapshot) -> bool {
    snapshot.gpu_blocks_free <= snapshot.gpu_blocks_total && snapshot.flags & !KNOWN_FLAGS == 0
}

/// Which field of a refused `snapshot` is wrong, and what would be right.
#[cold]
pub(crate) fn what_is_wrong(snapshot: &Snapshot) -> String {
    if snapshot.gpu_blocks_free > snapshot.gpu_blocks_total {
        format!(
            "gpu_blocks_free ({}) is above gpu_blocks_total ({}); pass the usable KV blocks \
             of the pool as total and its free ones as free (free <= total)",
            snapshot.gpu_blocks_free, snapshot.gpu_blocks_total
        )
    } else {
        format!(
            "flags {:#x} has bits layout version 1 does not define ({:#x}); only \
             FLAG_IDLE (1) and FLAG_SHUTTING_DOWN (2) may be set",
            snapshot.flags,
            snapshot.flags & !KNOWN_FLAGS
        )
    }
}

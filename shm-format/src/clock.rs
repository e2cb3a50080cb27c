//! Clocks and process identity recorded in snapshots and headers.

use std::os::unix::fs::MetadataExt;
use std::sync::OnceLock;

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

//! The heartbeat policy: every threshold that says how often a writer
//! stamps its heartbeat and when a reader or relay considers it late. The
//! writer (shared memory and Redis), the reader and the node agent's relay
//! all take their numbers from here.
//!
//! - A writer publishes, and its heartbeat thread ticks, every publish
//!   period ([`DEFAULT_PUBLISH_PERIOD`] unless configured).
//! - A writer's heartbeat thread ticks every publish period and stores a
//!   stamp unless a publish stamped one less than [`skip_if_younger`] ago
//!   (a busy engine's publishes are its heartbeats).
//! - A relay writes a heartbeat alone only when it is at least
//!   [`relay_step`] newer than the one it relayed last (nine tenths of a
//!   period: an idle engine's every heartbeat, timers jitter; not one
//!   between two publishes of a busy engine).
//! - A reader suspects a writer's death after [`late_after`] without a
//!   heartbeat (two periods), and a relay looks for a replaced file after
//!   [`replaced_after`] (four relay steps).
//! - A heartbeat older than [`DEFAULT_STALE_AFTER`] makes the engine stale
//!   (the reader's default; a Redis key's default expiry is the same).

use std::time::Duration;

/// Default publish (and heartbeat) period: what a writer records in its
/// file's header unless configured (`WriterOptions::default`; the settings
/// crate's `DEFAULT_PERIOD_MS` is this, in the unit of its variable).
pub const DEFAULT_PUBLISH_PERIOD: Duration = Duration::from_millis(50);

/// Default `stale_after`: a heartbeat older than this is stale
/// (docs/FORMAT.md, "Liveness and staleness").
pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(2);

/// A writer's heartbeat thread leaves alone a stamp younger than this: one
/// publish period.
pub fn skip_if_younger(period: Duration) -> Duration {
    period
}

/// The smallest heartbeat advance a relay forwards on its own (without a new
/// snapshot): nine tenths of the publish period.
pub fn relay_step(period: Duration) -> Duration {
    Duration::from_nanos(period.as_nanos() as u64 / 10 * 9)
}

/// How long without a heartbeat before a reader suspects the writer (and
/// checks that its process still lives): two publish periods, at least
/// `floor`.
pub fn late_after(period: Duration, floor: Duration) -> Duration {
    (2 * period).max(floor)
}

/// How long without a heartbeat before a polling reader checks whether the
/// file was replaced by a restarted engine's: four of its polling steps.
pub fn replaced_after(step: Duration) -> Duration {
    step.saturating_mul(4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_of_a_50_ms_period() {
        let period = Duration::from_millis(50);
        assert_eq!(relay_step(period), Duration::from_millis(45));
        assert_eq!(
            late_after(period, Duration::from_millis(10)),
            Duration::from_millis(100)
        );
        assert_eq!(
            late_after(Duration::from_millis(1), Duration::from_millis(10)),
            Duration::from_millis(10)
        );
        assert_eq!(
            replaced_after(relay_step(period)),
            Duration::from_millis(180)
        );
    }

    /// What the policy needs of `skip_if_younger`, for any period: a busy
    /// engine's stamps are left to its publishes (one each period, so the
    /// thread skips a stamp younger than that), an idle engine's stamp is
    /// never late (skipped, then stored on the next tick, one period later),
    /// and a relay forwards every stamp the thread stores.
    #[test]
    fn skipping_young_stamps_leaves_no_live_writer_late() {
        for ms in [1, 10, 50, 100, 1000, 60_000] {
            let period = Duration::from_millis(ms);
            let skip = skip_if_younger(period);
            assert!(
                skip >= period,
                "{ms} ms: a busy engine's publishes would get extra stamps"
            );
            assert!(
                skip + period <= late_after(period, Duration::ZERO),
                "{ms} ms: an idle writer's stamp, skipped then stored a tick later, is late"
            );
            assert!(
                relay_step(period) <= skip,
                "{ms} ms: a relay would drop some of an idle engine's heartbeats"
            );
        }
    }
}

//! The staleness rule of DESIGN §6. Every backend calls [`Freshness::classify`];
//! the rule lives nowhere else.

use std::fmt;
use std::time::Duration;

use serde::Serialize;

/// Default `stale_after`: heartbeat older than this is stale.
pub const DEFAULT_STALE_AFTER: Duration =
    Duration::from_millis(engine_state_settings::DEFAULT_STALE_AFTER_MS);
/// Default `max_capture_age`: a busy engine's capture older than this is stale.
pub const DEFAULT_MAX_CAPTURE_AGE: Duration = Duration::from_secs(30);

/// Whether an engine's state may be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Alive and recent: enters the `max(shadow, real)` merge.
    Fresh,
    /// Heartbeat or capture too old (or the writer is unreachable).
    Stale,
    /// The writer process is gone, or the file was retired.
    Dead,
    /// No consistent copy within the seqlock's retry bound, or the file was
    /// truncated under the reader's mapping.
    Torn,
}

impl Status {
    /// The lowercase name used in JSON, tables and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Fresh => "fresh",
            Status::Stale => "stale",
            Status::Dead => "dead",
            Status::Torn => "torn",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a backend observed about one engine.
#[derive(Clone, Copy, Debug, Default)]
pub struct Observation {
    /// The seqlock could not be read consistently.
    pub torn: bool,
    /// The writer retired its file (or its key says so).
    pub retired: bool,
    /// `Some(false)` when the writer process is known to be gone; `None` when
    /// that cannot be known (another pid namespace, another host).
    pub writer_alive: Option<bool>,
    /// Time since the last heartbeat.
    pub heartbeat_age: Duration,
    /// Time since the snapshot was captured.
    pub capture_age: Duration,
    /// The snapshot has the idle flag.
    pub idle: bool,
}

/// The thresholds of the staleness rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Freshness {
    /// Heartbeat older than this → stale (default 2 s).
    pub stale_after: Duration,
    /// Capture older than this while not idle → stale (default 30 s).
    pub max_capture_age: Duration,
}

impl Default for Freshness {
    fn default() -> Self {
        Freshness {
            stale_after: DEFAULT_STALE_AFTER,
            max_capture_age: DEFAULT_MAX_CAPTURE_AGE,
        }
    }
}

impl Freshness {
    /// The status of an engine given what was observed (DESIGN §6).
    #[inline]
    pub fn classify(&self, obs: &Observation) -> Status {
        if obs.torn {
            Status::Torn
        } else if obs.retired || obs.writer_alive == Some(false) {
            Status::Dead
        } else if obs.heartbeat_age > self.stale_after
            || (obs.capture_age > self.max_capture_age && !obs.idle)
        {
            Status::Stale
        } else {
            Status::Fresh
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(hb_ms: u64, cap_ms: u64) -> Observation {
        Observation {
            heartbeat_age: Duration::from_millis(hb_ms),
            capture_age: Duration::from_millis(cap_ms),
            writer_alive: Some(true),
            ..Observation::default()
        }
    }

    #[test]
    fn design_rule() {
        let f = Freshness::default();
        assert_eq!(f.classify(&obs(10, 10)), Status::Fresh);
        assert_eq!(
            f.classify(&obs(2000, 10)),
            Status::Fresh,
            "boundary is inclusive"
        );
        assert_eq!(f.classify(&obs(2001, 10)), Status::Stale);
        assert_eq!(
            f.classify(&obs(10, 30_001)),
            Status::Stale,
            "busy engine, old capture"
        );
        let idle = Observation {
            idle: true,
            ..obs(10, 600_000)
        };
        assert_eq!(
            f.classify(&idle),
            Status::Fresh,
            "idle engines are captured rarely"
        );
        let idle_no_heartbeat = Observation {
            idle: true,
            ..obs(5000, 10)
        };
        assert_eq!(f.classify(&idle_no_heartbeat), Status::Stale);
    }

    #[test]
    fn dead_and_torn_win() {
        let f = Freshness::default();
        assert_eq!(
            f.classify(&Observation {
                retired: true,
                ..obs(1, 1)
            }),
            Status::Dead
        );
        assert_eq!(
            f.classify(&Observation {
                writer_alive: Some(false),
                ..obs(1, 1)
            }),
            Status::Dead
        );
        assert_eq!(
            f.classify(&Observation {
                writer_alive: None,
                ..obs(1, 1)
            }),
            Status::Fresh
        );
        assert_eq!(
            f.classify(&Observation {
                torn: true,
                retired: true,
                ..obs(1, 1)
            }),
            Status::Torn
        );
    }

    #[test]
    fn thresholds_are_settings() {
        let f = Freshness {
            stale_after: Duration::from_millis(100),
            max_capture_age: Duration::from_millis(500),
        };
        assert_eq!(f.classify(&obs(150, 10)), Status::Stale);
        assert_eq!(f.classify(&obs(50, 600)), Status::Stale);
        assert_eq!(f.classify(&obs(50, 400)), Status::Fresh);
    }
}

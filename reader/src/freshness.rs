//! The staleness rule (docs/FORMAT.md, "Liveness and staleness"):
//! `Freshness::classify`, which only the judge (`judge.rs`) calls, and
//! [`heartbeat_recent`], its heartbeat half, which the router applies again
//! at decision time. The rule lives nowhere else.

use std::fmt;
use std::time::Duration;

use serde::Serialize;

/// Default `stale_after`: heartbeat older than this is stale (the heartbeat
/// policy's number).
pub use engine_state_shm_format::heartbeat::DEFAULT_STALE_AFTER;
/// Default `max_capture_age`: a busy engine's capture older than this is stale.
pub const DEFAULT_MAX_CAPTURE_AGE: Duration = Duration::from_secs(30);

/// What a writer's stamp may be ahead of a reader's `now` beyond one period
/// ([`max_ahead`]). A reader takes one clock reading per read (or scan of
/// every engine) and loads the stamps after it, so a live writer that stamps
/// meanwhile is legitimately ahead by up to the time the read took: a scan
/// of a thousand engines (~0.1 ms), a directory listing that opens new files
/// (milliseconds), and a reader preempted on a loaded host (tens to hundreds
/// of ms). One second covers all of them several times over; a reader
/// preempted for longer reads engines stamped meanwhile as not fresh for
/// that one read, the safe side.
pub const CLOCK_AHEAD_SLACK: Duration = Duration::from_secs(1);

/// The most a stamp of a writer with this publish period may be ahead of a
/// reader's `now`: one period plus [`CLOCK_AHEAD_SLACK`]. The period comes
/// from the file's header, which anyone who can write the directory can
/// forge, so it counts as at most [`CLOCK_AHEAD_SLACK`]: the bound is 1 to
/// 2 s whatever the header says. A stamp further ahead is not a clock this
/// reader shares (a writer in another time namespace, a forged file): its
/// age cannot be told, and reading it as 0 would keep the engine fresh for
/// as long as the stamp is ahead (forever at 2^64 - 1).
pub fn max_ahead(period: Duration) -> Duration {
    period.min(CLOCK_AHEAD_SLACK) + CLOCK_AHEAD_SLACK
}

/// Which of a writer's two stamps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stamp {
    /// `heartbeat_mono_ns`.
    Heartbeat,
    /// The snapshot's `captured_mono_ns`.
    Capture,
}

impl Stamp {
    /// The field's name in docs/FORMAT.md.
    pub fn field(self) -> &'static str {
        match self {
            Stamp::Heartbeat => "heartbeat_mono_ns",
            Stamp::Capture => "captured_mono_ns",
        }
    }
}

/// A writer's stamp more than [`max_ahead`] ahead of the reader's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClockAhead {
    /// The stamp (the heartbeat's when both are ahead).
    pub stamp: Stamp,
    /// How far ahead of the reader's `now` it is.
    pub ahead: Duration,
    /// The bound it exceeds ([`max_ahead`] of the writer's period).
    pub limit: Duration,
}

impl ClockAhead {
    /// The stamp (the heartbeat first) more than `max_ahead_ns` ahead of
    /// `now`, if any: the details of [`Ages::clock_ahead`], for the error
    /// (not on the read path).
    #[cold]
    pub fn of(
        now: u64,
        heartbeat_mono_ns: u64,
        captured_mono_ns: u64,
        max_ahead_ns: u64,
    ) -> Option<ClockAhead> {
        [
            (Stamp::Heartbeat, heartbeat_mono_ns),
            (Stamp::Capture, captured_mono_ns),
        ]
        .into_iter()
        .map(|(stamp, at)| (stamp, at.saturating_sub(now)))
        .find(|&(_, ahead)| ahead > max_ahead_ns)
        .map(|(stamp, ahead)| ClockAhead {
            stamp,
            ahead: Duration::from_nanos(ahead),
            limit: Duration::from_nanos(max_ahead_ns),
        })
    }
}

/// A writer's stamps measured against a reader's `now` (docs/FORMAT.md,
/// "Liveness and staleness"): the ages, floored at 0, and whether a stamp
/// is too far ahead to be believed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ages {
    /// `now - heartbeat_mono_ns`, floored at 0.
    pub heartbeat_age: Duration,
    /// `now - captured_mono_ns`, floored at 0.
    pub capture_age: Duration,
    /// A stamp is more than the bound ahead of `now` (which one, and by how
    /// much: [`ClockAhead::of`]): the engine is never fresh.
    pub clock_ahead: bool,
}

impl Ages {
    /// The ages at `now` of a writer's stamps, with `max_ahead_ns` its
    /// [`max_ahead`] in ns (computed once per file: this runs per read).
    #[inline]
    pub fn at(now: u64, heartbeat_mono_ns: u64, captured_mono_ns: u64, max_ahead_ns: u64) -> Ages {
        Ages {
            heartbeat_age: Duration::from_nanos(now.saturating_sub(heartbeat_mono_ns)),
            capture_age: Duration::from_nanos(now.saturating_sub(captured_mono_ns)),
            clock_ahead: heartbeat_mono_ns.saturating_sub(now) > max_ahead_ns
                || captured_mono_ns.saturating_sub(now) > max_ahead_ns,
        }
    }
}

/// Whether an engine's state may be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Alive and recent: enters the `max(shadow, real)` merge.
    Fresh,
    /// Heartbeat or capture too old (or the writer is unreachable), or a
    /// stamp too far ahead of the reader's clock to tell its age
    /// ([`ClockAhead`], also one of the read's errors).
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

/// What the judge (`judge.rs`) measured of one engine: the rule's input.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Evidence {
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
    /// A stamp of the writer is more than [`max_ahead`] ahead of the
    /// reader's clock ([`Ages::clock_ahead`]): its ages cannot be told.
    pub clock_ahead: bool,
}

/// The heartbeat half of the rule: a heartbeat `age` old is recent under
/// `stale_after` (the bound is inclusive: exactly `stale_after` old is
/// recent). The judge's `Freshness::classify` applies it at read time; the router
/// applies it once more at decision time, with its own threshold
/// (`real_state_expiry_s`), to a reading's heartbeat age plus the time
/// since the reading (docs/ARCHITECTURE.md, "Multi-node and routing").
#[inline]
pub fn heartbeat_recent(age: Duration, stale_after: Duration) -> bool {
    age <= stale_after
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
    /// The status of an engine given what was measured of it
    /// (docs/FORMAT.md, "Liveness and staleness").
    #[inline]
    pub(crate) fn classify(&self, obs: &Evidence) -> Status {
        if obs.torn {
            Status::Torn
        } else if obs.retired || obs.writer_alive == Some(false) {
            Status::Dead
        } else if obs.clock_ahead
            || !heartbeat_recent(obs.heartbeat_age, self.stale_after)
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

    fn obs(hb_ms: u64, cap_ms: u64) -> Evidence {
        Evidence {
            heartbeat_age: Duration::from_millis(hb_ms),
            capture_age: Duration::from_millis(cap_ms),
            writer_alive: Some(true),
            ..Evidence::default()
        }
    }

    #[test]
    fn fresh_and_stale_at_the_default_thresholds() {
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
        let idle = Evidence {
            idle: true,
            ..obs(10, 600_000)
        };
        assert_eq!(
            f.classify(&idle),
            Status::Fresh,
            "idle engines are captured rarely"
        );
        let idle_no_heartbeat = Evidence {
            idle: true,
            ..obs(5000, 10)
        };
        assert_eq!(f.classify(&idle_no_heartbeat), Status::Stale);
    }

    #[test]
    fn dead_and_torn_win() {
        let f = Freshness::default();
        assert_eq!(
            f.classify(&Evidence {
                retired: true,
                ..obs(1, 1)
            }),
            Status::Dead
        );
        assert_eq!(
            f.classify(&Evidence {
                writer_alive: Some(false),
                ..obs(1, 1)
            }),
            Status::Dead
        );
        assert_eq!(
            f.classify(&Evidence {
                writer_alive: None,
                ..obs(1, 1)
            }),
            Status::Fresh
        );
        assert_eq!(
            f.classify(&Evidence {
                torn: true,
                retired: true,
                ..obs(1, 1)
            }),
            Status::Torn
        );
    }

    #[test]
    fn a_stamp_ahead_of_the_clock_is_never_fresh() {
        let f = Freshness::default();
        let period = Duration::from_millis(50);
        let limit = max_ahead(period).as_nanos() as u64;
        assert_eq!(limit, 1_050_000_000, "one period plus the slack");
        let forged = max_ahead(Duration::from_secs(4000));
        assert_eq!(
            forged,
            Duration::from_secs(2),
            "a forged period cannot widen it"
        );
        let now = 10_000_000_000_000;
        let hour = 3_600_000_000_000;
        // Within the bound: a writer that stamped after the reader's clock read.
        let ages = Ages::at(now, now + limit, now + limit, limit);
        assert!(!ages.clock_ahead);
        assert_eq!(ClockAhead::of(now, now + limit, now + limit, limit), None);
        assert_eq!(
            (ages.heartbeat_age, ages.capture_age),
            (Duration::ZERO, Duration::ZERO)
        );
        for (heartbeat, capture, stamp) in [
            (now + limit + 1, now, Stamp::Heartbeat),
            (now + hour, now + hour, Stamp::Heartbeat),
            (u64::MAX, u64::MAX, Stamp::Heartbeat),
            (now, now + hour, Stamp::Capture),
            (now, u64::MAX, Stamp::Capture),
        ] {
            let ages = Ages::at(now, heartbeat, capture, limit);
            assert!(ages.clock_ahead);
            let ahead = ClockAhead::of(now, heartbeat, capture, limit).expect("ahead");
            assert_eq!(ahead.stamp, stamp);
            assert_eq!(ahead.limit, Duration::from_nanos(limit));
            let observation = Evidence {
                clock_ahead: true,
                idle: true,
                heartbeat_age: ages.heartbeat_age,
                capture_age: ages.capture_age,
                ..obs(0, 0)
            };
            assert_eq!(
                f.classify(&observation),
                Status::Stale,
                "{heartbeat} {capture}"
            );
            // Dead and torn still win.
            let dead = Evidence {
                writer_alive: Some(false),
                ..observation
            };
            assert_eq!(f.classify(&dead), Status::Dead);
        }
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

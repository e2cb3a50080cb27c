//! The one judge: what a reader observed of one engine becomes that engine's
//! [`EngineState`] (its ages, its status, the writer's stamps) for every
//! source: a shared-memory file (`shm_dir/entry.rs`), a Redis record
//! (`redis_fetch.rs`) and the simulator's feed (`engine-state-sim`). Each
//! source only observes; [`judge`] measures the ages and applies the
//! staleness rule ([`Freshness::classify`], docs/FORMAT.md "Liveness and
//! staleness"), and nothing else assembles an [`EngineState`].

use std::sync::Arc;
use std::time::Duration;

use engine_state_shm_format::Snapshot;

use crate::freshness::{Ages, Evidence, Freshness};
use crate::state::{EngineState, Writer};

/// How the ages of a writer's stamps are measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clocks {
    /// The writer stamps with this reader's `CLOCK_MONOTONIC` (a
    /// shared-memory file, the simulator): each age is the reader's `now`
    /// minus the stamp, floored at 0, and a stamp more than `max_ahead_ns`
    /// ([`crate::max_ahead`] of the writer's period) ahead of `now` is not
    /// believed ([`Ages::at`]).
    Shared {
        /// [`crate::max_ahead`] of the writer's period, in ns.
        max_ahead_ns: u64,
    },
    /// The writer's clock is another host's (a Redis record): the
    /// heartbeat's age was measured without it (the server's TTL,
    /// docs/REDIS.md "Staleness without comparing clocks of different
    /// hosts"), and the capture's is that plus the writer's own gap between
    /// its heartbeat and capture stamps (floored at 0). No stamp is compared
    /// with this reader's clock, so none is ever ahead of it.
    Separate {
        /// The heartbeat's age as measured.
        heartbeat_age: Duration,
    },
}

/// What a reader saw of one engine, before it is judged.
///
/// The snapshot is borrowed: the judge copies it once, into the state (a
/// by-value field cost the shared-memory read path a second 128-byte copy,
/// ~35 instructions an engine).
#[derive(Clone, Debug, PartialEq)]
pub struct Observation<'a> {
    /// The engine id (file name, key suffix).
    pub engine_id: Arc<str>,
    /// The snapshot read (all zero when `torn`, or when there is none).
    pub snapshot: &'a Snapshot,
    /// The writer's header facts and heartbeat stamp, as read.
    pub writer: Writer,
    /// The generation of the writer's file or key.
    pub generation: u64,
    /// No consistent copy within the seqlock's retry bound, or the file was
    /// truncated under the mapping.
    pub torn: bool,
    /// The writer retired its file (or its record says so).
    pub retired: bool,
    /// `Some(false)` when the writer process is known to be gone; `None` when
    /// that cannot be known (another pid namespace, another host).
    pub writer_alive: Option<bool>,
    /// How the stamps' ages are measured.
    pub clocks: Clocks,
}

/// The state of the engine `observation` saw, as of the reader's
/// `now_mono_ns` (`CLOCK_MONOTONIC`; the state's `read_mono_ns`), judged
/// with `freshness`.
///
/// The idle flag is read here, once, from the snapshot (it spares an idle
/// engine's old capture). The snapshot is passed on verbatim: in
/// particular more free than total KV blocks is not judged here (writers
/// refuse it; readers derive `gpu_kv_used_frac` from `min(free, total)`,
/// docs/FORMAT.md "Snapshot words", in `Snapshot::gpu_kv_used_frac` alone). A stamp too far ahead of `now_mono_ns` makes the
/// engine stale and sets [`EngineState::clock_ahead`] (the shared-memory
/// source also reports it as a per-engine error, `Error::ClockAhead`).
#[inline]
pub fn judge(observation: Observation<'_>, now_mono_ns: u64, freshness: &Freshness) -> EngineState {
    let Observation {
        engine_id,
        snapshot,
        writer,
        generation,
        torn,
        retired,
        writer_alive,
        clocks,
    } = observation;
    let (heartbeat_age, capture_age, clock_ahead) = match clocks {
        Clocks::Shared { max_ahead_ns } => {
            let ages = Ages::at(
                now_mono_ns,
                writer.heartbeat_mono_ns,
                snapshot.captured_mono_ns,
                max_ahead_ns,
            );
            (ages.heartbeat_age, ages.capture_age, ages.clock_ahead)
        }
        Clocks::Separate { heartbeat_age } => {
            let gap = writer
                .heartbeat_mono_ns
                .saturating_sub(snapshot.captured_mono_ns);
            (
                heartbeat_age,
                heartbeat_age + Duration::from_nanos(gap),
                false,
            )
        }
    };
    let status = freshness.classify(&Evidence {
        torn,
        retired,
        writer_alive,
        heartbeat_age,
        capture_age,
        idle: snapshot.is_idle(),
        clock_ahead,
    });
    EngineState {
        engine_id,
        status,
        snapshot: *snapshot,
        heartbeat_age,
        capture_age,
        generation,
        read_mono_ns: now_mono_ns,
        writer,
        clock_ahead,
        cache: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::freshness::{max_ahead, Status};

    fn snapshot(captured_mono_ns: u64) -> Snapshot {
        Snapshot {
            captured_mono_ns,
            num_running: 1,
            ..Snapshot::default()
        }
    }

    fn observed(heartbeat_mono_ns: u64, snapshot: &Snapshot, clocks: Clocks) -> Observation<'_> {
        Observation {
            engine_id: "e".into(),
            snapshot,
            writer: Writer {
                pid: 42,
                publish_period_us: 50_000,
                created_unix_ns: 7,
                heartbeat_mono_ns,
            },
            generation: 3,
            torn: false,
            retired: false,
            writer_alive: Some(true),
            clocks,
        }
    }

    const S: u64 = 1_000_000_000;

    #[test]
    fn shared_clocks_age_both_stamps_from_now() {
        let shared = Clocks::Shared {
            max_ahead_ns: max_ahead(Duration::from_millis(50)).as_nanos() as u64,
        };
        let f = Freshness::default();
        let state = judge(observed(99 * S, &snapshot(90 * S), shared), 100 * S, &f);
        assert_eq!(state.heartbeat_age, Duration::from_secs(1));
        assert_eq!(state.capture_age, Duration::from_secs(10));
        assert_eq!(state.status, Status::Fresh);
        assert!(!state.clock_ahead);
        // Everything observed is carried: the relay forwards the writer's stamps.
        assert_eq!(
            (
                state.writer.heartbeat_mono_ns,
                state.writer.pid,
                state.generation
            ),
            (99 * S, 42, 3)
        );
        assert_eq!(state.read_mono_ns, 100 * S);
        // An hour ahead: no age, never fresh, and said so.
        let ahead = judge(
            observed(100 * S + 3600 * S, &snapshot(90 * S), shared),
            100 * S,
            &f,
        );
        assert_eq!(ahead.status, Status::Stale);
        assert!(ahead.clock_ahead);
        assert_eq!(ahead.heartbeat_age, Duration::ZERO);
    }

    #[test]
    fn separate_clocks_add_the_writers_own_gap_and_are_never_ahead() {
        let separate = Clocks::Separate {
            heartbeat_age: Duration::from_millis(500),
        };
        let f = Freshness::default();
        // The writer's stamps are far ahead of this reader's `now`: another host.
        let state = judge(observed(5000 * S, &snapshot(4990 * S), separate), S, &f);
        assert_eq!(state.heartbeat_age, Duration::from_millis(500));
        assert_eq!(state.capture_age, Duration::from_millis(10_500));
        assert_eq!(state.status, Status::Fresh);
        assert!(!state.clock_ahead);
        // A capture after the heartbeat (writer's clock): no negative gap.
        let later = judge(observed(10 * S, &snapshot(11 * S), separate), S, &f);
        assert_eq!(later.capture_age, Duration::from_millis(500));
    }

    /// free > total is decided in one place on the reader's side, the used
    /// fraction: the judge neither rejects nor alters such a snapshot.
    #[test]
    fn more_free_than_total_blocks_is_passed_on_not_judged() {
        let shared = Clocks::Shared {
            max_ahead_ns: 2 * S,
        };
        let forged = Snapshot {
            gpu_blocks_total: 6,
            gpu_blocks_free: 7,
            ..snapshot(100 * S)
        };
        let state = judge(
            observed(100 * S, &forged, shared),
            100 * S,
            &Freshness::default(),
        );
        assert_eq!(state.status, Status::Fresh);
        assert_eq!(state.snapshot, forged);
        assert_eq!(state.gpu_kv_used_frac(), Some(0.0));
    }

    #[test]
    fn the_idle_flag_is_read_from_the_snapshot() {
        let shared = Clocks::Shared {
            max_ahead_ns: 2 * S,
        };
        let f = Freshness::default();
        let busy = snapshot(0);
        assert_eq!(
            judge(observed(100 * S, &busy, shared), 100 * S, &f).status,
            Status::Stale
        );
        let idle = Snapshot {
            flags: engine_state_shm_format::FLAG_IDLE,
            ..busy
        };
        assert_eq!(
            judge(observed(100 * S, &idle, shared), 100 * S, &f).status,
            Status::Fresh
        );
    }
}

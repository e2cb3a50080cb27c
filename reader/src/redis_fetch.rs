//! One fetched Redis record judged: its ages and its status by the staleness
//! rule. Pure (no connection): the reader's Redis source calls it on every
//! read, and so can a program that fetches the key with its own Redis client
//! (docs/FORMAT.md, "Reading a record"; the golden vectors in
//! `format/vectors/redis` go through it) after
//! `engine_state_redis::decode_fetched` and `heartbeat_age_at_fetch`.

use std::sync::Arc;
use std::time::Duration;

use engine_state_redis::RedisRecord;
use engine_state_shm_format::Snapshot;

use crate::freshness::{Freshness, Observation};
use crate::state::EngineState;

/// The state of `engine_id` from its record (`None`: the key expired before
/// a record was seen), the heartbeat's age, and whether the key expired on
/// the server's clock (the writer is gone; while the key exists, whether the
/// writer lives cannot be known from here). `read_mono_ns`: when it was read.
pub fn record_state(
    engine_id: Arc<str>,
    record: Option<&RedisRecord>,
    heartbeat_age: Duration,
    expired: bool,
    freshness: &Freshness,
    read_mono_ns: u64,
) -> EngineState {
    let snapshot = record.map_or(Snapshot::default(), |r| r.snapshot);
    let capture_age = heartbeat_age
        + Duration::from_nanos(record.map_or(0, |r| {
            r.heartbeat_mono_ns
                .saturating_sub(snapshot.captured_mono_ns)
        }));
    let observation = Observation {
        torn: false,
        retired: record.is_some_and(RedisRecord::is_retired),
        writer_alive: if expired { Some(false) } else { None },
        heartbeat_age,
        capture_age,
        idle: snapshot.is_idle(),
    };
    EngineState {
        engine_id,
        status: freshness.classify(&observation),
        snapshot,
        heartbeat_age,
        capture_age,
        generation: record.map_or(0, |r| r.generation),
        read_mono_ns,
    }
}

#[cfg(test)]
mod tests {
    use engine_state_redis::heartbeat_age_at_fetch;

    use super::*;
    use crate::freshness::Status;

    #[test]
    fn capture_age_adds_the_writers_gap_and_an_expired_key_is_dead() {
        let r = RedisRecord {
            state: engine_state_redis::STATE_ACTIVE,
            ttl_ms: 2000,
            write_delay_us: 250,
            heartbeat_mono_ns: 10_000_000_000,
            snapshot: Snapshot {
                captured_mono_ns: 9_000_000_000,
                ..Snapshot::default()
            },
            ..RedisRecord::default()
        };
        let age = heartbeat_age_at_fetch(&r, 1500);
        let state = record_state("e".into(), Some(&r), age, false, &Freshness::default(), 0);
        assert_eq!(state.capture_age, age + Duration::from_secs(1));
        assert_eq!(state.status, Status::Fresh);
        let gone = record_state("e".into(), Some(&r), age, true, &Freshness::default(), 0);
        assert_eq!(gone.status, Status::Dead);
    }
}

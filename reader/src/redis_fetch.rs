//! One fetched Redis record observed, for the judge (`judge.rs`: its ages
//! and its status by the staleness rule). Pure (no connection): the reader's Redis source calls it on every
//! read, and so can a program that fetches the key with its own Redis client
//! (docs/FORMAT.md, "Reading a record"; the golden vectors in
//! `format/vectors/redis` go through it): [`state_at_fetch`] judges one
//! fetch, `PTTL` −2 included; [`record_state`] judges a record already
//! decoded by `engine_state_redis::decode_fetched` and `heartbeat_age_at_fetch`.

use std::sync::Arc;
use std::time::Duration;

use engine_state_redis::{decode_fetched, heartbeat_age_at_fetch, RedisRecord};
use engine_state_shm_format::Snapshot;

use crate::freshness::Freshness;
use crate::judge::{judge, Clocks, Observation};
use crate::state::{EngineState, Writer};

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
    // A key that expired before a record was seen has no snapshot.
    let none = Snapshot::default();
    let observation = Observation {
        engine_id,
        snapshot: record.map_or(&none, |r| &r.snapshot),
        writer: record.map_or(Writer::default(), |r| Writer {
            pid: r.writer_pid,
            publish_period_us: r.publish_period_us,
            created_unix_ns: 0,
            heartbeat_mono_ns: r.heartbeat_mono_ns,
        }),
        generation: record.map_or(0, |r| r.generation),
        torn: false,
        retired: record.is_some_and(RedisRecord::is_retired),
        writer_alive: if expired { Some(false) } else { None },
        // Ages come from the server's TTL, not from this host's clock.
        clocks: Clocks::Separate { heartbeat_age },
    };
    judge(observation, read_mono_ns, freshness)
}

/// The state of `engine_id` from one fetch of its key `key`: `value` the
/// `GETRANGE` (or `GET`) reply (empty for nil), `pttl_ms` the `PTTL` reply of
/// the same fetch. `PTTL` −2 (no such key: it expired on the server's clock,
/// possibly between the two commands) is a dead engine with no snapshot,
/// whatever the value; otherwise the value must be a record whose key
/// expires as its record says (`decode_fetched`). The Go package's
/// `StateAtFetch` does the same.
pub fn state_at_fetch(
    engine_id: Arc<str>,
    key: &str,
    value: &[u8],
    pttl_ms: i64,
    freshness: &Freshness,
    read_mono_ns: u64,
) -> Result<EngineState, engine_state_redis::Error> {
    if pttl_ms == -2 {
        let age = freshness.stale_after;
        return Ok(record_state(
            engine_id,
            None,
            age,
            true,
            freshness,
            read_mono_ns,
        ));
    }
    let record = decode_fetched(key, value, pttl_ms)?;
    let age = heartbeat_age_at_fetch(&record, pttl_ms);
    Ok(record_state(
        engine_id,
        Some(&record),
        age,
        false,
        freshness,
        read_mono_ns,
    ))
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn a_key_gone_between_get_and_pttl_is_a_dead_engine_with_no_snapshot() {
        let r = RedisRecord {
            state: engine_state_redis::STATE_ACTIVE,
            ttl_ms: 2000,
            snapshot: Snapshot {
                num_running: 7,
                ..Snapshot::default()
            },
            ..RedisRecord::default()
        };
        let f = Freshness::default();
        for value in [Vec::new(), r.encode().to_vec()] {
            let state = state_at_fetch("e".into(), "k", &value, -2, &f, 5).unwrap();
            assert_eq!(state.status, Status::Dead);
            assert_eq!(state.snapshot, Snapshot::default());
            assert_eq!((state.generation, state.read_mono_ns), (0, 5));
        }
        let live = state_at_fetch("e".into(), "k", &r.encode(), 1500, &f, 0).unwrap();
        assert_eq!((live.status, live.snapshot.num_running), (Status::Fresh, 7));
        assert!(state_at_fetch("e".into(), "k", &[], 1500, &f, 0).is_err());
    }
}

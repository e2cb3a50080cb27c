//! One fetch of one engine's Redis key, judged: the record checked against
//! its key's expiry, its ages, its status. Pure (no connection): the
//! [`crate::RedisSource`] calls it on every fetch, and so can a program that
//! fetches the key with its own Redis client (docs/FORMAT.md, "Reading a
//! record"; the golden vectors in `format/vectors/redis` go through it).
//!
//! A fetch is `GETRANGE key 0 192` (or `GET`) and `PTTL key`, in one round
//! trip. `PTTL` -2 (no such key) means the key expired on the server's clock:
//! the engine is dead; that case has no record and is the caller's.

use std::sync::Arc;
use std::time::Duration;

use engine_state_shm_format::Snapshot;

use crate::error::Error;
use crate::freshness::{Freshness, Observation};
use crate::redis_schema::RedisRecord;
use crate::state::EngineState;

/// The record of `key` as one fetch returned it together with the key's
/// `PTTL` (ms): decoded ([`RedisRecord::decode`]) and checked against the
/// key's expiry.
///
/// A record's age is `ttl_ms - PTTL`; that only holds for a key written with
/// `SET ... PX ttl_ms`. A key without expiry (`PTTL` -1: `PERSIST`, a plain
/// `SET`, a copy) or with a longer one than its record says would read as
/// "written just now" forever: [`Error::NoExpiry`] instead.
pub fn decode_fetched(key: &str, bytes: &[u8], pttl_ms: i64) -> Result<RedisRecord, Error> {
    let record = RedisRecord::decode(key, bytes)?;
    let what = if pttl_ms < 0 {
        "the key has no expiry (PTTL -1; PERSISTed, copied or written without PX)".to_owned()
    } else if pttl_ms as u64 > u64::from(record.ttl_ms) {
        format!(
            "the key expires in {pttl_ms} ms but its record says it was written with PX {} \
             (re-expired or written by hand)",
            record.ttl_ms
        )
    } else {
        return Ok(record);
    };
    Err(Error::NoExpiry {
        key: key.to_owned(),
        what,
    })
}

/// Time from the record's heartbeat to the fetch that returned it with
/// `pttl_ms` (as accepted by [`decode_fetched`]): the time since the write by
/// the server's clock (`ttl_ms - PTTL`) plus the writer's delay between its
/// heartbeat stamp and the write by the writer's clock (`write_delay_us`);
/// never a difference of two hosts' clocks.
pub fn heartbeat_age_at_fetch(record: &RedisRecord, pttl_ms: i64) -> Duration {
    let since_write_ms = u64::from(record.ttl_ms).saturating_sub(pttl_ms.max(0) as u64);
    Duration::from_millis(since_write_ms) + Duration::from_micros(u64::from(record.write_delay_us))
}

/// The state of an engine whose latest record is `record` (`None`: none was
/// ever read) and whose heartbeat is `heartbeat_age` old now. `expired`: its
/// key no longer exists (the writer is gone). The capture age is the
/// heartbeat age plus `heartbeat_mono_ns - captured_mono_ns` (two stamps of
/// the same writer clock).
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
        // The key expired on the server's clock: the writer is gone. While
        // it exists, whether the writer lives cannot be known from here.
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
    use super::*;
    use crate::freshness::Status;

    fn record() -> RedisRecord {
        RedisRecord {
            state: crate::STATE_ACTIVE,
            ttl_ms: 2000,
            write_delay_us: 250,
            heartbeat_mono_ns: 10_000_000_000,
            snapshot: Snapshot {
                captured_mono_ns: 9_000_000_000,
                ..Snapshot::default()
            },
            ..RedisRecord::default()
        }
    }

    #[test]
    fn ages_come_from_the_servers_and_the_writers_clocks() {
        let r = record();
        let age = heartbeat_age_at_fetch(&r, 1500);
        assert_eq!(age, Duration::from_micros(500_250));
        let state = record_state("e".into(), Some(&r), age, false, &Freshness::default(), 0);
        assert_eq!(state.capture_age, age + Duration::from_secs(1));
        assert_eq!(state.status, Status::Fresh);
        let gone = record_state("e".into(), Some(&r), age, true, &Freshness::default(), 0);
        assert_eq!(gone.status, Status::Dead);
    }

    #[test]
    fn a_key_whose_expiry_does_not_match_its_record_is_refused() {
        let bytes = record().encode();
        assert!(decode_fetched("k", &bytes, 2000).is_ok());
        for (pttl, says) in [(-1, "no expiry"), (2001, "expires in 2001 ms")] {
            let err = decode_fetched("k", &bytes, pttl).unwrap_err().to_string();
            assert!(err.contains(says), "{err}");
        }
    }
}

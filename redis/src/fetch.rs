//! One fetched record, for any client: the bytes of a `GETRANGE key 0 192`
//! and the key's `PTTL` give a checked record and the heartbeat's age by
//! the server's and the writer's clocks (never a difference of two hosts'
//! clocks). [`crate::RedisSource`] uses these; a program that fetches with
//! its own Redis client calls them directly (the reader's `record_state`
//! then judges the status).

use std::time::Duration;

use crate::error::Error;
use crate::schema::RedisRecord;

/// Decodes a fetched value and checks the key's expiry against the record:
/// a record's age is `ttl_ms - PTTL`, which only holds for a key written
/// with `SET ... PX ttl_ms`. A key without expiry (PERSIST, a plain SET or a
/// copy) or with a longer one than its record says would read as "written
/// just now" forever: [`Error::NoExpiry`] instead.
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

/// The heartbeat's age when the record was fetched: time since the write by
/// the server's clock (`ttl_ms - PTTL`), plus the writer's delay between its
/// heartbeat and the write by the writer's clock. `pttl_ms` as
/// [`decode_fetched`] accepted it (0 ≤ PTTL ≤ `ttl_ms`).
pub fn heartbeat_age_at_fetch(record: &RedisRecord, pttl_ms: i64) -> Duration {
    let since_write_ms = u64::from(record.ttl_ms).saturating_sub(pttl_ms.max(0) as u64);
    Duration::from_millis(since_write_ms) + Duration::from_micros(u64::from(record.write_delay_us))
}

#[cfg(test)]
mod tests {
    use engine_state_shm_format::Snapshot;

    use super::*;

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
    fn the_age_comes_from_the_servers_and_the_writers_clocks() {
        assert_eq!(
            heartbeat_age_at_fetch(&record(), 1500),
            Duration::from_micros(500_250)
        );
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

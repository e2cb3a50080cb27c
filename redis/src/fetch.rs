//! One fetched record, for any client: the bytes of a `GETRANGE key 0 192`
//! and the key's `PTTL` give a checked record and the heartbeat's age by
//! the server's and the writer's clocks (never a difference of two hosts'
//! clocks). [`crate::RedisSource`] uses these; a program that fetches with
//! its own Redis client calls them directly (the reader's `record_state`
//! then judges the status). An engine's cache digest is fetched the same
//! way, size-bounded ([`CACHE_FETCH_END`]) and judged by
//! [`decode_fetched_cache`].

use std::time::Duration;

use engine_state_shm_format::{decode_digest_value, CacheDigest, MAX_DIGEST_SIZE};

use crate::error::Error;
use crate::router_value::{RouterValue, MAX_ROUTER_VALUE_SIZE};
use crate::schema::RedisRecord;

/// The last byte a reader fetches of a cache digest key:
/// `GETRANGE <prefix>cache:<id> 0 CACHE_FETCH_END` returns at most one
/// byte more than the largest digest (`128 + 8 × MAX_DIGEST_ENTRIES`), so a
/// huge foreign value costs no more than the largest digest and is told
/// from one.
pub const CACHE_FETCH_END: usize = MAX_DIGEST_SIZE;

/// Judges one fetch of an engine's cache digest key (the `GETRANGE … 0`
/// [`CACHE_FETCH_END`] bytes; empty for a missing key) for the record it
/// goes with: the record's `generation` and the `cache_version` its
/// snapshot names. A digest of another generation (another run of the
/// engine), or older than the version named, is not used; a value that is
/// not a digest is refused. The error says what is wrong (the caller names
/// the key).
pub fn decode_fetched_cache(
    bytes: &[u8],
    generation: u64,
    version: u64,
) -> Result<CacheDigest, CacheRefused> {
    let not_yet = |what: String| CacheRefused {
        what,
        damaged: false,
    };
    let damaged = |what: String| CacheRefused {
        what,
        damaged: true,
    };
    if bytes.is_empty() {
        return Err(not_yet(format!(
            "the record names digest version {version}, but the key holds no value (expired, \
             or not written yet)"
        )));
    }
    if bytes.len() > MAX_DIGEST_SIZE {
        return Err(damaged(format!(
            "a value larger than the largest digest ({MAX_DIGEST_SIZE} bytes; only its first {} \
             were read)",
            MAX_DIGEST_SIZE + 1
        )));
    }
    let record = decode_digest_value(bytes).map_err(|e| damaged(e.to_string()))?;
    if record.generation != generation {
        return Err(not_yet(format!(
            "it belongs to generation {} of the engine, not to the record's {generation}",
            record.generation
        )));
    }
    if record.digest.version() < version {
        return Err(not_yet(format!(
            "it holds version {}, older than the version {version} the record names",
            record.digest.version()
        )));
    }
    Ok(record.digest)
}

/// Why [`decode_fetched_cache`] did not return a digest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheRefused {
    /// What is wrong.
    pub what: String,
    /// The value is not a usable digest (reported at every read while the
    /// record names it); false: none is there yet for this record (missing,
    /// another generation, older: reported once).
    pub damaged: bool,
}

/// Decodes a fetched value and checks the key's expiry against the record:
/// a record's age is `ttl_ms - PTTL`, which only holds for a key written
/// with `SET ... PX ttl_ms`. A key without expiry (PERSIST, a plain SET or a
/// copy) or with a longer one than its record says would read as "written
/// just now" forever: [`Error::NoExpiry`] instead.
pub fn decode_fetched(key: &str, bytes: &[u8], pttl_ms: i64) -> Result<RedisRecord, Error> {
    let record = RedisRecord::decode(key, bytes)?;
    check_expiry(key, pttl_ms, record.ttl_ms, "record")?;
    Ok(record)
}

/// [`Error::NoExpiry`] unless the key's `PTTL` is one a value (`what`: its
/// name) written with `PX ttl_ms` can have: 0 ≤ PTTL ≤ `ttl_ms`.
fn check_expiry(key: &str, pttl_ms: i64, ttl_ms: u32, value: &str) -> Result<(), Error> {
    let what = if pttl_ms < 0 {
        "the key has no expiry (PTTL -1; PERSISTed, copied or written without PX)".to_owned()
    } else if pttl_ms as u64 > u64::from(ttl_ms) {
        format!(
            "the key expires in {pttl_ms} ms but its {value} says it was written with PX \
             {ttl_ms} (re-expired or written by hand)"
        )
    } else {
        return Ok(());
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

/// [`decode_fetched`] for a router replica's value (the bytes of a
/// `GETRANGE key 0` [`crate::MAX_ROUTER_VALUE_SIZE`], and the key's `PTTL`):
/// a value larger than the largest one is [`Error::ForeignValue`], a key
/// without expiry or with a longer one than its value says
/// [`Error::NoExpiry`].
pub fn decode_fetched_router(key: &str, bytes: &[u8], pttl_ms: i64) -> Result<RouterValue, Error> {
    if bytes.len() > MAX_ROUTER_VALUE_SIZE {
        return Err(Error::ForeignValue {
            key: key.to_owned(),
            what: format!(
                "a value larger than the largest router value ({MAX_ROUTER_VALUE_SIZE} bytes; \
                 only its first {} were read)",
                MAX_ROUTER_VALUE_SIZE + 1
            ),
        });
    }
    let value = RouterValue::decode(key, bytes)?;
    check_expiry(key, pttl_ms, value.ttl_ms, "value")?;
    Ok(value)
}

/// A router value's heartbeat age when fetched: the time since the write by
/// the server's clock (`ttl_ms - PTTL`; the writer stamps its heartbeat as
/// it sends the value). `pttl_ms` as [`decode_fetched_router`] accepted it.
pub fn router_heartbeat_age_at_fetch(value: &RouterValue, pttl_ms: i64) -> Duration {
    Duration::from_millis(u64::from(value.ttl_ms).saturating_sub(pttl_ms.max(0) as u64))
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
    fn a_router_value_is_checked_against_its_keys_expiry() {
        let value = RouterValue {
            state: crate::STATE_ACTIVE,
            ttl_ms: 2000,
            ..RouterValue::default()
        };
        let bytes = value.encode();
        assert_eq!(decode_fetched_router("k", &bytes, 1500).unwrap(), value);
        assert_eq!(
            router_heartbeat_age_at_fetch(&value, 1500),
            Duration::from_millis(500)
        );
        for (pttl, says) in [(-1, "no expiry"), (2001, "expires in 2001 ms")] {
            let err = decode_fetched_router("k", &bytes, pttl)
                .unwrap_err()
                .to_string();
            assert!(err.contains(says), "{err}");
        }
        let huge = vec![0u8; MAX_ROUTER_VALUE_SIZE + 1];
        let err = decode_fetched_router("k", &huge, 100)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("larger than the largest router value"),
            "{err}"
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

//! The Redis key schema: the one place that knows key names and the bytes of
//! a value. The publisher's sink, the Redis source and the node agent all
//! call it (docs/REDIS.md, "Key schema"; the bytes are specified in
//! docs/FORMAT.md, whose table a test checks against [`RedisRecord::encode`]). The header is [`RecordHeader`]; the
//! constants it shares with a shared-memory file (magic, layout version,
//! payload size, states) are shm-format's.
//!
//! ```text
//! <prefix>engines            SET of engine ids (discovery without KEYS)
//! <prefix>engine:<id>        one record, SET ... PX <ttl_ms>
//! <prefix>cache:<id>         the engine's cache digest (docs/FORMAT.md,
//!                            "Cache residency"), SET ... PX <ttl_ms> on
//!                            change, PEXPIREd with every record (by
//!                            SET_IF_OWNER_SCRIPT when owner-checked)
//! <prefix>routers            SET of router replica ids
//! <prefix>router:<id>        one replica's reservations (crate::RouterValue),
//!                            SET ... PX <ttl_ms> by SET_ROUTER_IF_OWNER_SCRIPT
//!
//! record (192 bytes, little-endian)
//! offset size
//!      0    8  magic              b"ENGSTATE"
//!      8    4  layout_version     1 (the snapshot's layout version)
//!     12    2  header_size        64
//!     14    2  payload_size       128
//!     16    4  writer_pid         on the writer's host (display only)
//!     20    4  publish_period_us
//!     24    8  state              1 ACTIVE, 2 RETIRED
//!     32    8  generation         changes when the writer restarts
//!     40    8  heartbeat_seq      +1 on every publish and heartbeat
//!     48    8  heartbeat_mono_ns  CLOCK_MONOTONIC of the writer's host
//!     56    4  ttl_ms             the PX the key was written with
//!     60    4  write_delay_us     heartbeat stamp → SET sent, writer's host clock
//!     64  128  snapshot           the 16 words of docs/FORMAT.md, "Snapshot words"
//! ```
//!
//! No field is ever compared with a clock of another host: `heartbeat_mono_ns`
//! and `captured_mono_ns` come from the same writer clock (their difference is
//! the capture's age at the heartbeat), and the time since the write is
//! `ttl_ms - PTTL`, both measured by the Redis server's clock.

use bytemuck::{Pod, Zeroable};
use engine_state_shm_format::layout::{MAGIC, PAYLOAD_SIZE, STATE_ACTIVE, STATE_RETIRED};
use engine_state_shm_format::{Snapshot, LAYOUT_VERSION};

use crate::error::Error;

/// The record's first eight bytes (the same magic as a shared-memory file).
pub const RECORD_MAGIC: [u8; 8] = MAGIC.to_le_bytes();
/// Bytes before the snapshot: a [`RecordHeader`].
pub const RECORD_HEADER_SIZE: usize = core::mem::size_of::<RecordHeader>();
/// Bytes of a whole record.
pub const RECORD_SIZE: usize = RECORD_HEADER_SIZE + PAYLOAD_SIZE;

/// The first 64 bytes of a record, as plain data (little-endian, like every
/// word of layout version 1: shm-format refuses to build on big-endian
/// hosts, so the native bytes are the record's bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct RecordHeader {
    /// [`RECORD_MAGIC`] (shm-format's `MAGIC`).
    pub magic: u64,
    /// [`LAYOUT_VERSION`]: the snapshot's layout version.
    pub layout_version: u32,
    /// [`RECORD_HEADER_SIZE`].
    pub header_size: u16,
    /// The snapshot's size (shm-format's `PAYLOAD_SIZE`).
    pub payload_size: u16,
    /// The writer's pid on its host (display only).
    pub writer_pid: u32,
    /// The writer's publish period in µs.
    pub publish_period_us: u32,
    /// shm-format's `STATE_ACTIVE` or `STATE_RETIRED`.
    pub state: u64,
    /// Changes when the writer restarts.
    pub generation: u64,
    /// +1 on every publish and heartbeat.
    pub heartbeat_seq: u64,
    /// `CLOCK_MONOTONIC` of the writer's host at the heartbeat.
    pub heartbeat_mono_ns: u64,
    /// The `PX` the key was written with.
    pub ttl_ms: u32,
    /// Heartbeat stamp → SET sent, writer's host clock.
    pub write_delay_us: u32,
}

const _: () = assert!(RECORD_HEADER_SIZE == 64);
const _: () = assert!(core::mem::offset_of!(RecordHeader, layout_version) == 8);
const _: () = assert!(core::mem::offset_of!(RecordHeader, header_size) == 12);
const _: () = assert!(core::mem::offset_of!(RecordHeader, payload_size) == 14);
// The scripts below compare bytes 17–20 (`writer_pid`), 25–32 (`state`) and
// 33–40 (`generation`), 1-based in Lua.
const _: () = assert!(core::mem::offset_of!(RecordHeader, writer_pid) == 16);
const _: () = assert!(core::mem::offset_of!(RecordHeader, publish_period_us) == 20);
const _: () = assert!(core::mem::offset_of!(RecordHeader, state) == 24);
const _: () = assert!(core::mem::offset_of!(RecordHeader, generation) == 32);
const _: () = assert!(core::mem::offset_of!(RecordHeader, heartbeat_seq) == 40);
const _: () = assert!(core::mem::offset_of!(RecordHeader, heartbeat_mono_ns) == 48);
const _: () = assert!(core::mem::offset_of!(RecordHeader, ttl_ms) == 56);
const _: () = assert!(core::mem::offset_of!(RecordHeader, write_delay_us) == 60);
const _: () = assert!(RECORD_SIZE == 192);

/// Lua script: writes the record `ARGV[1]` under `KEYS[1]` with `PX ARGV[2]`
/// unless the key holds an ACTIVE record of another writer (another
/// `writer_pid` or `generation`). Replies 1 when written, else the holder's
/// 64-byte header (its `writer_pid` says who holds it).
///
/// With a second key, the engine's cache digest key (`KEYS[2]`,
/// [`cache_key`]), a written record also refreshes that key's expiry
/// (`PEXPIRE KEYS[2] ARGV[2]`): the digest lives as long as the records
/// that name it, and only its owner's records keep it alive (a writer whose
/// record is refused refreshes nothing). The reply of a written record is
/// then `PEXPIRE`'s: 1, or 0 when the digest key does not exist (the writer
/// writes its digest again).
///
/// The engine's key is its own ownership token: a live writer refreshes it
/// every period, so it expires `ttl_ms` after its writer stops, and only
/// then (or after a clean close deletes it, or once it is RETIRED) may
/// another writer take the id. A missing key, a RETIRED record or a value
/// that is not a record is overwritten, as `SET` would. Byte ranges (1-based
/// in Lua): 1–8 magic, 17–20 `writer_pid`, 25–32 `state`, 33–40 `generation`.
pub const SET_IF_OWNER_SCRIPT: &str = r#"
local new = ARGV[1]
local old = redis.pcall('GETRANGE', KEYS[1], 0, 192)
if type(old) == 'string' and #old == #new
    and string.sub(old, 1, 8) == string.sub(new, 1, 8)
    and string.sub(old, 25, 32) == string.sub(new, 25, 32)
    and (string.sub(old, 17, 20) ~= string.sub(new, 17, 20)
         or string.sub(old, 33, 40) ~= string.sub(new, 33, 40)) then
  return string.sub(old, 1, 64)
end
redis.call('SET', KEYS[1], new, 'PX', ARGV[2])
if KEYS[2] then
  return redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return 1
"#;

/// SHA-1 of [`SET_IF_OWNER_SCRIPT`], for `EVALSHA` ([`crate::claim`]); a
/// test checks it against the server's `SCRIPT LOAD`
/// (tests/tests/redis_claim.rs).
pub const SET_IF_OWNER_SCRIPT_SHA1: &str = "fef5cd58858a2b0eb972d1d3678ea5e52a456f76";

/// Lua script: a clean close of the writer whose record is `ARGV[1]`:
/// deletes `KEYS[1]` and removes the id `ARGV[2]` from the registry
/// `KEYS[2]`, unless the key holds another writer's record (then it is left
/// alone: that writer owns the id now). Replies 1 when deleted, else 0.
pub const DELETE_IF_OWNER_SCRIPT: &str = r#"
local mine = ARGV[1]
local old = redis.pcall('GETRANGE', KEYS[1], 0, 192)
if type(old) == 'string' and #old == #mine
    and string.sub(old, 1, 8) == string.sub(mine, 1, 8)
    and (string.sub(old, 17, 20) ~= string.sub(mine, 17, 20)
         or string.sub(old, 33, 40) ~= string.sub(mine, 33, 40)) then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[2])
return 1
"#;

/// Lua script: writes the cache digest value `ARGV[1]` under `KEYS[2]`
/// with `PX ARGV[2]` unless the engine's record key `KEYS[1]` holds an
/// ACTIVE record of another writer: the writer of an engine id owns its
/// digest, by the record's own owner check ([`SET_IF_OWNER_SCRIPT`]). A
/// digest value carries its writer's `writer_pid` and `generation` at the
/// record's offsets (bytes 17–20 and 33–40, 1-based) and ACTIVE at 25–32,
/// so the bytes compare alike. Replies 1 when written, else the holder's
/// 64-byte record header. A digest of a writer that lost its key is never
/// written over the new owner's.
pub const SET_CACHE_IF_OWNER_SCRIPT: &str = r#"
local new = ARGV[1]
local old = redis.pcall('GETRANGE', KEYS[1], 0, 192)
if type(old) == 'string' and #old == 192
    and string.sub(old, 1, 8) == 'ENGSTATE'
    and string.sub(old, 25, 32) == string.sub(new, 25, 32)
    and (string.sub(old, 17, 20) ~= string.sub(new, 17, 20)
         or string.sub(old, 33, 40) ~= string.sub(new, 33, 40)) then
  return string.sub(old, 1, 64)
end
redis.call('SET', KEYS[2], new, 'PX', ARGV[2])
return 1
"#;

/// Lua script: a clean close's delete of the cache digest key `KEYS[1]` of
/// the writer whose identity (`writer_pid` at bytes 17–20, `generation` at
/// 33–40, 1-based) is in `ARGV[1]` (its record or digest bytes), unless the
/// key holds another writer's digest (magic `ESDIGEST`): then it is left
/// alone. Replies 1 when deleted (or already gone), else 0.
pub const DELETE_CACHE_IF_OWNER_SCRIPT: &str = r#"
local mine = ARGV[1]
local old = redis.pcall('GETRANGE', KEYS[1], 0, 127)
if type(old) == 'string' and #old >= 40
    and string.sub(old, 1, 8) == 'ESDIGEST'
    and (string.sub(old, 17, 20) ~= string.sub(mine, 17, 20)
         or string.sub(old, 33, 40) ~= string.sub(mine, 33, 40)) then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
"#;

/// The key of the engine-id registry.
pub fn registry_key(prefix: &str) -> String {
    format!("{prefix}engines")
}

/// The key of one engine's record.
pub fn engine_key(prefix: &str, engine_id: &str) -> String {
    format!("{prefix}engine:{engine_id}")
}

/// The key of the router replica registry: a SET of replica ids
/// (discovery without KEYS; docs/REDIS.md, "Router replicas' reservations").
pub fn router_registry_key(prefix: &str) -> String {
    format!("{prefix}routers")
}

/// The key of one router replica's reservations ([`crate::RouterValue`]).
/// Replica ids follow engine-id rules (shm-format's `EngineId`).
pub fn router_key(prefix: &str, replica_id: &str) -> String {
    format!("{prefix}router:{replica_id}")
}

/// The key of one engine's cache digest (outside `engine:*` and the
/// registry, so readers of layout version 1 never meet it).
pub fn cache_key(prefix: &str, engine_id: &str) -> String {
    format!("{prefix}cache:{engine_id}")
}

/// One engine's value in Redis.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RedisRecord {
    /// The writer's pid on its host.
    pub writer_pid: u32,
    /// The writer's publish period in µs.
    pub publish_period_us: u32,
    /// shm-format's `STATE_ACTIVE` or `STATE_RETIRED`.
    pub state: u64,
    /// Differs between two runs of the same engine id.
    pub generation: u64,
    /// Advances on every publish and heartbeat.
    pub heartbeat_seq: u64,
    /// `CLOCK_MONOTONIC` of the writer's host at the last heartbeat.
    pub heartbeat_mono_ns: u64,
    /// The key's expiry (`PX`) in ms.
    pub ttl_ms: u32,
    /// µs between the heartbeat stamp and the write (writer's host clock).
    pub write_delay_us: u32,
    /// The snapshot.
    pub snapshot: Snapshot,
}

/// Who writes an engine's records, fixed for one run of its writer: what
/// the owner check compares (`writer_pid`, `generation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordWriter {
    /// The writer's pid on its host.
    pub pid: u32,
    /// The writer's publish period in µs.
    pub publish_period_us: u32,
    /// Differs between two runs of the same engine id.
    pub generation: u64,
}

impl RedisRecord {
    /// An ACTIVE record of `writer`: heartbeat number `heartbeat_seq`,
    /// stamped `heartbeat_mono_ns`, holding `snapshot`. The sink fills in
    /// `ttl_ms` and `write_delay_us` when it writes it. The one way the
    /// publisher and the node agent make a record.
    pub fn active(
        writer: RecordWriter,
        heartbeat_seq: u64,
        heartbeat_mono_ns: u64,
        snapshot: Snapshot,
    ) -> RedisRecord {
        RedisRecord {
            writer_pid: writer.pid,
            publish_period_us: writer.publish_period_us,
            state: STATE_ACTIVE,
            generation: writer.generation,
            heartbeat_seq,
            heartbeat_mono_ns,
            snapshot,
            ..RedisRecord::default()
        }
    }

    /// The record's header.
    pub fn header(&self) -> RecordHeader {
        RecordHeader {
            magic: MAGIC,
            layout_version: LAYOUT_VERSION,
            header_size: RECORD_HEADER_SIZE as u16,
            payload_size: PAYLOAD_SIZE as u16,
            writer_pid: self.writer_pid,
            publish_period_us: self.publish_period_us,
            state: self.state,
            generation: self.generation,
            heartbeat_seq: self.heartbeat_seq,
            heartbeat_mono_ns: self.heartbeat_mono_ns,
            ttl_ms: self.ttl_ms,
            write_delay_us: self.write_delay_us,
        }
    }

    /// The record's bytes.
    pub fn encode(&self) -> [u8; RECORD_SIZE] {
        let mut out = [0u8; RECORD_SIZE];
        out[..RECORD_HEADER_SIZE].copy_from_slice(bytemuck::bytes_of(&self.header()));
        out[RECORD_HEADER_SIZE..].copy_from_slice(&self.snapshot.to_le_bytes());
        out
    }

    /// Parses the value of `key`; a foreign value or another layout version
    /// is an error naming the key and what to do.
    pub fn decode(key: &str, bytes: &[u8]) -> Result<RedisRecord, Error> {
        let foreign = |what: String| Error::ForeignValue {
            key: key.to_owned(),
            what,
        };
        if bytes.len() < 16 || bytes[0..8] != RECORD_MAGIC {
            return Err(foreign(format!(
                "{} bytes without the ENGSTATE magic",
                bytes.len()
            )));
        }
        // The first 16 bytes say what the rest is; checked before the rest is read.
        let u16_at = |i: usize| u16::from_le_bytes([bytes[i], bytes[i + 1]]);
        let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if version != LAYOUT_VERSION {
            return Err(Error::UnknownVersion {
                key: key.to_owned(),
                found: version,
                supported: LAYOUT_VERSION,
            });
        }
        if bytes.len() != RECORD_SIZE
            || usize::from(u16_at(12)) != RECORD_HEADER_SIZE
            || usize::from(u16_at(14)) != PAYLOAD_SIZE
        {
            return Err(foreign(format!(
                "{} bytes with header size {} and payload size {}, expected {RECORD_SIZE}, \
                 {RECORD_HEADER_SIZE} and {PAYLOAD_SIZE}",
                bytes.len(),
                u16_at(12),
                u16_at(14),
            )));
        }
        let header: RecordHeader = bytemuck::pod_read_unaligned(&bytes[..RECORD_HEADER_SIZE]);
        if header.state != STATE_ACTIVE && header.state != STATE_RETIRED {
            return Err(foreign(format!(
                "state {} is neither 1 nor 2",
                header.state
            )));
        }
        let payload: &[u8; PAYLOAD_SIZE] = bytes[RECORD_HEADER_SIZE..]
            .try_into()
            .expect("length checked above");
        Ok(RedisRecord {
            writer_pid: header.writer_pid,
            publish_period_us: header.publish_period_us,
            state: header.state,
            generation: header.generation,
            heartbeat_seq: header.heartbeat_seq,
            heartbeat_mono_ns: header.heartbeat_mono_ns,
            ttl_ms: header.ttl_ms,
            write_delay_us: header.write_delay_us,
            snapshot: Snapshot::from_le_bytes(payload),
        })
    }

    /// The writer closed (readers report the engine dead).
    pub fn is_retired(&self) -> bool {
        self.state == STATE_RETIRED
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pins the record header's bytes: any change is a layout change.
    #[test]
    fn golden_header_bytes() {
        let header = RedisRecord {
            writer_pid: 0x0102_0304,
            publish_period_us: 50_000,
            state: STATE_RETIRED,
            generation: 0x1112,
            heartbeat_seq: 0x2122,
            heartbeat_mono_ns: 0x3132_3334,
            ttl_ms: 2000,
            write_delay_us: 0x4142,
            snapshot: Snapshot::default(),
        }
        .header();
        let bytes: [u8; RECORD_HEADER_SIZE] = bytemuck::cast(header);
        #[rustfmt::skip]
        let golden: [u8; RECORD_HEADER_SIZE] = [
            b'E', b'N', b'G', b'S', b'T', b'A', b'T', b'E',   // magic
            1, 0, 0, 0,  64, 0,  128, 0,                      // version, header, payload size
            0x04, 0x03, 0x02, 0x01,  0x50, 0xc3, 0, 0,        // pid, period 50 000 us
            2, 0, 0, 0, 0, 0, 0, 0,                           // state RETIRED
            0x12, 0x11, 0, 0, 0, 0, 0, 0,                     // generation
            0x22, 0x21, 0, 0, 0, 0, 0, 0,                     // heartbeat_seq
            0x34, 0x33, 0x32, 0x31, 0, 0, 0, 0,               // heartbeat_mono_ns
            0xd0, 0x07, 0, 0,  0x42, 0x41, 0, 0,              // ttl_ms 2000, write_delay_us
        ];
        assert_eq!(bytes, golden);
        assert_eq!(
            &RedisRecord::default().encode()[..RECORD_HEADER_SIZE],
            bytemuck::bytes_of(&RedisRecord::default().header())
        );
    }

    fn sample() -> RedisRecord {
        RedisRecord {
            writer_pid: 42,
            publish_period_us: 50_000,
            state: STATE_ACTIVE,
            generation: 7,
            heartbeat_seq: 9,
            heartbeat_mono_ns: 123_456_789,
            ttl_ms: 2000,
            write_delay_us: 15,
            snapshot: Snapshot {
                num_running: 3,
                reserved: [0; 1],
                ..Snapshot::from_words(core::array::from_fn(|i| i as u64 * 11))
            },
        }
    }

    #[test]
    fn golden_bytes_and_round_trip() {
        let record = sample();
        let bytes = record.encode();
        assert_eq!(&bytes[0..8], b"ENGSTATE");
        assert_eq!(bytes[8], 1, "layout version");
        assert_eq!((bytes[12], bytes[14]), (64, 128));
        assert_eq!(bytes[16], 42);
        assert_eq!(bytes[24], 1);
        assert_eq!(bytes[40], 9);
        assert_eq!(&bytes[56..58], &2000u16.to_le_bytes());
        assert_eq!(bytes[64 + 3 * 8], 3, "num_running is word 3 of the payload");
        assert_eq!(RedisRecord::decode("k", &bytes).unwrap(), record);
        assert_eq!(
            (
                registry_key("p:"),
                engine_key("p:", "e0"),
                cache_key("p:", "e0")
            ),
            (
                "p:engines".to_owned(),
                "p:engine:e0".to_owned(),
                "p:cache:e0".to_owned()
            )
        );
    }

    #[test]
    fn foreign_values_and_other_versions_are_clear_errors() {
        let mut other_version = sample().encode();
        other_version[8] = 9;
        let mut bad_state = sample().encode();
        bad_state[24] = 5;
        for (bytes, says) in [
            (&b"hello"[..], "without the ENGSTATE magic"),
            (&sample().encode()[..100], "100 bytes with header size"),
            (
                &other_version[..],
                "layout version 9, but this build reads version 1",
            ),
            (&bad_state[..], "state 5"),
        ] {
            let err = RedisRecord::decode("fleet:engine:x", bytes)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(says) && err.contains("fleet:engine:x"),
                "{err}"
            );
        }
    }

    /// The decoder against arbitrary and mutated bytes (a value in Redis is
    /// whatever anyone wrote): it never panics, and accepts exactly the
    /// well-formed records, which encode back to the same bytes. 256 cases
    /// per property in `cargo test`; `make fuzz` (or `PROPTEST_CASES=N`)
    /// runs more.
    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        /// A well-formed record, said independently of `decode`.
        fn well_formed(bytes: &[u8]) -> bool {
            let word = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap());
            bytes.len() == RECORD_SIZE
                && bytes[0..8] == *b"ENGSTATE"
                && bytes[8..12] == 1u32.to_le_bytes()
                && bytes[12..14] == 64u16.to_le_bytes()
                && bytes[14..16] == 128u16.to_le_bytes()
                && matches!(word(24), 1 | 2)
        }

        fn check(bytes: &[u8]) -> Result<(), TestCaseError> {
            match RedisRecord::decode("fuzz:engine:x", bytes) {
                Ok(record) => {
                    prop_assert!(well_formed(bytes), "accepted a malformed value");
                    prop_assert_eq!(&record.encode()[..], bytes);
                }
                Err(error) => {
                    prop_assert!(!well_formed(bytes), "refused a record: {}", error);
                    prop_assert!(error.to_string().contains("fuzz:engine:x"));
                }
            }
            Ok(())
        }

        /// A valid record with arbitrary fields.
        fn record() -> impl Strategy<Value = Vec<u8>> {
            (
                any::<[u64; 16]>(),
                any::<[u64; 4]>(),
                any::<[u32; 4]>(),
                1u64..=2,
            )
                .prop_map(|(words, longs, ints, state)| {
                    RedisRecord {
                        writer_pid: ints[0],
                        publish_period_us: ints[1],
                        state,
                        generation: longs[0],
                        heartbeat_seq: longs[1],
                        heartbeat_mono_ns: longs[2],
                        ttl_ms: ints[2],
                        write_delay_us: ints[3],
                        snapshot: Snapshot::from_words(words),
                    }
                    .encode()
                    .to_vec()
                })
        }

        /// A valid record with some bytes overwritten, then cut or extended.
        fn mutated() -> impl Strategy<Value = Vec<u8>> {
            (
                record(),
                prop::collection::vec((0..RECORD_SIZE, any::<u8>()), 0..4),
                prop_oneof![Just(None), (0..RECORD_SIZE + 64).prop_map(Some),],
                prop::collection::vec(any::<u8>(), 0..8),
            )
                .prop_map(|(mut bytes, writes, length, tail)| {
                    for (at, byte) in writes {
                        bytes[at] = byte;
                    }
                    if let Some(length) = length {
                        bytes.resize(length, 0);
                        bytes.extend(tail);
                    }
                    bytes
                })
        }

        proptest! {
            #![proptest_config(ProptestConfig::default())]

            #[test]
            fn arbitrary_bytes_never_panic_and_are_refused(
                bytes in prop::collection::vec(any::<u8>(), 0..RECORD_SIZE + 64)
            ) {
                check(&bytes)?;
            }

            #[test]
            fn a_magic_prefix_with_arbitrary_rest_is_decided_by_its_shape(
                rest in prop::collection::vec(any::<u8>(), 0..RECORD_SIZE + 8)
            ) {
                let mut bytes = RECORD_MAGIC.to_vec();
                bytes.extend(rest);
                check(&bytes)?;
            }

            #[test]
            fn mutated_records_are_accepted_only_when_still_well_formed(bytes in mutated()) {
                check(&bytes)?;
            }

            #[test]
            fn every_valid_record_round_trips(bytes in record()) {
                prop_assert!(well_formed(&bytes));
                check(&bytes)?;
            }
        }
    }
}

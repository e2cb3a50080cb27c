//! A router replica's reservations in Redis: the bytes of the value at
//! `<prefix>router:<id>` ([`crate::router_key`]; docs/REDIS.md, "Router
//! replicas' reservations") and the owner-check scripts that write and
//! delete it. The 128-byte slots are shm-format's
//! ([`encode_reservation_slot`], [`decode_reservation_slots`]), the same as in
//! a replica's shared-memory file.
//!
//! ```text
//! value (64 + 128 × count bytes, little-endian)
//! offset size
//!      0    8  magic              b"ESROUTER"
//!      8    4  layout_version     1 (shm-format's ROUTER_LAYOUT_VERSION)
//!     12    2  header_size        64
//!     14    2  slot_size          128
//!     16    4  writer_pid         on the writer's host (display only)
//!     20    4  heartbeat_period_us
//!     24    8  state              1 ACTIVE (a writer deletes its key on close)
//!     32    8  generation         differs between two runs of the replica id
//!     40    8  heartbeat_seq      +1 on every write
//!     48    8  heartbeat_mono_ns  CLOCK_MONOTONIC of the writer's host at the write
//!     56    4  ttl_ms             the PX the key was written with
//!     60    4  count              slots that follow (at most MAX_ROUTER_ENGINES)
//!     64  128 × count  slots      engine id (64, NUL padded), six counters (48), zero (16)
//! ```
//!
//! `writer_pid`, `state` and `generation` sit at an engine record's offsets
//! ([`crate::RecordHeader`]), so the owner check compares alike.

use bytemuck::{Pod, Zeroable};
use engine_state_shm_format::layout::{STATE_ACTIVE, STATE_RETIRED};
use engine_state_shm_format::router_layout::ROUTER_MAGIC;
use engine_state_shm_format::{
    decode_reservation_slots, encode_reservation_slot, EngineId, Reservations, RouterError,
    MAX_ROUTER_ENGINES, RESERVATION_SLOT_SIZE, ROUTER_LAYOUT_VERSION,
};

use crate::error::Error;

/// The value's first eight bytes (the same magic as a replica's file).
pub const ROUTER_VALUE_MAGIC: [u8; 8] = ROUTER_MAGIC.to_le_bytes();
/// Bytes before the slots: a [`RouterValueHeader`].
pub const ROUTER_VALUE_HEADER_SIZE: usize = core::mem::size_of::<RouterValueHeader>();
/// Bytes of the largest value ([`MAX_ROUTER_ENGINES`] slots): a reader
/// fetches one byte more (`GETRANGE key 0 MAX_ROUTER_VALUE_SIZE`) to tell a
/// huge foreign value from a value, at no more cost than the largest one.
pub const MAX_ROUTER_VALUE_SIZE: usize =
    ROUTER_VALUE_HEADER_SIZE + MAX_ROUTER_ENGINES * RESERVATION_SLOT_SIZE;

/// The first 64 bytes of a router value, as plain data (little-endian:
/// shm-format refuses to build on big-endian hosts).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct RouterValueHeader {
    /// [`ROUTER_VALUE_MAGIC`].
    pub magic: u64,
    /// shm-format's `ROUTER_LAYOUT_VERSION`.
    pub layout_version: u32,
    /// [`ROUTER_VALUE_HEADER_SIZE`].
    pub header_size: u16,
    /// shm-format's `RESERVATION_SLOT_SIZE`.
    pub slot_size: u16,
    /// The writer's pid on its host (display only).
    pub writer_pid: u32,
    /// How often the writer writes when nothing changes, in µs.
    pub heartbeat_period_us: u32,
    /// shm-format's `STATE_ACTIVE` or `STATE_RETIRED`.
    pub state: u64,
    /// Differs between two runs of the same replica id.
    pub generation: u64,
    /// +1 on every write.
    pub heartbeat_seq: u64,
    /// `CLOCK_MONOTONIC` of the writer's host at the write.
    pub heartbeat_mono_ns: u64,
    /// The `PX` the key was written with.
    pub ttl_ms: u32,
    /// Slots after the header.
    pub count: u32,
}

const _: () = assert!(ROUTER_VALUE_HEADER_SIZE == 64);
const _: () = assert!(core::mem::offset_of!(RouterValueHeader, layout_version) == 8);
const _: () = assert!(core::mem::offset_of!(RouterValueHeader, header_size) == 12);
const _: () = assert!(core::mem::offset_of!(RouterValueHeader, slot_size) == 14);
// The scripts below compare bytes 17–20 (`writer_pid`), 25–32 (`state`) and
// 33–40 (`generation`), 1-based in Lua: an engine record's offsets.
const _: () = assert!(
    core::mem::offset_of!(RouterValueHeader, writer_pid)
        == core::mem::offset_of!(crate::RecordHeader, writer_pid)
);
const _: () = assert!(
    core::mem::offset_of!(RouterValueHeader, state)
        == core::mem::offset_of!(crate::RecordHeader, state)
);
const _: () = assert!(
    core::mem::offset_of!(RouterValueHeader, generation)
        == core::mem::offset_of!(crate::RecordHeader, generation)
);
const _: () = assert!(core::mem::offset_of!(RouterValueHeader, writer_pid) == 16);
const _: () = assert!(core::mem::offset_of!(RouterValueHeader, heartbeat_period_us) == 20);
const _: () = assert!(core::mem::offset_of!(RouterValueHeader, state) == 24);
const _: () = assert!(core::mem::offset_of!(RouterValueHeader, generation) == 32);
const _: () = assert!(core::mem::offset_of!(RouterValueHeader, heartbeat_seq) == 40);
const _: () = assert!(core::mem::offset_of!(RouterValueHeader, heartbeat_mono_ns) == 48);
const _: () = assert!(core::mem::offset_of!(RouterValueHeader, ttl_ms) == 56);
const _: () = assert!(core::mem::offset_of!(RouterValueHeader, count) == 60);
const _: () = assert!(MAX_ROUTER_VALUE_SIZE == 32_832);

/// Lua script: writes the router value `ARGV[1]` under `KEYS[1]` with `PX
/// ARGV[2]` and adds the replica id `ARGV[3]` to the registry `KEYS[2]`,
/// unless the key holds an ACTIVE router value of another writer (another
/// `writer_pid` or `generation`). Replies 1 when written, 2 when written but
/// the registry is not a set (`WRONGTYPE`: readers cannot find the
/// replica), else the holder's 64-byte header (its `writer_pid` says who
/// holds it).
///
/// Like [`crate::SET_IF_OWNER_SCRIPT`], but for a value whose length
/// changes with its count: only the old value's header is read (`GETRANGE
/// 0 63`), and a value is another writer's when it has the `ESROUTER` magic,
/// the new value's state (ACTIVE) and another identity — whatever its
/// length or layout version (the identity's offsets are fixed). A missing
/// key, a value that is not a router value or a RETIRED one is overwritten,
/// as `SET` would. The registration rides along with every write, so an id
/// a reader pruned is back within a heartbeat period, and a refused writer
/// registers nothing. Byte ranges (1-based in Lua): 1–8 magic, 17–20
/// `writer_pid`, 25–32 `state`, 33–40 `generation`.
pub const SET_ROUTER_IF_OWNER_SCRIPT: &str = r#"
local new = ARGV[1]
local old = redis.pcall('GETRANGE', KEYS[1], 0, 63)
if type(old) == 'string' and #old == 64
    and string.sub(old, 1, 8) == string.sub(new, 1, 8)
    and string.sub(old, 25, 32) == string.sub(new, 25, 32)
    and (string.sub(old, 17, 20) ~= string.sub(new, 17, 20)
         or string.sub(old, 33, 40) ~= string.sub(new, 33, 40)) then
  return old
end
redis.call('SET', KEYS[1], new, 'PX', ARGV[2])
local added = redis.pcall('SADD', KEYS[2], ARGV[3])
if type(added) == 'table' and added.err then
  return 2
end
return 1
"#;

/// SHA-1 of [`SET_ROUTER_IF_OWNER_SCRIPT`], for `EVALSHA`; a test checks
/// it against the server's `SCRIPT LOAD` (tests/tests/redis_replicas.rs).
pub const SET_ROUTER_IF_OWNER_SCRIPT_SHA1: &str = "c4aa6ac40619abb147634ea55247d2556afe7399";

/// Lua script: a clean close of the writer whose value (or header) is
/// `ARGV[1]`: deletes `KEYS[1]` and removes the replica id `ARGV[2]` from
/// the registry `KEYS[2]`, unless the key holds another writer's router
/// value (then both are left alone: that writer owns the id now). Replies 1
/// when deleted (or already gone), else 0.
pub const DELETE_ROUTER_IF_OWNER_SCRIPT: &str = r#"
local mine = ARGV[1]
local old = redis.pcall('GETRANGE', KEYS[1], 0, 63)
if type(old) == 'string' and #old == 64
    and string.sub(old, 1, 8) == string.sub(mine, 1, 8)
    and (string.sub(old, 17, 20) ~= string.sub(mine, 17, 20)
         or string.sub(old, 33, 40) ~= string.sub(mine, 33, 40)) then
  return 0
end
redis.call('DEL', KEYS[1])
redis.pcall('SREM', KEYS[2], ARGV[2])
return 1
"#;

/// One router replica's value in Redis: its writer, heartbeat and the
/// reservations it holds per engine.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RouterValue {
    /// The writer's pid on its host (display only).
    pub writer_pid: u32,
    /// How often the writer writes when nothing changes, in µs.
    pub heartbeat_period_us: u32,
    /// shm-format's `STATE_ACTIVE` or `STATE_RETIRED`.
    pub state: u64,
    /// Differs between two runs of the same replica id.
    pub generation: u64,
    /// +1 on every write.
    pub heartbeat_seq: u64,
    /// `CLOCK_MONOTONIC` of the writer's host at the write.
    pub heartbeat_mono_ns: u64,
    /// The `PX` the key was written with, in ms.
    pub ttl_ms: u32,
    /// Per engine, the replica's reservations on it; each engine once.
    pub engines: Vec<(EngineId, Reservations)>,
}

impl RouterValue {
    /// The value's header (`count` = the number of engines).
    pub fn header(&self) -> RouterValueHeader {
        RouterValueHeader {
            magic: ROUTER_MAGIC,
            layout_version: ROUTER_LAYOUT_VERSION,
            header_size: ROUTER_VALUE_HEADER_SIZE as u16,
            slot_size: RESERVATION_SLOT_SIZE as u16,
            writer_pid: self.writer_pid,
            heartbeat_period_us: self.heartbeat_period_us,
            state: self.state,
            generation: self.generation,
            heartbeat_seq: self.heartbeat_seq,
            heartbeat_mono_ns: self.heartbeat_mono_ns,
            ttl_ms: self.ttl_ms,
            count: self.engines.len().min(u32::MAX as usize) as u32,
        }
    }

    /// The value's bytes. A value of more than [`MAX_ROUTER_ENGINES`]
    /// engines is refused by [`RouterValue::decode`] (the sink never holds
    /// more).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            ROUTER_VALUE_HEADER_SIZE + self.engines.len() * RESERVATION_SLOT_SIZE,
        );
        out.extend_from_slice(bytemuck::bytes_of(&self.header()));
        for (engine_id, counters) in &self.engines {
            out.extend_from_slice(&encode_reservation_slot(engine_id, counters));
        }
        out
    }

    /// Parses the value of `key`. A value that is not a router value (no
    /// magic, sizes or a length its header does not explain) is
    /// [`Error::ForeignValue`], another layout version
    /// [`Error::UnknownVersion`] (naming both), and a router value whose
    /// contents break the rules (a state neither ACTIVE nor RETIRED, more
    /// than [`MAX_ROUTER_ENGINES`] slots, an invalid or duplicate engine id,
    /// nonzero padding) [`Error::CorruptRouter`]; each names the key.
    pub fn decode(key: &str, bytes: &[u8]) -> Result<RouterValue, Error> {
        let foreign = |what: String| Error::ForeignValue {
            key: key.to_owned(),
            what,
        };
        let corrupt = |what: String| Error::CorruptRouter {
            key: key.to_owned(),
            what,
        };
        if bytes.len() < 16 || bytes[0..8] != ROUTER_VALUE_MAGIC {
            return Err(foreign(format!(
                "{} bytes without the ESROUTER magic",
                bytes.len()
            )));
        }
        // The first 16 bytes say what the rest is; checked before the rest is read.
        let u16_at = |i: usize| u16::from_le_bytes([bytes[i], bytes[i + 1]]);
        let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if version != ROUTER_LAYOUT_VERSION {
            return Err(Error::UnknownVersion {
                key: key.to_owned(),
                found: version,
                supported: ROUTER_LAYOUT_VERSION,
            });
        }
        if bytes.len() < ROUTER_VALUE_HEADER_SIZE
            || usize::from(u16_at(12)) != ROUTER_VALUE_HEADER_SIZE
            || usize::from(u16_at(14)) != RESERVATION_SLOT_SIZE
        {
            return Err(foreign(format!(
                "{} bytes with header size {} and slot size {}, expected at least \
                 {ROUTER_VALUE_HEADER_SIZE} bytes, {ROUTER_VALUE_HEADER_SIZE} and \
                 {RESERVATION_SLOT_SIZE}",
                bytes.len(),
                u16_at(12),
                u16_at(14),
            )));
        }
        let header: RouterValueHeader =
            bytemuck::pod_read_unaligned(&bytes[..ROUTER_VALUE_HEADER_SIZE]);
        let count = header.count as usize;
        if count > MAX_ROUTER_ENGINES {
            return Err(corrupt(format!(
                "count {count} is more than MAX_ROUTER_ENGINES ({MAX_ROUTER_ENGINES})"
            )));
        }
        let expected = ROUTER_VALUE_HEADER_SIZE + count * RESERVATION_SLOT_SIZE;
        if bytes.len() != expected {
            return Err(foreign(format!(
                "{} bytes, but its count {count} makes {expected} \
                 ({ROUTER_VALUE_HEADER_SIZE} + {RESERVATION_SLOT_SIZE} × {count})",
                bytes.len()
            )));
        }
        if header.state != STATE_ACTIVE && header.state != STATE_RETIRED {
            return Err(corrupt(format!(
                "state {} is neither 1 nor 2",
                header.state
            )));
        }
        let engines =
            decode_reservation_slots(&bytes[ROUTER_VALUE_HEADER_SIZE..]).map_err(|error| {
                match error {
                    RouterError::Corrupt { what } => corrupt(what),
                    other => corrupt(other.to_string()),
                }
            })?;
        Ok(RouterValue {
            writer_pid: header.writer_pid,
            heartbeat_period_us: header.heartbeat_period_us,
            state: header.state,
            generation: header.generation,
            heartbeat_seq: header.heartbeat_seq,
            heartbeat_mono_ns: header.heartbeat_mono_ns,
            ttl_ms: header.ttl_ms,
            engines,
        })
    }

    /// The writer closed (readers treat the replica as gone).
    pub fn is_retired(&self) -> bool {
        self.state == STATE_RETIRED
    }
}

#[cfg(test)]
#[path = "router_value_tests.rs"]
mod tests;

//! The vector cases: each made by the real writer (`ShmWriter`,
//! `RedisRecord::encode`), with the header fields a writer stamps from its
//! process and clocks pinned, and the damage of the bad cases applied.

use std::fs::File;
use std::io::Read;
use std::time::Duration;

use engine_state_reader::redis::{RedisRecord, STATE_ACTIVE, STATE_RETIRED};
use engine_state_shm_format::layout::{HEARTBEAT_OFFSET, SEQ_OFFSET, STATE_WORD};
use engine_state_shm_format::{
    EngineId, ShmWriter, Snapshot, WriterOptions, FLAG_IDLE, FLAG_SHUTTING_DOWN,
};

/// The reader's `CLOCK_MONOTONIC` at which every shared-memory vector is judged.
pub const NOW_MONO_NS: u64 = 2_000_000_000_000;
pub const MS: u64 = 1_000_000;
pub const SEC: u64 = 1_000_000_000;
/// Pinned header fields (the writer stamps its own pid, namespace and time).
pub const WRITER_PID: u32 = 4242;
pub const CREATED_UNIX_NS: u64 = 1_767_225_600_000_000_000;
/// A pid no process can have (Linux pids are at most 2^22).
pub const NO_SUCH_PID: u32 = i32::MAX as u32;
/// Placeholder pid namespace of `same_pid_namespace` vectors: a reader
/// writes its own namespace's inode over it before reading.
pub const PLACEHOLDER_PID_NS: u64 = 1;

/// A snapshot with every field set, each to a different value.
pub fn busy() -> Snapshot {
    Snapshot {
        captured_mono_ns: NOW_MONO_NS - 250 * MS,
        captured_unix_ns: 1_767_225_612_345_678_901,
        step: 123_457,
        num_running: 12,
        num_waiting: 3,
        gpu_blocks_total: 30_000,
        gpu_blocks_free: 10_001,
        pending_prefill_tokens: 40_961,
        ongoing_decode_tokens: 90_113,
        num_prefilling: 2,
        max_prefill_remaining: 31_007,
        num_preempted: 1,
        flags: 0,
        cache_blocks: 0,
        cache_version: 0,
        reserved: [0; 1],
    }
}

/// [`busy`] with a cache digest reported (words 13 and 14 set): every
/// field a different value.
pub fn busy_with_cache() -> Snapshot {
    Snapshot {
        cache_blocks: 429,
        cache_version: 17,
        ..busy()
    }
}

pub fn idle() -> Snapshot {
    Snapshot {
        captured_mono_ns: NOW_MONO_NS - 45 * SEC,
        captured_unix_ns: 1_767_225_567_000_000_000,
        step: 999,
        gpu_blocks_total: 20_000,
        gpu_blocks_free: 20_000,
        flags: FLAG_IDLE,
        ..Snapshot::default()
    }
}

/// How a shared-memory vector is made from a real writer's file.
#[derive(Clone)]
pub enum Patch {
    None,
    /// Retired by the writer itself (`ShmWriter::retire`).
    Retire,
    /// Header word `state` / `layout_version`... overwritten: (offset, bytes).
    Bytes(usize, Vec<u8>),
    /// The file cut or extended to this length.
    Length(usize),
}

pub struct ShmCase {
    pub name: &'static str,
    pub what: &'static str,
    pub snapshot: Snapshot,
    pub heartbeat_mono_ns: u64,
    pub patches: Vec<Patch>,
    /// The engine id written into the file (default: the case name).
    pub id_field: Option<&'static str>,
    pub same_pid_namespace: bool,
    /// `None`: the expected `esdump --json` output is checked; else the error class.
    pub error: Option<&'static str>,
    /// With `error`: the engine is read all the same (`clock_ahead`), and
    /// its `esdump --json` output is checked too.
    pub still_read: bool,
    pub found_version: Option<u32>,
}

impl ShmCase {
    fn ok(name: &'static str, what: &'static str, snapshot: Snapshot, hb_age_ns: u64) -> ShmCase {
        ShmCase {
            name,
            what,
            snapshot,
            heartbeat_mono_ns: NOW_MONO_NS - hb_age_ns,
            patches: vec![],
            id_field: None,
            same_pid_namespace: false,
            error: None,
            still_read: false,
            found_version: None,
        }
    }

    /// A case whose stamps are ahead of the reader's clock: read, stale,
    /// and a `clock_ahead` error.
    fn ahead(name: &'static str, what: &'static str, heartbeat: u64, captured: u64) -> ShmCase {
        ShmCase {
            heartbeat_mono_ns: heartbeat,
            error: Some("clock_ahead"),
            still_read: true,
            ..ShmCase::ok(
                name,
                what,
                Snapshot {
                    captured_mono_ns: captured,
                    ..busy()
                },
                0,
            )
        }
    }

    fn bad(name: &'static str, what: &'static str, error: &'static str, patch: Patch) -> ShmCase {
        ShmCase {
            error: Some(error),
            patches: vec![patch],
            ..ShmCase::ok(name, what, busy(), 1_234_567)
        }
    }
}

pub fn shm_cases() -> Vec<ShmCase> {
    let mut max = Snapshot::from_words([u64::MAX; 16]);
    max.reserved = [0; 1];
    vec![
        ShmCase::ok(
            "active",
            "a busy engine, every field a different value; fresh",
            busy_with_cache(),
            1_234_567,
        ),
        ShmCase::ok(
            "idle",
            "idle flag, capture 45 s old (idle engines are captured rarely); fresh",
            idle(),
            500_000,
        ),
        ShmCase::ok(
            "busy_old_capture",
            "not idle, capture 45 s old (> max_capture_age 30 s); stale",
            Snapshot {
                captured_mono_ns: NOW_MONO_NS - 45 * SEC,
                ..busy()
            },
            500_000,
        ),
        ShmCase::ok(
            "heartbeat_at_limit",
            "heartbeat exactly stale_after (2 s) old: the bound is inclusive; fresh",
            busy(),
            2 * SEC,
        ),
        ShmCase::ok(
            "heartbeat_late",
            "heartbeat 2.000001 s old (> stale_after); stale",
            busy(),
            2 * SEC + 1_000,
        ),
        ShmCase::ok(
            "shutting_down",
            "shutting-down flag (bit 1); fresh (routers stop sending to it)",
            Snapshot {
                flags: FLAG_SHUTTING_DOWN,
                ..busy()
            },
            1_234_567,
        ),
        ShmCase {
            patches: vec![Patch::Retire],
            ..ShmCase::ok(
                "retired",
                "state RETIRED, set by the writer's close; dead",
                busy(),
                1_234_567,
            )
        },
        ShmCase {
            patches: vec![Patch::Bytes(16, NO_SUCH_PID.to_le_bytes().to_vec())],
            same_pid_namespace: true,
            ..ShmCase::ok(
                "dead_writer",
                "ACTIVE, fresh heartbeat, but the writer pid does not exist in the reader's pid \
                 namespace; dead",
                busy(),
                1_234_567,
            )
        },
        ShmCase {
            patches: vec![Patch::Bytes(SEQ_OFFSET, 5u64.to_le_bytes().to_vec())],
            ..ShmCase::ok(
                "mid_write",
                "odd sequence (a writer killed mid-write); torn, snapshot all zero",
                busy(),
                1_234_567,
            )
        },
        ShmCase {
            patches: vec![Patch::Bytes(SEQ_OFFSET, 0u64.to_le_bytes().to_vec())],
            ..ShmCase::ok(
                "seq_zero",
                "sequence 0 (never published: a zeroed or truncated-under-the-mapping file); torn",
                busy(),
                1_234_567,
            )
        },
        ShmCase {
            error: Some("clock_ahead"),
            still_read: true,
            ..ShmCase::ok(
                "max_values",
                "every field u64::MAX (unknown flag bits set): exact 64-bit integers, KV used \
                 0, ages floored at 0; captured_mono_ns is 2^64-1, far ahead of the reader's \
                 clock: stale, and a clock_ahead error",
                max,
                0,
            )
        },
        ShmCase {
            heartbeat_mono_ns: NOW_MONO_NS + 1_050 * MS,
            ..ShmCase::ok(
                "ahead_within_bound",
                "heartbeat and capture 1.05 s ahead of the reader's clock: exactly one 50 ms \
                 period plus the 1 s slack (a writer that stamped after the reader read its \
                 clock), the bound is inclusive; ages 0, fresh",
                Snapshot {
                    captured_mono_ns: NOW_MONO_NS + 1_050 * MS,
                    ..busy()
                },
                0,
            )
        },
        ShmCase::ahead(
            "heartbeat_ahead",
            "heartbeat and capture an hour ahead of the reader's clock: ages 0, but stale, \
             and a clock_ahead error (without the bound: fresh for an hour)",
            NOW_MONO_NS + 3_600 * SEC,
            NOW_MONO_NS + 3_600 * SEC,
        ),
        ShmCase::ahead(
            "heartbeat_ahead_by_1_05_s_and_1_ns",
            "heartbeat 1 ns beyond the bound (one period plus 1 s) ahead, capture on time: \
             stale, clock_ahead",
            NOW_MONO_NS + 1_050 * MS + 1,
            NOW_MONO_NS - 250 * MS,
        ),
        ShmCase::ahead(
            "capture_ahead",
            "heartbeat on time, capture an hour ahead: stale, clock_ahead (a busy engine whose \
             capture could never grow old)",
            NOW_MONO_NS - 1_234_567,
            NOW_MONO_NS + 3_600 * SEC,
        ),
        ShmCase::ahead(
            "stamps_at_max",
            "heartbeat and capture 2^64-1: stale, clock_ahead (without the bound: fresh forever)",
            u64::MAX,
            u64::MAX,
        ),
        ShmCase::ok(
            "tiny_floats",
            "1 of 1,000,000 KV blocks used, heartbeat 1 µs and capture 12 µs old: floats below \
             1e-5 in exponent form (gpu_kv_used_frac 1.0000000000287557e-6), ages 0.001 and \
             0.012 ms (docs/FORMAT.md, JSON); fresh",
            Snapshot {
                captured_mono_ns: NOW_MONO_NS - 12_000,
                gpu_blocks_total: 1_000_000,
                gpu_blocks_free: 999_999,
                ..busy()
            },
            1_000,
        ),
        ShmCase::bad(
            "bad_magic",
            "first 8 bytes are not ENGSTATE",
            "not_engine_state",
            Patch::Bytes(0, b"NOTSTATE".to_vec()),
        ),
        ShmCase {
            found_version: Some(2),
            ..ShmCase::bad(
                "version_2",
                "layout version 2, 4096 bytes",
                "unknown_version",
                Patch::Bytes(8, 2u32.to_le_bytes().to_vec()),
            )
        },
        ShmCase {
            found_version: Some(2),
            patches: vec![
                Patch::Bytes(8, 2u32.to_le_bytes().to_vec()),
                Patch::Length(8192),
            ],
            ..ShmCase::bad(
                "version_2_larger",
                "layout version 2, 8192 bytes: the version is reported, not the size",
                "unknown_version",
                Patch::None,
            )
        },
        ShmCase::bad(
            "truncated",
            "the first 100 bytes of a valid file",
            "wrong_size",
            Patch::Length(100),
        ),
        ShmCase::bad("empty", "0 bytes", "wrong_size", Patch::Length(0)),
        ShmCase::bad("too_long", "4097 bytes", "wrong_size", Patch::Length(4097)),
        ShmCase::bad(
            "bad_header_size",
            "header_size 72 instead of 64",
            "corrupt_header",
            Patch::Bytes(12, 72u16.to_le_bytes().to_vec()),
        ),
        ShmCase::bad(
            "bad_state",
            "state 3 (neither ACTIVE 1 nor RETIRED 2)",
            "corrupt_header",
            Patch::Bytes(STATE_WORD * 8, 3u64.to_le_bytes().to_vec()),
        ),
        ShmCase {
            id_field: Some("someone-else"),
            ..ShmCase::bad(
                "id_mismatch",
                "the engine id field says someone-else, the file is called id_mismatch",
                "corrupt_header",
                Patch::None,
            )
        },
        ShmCase::bad(
            "invalid_engine_id",
            "the engine id field holds ../x (not an engine id)",
            "corrupt_header",
            Patch::Bytes(256, b"../x\0\0\0\0".to_vec()),
        ),
    ]
}

/// The file a real writer leaves for `case`, with the nondeterministic
/// header fields pinned and the case's patches applied.
pub fn shm_bytes(case: &ShmCase) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let id = EngineId::new(case.id_field.unwrap_or(case.name)).unwrap();
    let options = WriterOptions {
        mode: 0o600,
        publish_period: Duration::from_millis(50),
    };
    // A first snapshot, then the case's: sequence 4, payload = the latest publish.
    let mut writer = ShmWriter::create(dir.path(), &id, &options, &Snapshot::default()).unwrap();
    writer.publish(&case.snapshot).unwrap();
    let mut file = File::open(writer.path()).unwrap();
    for patch in &case.patches {
        if let Patch::Retire = patch {
            writer.retire();
        }
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).unwrap();
    drop(writer);
    let put = |bytes: &mut Vec<u8>, offset: usize, value: &[u8]| {
        bytes[offset..offset + value.len()].copy_from_slice(value);
    };
    let pid_ns = if case.same_pid_namespace {
        PLACEHOLDER_PID_NS
    } else {
        0
    };
    put(&mut bytes, 16, &WRITER_PID.to_le_bytes());
    put(&mut bytes, 32, &pid_ns.to_le_bytes());
    put(&mut bytes, 40, &CREATED_UNIX_NS.to_le_bytes());
    put(
        &mut bytes,
        HEARTBEAT_OFFSET,
        &case.heartbeat_mono_ns.to_le_bytes(),
    );
    for patch in &case.patches {
        match patch {
            Patch::Bytes(offset, value) => put(&mut bytes, *offset, value),
            Patch::Length(length) => bytes.resize(*length, 0),
            Patch::None | Patch::Retire => {}
        }
    }
    bytes
}

pub struct RedisCase {
    pub name: &'static str,
    pub what: &'static str,
    pub record: RedisRecord,
    pub pttl_ms: i64,
    /// Bytes after encoding: (offset, bytes) overwritten, then the length.
    pub patch: Option<(usize, Vec<u8>)>,
    pub length: Option<usize>,
    pub error: Option<&'static str>,
    pub found_version: Option<u32>,
}

pub fn record(snapshot: Snapshot, state: u64) -> RedisRecord {
    RedisRecord {
        writer_pid: WRITER_PID,
        publish_period_us: 50_000,
        state,
        generation: 3,
        heartbeat_seq: 8_765,
        heartbeat_mono_ns: snapshot.captured_mono_ns.max(NOW_MONO_NS - 100 * MS),
        ttl_ms: 2000,
        write_delay_us: 250,
        snapshot,
    }
}

pub fn redis_cases() -> Vec<RedisCase> {
    let ok = |name, what, record, pttl_ms| RedisCase {
        name,
        what,
        record,
        pttl_ms,
        patch: None,
        length: None,
        error: None,
        found_version: None,
    };
    let active = record(busy_with_cache(), STATE_ACTIVE);
    vec![
        ok(
            "active",
            "every field a different value, PTTL 1500 of 2000: heartbeat 500.25 ms old; fresh",
            active,
            1500,
        ),
        ok(
            "idle",
            "idle flag, capture 45 s before the heartbeat; fresh",
            record(idle(), STATE_ACTIVE),
            1900,
        ),
        ok(
            "retired",
            "state RETIRED (the writer closed); dead",
            record(busy(), STATE_RETIRED),
            1500,
        ),
        ok(
            "stale",
            "PTTL 0 of 2000 and 1 ms write delay: heartbeat 2001 ms old; stale",
            RedisRecord {
                write_delay_us: 1000,
                ..active
            },
            0,
        ),
        RedisCase {
            patch: Some((0, b"NOTSTATE".to_vec())),
            error: Some("foreign_value"),
            ..ok("bad_magic", "first 8 bytes are not ENGSTATE", active, 1500)
        },
        RedisCase {
            patch: Some((8, 2u32.to_le_bytes().to_vec())),
            error: Some("unknown_version"),
            found_version: Some(2),
            ..ok("version_2", "layout version 2", active, 1500)
        },
        RedisCase {
            length: Some(100),
            error: Some("foreign_value"),
            ..ok("short", "the first 100 bytes of a record", active, 1500)
        },
        RedisCase {
            length: Some(193),
            error: Some("foreign_value"),
            ..ok("long", "a record and one byte more", active, 1500)
        },
        RedisCase {
            patch: Some((24, 3u64.to_le_bytes().to_vec())),
            error: Some("foreign_value"),
            ..ok("bad_state", "state 3", active, 1500)
        },
        RedisCase {
            error: Some("no_expiry"),
            ..ok(
                "no_expiry",
                "a valid record whose key has no expiry (PTTL -1)",
                active,
                -1,
            )
        },
        RedisCase {
            error: Some("no_expiry"),
            ..ok(
                "expiry_longer_than_ttl",
                "a valid record whose key expires later than its ttl_ms says (PTTL 5000)",
                active,
                5000,
            )
        },
        RedisCase {
            length: Some(0),
            ..ok(
                "expired",
                "no value (nil) and PTTL -2: the key expired on the server's clock; dead, no snapshot",
                active,
                -2,
            )
        },
        ok(
            "expired_after_getrange",
            "a whole record, then PTTL -2 (the key expired between the two commands): dead, \
             no snapshot, both ages stale_after, whatever the value",
            active,
            -2,
        ),
        ok(
            "capture_after_heartbeat",
            "captured_mono_ns 5 ms after heartbeat_mono_ns: the difference is floored at 0 \
             before it is added, so capture_age = heartbeat_age (500.25 ms); fresh",
            RedisRecord {
                heartbeat_mono_ns: active.snapshot.captured_mono_ns - 5_000_000,
                ..active
            },
            1500,
        ),
    ]
}

pub fn redis_bytes(case: &RedisCase) -> Vec<u8> {
    let mut bytes = case.record.encode().to_vec();
    if let Some((offset, value)) = &case.patch {
        bytes[*offset..offset + value.len()].copy_from_slice(value);
    }
    if let Some(length) = case.length {
        bytes.resize(length, 0);
    }
    bytes
}

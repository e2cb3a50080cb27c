//! The shared reservations vectors (`format/vectors/routers/`): router
//! replica files made by the real `RouterFileWriter` (its clock driven, the
//! header fields it stamps from its process pinned) and damaged for the bad
//! cases; what a reader must make of each (the reading, or an error class).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use engine_state_shm_format::router_layout::{
    router_slot_offset, ROUTER_COUNT_OFFSET, ROUTER_SEQ_OFFSET, ROUTER_STATE_WORD,
};
use engine_state_shm_format::{
    router_file_size, routers_dir, Clock, EngineId, Error, Reservations, RouterError, RouterFile,
    RouterFileWriter, RouterWriterOptions, MAX_ROUTER_ENGINES, ROUTER_FILE_SIZE,
};
use serde_json::{json, Map, Value};

use crate::cases::{CREATED_UNIX_NS, WRITER_PID};

/// The writer's clock at creation (its first heartbeat); each change
/// advances it by [`STEP_NS`].
const START_MONO_NS: u64 = 1_999_000_000_000;
const STEP_NS: u64 = 1_000_000;

/// A writer's change.
#[derive(Clone)]
pub enum Op {
    Set(&'static str, Reservations),
    Remove(&'static str),
}

/// How a vector is damaged after the writer made it.
#[derive(Clone)]
pub enum Damage {
    /// Retired by the writer itself (`RouterFileWriter::retire`).
    Retire,
    /// Bytes overwritten: (offset, bytes).
    Bytes(usize, Vec<u8>),
    /// Cut or extended to this length.
    Length(usize),
}

pub struct RouterCase {
    pub name: &'static str,
    pub what: &'static str,
    pub ops: Vec<Op>,
    pub damage: Vec<Damage>,
    pub error: Option<&'static str>,
    pub found_version: Option<u32>,
}

fn counters(n: u64) -> Reservations {
    Reservations {
        num_requests: n,
        ongoing_tokens: 1_000 * n + 17,
        pending_prefill_tokens: 300 * n,
        ongoing_decode_tokens: 700 * n + 17,
        num_prefilling: n / 2,
        max_prefill_remaining: 250 * n,
    }
}

fn le(v: u64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

/// Three engines after five changes: `e-a`, `e-b`, `e-c` set, `e-b`
/// updated, `e-a` removed (so `e-c` moved into slot 0), `e-d` set.
fn three_engines() -> Vec<Op> {
    vec![
        Op::Set("e-a", counters(1)),
        Op::Set("e-b", counters(2)),
        Op::Set("e-c", counters(3)),
        Op::Set("e-b", counters(5)),
        Op::Remove("e-a"),
        Op::Set("e-d", Reservations::default()),
    ]
}

pub fn router_cases() -> Vec<RouterCase> {
    let ok = |name, what, ops| RouterCase {
        name,
        what,
        ops,
        damage: vec![],
        error: None,
        found_version: None,
    };
    let bad = |name, what, error, damage| RouterCase {
        damage,
        error: Some(error),
        ..ok(name, what, three_engines())
    };
    let slot1 = router_slot_offset(1);
    let full: Vec<Op> = (0..MAX_ROUTER_ENGINES)
        .map(|n| {
            let name: &'static str = Box::leak(format!("engine-{n:03}").into_boxed_str());
            Op::Set(name, counters(n as u64))
        })
        .collect();
    vec![
        ok(
            "active",
            "three engines after sets, an update and a removal (the last slot moved into the hole)",
            three_engines(),
        ),
        ok(
            "empty",
            "a replica holding no reservations: count 0",
            vec![],
        ),
        ok("full", "MAX_ROUTER_ENGINES engines: count = capacity", full),
        RouterCase {
            damage: vec![Damage::Retire],
            ..ok(
                "retired",
                "retired by its writer: reads, but state retired (its reservations are not used)",
                three_engines(),
            )
        },
        RouterCase {
            damage: vec![
                Damage::Bytes(56, 4u32.to_le_bytes().to_vec()),
                Damage::Length(router_file_size(4)),
            ],
            ..ok(
                "small_capacity",
                "capacity 4 and a file of 704 bytes: readers accept any capacity up to the maximum",
                three_engines(),
            )
        },
        bad(
            "mid_write",
            "seq odd (a writer died mid-write): torn",
            "torn",
            vec![Damage::Bytes(ROUTER_SEQ_OFFSET, le(13))],
        ),
        bad(
            "seq_zero",
            "seq 0 (zeroed): never a reading, torn",
            "torn",
            vec![Damage::Bytes(ROUTER_SEQ_OFFSET, le(0))],
        ),
        bad(
            "bad_magic",
            "first 8 bytes ENGSTATE (an engine's file)",
            "not_router",
            vec![Damage::Bytes(0, b"ENGSTATE".to_vec())],
        ),
        RouterCase {
            found_version: Some(2),
            ..bad(
                "version_2",
                "router layout version 2 and another size: unknown, checked before the size",
                "unknown_version",
                vec![
                    Damage::Bytes(8, 2u32.to_le_bytes().to_vec()),
                    Damage::Length(4096),
                ],
            )
        },
        bad(
            "truncated",
            "40 bytes: shorter than a header",
            "wrong_size",
            vec![Damage::Length(40)],
        ),
        bad(
            "one_slot_short",
            "capacity 256 but room for 255 slots",
            "wrong_size",
            vec![Damage::Length(ROUTER_FILE_SIZE - 128)],
        ),
        bad(
            "bad_slot_size",
            "slot_size 64",
            "corrupt_router",
            vec![Damage::Bytes(14, 64u16.to_le_bytes().to_vec())],
        ),
        bad(
            "bad_state",
            "state 3",
            "corrupt_router",
            vec![Damage::Bytes(8 * ROUTER_STATE_WORD, le(3))],
        ),
        bad(
            "capacity_over_max",
            "capacity MAX_ROUTER_ENGINES + 1",
            "corrupt_router",
            vec![Damage::Bytes(
                56,
                (MAX_ROUTER_ENGINES as u32 + 1).to_le_bytes().to_vec(),
            )],
        ),
        bad(
            "replica_id_mismatch",
            "replica_id field other-router, file named replica_id_mismatch",
            "corrupt_router",
            vec![Damage::Bytes(128, b"other-router\0\0\0\0".to_vec())],
        ),
        bad(
            "count_over_capacity",
            "count 257 of capacity 256",
            "corrupt_router",
            vec![Damage::Bytes(
                ROUTER_COUNT_OFFSET,
                le(MAX_ROUTER_ENGINES as u64 + 1),
            )],
        ),
        bad(
            "bad_engine_id",
            "slot 1's engine id e/b (a character outside [A-Za-z0-9._-])",
            "corrupt_router",
            vec![Damage::Bytes(slot1 + 1, b"/".to_vec())],
        ),
        bad(
            "duplicate_engine",
            "slots 0 and 1 both e-c",
            "corrupt_router",
            vec![Damage::Bytes(slot1, b"e-c\0".to_vec())],
        ),
        bad(
            "slot_padding",
            "slot 1's bytes 112-127 not zero",
            "corrupt_router",
            vec![Damage::Bytes(slot1 + 120, le(1))],
        ),
        bad(
            "engine_id_after_nul",
            "slot 1's engine id e-b, NUL, then x",
            "corrupt_router",
            vec![Damage::Bytes(slot1 + 8, b"x".to_vec())],
        ),
    ]
}

/// The bytes of a case: the real writer's file, pinned and damaged.
pub fn router_bytes(case: &RouterCase) -> Vec<u8> {
    let state = tempfile::tempdir().unwrap();
    let now = Arc::new(AtomicU64::new(START_MONO_NS));
    let options = RouterWriterOptions {
        clock: Clock::from_fn({
            let now = Arc::clone(&now);
            move || now.load(Ordering::Relaxed)
        }),
        ..RouterWriterOptions::default()
    };
    let id = EngineId::new(case.name).unwrap();
    let mut writer = RouterFileWriter::create(state.path(), &id, &options).unwrap();
    for op in &case.ops {
        now.fetch_add(STEP_NS, Ordering::Relaxed);
        match op {
            Op::Set(engine, counters) => writer.set(engine, counters).unwrap(),
            Op::Remove(engine) => assert!(writer.remove(engine).unwrap()),
        }
    }
    let mut bytes = if case.damage.iter().any(|d| matches!(d, Damage::Retire)) {
        // Retiring removes the file: keep its bytes with the state stored.
        let kept = state.path().join("kept");
        std::fs::hard_link(writer.path(), &kept).unwrap();
        writer.retire();
        std::fs::read(&kept).unwrap()
    } else {
        std::fs::read(writer.path()).unwrap()
    };
    drop(writer);
    pin(&mut bytes);
    for damage in &case.damage {
        match damage {
            Damage::Retire => {}
            Damage::Bytes(at, new) => bytes[*at..at + new.len()].copy_from_slice(new),
            Damage::Length(len) => bytes.resize(*len, 0),
        }
    }
    bytes
}

/// The header fields a writer stamps from its process and clock.
fn pin(bytes: &mut [u8]) {
    bytes[16..20].copy_from_slice(&WRITER_PID.to_le_bytes());
    bytes[32..40].copy_from_slice(&0u64.to_le_bytes());
    bytes[40..48].copy_from_slice(&CREATED_UNIX_NS.to_le_bytes());
}

/// Reads a case as a reader does: the file written as
/// `<dir>.routers/<replica id>`, opened and read once with `RouterFile`.
/// The reading's JSON (the manifest's `expect`), or the error class.
pub fn read_case(replica_id: &str, bytes: &[u8]) -> Result<String, (&'static str, Option<u32>)> {
    let state = tempfile::tempdir().unwrap();
    let dir = routers_dir(&state.path().join("engines"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(replica_id);
    std::fs::write(&path, bytes).unwrap();
    read_file(&path)
}

fn router_class(error: &RouterError) -> (&'static str, Option<u32>) {
    let found = match error {
        RouterError::UnknownVersion { found } => Some(*found),
        _ => None,
    };
    (error.kind(), found)
}

fn read_file(path: &Path) -> Result<String, (&'static str, Option<u32>)> {
    let file = RouterFile::open(path).map_err(|e| match e {
        Error::Router { error, .. } => router_class(&error),
        Error::RefusedEntry { .. } => ("refused_entry", None),
        other => panic!("no vector error class for {other}"),
    })?;
    let record = file.read().map_err(|e| router_class(&e))?;
    let header = file.header();
    let engines: Vec<Value> = record
        .engines
        .iter()
        .map(|(engine_id, counters)| {
            let mut entry = Map::new();
            entry.insert("engine_id".to_owned(), json!(engine_id.as_str()));
            for (name, value) in counters.fields() {
                entry.insert(name.to_owned(), json!(value));
            }
            Value::Object(entry)
        })
        .collect();
    let value = json!({
        "replica_id": record.replica_id.as_str(),
        "state": if file.is_retired() { "retired" } else { "active" },
        "writer_pid": header.writer_pid,
        "writer_pid_ns": header.writer_pid_ns,
        "generation": record.generation,
        "created_unix_ns": header.created_unix_ns,
        "heartbeat_period_us": header.heartbeat_period_us,
        "capacity": header.capacity,
        "seq": record.seq,
        "heartbeat_mono_ns": record.heartbeat_mono_ns,
        "changed_mono_ns": record.changed_mono_ns,
        "count": record.engines.len(),
        "engines": engines,
    });
    Ok(serde_json::to_string_pretty(&value).unwrap() + "\n")
}

//! docs/FORMAT.md and the code cannot drift: the document's tables (each
//! after a `<!-- table: NAME -->` marker) are parsed and checked against the
//! crates' constants, `offset_of!` and the Redis record's encoder. Editing
//! either side alone fails here.

use std::collections::BTreeSet;
use std::mem::{offset_of, size_of};
use std::path::Path;

use engine_state_reader::redis::{
    RedisRecord, DEFAULT_PREFIX, DEFAULT_TTL, RECORD_HEADER_SIZE, RECORD_SIZE,
};
use engine_state_reader::{
    CLOCK_AHEAD_SLACK, DEFAULT_MAX_CAPTURE_AGE, DEFAULT_STALE_AFTER, DEFAULT_URI,
};
use engine_state_shm_format::blocks::BLOCK_TOKENS;
use engine_state_shm_format::digest_layout::{
    DigestHeader, CACHE_DIR_SUFFIX, CONTROL_CAPTURED_MONO_NS, CONTROL_CAPTURED_UNIX_NS,
    CONTROL_COUNT, CONTROL_HELD, CONTROL_VERSION, DIGEST_CONTROL_OFFSET, DIGEST_CONTROL_WORDS,
    DIGEST_ENTRIES_OFFSET, DIGEST_ENTRY_SIZE, DIGEST_FIXED_HEADER_SIZE, DIGEST_MAGIC,
    DIGEST_SEQ_OFFSET,
};
use engine_state_shm_format::layout::*;
use engine_state_shm_format::router_layout::{
    RouterHeader, REPLICA_ID_FIELD_SIZE, REPLICA_ID_OFFSET, ROUTER_CHANGED_OFFSET,
    ROUTER_COUNT_OFFSET, ROUTER_HEADER_SIZE, ROUTER_HEARTBEAT_OFFSET, ROUTER_MAGIC,
    ROUTER_SEQ_OFFSET, ROUTER_SLOTS_OFFSET,
};
use engine_state_shm_format::seqlock::{READ_SPINS, READ_YIELDS};
use engine_state_shm_format::{
    Header, Reservations, Snapshot, WriterOptions, DIGEST_HEADER_SIZE, DIGEST_LAYOUT_VERSION,
    FLAG_IDLE, FLAG_SHUTTING_DOWN, MAX_DIGEST_ENTRIES, MAX_ENGINE_ID_LEN, MAX_ROUTER_ENGINES,
    RESERVATION_SLOT_SIZE, RESERVATION_WORDS, ROUTERS_DIR_SUFFIX, ROUTER_FILE_SIZE,
    ROUTER_LAYOUT_VERSION, SLOT_COUNTERS_OFFSET, SLOT_PADDING_OFFSET, SNAPSHOT_WORDS,
};

fn format_md() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/FORMAT.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The body rows of the table after `<!-- table: name -->`, cells trimmed
/// and stripped of backticks.
fn table(doc: &str, name: &str) -> Vec<Vec<String>> {
    let marker = format!("<!-- table: {name} -->");
    let start = doc
        .find(&marker)
        .unwrap_or_else(|| panic!("docs/FORMAT.md has no {marker}"));
    let rows: Vec<Vec<String>> = doc[start + marker.len()..]
        .lines()
        .skip_while(|l| l.trim().is_empty())
        .take_while(|l| l.trim_start().starts_with('|'))
        .map(|l| {
            let l = l.trim().trim_start_matches('|').trim_end_matches('|');
            l.split('|').map(|c| c.trim().replace('`', "")).collect()
        })
        .collect();
    assert!(rows.len() > 2, "table {name} is empty");
    // Skip the header and the |---| line.
    rows.into_iter().skip(2).collect()
}

fn number(cell: &str) -> usize {
    cell.parse()
        .unwrap_or_else(|_| panic!("{cell:?} is not a number"))
}

/// `(offset, size, field)` of a byte-layout table.
fn layout(doc: &str, name: &str) -> Vec<(usize, usize, String)> {
    table(doc, name)
        .into_iter()
        .map(|r| (number(&r[0]), number(&r[1]), r[2].clone()))
        .collect()
}

/// The rows cover `0..total` with no gap and no overlap.
fn assert_contiguous(rows: &[(usize, usize, String)], total: usize, name: &str) {
    let mut at = 0;
    for (offset, size, field) in rows {
        assert_eq!(*offset, at, "{name}: {field} should start at {at}");
        at += size;
    }
    assert_eq!(at, total, "{name}: the rows cover {at} bytes, not {total}");
}

fn size_of_field<F>(_: fn(&Header) -> &F) -> usize {
    size_of::<F>()
}

#[test]
fn the_file_table_is_the_layout() {
    let rows = layout(&format_md(), "file");
    assert_contiguous(&rows, FILE_SIZE, "file");
    macro_rules! header_field {
        ($f:ident) => {
            (
                stringify!($f),
                offset_of!(Header, $f),
                size_of_field(|h| &h.$f),
            )
        };
    }
    let expected = [
        header_field!(magic),
        header_field!(layout_version),
        header_field!(header_size),
        header_field!(payload_size),
        header_field!(writer_pid),
        header_field!(publish_period_us),
        header_field!(state),
        header_field!(writer_pid_ns),
        header_field!(created_unix_ns),
        header_field!(generation),
        header_field!(reserved),
        ("seq", SEQ_OFFSET, 8),
        ("heartbeat_mono_ns", HEARTBEAT_OFFSET, 8),
        ("payload", PAYLOAD_OFFSET, PAYLOAD_SIZE),
        ("engine_id", ENGINE_ID_OFFSET, ENGINE_ID_FIELD_SIZE),
    ];
    let documented: Vec<(&str, usize, usize)> = rows
        .iter()
        .filter(|(_, _, field)| field != "unused")
        .map(|(offset, size, field)| (field.as_str(), *offset, *size))
        .collect();
    assert_eq!(
        documented, expected,
        "docs/FORMAT.md file table vs layout.rs"
    );
    assert_eq!(size_of::<Header>(), HEADER_SIZE);
    assert_eq!(offset_of!(Header, state), STATE_WORD * 8);
}

#[test]
fn the_snapshot_table_is_the_word_order() {
    let rows = table(&format_md(), "snapshot");
    let documented: Vec<(usize, usize, &str)> = rows
        .iter()
        .map(|r| (number(&r[0]), number(&r[1]), r[2].as_str()))
        .collect();
    let mut expected: Vec<(usize, usize, &str)> = Snapshot::FIELD_NAMES
        .iter()
        .enumerate()
        .map(|(word, name)| (word, word * 8, *name))
        .collect();
    for word in Snapshot::FIELD_NAMES.len()..SNAPSHOT_WORDS {
        expected.push((word, word * 8, "reserved"));
    }
    assert_eq!(
        documented, expected,
        "docs/FORMAT.md snapshot table vs snapshot.rs"
    );
    assert_eq!(
        offset_of!(Snapshot, reserved),
        Snapshot::FIELD_NAMES.len() * 8
    );
    assert_eq!(size_of::<Snapshot>(), PAYLOAD_SIZE);
}

/// Where each documented field lands in an encoded record: set the field
/// alone to a value whose bytes are all non-zero and see which bytes change.
#[test]
fn the_redis_record_table_is_the_encoder() {
    let rows = layout(&format_md(), "redis-record");
    assert_contiguous(&rows, RECORD_SIZE, "redis-record");
    let base = RedisRecord::default();
    let base_bytes = base.encode();
    let changed = |record: RedisRecord| -> (usize, usize) {
        let bytes = record.encode();
        let diff: Vec<usize> = (0..RECORD_SIZE)
            .filter(|i| bytes[*i] != base_bytes[*i])
            .collect();
        (diff[0], diff.len())
    };
    let (v32, v64) = (0x8182_8384u32, 0x9192_9394_9596_9798u64);
    let mut documented = BTreeSet::new();
    for (offset, size, field) in &rows {
        documented.insert(field.as_str());
        let at = (*offset, *size);
        let bytes = &base_bytes[*offset..offset + size];
        match field.as_str() {
            "magic" => assert_eq!(bytes, b"ENGSTATE"),
            "layout_version" => assert_eq!(bytes, LAYOUT_VERSION.to_le_bytes()),
            "header_size" => assert_eq!(bytes, (RECORD_HEADER_SIZE as u16).to_le_bytes()),
            "payload_size" => assert_eq!(bytes, (PAYLOAD_SIZE as u16).to_le_bytes()),
            "writer_pid" => assert_eq!(
                changed(RedisRecord {
                    writer_pid: v32,
                    ..base
                }),
                at
            ),
            "publish_period_us" => assert_eq!(
                changed(RedisRecord {
                    publish_period_us: v32,
                    ..base
                }),
                at
            ),
            "state" => assert_eq!(changed(RedisRecord { state: v64, ..base }), at),
            "generation" => assert_eq!(
                changed(RedisRecord {
                    generation: v64,
                    ..base
                }),
                at
            ),
            "heartbeat_seq" => assert_eq!(
                changed(RedisRecord {
                    heartbeat_seq: v64,
                    ..base
                }),
                at
            ),
            "heartbeat_mono_ns" => assert_eq!(
                changed(RedisRecord {
                    heartbeat_mono_ns: v64,
                    ..base
                }),
                at
            ),
            "ttl_ms" => assert_eq!(
                changed(RedisRecord {
                    ttl_ms: v32,
                    ..base
                }),
                at
            ),
            "write_delay_us" => assert_eq!(
                changed(RedisRecord {
                    write_delay_us: v32,
                    ..base
                }),
                at
            ),
            "snapshot" => {
                let snapshot = Snapshot::from_words(core::array::from_fn(|i| v64 + i as u64));
                assert_eq!(changed(RedisRecord { snapshot, ..base }), at);
                let bytes = RedisRecord { snapshot, ..base }.encode();
                assert_eq!(bytes[*offset..offset + size], snapshot.to_le_bytes());
            }
            other => panic!("docs/FORMAT.md documents a record field {other:?} the code lacks"),
        }
    }
    // Every field of the record is documented (a new one fails here).
    let RedisRecord {
        writer_pid: _,
        publish_period_us: _,
        state: _,
        generation: _,
        heartbeat_seq: _,
        heartbeat_mono_ns: _,
        ttl_ms: _,
        write_delay_us: _,
        snapshot: _,
    } = base;
    assert_eq!(
        documented.len(),
        13,
        "record fields documented: {documented:?}"
    );
}

#[test]
fn the_constants_table_is_the_code() {
    let rows = table(&format_md(), "constants");
    let ms = |d: std::time::Duration| format!("{} ms", d.as_millis());
    let writer = WriterOptions::default();
    let expected: Vec<(&str, String)> = vec![
        (
            "MAGIC",
            String::from_utf8(MAGIC.to_le_bytes().to_vec()).unwrap(),
        ),
        ("LAYOUT_VERSION", LAYOUT_VERSION.to_string()),
        ("FILE_SIZE", FILE_SIZE.to_string()),
        ("HEADER_SIZE", HEADER_SIZE.to_string()),
        ("PAYLOAD_SIZE", PAYLOAD_SIZE.to_string()),
        ("SNAPSHOT_WORDS", SNAPSHOT_WORDS.to_string()),
        ("MAX_ENGINE_ID_LEN", MAX_ENGINE_ID_LEN.to_string()),
        ("STATE_ACTIVE", STATE_ACTIVE.to_string()),
        ("STATE_RETIRED", STATE_RETIRED.to_string()),
        ("FLAG_IDLE", FLAG_IDLE.to_string()),
        ("FLAG_SHUTTING_DOWN", FLAG_SHUTTING_DOWN.to_string()),
        ("RECORD_SIZE", RECORD_SIZE.to_string()),
        ("DEFAULT_STALE_AFTER", ms(DEFAULT_STALE_AFTER)),
        ("DEFAULT_MAX_CAPTURE_AGE", ms(DEFAULT_MAX_CAPTURE_AGE)),
        ("CLOCK_AHEAD_SLACK", ms(CLOCK_AHEAD_SLACK)),
        // The writer's defaults; the publisher's period is the same
        // (publisher/src/config.rs, `default_period_is_the_writers`).
        ("DEFAULT_PERIOD", ms(writer.publish_period)),
        ("DEFAULT_FILE_MODE", format!("{:o}", writer.mode)),
        ("DEFAULT_URI", DEFAULT_URI.to_owned()),
        ("DEFAULT_PREFIX", DEFAULT_PREFIX.to_owned()),
        ("DEFAULT_TTL", ms(DEFAULT_TTL)),
        ("READ_SPINS", READ_SPINS.to_string()),
        ("READ_YIELDS", READ_YIELDS.to_string()),
        (
            "DIGEST_MAGIC",
            String::from_utf8(DIGEST_MAGIC.to_le_bytes().to_vec()).unwrap(),
        ),
        ("DIGEST_LAYOUT_VERSION", DIGEST_LAYOUT_VERSION.to_string()),
        ("DIGEST_HEADER_SIZE", DIGEST_HEADER_SIZE.to_string()),
        ("DIGEST_ENTRY_SIZE", DIGEST_ENTRY_SIZE.to_string()),
        ("MAX_DIGEST_ENTRIES", MAX_DIGEST_ENTRIES.to_string()),
        ("BLOCK_TOKENS", BLOCK_TOKENS.to_string()),
        ("CACHE_DIR_SUFFIX", CACHE_DIR_SUFFIX.to_owned()),
        (
            "ROUTER_MAGIC",
            String::from_utf8(ROUTER_MAGIC.to_le_bytes().to_vec()).unwrap(),
        ),
        ("ROUTER_LAYOUT_VERSION", ROUTER_LAYOUT_VERSION.to_string()),
        ("ROUTER_HEADER_SIZE", ROUTER_HEADER_SIZE.to_string()),
        ("RESERVATION_SLOT_SIZE", RESERVATION_SLOT_SIZE.to_string()),
        ("MAX_ROUTER_ENGINES", MAX_ROUTER_ENGINES.to_string()),
        ("ROUTER_FILE_SIZE", ROUTER_FILE_SIZE.to_string()),
        ("ROUTERS_DIR_SUFFIX", ROUTERS_DIR_SUFFIX.to_owned()),
    ];
    let documented: Vec<(&str, String)> =
        rows.iter().map(|r| (r[0].as_str(), r[1].clone())).collect();
    assert_eq!(documented, expected, "docs/FORMAT.md constants vs the code");
    assert_eq!(STATE_ACTIVE, engine_state_shm_format::layout::STATE_ACTIVE);
    assert_eq!(
        STATE_RETIRED,
        engine_state_shm_format::layout::STATE_RETIRED
    );
    assert!(rows[0][2].contains(&format!("0x{MAGIC:016x}")));
    let digest_magic = rows.iter().find(|r| r[0] == "DIGEST_MAGIC").unwrap();
    assert!(digest_magic[2].contains(&format!("0x{DIGEST_MAGIC:016x}")));
    let router_magic = rows.iter().find(|r| r[0] == "ROUTER_MAGIC").unwrap();
    assert!(router_magic[2].contains(&format!("0x{ROUTER_MAGIC:016x}")));
}

fn size_of_digest_field<F>(_: fn(&DigestHeader) -> &F) -> usize {
    size_of::<F>()
}

/// The cache digest's table ("Cache residency") is digest_layout.rs: the
/// header by `offset_of!`, the control words by their indices, then the
/// entries (`8 × capacity` bytes).
#[test]
fn the_digest_table_is_the_layout() {
    let rows = table(&format_md(), "digest");
    let (entries, fixed) = rows.split_last().expect("rows");
    assert_eq!(
        (
            entries[0].as_str(),
            entries[1].as_str(),
            entries[2].as_str()
        ),
        ("128", "8 × capacity", "entries")
    );
    assert_eq!(number(&entries[0]), DIGEST_ENTRIES_OFFSET);
    assert_eq!(DIGEST_ENTRY_SIZE, 8);
    let fixed: Vec<(usize, usize, String)> = fixed
        .iter()
        .map(|r| (number(&r[0]), number(&r[1]), r[2].clone()))
        .collect();
    assert_contiguous(&fixed, DIGEST_HEADER_SIZE, "digest");
    macro_rules! header_field {
        ($f:ident) => {
            (
                stringify!($f),
                offset_of!(DigestHeader, $f),
                size_of_digest_field(|h| &h.$f),
            )
        };
    }
    let control = |name: &'static str, index: usize| (name, DIGEST_CONTROL_OFFSET + 8 * index, 8);
    let expected = [
        header_field!(magic),
        header_field!(layout_version),
        header_field!(header_size),
        header_field!(entry_size),
        header_field!(writer_pid),
        header_field!(capacity),
        header_field!(state),
        header_field!(generation),
        header_field!(created_unix_ns),
        header_field!(kv_block_size),
        header_field!(block_tokens),
        header_field!(reserved),
        ("seq", DIGEST_SEQ_OFFSET, 8),
        control("version", CONTROL_VERSION),
        control("captured_mono_ns", CONTROL_CAPTURED_MONO_NS),
        control("captured_unix_ns", CONTROL_CAPTURED_UNIX_NS),
        control("count", CONTROL_COUNT),
        control("held", CONTROL_HELD),
        (
            "reserved",
            DIGEST_CONTROL_OFFSET + 8 * (CONTROL_HELD + 1),
            8 * (DIGEST_CONTROL_WORDS - CONTROL_HELD - 1),
        ),
    ];
    let documented: Vec<(&str, usize, usize)> = fixed
        .iter()
        .map(|(offset, size, field)| (field.as_str(), *offset, *size))
        .collect();
    assert_eq!(
        documented, expected,
        "docs/FORMAT.md digest table vs digest_layout.rs"
    );
    assert_eq!(size_of::<DigestHeader>(), DIGEST_FIXED_HEADER_SIZE);
    // The Redis owner check compares the record's bytes: the same offsets.
    let record = layout(&format_md(), "redis-record");
    for (field, offset) in [
        ("writer_pid", offset_of!(DigestHeader, writer_pid)),
        ("state", offset_of!(DigestHeader, state)),
        ("generation", offset_of!(DigestHeader, generation)),
    ] {
        let in_record = record.iter().find(|(_, _, f)| f == field).unwrap();
        assert_eq!(in_record.0, offset, "{field}: digest vs Redis record");
    }
}

/// The reservation counters' table ("Shared reservations") is the word
/// order of `Reservations` (its field list, `Reservations::FIELD_NAMES`).
#[test]
fn the_reservations_table_is_the_word_order() {
    let rows = table(&format_md(), "reservations");
    let documented: Vec<(usize, usize, &str)> = rows
        .iter()
        .map(|r| (number(&r[0]), number(&r[1]), r[2].as_str()))
        .collect();
    let expected: Vec<(usize, usize, &str)> = Reservations::FIELD_NAMES
        .iter()
        .enumerate()
        .map(|(word, name)| (word, word * 8, *name))
        .collect();
    assert_eq!(
        documented, expected,
        "docs/FORMAT.md reservations table vs reservations.rs"
    );
    assert_eq!(size_of::<Reservations>(), RESERVATION_WORDS * 8);
}

/// The slot's table is where `encode_reservation_slot` puts the engine id,
/// the counters and the padding.
#[test]
fn the_reservation_slot_table_is_the_encoder() {
    let rows = layout(&format_md(), "reservation-slot");
    assert_contiguous(&rows, RESERVATION_SLOT_SIZE, "reservation-slot");
    let expected = [
        ("engine_id", 0, SLOT_COUNTERS_OFFSET),
        (
            "counters",
            SLOT_COUNTERS_OFFSET,
            SLOT_PADDING_OFFSET - SLOT_COUNTERS_OFFSET,
        ),
        (
            "reserved",
            SLOT_PADDING_OFFSET,
            RESERVATION_SLOT_SIZE - SLOT_PADDING_OFFSET,
        ),
    ];
    let documented: Vec<(&str, usize, usize)> = rows
        .iter()
        .map(|(offset, size, field)| (field.as_str(), *offset, *size))
        .collect();
    assert_eq!(
        documented, expected,
        "docs/FORMAT.md reservation-slot table vs reservations.rs"
    );
    let id = engine_state_shm_format::EngineId::new("e-1").unwrap();
    let counters = Reservations::from_words(core::array::from_fn(|i| 0x0101 * (i as u64 + 1)));
    let slot = engine_state_shm_format::encode_reservation_slot(&id, &counters);
    assert_eq!(&slot[..3], b"e-1");
    assert!(slot[3..SLOT_COUNTERS_OFFSET].iter().all(|b| *b == 0));
    for (word, value) in counters.to_words().into_iter().enumerate() {
        let at = SLOT_COUNTERS_OFFSET + 8 * word;
        assert_eq!(slot[at..at + 8], value.to_le_bytes(), "word {word}");
    }
    assert!(slot[SLOT_PADDING_OFFSET..].iter().all(|b| *b == 0));
}

fn size_of_router_field<F>(_: fn(&RouterHeader) -> &F) -> usize {
    size_of::<F>()
}

/// The router file's table ("Shared reservations") is router_layout.rs:
/// the header by `offset_of!`, the control words and the replica id by
/// their offsets, then the slots (`128 × capacity` bytes).
#[test]
fn the_routers_table_is_the_layout() {
    let rows = table(&format_md(), "routers");
    let (slots, fixed) = rows.split_last().expect("rows");
    assert_eq!(
        (slots[0].as_str(), slots[1].as_str(), slots[2].as_str()),
        ("192", "128 × capacity", "slots")
    );
    assert_eq!(number(&slots[0]), ROUTER_SLOTS_OFFSET);
    assert_eq!(RESERVATION_SLOT_SIZE, 128);
    let fixed: Vec<(usize, usize, String)> = fixed
        .iter()
        .map(|r| (number(&r[0]), number(&r[1]), r[2].clone()))
        .collect();
    assert_contiguous(&fixed, ROUTER_SLOTS_OFFSET, "routers");
    macro_rules! header_field {
        ($f:ident) => {
            (
                stringify!($f),
                offset_of!(RouterHeader, $f),
                size_of_router_field(|h| &h.$f),
            )
        };
    }
    let expected = [
        header_field!(magic),
        header_field!(layout_version),
        header_field!(header_size),
        header_field!(slot_size),
        header_field!(writer_pid),
        header_field!(heartbeat_period_us),
        header_field!(state),
        header_field!(writer_pid_ns),
        header_field!(created_unix_ns),
        header_field!(generation),
        header_field!(capacity),
        header_field!(reserved),
        ("seq", ROUTER_SEQ_OFFSET, 8),
        ("heartbeat_mono_ns", ROUTER_HEARTBEAT_OFFSET, 8),
        ("count", ROUTER_COUNT_OFFSET, 8),
        ("changed_mono_ns", ROUTER_CHANGED_OFFSET, 8),
        (
            "reserved",
            ROUTER_CHANGED_OFFSET + 8,
            REPLICA_ID_OFFSET - ROUTER_CHANGED_OFFSET - 8,
        ),
        ("replica_id", REPLICA_ID_OFFSET, REPLICA_ID_FIELD_SIZE),
    ];
    let documented: Vec<(&str, usize, usize)> = fixed
        .iter()
        .map(|(offset, size, field)| (field.as_str(), *offset, *size))
        .collect();
    assert_eq!(
        documented, expected,
        "docs/FORMAT.md routers table vs router_layout.rs"
    );
    assert_eq!(size_of::<RouterHeader>(), ROUTER_HEADER_SIZE);
    // Creation and liveness share these words with the engine file's header.
    let file = layout(&format_md(), "file");
    for (field, offset) in [
        ("writer_pid", offset_of!(RouterHeader, writer_pid)),
        ("state", offset_of!(RouterHeader, state)),
        ("writer_pid_ns", offset_of!(RouterHeader, writer_pid_ns)),
        ("generation", offset_of!(RouterHeader, generation)),
    ] {
        let in_file = file.iter().find(|(_, _, f)| f == field).unwrap();
        assert_eq!(in_file.0, offset, "{field}: router file vs engine file");
    }
}

/// The JSON float cases are what serde_json (the encoder of `esdump --json`
/// and Python's `to_dict` keys' values) prints, and read back exactly.
#[test]
fn the_json_floats_table_is_what_esdump_prints() {
    let rows = table(&format_md(), "json_floats");
    assert!(rows.len() >= 10, "{rows:?}");
    for row in rows {
        let value: f64 = row[0].parse().unwrap_or_else(|e| panic!("{row:?}: {e}"));
        let printed = serde_json::to_string(&value).unwrap();
        assert_eq!(printed, row[1], "docs/FORMAT.md json_floats row {row:?}");
        assert_eq!(printed.parse::<f64>().unwrap(), value, "{row:?} reads back");
    }
    // The empty array, as the section says.
    let empty: Vec<engine_state_reader::EngineState> = Vec::new();
    assert_eq!(serde_json::to_string_pretty(&empty).unwrap() + "\n", "[]\n");
}

/// The redaction cases are what `redact` shows (esdump-go's test reads the
/// same table).
#[test]
fn the_uri_redact_table_is_what_redact_shows() {
    let rows = table(&format_md(), "uri_redact");
    assert!(rows.len() >= 8, "{rows:?}");
    for row in rows {
        assert_eq!(
            engine_state_settings::redact(&row[0]),
            row[1],
            "docs/FORMAT.md uri_redact row {row:?}"
        );
    }
}

/// The escaping cases are what `printable` writes (esdump-go's test reads
/// the same table): each character between two letters.
#[test]
fn the_printable_table_is_what_printable_writes() {
    let rows = table(&format_md(), "printable");
    assert!(rows.len() >= 10, "{rows:?}");
    for row in rows {
        let code = row[0]
            .strip_prefix("U+")
            .and_then(|hex| u32::from_str_radix(hex, 16).ok())
            .and_then(char::from_u32)
            .unwrap_or_else(|| panic!("{row:?}: not U+hex"));
        assert_eq!(
            engine_state_reader::printable(&format!("a{code}b")),
            format!("a{}b", row[1]),
            "docs/FORMAT.md printable row {row:?}"
        );
    }
}

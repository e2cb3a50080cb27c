//! The cache residency vectors (`format/vectors/cache/`): digest files made
//! by the real `DigestWriter` and Redis values by `encode_digest_value`,
//! with the header fields a writer stamps from its process pinned and the
//! damage of the bad cases applied; what a reader must make of each (the
//! digest, or an error class); and the router block hashes of a few token
//! lists.

use std::path::Path;

use engine_state_shm_format::blocks::{block_hashes, BLOCK_TOKENS, CHAIN_SEED};
use engine_state_shm_format::digest_layout::{
    DIGEST_CONTROL_OFFSET, DIGEST_ENTRIES_OFFSET, DIGEST_SEQ_OFFSET, DIGEST_STATE_WORD,
};
use engine_state_shm_format::{
    cache_dir, decode_digest_value, encode_digest_value, CacheDigest, DigestError, DigestFile,
    DigestOptions, DigestRecord, DigestWriter, EngineId, Error, MAX_DIGEST_ENTRIES,
};
use serde_json::{json, Value};

use crate::cases::{CREATED_UNIX_NS, WRITER_PID};

/// The engine generation every digest vector belongs to.
pub const GENERATION: u64 = 7;
const KV_BLOCK_SIZE: u32 = 16;
const CAPTURED_MONO_NS: u64 = 1_999_750_000_000;
const CAPTURED_UNIX_NS: u64 = 1_767_225_612_345_678_901;

/// A deterministic token stream: token `i` of prompt `seed`.
fn tokens(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| {
            seed.wrapping_mul(7919)
                .wrapping_add(i.wrapping_mul(2_654_435_761))
                % 151_936
        })
        .collect()
}

/// The blocks an engine holding these prompts holds (prefix-closed: every
/// block of each prompt), as a digest of `version`.
fn digest(version: u64, prompts: &[(u32, usize)]) -> CacheDigest {
    let blocks = prompts
        .iter()
        .flat_map(|(seed, blocks)| block_hashes(&tokens(*seed, blocks * BLOCK_TOKENS)))
        .collect();
    CacheDigest::new(version, CAPTURED_MONO_NS, blocks)
}

/// How a vector is damaged after the writer made it.
#[derive(Clone)]
pub enum Damage {
    /// Retired by the writer itself (`DigestWriter::retire`).
    Retire,
    /// Bytes overwritten: (offset, bytes).
    Bytes(usize, Vec<u8>),
    /// Cut or extended to this length.
    Length(usize),
}

pub struct CacheCase {
    pub name: &'static str,
    pub what: &'static str,
    /// `cache_file` or `cache_value`.
    pub kind: &'static str,
    pub capacity: usize,
    pub digest: CacheDigest,
    pub held: u64,
    pub damage: Vec<Damage>,
    pub error: Option<&'static str>,
    pub found_version: Option<u32>,
}

fn le(v: u64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

fn control(index: usize) -> usize {
    DIGEST_CONTROL_OFFSET + 8 * index
}

fn entry(index: usize) -> usize {
    DIGEST_ENTRIES_OFFSET + 8 * index
}

pub fn cache_cases() -> Vec<CacheCase> {
    let five = digest(3, &[(1, 3), (2, 2)]);
    let sorted = five.blocks().to_vec();
    let ok = |name, what, kind, capacity: usize, digest: CacheDigest, held| CacheCase {
        name,
        what,
        kind,
        capacity,
        digest,
        held,
        damage: vec![],
        error: None,
        found_version: None,
    };
    let bad = |name, what, kind, error, damage: Vec<Damage>| CacheCase {
        error: Some(error),
        damage,
        ..ok(name, what, kind, 8, five.clone(), 5)
    };
    let f = "cache_file";
    let v = "cache_value";
    vec![
        ok(
            "file_active",
            "two prompts' blocks (3 and 2), capacity 8: 5 entries, version 3",
            f,
            8,
            five.clone(),
            5,
        ),
        ok(
            "file_empty",
            "an engine whose cache holds no full block: count 0",
            f,
            4,
            digest(1, &[]),
            0,
        ),
        ok(
            "file_cut",
            "capacity 3, the engine held 10 blocks: cut to 3, held 10",
            f,
            3,
            digest(9, &[(3, 3)]),
            10,
        ),
        CacheCase {
            damage: vec![Damage::Retire],
            ..ok(
                "file_retired",
                "retired by its writer: reads, but state retired (a reader does not use it)",
                f,
                8,
                five.clone(),
                5,
            )
        },
        bad(
            "file_mid_write",
            "seq odd (a writer died mid-write): torn",
            f,
            "torn",
            vec![Damage::Bytes(DIGEST_SEQ_OFFSET, le(3))],
        ),
        bad(
            "file_seq_zero",
            "seq 0 (zeroed): never a digest, torn",
            f,
            "torn",
            vec![Damage::Bytes(DIGEST_SEQ_OFFSET, le(0))],
        ),
        bad(
            "file_bad_magic",
            "first 8 bytes not ESDIGEST",
            f,
            "not_digest",
            vec![Damage::Bytes(0, b"ENGSTATE".to_vec())],
        ),
        CacheCase {
            found_version: Some(2),
            ..bad(
                "file_version_2",
                "digest layout version 2: unknown, checked before the size",
                f,
                "unknown_version",
                vec![Damage::Bytes(8, 2u32.to_le_bytes().to_vec())],
            )
        },
        bad(
            "file_truncated",
            "100 bytes: shorter than a header",
            f,
            "wrong_size",
            vec![Damage::Length(100)],
        ),
        bad(
            "file_one_entry_short",
            "capacity 8 but room for 7 entries",
            f,
            "wrong_size",
            vec![Damage::Length(128 + 7 * 8)],
        ),
        bad(
            "file_bad_header_size",
            "header_size 64",
            f,
            "corrupt_cache",
            vec![Damage::Bytes(12, 64u16.to_le_bytes().to_vec())],
        ),
        bad(
            "file_bad_block_tokens",
            "block_tokens 256 (another block size)",
            f,
            "corrupt_cache",
            vec![Damage::Bytes(52, 256u32.to_le_bytes().to_vec())],
        ),
        bad(
            "file_bad_state",
            "state 3",
            f,
            "corrupt_cache",
            vec![Damage::Bytes(8 * DIGEST_STATE_WORD, le(3))],
        ),
        bad(
            "file_capacity_over_max",
            "capacity MAX_DIGEST_ENTRIES + 1: refused before the size is looked at",
            f,
            "corrupt_cache",
            vec![Damage::Bytes(
                20,
                (MAX_DIGEST_ENTRIES as u32 + 1).to_le_bytes().to_vec(),
            )],
        ),
        bad(
            "file_count_over_capacity",
            "count 9 of capacity 8",
            f,
            "corrupt_cache",
            vec![Damage::Bytes(control(3), le(9))],
        ),
        bad(
            "file_held_below_count",
            "held 4 below count 5",
            f,
            "corrupt_cache",
            vec![Damage::Bytes(control(4), le(4))],
        ),
        bad(
            "file_version_zero",
            "version 0: never published",
            f,
            "corrupt_cache",
            vec![Damage::Bytes(control(0), le(0))],
        ),
        bad(
            "file_unsorted",
            "entries 1 and 2 swapped",
            f,
            "corrupt_cache",
            vec![
                Damage::Bytes(entry(1), le(sorted[2])),
                Damage::Bytes(entry(2), le(sorted[1])),
            ],
        ),
        bad(
            "file_duplicate",
            "entry 2 equal to entry 1 (not strictly ascending)",
            f,
            "corrupt_cache",
            vec![Damage::Bytes(entry(2), le(sorted[1]))],
        ),
        ok(
            "value_active",
            "the Redis value of file_active: 128 + 5 × 8 bytes",
            v,
            5,
            five.clone(),
            5,
        ),
        ok(
            "value_empty",
            "a value with no entries: the header alone",
            v,
            0,
            digest(1, &[]),
            0,
        ),
        ok(
            "value_cut",
            "the value of file_cut: 3 entries, held 10",
            v,
            3,
            digest(9, &[(3, 3)]),
            10,
        ),
        CacheCase {
            capacity: 5,
            ..bad(
                "value_short",
                "7 bytes",
                v,
                "not_digest",
                vec![Damage::Length(7)],
            )
        },
        CacheCase {
            capacity: 5,
            ..bad(
                "value_bad_magic",
                "an engine record's magic",
                v,
                "not_digest",
                vec![Damage::Bytes(0, b"ENGSTATE".to_vec())],
            )
        },
        CacheCase {
            capacity: 5,
            found_version: Some(2),
            ..bad(
                "value_version_2",
                "digest layout version 2",
                v,
                "unknown_version",
                vec![Damage::Bytes(8, 2u32.to_le_bytes().to_vec())],
            )
        },
        CacheCase {
            capacity: 5,
            ..bad(
                "value_header_cut",
                "100 bytes: shorter than a header",
                v,
                "wrong_size",
                vec![Damage::Length(100)],
            )
        },
        CacheCase {
            capacity: 5,
            ..bad(
                "value_extra_byte",
                "one byte more than 128 + 8 × capacity",
                v,
                "wrong_size",
                vec![Damage::Length(128 + 5 * 8 + 1)],
            )
        },
        CacheCase {
            capacity: 5,
            ..bad(
                "value_retired",
                "state RETIRED (writers delete their value instead)",
                v,
                "corrupt_cache",
                vec![Damage::Bytes(8 * DIGEST_STATE_WORD, le(2))],
            )
        },
        CacheCase {
            capacity: 5,
            ..bad(
                "value_count_below_capacity",
                "count 4 of capacity 5 (a value's are equal)",
                v,
                "corrupt_cache",
                vec![Damage::Bytes(control(3), le(4))],
            )
        },
        CacheCase {
            capacity: 5,
            ..bad(
                "value_capacity_over_max",
                "capacity MAX_DIGEST_ENTRIES + 1",
                v,
                "corrupt_cache",
                vec![Damage::Bytes(
                    20,
                    (MAX_DIGEST_ENTRIES as u32 + 1).to_le_bytes().to_vec(),
                )],
            )
        },
        CacheCase {
            capacity: 5,
            ..bad(
                "value_unsorted",
                "entries 1 and 2 swapped",
                v,
                "corrupt_cache",
                vec![
                    Damage::Bytes(entry(1), le(sorted[2])),
                    Damage::Bytes(entry(2), le(sorted[1])),
                ],
            )
        },
    ]
}

/// The bytes of a case: the real writer's file (or value), pinned and damaged.
pub fn cache_bytes(case: &CacheCase) -> Vec<u8> {
    let mut bytes = match case.kind {
        "cache_file" => file_bytes(case),
        _ => encode_digest_value(&DigestRecord {
            writer_pid: WRITER_PID,
            generation: GENERATION,
            created_unix_ns: CREATED_UNIX_NS,
            kv_block_size: KV_BLOCK_SIZE,
            captured_unix_ns: CAPTURED_UNIX_NS,
            held: case.held,
            digest: case.digest.clone(),
        })
        .unwrap(),
    };
    for damage in &case.damage {
        match damage {
            Damage::Retire => {}
            Damage::Bytes(at, new) => bytes[*at..at + new.len()].copy_from_slice(new),
            Damage::Length(len) => bytes.resize(*len, 0),
        }
    }
    bytes
}

fn file_bytes(case: &CacheCase) -> Vec<u8> {
    let state = tempfile::tempdir().unwrap();
    let options = DigestOptions {
        capacity: case.capacity,
        generation: GENERATION,
        kv_block_size: KV_BLOCK_SIZE,
        ..DigestOptions::default()
    };
    let id = EngineId::new(case.name).unwrap();
    let mut writer = DigestWriter::create(
        state.path(),
        &id,
        &options,
        &case.digest,
        case.held,
        CAPTURED_UNIX_NS,
    )
    .unwrap();
    if case.damage.iter().any(|d| matches!(d, Damage::Retire)) {
        let bytes_before = std::fs::read(writer.path()).unwrap();
        // Retiring removes the file: keep its bytes with the state stored.
        let path = writer.path().to_owned();
        let kept = state.path().join("kept");
        std::fs::hard_link(&path, &kept).unwrap();
        writer.retire();
        let mut bytes = std::fs::read(&kept).unwrap();
        assert_eq!(bytes.len(), bytes_before.len());
        pin(&mut bytes);
        return bytes;
    }
    let mut bytes = std::fs::read(writer.path()).unwrap();
    drop(writer);
    pin(&mut bytes);
    bytes
}

/// The header fields a writer stamps from its process and clock.
fn pin(bytes: &mut [u8]) {
    bytes[16..20].copy_from_slice(&WRITER_PID.to_le_bytes());
    bytes[40..48].copy_from_slice(&CREATED_UNIX_NS.to_le_bytes());
}

/// What a reader must make of a good digest (the manifest's `expect`).
pub fn digest_json(record: &DigestRecord, capacity: usize, retired: bool) -> String {
    let value = json!({
        "state": if retired { "retired" } else { "active" },
        "writer_pid": record.writer_pid,
        "generation": record.generation,
        "created_unix_ns": record.created_unix_ns,
        "kv_block_size": record.kv_block_size,
        "capacity": capacity,
        "version": record.digest.version(),
        "captured_mono_ns": record.digest.captured_mono_ns(),
        "captured_unix_ns": record.captured_unix_ns,
        "count": record.digest.len(),
        "held": record.held,
        "blocks": record.digest.blocks(),
    });
    serde_json::to_string_pretty(&value).unwrap() + "\n"
}

/// The error class of a digest error (format/vectors/README.md).
pub fn digest_class(error: &DigestError) -> (&'static str, Option<u32>) {
    let found = match error {
        DigestError::UnknownVersion { found } => Some(*found),
        _ => None,
    };
    (error.kind(), found)
}

/// Reads a case as a reader does: a file written as `<dir>.cache/<id>` and
/// opened and read with `DigestFile`, a value decoded. The digest's JSON, or
/// the error class.
pub fn read_case(
    kind: &str,
    engine_id: &str,
    bytes: &[u8],
) -> Result<String, (&'static str, Option<u32>)> {
    match kind {
        "cache_file" => {
            let state = tempfile::tempdir().unwrap();
            let dir = cache_dir(&state.path().join("engines"));
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join(engine_id);
            std::fs::write(&path, bytes).unwrap();
            read_file(&path)
        }
        "cache_value" => decode_digest_value(bytes)
            .map(|record| {
                let capacity = record.digest.len();
                digest_json(&record, capacity, false)
            })
            .map_err(|e| digest_class(&e)),
        other => panic!("no cache vector kind {other}"),
    }
}

fn read_file(path: &Path) -> Result<String, (&'static str, Option<u32>)> {
    let file = DigestFile::open(path).map_err(|e| match e {
        Error::Digest { error, .. } => digest_class(&error),
        Error::RefusedEntry { .. } => ("refused_entry", None),
        other => panic!("no vector error class for {other}"),
    })?;
    let record = file.read_record().map_err(|e| digest_class(&e))?;
    Ok(digest_json(&record, file.capacity(), file.is_retired()))
}

/// The router block hashes of a few token lists
/// (`cache/block_hashes.json`): every binding that hashes prompts checks
/// its own function against it.
pub fn block_hash_vectors() -> String {
    let lists: Vec<(&str, &str, Vec<u32>)> = vec![
        ("empty", "no tokens: no block", vec![]),
        ("partial", "511 tokens: no full block", tokens(1, 511)),
        ("zeros", "one block of token 0", vec![0; 512]),
        (
            "two_and_a_bit",
            "1100 tokens: two full blocks, the rest ignored",
            (0..1100).map(|i| i % 1000).collect(),
        ),
        (
            "large_ids",
            "three blocks of ids near u32::MAX",
            (0..1536u32).map(|i| u32::MAX - i).collect(),
        ),
        (
            "shares_first_block",
            "the first block of `zeros`, then one other: its first hash is zeros' hash",
            [vec![0; 512], tokens(5, 512)].concat(),
        ),
    ];
    let cases: Vec<Value> = lists
        .into_iter()
        .map(|(name, what, tokens)| {
            let hashes = block_hashes(&tokens);
            json!({"name": name, "what": what, "tokens": tokens, "hashes": hashes})
        })
        .collect();
    let value = json!({
        "about": "router block hashes (docs/FORMAT.md, \"Keys: router block hashes\"): \
                  block_hashes(tokens) must equal hashes",
        "block_tokens": BLOCK_TOKENS,
        "chain_seed": CHAIN_SEED,
        "cases": cases,
    });
    serde_json::to_string(&value).unwrap() + "\n"
}

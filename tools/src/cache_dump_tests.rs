use std::io::{Seek, SeekFrom, Write};
use std::time::Duration;

use engine_state_reader::{EngineError, EngineState, Reading, Snapshot, Status};
use engine_state_shm_format::{
    digest_layout::DIGEST_ENTRIES_OFFSET, CacheDigest, DigestOptions, DigestRecord, DigestWriter,
    EngineId,
};

use super::*;

fn engine(id: &str, status: Status, cache_version: u64) -> EngineState {
    EngineState {
        engine_id: id.into(),
        status,
        snapshot: Snapshot {
            captured_mono_ns: 5_000_000_000,
            cache_blocks: 2,
            cache_version,
            ..Snapshot::default()
        },
        heartbeat_age: Duration::from_millis(3),
        capture_age: Duration::from_millis(40),
        generation: 7,
        read_mono_ns: 0,
        writer: Default::default(),
        clock_ahead: false,
        cache: None,
    }
}

fn record(generation: u64, version: u64, blocks: Vec<u64>) -> DigestRecord {
    DigestRecord {
        writer_pid: 1,
        generation,
        created_unix_ns: 1,
        kv_block_size: 16,
        captured_unix_ns: 42,
        held: 5,
        // Captured 2 s before the snapshot, on the writer's clock.
        digest: CacheDigest::new(version, 3_000_000_000, blocks),
    }
}

#[test]
fn a_block_is_16_lowercase_hex_digits() {
    assert_eq!(block_hex(0), "0000000000000000");
    assert_eq!(block_hex(0xABCD_EF01_2345_6789), "abcdef0123456789");
    assert_eq!(block_hex(u64::MAX), "ffffffffffffffff");
}

#[test]
fn the_argument_must_be_an_engine_id() {
    assert_eq!(engine_id_arg("e-0.x").unwrap().as_str(), "e-0.x");
    let err = engine_id_arg("a/b").unwrap_err().to_string();
    assert!(
        err.starts_with("--cache: invalid engine id") && err.contains("[A-Za-z0-9._-]"),
        "{err}"
    );
}

#[test]
fn an_unknown_engine_names_the_engines_there() {
    let reading = Reading {
        engines: vec![engine("a", Status::Fresh, 1), engine("b", Status::Fresh, 1)],
        errors: vec![],
    };
    assert_eq!(
        &*engine_of(&reading, "b", "file:///x").unwrap().engine_id,
        "b"
    );
    let err = engine_of(&reading, "c", "file:///x")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no engine \"c\" at file:///x (engines there: a, b)"),
        "{err}"
    );
    let many = Reading {
        engines: (0..12)
            .map(|i| engine(&format!("e{i:02}"), Status::Fresh, 1))
            .collect(),
        errors: vec![],
    };
    let err = engine_of(&many, "x", "u").unwrap_err().to_string();
    assert!(err.contains("e09, … (12 in all)"), "{err}");
    let err = engine_of(&Reading::default(), "x", "u")
        .unwrap_err()
        .to_string();
    assert!(err.contains("(engines there: none)"), "{err}");
}

#[test]
fn an_engine_that_cannot_be_read_says_why() {
    let reading = Reading {
        engines: vec![],
        errors: vec![EngineError::new(
            "bad",
            engine_state_shm_format::Error::NotEngineState {
                path: "/d/bad".into(),
            },
        )],
    };
    let err = engine_of(&reading, "bad", "u").unwrap_err().to_string();
    assert!(
        err.contains("engine \"bad\" cannot be read") && err.contains("bad magic"),
        "{err}"
    );
}

#[test]
fn a_digest_shows_every_field() {
    let e = engine("e0", Status::Fresh, 3);
    let fetched = Fetched::Digest(record(7, 3, vec![0x20, 0x1]), Some(8));
    let dump = dump(&e, "loc", fetched, None).unwrap();
    assert_eq!(
        dump,
        CacheDump {
            engine_id: "e0".into(),
            status: "fresh".into(),
            generation: 7,
            version: 3,
            count: 2,
            held: 5,
            capacity: Some(8),
            kv_block_size: Some(16),
            captured_unix_ns: 42,
            // 40 ms since the snapshot's capture, which was 2 s after the digest's.
            captured_age_ms: 2040.0,
            blocks: vec!["0000000000000001".into(), "0000000000000020".into()],
        }
    );
    assert_eq!(
        dump.text(),
        "engine e0  status fresh  version 3  count 2  held 5  capacity 8  kv_block_size 16  \
         captured_age_ms 2040.0\n0000000000000001\n0000000000000020\n"
    );
    assert_eq!(dump.warning(), None);
    let json = serde_json::to_value(&dump).unwrap();
    assert_eq!(json["blocks"][1], "0000000000000020");
    assert_eq!(json["capacity"], 8);
}

#[test]
fn what_is_not_known_is_a_dash_and_null() {
    let mut r = record(7, 1, vec![]);
    r.kv_block_size = 0;
    let dump = dump(
        &engine("e0", Status::Fresh, 1),
        "k",
        Fetched::Digest(r, None),
        // Shared memory: the age is this host's clock since the capture.
        Some(3_000_000_000 + 1_500_000),
    )
    .unwrap();
    assert_eq!(
        dump.text(),
        "engine e0  status fresh  version 1  count 0  held 5  capacity -  kv_block_size -  \
         captured_age_ms 1.5\n"
    );
    let json = serde_json::to_value(&dump).unwrap();
    assert!(json["capacity"].is_null() && json["kv_block_size"].is_null());
    assert_eq!(json["blocks"], serde_json::json!([]));
}

#[test]
fn a_stale_engines_digest_is_shown_with_a_warning() {
    let dump = dump(
        &engine("e0", Status::Stale, 3),
        "k",
        Fetched::Digest(record(7, 3, vec![1]), None),
        None,
    )
    .unwrap();
    assert!(dump.header().contains("status stale"));
    let warning = dump.warning().unwrap();
    assert!(
        warning.contains("\"e0\" is stale") && warning.contains("routers do not use it"),
        "{warning}"
    );
}

#[test]
fn errors_say_what_is_wrong_and_what_to_do() {
    let e = engine("e0", Status::Fresh, 3);
    let err = |fetched, e: &EngineState| dump(e, "LOC", fetched, None).unwrap_err().to_string();
    let none = err(
        Fetched::Digest(record(7, 1, vec![]), None),
        &engine("e0", Status::Fresh, 0),
    );
    assert!(
        none.contains("publishes no cache digest") && none.contains("cache_version is 0"),
        "{none}"
    );
    let missing = err(Fetched::Missing, &e);
    assert!(
        missing.contains("names cache digest version 3, but LOC does not exist"),
        "{missing}"
    );
    let retired = err(Fetched::Retired, &e);
    assert!(retired.contains("retired by its writer"), "{retired}");
    let corrupt = err(
        Fetched::Refused(
            "corrupt_cache",
            "corrupt cache digest (x); remove it".into(),
        ),
        &e,
    );
    assert!(
        corrupt
            .contains("at LOC cannot be used (corrupt_cache): corrupt cache digest (x); remove it"),
        "{corrupt}"
    );
    let other_run = err(Fetched::Digest(record(6, 3, vec![1]), None), &e);
    assert!(
        other_run.contains("belongs to generation 6") && other_run.contains("current generation 7"),
        "{other_run}"
    );
}

/// A digest file of engine `e0` under `dir` (the state directory).
fn digest_file(dir: &Path, blocks: Vec<u64>) -> DigestWriter {
    let options = DigestOptions {
        capacity: 4,
        generation: 7,
        kv_block_size: 32,
        ..DigestOptions::default()
    };
    let held = blocks.len() as u64 + 1;
    let digest = CacheDigest::new(1, monotonic_ns(), blocks);
    DigestWriter::create(
        dir,
        &EngineId::new("e0").unwrap(),
        &options,
        &digest,
        held,
        9,
    )
    .unwrap()
}

#[test]
fn a_digest_file_is_read_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("engines");
    std::fs::create_dir(&dir).unwrap();
    assert!(matches!(fetch_shm(&dir, "e0").1, Fetched::Missing));
    let _writer = digest_file(&dir, vec![9, 4]);
    let (location, fetched) = fetch_shm(&dir, "e0");
    assert_eq!(location, cache_dir(&dir).join("e0").display().to_string());
    let Fetched::Digest(record, capacity) = fetched else {
        panic!("{fetched:?}")
    };
    assert_eq!(
        (
            record.digest.blocks(),
            record.held,
            record.kv_block_size,
            capacity
        ),
        (&[4u64, 9][..], 3, 32, Some(4))
    );
}

#[test]
fn a_damaged_digest_file_gives_its_class() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("engines");
    std::fs::create_dir(&dir).unwrap();
    let writer = digest_file(&dir, vec![4, 9]);
    let path = cache_dir(&dir).join("e0");
    // The entries out of order: the format's `corrupt_cache`.
    let mut file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.seek(SeekFrom::Start(DIGEST_ENTRIES_OFFSET as u64))
        .unwrap();
    file.write_all(&9u64.to_le_bytes()).unwrap();
    file.write_all(&4u64.to_le_bytes()).unwrap();
    match fetch_shm(&dir, "e0").1 {
        Fetched::Refused(class, message) => {
            assert_eq!(class, "corrupt_cache", "{message}");
            assert!(message.contains("remove it"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // (Not under a live writer's mapping: shortening the file would fault it.)
    drop(writer);
    std::fs::write(&path, b"not a digest at all").unwrap();
    assert!(matches!(
        fetch_shm(&dir, "e0").1,
        Fetched::Refused("not_digest", _)
    ));
}

#[test]
fn a_link_is_refused_not_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("engines");
    std::fs::create_dir_all(cache_dir(&dir)).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", cache_dir(&dir).join("e0")).unwrap();
    assert!(matches!(
        fetch_shm(&dir, "e0").1,
        Fetched::Refused("refused_entry", _)
    ));
}

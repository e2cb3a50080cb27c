//! Tests of a router replica's reservations file (docs/FORMAT.md, "Shared
//! reservations"): the writer's changes as readers see them, creation,
//! replacement and retirement, and what other processes can put into (or
//! do to) the routers directory. None may hang, panic or kill a reader.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::router_layout::*;
use crate::*;

fn id(s: &str) -> EngineId {
    EngineId::new(s).unwrap()
}

fn counters(n: u64) -> Reservations {
    Reservations {
        num_requests: n,
        ongoing_tokens: 100 * n,
        pending_prefill_tokens: 10 * n,
        ongoing_decode_tokens: 90 * n,
        num_prefilling: n / 2,
        max_prefill_remaining: 7 * n,
    }
}

fn create(state_dir: &Path, replica: &str) -> RouterFileWriter {
    RouterFileWriter::create(state_dir, &id(replica), &RouterWriterOptions::default()).unwrap()
}

fn pairs(engines: &[(EngineId, Reservations)]) -> Vec<(&str, Reservations)> {
    engines.iter().map(|(e, r)| (e.as_str(), *r)).collect()
}

/// The class of a router format error from `open`.
fn open_kind(path: &Path) -> &'static str {
    match RouterFile::open(path) {
        Err(Error::Router { error, .. }) => error.kind(),
        other => panic!("{}: {other:?}", path.display()),
    }
}

fn poke(path: &Path, offset: u64, bytes: &[u8]) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .write_at(bytes, offset)
        .unwrap();
}

#[test]
fn set_update_remove_as_readers_see_them() {
    let state = tempfile::tempdir().unwrap();
    let now = Arc::new(AtomicU64::new(1_000));
    let options = RouterWriterOptions {
        clock: Clock::from_fn({
            let now = Arc::clone(&now);
            move || now.load(Ordering::Relaxed)
        }),
        ..RouterWriterOptions::default()
    };
    let mut writer = RouterFileWriter::create(state.path(), &id("router-a"), &options).unwrap();
    assert_eq!(
        writer.path(),
        routers_dir(state.path()).join("router-a").as_path()
    );
    let reader = RouterFile::open(writer.path()).unwrap();
    let empty = reader.read().unwrap();
    assert_eq!(
        (empty.replica_id.as_str(), empty.generation, empty.seq),
        ("router-a", 1, 2)
    );
    assert!(empty.engines.is_empty());
    assert_eq!(empty.heartbeat_mono_ns, 1_000);

    for (n, engine) in ["e0", "e1", "e2", "e3"].into_iter().enumerate() {
        now.store(2_000 + n as u64, Ordering::Relaxed);
        writer.set(engine, &counters(n as u64 + 1)).unwrap();
    }
    let record = reader.read().unwrap();
    assert_eq!(record.seq, 10);
    assert_eq!(record.changed_mono_ns, 2_003);
    assert_eq!(pairs(&record.engines), pairs(writer.engines()));
    assert_eq!(record.engines[2], (id("e2"), counters(3)));

    // An update stores only the slot's counters; an unchanged one stores nothing.
    now.store(3_000, Ordering::Relaxed);
    writer.set("e1", &counters(9)).unwrap();
    writer.set("e1", &counters(9)).unwrap();
    let record = reader.read().unwrap();
    assert_eq!((record.seq, record.changed_mono_ns), (12, 3_000));
    assert_eq!(record.engines[1], (id("e1"), counters(9)));
    assert_eq!(writer.get("e1"), Some(&counters(9)));

    // Removing a middle slot moves the last one into it; the vacated slot is zeroed.
    assert!(writer.remove("e1").unwrap());
    assert!(!writer.remove("e1").unwrap());
    let record = reader.read().unwrap();
    assert_eq!(
        pairs(&record.engines),
        [
            ("e0", counters(1)),
            ("e3", counters(4)),
            ("e2", counters(3))
        ]
    );
    let mut vacated = [0u8; 128];
    std::fs::File::open(writer.path())
        .unwrap()
        .read_exact_at(&mut vacated, router_slot_offset(3) as u64)
        .unwrap();
    assert_eq!(vacated, [0u8; 128]);
    // The moved engine is updated in its new slot, and the last one can go.
    writer.set("e3", &Reservations::default()).unwrap();
    assert!(writer.remove("e2").unwrap());
    let record = reader.read().unwrap();
    assert_eq!(
        pairs(&record.engines),
        [("e0", counters(1)), ("e3", Reservations::default())]
    );
    assert_eq!(writer.get("e2"), None);
}

#[test]
fn read_into_follows_every_change_and_empties_on_an_error() {
    let state = tempfile::tempdir().unwrap();
    let mut writer = create(state.path(), "r");
    writer.set("a", &counters(1)).unwrap();
    writer.set("b", &counters(2)).unwrap();
    let reader = RouterFile::open(writer.path()).unwrap();
    let mut record = reader.read().unwrap();
    writer.set("b", &counters(3)).unwrap();
    writer.remove("a").unwrap();
    writer.set("c", &counters(4)).unwrap();
    reader.read_into(&mut record).unwrap();
    assert_eq!(record, reader.read().unwrap());
    assert_eq!(
        pairs(&record.engines),
        [("b", counters(3)), ("c", counters(4))]
    );
    poke(writer.path(), router_slot_offset(1) as u64, b"b\0");
    let err = reader.read_into(&mut record).unwrap_err();
    assert!(
        err.to_string().contains("engine b is in slots 0 and 1"),
        "{err}"
    );
    assert!(record.engines.is_empty());
    assert_eq!(record.replica_id.as_str(), "r");
    writer.set("c", &counters(5)).unwrap(); // rewrites only c's counters, not its id
    assert!(reader.read_into(&mut record).is_err());
}

#[test]
fn more_engines_than_capacity_is_an_error_not_a_panic() {
    let state = tempfile::tempdir().unwrap();
    let mut writer = create(state.path(), "r");
    for n in 0..MAX_ROUTER_ENGINES {
        writer.set(&format!("e{n}"), &counters(n as u64)).unwrap();
    }
    let err = writer.set("one-more", &counters(1)).unwrap_err();
    assert!(
        matches!(err, Error::RouterCapacity { capacity: 256, .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("\"one-more\"") && text.contains("256 engines"),
        "{text}"
    );
    // Known engines still update, and a removal makes room.
    writer.set("e7", &counters(70)).unwrap();
    writer.remove("e0").unwrap();
    writer.set("one-more", &counters(1)).unwrap();
    let record = RouterFile::open(writer.path()).unwrap().read().unwrap();
    assert_eq!(record.engines.len(), MAX_ROUTER_ENGINES);
    assert_eq!(pairs(&record.engines), pairs(writer.engines()));
}

#[test]
fn invalid_engine_ids_are_refused_before_anything_is_written() {
    let state = tempfile::tempdir().unwrap();
    let mut writer = create(state.path(), "r");
    for bad in ["", "a/b", ".x", &"x".repeat(64)] {
        let err = writer.set(bad, &counters(1)).unwrap_err();
        assert!(
            matches!(err, Error::InvalidEngineId { .. }),
            "{bad:?}: {err:?}"
        );
    }
    assert_eq!(
        RouterFile::open(writer.path()).unwrap().read().unwrap().seq,
        2
    );
}

#[test]
fn one_writer_per_replica_and_retire_on_drop() {
    let state = tempfile::tempdir().unwrap();
    let mut writer = create(state.path(), "r");
    writer.set("e", &counters(1)).unwrap();
    let err = RouterFileWriter::create(state.path(), &id("r"), &RouterWriterOptions::default())
        .unwrap_err();
    assert!(matches!(err, Error::ReplicaInUse { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains(&format!("pid {}", std::process::id()))
            && text.contains("another replica id"),
        "{text}"
    );
    let reader = RouterFile::open(writer.path()).unwrap();
    let path = writer.path().to_owned();
    drop(writer);
    assert!(reader.is_retired());
    assert!(!path.exists(), "dropping the writer removes its file");
    // The reader's mapping still reads the last reservations.
    assert_eq!(reader.read().unwrap().engines.len(), 1);
    let again = create(state.path(), "r");
    assert_eq!(again.generation(), 1);
}

#[test]
fn a_dead_writers_file_is_retired_and_replaced_with_the_next_generation() {
    let state = tempfile::tempdir().unwrap();
    let mut writer = create(state.path(), "r");
    writer.set("e", &counters(1)).unwrap();
    let bytes = std::fs::read(writer.path()).unwrap();
    let path = writer.path().to_owned();
    drop(writer);
    // What a killed router leaves: its file, ACTIVE, no lock held.
    std::fs::write(&path, &bytes).unwrap();
    let stale = RouterFile::open(&path).unwrap();
    assert!(!stale.is_retired());
    let fresh = create(state.path(), "r");
    assert_eq!(fresh.generation(), 2);
    assert!(
        stale.is_retired(),
        "the dead file was retired for its readers"
    );
    let record = RouterFile::open(&path).unwrap().read().unwrap();
    assert_eq!((record.generation, record.engines.len()), (2, 0));
}

#[test]
fn replace_carries_the_reservations_into_a_new_generation() {
    let state = tempfile::tempdir().unwrap();
    let mut writer = create(state.path(), "r");
    writer.set("a", &counters(1)).unwrap();
    writer.set("b", &counters(2)).unwrap();
    let old_beat = writer.heartbeat();
    let old = RouterFile::open(writer.path()).unwrap();
    // Another process removed the file: readers no longer see it.
    std::fs::remove_file(writer.path()).unwrap();
    assert!(!old_beat.in_place() && !writer.in_place());
    writer.replace().unwrap();
    assert!(writer.in_place() && writer.heartbeat().in_place());
    assert!(old.is_retired());
    assert!(!old_beat.beat(), "a retired file's heartbeat handle stops");
    assert!(writer.heartbeat().beat());
    let new = RouterFile::open(writer.path()).unwrap();
    let record = new.read().unwrap();
    assert_eq!(record.generation, 2);
    assert_eq!(
        pairs(&record.engines),
        [("a", counters(1)), ("b", counters(2))]
    );
    writer.set("a", &counters(5)).unwrap();
    assert_eq!(new.read().unwrap().engines[0].1, counters(5));
}

#[test]
fn heartbeat_stamps_until_retired() {
    let state = tempfile::tempdir().unwrap();
    let mut writer = create(state.path(), "r");
    let beat = writer.heartbeat();
    let reader = RouterFile::open(writer.path()).unwrap();
    let seq = reader.seq();
    assert!(beat.beat_at(42));
    assert_eq!(reader.heartbeat_mono_ns(), 42);
    assert_eq!(reader.read().unwrap().heartbeat_mono_ns, 42);
    assert_eq!(reader.seq(), seq, "a heartbeat is outside the seqlock");
    assert!(beat.clone().beat());
    assert!(reader.heartbeat_mono_ns() > 42);
    writer.retire();
    assert!(!beat.beat_at(50));
    assert!(writer.set("e", &counters(1)).is_err());
    assert!(writer.remove("e").is_err());
}

/// A reader racing a writer that inserts, updates and removes engines
/// accepts only whole readings: every slot's counters are those of one
/// `set` (all derived from one value), and no engine twice.
#[test]
fn concurrent_reads_are_whole() {
    let state = tempfile::tempdir().unwrap();
    let mut writer = create(state.path(), "r");
    let path = writer.path().to_owned();
    let done = Arc::new(AtomicBool::new(false));
    let iterations: u64 = 50_000;
    let handle = {
        let done = Arc::clone(&done);
        std::thread::spawn(move || {
            for v in 1..=iterations {
                let engine = format!("e{}", v % 11);
                if v % 7 == 0 {
                    writer.remove(&engine).unwrap();
                } else {
                    writer.set(&engine, &counters(v)).unwrap();
                }
            }
            done.store(true, Ordering::Release);
            writer
        })
    };
    let reader = RouterFile::open(&path).unwrap();
    let mut accepted = 0u64;
    while !done.load(Ordering::Acquire) || accepted == 0 {
        match reader.read() {
            Ok(record) => {
                for (engine, c) in &record.engines {
                    assert_eq!(
                        *c,
                        counters(c.num_requests),
                        "{engine}: mixed copy accepted"
                    );
                }
                accepted += 1;
            }
            Err(RouterError::Torn(_)) => {}
            Err(other) => panic!("{other}"),
        }
    }
    let writer = handle.join().unwrap();
    assert_eq!(
        pairs(&reader.read().unwrap().engines),
        pairs(writer.engines())
    );
}

// ---- hostile files -------------------------------------------------------

/// A routers directory with one valid replica file `r` (engines `a`, `b`).
fn fixture() -> (tempfile::TempDir, RouterFileWriter, PathBuf) {
    let state = tempfile::tempdir().unwrap();
    let mut writer = create(state.path(), "r");
    writer.set("a", &counters(1)).unwrap();
    writer.set("b", &counters(2)).unwrap();
    let path = writer.path().to_owned();
    (state, writer, path)
}

/// A copy of the fixture's file at `<routers>/<name>`, left unlocked.
fn copy_as(path: &Path, name: &str) -> PathBuf {
    let copy = path.with_file_name(name);
    std::fs::write(&copy, std::fs::read(path).unwrap()).unwrap();
    copy
}

#[test]
fn truncated_or_grown_files_are_wrong_size() {
    let (_state, _writer, path) = fixture();
    for size in [
        0u64,
        7,
        40,
        64,
        191,
        ROUTER_FILE_SIZE as u64 - 1,
        ROUTER_FILE_SIZE as u64 + 8,
    ] {
        let copy = copy_as(&path, "t");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&copy)
            .unwrap()
            .set_len(size)
            .unwrap();
        let err = RouterFile::open(&copy).unwrap_err();
        assert!(
            matches!(
                &err,
                Error::Router {
                    error: RouterError::WrongSize { .. },
                    ..
                }
            ),
            "{size}: {err:?}"
        );
        assert!(err.to_string().contains("truncated"), "{err}");
    }
}

#[test]
fn truncated_under_the_mapping_reads_torn() {
    let (_state, mut writer, path) = fixture();
    let reader = RouterFile::open(&path).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(0)
        .unwrap();
    assert!(matches!(reader.read(), Err(RouterError::Torn(_))));
    assert!(reader.is_truncated());
    assert!(!writer.in_place());
    writer.replace().unwrap();
    assert_eq!(
        RouterFile::open(&path)
            .unwrap()
            .read()
            .unwrap()
            .engines
            .len(),
        2
    );
}

#[test]
fn foreign_and_future_files_name_what_they_are() {
    let (state, _writer, path) = fixture();
    // An engine's file is no router file.
    let engine = ShmWriter::create(
        state.path(),
        &id("eng"),
        &WriterOptions::default(),
        &Snapshot::default(),
    )
    .unwrap();
    let routers = routers_dir(state.path());
    std::fs::copy(engine.path(), routers.join("eng")).unwrap();
    assert_eq!(open_kind(&routers.join("eng")), "not_router");
    std::fs::write(routers.join("junk"), b"hello").unwrap();
    assert_eq!(open_kind(&routers.join("junk")), "wrong_size");
    std::fs::write(routers.join("text"), [b'x'; 200]).unwrap();
    assert_eq!(open_kind(&routers.join("text")), "not_router");

    let future = copy_as(&path, "future");
    poke(&future, 8, &7u32.to_le_bytes());
    let err = RouterFile::open(&future).unwrap_err().to_string();
    assert!(
        err.contains("layout version 7") && err.contains("reads version 1"),
        "{err}"
    );
    // A future file of another size is still told by its version.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&future)
        .unwrap()
        .set_len(100)
        .unwrap();
    assert_eq!(open_kind(&future), "unknown_version");
}

#[test]
fn corrupt_headers_are_refused_at_open() {
    let (_state, _writer, path) = fixture();
    let cases: [(&str, u64, &[u8], &str); 5] = [
        ("slot size", 14, &64u16.to_le_bytes(), "header/slot size"),
        ("state", 24, &9u64.to_le_bytes(), "state 9"),
        ("capacity", 56, &257u32.to_le_bytes(), "capacity 257"),
        ("replica id", 128, b"r/x\0", "replica id is invalid"),
        ("name", 128, b"q\0", "names replica \"q\""),
    ];
    for (what, offset, bytes, message) in cases {
        let copy = copy_as(&path, "r2");
        // The copy is called r2: give it that replica id first.
        poke(&copy, 128, b"r2\0");
        poke(&copy, offset, bytes);
        let err = RouterFile::open(&copy).unwrap_err();
        assert!(
            matches!(
                &err,
                Error::Router {
                    error: RouterError::Corrupt { .. },
                    ..
                }
            ),
            "{what}: {err:?}"
        );
        assert!(err.to_string().contains(message), "{what}: {err}");
    }
    // A smaller capacity with the matching size is a valid file.
    let small = copy_as(&path, "small");
    poke(&small, 128, b"small\0");
    poke(&small, 56, &2u32.to_le_bytes());
    std::fs::OpenOptions::new()
        .write(true)
        .open(&small)
        .unwrap()
        .set_len(router_file_size(2) as u64)
        .unwrap();
    assert_eq!(
        RouterFile::open(&small)
            .unwrap()
            .read()
            .unwrap()
            .engines
            .len(),
        2
    );
}

#[test]
fn malformed_contents_are_a_per_replica_error() {
    let (_state, _writer, path) = fixture();
    let reader = RouterFile::open(&path).unwrap();
    let slot1 = router_slot_offset(1) as u64;
    let cases: [(&str, u64, &[u8], &str); 5] = [
        ("count", 80, &300u64.to_le_bytes(), "count 300 is above"),
        (
            "engine id",
            slot1,
            b"b b\0",
            "slot 1: a slot holds an invalid engine id",
        ),
        ("duplicate", slot1, b"a\0", "engine a is in slots 0 and 1"),
        (
            "padding",
            slot1 + 120,
            &[1],
            "slot 1: the padding of engine b",
        ),
        ("after NUL", slot1 + 10, b"z", "bytes after its NUL"),
    ];
    for (what, offset, bytes, message) in cases {
        let before = std::fs::read(&path).unwrap();
        poke(&path, offset, bytes);
        let err = reader.read().unwrap_err();
        assert_eq!(err.kind(), "corrupt_router", "{what}");
        assert!(err.to_string().contains(message), "{what}: {err}");
        assert!(err.to_string().contains("ignore this replica"), "{err}");
        assert_eq!(open_kind(&path), "corrupt_router", "{what}");
        std::fs::write(&path, before).unwrap();
        assert!(reader.read().is_ok(), "{what}: repaired");
    }
}

#[test]
fn a_write_in_progress_forever_is_torn_not_a_hang() {
    let (_state, _writer, path) = fixture();
    let reader = RouterFile::open(&path).unwrap();
    poke(&path, 64, &7u64.to_le_bytes());
    assert_eq!(
        reader.read(),
        Err(RouterError::Torn(seqlock::Torn { last_seq: 7 }))
    );
    // Opening such a file succeeds (its writer may be mid-write).
    RouterFile::open(&path).unwrap();
}

#[test]
fn fifos_directories_and_links_named_like_a_replica_are_refused() {
    let (state, _writer, path) = fixture();
    let routers = routers_dir(state.path());
    let fifo = routers.join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let dir = routers.join("dir");
    std::fs::create_dir(&dir).unwrap();
    let link = routers.join("link");
    std::os::unix::fs::symlink(&path, &link).unwrap();
    for (entry, what) in [
        (&fifo, "not a regular file (a FIFO)"),
        (&dir, "not a regular file (a directory)"),
        (&link, "symbolic link, not followed"),
    ] {
        let err = RouterFile::open(entry).unwrap_err();
        assert!(matches!(err, Error::RefusedEntry { .. }), "{err:?}");
        assert!(err.to_string().starts_with(what), "{err}");
    }
    // A writer never clobbers what is no router file at its path.
    for (name, kind) in [("fifo", "RefusedEntry"), ("dir", "RefusedEntry")] {
        let err =
            RouterFileWriter::create(state.path(), &id(name), &RouterWriterOptions::default())
                .unwrap_err();
        assert!(format!("{err:?}").starts_with(kind), "{name}: {err:?}");
    }
    std::fs::write(routers.join("foreign"), [b'x'; 64]).unwrap();
    let err = RouterFileWriter::create(
        state.path(),
        &id("foreign"),
        &RouterWriterOptions::default(),
    )
    .unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Router {
                error: RouterError::NotRouter,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(std::fs::read(routers.join("foreign")).unwrap(), [b'x'; 64]);
}

#[test]
fn a_file_replaced_under_the_reader_is_retired_and_reopened() {
    let (state, writer, path) = fixture();
    let old = RouterFile::open(&path).unwrap();
    let old_inode = old.inode();
    // The router restarts: the old writer is gone and a new one takes the id.
    drop(writer);
    let mut restarted = create(state.path(), "r");
    restarted.set("c", &counters(3)).unwrap();
    assert!(old.is_retired());
    let new = RouterFile::open(&path).unwrap();
    assert_ne!(new.inode(), old_inode);
    let record = new.read().unwrap();
    assert_eq!(pairs(&record.engines), [("c", counters(3))]);
    // The old mapping still reads what its writer left, whole.
    assert_eq!(old.read().unwrap().engines.len(), 2);
}

#[test]
fn the_routers_directory_is_made_with_the_state_directorys_mode() {
    use std::os::unix::fs::PermissionsExt;
    let state = tempfile::tempdir().unwrap();
    std::fs::set_permissions(state.path(), std::fs::Permissions::from_mode(0o751)).unwrap();
    let _writer = create(state.path(), "r");
    let mode = std::fs::metadata(routers_dir(state.path()))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o751);
    // A state directory that is a file is refused.
    let file = state.path().join("file");
    std::fs::write(&file, b"").unwrap();
    let err =
        RouterFileWriter::create(&file, &id("r"), &RouterWriterOptions::default()).unwrap_err();
    assert!(err.to_string().contains("not a directory"), "{err}");
}

//! Tests of the shared-memory source with real files (cross-process tests
//! live in the `tests` crate).

use std::time::Duration;

use engine_state_shm_format::{monotonic_ns, EngineId, ShmWriter, Snapshot, WriterOptions};

use crate::*;

fn writer(dir: &std::path::Path, id: &str, running: u64) -> ShmWriter {
    let snap = Snapshot {
        captured_mono_ns: monotonic_ns(),
        num_running: running,
        ..Snapshot::default()
    };
    ShmWriter::create(
        dir,
        &EngineId::new(id).unwrap(),
        &WriterOptions::default(),
        &snap,
    )
    .unwrap()
}

fn fast() -> ReaderOptions {
    ReaderOptions {
        rescan_interval: Duration::ZERO,
        ..ReaderOptions::default()
    }
}

#[test]
fn reads_every_engine_sorted_with_ages() {
    let dir = tempfile::tempdir().unwrap();
    let _b = writer(dir.path(), "b", 2);
    let _a = writer(dir.path(), "a", 1);
    let mut source = ShmDir::open(dir.path(), fast()).unwrap();
    let reading = source.read().unwrap();
    let ids: Vec<&str> = reading.engines.iter().map(|e| &*e.engine_id).collect();
    assert_eq!(ids, ["a", "b"]);
    assert!(reading.errors.is_empty());
    let a = reading.get("a").unwrap();
    assert_eq!(a.snapshot.num_running, 1);
    assert_eq!(a.status, Status::Fresh);
    assert!(a.heartbeat_age < Duration::from_secs(1));
    assert_eq!(
        source
            .read_engine("b")
            .unwrap()
            .unwrap()
            .snapshot
            .num_running,
        2
    );
    assert!(source.read_engine("zz").unwrap().is_none());
}

#[test]
fn notices_new_and_removed_engines() {
    let dir = tempfile::tempdir().unwrap();
    let mut source = ShmDir::open(dir.path(), fast()).unwrap();
    assert!(source.read().unwrap().engines.is_empty());
    let a = writer(dir.path(), "a", 1);
    assert_eq!(source.read().unwrap().engines.len(), 1);
    drop(a); // retires and removes
    let reading = source.read().unwrap();
    assert!(reading.engines.is_empty(), "{reading:?}");
}

#[test]
fn rescan_interval_bounds_directory_listings() {
    let dir = tempfile::tempdir().unwrap();
    let options = ReaderOptions {
        rescan_interval: Duration::from_secs(3600),
        ..ReaderOptions::default()
    };
    let mut source = ShmDir::open(dir.path(), options).unwrap();
    let _a = writer(dir.path(), "a", 1);
    assert!(
        source.read().unwrap().engines.is_empty(),
        "no listing before the interval"
    );
    source.rescan().unwrap();
    assert_eq!(source.read().unwrap().engines.len(), 1);
}

#[test]
fn retired_file_reads_dead_and_a_replacement_is_picked_up() {
    let dir = tempfile::tempdir().unwrap();
    let options = ReaderOptions {
        rescan_interval: Duration::from_secs(3600),
        ..ReaderOptions::default()
    };
    let mut old = writer(dir.path(), "e", 1);
    let mut source = ShmDir::open(dir.path(), options).unwrap();
    assert_eq!(source.read_engine("e").unwrap().unwrap().generation, 1);
    old.retire();
    let state = source.read_engine("e").unwrap().unwrap();
    assert_eq!(state.status, Status::Dead);
    assert_eq!(state.snapshot.num_running, 1);
    let _new = writer(dir.path(), "e", 5);
    std::thread::sleep(Duration::from_millis(25)); // past the reopen backoff
    let state = source.read_engine("e").unwrap().unwrap();
    assert_eq!(
        (state.status, state.generation, state.snapshot.num_running),
        (Status::Fresh, 1, 5)
    );
}

#[test]
fn stale_thresholds_apply() {
    let dir = tempfile::tempdir().unwrap();
    let _a = writer(dir.path(), "a", 1);
    let options = ReaderOptions {
        freshness: Freshness {
            stale_after: Duration::from_millis(30),
            ..Freshness::default()
        },
        ..fast()
    };
    let mut source = ShmDir::open(dir.path(), options).unwrap();
    assert_eq!(source.read().unwrap().engines[0].status, Status::Fresh);
    std::thread::sleep(Duration::from_millis(60)); // no heartbeat thread here
    let state = &source.read().unwrap().engines[0];
    assert_eq!(state.status, Status::Stale);
    assert!(state.heartbeat_age >= Duration::from_millis(60));
}

#[test]
fn bad_files_are_per_engine_errors_and_healthy_engines_still_read() {
    let dir = tempfile::tempdir().unwrap();
    let _good = writer(dir.path(), "good", 3);
    std::fs::write(dir.path().join("junk"), b"not an engine").unwrap();
    std::fs::write(dir.path().join("big"), vec![7u8; 5000]).unwrap();
    std::fs::write(dir.path().join(".e.tmp.123"), b"in creation").unwrap();
    std::fs::create_dir(dir.path().join("subdir")).unwrap();
    let mut source = ShmDir::open(dir.path(), fast()).unwrap();
    let reading = source.read().unwrap();
    assert_eq!(reading.engines.len(), 1);
    assert_eq!(reading.engines[0].snapshot.num_running, 3);
    let names: Vec<&str> = reading.errors.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["big", "junk", "subdir"]);
    for error in &reading.errors {
        assert!(error.to_string().contains(&error.name), "{error}");
    }
}

#[test]
fn missing_directory_is_a_clear_error() {
    let err = ShmDir::open("/nonexistent/engine-state", fast())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("/nonexistent/engine-state") && err.contains("--uri"),
        "{err}"
    );
}

#[test]
fn open_dispatches_on_the_uri() {
    let dir = tempfile::tempdir().unwrap();
    let _a = writer(dir.path(), "a", 1);
    let uri = StateUri::parse(&format!("file://{}", dir.path().display())).unwrap();
    let mut source = open(&uri, fast()).unwrap();
    assert_eq!(source.uri(), uri.to_string());
    assert_eq!(source.read().unwrap().engines.len(), 1);
}

#[test]
fn read_changed_returns_only_engines_that_published_since_the_last_read() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = writer(dir.path(), "a", 1);
    let _b = writer(dir.path(), "b", 2);
    let mut source = ShmDir::open(dir.path(), fast()).unwrap();
    let mut changed = Reading::default();
    let ids = |r: &Reading| {
        r.engines
            .iter()
            .map(|e| e.engine_id.to_string())
            .collect::<Vec<_>>()
    };
    source
        .read_changed_at(&mut changed, monotonic_ns(), None)
        .unwrap();
    assert_eq!(
        ids(&changed),
        ["a", "b"],
        "nothing read yet: everything is new"
    );
    source
        .read_changed_at(&mut changed, monotonic_ns(), None)
        .unwrap();
    assert!(changed.engines.is_empty(), "{changed:?}");
    a.stamp_heartbeat(monotonic_ns());
    source
        .read_changed_at(&mut changed, monotonic_ns(), None)
        .unwrap();
    assert!(
        changed.engines.is_empty(),
        "a heartbeat is not a new snapshot"
    );
    let snap = Snapshot {
        captured_mono_ns: monotonic_ns(),
        num_running: 9,
        ..Snapshot::default()
    };
    a.publish(&snap).unwrap();
    source
        .read_changed_at(&mut changed, monotonic_ns(), None)
        .unwrap();
    assert_eq!(ids(&changed), ["a"]);
    assert_eq!(changed.engines[0].snapshot.num_running, 9);
    // A full read counts as having read it.
    a.publish(&snap).unwrap();
    source.read().unwrap();
    source
        .read_changed_at(&mut changed, monotonic_ns(), None)
        .unwrap();
    assert!(changed.engines.is_empty(), "{changed:?}");
}

#[test]
fn read_changed_with_a_heartbeat_step_reports_heartbeats_that_moved_that_far() {
    let dir = tempfile::tempdir().unwrap();
    let a = writer(dir.path(), "a", 1);
    let b = writer(dir.path(), "b", 2);
    let mut source = ShmDir::open(dir.path(), fast()).unwrap();
    let mut changed = Reading::default();
    let step = Some(Duration::from_millis(25));
    let base = monotonic_ns();
    a.stamp_heartbeat(base);
    b.stamp_heartbeat(base);
    source.read_changed_at(&mut changed, base, step).unwrap();
    assert_eq!(
        changed.engines.len(),
        2,
        "nothing read yet: everything is new"
    );

    // Less than a step newer: not worth a read.
    a.stamp_heartbeat(base + 24_999_999);
    source.read_changed_at(&mut changed, base, step).unwrap();
    assert!(changed.engines.is_empty(), "{changed:?}");

    // A full step newer than what was last read: reported, with its age.
    a.stamp_heartbeat(base + 25_000_000);
    let now = base + 30_000_000;
    source.read_changed_at(&mut changed, now, step).unwrap();
    assert_eq!(changed.engines.len(), 1, "{changed:?}");
    assert_eq!(&*changed.engines[0].engine_id, "a");
    assert_eq!(changed.engines[0].heartbeat_age, Duration::from_millis(5));

    // Measured from the heartbeat last read, not from the first one.
    a.stamp_heartbeat(base + 40_000_000);
    source.read_changed_at(&mut changed, now, step).unwrap();
    assert!(changed.engines.is_empty(), "{changed:?}");

    // Without a step only snapshots count, however old the heartbeat read.
    b.stamp_heartbeat(base + 60_000_000);
    source.read_changed_at(&mut changed, now, None).unwrap();
    assert!(changed.engines.is_empty(), "{changed:?}");
    source.read_changed_at(&mut changed, now, step).unwrap();
    assert_eq!(&*changed.engines[0].engine_id, "b");
}

#[test]
fn read_changed_finds_a_replaced_file_once_the_old_heartbeat_is_late() {
    let dir = tempfile::tempdir().unwrap();
    let options = ReaderOptions {
        rescan_interval: Duration::from_secs(3600), // only the probe can find it
        ..ReaderOptions::default()
    };
    let mut old = writer(dir.path(), "e", 1);
    let mut source = ShmDir::open(dir.path(), options).unwrap();
    let mut changed = Reading::default();
    let step = Some(Duration::from_millis(25));
    source
        .read_changed_at(&mut changed, monotonic_ns(), step)
        .unwrap();
    assert_eq!(changed.engines.len(), 1);

    // A clean close: retired and removed, nothing replaces it.
    old.retire();
    let late = || monotonic_ns() + 1_000_000_000; // far past two periods
    source.read_changed_at(&mut changed, late(), step).unwrap();
    assert!(changed.engines.is_empty(), "{changed:?}");

    // A restarted engine's new file: not looked for while the old heartbeat
    // is recent, found (and read) once it is late.
    let _new = writer(dir.path(), "e", 5);
    std::thread::sleep(Duration::from_millis(25)); // past the reopen backoff
    source
        .read_changed_at(&mut changed, monotonic_ns(), step)
        .unwrap();
    assert!(changed.engines.is_empty(), "{changed:?}");
    source.read_changed_at(&mut changed, late(), step).unwrap();
    assert_eq!(changed.engines.len(), 1, "{changed:?}");
    assert_eq!(changed.engines[0].snapshot.num_running, 5);
    source.read_changed_at(&mut changed, late(), step).unwrap();
    assert!(changed.engines.is_empty(), "read once: {changed:?}");
}

#[test]
fn a_replay_time_in_the_past_neither_starves_nor_forces_listings() {
    let dir = tempfile::tempdir().unwrap();
    let _a = writer(dir.path(), "a", 1);
    let options = ReaderOptions {
        rescan_interval: Duration::from_millis(1),
        ..ReaderOptions::default()
    };
    let mut source = ShmDir::open(dir.path(), options).unwrap();
    let mut reading = Reading::default();
    source.read_at(&mut reading, 1).unwrap();
    let _b = writer(dir.path(), "b", 2);
    // More than the interval by the real clock; the caller's time stays at 1 ns.
    std::thread::sleep(Duration::from_millis(20));
    source.read_at(&mut reading, 1).unwrap();
    assert!(reading.get("b").is_some(), "{reading:?}");
    // And a time far ahead does not list on every read.
    let long = ReaderOptions {
        rescan_interval: Duration::from_secs(3600),
        ..ReaderOptions::default()
    };
    let mut source = ShmDir::open(dir.path(), long).unwrap();
    let _c = writer(dir.path(), "c", 3);
    source.read_at(&mut reading, u64::MAX / 2).unwrap();
    assert!(reading.get("c").is_none(), "{reading:?}");
}

#[test]
fn reading_one_engine_of_a_vanished_directory_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state");
    std::fs::create_dir(&path).unwrap();
    let _a = writer(&path, "a", 1);
    let mut source = ShmDir::open(&path, fast()).unwrap();
    assert!(source.read_engine("a").unwrap().is_some());
    assert!(source.read_engine("zz").unwrap().is_none());
    std::fs::remove_dir_all(&path).unwrap();
    let error = source.read_engine("a").unwrap_err();
    assert!(matches!(error, Error::Directory { .. }), "{error}");
    // Every read says so, not only the first.
    assert!(source.read_engine("a").is_err());
}

/// Stores `value` into the sequence word of `path` (`pwrite`, as another
/// process could).
fn store_seq(path: &std::path::Path, value: u64) {
    store_word(path, engine_state_shm_format::layout::SEQ_OFFSET, value);
}

fn store_word(path: &std::path::Path, offset: usize, value: u64) {
    use std::os::unix::fs::FileExt;
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .write_all_at(&value.to_le_bytes(), offset as u64)
        .unwrap();
}

/// A torn file whose writer is silent (heartbeat late) is spun once, not at
/// every read (1,000 of them took a read from 11 µs to 21 ms); a changed
/// sequence or heartbeat word makes the next read spin again, and a live
/// writer's torn file is never cached.
#[test]
fn a_torn_file_of_a_silent_writer_is_not_spun_at_every_read() {
    let dir = tempfile::tempdir().unwrap();
    let options = WriterOptions {
        publish_period: Duration::from_millis(1), // late after the 10 ms floor
        ..WriterOptions::default()
    };
    let writer = ShmWriter::create(
        dir.path(),
        &EngineId::new("torn").unwrap(),
        &options,
        &Snapshot::default(),
    )
    .unwrap();
    let path = dir.path().join("torn");
    store_seq(&path, 7);
    let mut source = ShmDir::open(dir.path(), fast()).unwrap();
    let read = |source: &mut ShmDir| source.read_engine("torn").unwrap().unwrap();
    // The heartbeat is fresh: the writer may finish its write; every read spins.
    writer.stamp_heartbeat(monotonic_ns());
    let first = read(&mut source);
    assert_eq!(first.status, Status::Torn);
    if monotonic_ns() - first.writer.heartbeat_mono_ns < 10_000_000 {
        assert_eq!(read(&mut source).status, Status::Torn);
        assert_eq!(
            source.torn_spins(),
            2,
            "a live writer's torn file is re-read"
        );
    }
    // Silent (its last heartbeat 50 ms ago, past the 10 ms floor): one more
    // spin, then none while nothing changes.
    writer.stamp_heartbeat(monotonic_ns() - 50_000_000);
    let before = source.torn_spins();
    for _ in 0..5 {
        assert_eq!(read(&mut source).status, Status::Torn);
    }
    assert_eq!(source.torn_spins(), before + 1, "spun once, then cached");
    // Another sequence: spun again (still torn, still silent: cached again).
    store_seq(&path, 9);
    assert_eq!(read(&mut source).status, Status::Torn);
    assert_eq!(read(&mut source).status, Status::Torn);
    assert_eq!(source.torn_spins(), before + 2);
    // A heartbeat: spun again, and not cached while it is fresh.
    writer.stamp_heartbeat(monotonic_ns());
    assert_eq!(read(&mut source).status, Status::Torn);
    assert_eq!(source.torn_spins(), before + 3);
    // Healed: read as usual.
    store_seq(&path, 10);
    assert_ne!(read(&mut source).status, Status::Torn);
    assert_eq!(source.torn_spins(), before + 3);
    drop(writer);
}

/// A torn file whose heartbeat is ahead of the clock (forged, or from another
/// time namespace) is as silent as a late one: its age floors at 0, and
/// without this it was spun at every read, forever, whatever its writer.
#[test]
fn a_torn_file_with_a_heartbeat_ahead_of_the_clock_is_not_spun_at_every_read() {
    let dir = tempfile::tempdir().unwrap();
    let writer = ShmWriter::create(
        dir.path(),
        &EngineId::new("ahead").unwrap(),
        &WriterOptions::default(),
        &Snapshot::default(),
    )
    .unwrap();
    let path = dir.path().join("ahead");
    store_seq(&path, 7);
    store_word(
        &path,
        engine_state_shm_format::layout::HEARTBEAT_OFFSET,
        u64::MAX,
    );
    let mut source = ShmDir::open(dir.path(), fast()).unwrap();
    for _ in 0..5 {
        assert_eq!(
            source.read_engine("ahead").unwrap().unwrap().status,
            Status::Torn
        );
    }
    assert_eq!(source.torn_spins(), 1, "spun once, then cached");
    drop(writer);
}

/// What a relay forwards travels on each state: the header's facts and the
/// heartbeat stamp behind `heartbeat_age` (no second look at the file).
#[test]
fn each_state_carries_the_writers_header_facts_and_heartbeat_stamp() {
    let dir = tempfile::tempdir().unwrap();
    let a = writer(dir.path(), "a", 1);
    let now = monotonic_ns();
    a.stamp_heartbeat(now - 7_000_000);
    let mut source = ShmDir::open(dir.path(), fast()).unwrap();
    let mut reading = Reading::default();
    source.read_at(&mut reading, now).unwrap();
    let state = reading.get("a").unwrap();
    let header = *source.header("a").unwrap();
    assert_eq!(
        state.writer,
        Writer {
            pid: std::process::id(),
            publish_period_us: header.publish_period_us,
            created_unix_ns: header.created_unix_ns,
            heartbeat_mono_ns: now - 7_000_000,
        }
    );
    assert_eq!(state.heartbeat_age, Duration::from_millis(7));
    assert!(!state.clock_ahead);
    assert_eq!(
        source.read_engine("a").unwrap().unwrap().writer,
        state.writer
    );
}

use std::time::Duration;

use engine_state_reader::{ReaderOptions, ShmDir, Source, Status};
use engine_state_shm_format::{Snapshot, FLAG_IDLE, FLAG_SHUTTING_DOWN};

use crate::*;

fn start(dir: &std::path::Path, id: &str, period_ms: u64) -> Publisher {
    let uri = format!("file://{}", dir.display());
    Publisher::start(PublisherConfig::resolve(Some(&uri), Some(id), Some(period_ms), None).unwrap())
        .unwrap()
}

#[test]
fn publish_stamps_clocks_and_idle_flag() {
    let dir = tempfile::tempdir().unwrap();
    let mut publisher = start(dir.path(), "e0", 50);
    let mut source = ShmDir::open(dir.path(), ReaderOptions::default()).unwrap();
    let first = source.read().unwrap().engines[0].snapshot;
    assert_ne!(first.captured_mono_ns, 0);
    assert!(first.is_idle(), "nothing published yet: idle");

    publisher
        .publish(Snapshot {
            step: 3,
            num_running: 2,
            flags: FLAG_IDLE | FLAG_SHUTTING_DOWN,
            ..Snapshot::default()
        })
        .unwrap();
    let snap = source.read().unwrap().engines[0].snapshot;
    assert_eq!((snap.step, snap.num_running), (3, 2));
    assert!(!snap.is_idle(), "idle follows the counts, not the caller");
    assert!(snap.is_shutting_down(), "other flags are kept");
    assert!(snap.captured_mono_ns > first.captured_mono_ns);
    assert!(snap.captured_unix_ns > 1_600_000_000_000_000_000);

    publisher
        .publish(Snapshot {
            num_waiting: 0,
            ..Snapshot::default()
        })
        .unwrap();
    assert!(source.read().unwrap().engines[0].snapshot.is_idle());
}

#[test]
fn heartbeat_thread_keeps_an_idle_engine_fresh() {
    let dir = tempfile::tempdir().unwrap();
    let _publisher = start(dir.path(), "hb", 10);
    let options = ReaderOptions {
        freshness: engine_state_reader::Freshness {
            stale_after: Duration::from_millis(100),
            ..Default::default()
        },
        ..ReaderOptions::default()
    };
    let mut source = ShmDir::open(dir.path(), options).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let state = &source.read().unwrap().engines[0];
    assert_eq!(state.status, Status::Fresh, "{state:?}");
    assert!(state.heartbeat_age < Duration::from_millis(100));
    assert!(
        state.capture_age >= Duration::from_millis(300),
        "no capture, only heartbeats"
    );
}

#[test]
fn close_retires_removes_and_refuses_later_publishes() {
    let dir = tempfile::tempdir().unwrap();
    let mut publisher = start(dir.path(), "c", 50);
    let path = publisher.path().unwrap().to_owned();
    assert!(path.exists());
    publisher.close();
    publisher.close();
    assert!(!path.exists());
    assert!(!publisher.is_open());
    let err = publisher.publish(Snapshot::default()).unwrap_err();
    assert!(err.to_string().contains("closed"), "{err}");
}

#[test]
fn missing_directory_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let nested = dir.path().join("a/b");
    let _publisher = start(&nested, "e", 50);
    assert!(nested.join("e").exists());
}

#[test]
fn uncreatable_directory_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("file"), b"").unwrap();
    let uri = format!("file://{}/file/sub", dir.path().display());
    let err =
        Publisher::start(PublisherConfig::resolve(Some(&uri), Some("e"), None, None).unwrap())
            .unwrap_err();
    assert!(
        err.to_string()
            .contains("cannot create the engine-state directory"),
        "{err}"
    );
}

#[test]
fn directory_path_that_is_a_regular_file_is_a_directory_error_not_a_bad_setting() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("file"), b"").unwrap();
    let uri = format!("file://{}/file", dir.path().display());
    let err =
        Publisher::start(PublisherConfig::resolve(Some(&uri), Some("e"), None, None).unwrap())
            .unwrap_err();
    assert!(matches!(err, Error::Shm(_)), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("not a directory") && text.contains("remove that file"),
        "{text}"
    );
}

/// The heartbeat word (`CLOCK_MONOTONIC` ns) of `id` in `dir`, read directly.
fn heartbeat_word(dir: &std::path::Path, id: &str) -> u64 {
    engine_state_shm_format::ShmFile::open(dir.join(id))
        .unwrap()
        .heartbeat_mono_ns()
}

#[test]
fn heartbeat_thread_leaves_a_busy_engines_stamp_to_its_publishes() {
    let dir = tempfile::tempdir().unwrap();
    let mut publisher = start(dir.path(), "busy", 20);
    let mut source = ShmDir::open(dir.path(), ReaderOptions::default()).unwrap();
    // Publishing every 2 ms for ~300 ms (15 heartbeat periods): just before
    // each publish the stamp is still the previous publish's, unless this
    // thread was descheduled for a whole period (then a stamp is due).
    publisher.publish(Snapshot::default()).unwrap();
    let mut last = source.read().unwrap().engines[0].snapshot.captured_mono_ns;
    let mut thread_stamps = 0;
    for _ in 0..150 {
        std::thread::sleep(Duration::from_millis(2));
        let stamped = heartbeat_word(dir.path(), "busy") != last;
        let gap = Duration::from_nanos(engine_state_shm_format::monotonic_ns() - last);
        thread_stamps += usize::from(stamped && gap < Duration::from_millis(15));
        publisher.publish(Snapshot::default()).unwrap();
        last = source.read().unwrap().engines[0].snapshot.captured_mono_ns;
        assert_eq!(
            heartbeat_word(dir.path(), "busy"),
            last,
            "a publish stamps it"
        );
    }
    assert_eq!(
        thread_stamps, 0,
        "the heartbeat thread stamped between publishes"
    );
    // Idle: the thread stamps again within about a period.
    std::thread::sleep(Duration::from_millis(60));
    assert!(
        heartbeat_word(dir.path(), "busy") > last,
        "an idle engine's heartbeat stopped"
    );
    let age = source.read().unwrap().engines[0].heartbeat_age;
    assert!(age < Duration::from_millis(45), "{age:?}");
}

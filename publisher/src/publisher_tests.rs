use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use engine_state_reader::{EngineState, ReaderOptions, Reading, ShmDir, Source, Status};
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

/// A publisher whose heartbeat thread beats only on
/// [`Publisher::heartbeat_tick`], on a clock the test sets (ns, starting at
/// [`T0`]): tests advance time and tick instead of sleeping for periods.
fn driven(dir: &Path, id: &str, period_ms: u64) -> (Publisher, Arc<AtomicU64>) {
    let now = Arc::new(AtomicU64::new(T0));
    let clock = engine_state_shm_format::Clock::from_fn({
        let now = Arc::clone(&now);
        move || now.load(Ordering::Relaxed)
    });
    let uri = format!("file://{}", dir.display());
    let config = PublisherConfig::resolve(Some(&uri), Some(id), Some(period_ms), None).unwrap();
    (Publisher::start_driven(config, clock).unwrap(), now)
}

/// Where a [`driven`] publisher's clock starts.
const T0: u64 = 1_000_000_000_000;

/// Advances a [`driven`] publisher's clock by `by`; returns the new now.
fn advance(now: &AtomicU64, by: Duration) -> u64 {
    now.fetch_add(by.as_nanos() as u64, Ordering::Relaxed) + by.as_nanos() as u64
}

/// `n` periods of a [`driven`] publisher: the clock advanced by `period`
/// and the heartbeat thread ticked, each.
fn periods(publisher: &Publisher, now: &AtomicU64, period: Duration, n: u32) {
    for _ in 0..n {
        advance(now, period);
        publisher.heartbeat_tick();
    }
}

/// Engine `id` as `source` reads it at `now_ns` (a driven publisher's clock).
fn read_at(source: &mut ShmDir, id: &str, now_ns: u64) -> Option<EngineState> {
    let mut reading = Reading::default();
    source.read_at(&mut reading, now_ns).unwrap();
    reading.get(id).cloned()
}

#[test]
fn heartbeat_thread_keeps_an_idle_engine_fresh() {
    let dir = tempfile::tempdir().unwrap();
    let period = Duration::from_millis(10);
    let (publisher, now) = driven(dir.path(), "hb", 10);
    let options = ReaderOptions {
        freshness: engine_state_reader::Freshness {
            stale_after: Duration::from_secs(1),
            ..Default::default()
        },
        ..ReaderOptions::default()
    };
    let mut source = ShmDir::open(dir.path(), options).unwrap();
    // 300 ms without a publish (30 periods): the thread stamps every period.
    for _ in 0..30 {
        let now = advance(&now, period);
        publisher.heartbeat_tick();
        assert_eq!(
            heartbeat_word(dir.path(), "hb"),
            now,
            "a stamp every period"
        );
    }
    let now = now.load(Ordering::Relaxed);
    let state = read_at(&mut source, "hb", now).unwrap();
    assert_eq!(state.status, Status::Fresh, "{state:?}");
    assert_eq!(state.heartbeat_age, Duration::ZERO, "{state:?}");
    assert_eq!(
        state.capture_age,
        Duration::from_millis(300),
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
    assert!(matches!(err, Error::CreateDirectory { .. }), "{err:?}");
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
    let period = Duration::from_millis(20);
    let (mut publisher, now) = driven(dir.path(), "busy", 20);
    let mut source = ShmDir::open(dir.path(), ReaderOptions::default()).unwrap();
    // Publishing every 2 ms for 300 ms (15 heartbeat periods), the thread
    // ticking between publishes: the stamp stays each publish's.
    publisher.publish(Snapshot::default()).unwrap();
    let mut last = heartbeat_word(dir.path(), "busy");
    assert_eq!(last, T0, "a publish stamps it");
    for _ in 0..150 {
        advance(&now, Duration::from_millis(2));
        publisher.heartbeat_tick();
        assert_eq!(
            heartbeat_word(dir.path(), "busy"),
            last,
            "the heartbeat thread stamped between publishes"
        );
        publisher.publish(Snapshot::default()).unwrap();
        last = read_at(&mut source, "busy", now.load(Ordering::Relaxed))
            .unwrap()
            .snapshot
            .captured_mono_ns;
        assert_eq!(last, now.load(Ordering::Relaxed));
        assert_eq!(
            heartbeat_word(dir.path(), "busy"),
            last,
            "a publish stamps it"
        );
    }
    // Idle: the thread leaves the stamp alone while it is younger than
    // the policy's age, and stamps once it is that old.
    let skip = engine_state_shm_format::heartbeat::skip_if_younger(period);
    advance(&now, skip - Duration::from_nanos(1));
    publisher.heartbeat_tick();
    assert_eq!(heartbeat_word(dir.path(), "busy"), last, "still young");
    let now = advance(&now, Duration::from_nanos(1));
    publisher.heartbeat_tick();
    assert_eq!(
        heartbeat_word(dir.path(), "busy"),
        now,
        "an idle engine's heartbeat from the thread"
    );
    let age = read_at(&mut source, "busy", now).unwrap().heartbeat_age;
    assert_eq!(age, Duration::ZERO);
}

/// Polls `condition` every 5 ms for up to 5 s.
fn eventually(mut condition: impl FnMut() -> bool, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !condition() {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `rm -rf DIR` under a live publisher, then `mkdir DIR`: the heartbeat
/// thread recreates the file in a new generation with the latest snapshot,
/// publishing goes on into it, and the gap is counted once.
#[test]
fn a_removed_directory_is_noticed_and_the_file_recreated_when_it_is_back() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("engines");
    let period = Duration::from_millis(10);
    let (mut publisher, now) = driven(&dir, "phoenix", 10);
    let busy = |step| Snapshot {
        step,
        num_running: 3,
        ..Snapshot::default()
    };
    publisher.publish(busy(1)).unwrap();
    let reader = |dir: &std::path::Path| ShmDir::open(dir, ReaderOptions::default()).unwrap();
    let first = read_at(&mut reader(&dir), "phoenix", T0).unwrap();
    assert_eq!(publisher.stats(), PublisherStats::default());

    std::fs::remove_dir_all(&dir).unwrap();
    periods(&publisher, &now, period, crate::recreate::CHECK_EVERY);
    assert_eq!(publisher.stats().files_lost, 1, "the loss noticed");
    publisher.publish(busy(2)).unwrap(); // never an error
                                         // Ten periods, the file checked at each while it is missing.
    periods(&publisher, &now, period, 10);
    assert!(
        !dir.exists(),
        "the directory is not recreated by the publisher"
    );
    assert_eq!(publisher.stats().files_recreated, 0);

    std::fs::create_dir(&dir).unwrap();
    periods(&publisher, &now, period, 1);
    let mut source = reader(&dir);
    let again = read_at(&mut source, "phoenix", now.load(Ordering::Relaxed))
        .expect("the file recreated in the next period");
    assert_eq!(again.status, Status::Fresh, "{again:?}");
    assert!(again.generation > first.generation, "{again:?}");
    assert_eq!(
        (again.snapshot.step, again.snapshot.num_running),
        (2, 3),
        "the latest snapshot carried over"
    );
    assert_eq!(
        publisher.stats(),
        PublisherStats {
            files_lost: 1,
            files_recreated: 1
        }
    );
    // Publishing goes to the new file, and the heartbeat thread stamps it
    // (after the publish: the thread's own stamp, not the publish's).
    publisher.publish(busy(3)).unwrap();
    let published = read_at(&mut source, "phoenix", now.load(Ordering::Relaxed))
        .unwrap()
        .snapshot;
    assert_eq!(published.step, 3);
    periods(&publisher, &now, period, 1);
    let stamped = now.load(Ordering::Relaxed);
    assert!(stamped > published.captured_mono_ns);
    assert_eq!(
        heartbeat_word(&dir, "phoenix"),
        stamped,
        "the heartbeat thread stamping the new file"
    );
    let idle = read_at(&mut source, "phoenix", stamped).unwrap();
    assert_eq!(idle.status, Status::Fresh, "{idle:?}");
    assert_eq!(idle.heartbeat_age, Duration::ZERO, "{idle:?}");
    assert_eq!(publisher.path(), Some(dir.join("phoenix").as_path()));

    // The file alone removed (the directory stays): recreated at the next
    // check.
    std::fs::remove_file(dir.join("phoenix")).unwrap();
    periods(&publisher, &now, period, crate::recreate::CHECK_EVERY);
    assert_eq!(
        publisher.stats().files_recreated,
        2,
        "the file recreated again"
    );
    assert_eq!(publisher.stats().files_lost, 2);
    publisher.close();
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "close removes it"
    );
}

/// A recreated file nobody published into yet (an idle engine) is still
/// removed by close.
#[test]
fn close_removes_a_recreated_file_not_published_into() {
    let dir = tempfile::tempdir().unwrap();
    let mut publisher = start(dir.path(), "idle", 10);
    std::fs::remove_file(dir.path().join("idle")).unwrap();
    eventually(
        || publisher.stats().files_recreated == 1,
        "the file recreated",
    );
    assert!(dir.path().join("idle").exists());
    publisher.close();
    assert!(!dir.path().join("idle").exists());
}

#[test]
fn snapshots_that_break_the_layout_rules_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut publisher = start(dir.path(), "strict", 50);
    let err = publisher
        .publish(Snapshot {
            gpu_blocks_total: 10,
            gpu_blocks_free: 12,
            ..Snapshot::default()
        })
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("gpu_blocks_free (12) is above gpu_blocks_total (10)")
            && err.contains("nothing was published"),
        "{err}"
    );
    let err = publisher
        .publish(Snapshot {
            flags: FLAG_SHUTTING_DOWN | 0x10,
            ..Snapshot::default()
        })
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("flags 0x12") && err.contains("(0x10)"),
        "{err}"
    );
    // The limits themselves are fine.
    publisher
        .publish(Snapshot {
            gpu_blocks_total: 10,
            gpu_blocks_free: 10,
            flags: FLAG_IDLE | FLAG_SHUTTING_DOWN,
            ..Snapshot::default()
        })
        .unwrap();
}

/// `truncate -s 0` of a live publisher's file: readers refuse it (0 bytes),
/// the writer's own stores into it fault and are absorbed (the `sigbus`
/// handler), the heartbeat thread notices and renames a new generation
/// over it, and readers see the engine fresh again — idle (the snapshot
/// carried over) or while another thread keeps publishing.
#[test]
fn a_truncated_file_is_replaced_and_the_engine_seen_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut");
    let mut publisher = start(dir.path(), "cut", 10);
    let busy = |step| Snapshot {
        step,
        num_running: 3,
        gpu_blocks_total: 100,
        gpu_blocks_free: 40,
        ..Snapshot::default()
    };
    publisher.publish(busy(1)).unwrap();
    let (mut source, first) = seen_with_a_heartbeat_after(dir.path(), "cut");
    let truncate = || set_len(&path, 0);

    // Idle: nothing published after the cut.
    truncate();
    let again = fresh_in_a_later_generation(
        &mut source,
        "cut",
        first.generation,
        "the idle engine fresh again in a new generation",
    );
    assert_eq!(
        (
            again.snapshot.step,
            again.snapshot.num_running,
            again.snapshot.gpu_blocks_total
        ),
        (1, 3, 100),
        "the snapshot seen before the cut carried over"
    );
    assert_eq!(
        publisher.stats(),
        PublisherStats {
            files_lost: 1,
            files_recreated: 1
        }
    );

    // Busy: another thread publishes throughout; every publish succeeds.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let publishing = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut step = 10;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                step += 1;
                publisher.publish(busy(step)).unwrap();
                // Pacing, not a wait: this test is about publishes racing the
                // real heartbeat thread (a driven one would never race them).
                std::thread::sleep(Duration::from_millis(1));
            }
            publisher
        })
    };
    eventually(
        || {
            source
                .read_engine("cut")
                .ok()
                .flatten()
                .is_some_and(|e| e.snapshot.step > 10)
        },
        "the publishing thread's snapshots",
    );
    truncate();
    let step = fresh_in_a_later_generation(
        &mut source,
        "cut",
        again.generation,
        "the busy engine fresh again in a new generation",
    )
    .snapshot
    .step;
    eventually(
        || {
            source
                .read_engine("cut")
                .ok()
                .flatten()
                .is_some_and(|e| e.snapshot.step > step)
        },
        "publishes landing in the new file",
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut publisher = publishing.join().expect("the publishing thread survived");
    assert_eq!(
        publisher.stats(),
        PublisherStats {
            files_lost: 2,
            files_recreated: 2
        }
    );
    publisher.close();
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "close removes it"
    );
}

/// `truncate -s 200 f; truncate -s 4096 f` under an idle publisher: the
/// page stays (no fault), size, magic and state survive, but the engine id
/// and the payload's last words read zero, so readers refuse the file for
/// good. The heartbeat thread notices, counts the loss, and renames a new
/// generation over it with the last intact snapshot (not the cut one).
#[test]
fn a_file_cut_to_a_few_bytes_and_grown_back_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut");
    let period = Duration::from_millis(10);
    let (mut publisher, now) = driven(dir.path(), "cut", 10);
    publisher
        .publish(Snapshot {
            step: 7,
            num_running: 3,
            num_waiting: 2,
            gpu_blocks_total: 100,
            gpu_blocks_free: 40,
            pending_prefill_tokens: 900,
            num_prefilling: 2,
            max_prefill_remaining: 500,
            num_preempted: 1,
            ..Snapshot::default()
        })
        .unwrap();
    let options = ReaderOptions {
        rescan_interval: Duration::ZERO,
        ..ReaderOptions::default()
    };
    let mut source = ShmDir::open(dir.path(), options).unwrap();
    let first = read_at(&mut source, "cut", T0).unwrap();
    assert_eq!(first.status, Status::Fresh, "{first:?}");
    // A period: the heartbeat thread has seen the published snapshot.
    periods(&publisher, &now, period, 1);
    for len in [200, engine_state_shm_format::FILE_SIZE as u64] {
        set_len(&path, len);
    }
    // Noticed at the next file check, and replaced in the same period.
    periods(&publisher, &now, period, crate::recreate::CHECK_EVERY);
    let again = read_at(&mut source, "cut", now.load(Ordering::Relaxed)).unwrap();
    assert!(again.generation > first.generation, "{again:?}");
    assert_eq!(again.status, Status::Fresh, "{again:?}");
    let again = again.snapshot;
    assert_eq!(
        (
            again.step,
            again.num_prefilling,
            again.max_prefill_remaining,
            again.num_preempted
        ),
        (7, 2, 500, 1),
        "the snapshot seen before the cut carried over, its last words too"
    );
    assert_eq!(
        publisher.stats(),
        PublisherStats {
            files_lost: 1,
            files_recreated: 1
        }
    );
    publisher.close();
}

/// A reader of `dir` that lists at every read, the engine `id` read fresh
/// through it, after the heartbeat thread has ticked since its last publish
/// (so the thread has seen that snapshot).
fn seen_with_a_heartbeat_after(dir: &Path, id: &str) -> (ShmDir, EngineState) {
    let options = ReaderOptions {
        rescan_interval: Duration::ZERO,
        ..ReaderOptions::default()
    };
    let mut source = ShmDir::open(dir, options).unwrap();
    let first = source.read_engine(id).unwrap().unwrap();
    assert_eq!(first.status, Status::Fresh, "{first:?}");
    eventually(
        || heartbeat_word(dir, id) > first.snapshot.captured_mono_ns,
        "a heartbeat after the publish",
    );
    (source, first)
}

/// Waits for `id` fresh in a generation above `generation`.
fn fresh_in_a_later_generation(
    source: &mut ShmDir,
    id: &str,
    generation: u64,
    what: &str,
) -> EngineState {
    let mut seen = None;
    eventually(
        || {
            seen = source
                .read_engine(id)
                .ok()
                .flatten()
                .filter(|e| e.generation > generation && e.status == Status::Fresh);
            seen.is_some()
        },
        what,
    );
    seen.unwrap()
}

/// `truncate -s LEN path`, from another process's point of view.
fn set_len(path: &Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

/// Time passed in: `publish` stamps the capture clock and the heartbeat
/// from the publisher's `Clock`, not from `CLOCK_MONOTONIC`.
#[test]
fn publish_stamps_from_the_clock_it_was_given() {
    let dir = tempfile::tempdir().unwrap();
    let now = Arc::new(AtomicU64::new(1_000));
    let clock = engine_state_shm_format::Clock::from_fn({
        let now = Arc::clone(&now);
        move || now.load(Ordering::Relaxed)
    });
    let uri = format!("file://{}", dir.path().display());
    // A period of a minute: the heartbeat thread does not tick during the test.
    let config = PublisherConfig::resolve(Some(&uri), Some("clocked"), Some(60_000), None).unwrap();
    let mut publisher = Publisher::start_with_clock(config, clock).unwrap();
    let file = engine_state_shm_format::ShmFile::open(dir.path().join("clocked")).unwrap();
    assert_eq!(
        file.read().unwrap().0.captured_mono_ns,
        1_000,
        "the first snapshot"
    );
    now.store(5_000, Ordering::Relaxed);
    publisher
        .publish(Snapshot {
            num_running: 1,
            ..Snapshot::default()
        })
        .unwrap();
    let (snapshot, _) = file.read().unwrap();
    assert_eq!(snapshot.captured_mono_ns, 5_000);
    assert_eq!(
        file.heartbeat_mono_ns(),
        5_000,
        "a publish stamps the heartbeat"
    );
    assert!(
        snapshot.captured_unix_ns > 1_600_000_000_000_000_000,
        "the wall clock's"
    );
}

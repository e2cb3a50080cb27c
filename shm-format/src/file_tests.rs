//! Tests of the file as a whole: creation, validation, replacement, retirement.

use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::Ordering;

use crate::layout::*;
use crate::*;

fn id(s: &str) -> EngineId {
    EngineId::new(s).unwrap()
}

fn snap(n: u64) -> Snapshot {
    Snapshot {
        step: n,
        num_running: n * 2,
        ..Snapshot::default()
    }
}

#[test]
fn created_file_has_layout_v1_and_first_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let w = ShmWriter::create(dir.path(), &id("e0"), &WriterOptions::default(), &snap(5)).unwrap();
    let path = dir.path().join("e0");
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.len(), FILE_SIZE as u64);
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(&bytes[..8], b"ENGSTATE");
    assert_eq!(&bytes[ENGINE_ID_OFFSET..ENGINE_ID_OFFSET + 3], b"e0\0");
    // seq 2 after the first publish, payload word 2 (step) = 5.
    assert_eq!(
        u64::from_le_bytes(bytes[SEQ_OFFSET..SEQ_OFFSET + 8].try_into().unwrap()),
        2
    );
    let step_at = PAYLOAD_OFFSET + 2 * 8;
    assert_eq!(
        u64::from_le_bytes(bytes[step_at..step_at + 8].try_into().unwrap()),
        5
    );
    assert!(bytes[ENGINE_ID_OFFSET + 64..].iter().all(|b| *b == 0));

    let r = ShmFile::open(&path).unwrap();
    assert_eq!(r.read().unwrap(), (snap(5), 2));
    assert_eq!(r.engine_id().as_str(), "e0");
    assert_eq!(r.generation(), 1);
    assert_eq!(r.header().writer_pid, std::process::id());
    assert_eq!(r.header().publish_period_us, 50_000);
    assert_eq!(r.header().writer_pid_ns, pid_namespace());
    assert!(!r.is_retired());
    drop(w);
    // No temporary file is left behind.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn publish_and_heartbeat_are_seen_by_a_reader() {
    let dir = tempfile::tempdir().unwrap();
    let mut w =
        ShmWriter::create(dir.path(), &id("e1"), &WriterOptions::default(), &snap(0)).unwrap();
    let r = ShmFile::open(dir.path().join("e1")).unwrap();
    for n in 1..100 {
        w.publish(&snap(n)).unwrap();
        assert_eq!(r.read().unwrap(), (snap(n), 2 * (n + 1)));
    }
    let before = r.heartbeat_mono_ns();
    // Until the clock has moved past the stamp (no sleep: a few ns at most).
    while crate::monotonic_ns() <= before {
        std::hint::spin_loop();
    }
    assert!(w.heartbeat().beat());
    assert!(r.heartbeat_mono_ns() > before);
}

#[test]
fn second_live_writer_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _w =
        ShmWriter::create(dir.path(), &id("dup"), &WriterOptions::default(), &snap(1)).unwrap();
    let err =
        ShmWriter::create(dir.path(), &id("dup"), &WriterOptions::default(), &snap(2)).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, Error::AlreadyPublished { pid, .. } if pid == std::process::id()),
        "{msg}"
    );
    assert!(
        msg.contains("already published") && msg.contains("AGENTIC_WORKER_ID"),
        "{msg}"
    );
    // The live file is untouched.
    let r = ShmFile::open(dir.path().join("dup")).unwrap();
    assert_eq!(r.read().unwrap().0, snap(1));
    assert!(!r.is_retired());
}

/// A dead writer's file (its lock released without retiring, as when a
/// process is killed) is replaced by a new generation; readers of the old
/// mapping see it retired and never see the new writer's data through it.
#[test]
fn dead_writers_file_is_replaced_by_a_new_generation() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e2");
    let old =
        ShmWriter::create(dir.path(), &id("e2"), &WriterOptions::default(), &snap(7)).unwrap();
    // Simulate a kill: release the lock but leave the file as it was.
    let old_inode = old.inode;
    drop_without_retire(old);
    let old_reader = ShmFile::open(&path).unwrap();
    assert_eq!(old_reader.inode(), old_inode);

    let mut new =
        ShmWriter::create(dir.path(), &id("e2"), &WriterOptions::default(), &snap(8)).unwrap();
    assert_eq!(new.generation(), 2);
    assert!(old_reader.is_retired());
    assert_eq!(old_reader.read().unwrap().0, snap(7));
    new.publish(&snap(9)).unwrap();
    assert_eq!(
        old_reader.read().unwrap().0,
        snap(7),
        "old mapping never shows new data"
    );
    let new_reader = ShmFile::open(&path).unwrap();
    assert_ne!(new_reader.inode(), old_inode);
    assert_eq!(new_reader.generation(), 2);
    assert_eq!(new_reader.read().unwrap().0, snap(9));
}

fn drop_without_retire(mut writer: ShmWriter) {
    writer.retired = true; // what a killed process leaves: state ACTIVE, lock gone
    drop(writer);
}

#[test]
fn retire_marks_and_removes_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut w =
        ShmWriter::create(dir.path(), &id("e3"), &WriterOptions::default(), &snap(1)).unwrap();
    let r = ShmFile::open(dir.path().join("e3")).unwrap();
    let hb = w.heartbeat();
    w.retire();
    assert!(r.is_retired());
    assert!(!dir.path().join("e3").exists());
    assert!(!hb.beat(), "no heartbeat after retirement");
    assert_eq!(w.publish(&snap(2)), Err(WrongProcess));
    // Retiring twice is harmless.
    w.retire();
}

#[test]
fn foreign_and_corrupt_files_are_refused_with_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name);
    std::fs::write(p("short"), b"hello").unwrap();
    std::fs::write(p("foreign"), vec![b'x'; 8192]).unwrap();
    std::fs::write(p("foreign4k"), vec![b'x'; FILE_SIZE]).unwrap();
    let mut future = vec![0u8; FILE_SIZE];
    future[..8].copy_from_slice(b"ENGSTATE");
    future[8..12].copy_from_slice(&2u32.to_le_bytes());
    std::fs::write(p("future"), &future).unwrap();
    std::fs::write(p("future_big"), [&future[..], &[0u8; 4096]].concat()).unwrap();
    let w =
        ShmWriter::create(dir.path(), &id("good"), &WriterOptions::default(), &snap(1)).unwrap();
    let good = std::fs::read(p("good")).unwrap();
    std::fs::write(p("truncated"), &good[..200]).unwrap();
    std::fs::write(p("renamed"), &good).unwrap();
    let mut bad_sizes = good.clone();
    bad_sizes[12] = 32;
    std::fs::write(p("bad_sizes"), &bad_sizes).unwrap();

    let err = |name: &str| ShmFile::open(p(name)).unwrap_err();
    assert!(matches!(err("short"), Error::WrongSize { size: 5, .. }));
    assert!(matches!(err("foreign"), Error::NotEngineState { .. }));
    assert!(matches!(err("foreign4k"), Error::NotEngineState { .. }));
    let future_err = err("future");
    assert!(matches!(
        future_err,
        Error::UnknownVersion {
            found: 2,
            supported: 1,
            ..
        }
    ));
    assert!(future_err
        .to_string()
        .contains("layout version 2, but this build reads version 1"));
    assert!(matches!(
        err("future_big"),
        Error::UnknownVersion { found: 2, .. }
    ));
    assert!(matches!(
        err("truncated"),
        Error::WrongSize { size: 200, .. }
    ));
    let renamed = err("renamed").to_string();
    assert!(
        renamed.contains("names engine \"good\"") && renamed.contains("\"renamed\""),
        "{renamed}"
    );
    assert!(err("bad_sizes").to_string().contains("header/payload size"));
    assert!(matches!(err("missing"), Error::Io { .. }));
    assert!(err("short")
        .to_string()
        .contains(&p("short").display().to_string()));
    drop(w);
}

#[test]
fn writer_never_clobbers_a_foreign_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("mine"), b"precious data").unwrap();
    let err = ShmWriter::create(dir.path(), &id("mine"), &WriterOptions::default(), &snap(1))
        .unwrap_err();
    assert!(
        matches!(err, Error::WrongSize { .. } | Error::NotEngineState { .. }),
        "{err}"
    );
    assert_eq!(
        std::fs::read(dir.path().join("mine")).unwrap(),
        b"precious data"
    );
}

#[test]
fn missing_and_unwritable_directories_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let err =
        ShmWriter::create(&missing, &id("e"), &WriterOptions::default(), &snap(1)).unwrap_err();
    assert!(err.to_string().contains("create it"), "{err}");

    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"").unwrap();
    let err = ShmWriter::create(&file, &id("e"), &WriterOptions::default(), &snap(1)).unwrap_err();
    assert!(err.to_string().contains("not a directory"), "{err}");

    let ro = dir.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    let result = ShmWriter::create(&ro, &id("e"), &WriterOptions::default(), &snap(1));
    if nix::unistd::geteuid().is_root() {
        // root ignores directory permission bits; nothing to assert about refusal.
        assert!(result.is_ok());
    } else {
        let err = result.unwrap_err();
        assert!(err.to_string().contains("Permission denied"), "{err}");
    }
}

#[test]
fn configured_mode_is_applied() {
    let dir = tempfile::tempdir().unwrap();
    let options = WriterOptions {
        mode: 0o644,
        ..WriterOptions::default()
    };
    let _w = ShmWriter::create(dir.path(), &id("shared"), &options, &snap(1)).unwrap();
    let mode = std::fs::metadata(dir.path().join("shared"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o644);
}

#[test]
fn odd_sequence_left_by_a_dead_writer_reads_as_torn() {
    let dir = tempfile::tempdir().unwrap();
    let w =
        ShmWriter::create(dir.path(), &id("torn"), &WriterOptions::default(), &snap(1)).unwrap();
    // What a writer killed between its two sequence stores leaves behind.
    w.map.word(SEQ_OFFSET).store(3, Ordering::Relaxed);
    let r = ShmFile::open(dir.path().join("torn")).unwrap();
    // Bounded retries, counted: the read gives up after exactly the
    // seqlock's bound. It returns within a deadline (not a timing: the host
    // may be busy; 5 s is far beyond the bound's spins and yields, and fails
    // a retry that sleeps). Not a scoped thread: a read that never returns
    // fails the test instead of hanging it; the thread owns the file and
    // hands it back with the result.
    let (done, returned) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let before = seqlock::failed_attempts();
        let read = r.read();
        let _ = done.send((read, seqlock::failed_attempts() - before, r));
    });
    let (read, attempts, _r) = returned
        .recv_timeout(std::time::Duration::from_secs(5))
        .expect("bounded retries: the read of an odd sequence returns");
    assert_eq!(read, Err(Torn { last_seq: 3 }));
    assert_eq!(
        attempts,
        u64::from(seqlock::READ_SPINS + seqlock::READ_YIELDS),
        "the read of an odd sequence spends the retry bound, once"
    );
}

#[test]
fn seq_probe_moves_with_each_publish_but_not_with_heartbeats() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = ShmWriter::create(
        dir.path(),
        &id("probe"),
        &WriterOptions::default(),
        &snap(1),
    )
    .unwrap();
    let r = ShmFile::open(dir.path().join("probe")).unwrap();
    assert_eq!(r.seq(), r.read().unwrap().1);
    let before = r.seq();
    w.stamp_heartbeat(monotonic_ns());
    assert_eq!(r.seq(), before, "a heartbeat is not a publish");
    w.publish(&snap(2)).unwrap();
    assert_eq!(r.seq(), before + 2);
    assert_eq!(r.read().unwrap(), (snap(2), before + 2));
}

#[test]
fn heartbeat_notices_a_removed_or_replaced_file_and_create_after_moves_the_generation_on() {
    let dir = tempfile::tempdir().unwrap();
    let options = WriterOptions::default();
    let mut w = ShmWriter::create(dir.path(), &id("gone"), &options, &snap(1)).unwrap();
    w.publish(&snap(7)).unwrap();
    let beat = w.heartbeat();
    assert!(beat.in_place());
    assert_eq!(beat.snapshot(), Some(snap(7)));
    std::fs::remove_file(dir.path().join("gone")).unwrap();
    assert!(!beat.in_place(), "removed");
    // Another file under the same name is not ours either.
    std::fs::write(dir.path().join("gone"), b"x").unwrap();
    assert!(!beat.in_place(), "replaced");
    std::fs::remove_file(dir.path().join("gone")).unwrap();

    let again = ShmWriter::create_after(&beat, &options, &snap(7)).unwrap();
    assert_eq!(
        again.generation(),
        w.generation() + 1,
        "nothing on the path: previous + 1"
    );
    assert!(again.heartbeat().in_place());
    let read = ShmFile::open(dir.path().join("gone")).unwrap();
    assert_eq!(read.read().unwrap().0, snap(7));
    // The orphan retires without touching the file now at its path.
    w.retire();
    assert!(dir.path().join("gone").exists());
}

//! What other processes can put into (or do to) a state directory: FIFOs,
//! symbolic links, names that are not UTF-8, files truncated under a live
//! mapping. Each is one engine's error; the other engines are still read.

use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use engine_state_shm_format::{monotonic_ns, EngineId, ShmWriter, Snapshot, WriterOptions};

use crate::*;

fn writer(dir: &std::path::Path, id: &str) -> ShmWriter {
    let snap = Snapshot {
        captured_mono_ns: monotonic_ns(),
        num_running: 1,
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

fn error_of(reading: &Reading, name: &str) -> String {
    reading
        .errors
        .iter()
        .find(|e| e.name == name)
        .unwrap_or_else(|| panic!("no error for {name}: {reading:?}"))
        .to_string()
}

#[test]
fn fifos_links_and_odd_names_are_reported_not_opened() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let _good = writer(dir.path(), "good");
    let _outside = writer(elsewhere.path(), "outside");
    let fifo_mode = nix::sys::stat::Mode::from_bits_truncate(0o600);
    nix::unistd::mkfifo(&dir.path().join("fifo"), fifo_mode).unwrap();
    nix::unistd::mkfifo(&dir.path().join(".hidden-fifo"), fifo_mode).unwrap();
    std::os::unix::fs::symlink(elsewhere.path().join("outside"), dir.path().join("outside"))
        .unwrap();
    let odd = std::ffi::OsStr::from_bytes(b"odd-\xff");
    std::fs::write(dir.path().join(odd), b"x").unwrap();
    std::fs::write(dir.path().join(".good.tmp.1"), b"in creation").unwrap();

    // Would block forever in open() on the FIFO without O_NONBLOCK.
    let mut source = ShmDir::open(dir.path(), fast()).unwrap();
    let reading = source.read().unwrap();
    let ids: Vec<&str> = reading.engines.iter().map(|e| &*e.engine_id).collect();
    assert_eq!(ids, ["good"], "the link's target is not read");
    let names: Vec<&str> = reading.errors.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, [".hidden-fifo", "fifo", "odd-\u{fffd}", "outside"]);
    assert!(error_of(&reading, "fifo").starts_with("not a regular file (a FIFO): "));
    assert!(error_of(&reading, "outside").starts_with("symbolic link, not followed: "));
    assert!(error_of(&reading, "odd-\u{fffd}").starts_with("name is not UTF-8"));
}

#[test]
fn file_truncated_under_the_reader_reads_torn_then_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let _victim = writer(dir.path(), "victim");
    let _other = writer(dir.path(), "other");
    let options = ReaderOptions {
        rescan_interval: Duration::from_secs(3600),
        ..ReaderOptions::default()
    };
    let mut source = ShmDir::open(dir.path(), options).unwrap();
    assert!(source.read().unwrap().engines.iter().all(|e| e.is_fresh()));
    // `truncate -s 0` by another process: the next read of the mapping faults.
    std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("victim"))
        .unwrap()
        .set_len(0)
        .unwrap();
    let reading = source.read().unwrap();
    assert_eq!(reading.get("victim").unwrap().status, Status::Torn);
    assert_eq!(reading.get("other").unwrap().status, Status::Fresh);
    let mut changed = Reading::default();
    source
        .read_changed_at(&mut changed, monotonic_ns(), None)
        .unwrap();
    assert!(changed
        .engines
        .iter()
        .all(|e| e.engine_id.as_ref() != "other"));
    // The next listing drops the mapping and reports what the file is now.
    source.rescan().unwrap();
    let reading = source.read().unwrap();
    assert!(reading.get("victim").is_none(), "{reading:?}");
    assert_eq!(reading.get("other").unwrap().status, Status::Fresh);
    assert!(error_of(&reading, "victim").contains("is 0 bytes"));
}

#[test]
fn a_pid_no_process_can_have_is_liveness_unknown_not_kill_minus_one() {
    let dir = tempfile::tempdir().unwrap();
    let copies = tempfile::tempdir().unwrap();
    let live = writer(dir.path(), "hostile");
    // The writer's file, in this pid namespace, with pid 0xFFFFFFFF (as i32:
    // -1, and kill(-1, 0) succeeds whenever any process may be signalled)
    // and a heartbeat 10 s old.
    let mut bytes = std::fs::read(dir.path().join("hostile")).unwrap();
    bytes[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
    let old = monotonic_ns().saturating_sub(10_000_000_000);
    bytes[72..80].copy_from_slice(&old.to_le_bytes());
    std::fs::write(copies.path().join("hostile"), &bytes).unwrap();
    drop(live);

    let mut source = ShmDir::open(copies.path(), fast()).unwrap();
    let reading = source.read().unwrap();
    assert_eq!(reading.get("hostile").unwrap().status, Status::Stale);
    let header = *source.header("hostile").unwrap();
    assert_eq!(header.writer_pid, u32::MAX);
    assert_eq!(
        header.writer_pid_ns,
        engine_state_shm_format::pid_namespace()
    );
    assert_eq!(crate::liveness::writer_alive(&header, true), None);
    let zero = engine_state_shm_format::Header {
        writer_pid: 0,
        ..header
    };
    assert_eq!(crate::liveness::writer_alive(&zero, true), None);
    let me = engine_state_shm_format::Header {
        writer_pid: std::process::id(),
        ..header
    };
    assert_eq!(crate::liveness::writer_alive(&me, true), Some(true));
}

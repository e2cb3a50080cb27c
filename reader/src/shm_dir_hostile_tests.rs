//! What other processes can put into a state directory: FIFOs, symbolic
//! links, names that are not UTF-8. Each is one engine's error; the other
//! engines are still read.

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

//! Tests of what other processes can put into (or do to) the state
//! directory: FIFOs, symbolic links and unreadable files. None may
//! hang a reader.

use std::os::unix::fs::PermissionsExt;

use crate::*;

fn id(s: &str) -> EngineId {
    EngineId::new(s).unwrap()
}

fn create(dir: &std::path::Path, name: &str) -> ShmWriter {
    let first = Snapshot {
        num_running: 4,
        ..Snapshot::default()
    };
    ShmWriter::create(dir, &id(name), &WriterOptions::default(), &first).unwrap()
}

#[test]
fn fifo_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fifo");
    nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    // Without O_NONBLOCK this open would wait for a writer forever.
    let err = ShmFile::open(&path).unwrap_err();
    assert!(matches!(err, Error::RefusedEntry { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.starts_with("not a regular file (a FIFO): "), "{text}");
    assert!(text.contains("remove it"), "{text}");
}

#[test]
fn symbolic_link_is_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let _w = create(elsewhere.path(), "eng");
    let link = dir.path().join("eng");
    std::os::unix::fs::symlink(elsewhere.path().join("eng"), &link).unwrap();
    let err = ShmFile::open(&link).unwrap_err();
    assert!(
        err.to_string().starts_with("symbolic link, not followed: "),
        "{err}"
    );
    // The target itself is fine.
    ShmFile::open(elsewhere.path().join("eng")).unwrap();
}

#[test]
fn unreadable_file_says_readers_need_read_access() {
    if nix::unistd::geteuid().is_root() {
        return; // root reads anything
    }
    let dir = tempfile::tempdir().unwrap();
    let _w = create(dir.path(), "private");
    let path = dir.path().join("private");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o200)).unwrap();
    let err = ShmFile::open(&path).unwrap_err().to_string();
    assert!(
        err.contains("read access") && err.contains("AGENTIC_ENGINE_STATE_FILE_MODE=644"),
        "{err}"
    );
}

//! Tests of what other processes can put into (or do to) the state
//! directory: FIFOs, symbolic links, unreadable files, truncation of a mapped
//! file. None may hang or kill a reader.

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

#[test]
fn truncated_mapping_reads_torn_instead_of_killing_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = create(dir.path(), "victim");
    let _b = create(dir.path(), "bystander");
    let victim = ShmFile::open(dir.path().join("victim")).unwrap();
    let bystander = ShmFile::open(dir.path().join("bystander")).unwrap();
    assert!(victim.read().is_ok());
    // Another process's `truncate -s 0`: the mapping now lies beyond the end
    // of the file, and touching it raises SIGBUS.
    std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("victim"))
        .unwrap()
        .set_len(0)
        .unwrap();
    assert!(victim.read().is_err(), "a truncated file reads torn");
    assert!(victim.is_truncated());
    assert_eq!(victim.heartbeat_mono_ns(), 0, "the mapping reads zeros now");
    assert!(!victim.is_retired());
    assert!(victim.read().is_err(), "and stays torn");
    // The writer in this process survives too: its stores land in zero pages.
    writer.publish(&Snapshot::default()).unwrap();
    let (snapshot, _) = bystander.read().unwrap();
    assert_eq!(snapshot.num_running, 4);
    assert!(!bystander.is_truncated());
    // Opening it again says what it is now.
    assert!(matches!(
        ShmFile::open(dir.path().join("victim")).unwrap_err(),
        Error::WrongSize { size: 0, .. }
    ));
    drop(victim);
    // The slot is free again and a new mapping starts untruncated.
    let again = ShmFile::open(dir.path().join("bystander")).unwrap();
    assert!(!again.is_truncated());
}

#[test]
fn many_mappings_register_and_unregister() {
    let dir = tempfile::tempdir().unwrap();
    let _w = create(dir.path(), "e");
    // More than one chunk of registry slots, opened and dropped twice.
    for _ in 0..2 {
        let files: Vec<ShmFile> = (0..600)
            .map(|_| ShmFile::open(dir.path().join("e")).unwrap())
            .collect();
        assert!(files.iter().all(|f| f.read().is_ok() && !f.is_truncated()));
    }
}

#[test]
fn file_zeroed_in_place_reads_torn() {
    let dir = tempfile::tempdir().unwrap();
    let _w = create(dir.path(), "zeroed");
    let reader = ShmFile::open(dir.path().join("zeroed")).unwrap();
    // Truncated and grown back before the reader touched it: no fault, the
    // mapping just reads zeros (sequence 0, which no writer publishes).
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("zeroed"))
        .unwrap();
    file.set_len(0).unwrap();
    file.set_len(FILE_SIZE as u64).unwrap();
    assert_eq!(reader.read().unwrap_err().last_seq, 0);
    assert!(!reader.is_truncated(), "no fault happened");
}

#[test]
fn writer_does_not_take_over_through_a_symbolic_link() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    // A dead writer's file elsewhere (dropping a writer removes its file,
    // so keep a copy of its bytes).
    let bytes = {
        let _w = create(elsewhere.path(), "eng");
        std::fs::read(elsewhere.path().join("eng")).unwrap()
    };
    std::fs::write(elsewhere.path().join("eng"), &bytes).unwrap();
    std::os::unix::fs::symlink(elsewhere.path().join("eng"), dir.path().join("eng")).unwrap();
    let first = Snapshot::default();
    let err =
        ShmWriter::create(dir.path(), &id("eng"), &WriterOptions::default(), &first).unwrap_err();
    assert!(
        err.to_string().starts_with("symbolic link, not followed: "),
        "{err}"
    );
    assert_eq!(
        std::fs::read(elsewhere.path().join("eng")).unwrap(),
        bytes,
        "the file the link points to is not retired"
    );
}

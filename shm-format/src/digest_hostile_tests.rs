//! Tests of what other processes can put into (or do to) the cache
//! directory: FIFOs, links, foreign files, truncation and stray writes into
//! a mapped digest. None may hang or kill a reader or a writer
//! (docs/FORMAT.md, "Cache residency").

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::digest_layout::*;
use crate::*;

fn id(s: &str) -> EngineId {
    EngineId::new(s).unwrap()
}

fn options(capacity: usize) -> DigestOptions {
    DigestOptions {
        capacity,
        generation: 2,
        kv_block_size: 16,
        ..DigestOptions::default()
    }
}

/// A digest of `count` blocks all derived from `version`, so a copy that
/// mixes two publishes is told apart (as read from a file of [`options`]
/// written with `held` = `count`: KV blocks of 16 tokens).
fn digest(version: u64, count: usize) -> CacheDigest {
    let blocks = (0..count as u64).map(|i| version << 32 | i).collect();
    CacheDigest::with_capture(version, version, blocks, count as u64, 16)
}

fn writer(state: &Path, name: &str, capacity: usize, count: usize) -> DigestWriter {
    DigestWriter::create(
        state,
        &id(name),
        &options(capacity),
        &digest(1, count),
        count as u64,
        0,
    )
    .unwrap()
}

/// Stores `value` at `offset` of the file at `path`, as another process
/// with write access could.
fn poke(path: &Path, offset: usize, value: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .write_all_at(&value.to_le_bytes(), offset as u64)
        .unwrap();
}

fn cache_path(state: &Path, name: &str) -> PathBuf {
    cache_dir(state).join(name)
}

#[test]
fn what_is_no_regular_file_is_refused_without_blocking() {
    let state = tempfile::tempdir().unwrap();
    let dir = cache_dir(state.path());
    std::fs::create_dir(&dir).unwrap();
    let fifo = dir.join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let socket = dir.join("sock");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let sub = dir.join("sub");
    std::fs::create_dir(&sub).unwrap();
    let _w = writer(state.path(), "real", 4, 2);
    let link = dir.join("link");
    std::os::unix::fs::symlink(dir.join("real"), &link).unwrap();
    for (path, what) in [
        (&fifo, "not a regular file (a FIFO)"),
        (&socket, "not a regular file (a socket)"),
        (&sub, "not a regular file (a directory)"),
        (&link, "symbolic link, not followed"),
        (
            &PathBuf::from("/dev/null"),
            "not a regular file (a character device)",
        ),
    ] {
        let err = DigestFile::open(path).unwrap_err();
        assert!(matches!(err, Error::RefusedEntry { .. }), "{err:?}");
        assert!(err.to_string().starts_with(what), "{err}");
    }
}

#[test]
fn a_digest_truncated_under_its_mapping_reads_torn() {
    let state = tempfile::tempdir().unwrap();
    // Three pages of entries; cut in the middle of the second.
    let capacity = 1_500;
    let mut writer = writer(state.path(), "victim", capacity, capacity);
    let path = cache_path(state.path(), "victim");
    let reader = DigestFile::open(&path).unwrap();
    assert_eq!(reader.read().unwrap().len(), capacity);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(5_000)
        .unwrap();
    let err = reader.read().unwrap_err();
    assert_eq!(err.kind(), "torn", "{err}");
    assert!(reader.is_truncated());
    assert!(reader.read().is_err(), "and stays torn");
    // The writer in this process survives too: its stores land in zero pages.
    writer.publish(&digest(2, capacity), 0, 0).unwrap();
    assert!(
        !writer.in_place(),
        "its writer sees the file is not what it wrote"
    );
    // Opening it again says what it is now.
    match DigestFile::open(&path).unwrap_err() {
        Error::Digest {
            error:
                DigestError::WrongSize {
                    size: 5_000,
                    expected,
                },
            ..
        } => assert_eq!(expected, digest_size(capacity) as u64),
        other => panic!("{other:?}"),
    }
    // Its writer puts a new file in place.
    writer
        .replace(&options(capacity), &digest(3, 10), 10, 0)
        .unwrap();
    assert_eq!(
        DigestFile::open(&path).unwrap().read().unwrap(),
        digest(3, 10)
    );
}

#[test]
fn a_digest_zeroed_in_place_reads_torn() {
    let state = tempfile::tempdir().unwrap();
    let _w = writer(state.path(), "zeroed", 8, 3);
    let path = cache_path(state.path(), "zeroed");
    let reader = DigestFile::open(&path).unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(0).unwrap();
    file.set_len(digest_size(8) as u64).unwrap();
    assert_eq!(reader.read().unwrap_err().kind(), "torn");
    assert!(!reader.is_truncated(), "no fault happened");
}

#[test]
fn stray_writes_after_open_are_corrupt_at_the_next_read() {
    let state = tempfile::tempdir().unwrap();
    let _w = writer(state.path(), "e", 8, 4);
    let path = cache_path(state.path(), "e");
    let reader = DigestFile::open(&path).unwrap();
    let control = |i: usize| DIGEST_CONTROL_OFFSET + 8 * i;
    let cases: [(usize, u64, &str); 4] = [
        (control(3), 9, "count 9 is above the capacity of 8"),
        (control(3), u64::MAX, "above the capacity"),
        (control(0), 0, "version 0"),
        (DIGEST_ENTRIES_OFFSET + 8, 0, "not strictly ascending"),
    ];
    for (offset, value, what) in cases {
        let before = std::fs::read(&path).unwrap();
        poke(&path, offset, value);
        let err = reader.read().unwrap_err();
        assert_eq!(err.kind(), "corrupt_cache", "{err}");
        assert!(err.to_string().contains(what), "{what}: {err}");
        // Refused at open too.
        let opened = DigestFile::open(&path).unwrap_err();
        assert!(matches!(opened, Error::Digest { .. }), "{opened}");
        std::fs::write(&path, before).unwrap();
        assert!(reader.read().is_ok());
    }
}

#[test]
fn a_writer_that_died_mid_write_leaves_a_torn_digest_not_a_hang() {
    let state = tempfile::tempdir().unwrap();
    let _w = writer(state.path(), "e", 8, 4);
    let path = cache_path(state.path(), "e");
    poke(&path, DIGEST_SEQ_OFFSET, 5);
    // Open does not fail on a write in progress; the read gives up, bounded.
    let reader = DigestFile::open(&path).unwrap();
    let before = seqlock::failed_attempts();
    match reader.read().unwrap_err() {
        DigestError::Torn(torn) => assert_eq!(torn.last_seq, 5),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        seqlock::failed_attempts() - before,
        u64::from(seqlock::READ_SPINS + seqlock::READ_YIELDS)
    );
}

#[test]
fn writers_never_clobber_a_foreign_file_or_follow_a_link() {
    let state = tempfile::tempdir().unwrap();
    let dir = cache_dir(state.path());
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("foreign"), b"not a digest, somebody's data").unwrap();
    let err = DigestWriter::create(
        state.path(),
        &id("foreign"),
        &options(4),
        &digest(1, 1),
        1,
        0,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Digest {
                error: DigestError::NotDigest,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        std::fs::read(dir.join("foreign")).unwrap(),
        b"not a digest, somebody's data"
    );
    let elsewhere = tempfile::tempdir().unwrap();
    std::fs::write(elsewhere.path().join("target"), b"x").unwrap();
    std::os::unix::fs::symlink(elsewhere.path().join("target"), dir.join("linked")).unwrap();
    let err = DigestWriter::create(
        state.path(),
        &id("linked"),
        &options(4),
        &digest(1, 1),
        1,
        0,
    )
    .unwrap_err();
    assert!(matches!(err, Error::RefusedEntry { .. }), "{err}");
    assert_eq!(
        std::fs::read(elsewhere.path().join("target")).unwrap(),
        b"x"
    );
    // A dead writer's digest of the wrong size is replaced.
    std::fs::write(dir.join("short"), DIGEST_MAGIC.to_le_bytes()).unwrap();
    let w =
        DigestWriter::create(state.path(), &id("short"), &options(4), &digest(1, 1), 1, 0).unwrap();
    assert!(w.in_place());
    // A cache "directory" that is a file is a clear error.
    let other = tempfile::tempdir().unwrap();
    std::fs::write(cache_dir(other.path()), b"").unwrap();
    let err =
        DigestWriter::create(other.path(), &id("e"), &options(4), &digest(1, 1), 1, 0).unwrap_err();
    assert!(err.to_string().contains("not a directory"), "{err}");
}

#[test]
fn the_cache_directory_gets_the_state_directorys_mode() {
    use std::os::unix::fs::PermissionsExt;
    let state = tempfile::tempdir().unwrap();
    std::fs::set_permissions(state.path(), std::fs::Permissions::from_mode(0o750)).unwrap();
    let _w = writer(state.path(), "e", 1, 1);
    let mode = std::fs::metadata(cache_dir(state.path()))
        .unwrap()
        .permissions()
        .mode();
    // The umask may take bits away, never add any.
    assert_eq!(mode & 0o7777 & !0o750, 0, "{mode:o}");
    assert_ne!(mode & 0o700, 0, "{mode:o}");
}

/// A reader racing a writer whose digests change length accepts only whole
/// digests: every block of one version, exactly as many as it published.
#[test]
fn a_reader_racing_the_writer_accepts_only_whole_digests() {
    let state = tempfile::tempdir().unwrap();
    let capacity = 600;
    let mut writer = writer(state.path(), "racy", capacity, 1);
    let reader = DigestFile::open(cache_path(state.path(), "racy")).unwrap();
    let count_of = |version: u64| (version as usize * 37) % (capacity + 1);
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for version in 2..3_000u64 {
                writer
                    .publish(&digest(version, count_of(version)), 0, version)
                    .unwrap();
            }
            done.store(true, std::sync::atomic::Ordering::Release);
        });
        let mut accepted = 0;
        while !done.load(std::sync::atomic::Ordering::Acquire) || accepted == 0 {
            match reader.read_record() {
                Ok(record) => {
                    let version = record.digest.version();
                    let expected = if version == 1 { 1 } else { count_of(version) };
                    assert_eq!(record.digest.len(), expected, "version {version}");
                    assert!(record.digest.blocks().iter().all(|b| b >> 32 == version));
                    assert_eq!(record.held, expected as u64);
                    accepted += 1;
                }
                Err(DigestError::Torn(_)) => {}
                Err(other) => panic!("{other}"),
            }
        }
    });
    assert_eq!(reader.read().unwrap().version(), 2_999);
}

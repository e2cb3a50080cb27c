//! `ShmDir` with cache digests (docs/FORMAT.md, "Cache residency"): real
//! engine files and digest files (shm-format's writers) in a state
//! directory and its `<dir>.cache` sibling, read through every path of the
//! source. What other processes can put where a digest belongs (garbage, a
//! FIFO, a link, a directory, a file cut under its mapping) is that
//! engine's error or no digest, never a hang or a crash, and its state is
//! still read.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use engine_state_shm_format::{
    cache_dir, monotonic_ns, CacheDigest, DigestOptions, DigestWriter, EngineId, ShmWriter,
    Snapshot, WriterOptions,
};

use crate::*;

/// A state directory inside a temporary one (so its `.cache` sibling is
/// removed with it).
fn state_dir() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("engines");
    std::fs::create_dir(&dir).unwrap();
    (tmp, dir)
}

fn id(name: &str) -> EngineId {
    EngineId::new(name).unwrap()
}

/// An engine whose snapshot names digest `version` (0: none).
fn engine(dir: &Path, name: &str) -> ShmWriter {
    ShmWriter::create(
        dir,
        &id(name),
        &WriterOptions::default(),
        &snapshot_naming(0),
    )
    .unwrap()
}

fn snapshot_naming(version: u64) -> Snapshot {
    Snapshot {
        captured_mono_ns: monotonic_ns(),
        num_running: 1,
        cache_version: version,
        cache_blocks: 3,
        ..Snapshot::default()
    }
}

/// Publishes a snapshot naming digest `version` (and a heartbeat: fresh).
fn name(writer: &mut ShmWriter, version: u64) {
    writer.publish(&snapshot_naming(version)).unwrap();
    writer.stamp_heartbeat(monotonic_ns());
}

fn digest_writer(dir: &Path, name: &str, generation: u64, version: u64) -> DigestWriter {
    let options = DigestOptions {
        capacity: 8,
        generation,
        ..DigestOptions::default()
    };
    DigestWriter::create(dir, &id(name), &options, &digest(version), 3, 0).unwrap()
}

fn digest(version: u64) -> CacheDigest {
    CacheDigest::new(version, monotonic_ns(), vec![version, 100, 200])
}

fn with_digests() -> ReaderOptions {
    ReaderOptions {
        rescan_interval: Duration::ZERO,
        ..ReaderOptions::default()
    }
    .with_cache_digests(true)
}

/// The engine `name` of one read of every engine, and the cache errors of
/// that read.
fn read(source: &mut ShmDir, name: &str) -> (EngineState, Vec<String>) {
    let reading = source.read().unwrap();
    let state = reading.get(name).expect("the engine is read").clone();
    let errors = reading
        .errors
        .iter()
        .filter(|e| e.error.is_cache_fault())
        .map(|e| {
            assert_eq!(e.name, name);
            e.to_string()
        })
        .collect();
    (state, errors)
}

/// The class of [`ShmDir::cache_fault`] for `state`, at any call.
fn fault_class(source: &ShmDir, state: &EngineState) -> Option<&'static str> {
    source.cache_fault(state).map(|e| match *e.error {
        Error::MissingCache { .. } => "missing_cache",
        Error::CorruptCache { .. } => "corrupt_cache",
        _ => panic!("not a cache fault: {e}"),
    })
}

#[test]
fn a_digest_is_read_once_per_version_and_shared_until_it_moves() {
    let (_tmp, dir) = state_dir();
    let mut writer = engine(&dir, "e0");
    let mut source = ShmDir::open(&dir, with_digests()).unwrap();
    assert_eq!(read(&mut source, "e0").0.cache, None, "version 0: none");

    let mut digests = digest_writer(&dir, "e0", writer.generation(), 1);
    name(&mut writer, 1);
    let (state, errors) = read(&mut source, "e0");
    assert!(errors.is_empty(), "{errors:?}");
    let first = state.cache.unwrap();
    assert_eq!((first.version(), first.blocks()), (1, &[1, 100, 200][..]));
    for _ in 0..3 {
        name(&mut writer, 1);
        let again = read(&mut source, "e0").0.cache.unwrap();
        assert!(
            Arc::ptr_eq(&first, &again),
            "the same Arc while the version stays"
        );
    }
    // The writer writes the digest before the snapshot names it: not read
    // until then (the snapshot's word is the only thing a read looks at).
    digests.publish(&digest(2), 3, 0).unwrap();
    let held = read(&mut source, "e0").0.cache.unwrap();
    assert!(Arc::ptr_eq(&first, &held));
    // The file already ahead of the version named: used, and kept until a
    // later version is named.
    digests.publish(&digest(3), 3, 0).unwrap();
    name(&mut writer, 2);
    let named = read(&mut source, "e0").0.cache.unwrap();
    assert_eq!(named.version(), 3);
    name(&mut writer, 3);
    assert!(Arc::ptr_eq(
        &named,
        &read(&mut source, "e0").0.cache.unwrap()
    ));
    // One engine by id, and the relay's changed-engines read, too.
    assert_eq!(
        source.read_engine("e0").unwrap().unwrap().cache,
        Some(named.clone())
    );
    name(&mut writer, 3);
    let mut reading = Reading::default();
    source
        .read_changed_at(&mut reading, monotonic_ns(), None)
        .unwrap();
    assert_eq!(reading.engines[0].cache, Some(named));

    // Without the option: nothing read.
    let mut plain = ShmDir::open(&dir, ReaderOptions::default()).unwrap();
    let state = plain.read_engine("e0").unwrap().unwrap();
    assert_eq!((state.snapshot.cache_version, state.cache), (3, None));
}

/// A moved digest is read into the held allocation when no caller holds
/// it any more, and into a new one when a caller does: a caller's digest
/// never changes under it.
#[test]
fn a_moved_digest_reuses_its_allocation_only_when_no_caller_holds_it() {
    let (_tmp, dir) = state_dir();
    let mut writer = engine(&dir, "e0");
    let mut digests = digest_writer(&dir, "e0", writer.generation(), 1);
    let mut source = ShmDir::open(&dir, with_digests()).unwrap();
    name(&mut writer, 1);
    let kept = read(&mut source, "e0").0.cache.unwrap();

    // Held by this caller: the next version goes to a new digest.
    digests.publish(&digest(2), 3, 0).unwrap();
    name(&mut writer, 2);
    let second = read(&mut source, "e0").0.cache.unwrap();
    assert!(!Arc::ptr_eq(&kept, &second));
    assert_eq!((second.version(), second.blocks()), (2, &[2, 100, 200][..]));
    assert_eq!((kept.version(), kept.blocks()), (1, &[1, 100, 200][..]));
    let (arc, entries) = (Arc::as_ptr(&second), second.blocks().as_ptr());
    drop(second);

    // No one else holds version 2 now: version 3 is read into it.
    digests.publish(&digest(3), 3, 0).unwrap();
    name(&mut writer, 3);
    let third = read(&mut source, "e0").0.cache.unwrap();
    assert_eq!((third.version(), third.blocks()), (3, &[3, 100, 200][..]));
    assert_eq!(Arc::as_ptr(&third), arc, "the Arc is reused");
    assert_eq!(third.blocks().as_ptr(), entries, "and its entries");
    assert_eq!((kept.version(), kept.blocks()), (1, &[1, 100, 200][..]));

    // Held again (`third`): a torn-free read of version 4 leaves it be.
    digests.publish(&digest(4), 3, 0).unwrap();
    name(&mut writer, 4);
    let fourth = read(&mut source, "e0").0.cache.unwrap();
    assert_eq!((third.version(), third.blocks()), (3, &[3, 100, 200][..]));
    assert_eq!(fourth.version(), 4);
}

/// A writer that replaces its digest file (a new capacity) retires the old
/// one: the reader maps the new one at the next version.
#[test]
fn a_replaced_digest_file_is_mapped_again() {
    let (_tmp, dir) = state_dir();
    let mut writer = engine(&dir, "r");
    let mut digests = digest_writer(&dir, "r", writer.generation(), 1);
    name(&mut writer, 1);
    let mut source = ShmDir::open(&dir, with_digests()).unwrap();
    assert_eq!(read(&mut source, "r").0.cache.unwrap().version(), 1);
    let options = DigestOptions {
        capacity: 64,
        generation: writer.generation(),
        ..DigestOptions::default()
    };
    digests.replace(&options, &digest(2), 3, 0).unwrap();
    name(&mut writer, 2);
    let (state, errors) = read(&mut source, "r");
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(state.cache.unwrap().version(), 2);
}

/// A snapshot naming a digest with no file: reported once per version, the
/// state read all the same.
#[test]
fn a_missing_digest_is_reported_once_per_version() {
    let (_tmp, dir) = state_dir();
    let mut writer = engine(&dir, "m");
    name(&mut writer, 4);
    let mut source = ShmDir::open(&dir, with_digests()).unwrap();
    let (state, errors) = read(&mut source, "m");
    assert_eq!((state.status, state.cache.as_ref()), (Status::Fresh, None));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("names digest version 4, but there is no digest file")
            && errors[0].contains("engines.cache/m"),
        "{}",
        errors[0]
    );
    // Not there is not damage: `missing_cache`, said once, and asked for
    // at every read.
    assert_eq!(fault_class(&source, &state), Some("missing_cache"));
    for _ in 0..3 {
        let (state, errors) = read(&mut source, "m");
        assert!(errors.is_empty() && state.cache.is_none(), "{errors:?}");
        assert_eq!(fault_class(&source, &state), Some("missing_cache"));
    }
    name(&mut writer, 5);
    assert_eq!(
        read(&mut source, "m").1.len(),
        1,
        "the next version: once more"
    );
    // The digest appears: used from its version on.
    let _digests = digest_writer(&dir, "m", writer.generation(), 6);
    name(&mut writer, 6);
    let (state, errors) = read(&mut source, "m");
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(state.cache.unwrap().version(), 6);
}

/// A retired digest (its writer closed it) is not used: neither the one a
/// reader already holds nor one it finds at the path.
#[test]
fn a_retired_digest_is_not_used() {
    let (_tmp, dir) = state_dir();
    let mut writer = engine(&dir, "r");
    let _digests = digest_writer(&dir, "r", writer.generation(), 1);
    name(&mut writer, 1);
    let mut source = ShmDir::open(&dir, with_digests()).unwrap();
    assert_eq!(read(&mut source, "r").0.cache.unwrap().version(), 1);
    // RETIRED stored in the file at its path (what a writer does before it
    // goes; the path still holds it here).
    let path = engine_state_shm_format::cache_dir(&dir).join("r");
    {
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all_at(&2u64.to_le_bytes(), 24).unwrap();
    }
    name(&mut writer, 1);
    let (state, errors) = read(&mut source, "r");
    assert_eq!(state.cache, None, "the held digest's file is retired");
    assert!(errors.is_empty(), "{errors:?}");
    // A reader that meets the retired file first does not use it either.
    let mut fresh = ShmDir::open(&dir, with_digests()).unwrap();
    assert_eq!(read(&mut fresh, "r").0.cache, None);
}

/// A digest of another run of the engine (another generation) is not used.
#[test]
fn a_digest_of_another_generation_is_not_used() {
    let (_tmp, dir) = state_dir();
    let mut writer = engine(&dir, "g");
    let _digests = digest_writer(&dir, "g", writer.generation() + 1, 1);
    name(&mut writer, 1);
    let mut source = ShmDir::open(&dir, with_digests()).unwrap();
    let (state, errors) = read(&mut source, "g");
    assert_eq!(state.cache, None);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("belongs to generation"), "{}", errors[0]);
    assert_eq!(fault_class(&source, &state), Some("missing_cache"));
    let (state, errors) = read(&mut source, "g");
    assert!(errors.is_empty(), "once");
    assert_eq!(fault_class(&source, &state), Some("missing_cache"));
}

/// Garbage where a digest belongs: that engine's `corrupt_cache` error at
/// every read (while the snapshot names that version), with advice; the
/// engine and the other engines are read.
#[test]
fn a_damaged_digest_is_the_engines_error_and_its_state_is_still_read() {
    let (_tmp, dir) = state_dir();
    let mut writer = engine(&dir, "bad");
    let mut other = engine(&dir, "ok");
    let _ok = digest_writer(&dir, "ok", other.generation(), 1);
    name(&mut other, 1);
    std::fs::create_dir_all(cache_dir(&dir)).unwrap();
    let path = cache_dir(&dir).join("bad");
    std::fs::write(&path, vec![0xab; 4096]).unwrap();
    name(&mut writer, 1);
    let mut source = ShmDir::open(&dir, with_digests()).unwrap();
    for _ in 0..2 {
        let (state, errors) = read(&mut source, "bad");
        assert_eq!((state.status, state.cache.as_ref()), (Status::Fresh, None));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(fault_class(&source, &state), Some("corrupt_cache"));
        assert!(
            errors[0].contains("not a cache digest")
                && errors[0].contains("its state is read without it")
                && errors[0].contains("restart that engine's publisher"),
            "{}",
            errors[0]
        );
        let reading = source.read().unwrap();
        assert_eq!(
            reading.get("ok").unwrap().cache.as_ref().unwrap().version(),
            1
        );
    }
    // Entries out of order in a well-formed file: corrupt too. A digest
    // file written by hand from a valid one, entries swapped.
    let valid = tempfile::tempdir().unwrap();
    let valid_dir = valid.path().join("v");
    std::fs::create_dir(&valid_dir).unwrap();
    let source_digest = digest_writer(&valid_dir, "bad", writer.generation(), 2);
    let mut bytes = std::fs::read(source_digest.path()).unwrap();
    let (a, b) = (128, 136);
    let first: [u8; 8] = bytes[a..a + 8].try_into().unwrap();
    let second: [u8; 8] = bytes[b..b + 8].try_into().unwrap();
    bytes[a..a + 8].copy_from_slice(&second);
    bytes[b..b + 8].copy_from_slice(&first);
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, &bytes).unwrap();
    name(&mut writer, 2);
    let (state, errors) = read(&mut source, "bad");
    assert_eq!(state.cache, None);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("corrupt cache digest"), "{}", errors[0]);
}

/// A FIFO (a plain open would wait for a writer forever), a symbolic link
/// and a directory where a digest belongs: refused at once, each that
/// engine's error.
#[test]
fn fifos_links_and_directories_where_a_digest_belongs_are_refused_at_once() {
    let (_tmp, dir) = state_dir();
    let cache = cache_dir(&dir);
    std::fs::create_dir_all(&cache).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let mut writers = Vec::new();
    for (name_, make) in [("fifo", 0), ("link", 1), ("directory", 2)] {
        let mut writer = engine(&dir, name_);
        let path = cache.join(name_);
        match make {
            0 => {
                nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap()
            }
            1 => {
                let target = digest_writer(elsewhere.path(), name_, writer.generation(), 1);
                std::os::unix::fs::symlink(target.path(), &path).unwrap();
                std::mem::forget(target); // keep its file in place
            }
            _ => std::fs::create_dir(&path).unwrap(),
        }
        name(&mut writer, 1);
        writers.push(writer);
    }
    let mut source = ShmDir::open(&dir, with_digests()).unwrap();
    let reading = source.read().unwrap();
    assert_eq!(reading.engines.len(), 3);
    assert!(reading.engines.iter().all(|e| e.cache.is_none()));
    let errors: Vec<String> = reading
        .errors
        .iter()
        .filter(|e| matches!(*e.error, Error::CorruptCache { .. }))
        .map(|e| e.to_string())
        .collect();
    assert_eq!(errors.len(), 3, "{errors:?}");
}

/// A digest file cut under the reader's mapping (`truncate -s 0`): the
/// read is torn (zero pages, no `SIGBUS`), the state still read; once the
/// writer puts a new file in place and names its version, it is read.
#[test]
fn a_digest_cut_under_the_mapping_never_kills_the_reader() {
    let (_tmp, dir) = state_dir();
    let mut writer = engine(&dir, "cut");
    let mut digests = digest_writer(&dir, "cut", writer.generation(), 1);
    name(&mut writer, 1);
    let mut source = ShmDir::open(&dir, with_digests()).unwrap();
    assert!(read(&mut source, "cut").0.cache.is_some());
    std::fs::OpenOptions::new()
        .write(true)
        .open(digests.path())
        .unwrap()
        .set_len(0)
        .unwrap();
    name(&mut writer, 2);
    let (state, _) = read(&mut source, "cut");
    assert_eq!((state.status, state.cache), (Status::Fresh, None));
    // The writer replaces its file (as a publisher does for a new capacity).
    let options = DigestOptions {
        capacity: 8,
        generation: writer.generation(),
        ..DigestOptions::default()
    };
    digests.replace(&options, &digest(3), 3, 0).unwrap();
    name(&mut writer, 3);
    let (state, errors) = read(&mut source, "cut");
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(state.cache.unwrap().version(), 3);
}

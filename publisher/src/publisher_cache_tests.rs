//! The publisher's cache digests (docs/FORMAT.md, "Cache residency") on
//! shared memory: written on change only, named by the snapshots published
//! after them, replaced when the capacity changes, refused when they break
//! the rules, retired with the engine file; read back through the reader.
//! The Redis backend's: tests/tests/redis_cache.rs (a real `redis-server`).

use std::path::Path;
use std::sync::Arc;

use engine_state_reader::{ReaderOptions, ShmDir};
use engine_state_shm_format::{cache_dir, DigestFile, ShmFile, Snapshot, MAX_DIGEST_ENTRIES};

use crate::*;

/// A state directory inside a temporary one (its `.cache` sibling is
/// removed with it); the publisher creates it.
fn state_dir() -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("engines");
    (tmp, dir)
}

fn start(dir: &Path, id: &str) -> Publisher {
    let uri = format!("file://{}", dir.display());
    Publisher::start(PublisherConfig::resolve(Some(&uri), Some(id), Some(50), None).unwrap())
        .unwrap()
}

fn snapshot_of(dir: &Path, id: &str) -> Snapshot {
    ShmFile::open(dir.join(id)).unwrap().read().unwrap().0
}

fn digest_reader(dir: &Path) -> ShmDir {
    ShmDir::open(dir, ReaderOptions::default().with_cache_digests(true)).unwrap()
}

#[test]
fn a_digest_is_written_on_change_and_named_by_later_snapshots() {
    let (_tmp, dir) = state_dir();
    let mut publisher = start(dir.as_path(), "e0");
    let file = cache_dir(dir.as_path()).join("e0");
    assert!(!file.exists(), "no digest before the first publish_cache");

    assert!(publisher.publish_cache(&[30, 10, 20, 10], 3, 8).unwrap());
    let digest = DigestFile::open(&file).unwrap();
    let read = digest.read().unwrap();
    assert_eq!((read.version(), read.blocks()), (1, &[10, 20, 30][..]));
    assert_eq!(digest.capacity(), 8);
    assert_eq!(
        digest.generation(),
        ShmFile::open(dir.as_path().join("e0"))
            .unwrap()
            .generation(),
        "the digest belongs to the engine file's generation"
    );
    // Not named until the next snapshot.
    assert_eq!(snapshot_of(dir.as_path(), "e0").cache_version, 0);

    // A caller's values for the two words are overwritten.
    publisher
        .publish(Snapshot {
            num_running: 2,
            cache_blocks: 999,
            cache_version: 77,
            ..Snapshot::default()
        })
        .unwrap();
    let snap = snapshot_of(dir.as_path(), "e0");
    assert_eq!((snap.cache_blocks, snap.cache_version), (3, 1));
    assert_eq!(snap.num_running, 2);

    // The same set in another order: nothing written.
    let seq = digest.seq();
    assert!(!publisher.publish_cache(&[20, 30, 10], 3, 8).unwrap());
    assert_eq!(digest.seq(), seq, "the file was not written");
    publisher.publish(Snapshot::default()).unwrap();
    assert_eq!(snapshot_of(dir.as_path(), "e0").cache_version, 1);

    // A changed set: version 2, in the same file.
    assert!(publisher.publish_cache(&[10, 20], 5, 8).unwrap());
    let read = digest.read().unwrap();
    assert_eq!((read.version(), read.blocks()), (2, &[10, 20][..]));
    assert_eq!(digest.read_record().unwrap().held, 5);
    publisher.publish(Snapshot::default()).unwrap();
    let snap = snapshot_of(dir.as_path(), "e0");
    assert_eq!((snap.cache_blocks, snap.cache_version), (2, 2));
    assert!(!digest.is_retired());

    // Close retires and removes the digest with the engine file.
    publisher.close();
    assert!(digest.is_retired());
    assert!(!file.exists());
    assert!(!dir.as_path().join("e0").exists());
}

#[test]
fn a_new_capacity_replaces_the_file() {
    let (_tmp, dir) = state_dir();
    let mut publisher = start(dir.as_path(), "cap");
    let path = cache_dir(dir.as_path()).join("cap");
    publisher.publish_cache(&[1, 2], 2, 4).unwrap();
    let old = DigestFile::open(&path).unwrap();
    assert_eq!(old.capacity(), 4);
    // The same set at another capacity: a new file, a new version.
    assert!(publisher.publish_cache(&[1, 2], 2, 16).unwrap());
    assert!(old.is_retired(), "readers of the old file see it retired");
    let new = DigestFile::open(&path).unwrap();
    assert_eq!(new.capacity(), 16);
    assert_eq!(new.read().unwrap().version(), 2);
    assert_eq!(new.generation(), old.generation());
}

#[test]
fn digests_that_break_the_rules_are_refused_and_nothing_is_published() {
    let (_tmp, dir) = state_dir();
    let mut publisher = start(dir.as_path(), "strict");
    let err = |r: Result<bool, Error>| {
        let e = r.unwrap_err();
        assert!(matches!(e, Error::InvalidCache { .. }), "{e:?}");
        e.to_string()
    };
    let text = err(publisher.publish_cache(&[1, 2, 3], 3, 2));
    assert!(
        text.contains("3 distinct blocks do not fit in a digest of capacity 2"),
        "{text}"
    );
    let text = err(publisher.publish_cache(&[1], 1, MAX_DIGEST_ENTRIES + 1));
    assert!(text.contains("above the 131072 entries"), "{text}");
    let text = err(publisher.publish_cache(&[1, 2], 1, 4));
    assert!(
        text.contains("held (1) is below the 2 distinct blocks"),
        "{text}"
    );
    assert!(!cache_dir(dir.as_path()).join("strict").exists());
    publisher.publish(Snapshot::default()).unwrap();
    let snap = snapshot_of(dir.as_path(), "strict");
    assert_eq!((snap.cache_blocks, snap.cache_version), (0, 0));
    // The largest capacity is fine.
    assert!(publisher
        .publish_cache(&[1], 1, MAX_DIGEST_ENTRIES)
        .unwrap());
    publisher.close();
    let err = publisher.publish_cache(&[1], 1, 4).unwrap_err();
    assert!(matches!(err, Error::Closed { .. }), "{err:?}");
}

/// What a router reads: the digest once per version, the same `Arc` while
/// the version stays.
#[test]
fn a_reader_with_digests_gets_each_version_once() {
    let (_tmp, dir) = state_dir();
    let mut publisher = start(dir.as_path(), "r");
    let mut source = digest_reader(dir.as_path());
    assert_eq!(source.read_engine("r").unwrap().unwrap().cache, None);
    publisher.publish_cache(&[5, 6, 7], 3, 8).unwrap();
    publisher.publish(Snapshot::default()).unwrap();
    let first = source.read_engine("r").unwrap().unwrap().cache.unwrap();
    assert_eq!((first.version(), first.blocks()), (1, &[5, 6, 7][..]));
    publisher.publish(Snapshot::default()).unwrap();
    let again = source.read_engine("r").unwrap().unwrap().cache.unwrap();
    assert!(Arc::ptr_eq(&first, &again), "not read again");
    publisher.publish_cache(&[5, 6], 2, 8).unwrap();
    publisher.publish(Snapshot::default()).unwrap();
    let moved = source.read_engine("r").unwrap().unwrap().cache.unwrap();
    assert_eq!((moved.version(), moved.blocks()), (2, &[5, 6][..]));
    // A reader that does not ask pays nothing and gets nothing.
    let mut plain = ShmDir::open(dir.as_path(), ReaderOptions::default()).unwrap();
    let state = plain.read_engine("r").unwrap().unwrap();
    assert_eq!((state.snapshot.cache_version, state.cache), (2, None));
}

/// An engine file recreated in a new generation (removed under its live
/// publisher): readers would not use a digest of the old generation, so the
/// next `publish_cache` rewrites it even for the same set.
#[test]
fn a_recreated_engine_file_gets_its_digest_rewritten() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let (_tmp, dir) = state_dir();
    let now = Arc::new(AtomicU64::new(1_000_000_000_000));
    let clock = engine_state_shm_format::Clock::from_fn({
        let now = Arc::clone(&now);
        move || now.load(Ordering::Relaxed)
    });
    let uri = format!("file://{}", dir.as_path().display());
    let config = PublisherConfig::resolve(Some(&uri), Some("g"), Some(10), None).unwrap();
    let mut publisher = Publisher::start_driven(config, clock).unwrap();
    publisher.publish_cache(&[1, 2, 3], 3, 8).unwrap();
    let engine = dir.as_path().join("g");
    let before = ShmFile::open(&engine).unwrap().generation();
    std::fs::remove_file(&engine).unwrap();
    for _ in 0..crate::recreate::CHECK_EVERY {
        now.fetch_add(10_000_000, Ordering::Relaxed);
        publisher.heartbeat_tick();
    }
    assert_eq!(publisher.stats().files_recreated, 1);
    let after = ShmFile::open(&engine).unwrap().generation();
    assert!(after > before);
    assert!(
        publisher.publish_cache(&[3, 2, 1], 3, 8).unwrap(),
        "rewritten"
    );
    let digest = DigestFile::open(cache_dir(dir.as_path()).join("g")).unwrap();
    assert_eq!(digest.generation(), after);
    assert_eq!(digest.read().unwrap().version(), 2);
    publisher.publish(Snapshot::default()).unwrap();
    let mut source = digest_reader(dir.as_path());
    let state = source.read_engine("g").unwrap().unwrap();
    assert_eq!(state.generation, after);
    assert_eq!(state.cache.unwrap().blocks(), &[1, 2, 3]);
    assert!(!publisher.publish_cache(&[1, 2, 3], 3, 8).unwrap());
}

/// A digest file removed by another process (a cleanup script) is put back
/// at the next `publish_cache`, even for an unchanged set.
#[test]
fn a_removed_digest_file_is_put_back() {
    let (_tmp, dir) = state_dir();
    let mut publisher = start(&dir, "back");
    let path = cache_dir(&dir).join("back");
    publisher.publish_cache(&[4, 5], 2, 8).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(publisher.publish_cache(&[5, 4], 2, 8).unwrap(), "rewritten");
    let digest = DigestFile::open(&path).unwrap().read().unwrap();
    assert_eq!((digest.version(), digest.blocks()), (2, &[4, 5][..]));
    assert!(!publisher.publish_cache(&[4, 5], 2, 8).unwrap());
}

#[test]
fn the_kv_block_size_goes_into_the_digest_header_and_a_change_rewrites_it() {
    let (_tmp, dir) = state_dir();
    let mut publisher = start(dir.as_path(), "kv");
    let path = cache_dir(dir.as_path()).join("kv");
    publisher.publish_cache(&[1, 2], 2, 4).unwrap();
    let first = DigestFile::open(&path).unwrap();
    assert_eq!(first.read_record().unwrap().kv_block_size, 0, "not given");

    // The same set with the block size given: written again, in a new file.
    publisher.set_cache_kv_block_size(16);
    assert!(publisher.publish_cache(&[1, 2], 2, 4).unwrap());
    let file = DigestFile::open(&path).unwrap();
    let record = file.read_record().unwrap();
    assert_eq!(record.kv_block_size, 16);
    assert_eq!(record.digest.version(), 2);
    // Unchanged from then on: nothing written.
    let seq = file.seq();
    assert!(!publisher.publish_cache(&[2, 1], 2, 4).unwrap());
    assert_eq!(file.seq(), seq);
    assert!(publisher.publish_cache(&[1, 2, 3], 3, 4).unwrap());
    assert_eq!(file.read_record().unwrap().kv_block_size, 16);
}

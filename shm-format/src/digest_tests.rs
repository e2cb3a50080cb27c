//! Tests of the cache digest file as a whole: creation, publish, reading,
//! replacement, retirement, and the Redis value's round trip.

use std::os::unix::fs::PermissionsExt;

use crate::digest_layout::*;
use crate::*;

fn id(s: &str) -> EngineId {
    EngineId::new(s).unwrap()
}

fn options(capacity: usize) -> DigestOptions {
    DigestOptions {
        capacity,
        generation: 3,
        kv_block_size: 16,
        ..DigestOptions::default()
    }
}

fn digest(version: u64, blocks: &[u64]) -> CacheDigest {
    CacheDigest::new(version, 1_000 + version, blocks.to_vec())
}

#[test]
fn created_file_holds_the_first_digest() {
    let state = tempfile::tempdir().unwrap();
    let first = digest(1, &[30, 10, 20]);
    let writer = DigestWriter::create(state.path(), &id("e0"), &options(8), &first, 5, 77).unwrap();
    let path = cache_dir(state.path()).join("e0");
    assert_eq!(writer.path(), path);
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.len(), digest_size(8) as u64);
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    // Nothing inside the state directory itself: a layout-1 reader sees no digest.
    assert_eq!(std::fs::read_dir(state.path()).unwrap().count(), 0);

    let file = DigestFile::open(&path).unwrap();
    // The digest read says what its header says: held 5, KV blocks of 16.
    let read = file.read().unwrap();
    assert_eq!(
        read,
        CacheDigest::with_capture(1, 1_001, vec![10, 20, 30], 5, 16)
    );
    assert_eq!((read.held(), read.kv_block_size()), (5, 16));
    assert_ne!(read, first, "held and kv_block_size are part of a digest");
    let record = file.read_record().unwrap();
    assert_eq!(
        (record.generation, record.held, record.captured_unix_ns),
        (3, 5, 77)
    );
    assert_eq!(record.kv_block_size, 16);
    assert_eq!(record.writer_pid, std::process::id());
    assert_eq!((file.generation(), file.capacity()), (3, 8));
    assert_eq!(file.seq(), 2);
    assert!(!file.is_retired());
    assert!(writer.in_place());
    assert_eq!(writer.last(), &record);
    drop(writer);
    assert!(file.is_retired(), "closing retires the file");
    assert!(!path.exists(), "and removes it");
    // No temporary file is left behind.
    assert_eq!(
        std::fs::read_dir(cache_dir(state.path())).unwrap().count(),
        0
    );
}

#[test]
fn publishes_are_seen_and_capacity_is_enforced() {
    let state = tempfile::tempdir().unwrap();
    let mut writer =
        DigestWriter::create(state.path(), &id("e0"), &options(3), &digest(1, &[1]), 1, 0).unwrap();
    let file = DigestFile::open(writer.path()).unwrap();
    writer.publish(&digest(2, &[9, 4, 6]), 3, 1).unwrap();
    assert_eq!(
        file.read().unwrap(),
        CacheDigest::with_capture(2, 1_002, vec![4, 6, 9], 3, 16)
    );
    // Fewer entries than before: only the first `count` are read.
    writer.publish(&digest(3, &[5]), 0, 2).unwrap();
    let record = file.read_record().unwrap();
    assert_eq!(record.digest.blocks(), &[5]);
    assert_eq!(record.held, 1, "held is at least the count");
    let too_many = writer.publish(&digest(4, &[1, 2, 3, 4]), 4, 3).unwrap_err();
    assert!(
        matches!(
            too_many,
            Error::DigestCapacity {
                count: 4,
                capacity: 3
            }
        ),
        "{too_many}"
    );
    assert_eq!(file.read().unwrap().version(), 3, "nothing written");
    writer.close();
    assert!(file.is_retired());
}

#[test]
fn capacities_beyond_the_limit_are_refused() {
    let state = tempfile::tempdir().unwrap();
    let err = DigestWriter::create(
        state.path(),
        &id("e0"),
        &options(MAX_DIGEST_ENTRIES + 1),
        &digest(1, &[]),
        0,
        0,
    )
    .unwrap_err();
    assert!(matches!(err, Error::DigestCapacity { .. }), "{err}");
    assert!(err.to_string().contains("131072"), "{err}");
}

#[test]
fn replace_moves_readers_to_a_new_file() {
    let state = tempfile::tempdir().unwrap();
    let mut writer = DigestWriter::create(
        state.path(),
        &id("e0"),
        &options(2),
        &digest(1, &[1, 2]),
        2,
        0,
    )
    .unwrap();
    let old = DigestFile::open(writer.path()).unwrap();
    let bigger = DigestOptions {
        capacity: 4,
        ..options(2)
    };
    writer
        .replace(&bigger, &digest(2, &[1, 2, 3, 4]), 4, 0)
        .unwrap();
    assert!(old.is_retired());
    let new = DigestFile::open(writer.path()).unwrap();
    assert_ne!(new.inode(), old.inode());
    assert_eq!(new.capacity(), 4);
    assert_eq!(
        new.read().unwrap(),
        CacheDigest::with_capture(2, 1_002, vec![1, 2, 3, 4], 4, 16)
    );
    assert!(writer.in_place());
    assert_eq!(writer.options(), bigger);
    // A failed replacement keeps the writer and its file.
    let err = writer
        .replace(&options(1), &digest(3, &[1, 2]), 2, 0)
        .unwrap_err();
    assert!(matches!(err, Error::DigestCapacity { .. }), "{err}");
    writer.publish(&digest(3, &[7]), 1, 0).unwrap();
    assert_eq!(new.read().unwrap().blocks(), &[7]);
}

#[test]
fn a_second_live_writer_is_refused_and_a_dead_ones_file_replaced() {
    let state = tempfile::tempdir().unwrap();
    let writer =
        DigestWriter::create(state.path(), &id("e0"), &options(2), &digest(1, &[1]), 1, 0).unwrap();
    let err = DigestWriter::create(state.path(), &id("e0"), &options(2), &digest(1, &[1]), 1, 0)
        .unwrap_err();
    assert!(matches!(err, Error::AlreadyPublished { .. }), "{err}");
    // A dead writer's file: what a killed writer leaves (its lock released,
    // the file in place).
    let path = writer.path().to_owned();
    let left = std::fs::read(&path).unwrap();
    drop(writer);
    std::fs::write(&path, &left).unwrap();
    let stale = DigestFile::open(&path).unwrap();
    let writer =
        DigestWriter::create(state.path(), &id("e0"), &options(2), &digest(5, &[2]), 1, 0).unwrap();
    assert!(stale.is_retired(), "the dead writer's file was retired");
    assert_eq!(
        DigestFile::open(&path).unwrap().read().unwrap().version(),
        5
    );
    drop(writer);
}

#[test]
fn redis_values_round_trip() {
    let record = DigestRecord {
        writer_pid: 4242,
        generation: 9,
        created_unix_ns: 11,
        kv_block_size: 16,
        captured_unix_ns: 12,
        held: 5,
        digest: CacheDigest::with_capture(4, 1_004, vec![3, 1, 2], 5, 16),
    };
    let value = encode_digest_value(&record).unwrap();
    assert_eq!(value.len(), digest_size(3));
    assert_eq!(&value[64..72], &[0; 8], "seq is 0 in a value");
    assert_eq!(decode_digest_value(&value).unwrap(), record);
    // The record's `held` and `kv_block_size` are what is written, and the
    // decoded digest carries them (a digest handed on alone still says them).
    let plain = DigestRecord {
        digest: digest(4, &[3, 1, 2]),
        ..record.clone()
    };
    let decoded = decode_digest_value(&encode_digest_value(&plain).unwrap()).unwrap();
    assert_eq!(
        (decoded.digest.held(), decoded.digest.kv_block_size()),
        (5, 16)
    );
    let empty = DigestRecord {
        digest: CacheDigest::new(1, 0, vec![]),
        ..record.clone()
    };
    let value = encode_digest_value(&empty).unwrap();
    assert_eq!(value.len(), DIGEST_HEADER_SIZE);
    assert_eq!(decode_digest_value(&value).unwrap().held, 5);
}

#[test]
fn read_into_refills_the_callers_digest_and_empties_it_on_an_error() {
    let state = tempfile::tempdir().unwrap();
    let first = digest(1, &[10, 20, 30, 40]);
    let mut writer =
        DigestWriter::create(state.path(), &id("e0"), &options(8), &first, 9, 0).unwrap();
    let file = DigestFile::open(writer.path()).unwrap();
    let mut into = CacheDigest::default();
    file.read_into(&mut into).unwrap();
    assert_eq!(into, file.read().unwrap());
    assert_eq!(
        (into.version(), into.held(), into.kv_block_size()),
        (1, 9, 16)
    );
    let allocation = into.blocks().as_ptr();

    // A shorter digest: the same allocation, only the new entries.
    writer.publish(&digest(2, &[7, 5]), 2, 0).unwrap();
    file.read_into(&mut into).unwrap();
    assert_eq!(
        (into.version(), into.blocks(), into.held()),
        (2, &[5, 7][..], 2)
    );
    assert_eq!(
        into.blocks().as_ptr(),
        allocation,
        "the allocation is reused"
    );

    // Entries out of order (a stray write): an error, and `into` holds no
    // digest (version 0) rather than a half-checked one.
    let path = writer.path().to_owned();
    let poke = |offset: usize, value: u64| {
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.write_at(&value.to_le_bytes(), offset as u64).unwrap();
    };
    poke(DIGEST_ENTRIES_OFFSET, 99);
    let error = file.read_into(&mut into).unwrap_err();
    assert_eq!(error.kind(), "corrupt_cache", "{error}");
    assert!(error.to_string().contains("entries 0 and 1"), "{error}");
    assert_eq!((into.version(), into.len()), (0, 0));
    drop(writer);
}

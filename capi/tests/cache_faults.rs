//! `es_read_cache` says why an engine has no digest at every call, not
//! only with the read that found it: a digest that is not there (no file
//! yet, one of another run) is `ES_CODE_MISSING_CACHE`, a damaged one
//! `ES_CODE_CORRUPT_CACHE`, whatever read came before (`es_read_cache`
//! again, or `es_read`, whose per-engine errors say a missing digest once).
//!
//! Every `unsafe` call passes a live handle, C strings, or locals of the
//! sizes given with them: the SAFETY argument is made once here.
#![allow(clippy::undocumented_unsafe_blocks)]

mod common;

use std::ffi::{CStr, CString};
use std::path::Path;
use std::ptr::null_mut;

use engine_state::{
    es_close, es_code_name, es_last_error, es_read, es_read_cache, EsCacheDigest, EsCode, EsEngine,
    EsOptions, EsSource,
};
use engine_state_shm_format::{
    cache_dir, monotonic_ns, CacheDigest, DigestOptions, DigestWriter, EngineId, ShmWriter,
    Snapshot, WriterOptions,
};

fn open(dir: &Path) -> *mut EsSource {
    let size = std::mem::size_of::<EsOptions>();
    common::open_source(&format!("file://{}", dir.display()), true, size)
}

fn naming(version: u64) -> Snapshot {
    Snapshot {
        captured_mono_ns: monotonic_ns(),
        cache_blocks: 2,
        cache_version: version,
        ..Snapshot::default()
    }
}

/// `es_read_cache` of engine `id`: its code and message.
fn read_cache(source: *mut EsSource, id: &str) -> (EsCode, String) {
    let id = CString::new(id).unwrap();
    let mut digest = EsCacheDigest::default();
    let mut entries = [0u64; 8];
    let code = unsafe {
        es_read_cache(
            source,
            id.as_ptr(),
            null_mut(),
            &mut digest,
            entries.as_mut_ptr(),
            entries.len(),
        )
    };
    let mut message = vec![0u8; 4096];
    unsafe { es_last_error(message.as_mut_ptr().cast(), message.len()) };
    let message = CStr::from_bytes_until_nul(&message)
        .unwrap()
        .to_string_lossy()
        .into_owned();
    (code, message)
}

/// One `es_read` of every engine (its per-engine errors say a missing
/// digest once): the read a caller may make between two `es_read_cache`.
fn read_all(source: *mut EsSource) {
    let mut engines = vec![EsEngine::default(); 8];
    let mut count = 0;
    let code = unsafe { es_read(source, engines.as_mut_ptr(), engines.len(), &mut count) };
    assert_eq!(code, EsCode::Ok);
}

fn name(code: EsCode) -> String {
    unsafe { CStr::from_ptr(es_code_name(code as i32)) }
        .to_string_lossy()
        .into_owned()
}

/// Asserts that three `es_read_cache` calls, with `es_read` between them,
/// all return `expected` with a message containing `says`.
fn always(source: *mut EsSource, id: &str, expected: EsCode, says: &str) {
    for call in 0..3 {
        let (code, message) = read_cache(source, id);
        assert_eq!(
            name(code),
            name(expected),
            "call {call} for {id}: {message}"
        );
        assert!(message.contains(says), "call {call}: {message}");
        read_all(source);
    }
}

#[test]
fn a_missing_damaged_or_other_run_digest_has_its_code_at_every_call() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("engines");
    std::fs::create_dir(&dir).unwrap();
    let writer = |name: &str| {
        let id = EngineId::new(name).unwrap();
        let engine = ShmWriter::create(&dir, &id, &WriterOptions::default(), &naming(0)).unwrap();
        (id, engine)
    };
    let digest_options = |generation: u64| DigestOptions {
        capacity: 4,
        generation,
        ..DigestOptions::default()
    };
    let blocks = CacheDigest::new(1, monotonic_ns(), vec![1, 2]);

    // "missing": the snapshot names version 1, no digest file.
    let (_, mut missing) = writer("missing");
    missing.publish(&naming(1)).unwrap();
    // "other": a digest of another run of the engine (generation + 1).
    let (other_id, mut other) = writer("other");
    let _other_digest = DigestWriter::create(
        &dir,
        &other_id,
        &digest_options(other.generation() + 1),
        &blocks,
        2,
        0,
    )
    .unwrap();
    other.publish(&naming(1)).unwrap();
    // "damaged": a digest file whose header is garbage.
    let (_, mut damaged) = writer("damaged");
    std::fs::create_dir_all(cache_dir(&dir)).unwrap();
    std::fs::write(cache_dir(&dir).join("damaged"), [0x5a; 256]).unwrap();
    damaged.publish(&naming(1)).unwrap();
    // "good": its digest is read.
    let (good_id, mut good) = writer("good");
    let _good_digest = DigestWriter::create(
        &dir,
        &good_id,
        &digest_options(good.generation()),
        &blocks,
        2,
        0,
    )
    .unwrap();
    good.publish(&naming(1)).unwrap();

    let source = open(&dir);
    always(
        source,
        "missing",
        EsCode::MissingCache,
        "there is no digest file",
    );
    always(
        source,
        "other",
        EsCode::MissingCache,
        "belongs to generation",
    );
    always(source, "damaged", EsCode::CorruptCache, "cannot be used");
    always(source, "good", EsCode::Ok, "");

    // The missing digest arrives with the next version: read.
    let _late = DigestWriter::create(
        &dir,
        &EngineId::new("missing").unwrap(),
        &digest_options(missing.generation()),
        &CacheDigest::new(2, monotonic_ns(), vec![1, 2]),
        2,
        0,
    )
    .unwrap();
    missing.publish(&naming(2)).unwrap();
    assert_eq!(read_cache(source, "missing").0, EsCode::Ok);
    unsafe { es_close(source) };
}

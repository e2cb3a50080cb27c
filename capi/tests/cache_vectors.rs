//! The cache residency vectors (`format/vectors/cache/`, manifest
//! "cache_cases" and "block_hashes") through the C ABI's `extern "C"`
//! functions only, and one live digest read with `es_read_cache`.
//!
//! Every `unsafe` call passes null, a live handle, C strings, or locals of
//! the sizes given with them: the SAFETY argument is made once here.
#![allow(clippy::undocumented_unsafe_blocks)]

mod common;

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::ptr::null_mut;

use engine_state::{
    es_block_hashes, es_close, es_decode_cache_value, es_open, es_read_cache, es_read_cache_file,
    EsCacheDigest, EsCacheState, EsCode, EsEngine, EsOptions, EsSource, EsStatus,
    ES_OPTIONS_V1_SIZE,
};
use engine_state_shm_format::{
    monotonic_ns, CacheDigest, DigestOptions, DigestWriter, EngineId, ShmWriter, Snapshot,
    WriterOptions,
};
use serde_json::{json, Value};

fn vectors() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../format/vectors")
}

fn manifest() -> Value {
    serde_json::from_slice(&std::fs::read(vectors().join("manifest.json")).unwrap()).unwrap()
}

/// The vector class of a code (docs/FORMAT.md, "Writing and reading a digest").
fn class(code: EsCode) -> &'static str {
    match code {
        EsCode::NotDigest => "not_digest",
        EsCode::UnknownVersion => "unknown_version",
        EsCode::WrongSize => "wrong_size",
        EsCode::CorruptCache => "corrupt_cache",
        EsCode::Torn => "torn",
        other => panic!("{other:?} is no digest class"),
    }
}

/// A case read through the ABI: its code, and on success its JSON shape.
fn read_case(case: &Value) -> (EsCode, Value) {
    let path = vectors().join(case["file"].as_str().unwrap());
    let mut digest = EsCacheDigest::default();
    let mut entries = vec![0u64; 64];
    let code = if case["kind"] == "cache_file" {
        let path = CString::new(path.to_str().unwrap()).unwrap();
        // Count first (the size query), then read.
        let mut counted = EsCacheDigest::default();
        let first = unsafe { es_read_cache_file(path.as_ptr(), &mut counted, null_mut(), 0) };
        let code = unsafe {
            es_read_cache_file(
                path.as_ptr(),
                &mut digest,
                entries.as_mut_ptr(),
                entries.len(),
            )
        };
        if code == EsCode::Ok && counted.count > 0 {
            assert_eq!(first, EsCode::BufferTooSmall);
            assert_eq!(counted, digest);
        }
        code
    } else {
        let bytes = std::fs::read(&path).unwrap();
        unsafe {
            es_decode_cache_value(
                bytes.as_ptr(),
                bytes.len(),
                &mut digest,
                entries.as_mut_ptr(),
                entries.len(),
            )
        }
    };
    let blocks = &entries[..digest.count as usize];
    let state = match digest.state {
        EsCacheState::Active => "active",
        EsCacheState::Retired => "retired",
        EsCacheState::Unknown => "unknown",
    };
    let shape = json!({
        "blocks": blocks,
        "capacity": digest.capacity,
        "captured_mono_ns": digest.captured_mono_ns,
        "captured_unix_ns": digest.captured_unix_ns,
        "count": digest.count,
        "created_unix_ns": digest.created_unix_ns,
        "generation": digest.generation,
        "held": digest.held,
        "kv_block_size": digest.kv_block_size,
        "state": state,
        "version": digest.version,
        "writer_pid": digest.writer_pid,
    });
    (code, shape)
}

#[test]
fn every_cache_vector_decodes_to_its_expectation_or_fails_with_its_class() {
    let cases = manifest()["cache_cases"].as_array().unwrap().clone();
    assert!(cases.len() >= 30, "{} cases", cases.len());
    for case in &cases {
        let name = case["name"].as_str().unwrap();
        let (code, shape) = read_case(case);
        match case["error"].as_str() {
            Some(error) => assert_eq!(class(code), error, "{name}"),
            None => {
                assert_eq!(code, EsCode::Ok, "{name}");
                let expect = vectors().join(case["expect"].as_str().unwrap());
                let expect: Value =
                    serde_json::from_slice(&std::fs::read(expect).unwrap()).unwrap();
                assert_eq!(shape, expect, "{name}");
            }
        }
    }
}

#[test]
fn block_hashes_json_is_reproduced() {
    let file = manifest()["block_hashes"].as_str().unwrap().to_owned();
    let v: Value = serde_json::from_slice(&std::fs::read(vectors().join(file)).unwrap()).unwrap();
    for case in v["cases"].as_array().unwrap() {
        let tokens: Vec<u32> = case["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect();
        let expected: Vec<u64> = case["hashes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h.as_u64().unwrap())
            .collect();
        let mut out = vec![0u64; expected.len() + 1];
        let mut count = 0;
        let code = unsafe {
            es_block_hashes(
                tokens.as_ptr(),
                tokens.len(),
                out.as_mut_ptr(),
                out.len(),
                &mut count,
            )
        };
        assert_eq!(code, EsCode::Ok, "{}", case["name"]);
        assert_eq!(&out[..count], &expected[..], "{}", case["name"]);
    }
}

fn open(dir: &Path, digests: bool, struct_size: usize) -> *mut EsSource {
    common::open_source(&format!("file://{}", dir.display()), digests, struct_size)
}

#[test]
fn a_live_digest_is_read_with_es_read_cache_and_every_refusal_has_its_code() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("engines");
    std::fs::create_dir(&dir).unwrap();
    let blocks: Vec<u64> = vec![30, 10, 20];
    let id = EngineId::new("e0").unwrap();
    let mut engine =
        ShmWriter::create(&dir, &id, &WriterOptions::default(), &Snapshot::default()).unwrap();
    let options = DigestOptions {
        capacity: 8,
        generation: engine.generation(),
        kv_block_size: 16,
        ..DigestOptions::default()
    };
    let captured = monotonic_ns();
    let _digest = DigestWriter::create(
        &dir,
        &id,
        &options,
        &CacheDigest::new(4, captured, blocks.clone()),
        5,
        0,
    )
    .unwrap();
    engine
        .publish(&Snapshot {
            captured_mono_ns: monotonic_ns(),
            cache_blocks: 3,
            cache_version: 4,
            ..Snapshot::default()
        })
        .unwrap();
    let _plain = ShmWriter::create(
        &dir,
        &EngineId::new("e1").unwrap(),
        &WriterOptions::default(),
        &Snapshot {
            captured_mono_ns: monotonic_ns(),
            ..Snapshot::default()
        },
    )
    .unwrap();

    let e0 = CString::new("e0").unwrap();
    let source = open(&dir, true, std::mem::size_of::<EsOptions>());
    let mut digest = EsCacheDigest::default();
    let mut state = EsEngine::default();
    let mut entries = [0u64; 2];
    unsafe {
        // Too small: what fits, and the count.
        let code = es_read_cache(
            source,
            e0.as_ptr(),
            &mut state,
            &mut digest,
            entries.as_mut_ptr(),
            2,
        );
        assert_eq!(code, EsCode::BufferTooSmall);
        assert_eq!((digest.count, entries), (3, [10, 20]));
        let mut all = [0u64; 3];
        let code = es_read_cache(
            source,
            e0.as_ptr(),
            null_mut(),
            &mut digest,
            all.as_mut_ptr(),
            3,
        );
        assert_eq!(code, EsCode::Ok);
        assert_eq!(all, [10, 20, 30]);
        assert_eq!(
            (
                digest.version,
                digest.captured_mono_ns,
                digest.generation,
                digest.state
            ),
            (4, captured, engine.generation(), EsCacheState::Active)
        );
        // What the file's header says: 5 blocks held (cut to 3 entries),
        // KV blocks of 16 tokens.
        assert_eq!((digest.held, digest.kv_block_size), (5, 16));
        assert_eq!((state.engine_id(), state.status), ("e0", EsStatus::Fresh));
        assert_eq!(state.snapshot.cache_version, 4);

        let e1 = CString::new("e1").unwrap();
        let code = es_read_cache(source, e1.as_ptr(), null_mut(), &mut digest, null_mut(), 0);
        assert_eq!(code, EsCode::NoCache);
        let nope = CString::new("nope").unwrap();
        let code = es_read_cache(
            source,
            nope.as_ptr(),
            null_mut(),
            &mut digest,
            null_mut(),
            0,
        );
        assert_eq!(code, EsCode::NotFound);
        let code = es_read_cache(source, e0.as_ptr(), null_mut(), null_mut(), null_mut(), 0);
        assert_eq!(code, EsCode::NullArgument);
        let code = es_read_cache(source, e0.as_ptr(), null_mut(), &mut digest, null_mut(), 3);
        assert_eq!(code, EsCode::NullArgument);
        es_close(source);

        // A stale engine: the digest is written, the code says not to use it.
        let uri = CString::new(format!("file://{}", dir.display())).unwrap();
        let options = EsOptions {
            read_cache_digests: 1,
            stale_after_ns: 1, // every heartbeat is older than 1 ns
            ..EsOptions::default()
        };
        let mut stale = null_mut();
        assert_eq!(es_open(uri.as_ptr(), &options, &mut stale), EsCode::Ok);
        let mut all = [0u64; 3];
        digest = EsCacheDigest::default();
        let code = es_read_cache(
            stale,
            e0.as_ptr(),
            &mut state,
            &mut digest,
            all.as_mut_ptr(),
            3,
        );
        assert_eq!(code, EsCode::NotFresh);
        assert_eq!((digest.count, all), (3, [10, 20, 30]));
        assert_eq!(state.status, EsStatus::Stale);
        es_close(stale);

        // A version-1 caller (32 bytes, digests on past its end) reads none.
        let old = open(&dir, true, ES_OPTIONS_V1_SIZE);
        let code = es_read_cache(old, e0.as_ptr(), null_mut(), &mut digest, null_mut(), 0);
        assert_eq!(code, EsCode::Unsupported);
        es_close(old);
    }

    // A damaged digest: the engine's own error, with its class.
    let path = engine_state_shm_format::cache_dir(&dir).join("e0");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[12] = 64; // header_size
    std::fs::write(&path, &bytes).unwrap();
    engine
        .publish(&Snapshot {
            captured_mono_ns: monotonic_ns(),
            cache_blocks: 3,
            cache_version: 5,
            ..Snapshot::default()
        })
        .unwrap();
    let source = open(&dir, true, std::mem::size_of::<EsOptions>());
    unsafe {
        let code = es_read_cache(source, e0.as_ptr(), null_mut(), &mut digest, null_mut(), 0);
        assert_eq!(code, EsCode::CorruptCache);
        es_close(source);
    }
}

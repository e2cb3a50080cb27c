//! `es_read_cache` over Redis, real processes: a redis-server started on a
//! free port and `espublish --cache-blocks N --uri redis://...`; the C ABI
//! reads the digest the publisher wrote (`<prefix>cache:<id>`) with the
//! reader's rules, and an engine that publishes none is `ES_CODE_NO_CACHE`.
//!
//! Every `unsafe` call passes a live handle, C strings, or locals of the
//! sizes given with them: the SAFETY argument is made once here.
#![allow(clippy::undocumented_unsafe_blocks)]

mod common;

use std::ffi::CString;
use std::ptr::null_mut;

use engine_state::{
    es_close, es_read_cache, EsCacheDigest, EsCacheState, EsCode, EsEngine, EsOptions, EsSource,
    EsStatus,
};
use engine_state_shm_format::blocks::{block_hashes, BLOCK_TOKENS};
use engine_state_tests::{espublish, wait_for, RedisServer};

fn open(uri: &str) -> *mut EsSource {
    common::open_source(uri, true, std::mem::size_of::<EsOptions>())
}

#[test]
fn es_read_cache_reads_a_digest_espublish_wrote_to_redis() {
    const N: usize = 6;
    let server = RedisServer::start();
    let uri = server.uri("?prefix=capi-cache:");
    let _cached = espublish(&uri, "r0", &["--cache-blocks", &N.to_string()]);
    let _plain = espublish(&uri, "r1", &[]);
    let source = open(&uri);

    let tokens: Vec<u32> = (0..(N * BLOCK_TOKENS) as u32).collect();
    let mut expected = block_hashes(&tokens);
    expected.sort_unstable();

    let (r0, r1) = (CString::new("r0").unwrap(), CString::new("r1").unwrap());
    let mut digest = EsCacheDigest::default();
    let mut engine = EsEngine::default();
    let mut entries = [0u64; 16];
    // The digest is written by the publisher's sink thread just before the
    // record naming it: poll until a read has both.
    let mut code = EsCode::Other;
    wait_for(
        || {
            code = unsafe {
                es_read_cache(
                    source,
                    r0.as_ptr(),
                    &mut engine,
                    &mut digest,
                    entries.as_mut_ptr(),
                    entries.len(),
                )
            };
            code == EsCode::Ok
        },
        "es_read_cache of r0 to succeed",
    );
    assert_eq!(digest.count, N as u64);
    assert_eq!(&entries[..N], &expected[..]);
    assert_eq!(
        (digest.version, digest.held, digest.state),
        (1, N as u64, EsCacheState::Active)
    );
    assert_eq!(digest.generation, engine.generation);
    assert_eq!((engine.engine_id(), engine.status), ("r0", EsStatus::Fresh));
    assert_eq!(
        (engine.snapshot.cache_blocks, engine.snapshot.cache_version),
        (N as u64, 1)
    );
    // Read again: the same digest (held by the source, not fetched again).
    let again = unsafe {
        es_read_cache(
            source,
            r0.as_ptr(),
            null_mut(),
            &mut digest,
            entries.as_mut_ptr(),
            entries.len(),
        )
    };
    assert_eq!(again, EsCode::Ok);
    assert_eq!(&entries[..N], &expected[..]);

    // An engine that publishes no digest.
    wait_for(
        || {
            let code = unsafe {
                es_read_cache(source, r1.as_ptr(), null_mut(), &mut digest, null_mut(), 0)
            };
            assert_ne!(code, EsCode::Ok, "r1 publishes no digest");
            code == EsCode::NoCache
        },
        "r1 to be read (NoCache)",
    );
    unsafe { es_close(source) };
}

//! `es_read_cache`: one engine's cache digest from an open source, with the
//! reader's own rules (docs/FORMAT.md, "Writing and reading a digest": the
//! digest of the engine's generation, re-read only when its version moves)
//! and the one the caller must apply, freshness, as a code.

use std::ffi::c_char;

use engine_state_reader::{EngineError, EngineState, Source, Status};

use crate::c_string::text_arg;
use crate::code::EsCode;
use crate::digest::{check_out, write_digest, EsCacheDigest, EsCacheState};
use crate::engine::EsEngine;
use crate::ffi_call::{ffi_call, Failure};
use crate::source::{lock, Backend, EsSource, Inner};

/// One engine as a read saw it, and why it has no digest if the source
/// knows ([`Source::cache_fault`]: at every call, not only with the read
/// that found it).
struct Found {
    state: EngineState,
    cache_fault: Option<EngineError>,
}

/// Engine `id` read from the handle's source (on shared memory one engine
/// file and its digest; on Redis the fleet's records), with its digest's
/// fault.
fn read_one(inner: &mut Inner, id: &str) -> Result<Option<Found>, Failure> {
    let Inner {
        backend, scratch, ..
    } = inner;
    scratch.clear();
    let (state, source): (EngineState, &dyn Source) = match backend {
        Backend::Shm(dir) => match dir.read_engine(id)? {
            Some(state) => (state, &*dir),
            None => return Ok(None),
        },
        Backend::Other(source) => {
            source.read_into(scratch)?;
            match scratch.get(id) {
                Some(state) => (state.clone(), &**source),
                None => return Ok(None),
            }
        }
    };
    let cache_fault = source.cache_fault(&state);
    Ok(Some(Found { state, cache_fault }))
}

/// The cache digest of engine `engine_id` from `source`, which must have
/// been opened with `EsOptions.read_cache_digests = 1` (else
/// `ES_CODE_UNSUPPORTED`). Reads the engine (into `*engine`, unless it is
/// null) and its digest: `*digest` gets the digest's version, capture
/// stamp, count, `held`, `kv_block_size` and generation (the engine's), and
/// `entries` the first
/// `capacity` of its `digest->count` entries, the router block hashes
/// ascending (`entries = NULL, capacity = 0` learns the count:
/// `ES_CODE_BUFFER_TOO_SMALL` when it is not 0; `ES_MAX_DIGEST_ENTRIES`
/// always suffices). The reader reads a digest again only when the
/// engine's `cache_version` moves; a call reads the engine's state (on
/// shared memory one engine file; on Redis the fleet's records).
///
/// Results, in this order: `ES_CODE_NOT_FOUND` (no readable engine of that
/// id); `ES_CODE_NO_CACHE` (the engine publishes no digest: `cache_version`
/// 0); `ES_CODE_CORRUPT_CACHE` (its digest is damaged; the message says why
/// and what to do) or `ES_CODE_MISSING_CACHE` (the digest its snapshot
/// names is not there for it: not written yet, of another run, older),
/// at every call while the engine names that version; `ES_CODE_NOT_FRESH`
/// with no digest, or `ES_CODE_TORN` (a digest being written or replaced:
/// read again later);
/// then the digest is written, and `ES_CODE_BUFFER_TOO_SMALL` or
/// `ES_CODE_NOT_FRESH` (the engine is stale, dead or torn: the digest is
/// written but must not be used to route) or `ES_CODE_OK`. `*engine` is
/// written whenever the engine was found.
///
/// # Safety
/// `source` is a live handle; `engine_id` is NUL-terminated; `engine` is
/// null or writable; `digest` is null (an error) or writable; `entries` is
/// null or has `capacity` writable `uint64_t`s.
#[no_mangle]
pub unsafe extern "C" fn es_read_cache(
    source: *mut EsSource,
    engine_id: *const c_char,
    engine: *mut EsEngine,
    digest: *mut EsCacheDigest,
    entries: *mut u64,
    capacity: usize,
) -> EsCode {
    ffi_call(|| {
        if digest.is_null() {
            return Err(Failure::new(EsCode::NullArgument, "digest is null"));
        }
        check_out(entries, capacity, "entries")?;
        // SAFETY: NUL-terminated (the caller's contract).
        let id = unsafe { text_arg(engine_id, "engine_id") }?;
        // SAFETY: a live handle (the caller's contract).
        let mut inner = unsafe { lock(source) }?;
        if !inner.cache_digests {
            return Err(Failure::new(
                EsCode::Unsupported,
                "this source reads no cache digests: open it with EsOptions.read_cache_digests = 1 \
                 (es_options_init, then set the field)",
            ));
        }
        let found = read_one(&mut inner, id)?.ok_or_else(|| {
            Failure::new(
                EsCode::NotFound,
                format!("no readable engine {id:?}; es_read lists the engines and errors"),
            )
        })?;
        let state = &found.state;
        if !engine.is_null() {
            // SAFETY: writable (the caller's contract).
            unsafe { engine.write(EsEngine::from(state)) };
        }
        let version = state.snapshot.cache_version;
        let fresh = state.status == Status::Fresh;
        let not_fresh = || {
            Failure::new(
                EsCode::NotFresh,
                format!(
                    "engine {id:?} is {}, not fresh: its cache digest must not be used to \
                     route (docs/FORMAT.md, \"Writing and reading a digest\"); read it again \
                     once the engine is fresh",
                    state.status
                ),
            )
        };
        if version == 0 {
            return Err(Failure::new(
                EsCode::NoCache,
                format!(
                    "engine {id:?} publishes no cache digest (its cache_version is 0): its \
                     publisher does not report cache residency"
                ),
            ));
        }
        if let Some(fault) = &found.cache_fault {
            return Err(Failure::new(EsCode::of(&fault.error), fault.to_string()));
        }
        let Some(cache) = &state.cache else {
            if !fresh {
                return Err(not_fresh());
            }
            return Err(Failure::new(
                EsCode::Torn,
                format!(
                    "engine {id:?} names cache digest version {version}, but no consistent copy \
                     of it could be read (a write or a replacement in progress): read it again"
                ),
            ));
        };
        let c = EsCacheDigest {
            version: cache.version(),
            captured_mono_ns: cache.captured_mono_ns(),
            count: cache.len() as u64,
            held: cache.held(),
            kv_block_size: cache.kv_block_size(),
            generation: state.generation,
            state: EsCacheState::Active,
            ..EsCacheDigest::default()
        };
        // SAFETY: checked above; the caller's contract on both.
        unsafe { write_digest(c, cache.blocks(), digest, entries, capacity) }?;
        if !fresh {
            return Err(not_fresh());
        }
        Ok(())
    })
}

//! One Redis value judged without a connection: for programs that fetch
//! engine keys with their own Redis client (docs/FORMAT.md, "Reading a
//! record").

use std::ffi::c_char;

use crate::code::EsCode;
use crate::engine::EsEngine;
use crate::ffi_call::{ffi_call, Failure};
use crate::options::EsOptions;

/// Judges one engine's Redis value as the Redis source does: `key` is the
/// key it was fetched from (for messages; `<prefix>engine:<engine_id>`),
/// `value` its `value_len` bytes, `pttl_ms` the key's `PTTL` from the same
/// fetch (a `MULTI`/`EXEC` or pipeline of `GET` and `PTTL`). The engine goes
/// into `*out` (`read_mono_ns` 0). `pttl_ms` −2 (no such key: it expired on
/// the server's clock, possibly between the `GET` and the `PTTL`) is
/// `ES_CODE_OK` with a dead engine (`ES_STATUS_DEAD`) and an empty snapshot,
/// whatever `value` holds (a nil `GET` is `value_len` 0). A bad value is its
/// per-engine class (`ES_CODE_FOREIGN_VALUE`, `ES_CODE_UNKNOWN_VERSION`,
/// `ES_CODE_NO_EXPIRY`) with the message in `es_last_error`. An `engine_id`
/// that is not a valid engine id (1 to 63 bytes of `[A-Za-z0-9._-]`, not
/// starting with `.`) is `ES_CODE_BAD_ARGUMENT`. Builds without Redis support
/// return `ES_CODE_UNSUPPORTED`.
///
/// # Safety
/// `key` and `engine_id` are NUL-terminated; `value` has `value_len`
/// readable bytes (or is null with `value_len` 0); `options` is null or an
/// `EsOptions` of at least its `struct_size`; `out` is null (an error) or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn es_decode_record(
    key: *const c_char,
    engine_id: *const c_char,
    value: *const u8,
    value_len: usize,
    pttl_ms: i64,
    options: *const EsOptions,
    out: *mut EsEngine,
) -> EsCode {
    ffi_call(|| {
        if out.is_null() {
            return Err(Failure::new(EsCode::NullArgument, "out is null"));
        }
        if value.is_null() && value_len > 0 {
            return Err(Failure::new(EsCode::NullArgument, "value is null"));
        }
        // SAFETY: NUL-terminated (the caller's contract).
        let key = unsafe { crate::c_string::text_arg(key, "key") }?;
        // SAFETY: as above.
        let engine_id = unsafe { crate::c_string::text_arg(engine_id, "engine_id") }?;
        // The id goes into EsEngine's fixed field and names the engine to
        // the caller: only a valid engine id (the writer's rule) is one.
        engine_state_shm_format::EngineId::new(engine_id).map_err(|error| {
            Failure::new(
                EsCode::BadArgument,
                format!(
                    "engine_id: {error}; pass the id the key names (<prefix>engine:<engine_id>)"
                ),
            )
        })?;
        let value: &[u8] = if value_len == 0 {
            &[]
        } else {
            // SAFETY: value_len readable bytes, not null (checked; the contract).
            unsafe { std::slice::from_raw_parts(value, value_len) }
        };
        // SAFETY: the caller's contract, passed on.
        let options = unsafe { crate::options::reader_options(options) }?;
        let engine = decode(key, engine_id, value, pttl_ms, &options)?;
        // SAFETY: writable (checked non-null above).
        unsafe { out.write(engine) };
        Ok(())
    })
}

#[cfg(feature = "redis")]
fn decode(
    key: &str,
    engine_id: &str,
    value: &[u8],
    pttl_ms: i64,
    options: &engine_state_reader::ReaderOptions,
) -> Result<EsEngine, Failure> {
    use engine_state_reader::{state_at_fetch, Error};

    let state = state_at_fetch(engine_id.into(), key, value, pttl_ms, &options.freshness, 0)
        .map_err(Error::Redis)?;
    Ok(EsEngine::from(&state))
}

#[cfg(not(feature = "redis"))]
fn decode(
    _key: &str,
    _engine_id: &str,
    _value: &[u8],
    _pttl_ms: i64,
    _options: &engine_state_reader::ReaderOptions,
) -> Result<EsEngine, Failure> {
    Err(Failure::new(
        EsCode::Unsupported,
        "this libengine_state was built without Redis support: rebuild engine-state-capi with \
         its `redis` feature (on by default)",
    ))
}

#[cfg(test)]
mod tests {
    use std::ffi::CString;

    use super::*;
    #[cfg(feature = "redis")]
    use crate::engine::EsStatus;

    /// `es_decode_record` of `value` with `pttl_ms` under id `engine_id`.
    fn decode_with(engine_id: &str, value: &[u8], pttl_ms: i64) -> (EsCode, EsEngine) {
        let key = CString::new(format!("engine-state:engine:{engine_id}")).unwrap();
        let id = CString::new(engine_id).unwrap();
        let mut engine = EsEngine::default();
        // SAFETY: C strings, `value.len()` readable bytes, default options, a writable engine.
        let code = unsafe {
            es_decode_record(
                key.as_ptr(),
                id.as_ptr(),
                value.as_ptr(),
                value.len(),
                pttl_ms,
                std::ptr::null(),
                &mut engine,
            )
        };
        (code, engine)
    }

    #[cfg(feature = "redis")]
    #[test]
    fn a_key_gone_between_get_and_pttl_is_a_dead_engine_with_no_snapshot() {
        use engine_state_reader::redis::{RedisRecord, STATE_ACTIVE};
        use engine_state_shm_format::Snapshot;

        let record = RedisRecord {
            state: STATE_ACTIVE,
            ttl_ms: 2000,
            generation: 3,
            snapshot: Snapshot {
                num_running: 7,
                ..Snapshot::default()
            },
            ..RedisRecord::default()
        };
        for value in [Vec::new(), record.encode().to_vec()] {
            let (code, engine) = decode_with("e0", &value, -2);
            assert_eq!(code, EsCode::Ok, "{} bytes", value.len());
            assert_eq!(engine.status, EsStatus::Dead);
            assert_eq!(engine.engine_id(), "e0");
            assert_eq!((engine.snapshot.num_running, engine.generation), (0, 0));
        }
    }

    #[test]
    fn an_invalid_engine_id_is_a_bad_argument() {
        for id in ["", "a/b", ".hidden", &"x".repeat(64)] {
            let (code, _) = decode_with(id, &[], 1000);
            assert_eq!(code, EsCode::BadArgument, "{id:?}");
        }
    }
}

//! `EsSource`: an open source behind an opaque handle, and the calls that
//! read it. The handle owns one `Reading` that every read refills, so a read
//! of shared memory allocates nothing once the engines have been seen (see
//! `es_read` for the exceptions).

use std::ffi::c_char;
use std::sync::{Mutex, MutexGuard};

use engine_state_reader::{open, EngineState, Reading, ShmDir, Source, StateUri};

use crate::c_string::text_arg;
use crate::code::EsCode;
use crate::engine::EsEngine;
use crate::ffi_call::{ffi_call, Failure};
use crate::handle::{
    close_handle, describe_error, lock_handle, open_handle, state_uri, write_error_count, ErrorOut,
};
use crate::options::{reader_options, EsOptions};

/// An open source of engine state (opaque). Made by `es_open`, freed by
/// `es_close`. A call on a handle that another thread is inside a call on
/// returns `ES_CODE_BUSY`: use one handle per thread.
#[derive(Debug)]
pub struct EsSource {
    /// One call at a time (`handle.rs`, `lock_handle`).
    inner: Mutex<Inner>,
}

pub(crate) struct Inner {
    pub(crate) backend: Backend,
    /// The per-engine errors of the last `es_read` (for `es_engine_error`),
    /// and the engines of a source that is not shared memory.
    pub(crate) reading: Reading,
    /// `es_read_engine` on a source without a one-engine read: a whole read
    /// that leaves `reading` (and its errors) alone; `es_read_cache` too.
    pub(crate) scratch: Reading,
    /// Opened with `EsOptions.read_cache_digests` (`es_read_cache` needs it).
    pub(crate) cache_digests: bool,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("engines", &self.reading.engines.len())
            .field("errors", &self.reading.errors.len())
            .finish_non_exhaustive()
    }
}

/// Shared memory is kept as itself for `es_read_at` and `es_read_engine`.
pub(crate) enum Backend {
    Shm(ShmDir),
    Other(Box<dyn Source>),
}

/// The handle's state, or `Busy` while another thread is inside a call.
///
/// # Safety
/// `source` is null or a handle from `es_open` not yet closed.
pub(crate) unsafe fn lock<'a>(source: *mut EsSource) -> Result<MutexGuard<'a, Inner>, Failure> {
    // SAFETY: the caller's contract, passed on.
    unsafe { lock_handle(source, "source", |s| &s.inner) }
}

/// Opens the source `uri` names (`file:///dir`, a bare absolute path, or
/// `redis://[user:password@]host:port/db[?prefix=P]`, `rediss://…`; null:
/// `$AGENTIC_ENGINE_STATE_URI`, else `file:///dev/shm/agentic_engine_state`)
/// with `options` (null: the defaults), and stores the new handle in `*out`
/// (null on failure). The caller owns the handle and frees it with `es_close`.
///
/// # Safety
/// `uri` is null or NUL-terminated; `options` is null or an `EsOptions` of
/// at least its `struct_size` bytes; `out` is null (an error) or writable.
#[no_mangle]
pub unsafe extern "C" fn es_open(
    uri: *const c_char,
    options: *const EsOptions,
    out: *mut *mut EsSource,
) -> EsCode {
    ffi_call(|| {
        let make = || {
            // SAFETY: null or NUL-terminated (the caller's contract).
            let uri = unsafe { state_uri(uri) }?;
            // SAFETY: the caller's contract, passed on.
            let options = unsafe { reader_options(options) }?;
            let cache_digests = options.cache_digests;
            let backend = match &uri {
                StateUri::Shm { dir } => Backend::Shm(ShmDir::open(dir, options)?),
                #[allow(unreachable_patterns)] // without the redis feature
                _ => Backend::Other(open(&uri, options)?),
            };
            Ok(EsSource {
                inner: Mutex::new(Inner {
                    backend,
                    reading: Reading::default(),
                    scratch: Reading::default(),
                    cache_digests,
                }),
            })
        };
        // SAFETY: `out` is null or writable (the caller's contract).
        unsafe { open_handle(out, make) }
    })
}

/// Closes a handle and frees everything it holds. Null is ignored.
///
/// # Safety
/// `source` is null or a handle from `es_open` that no thread is using and
/// that is closed only once; it must not be used afterwards.
#[no_mangle]
pub unsafe extern "C" fn es_close(source: *mut EsSource) {
    let _ = ffi_call(|| {
        // SAFETY: null or a live handle closed once (the caller's contract).
        unsafe { close_handle(source) };
        Ok(())
    });
}

/// Reads the source into the caller's array (`now_mono_ns`: `es_read_at`)
/// and sets `*count`; the per-engine errors stay in the handle's `reading`.
///
/// # Safety
/// `engines` is null (then `capacity` is 0) or has `capacity` writable,
/// aligned `EsEngine`s; `count` is writable.
#[inline]
unsafe fn read_into_array(
    inner: &mut Inner,
    now_mono_ns: Option<u64>,
    engines: *mut EsEngine,
    capacity: usize,
    count: *mut usize,
) -> Result<(), Failure> {
    // SAFETY: writable (checked non-null by the callers; the contract).
    unsafe { count.write(0) };
    let Inner {
        backend, reading, ..
    } = inner;
    reading.clear();
    let write = |i: usize, state: &EngineState| {
        if i < capacity {
            // SAFETY: i < capacity, and `engines` has `capacity` writable,
            // aligned slots (the contract); `EsEngine::write` never reads
            // the caller's possibly uninitialized memory.
            unsafe { EsEngine::write(engines.add(i), state) }
        }
    };
    let n = match backend {
        // Shared memory: each engine goes straight into the caller's array
        // as it is read (no list of states written and read back: that
        // copy alone made a 1,024-engine scan 1.3× the Rust one).
        Backend::Shm(dir) => {
            let mut n = 0;
            let each = |state: EngineState| {
                write(n, &state);
                n += 1;
            };
            dir.read_each(now_mono_ns, &mut reading.errors, each)?;
            n
        }
        Backend::Other(source) => {
            if now_mono_ns.is_some() {
                return Err(Failure::new(
                    EsCode::Unsupported,
                    format!(
                        "es_read_at reads shared memory only, and {} is not: use es_read",
                        source.uri()
                    ),
                ));
            }
            source.read_into(reading)?;
            for (i, state) in reading.engines.iter().take(capacity).enumerate() {
                write(i, state);
            }
            reading.engines.len()
        }
    };
    // SAFETY: writable (as above).
    unsafe { count.write(n) };
    if n > capacity {
        return Err(Failure::new(
            EsCode::BufferTooSmall,
            format!(
                "{n} engines, but the array holds {capacity} (the first {capacity} by id were \
                 written); pass an array of at least the count written back"
            ),
        ));
    }
    Ok(())
}

/// The checks shared by the reads: a count, and an array unless `capacity` is 0.
fn check_array(engines: *mut EsEngine, capacity: usize, count: *mut usize) -> Result<(), Failure> {
    if count.is_null() {
        return Err(Failure::new(EsCode::NullArgument, "count is null"));
    }
    if engines.is_null() && capacity > 0 {
        return Err(Failure::new(
            EsCode::NullArgument,
            format!(
                "engines is null but capacity is {capacity}: pass an array, or capacity 0 to count"
            ),
        ));
    }
    Ok(())
}

/// Reads every engine, sorted by id, into `engines` (`capacity` of them) and
/// sets `*count` to how many there are. More engines than fit: the first
/// `capacity` are written, `*count` is the number needed, and the result is
/// `ES_CODE_BUFFER_TOO_SMALL` (`engines = NULL, capacity = 0` just counts).
/// Engines that could not be read (bad files, foreign keys) are not in the
/// array: `es_error_count` and `es_engine_error` describe them. An error of
/// the whole source (the directory is gone, Redis unreachable) is the
/// result. A read of shared memory allocates nothing once the engines have
/// been seen, except when the directory holds entries that cannot be read
/// (their errors are copied on every read) and when a directory listing is
/// due (every `rescan_interval_ns`); a read of Redis allocates on every read.
///
/// # Safety
/// `source` is a live handle; `engines` is null or has `capacity` writable
/// `EsEngine`s; `count` is null (an error) or writable.
#[no_mangle]
pub unsafe extern "C" fn es_read(
    source: *mut EsSource,
    engines: *mut EsEngine,
    capacity: usize,
    count: *mut usize,
) -> EsCode {
    ffi_call(|| {
        check_array(engines, capacity, count)?;
        // SAFETY: a live handle (the caller's contract).
        let mut inner = unsafe { lock(source) }?;
        // SAFETY: the caller's contract, checked for null above.
        unsafe { read_into_array(&mut inner, None, engines, capacity, count) }
    })
}

/// `es_read` with both ages measured from `now_mono_ns` (`CLOCK_MONOTONIC`)
/// instead of the clock: replays, tests, and relays that recover each
/// writer's stamps (`heartbeat_mono_ns = now_mono_ns - heartbeat_age_ns`).
/// Only the ages use `now_mono_ns`: whether a directory listing is due
/// (`rescan_interval_ns`) is decided by the real clock, so a time in the
/// past neither stops nor forces listings. Shared-memory sources only
/// (`ES_CODE_UNSUPPORTED` otherwise).
///
/// # Safety
/// As `es_read`.
#[no_mangle]
pub unsafe extern "C" fn es_read_at(
    source: *mut EsSource,
    now_mono_ns: u64,
    engines: *mut EsEngine,
    capacity: usize,
    count: *mut usize,
) -> EsCode {
    ffi_call(|| {
        check_array(engines, capacity, count)?;
        // SAFETY: a live handle (the caller's contract).
        let mut inner = unsafe { lock(source) }?;
        // SAFETY: the caller's contract, checked for null above.
        unsafe { read_into_array(&mut inner, Some(now_mono_ns), engines, capacity, count) }
    })
}

/// Reads one engine by id into `*out` (`ES_CODE_NOT_FOUND` when there is no
/// readable engine of that id). On shared memory this reads that engine's
/// file alone, and a due directory listing that fails is that failure
/// (`ES_CODE_DIRECTORY` when the directory vanished). It leaves the
/// per-engine errors of the last `es_read` alone.
///
/// # Safety
/// `source` is a live handle; `engine_id` is NUL-terminated; `out` is null
/// (an error) or writable.
#[no_mangle]
pub unsafe extern "C" fn es_read_engine(
    source: *mut EsSource,
    engine_id: *const c_char,
    out: *mut EsEngine,
) -> EsCode {
    ffi_call(|| {
        if out.is_null() {
            return Err(Failure::new(EsCode::NullArgument, "out is null"));
        }
        // SAFETY: NUL-terminated (the caller's contract).
        let engine_id = unsafe { text_arg(engine_id, "engine_id") }?;
        // SAFETY: a live handle (the caller's contract).
        let mut inner = unsafe { lock(source) }?;
        let Inner {
            backend, scratch, ..
        } = &mut *inner;
        let engine = match backend {
            Backend::Shm(dir) => dir.read_engine(engine_id)?.as_ref().map(EsEngine::from),
            Backend::Other(source) => {
                source.read_into(scratch)?;
                scratch.get(engine_id).map(EsEngine::from)
            }
        };
        let engine = engine.ok_or_else(|| {
            Failure::new(
                EsCode::NotFound,
                format!("no readable engine {engine_id:?}; es_read lists the engines and errors"),
            )
        })?;
        // SAFETY: writable (checked non-null above; the contract).
        unsafe { out.write(engine) };
        Ok(())
    })
}

/// Sets `*count` to the number of per-engine errors of the last `es_read`
/// or `es_read_at` (files or keys that could not be read).
///
/// # Safety
/// `source` is a live handle; `count` is null (an error) or writable.
#[no_mangle]
pub unsafe extern "C" fn es_error_count(source: *mut EsSource, count: *mut usize) -> EsCode {
    ffi_call(|| {
        // SAFETY: writable or null (the caller's contract); a live handle.
        unsafe { write_error_count(count, || Ok(lock(source)?.reading.errors.len())) }
    })
}

/// Describes per-engine error `index` (from 0 to `es_error_count - 1`) of the
/// last read: its class in `*class_out` (one of the per-engine codes, e.g.
/// `ES_CODE_NOT_ENGINE_STATE`), the engine id, file name or key in `name`
/// and the message (what is wrong and what to do) in `message`, each
/// NUL-terminated. A buffer may be null with size 0 to skip it; one too
/// small gets what fits and the result is `ES_CODE_BUFFER_TOO_SMALL`.
/// `class_out` may be null.
///
/// # Safety
/// `source` is a live handle; `class_out` is null or writable; `name` and
/// `message` are null or have `name_size` / `message_size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn es_engine_error(
    source: *mut EsSource,
    index: usize,
    class_out: *mut EsCode,
    name: *mut c_char,
    name_size: usize,
    message: *mut c_char,
    message_size: usize,
) -> EsCode {
    ffi_call(|| {
        // SAFETY: a live handle (the caller's contract).
        let inner = unsafe { lock(source) }?;
        let out = ErrorOut {
            class_out,
            name,
            name_size,
            message,
            message_size,
        };
        // SAFETY: the caller's contract on the out-pointers.
        unsafe {
            describe_error(
                &inner.reading.errors,
                index,
                "per-engine",
                "es_error_count",
                out,
            )
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_while_the_handle_is_in_use_is_busy() {
        let dir = tempfile::tempdir().unwrap();
        let uri = std::ffi::CString::new(format!("file://{}", dir.path().display())).unwrap();
        let mut source = std::ptr::null_mut();
        // SAFETY: a C string, default options, a writable out-pointer.
        let code = unsafe { es_open(uri.as_ptr(), std::ptr::null(), &mut source) };
        assert_eq!(code, EsCode::Ok);
        let mut count = 0;
        {
            // Another call in progress on this handle.
            // SAFETY: the live handle from es_open.
            let _held = unsafe { &*source }.inner.lock().unwrap();
            // SAFETY: the live handle, counting only.
            let busy = unsafe { es_read(source, std::ptr::null_mut(), 0, &mut count) };
            assert_eq!(busy, EsCode::Busy);
        }
        // SAFETY: as above, the lock released.
        let code = unsafe { es_read(source, std::ptr::null_mut(), 0, &mut count) };
        assert_eq!((code, count), (EsCode::Ok, 0));
        // SAFETY: closed once.
        unsafe { es_close(source) };
    }
}

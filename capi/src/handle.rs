//! What every opaque handle that reads (`EsSource`, `EsReplicas`) shares:
//! one call at a time (`ES_CODE_BUSY` otherwise), and the per-item errors
//! of its last read, counted and described the same way.

use std::ffi::c_char;
use std::sync::{Mutex, MutexGuard, TryLockError};

use engine_state_reader::{EngineError, StateUri};

use crate::c_string::{copy_arg, text_arg};
use crate::code::EsCode;
use crate::ffi_call::Failure;

/// Opens a handle: `*out` is null until `make` succeeds, then owns the new
/// handle (the caller frees it with `close_handle`, through its `es_close…`).
///
/// # Safety
/// `out` is null (an error) or writable.
pub(crate) unsafe fn open_handle<H>(
    out: *mut *mut H,
    make: impl FnOnce() -> Result<H, Failure>,
) -> Result<(), Failure> {
    if out.is_null() {
        return Err(Failure::new(EsCode::NullArgument, "out is null"));
    }
    // SAFETY: writable (the caller's contract); null until success.
    unsafe { out.write(std::ptr::null_mut()) };
    let handle = Box::new(make()?);
    // SAFETY: writable (checked above); ownership passes to the caller.
    unsafe { out.write(Box::into_raw(handle)) };
    Ok(())
}

/// Frees a handle made by `open_handle`. Null is ignored.
///
/// # Safety
/// `handle` is null or from `open_handle`, used by no thread, closed once.
pub(crate) unsafe fn close_handle<H>(handle: *mut H) {
    if !handle.is_null() {
        // SAFETY: made by Box::into_raw in open_handle, closed once.
        drop(unsafe { Box::from_raw(handle) });
    }
}

/// The place `uri` names (null: `StateUri::from_env`'s).
///
/// # Safety
/// `uri` is null or NUL-terminated.
pub(crate) unsafe fn state_uri(uri: *const c_char) -> Result<StateUri, Failure> {
    Ok(if uri.is_null() {
        StateUri::from_env()?
    } else {
        // SAFETY: NUL-terminated (the caller's contract).
        StateUri::parse(unsafe { text_arg(uri, "uri") }?)?
    })
}

/// The state behind `handle` (`inner` finds its Mutex), or `Busy` while
/// another thread is inside a call on it; `what` names the handle in the
/// messages ("source", "replicas").
///
/// Never contended in correct use: `try_lock` turns a second thread's call
/// into `Busy` instead of a data race (one uncontended atomic swap per
/// call).
///
/// # Safety
/// `handle` is null or a live handle not yet closed.
pub(crate) unsafe fn lock_handle<'a, H, T>(
    handle: *mut H,
    what: &str,
    inner: fn(&'a H) -> &'a Mutex<T>,
) -> Result<MutexGuard<'a, T>, Failure> {
    if handle.is_null() {
        return Err(Failure::new(
            EsCode::NullArgument,
            format!("{what} is null"),
        ));
    }
    // SAFETY: a live handle (the caller's contract); only shared references
    // are made to it, the Mutex serializes the rest.
    let handle = unsafe { &*handle };
    match inner(handle).try_lock() {
        Ok(inner) => Ok(inner),
        // A panic inside an earlier call: every call rebuilds what it reads
        // (readings are cleared, directory listings redone), so go on.
        Err(TryLockError::Poisoned(poisoned)) => Ok(poisoned.into_inner()),
        Err(TryLockError::WouldBlock) => Err(Failure::new(
            EsCode::Busy,
            format!(
                "another thread is inside a call on this {what} handle; use one handle per thread"
            ),
        )),
    }
}

/// Writes the number of errors `errors` finds (after it locked the handle)
/// to `*count`.
///
/// # Safety
/// `count` is null (an error) or writable.
pub(crate) unsafe fn write_error_count(
    count: *mut usize,
    errors: impl FnOnce() -> Result<usize, Failure>,
) -> Result<(), Failure> {
    if count.is_null() {
        return Err(Failure::new(EsCode::NullArgument, "count is null"));
    }
    let n = errors()?;
    // SAFETY: writable (checked non-null above).
    unsafe { count.write(n) };
    Ok(())
}

/// Where `describe_error` writes: the caller's out-pointers.
pub(crate) struct ErrorOut {
    pub(crate) class_out: *mut EsCode,
    pub(crate) name: *mut c_char,
    pub(crate) name_size: usize,
    pub(crate) message: *mut c_char,
    pub(crate) message_size: usize,
}

/// Describes `errors[index]` into `out`: its class (when `class_out` is not
/// null), its name and its message (each NUL-terminated, what fits;
/// `BufferTooSmall` when one did not). `kind` ("per-engine") and `counter`
/// (the call that counts them) name a missing index in the message.
///
/// # Safety
/// `out.class_out` is null or writable; `out.name` and `out.message` are
/// null or have `name_size` / `message_size` writable bytes.
pub(crate) unsafe fn describe_error(
    errors: &[EngineError],
    index: usize,
    kind: &str,
    counter: &str,
    out: ErrorOut,
) -> Result<(), Failure> {
    let error = errors.get(index).ok_or_else(|| {
        Failure::new(
            EsCode::NotFound,
            format!(
                "no {kind} error {index}: the last read has {} ({counter})",
                errors.len()
            ),
        )
    })?;
    if !out.class_out.is_null() {
        // SAFETY: writable (the caller's contract).
        unsafe { out.class_out.write(EsCode::of(&error.error)) };
    }
    // SAFETY: the caller's contract on both buffers.
    let copied_name = unsafe { copy_arg(&error.name, out.name, out.name_size, "name") };
    // SAFETY: as above.
    let copied_message = unsafe {
        copy_arg(
            &error.error.to_string(),
            out.message,
            out.message_size,
            "message",
        )
    };
    copied_name.and(copied_message)
}

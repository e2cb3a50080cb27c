//! What every opaque handle that reads (`EsSource`, `EsReplicas`) shares:
//! one call at a time (`ES_CODE_BUSY` otherwise), and the per-item errors
//! of its last read, counted and described the same way.

use std::ffi::c_char;
use std::sync::{Mutex, MutexGuard, TryLockError};

use engine_state_reader::EngineError;

use crate::c_string::copy_arg;
use crate::code::EsCode;
use crate::ffi_call::Failure;

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

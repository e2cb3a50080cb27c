//! The boundary of every exported function: panics are caught (they never
//! unwind into C), failures become an [`EsCode`] and the calling thread's
//! last error message ([`es_last_error`]).

use std::cell::RefCell;
use std::ffi::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::c_string::copy_out;
use crate::code::EsCode;

/// A failed call: its code and message.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: EsCode,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(code: EsCode, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }
}

impl From<engine_state_reader::BadUri> for Failure {
    fn from(error: engine_state_reader::BadUri) -> Self {
        engine_state_reader::Error::from(error).into()
    }
}

impl From<engine_state_reader::Error> for Failure {
    fn from(error: engine_state_reader::Error) -> Failure {
        Failure::new(EsCode::of(&error), error.to_string())
    }
}

thread_local! {
    /// The message of this thread's last failed call (errno-like: a
    /// successful call leaves it alone).
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

fn set_last_error(message: &str) {
    // try_with: a call made from a thread-local destructor, after LAST_ERROR
    // was destroyed, keeps its code and loses only the message (`with`
    // would panic inside extern "C", which aborts).
    let _ = LAST_ERROR.try_with(|last| {
        let mut last = last.borrow_mut();
        last.clear();
        last.push_str(message);
    });
}

/// Runs one exported function's body: `Ok` is [`EsCode::Ok`]; a failure or
/// a panic sets the thread's last error and returns its code.
pub(crate) fn ffi_call(body: impl FnOnce() -> Result<(), Failure>) -> EsCode {
    // AssertUnwindSafe: after a panic every handle is still sound to use
    // (a read rebuilds what it fills, and the lock recovers from poison:
    // source.rs), so observing state a panic left half-updated is harmless.
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => EsCode::Ok,
        Ok(Err(failure)) => {
            set_last_error(&failure.message);
            failure.code
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_owned());
            set_last_error(&format!(
                "engine-state panicked: {what}; this is a bug, please report it with this message"
            ));
            EsCode::Panic
        }
    }
}

/// Copies the message of the calling thread's last failed call into `buf`
/// (`size` bytes, always NUL-terminated when `size > 0`, truncated to fit)
/// and returns the message's full length in bytes without the NUL (0 when
/// no call on this thread has failed). Pass `buf = NULL, size = 0` to learn
/// the length. The message is per thread: read it on the thread whose call
/// failed, before that thread's next failing call replaces it.
///
/// # Safety
/// `buf` is null or points to `size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn es_last_error(buf: *mut c_char, size: usize) -> usize {
    catch_unwind(AssertUnwindSafe(|| {
        // try_with: from a thread-local destructor after LAST_ERROR was
        // destroyed there is no message (0, and `buf` gets "").
        LAST_ERROR
            .try_with(|last| {
                let last = last.borrow();
                // SAFETY: buf is null or has `size` writable bytes (this function's contract).
                unsafe { copy_out(&last, buf, size) };
                last.len()
            })
            .unwrap_or_else(|_| {
                // SAFETY: as above.
                unsafe { copy_out("", buf, size) };
                0
            })
    }))
    .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_a_code_and_a_message_not_an_unwind() {
        let code = ffi_call(|| panic!("boom {}", 42));
        assert_eq!(code, EsCode::Panic);
        let mut buf = [0 as c_char; 128];
        // SAFETY: a 128-byte buffer.
        let n = unsafe { es_last_error(buf.as_mut_ptr(), buf.len()) };
        // SAFETY: es_last_error NUL-terminated it.
        let text = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
            .to_str()
            .unwrap();
        assert_eq!(n, text.len());
        assert!(text.contains("boom 42"), "{text}");
    }

    #[test]
    fn the_last_error_is_per_thread_and_kept_by_successes() {
        assert_eq!(
            ffi_call(|| Err(Failure::new(EsCode::BadUri, "here"))),
            EsCode::BadUri
        );
        assert_eq!(ffi_call(|| Ok(())), EsCode::Ok);
        // SAFETY: null with size 0 asks for the length only.
        assert_eq!(unsafe { es_last_error(std::ptr::null_mut(), 0) }, 4);
        let other = std::thread::spawn(|| {
            // SAFETY: as above.
            unsafe { es_last_error(std::ptr::null_mut(), 0) }
        });
        assert_eq!(other.join().unwrap(), 0);
    }

    #[test]
    fn a_call_from_a_thread_local_destructor_is_a_code_not_an_abort() {
        struct CallsOnDrop(std::sync::mpsc::Sender<(bool, EsCode, usize)>);
        impl Drop for CallsOnDrop {
            fn drop(&mut self) {
                let gone = LAST_ERROR.try_with(|_| ()).is_err();
                let code = ffi_call(|| Err(Failure::new(EsCode::BadUri, "late")));
                let mut buf = [1 as c_char; 8];
                // SAFETY: an 8-byte buffer.
                let n = unsafe { es_last_error(buf.as_mut_ptr(), buf.len()) };
                assert_eq!(buf[0], 0, "NUL-terminated even without a message");
                let _ = self.0.send((gone, code, n));
            }
        }
        thread_local! {
            static GUARD: RefCell<Option<CallsOnDrop>> = const { RefCell::new(None) };
        }
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // The guard is registered first, LAST_ERROR second: thread-local
            // destructors run in reverse order, so LAST_ERROR is gone when
            // the guard calls in.
            GUARD.with(|g| *g.borrow_mut() = Some(CallsOnDrop(tx)));
            assert_eq!(
                ffi_call(|| Err(Failure::new(EsCode::BadUri, "x"))),
                EsCode::BadUri
            );
        })
        .join()
        .unwrap();
        let (gone, code, n) = rx.recv().unwrap();
        assert!(
            gone,
            "LAST_ERROR was still alive: the test did not reach its case"
        );
        assert_eq!((code, n), (EsCode::BadUri, 0));
    }
}

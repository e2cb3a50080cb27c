//! Strings across the boundary: C strings in, NUL-terminated copies out
//! into caller buffers.

use std::ffi::{c_char, CStr};

use crate::code::EsCode;
use crate::ffi_call::Failure;

/// The UTF-8 text of a C string argument.
///
/// # Safety
/// `text` is null or points to a NUL-terminated string that lives for `'a`.
pub(crate) unsafe fn text_arg<'a>(text: *const c_char, what: &str) -> Result<&'a str, Failure> {
    if text.is_null() {
        return Err(Failure::new(
            EsCode::NullArgument,
            format!("{what} is null"),
        ));
    }
    // SAFETY: not null (checked), NUL-terminated and alive for 'a (the caller's contract).
    let text = unsafe { CStr::from_ptr(text) };
    text.to_str().map_err(|_| {
        Failure::new(
            EsCode::BadArgument,
            format!("{what} is not UTF-8: pass it as UTF-8 text"),
        )
    })
}

/// Copies `text` and a NUL into `buf` (`size` bytes), truncating to fit.
/// Returns whether all of it fitted. A null `buf` with `size` 0 copies nothing.
///
/// # Safety
/// `buf` is null or points to `size` writable bytes.
pub(crate) unsafe fn copy_out(text: &str, buf: *mut c_char, size: usize) -> bool {
    if buf.is_null() || size == 0 {
        return text.is_empty() && size == 0;
    }
    let n = text.len().min(size - 1);
    // SAFETY: buf has `size` writable bytes (the caller's contract) and
    // n + 1 <= size; `text` is a Rust string, which cannot overlap a buffer
    // the caller lent us.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
        buf.add(n).write(0);
    }
    n == text.len()
}

/// [`copy_out`] for a named argument: null with a nonzero size is an error,
/// a too-small buffer is an error (after copying what fits).
///
/// # Safety
/// As [`copy_out`].
pub(crate) unsafe fn copy_arg(
    text: &str,
    buf: *mut c_char,
    size: usize,
    what: &str,
) -> Result<(), Failure> {
    if buf.is_null() {
        if size == 0 {
            return Ok(()); // not wanted
        }
        return Err(Failure::new(
            EsCode::NullArgument,
            format!("{what} is null but its size is {size}: pass a buffer, or size 0 to skip it"),
        ));
    }
    // SAFETY: the caller's contract, passed on.
    if unsafe { copy_out(text, buf, size) } {
        Ok(())
    } else {
        Err(Failure::new(
            EsCode::BufferTooSmall,
            format!(
                "{what} needs {} bytes (with its NUL), the buffer has {size}; what fits was copied",
                text.len() + 1
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_truncate_and_always_terminate() {
        let mut buf = [0x55 as c_char; 4];
        // SAFETY: a 4-byte buffer.
        assert!(unsafe { copy_out("abc", buf.as_mut_ptr(), 4) });
        assert_eq!(buf.map(|b| b as u8), *b"abc\0");
        // SAFETY: as above.
        assert!(!unsafe { copy_out("abcdef", buf.as_mut_ptr(), 4) });
        assert_eq!(buf.map(|b| b as u8), *b"abc\0");
        // SAFETY: size 1: only the NUL.
        assert!(!unsafe { copy_out("x", buf.as_mut_ptr(), 1) });
        assert_eq!(buf[0], 0);
        // SAFETY: null with size 0 writes nothing.
        let skipped = unsafe { copy_arg("x", std::ptr::null_mut(), 0, "name") };
        assert!(skipped.is_ok());
        // SAFETY: null with a size is refused before any write.
        let refused = unsafe { copy_arg("x", std::ptr::null_mut(), 8, "name") };
        assert_eq!(refused.unwrap_err().code, EsCode::NullArgument);
        // SAFETY: a 4-byte buffer.
        let short = unsafe { copy_arg("abcdef", buf.as_mut_ptr(), 4, "name") };
        assert_eq!(short.unwrap_err().code, EsCode::BufferTooSmall);
    }
}

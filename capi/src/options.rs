//! `EsOptions`: the reader's settings, versioned by the caller's
//! `struct_size` so later versions can append fields without breaking
//! programs built against this header.

use std::mem::{offset_of, size_of};
use std::time::Duration;

use engine_state_reader::{Freshness, ReaderOptions};

use crate::code::EsCode;
use crate::engine::nanos;
use crate::ffi_call::{ffi_call, Failure};

/// How a source reads and judges engines. Fill it with `es_options_init`
/// (which sets `struct_size` and the defaults), then change what you need.
/// Fields a newer library adds go at the end; it reads only the first
/// `struct_size` bytes a program passes and defaults the rest.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EsOptions {
    /// `sizeof(EsOptions)` as the caller compiled it.
    pub struct_size: usize,
    /// Heartbeat older than this: stale (default 2 s, in ns).
    pub stale_after_ns: u64,
    /// Capture older than this while the engine is not idle: stale
    /// (default 30 s, in ns).
    pub max_capture_age_ns: u64,
    /// How often a source looks for new, removed and replaced engines
    /// (a directory listing, or the Redis registry; default 250 ms, in ns).
    pub rescan_interval_ns: u64,
}

/// `struct_size` of the first version of `EsOptions` (all fields above):
/// the smallest a library accepts.
pub const ES_OPTIONS_V1_SIZE: usize = 32;

const _: () = assert!(size_of::<EsOptions>() == ES_OPTIONS_V1_SIZE);
const _: () = assert!(offset_of!(EsOptions, rescan_interval_ns) == 24);

impl Default for EsOptions {
    fn default() -> Self {
        let defaults = ReaderOptions::default();
        EsOptions {
            struct_size: size_of::<EsOptions>(),
            stale_after_ns: nanos(defaults.freshness.stale_after),
            max_capture_age_ns: nanos(defaults.freshness.max_capture_age),
            rescan_interval_ns: nanos(defaults.rescan_interval),
        }
    }
}

/// The reader options of a caller's `EsOptions` (null: the defaults).
///
/// # Safety
/// `options` is null or points to at least `struct_size` readable bytes
/// (its first field) that start with an `EsOptions` prefix.
pub(crate) unsafe fn reader_options(options: *const EsOptions) -> Result<ReaderOptions, Failure> {
    if options.is_null() {
        return Ok(ReaderOptions::default());
    }
    // SAFETY: not null; every version starts with struct_size (the contract).
    let size = unsafe { options.cast::<usize>().read_unaligned() };
    if size < ES_OPTIONS_V1_SIZE {
        return Err(Failure::new(
            EsCode::BadArgument,
            format!(
                "EsOptions.struct_size is {size}, below the smallest version ({ES_OPTIONS_V1_SIZE}); \
                 fill the options with es_options_init"
            ),
        ));
    }
    // SAFETY: the caller has at least ES_OPTIONS_V1_SIZE = sizeof(EsOptions)
    // readable bytes (checked above); later fields, if any, are ignored.
    let options = unsafe { options.read_unaligned() };
    Ok(ReaderOptions {
        freshness: Freshness {
            stale_after: Duration::from_nanos(options.stale_after_ns),
            max_capture_age: Duration::from_nanos(options.max_capture_age_ns),
        },
        rescan_interval: Duration::from_nanos(options.rescan_interval_ns),
        cache_digests: false,
    })
}

/// Fills `*options` with the defaults and `struct_size = sizeof(EsOptions)`.
///
/// # Safety
/// `options` is null (an error) or points to a writable `EsOptions`.
#[no_mangle]
pub unsafe extern "C" fn es_options_init(options: *mut EsOptions) -> EsCode {
    ffi_call(|| {
        if options.is_null() {
            return Err(Failure::new(EsCode::NullArgument, "options is null"));
        }
        // SAFETY: not null and writable (the caller's contract).
        unsafe { options.write(EsOptions::default()) };
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_round_trip_and_small_sizes_are_refused() {
        let mut options = EsOptions {
            struct_size: 0,
            stale_after_ns: 0,
            max_capture_age_ns: 0,
            rescan_interval_ns: 0,
        };
        // SAFETY: a writable EsOptions.
        assert_eq!(unsafe { es_options_init(&mut options) }, EsCode::Ok);
        assert_eq!(options.struct_size, ES_OPTIONS_V1_SIZE);
        // SAFETY: a whole EsOptions.
        let read = unsafe { reader_options(&options) }.unwrap();
        assert_eq!(read.freshness, Freshness::default());
        assert_eq!(
            read.rescan_interval,
            ReaderOptions::default().rescan_interval
        );
        options.struct_size = 8;
        // SAFETY: as above.
        let refused = unsafe { reader_options(&options) }.unwrap_err();
        assert_eq!(refused.code, EsCode::BadArgument);
        assert!(refused.message.contains("es_options_init"));
        // SAFETY: null is refused before any write.
        let null = unsafe { es_options_init(std::ptr::null_mut()) };
        assert_eq!(null, EsCode::NullArgument);
    }
}

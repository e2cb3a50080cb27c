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
    /// Version 2. 1: each read also reads the cache digest of every engine
    /// whose snapshot names one (`es_read_cache` needs it); 0 (the
    /// default, and what a version-1 caller gets): no digests. Other
    /// values are `ES_CODE_BAD_ARGUMENT`.
    pub read_cache_digests: u32,
    /// Version 2: zero (room for later flags).
    pub reserved: u32,
}

/// `struct_size` of the first version of `EsOptions` (up to
/// `rescan_interval_ns`): the smallest a library accepts.
pub const ES_OPTIONS_V1_SIZE: usize = 32;

/// `struct_size` of version 2 (`read_cache_digests` appended).
pub const ES_OPTIONS_V2_SIZE: usize = 40;

const _: () = assert!(offset_of!(EsOptions, rescan_interval_ns) + 8 == ES_OPTIONS_V1_SIZE);
const _: () = assert!(offset_of!(EsOptions, read_cache_digests) == ES_OPTIONS_V1_SIZE);
const _: () = assert!(size_of::<EsOptions>() == ES_OPTIONS_V2_SIZE);

impl Default for EsOptions {
    fn default() -> Self {
        let defaults = ReaderOptions::default();
        EsOptions {
            struct_size: size_of::<EsOptions>(),
            stale_after_ns: nanos(defaults.freshness.stale_after),
            max_capture_age_ns: nanos(defaults.freshness.max_capture_age),
            rescan_interval_ns: nanos(defaults.rescan_interval),
            read_cache_digests: u32::from(defaults.cache_digests),
            reserved: 0,
        }
    }
}

/// The reader options of a caller's `EsOptions` (null: the defaults).
///
/// A caller's `struct_size` below this version's is an older caller: the
/// fields it lacks keep their defaults; a larger one is a newer caller,
/// whose fields past this version's are ignored.
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
    // The caller's fields over the defaults: a version-1 caller's 32 bytes
    // leave `read_cache_digests` at its default.
    let mut known = EsOptions::default();
    let have = size.min(size_of::<EsOptions>());
    // SAFETY: the caller has `size` >= `have` readable bytes (the contract);
    // `known` is a local EsOptions of at least `have` bytes, all of whose
    // fields are integers (any bytes are a valid value); the two cannot
    // overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(
            options.cast::<u8>(),
            std::ptr::addr_of_mut!(known).cast::<u8>(),
            have,
        );
    }
    let cache_digests = match known.read_cache_digests {
        0 => false,
        1 => true,
        other => {
            return Err(Failure::new(
                EsCode::BadArgument,
                format!("EsOptions.read_cache_digests is {other}: pass 0 (off) or 1 (on)"),
            ))
        }
    };
    Ok(ReaderOptions {
        freshness: Freshness {
            stale_after: Duration::from_nanos(known.stale_after_ns),
            max_capture_age: Duration::from_nanos(known.max_capture_age_ns),
        },
        rescan_interval: Duration::from_nanos(known.rescan_interval_ns),
        cache_digests,
    })
}

/// Fills the first version of `*options` (its first `ES_OPTIONS_V1_SIZE`
/// bytes) with the defaults and `struct_size = ES_OPTIONS_V1_SIZE`: the
/// symbol that programs built against a version-1 header call, whose
/// `EsOptions` is that long. The header's `es_options_init(options)` is a
/// macro for [`es_options_init_sized`] with the caller's `sizeof`.
///
/// # Safety
/// `options` is null (an error) or points to `ES_OPTIONS_V1_SIZE` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn es_options_init(options: *mut EsOptions) -> EsCode {
    // SAFETY: the caller's contract is this function's, for the v1 size.
    unsafe { es_options_init_sized(options, ES_OPTIONS_V1_SIZE) }
}

/// Fills `*options`, as the caller compiled it (`size = sizeof(EsOptions)`),
/// with the defaults: the first `min(size, sizeof(EsOptions) of this
/// library)` bytes are written, and `struct_size` says how many. A size
/// below `ES_OPTIONS_V1_SIZE` is `ES_CODE_BAD_ARGUMENT`.
///
/// # Safety
/// `options` is null (an error) or points to `size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn es_options_init_sized(options: *mut EsOptions, size: usize) -> EsCode {
    ffi_call(|| {
        if options.is_null() {
            return Err(Failure::new(EsCode::NullArgument, "options is null"));
        }
        if size < ES_OPTIONS_V1_SIZE {
            return Err(Failure::new(
                EsCode::BadArgument,
                format!(
                    "es_options_init_sized: size {size} is below the smallest EsOptions \
                     ({ES_OPTIONS_V1_SIZE}); pass sizeof(EsOptions)"
                ),
            ));
        }
        let written = size.min(size_of::<EsOptions>());
        let defaults = EsOptions {
            struct_size: written,
            ..EsOptions::default()
        };
        // SAFETY: not null, `written` ≤ `size` bytes writable (the caller's
        // contract); `defaults` is `size_of::<EsOptions>()` ≥ `written`
        // readable bytes; the two do not overlap (one is a local). Byte
        // copies: `options` may be unaligned or shorter than EsOptions.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&raw const defaults).cast::<u8>(),
                options.cast::<u8>(),
                written,
            )
        };
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A program built against the version-1 header has 32 bytes of
    /// `EsOptions`, and calls the `es_options_init` symbol: exactly those
    /// 32 bytes are written (the 40-byte version 2 overran its stack).
    #[test]
    fn the_version_1_symbol_writes_only_version_1_and_sized_writes_what_it_is_given() {
        let mut bytes = [0xAAu8; 64];
        // SAFETY: 64 writable bytes ≥ ES_OPTIONS_V1_SIZE.
        let code = unsafe { es_options_init(bytes.as_mut_ptr().cast()) };
        assert_eq!(code, EsCode::Ok);
        assert!(
            bytes[ES_OPTIONS_V1_SIZE..].iter().all(|&b| b == 0xAA),
            "{bytes:?}"
        );
        assert_eq!(
            usize::from_ne_bytes(bytes[..8].try_into().unwrap()),
            ES_OPTIONS_V1_SIZE
        );
        for (size, written) in [(36, 36), (40, 40), (64, 40)] {
            let mut bytes = [0xAAu8; 64];
            // SAFETY: `size` ≤ 64 writable bytes.
            let code = unsafe { es_options_init_sized(bytes.as_mut_ptr().cast(), size) };
            assert_eq!(code, EsCode::Ok);
            assert!(
                bytes[written..].iter().all(|&b| b == 0xAA),
                "{size}: {bytes:?}"
            );
            assert_eq!(
                usize::from_ne_bytes(bytes[..8].try_into().unwrap()),
                written
            );
        }
        let mut bytes = [0xAAu8; 64];
        // SAFETY: 64 writable bytes.
        let code = unsafe { es_options_init_sized(bytes.as_mut_ptr().cast(), 31) };
        assert_eq!(code, EsCode::BadArgument);
        assert!(bytes.iter().all(|&b| b == 0xAA));
    }

    #[test]
    fn defaults_round_trip_and_small_sizes_are_refused() {
        let mut options = EsOptions {
            struct_size: 0,
            stale_after_ns: 0,
            max_capture_age_ns: 0,
            rescan_interval_ns: 0,
            read_cache_digests: 7,
            reserved: 7,
        };
        // SAFETY: a writable EsOptions.
        let code = unsafe { es_options_init_sized(&mut options, size_of::<EsOptions>()) };
        assert_eq!(code, EsCode::Ok);
        assert_eq!(options.struct_size, ES_OPTIONS_V2_SIZE);
        assert_eq!((options.read_cache_digests, options.reserved), (0, 0));
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

    /// A version-1 caller's 32 bytes are all that is read: what follows
    /// them in its memory (here: digests on) is not its and is ignored.
    #[test]
    fn a_version_1_caller_gets_no_digests_and_version_2_turns_them_on() {
        let on = EsOptions {
            read_cache_digests: 1,
            ..EsOptions::default()
        };
        // SAFETY: a whole EsOptions.
        assert!(unsafe { reader_options(&on) }.unwrap().cache_digests);
        let v1 = EsOptions {
            struct_size: ES_OPTIONS_V1_SIZE,
            stale_after_ns: 5,
            ..on
        };
        // SAFETY: a whole EsOptions (struct_size says fewer bytes).
        let read = unsafe { reader_options(&v1) }.unwrap();
        assert!(!read.cache_digests);
        assert_eq!(read.freshness.stale_after, Duration::from_nanos(5));
        let bad = EsOptions {
            read_cache_digests: 2,
            ..EsOptions::default()
        };
        // SAFETY: a whole EsOptions.
        let refused = unsafe { reader_options(&bad) }.unwrap_err();
        assert_eq!(refused.code, EsCode::BadArgument);
        assert!(
            refused.message.contains("read_cache_digests is 2"),
            "{}",
            refused.message
        );
    }
}

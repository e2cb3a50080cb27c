//! Cache digests as C sees them (docs/FORMAT.md, "Cache residency"): the
//! fixed-size `EsCacheDigest` plus the entries in the caller's array, from
//! a digest file (`es_read_cache_file`), a Redis value
//! (`es_decode_cache_value`) or a source (`es_read_cache`, `source_cache.rs`);
//! and the router block hashes of a prompt (`es_block_hashes`). Every rule
//! is shm-format's: this file only copies what it decides.

use std::mem::{offset_of, size_of};

use engine_state_shm_format::blocks::{block_hashes, BLOCK_TOKENS};
use engine_state_shm_format::{decode_digest_value, DigestFile, DigestRecord, MAX_DIGEST_ENTRIES};

use crate::code::EsCode;
use crate::ffi_call::{ffi_call, Failure};

/// Tokens per router block (docs/FORMAT.md `BLOCK_TOKENS`): a prompt of
/// `n` tokens has `n / ES_BLOCK_TOKENS` block hashes.
pub const ES_BLOCK_TOKENS: usize = 512;
/// The most entries a digest holds (docs/FORMAT.md `MAX_DIGEST_ENTRIES`):
/// an array this long takes any digest.
pub const ES_MAX_DIGEST_ENTRIES: usize = 131_072;

const _: () = assert!(ES_BLOCK_TOKENS == BLOCK_TOKENS);
const _: () = assert!(ES_MAX_DIGEST_ENTRIES == MAX_DIGEST_ENTRIES);

/// The `state` of a digest file or value.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EsCacheState {
    /// Not filled in (a default `EsCacheDigest`).
    Unknown = 0,
    /// Written by a live writer: usable (while its engine is fresh).
    Active = 1,
    /// Its writer closed or replaced it: do not use it.
    Retired = 2,
}

/// One cache digest's header and control words (docs/FORMAT.md, "The
/// digest file"); its entries, the router block hashes ascending, go into
/// the caller's array. Plain data: nothing to free.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EsCacheDigest {
    /// The digest version (1 or more; it moves with each published change).
    pub version: u64,
    /// The writer's `CLOCK_MONOTONIC` at the capture, ns.
    pub captured_mono_ns: u64,
    /// `CLOCK_REALTIME` at the capture, ns since the epoch (display); 0
    /// from `es_read_cache`.
    pub captured_unix_ns: u64,
    /// Valid entries: the array length the entries need.
    pub count: u64,
    /// Router blocks the engine held at the capture: `count`, or more when
    /// the digest was cut to its capacity.
    pub held: u64,
    /// The generation of the engine file (Redis record) this digest
    /// belongs to: use it only with an engine of that generation.
    pub generation: u64,
    /// When the file was created (a Redis value: when its writer's digest
    /// started), ns since the epoch; 0 from `es_read_cache`.
    pub created_unix_ns: u64,
    /// Entries the file holds (a Redis value: `count`); 0 from `es_read_cache`.
    pub capacity: u32,
    /// The engine's KV block size in tokens (display; 0: its writer did not
    /// say).
    pub kv_block_size: u32,
    /// The writer's pid, in its pid namespace; 0 from `es_read_cache`.
    pub writer_pid: u32,
    /// Active or retired (`es_read_cache`: active; the reader hands out no
    /// retired digest).
    pub state: EsCacheState,
}

const _: () = assert!(offset_of!(EsCacheDigest, capacity) == 56);
const _: () = assert!(offset_of!(EsCacheDigest, state) == 68);
const _: () = assert!(size_of::<EsCacheDigest>() == 72);

impl Default for EsCacheDigest {
    fn default() -> Self {
        EsCacheDigest {
            version: 0,
            captured_mono_ns: 0,
            captured_unix_ns: 0,
            count: 0,
            held: 0,
            generation: 0,
            created_unix_ns: 0,
            capacity: 0,
            kv_block_size: 0,
            writer_pid: 0,
            state: EsCacheState::Unknown,
        }
    }
}

impl EsCacheDigest {
    /// The C struct of a whole record (a file's or a value's).
    fn of_record(record: &DigestRecord, capacity: u32, state: EsCacheState) -> EsCacheDigest {
        EsCacheDigest {
            version: record.digest.version(),
            captured_mono_ns: record.digest.captured_mono_ns(),
            captured_unix_ns: record.captured_unix_ns,
            count: record.digest.len() as u64,
            held: record.held,
            generation: record.generation,
            created_unix_ns: record.created_unix_ns,
            capacity,
            kv_block_size: record.kv_block_size,
            writer_pid: record.writer_pid,
            state,
        }
    }
}

/// The checks of an out-array: null only with length 0.
pub(crate) fn check_out<T>(out: *mut T, len: usize, what: &str) -> Result<(), Failure> {
    if out.is_null() && len > 0 {
        return Err(Failure::new(
            EsCode::NullArgument,
            format!("{what} is null but its length is {len}: pass an array, or length 0 to count"),
        ));
    }
    Ok(())
}

/// Copies `values` into `out` (`len` of them fit) and fails with
/// `BufferTooSmall` when they do not all fit (what fits was copied).
///
/// # Safety
/// `out` is null with `len` 0, or has `len` writable `u64`s that do not
/// overlap `values`.
pub(crate) unsafe fn copy_entries(
    values: &[u64],
    out: *mut u64,
    len: usize,
    what: &str,
) -> Result<(), Failure> {
    let n = values.len().min(len);
    if n > 0 {
        // SAFETY: n <= len writable u64s at `out` (the contract, not null
        // when len > 0), not overlapping the library's own `values`.
        unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), out, n) };
    }
    if values.len() > len {
        return Err(Failure::new(
            EsCode::BufferTooSmall,
            format!(
                "{} {what}, but the array holds {len} (the first {n} were written); pass an \
                 array of at least the count written back",
                values.len()
            ),
        ));
    }
    Ok(())
}

/// Writes `digest` to `*out` and the entries to `entries` (`capacity` of
/// them): the shared tail of the three digest reads.
///
/// # Safety
/// `out` is writable; `entries` as in [`copy_entries`].
pub(crate) unsafe fn write_digest(
    digest: EsCacheDigest,
    blocks: &[u64],
    out: *mut EsCacheDigest,
    entries: *mut u64,
    capacity: usize,
) -> Result<(), Failure> {
    // SAFETY: writable (the contract).
    unsafe { out.write(digest) };
    // SAFETY: the contract, passed on.
    unsafe { copy_entries(blocks, entries, capacity, "digest entries") }
}

/// The checks shared by the digest reads: `out` given, the array null only
/// with capacity 0.
fn check_digest_out(
    out: *mut EsCacheDigest,
    entries: *mut u64,
    capacity: usize,
) -> Result<(), Failure> {
    if out.is_null() {
        return Err(Failure::new(EsCode::NullArgument, "digest is null"));
    }
    check_out(entries, capacity, "entries")
}

/// Reads the cache digest file at `path` (`<dir>.cache/<engine_id>`) as a
/// reader does: never blocking, never following a link, validated in the
/// order of docs/FORMAT.md, "Writing and reading a digest". On success
/// `*digest` has its header and control words and `entries` the first
/// `capacity` of its `digest->count` entries (`entries = NULL, capacity =
/// 0` learns the count: `ES_CODE_BUFFER_TOO_SMALL` when it is not 0). A
/// retired file is read (`ES_CACHE_STATE_RETIRED`): a router must not use it.
/// Failures are the format's classes: `ES_CODE_REFUSED_ENTRY` (not a
/// regular file), `ES_CODE_NOT_DIGEST`, `ES_CODE_UNKNOWN_VERSION`,
/// `ES_CODE_WRONG_SIZE`, `ES_CODE_CORRUPT_CACHE`, `ES_CODE_TORN` (read it
/// again later), or `ES_CODE_IO` (it cannot be opened, e.g. missing).
///
/// # Safety
/// `path` is NUL-terminated; `digest` is null (an error) or writable;
/// `entries` is null or has `capacity` writable `uint64_t`s.
#[no_mangle]
pub unsafe extern "C" fn es_read_cache_file(
    path: *const std::ffi::c_char,
    digest: *mut EsCacheDigest,
    entries: *mut u64,
    capacity: usize,
) -> EsCode {
    ffi_call(|| {
        check_digest_out(digest, entries, capacity)?;
        // SAFETY: NUL-terminated (the caller's contract).
        let path = unsafe { crate::c_string::text_arg(path, "path") }?;
        let file = DigestFile::open(path).map_err(engine_state_reader::Error::from)?;
        let record = file.read_record().map_err(|error| {
            Failure::new(
                EsCode::of_digest(&error),
                format!("cache digest {path}: {error}"),
            )
        })?;
        let state = if file.is_retired() {
            EsCacheState::Retired
        } else {
            EsCacheState::Active
        };
        let c = EsCacheDigest::of_record(&record, file.header().capacity, state);
        // SAFETY: checked above; the caller's contract on both.
        unsafe { write_digest(c, record.digest.blocks(), digest, entries, capacity) }
    })
}

/// Decodes the Redis value of a cache digest (`<prefix>cache:<engine_id>`,
/// `value_len` bytes as fetched with `GETRANGE key 0 1048704`) as the Redis
/// source does (docs/FORMAT.md, "On Redis"). Outputs as in
/// `es_read_cache_file` (`capacity` of the value is its `count`; its state
/// is active: any other is `ES_CODE_CORRUPT_CACHE`). Failures:
/// `ES_CODE_NOT_DIGEST`, `ES_CODE_UNKNOWN_VERSION`, `ES_CODE_WRONG_SIZE`,
/// `ES_CODE_CORRUPT_CACHE`. Use the digest only while the engine's record is
/// fresh and of the digest's `generation`.
///
/// # Safety
/// `value` has `value_len` readable bytes (or is null with `value_len` 0);
/// `digest` is null (an error) or writable; `entries` is null or has
/// `capacity` writable `uint64_t`s.
#[no_mangle]
pub unsafe extern "C" fn es_decode_cache_value(
    value: *const u8,
    value_len: usize,
    digest: *mut EsCacheDigest,
    entries: *mut u64,
    capacity: usize,
) -> EsCode {
    ffi_call(|| {
        check_digest_out(digest, entries, capacity)?;
        if value.is_null() && value_len > 0 {
            return Err(Failure::new(EsCode::NullArgument, "value is null"));
        }
        let value: &[u8] = if value_len == 0 {
            &[]
        } else {
            // SAFETY: value_len readable bytes, not null (checked; the contract).
            unsafe { std::slice::from_raw_parts(value, value_len) }
        };
        let record = decode_digest_value(value).map_err(|error| {
            Failure::new(
                EsCode::of_digest(&error),
                format!("cache digest value of {value_len} bytes: {error}"),
            )
        })?;
        let c = EsCacheDigest::of_record(&record, record.digest.len() as u32, EsCacheState::Active);
        // SAFETY: checked above; the caller's contract on both.
        unsafe { write_digest(c, record.digest.blocks(), digest, entries, capacity) }
    })
}

/// The router block hashes of a prompt (docs/FORMAT.md, "Keys: router block
/// hashes"): one chained hash per full `ES_BLOCK_TOKENS`-token block of
/// `tokens` (`n_tokens` token ids; a trailing partial block has none), the
/// keys of a digest's entries. `*count` is `n_tokens / ES_BLOCK_TOKENS`;
/// `out` gets the first `out_len` hashes in prompt order (`out = NULL,
/// out_len = 0` learns the count without hashing: `ES_CODE_BUFFER_TOO_SMALL`
/// when it is not 0). A prompt's cache hit on an engine is the leading run
/// of these found in its digest.
///
/// # Safety
/// `tokens` has `n_tokens` readable `uint32_t`s (or is null with `n_tokens`
/// 0); `out` is null or has `out_len` writable `uint64_t`s; `count` is null
/// (an error) or writable.
#[no_mangle]
pub unsafe extern "C" fn es_block_hashes(
    tokens: *const u32,
    n_tokens: usize,
    out: *mut u64,
    out_len: usize,
    count: *mut usize,
) -> EsCode {
    ffi_call(|| {
        if count.is_null() {
            return Err(Failure::new(EsCode::NullArgument, "count is null"));
        }
        if tokens.is_null() && n_tokens > 0 {
            return Err(Failure::new(EsCode::NullArgument, "tokens is null"));
        }
        check_out(out, out_len, "out")?;
        let n = n_tokens / BLOCK_TOKENS;
        // SAFETY: writable (checked non-null; the contract).
        unsafe { count.write(n) };
        // Hash only the blocks that fit (a chain: the first k hashes need
        // only the first k blocks' tokens).
        let fit = n.min(out_len);
        let hashes = if fit == 0 {
            Vec::new()
        } else {
            // SAFETY: n_tokens >= fit * BLOCK_TOKENS readable u32s, not null
            // (checked; the contract).
            let tokens = unsafe { std::slice::from_raw_parts(tokens, fit * BLOCK_TOKENS) };
            block_hashes(tokens)
        };
        // The message counts all n hashes, not just those computed.
        if n > out_len {
            // SAFETY: the caller's contract (fit <= out_len).
            unsafe { copy_entries(&hashes, out, out_len, "block hashes") }?;
            return Err(Failure::new(
                EsCode::BufferTooSmall,
                format!(
                    "{n} block hashes, but the array holds {out_len} (the first {fit} were \
                     written); pass an array of at least the count written back"
                ),
            ));
        }
        // SAFETY: the caller's contract (hashes.len() == n <= out_len).
        unsafe { copy_entries(&hashes, out, out_len, "block hashes") }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_hashes_count_without_hashing_and_fill_what_fits() {
        let tokens: Vec<u32> = (0..3 * BLOCK_TOKENS as u32 + 7).collect();
        let expected = block_hashes(&tokens);
        assert_eq!(expected.len(), 3);
        let mut count = 0;
        // SAFETY: a token slice and its length, null out with length 0, a count.
        let code = unsafe {
            es_block_hashes(
                tokens.as_ptr(),
                tokens.len(),
                std::ptr::null_mut(),
                0,
                &mut count,
            )
        };
        assert_eq!((code, count), (EsCode::BufferTooSmall, 3));
        let mut out = [0u64; 4];
        // SAFETY: as above, out of 2 then 4.
        let code = unsafe {
            es_block_hashes(
                tokens.as_ptr(),
                tokens.len(),
                out.as_mut_ptr(),
                2,
                &mut count,
            )
        };
        assert_eq!((code, count), (EsCode::BufferTooSmall, 3));
        assert_eq!(out[..2], expected[..2]);
        assert_eq!(out[2], 0, "only what fits is written");
        // SAFETY: as above.
        let code = unsafe {
            es_block_hashes(
                tokens.as_ptr(),
                tokens.len(),
                out.as_mut_ptr(),
                4,
                &mut count,
            )
        };
        assert_eq!((code, count), (EsCode::Ok, 3));
        assert_eq!(out[..3], expected[..]);
        // SAFETY: null tokens with 0 tokens: no block.
        let code =
            unsafe { es_block_hashes(std::ptr::null(), 0, std::ptr::null_mut(), 0, &mut count) };
        assert_eq!((code, count), (EsCode::Ok, 0));
        // SAFETY: null tokens with a length is refused before any read.
        let code =
            unsafe { es_block_hashes(std::ptr::null(), 512, out.as_mut_ptr(), 4, &mut count) };
        assert_eq!(code, EsCode::NullArgument);
    }
}

//! Result codes: what every function returns, and the class of a per-engine
//! error (the classes of `format/vectors/README.md`).

use std::ffi::c_char;

use engine_state_reader::{Error, FormatError};
use engine_state_shm_format::{DigestError, RouterError};

/// What a call did. `ES_CODE_OK` is 0; every other value is a failure whose
/// message `es_last_error` returns. Codes from 100 up are also the class of a
/// per-engine error (`es_engine_error`) or a per-replica one
/// (`es_replica_error`). New codes may be added: a program treats a code it
/// does not know that is 100 or more as that engine's (replica's) error
/// (the others may still be read), and one below 100 as a failure of the
/// call.
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EsCode {
    /// Success.
    Ok = 0,
    /// A required pointer argument was null.
    NullArgument = 1,
    /// A caller's buffer is too small: the out-count says how many engines
    /// (or digest entries, block hashes) there are, or the message says how
    /// many bytes are needed. What fits was written.
    BufferTooSmall = 2,
    /// The URI cannot be parsed (or names a backend this build lacks).
    BadUri = 3,
    /// An `EsOptions` whose `struct_size` is too small, or a string argument
    /// that is not UTF-8.
    BadArgument = 4,
    /// The shared-memory directory cannot be listed.
    Directory = 5,
    /// Redis failed (unreachable, refused, wrong password, ...).
    Redis = 6,
    /// Another thread is inside a call on the same handle: use one handle
    /// per thread.
    Busy = 7,
    /// The library panicked (a bug: please report the message); the handle
    /// may still be used.
    Panic = 8,
    /// This source or build cannot do that (`es_read_at` on Redis,
    /// `es_decode_record` without Redis support, `es_read_cache` on a
    /// source opened without `EsOptions.read_cache_digests`).
    Unsupported = 9,
    /// No such engine, or no per-engine error at that index.
    NotFound = 10,
    /// `es_read_cache`: the engine publishes no cache digest (its snapshot's
    /// `cache_version` is 0).
    NoCache = 11,
    /// `es_read_cache`: the engine's state is not fresh (stale, dead or
    /// torn). Its digest, when there is one, was written all the same, but
    /// must not be used to route (docs/FORMAT.md, "Writing and reading a
    /// digest").
    NotFresh = 12,
    /// Per-engine: not an engine-state file (bad magic).
    NotEngineState = 100,
    /// Per-engine: a layout version this build does not read.
    UnknownVersion = 101,
    /// Per-engine: a version-1 file that is not 4096 bytes.
    WrongSize = 102,
    /// Per-engine: header or payload size, state, or engine id field wrong.
    CorruptHeader = 103,
    /// Per-engine: a FIFO, socket, symbolic link, directory or non-UTF-8 name.
    RefusedEntry = 104,
    /// Per-engine: a Redis value that is not a version-1 record.
    ForeignValue = 105,
    /// Per-engine: a Redis record whose key's expiry does not match it.
    NoExpiry = 106,
    /// Per-engine: a system call on the engine's file failed.
    Io = 107,
    /// Per-engine: a stamp of the engine is too far ahead of this reader's
    /// clock to tell its age. The engine is read all the same, status
    /// `ES_STATUS_STALE`: this error says why.
    ClockAhead = 108,
    /// Per-engine: the engine's cache digest cannot be used (damaged, or of
    /// another digest layout version); its state is read without it. Also
    /// the class of a digest file or value that breaks the format's rules.
    CorruptCache = 109,
    /// A digest file or value that is not a cache digest (bad magic).
    NotDigest = 110,
    /// A cache digest or router reservations file with no consistent copy
    /// (a write was in progress at every attempt, a writer died mid-write,
    /// or the file is zeroed), or a digest being replaced: read it again
    /// later.
    Torn = 111,
    /// Per-engine and `es_read_cache`: the digest the engine's snapshot
    /// names is not there for it (no file or key yet, one of another run of
    /// the engine, or an older version): a restarted engine or one between
    /// writes, not damage. Its state is read without it; read again once
    /// the engine names its next digest.
    MissingCache = 112,
    /// Per-replica and `es_read_router_file`: not a router reservations
    /// file (bad magic, or fewer than 8 bytes).
    NotRouter = 113,
    /// Per-replica and `es_read_router_file`: a router reservations file
    /// or value that breaks the format's rules (header fields, replica id,
    /// count, a malformed or duplicate slot: docs/FORMAT.md, "Writing and
    /// reading reservations"); the replica's reservations are not used.
    CorruptRouter = 114,
    /// Anything else.
    Other = 199,
}

impl EsCode {
    /// The code of a reader error.
    pub(crate) fn of(error: &Error) -> EsCode {
        #[cfg(feature = "redis")]
        use engine_state_reader::redis::Error as RedisError;
        match error {
            Error::BadUri { .. } => EsCode::BadUri,
            Error::CorruptCache { .. } => EsCode::CorruptCache,
            Error::MissingCache { .. } => EsCode::MissingCache,
            Error::Directory { .. } => EsCode::Directory,
            Error::ClockAhead { .. } => EsCode::ClockAhead,
            Error::Format(format) => match format {
                FormatError::NotEngineState { .. } => EsCode::NotEngineState,
                FormatError::UnknownVersion { .. } => EsCode::UnknownVersion,
                FormatError::WrongSize { .. } => EsCode::WrongSize,
                FormatError::CorruptHeader { .. } => EsCode::CorruptHeader,
                FormatError::RefusedEntry { .. } => EsCode::RefusedEntry,
                FormatError::Io { .. } => EsCode::Io,
                FormatError::Digest { error, .. } => EsCode::of_digest(error),
                FormatError::Router { error, .. } => EsCode::of_router(error),
                _ => EsCode::Other,
            },
            #[cfg(feature = "redis")]
            Error::Redis(redis) => match redis {
                RedisError::ForeignValue { .. } => EsCode::ForeignValue,
                RedisError::NoExpiry { .. } => EsCode::NoExpiry,
                RedisError::UnknownVersion { .. } => EsCode::UnknownVersion,
                RedisError::BadUri { .. } => EsCode::BadUri,
                _ => EsCode::Redis,
            },
            _ => EsCode::Other,
        }
    }

    /// The code of a digest error: its class (docs/FORMAT.md, "Writing and
    /// reading a digest"; `DigestError::kind`).
    pub(crate) fn of_digest(error: &DigestError) -> EsCode {
        match error {
            DigestError::NotDigest => EsCode::NotDigest,
            DigestError::UnknownVersion { .. } => EsCode::UnknownVersion,
            DigestError::WrongSize { .. } => EsCode::WrongSize,
            DigestError::Corrupt { .. } => EsCode::CorruptCache,
            DigestError::Torn(_) => EsCode::Torn,
            _ => EsCode::Other,
        }
    }

    /// The code of a router reservations error: its class (docs/FORMAT.md,
    /// "Writing and reading reservations"; `RouterError::kind`).
    pub(crate) fn of_router(error: &RouterError) -> EsCode {
        match error {
            RouterError::NotRouter => EsCode::NotRouter,
            RouterError::UnknownVersion { .. } => EsCode::UnknownVersion,
            RouterError::WrongSize { .. } => EsCode::WrongSize,
            RouterError::Corrupt { .. } => EsCode::CorruptRouter,
            RouterError::Torn(_) => EsCode::Torn,
            _ => EsCode::Other,
        }
    }

    /// The code's name as in the header, NUL-terminated.
    fn name(self) -> &'static str {
        match self {
            EsCode::Ok => "ES_CODE_OK\0",
            EsCode::NullArgument => "ES_CODE_NULL_ARGUMENT\0",
            EsCode::BufferTooSmall => "ES_CODE_BUFFER_TOO_SMALL\0",
            EsCode::BadUri => "ES_CODE_BAD_URI\0",
            EsCode::BadArgument => "ES_CODE_BAD_ARGUMENT\0",
            EsCode::Directory => "ES_CODE_DIRECTORY\0",
            EsCode::Redis => "ES_CODE_REDIS\0",
            EsCode::Busy => "ES_CODE_BUSY\0",
            EsCode::Panic => "ES_CODE_PANIC\0",
            EsCode::Unsupported => "ES_CODE_UNSUPPORTED\0",
            EsCode::NotFound => "ES_CODE_NOT_FOUND\0",
            EsCode::NoCache => "ES_CODE_NO_CACHE\0",
            EsCode::NotFresh => "ES_CODE_NOT_FRESH\0",
            EsCode::NotEngineState => "ES_CODE_NOT_ENGINE_STATE\0",
            EsCode::UnknownVersion => "ES_CODE_UNKNOWN_VERSION\0",
            EsCode::WrongSize => "ES_CODE_WRONG_SIZE\0",
            EsCode::CorruptHeader => "ES_CODE_CORRUPT_HEADER\0",
            EsCode::RefusedEntry => "ES_CODE_REFUSED_ENTRY\0",
            EsCode::ForeignValue => "ES_CODE_FOREIGN_VALUE\0",
            EsCode::NoExpiry => "ES_CODE_NO_EXPIRY\0",
            EsCode::Io => "ES_CODE_IO\0",
            EsCode::ClockAhead => "ES_CODE_CLOCK_AHEAD\0",
            EsCode::CorruptCache => "ES_CODE_CORRUPT_CACHE\0",
            EsCode::NotDigest => "ES_CODE_NOT_DIGEST\0",
            EsCode::Torn => "ES_CODE_TORN\0",
            EsCode::MissingCache => "ES_CODE_MISSING_CACHE\0",
            EsCode::NotRouter => "ES_CODE_NOT_ROUTER\0",
            EsCode::CorruptRouter => "ES_CODE_CORRUPT_ROUTER\0",
            EsCode::Other => "ES_CODE_OTHER\0",
        }
    }
}

/// The name of `code` as spelled in this header ("ES_CODE_BAD_URI"), or
/// "ES_CODE_UNKNOWN" for a value that is no code. A static string: never free it.
#[no_mangle]
pub extern "C" fn es_code_name(code: i32) -> *const c_char {
    let name = EsCode::ALL
        .iter()
        .find(|c| **c as i32 == code)
        .map_or("ES_CODE_UNKNOWN\0", |c| c.name());
    name.as_ptr().cast()
}

impl EsCode {
    /// Every code.
    pub(crate) const ALL: [EsCode; 29] = [
        EsCode::Ok,
        EsCode::NullArgument,
        EsCode::BufferTooSmall,
        EsCode::BadUri,
        EsCode::BadArgument,
        EsCode::Directory,
        EsCode::Redis,
        EsCode::Busy,
        EsCode::Panic,
        EsCode::Unsupported,
        EsCode::NotFound,
        EsCode::NoCache,
        EsCode::NotFresh,
        EsCode::NotEngineState,
        EsCode::UnknownVersion,
        EsCode::WrongSize,
        EsCode::CorruptHeader,
        EsCode::RefusedEntry,
        EsCode::ForeignValue,
        EsCode::NoExpiry,
        EsCode::Io,
        EsCode::ClockAhead,
        EsCode::CorruptCache,
        EsCode::NotDigest,
        EsCode::Torn,
        EsCode::MissingCache,
        EsCode::NotRouter,
        EsCode::CorruptRouter,
        EsCode::Other,
    ];
}

#[cfg(test)]
mod tests {
    use std::ffi::CStr;

    use super::*;

    #[test]
    fn every_code_has_its_header_name() {
        for code in EsCode::ALL {
            // SAFETY: es_code_name returns a static NUL-terminated string.
            let name = unsafe { CStr::from_ptr(es_code_name(code as i32)) };
            let name = name.to_str().unwrap();
            assert!(name.starts_with("ES_CODE_"), "{name}");
            let words: String = name["ES_CODE_".len()..]
                .split('_')
                .map(|w| w[..1].to_owned() + &w[1..].to_lowercase())
                .collect();
            assert_eq!(words, format!("{code:?}"));
        }
        // SAFETY: as above.
        let unknown = unsafe { CStr::from_ptr(es_code_name(12345)) };
        assert_eq!(unknown.to_str().unwrap(), "ES_CODE_UNKNOWN");
    }
}

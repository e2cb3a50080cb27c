//! The one error type of the reader crate.

use std::path::PathBuf;

pub use engine_state_shm_format::Error as FormatError;

/// Errors of a whole source (one engine's bad file is an [`EngineError`] instead).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The URI cannot be parsed.
    #[error("bad engine-state URI {uri:?}: {reason}")]
    BadUri {
        /// The URI, password hidden.
        uri: String,
        /// What is wrong and which forms work.
        reason: String,
    },
    /// The shared-memory directory cannot be listed.
    #[error(
        "cannot read engine-state directory {}: {io}; check --uri / AGENTIC_ENGINE_STATE_URI, \
         and that the engines publish on this host",
        dir.display()
    )]
    Directory {
        /// The directory.
        dir: PathBuf,
        /// The OS error.
        io: std::io::Error,
    },
    /// Talking to Redis failed (unreachable, refused, wrong password, ...).
    #[error("Redis at {uri}: {error}; {hint}")]
    Redis {
        /// The URI, password hidden.
        uri: String,
        /// What Redis or the network said (never contains the password).
        error: String,
        /// What to do about it.
        hint: &'static str,
    },
    /// One engine's shared-memory file is unusable (an [`EngineError`]'s cause).
    #[error(transparent)]
    Format(#[from] FormatError),
    /// A key in the engine-state namespace of Redis holds something that is
    /// not an engine-state record (an [`EngineError`]'s cause).
    #[error(
        "Redis key {key:?} does not hold an engine-state record ({what}); delete it, or give \
         this fleet its own key prefix (?prefix=... in the URI)"
    )]
    ForeignValue {
        /// The key.
        key: String,
        /// What is wrong with the value.
        what: String,
    },
    /// A Redis record whose key's expiry does not match it, so its age cannot
    /// be told (an [`EngineError`]'s cause): never read as "written just now".
    #[error(
        "Redis key {key:?} holds an engine-state record whose age cannot be told: {what}; it is \
         not used. Delete the key (engine-state writers always SET it with PX ttl_ms, and a live \
         writer writes it again within a period)"
    )]
    NoExpiry {
        /// The key.
        key: String,
        /// What is wrong with its expiry.
        what: String,
    },
    /// A Redis record has a layout version this build does not know (an
    /// [`EngineError`]'s cause).
    #[error(
        "Redis key {key:?} has layout version {found}, but this build reads version {supported}; \
         upgrade engine-state on this side (or downgrade the writer) so both use the same layout"
    )]
    UnknownVersion {
        /// The key.
        key: String,
        /// The version in the record.
        found: u32,
        /// The version this build supports.
        supported: u32,
    },
}

/// One engine's state could not be read; the other engines are unaffected.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{error}")]
pub struct EngineError {
    /// The engine id, file name or key it concerns.
    pub name: String,
    /// What went wrong, with what to do next (the message names the file or
    /// key): [`Error::Format`] for a file, [`Error::ForeignValue`],
    /// [`Error::NoExpiry`] or [`Error::UnknownVersion`] for a Redis key, [`Error::Redis`] when a
    /// source lost its server (then `name` is the source's URI).
    pub error: std::sync::Arc<Error>,
}

impl EngineError {
    /// An error about `name`.
    pub fn new(name: impl Into<String>, error: impl Into<Error>) -> EngineError {
        EngineError {
            name: name.into(),
            error: std::sync::Arc::new(error.into()),
        }
    }
}

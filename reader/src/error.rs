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
    /// This build has no backend for the URI's scheme.
    #[error("{uri}: {reason}")]
    Unsupported {
        /// The URI, password hidden.
        uri: String,
        /// Why, and what to use instead.
        reason: String,
    },
    /// A backend failed as a whole (e.g. Redis unreachable).
    #[error("{0}")]
    Backend(String),
}

/// One engine's state could not be read; the other engines are unaffected.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{error}")]
pub struct EngineError {
    /// The engine id, file name or key it concerns.
    pub name: String,
    /// What went wrong, with what to do next (the message names the file or key).
    pub error: std::sync::Arc<FormatError>,
}

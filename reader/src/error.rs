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
    /// One engine's shared-memory file is unusable (an [`EngineError`]'s cause).
    #[error(transparent)]
    Format(#[from] FormatError),
    /// One engine's stamp is too far ahead of this reader's clock to tell
    /// its age (an [`EngineError`]'s cause; the engine is also read, stale).
    #[error(
        "{}: its {} is {} ms ahead of this reader's CLOCK_MONOTONIC, more than the {} ms a \
         writer's stamp can be (one publish period plus 1 s), so its age cannot be told and it \
         reads stale; the writer runs under another clock (a container in its own time \
         namespace) or the file was written by hand: run the engine in this host's time \
         namespace, or remove the file",
        name.display(),
        ahead.stamp.field(),
        ahead.ahead.as_millis(),
        ahead.limit.as_millis()
    )]
    ClockAhead {
        /// The engine's file.
        name: PathBuf,
        /// Which stamp, how far ahead, and the bound.
        ahead: crate::freshness::ClockAhead,
    },
    /// One engine's cache digest cannot be used (an [`EngineError`]'s cause,
    /// class `corrupt_cache`): the file or Redis value is damaged, or of
    /// another layout version (a digest that is simply not there is
    /// [`Error::MissingCache`]). The engine's state is still read, with
    /// `cache: None`; a router falls back to its own estimate for it.
    #[error(
        "{location}: the cache digest of engine {engine_id:?} cannot be used ({what}); its state \
         is read without it (cache: None). It is read again when the engine publishes its next \
         digest; if this persists, restart that engine's publisher (it rewrites its digest), \
         remove the digest so it is recreated, or turn digests off in this reader \
         (ReaderOptions::cache_digests)"
    )]
    CorruptCache {
        /// The engine.
        engine_id: String,
        /// The digest's file or Redis key.
        location: String,
        /// What is wrong.
        what: String,
    },
    /// One engine's snapshot (record) names a cache digest that is not
    /// there for it (an [`EngineError`]'s cause, class `missing_cache`): no
    /// digest file or key (yet), one of another run of the engine, or one
    /// older than the version named. A writer between writes or a restarted
    /// engine, not damage: said once per version. The engine's state is
    /// still read, with `cache: None`.
    #[error(
        "{location}: engine {engine_id:?} names a cache digest that is not there for it ({what}); \
         its state is read without it (cache: None). A restarted engine or one between writes \
         puts it in place shortly, and the next version named is read again; if this persists, \
         check that the engine's publisher still writes its digest (on Redis: that this reader \
         may read the <prefix>cache:* keys)"
    )]
    MissingCache {
        /// The engine.
        engine_id: String,
        /// The digest's file or Redis key.
        location: String,
        /// What is not there.
        what: String,
    },
    /// Redis failed (unreachable, refused, wrong password, ...), or one
    /// engine's key holds no usable record (an [`EngineError`]'s cause: a
    /// foreign value, a key without expiry, another layout version).
    #[cfg(feature = "redis")]
    #[error(transparent)]
    Redis(engine_state_redis::Error),
}

impl Error {
    /// Whether this is about an engine's cache digest
    /// ([`Error::CorruptCache`] or [`Error::MissingCache`]): the engine's
    /// state was read all the same.
    pub fn is_cache_fault(&self) -> bool {
        matches!(
            self,
            Error::CorruptCache { .. } | Error::MissingCache { .. }
        )
    }

    /// A cache digest fault of engine `engine_id` at `location`:
    /// [`Error::CorruptCache`] when the digest is `damaged`, else
    /// [`Error::MissingCache`] (the one rule for both sources).
    pub(crate) fn cache_fault(
        damaged: bool,
        engine_id: String,
        location: String,
        what: String,
    ) -> Error {
        if damaged {
            Error::CorruptCache {
                engine_id,
                location,
                what,
            }
        } else {
            Error::MissingCache {
                engine_id,
                location,
                what,
            }
        }
    }

    /// The engine a cache digest fault is about.
    pub fn cache_engine_id(&self) -> Option<&str> {
        match self {
            Error::CorruptCache { engine_id, .. } | Error::MissingCache { engine_id, .. } => {
                Some(engine_id)
            }
            _ => None,
        }
    }
}

impl From<engine_state_settings::BadUri> for Error {
    /// A URI the parser refused (`engine_state_settings::StateUri::parse`).
    fn from(error: engine_state_settings::BadUri) -> Error {
        Error::BadUri {
            uri: error.uri,
            reason: error.reason,
        }
    }
}

#[cfg(feature = "redis")]
impl From<engine_state_redis::Error> for Error {
    /// A bad `redis://` URI is a bad URI like any other.
    fn from(error: engine_state_redis::Error) -> Error {
        match error {
            engine_state_redis::Error::BadUri { uri, reason } => Error::BadUri { uri, reason },
            other => Error::Redis(other),
        }
    }
}

/// One engine's state could not be read; the other engines are unaffected.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{error}")]
pub struct EngineError {
    /// The engine id, file name or key it concerns.
    pub name: String,
    /// What went wrong, with what to do next (the message names the file or
    /// key): [`Error::Format`] for a file, `Error::Redis` for a Redis key
    /// and when a source lost its server (then `name` is the source's URI).
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

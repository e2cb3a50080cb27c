//! The one error type of the publisher crate.

use std::path::PathBuf;

/// Why a publisher could not start or publish.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A setting is invalid.
    #[error("engine-state publisher: {what}")]
    Config {
        /// What is wrong and what would be right.
        what: String,
    },
    /// The URI is invalid.
    #[error(transparent)]
    BadUri(#[from] engine_state_settings::BadUri),
    /// Redis refused the connection for good (wrong password, no permission).
    #[error(transparent)]
    Redis(engine_state_redis::Error),
    /// The shared-memory directory is missing and cannot be created.
    #[error(
        "engine-state publisher: cannot create the engine-state directory {}: {io}; create it, \
         or choose another directory with AGENTIC_ENGINE_STATE_URI=file:///path",
        dir.display()
    )]
    CreateDirectory {
        /// The directory.
        dir: PathBuf,
        /// The OS error.
        io: std::io::Error,
    },
    /// The operating system refused to start one of the publisher's threads.
    #[error(
        "engine-state publisher: cannot start the {thread} thread: {io}; the process is out of \
         threads or memory: raise its limits (ulimit -u, memory) or run fewer processes"
    )]
    Spawn {
        /// Which thread ("heartbeat", "Redis sink").
        thread: &'static str,
        /// The OS error.
        io: std::io::Error,
    },
    /// Creating or writing the shared-memory file failed.
    #[error(transparent)]
    Shm(#[from] engine_state_shm_format::Error),
    /// A snapshot breaks the layout's rules (nothing was published).
    #[error("engine-state publisher for {engine_id:?}: {what}; nothing was published")]
    InvalidSnapshot {
        /// The engine id.
        engine_id: String,
        /// Which field is wrong and what would be right.
        what: String,
    },
    /// A cache digest breaks the rules (too many blocks for its capacity, a
    /// capacity above `MAX_DIGEST_ENTRIES`, `held` below the blocks
    /// listed); nothing was published and later snapshots still name the
    /// previous digest.
    #[error("engine-state publisher for {engine_id:?}: cache digest refused: {what}")]
    InvalidCache {
        /// The engine id.
        engine_id: String,
        /// What is wrong and what would be right.
        what: String,
    },
    /// Another live publisher already publishes this engine id: the writer
    /// of a live file (shared memory), or of an unexpired record (Redis).
    /// The same error for both backends.
    #[error(
        "engine id {engine_id:?} is already published by a live process ({holder}) at \
         {location}; give this engine another id (AGENTIC_WORKER_ID) or stop the other \
         publisher{takeover}"
    )]
    AlreadyPublished {
        /// The contested id.
        engine_id: String,
        /// Who holds it, e.g. "pid 123 in its namespace".
        holder: String,
        /// The live file, or the Redis key and server (password hidden).
        location: String,
        /// When the id can be taken over, if that needs saying.
        takeover: &'static str,
    },
    /// The publisher was used after `close()`.
    #[error("engine-state publisher for {engine_id:?} is closed; create a new one")]
    Closed {
        /// The engine id.
        engine_id: String,
    },
    /// The publisher was used in a process forked from the one that created it.
    #[error(
        "engine-state publisher for {engine_id:?} was created in process {owner_pid}, before a \
         fork(); create a new Publisher in this process"
    )]
    WrongProcess {
        /// The engine id.
        engine_id: String,
        /// The creating process.
        owner_pid: u32,
    },
}

impl Error {
    /// The shared-memory "in use" error as [`Error::AlreadyPublished`], so that
    /// both backends refuse a second live publisher with one error.
    pub(crate) fn from_shm(error: engine_state_shm_format::Error) -> Error {
        match error {
            engine_state_shm_format::Error::AlreadyPublished {
                engine_id,
                path,
                pid,
            } => Error::AlreadyPublished {
                engine_id,
                holder: format!("pid {pid} in its namespace"),
                location: path.display().to_string(),
                takeover: "",
            },
            engine_state_shm_format::Error::LiveFileWrongSize {
                engine_id,
                path,
                size,
                expected,
            } => Error::AlreadyPublished {
                engine_id,
                holder: format!(
                    "pid unknown: another process truncated its file to {size} bytes instead of \
                     {expected}"
                ),
                location: path.display().to_string(),
                takeover: "; that publisher replaces its file within a few heartbeat periods",
            },
            other => Error::Shm(other),
        }
    }
}

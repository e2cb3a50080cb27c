//! The one error type of the publisher crate.

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
    /// The URI is invalid or names a backend this build lacks.
    #[error(transparent)]
    Uri(#[from] engine_state_reader::Error),
    /// Redis refused the connection for good (wrong password, no permission).
    #[error(transparent)]
    Redis(engine_state_reader::Error),
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

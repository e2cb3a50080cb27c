//! The one error type of the agent crate.

/// Why the agent could not start or had to stop.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A setting is invalid.
    #[error("esagent: {what}")]
    Config {
        /// What is wrong and what would be right.
        what: String,
    },
    /// The shared-memory directory or the Redis URI is unusable.
    #[error(transparent)]
    Reader(#[from] engine_state_reader::Error),
    /// The shared-memory directory is missing and cannot be created.
    #[error(
        "esagent: cannot create the engine-state directory {}: {io}; create it or point --uri \
         at the directory the engines publish into",
        dir.display()
    )]
    CreateDirectory {
        /// The directory.
        dir: std::path::PathBuf,
        /// The OS error.
        io: std::io::Error,
    },
    /// The metrics/health listener could not be bound.
    #[error(
        "esagent: cannot listen on {addr}: {io}; choose another address with --listen \
         (or {env})",
        env = engine_state_settings::AGENT_LISTEN_ENV
    )]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// The OS error.
        io: std::io::Error,
    },
}

impl From<engine_state_reader::BadUri> for Error {
    /// A URI the parser refused: the reader's bad URI, as for every other
    /// reader error.
    fn from(error: engine_state_reader::BadUri) -> Error {
        Error::Reader(error.into())
    }
}

//! engine-state's settings, in one place (DESIGN §9): the environment
//! variables every component reads, their defaults, the engine-id rule
//! ([`engine_id`]) and, with the `cli` feature, the command-line flags the
//! binaries share ([`cli`]). Explicit values (flags, arguments) always win
//! over the environment, which wins over the defaults.

mod engine_id;

#[cfg(feature = "cli")]
pub mod cli;

pub use engine_id::{default_engine_id, engine_id, fallback_engine_id, hostname, DataParallel};

/// Environment variable naming where engine state lives (a `file://`
/// directory or a `redis://` server).
pub const URI_ENV: &str = "AGENTIC_ENGINE_STATE_URI";
/// Where engine state lives by default: a directory in `/dev/shm`.
pub const DEFAULT_URI: &str = "file:///dev/shm/agentic_engine_state";
/// Environment variable holding the engine id.
pub const ENGINE_ID_ENV: &str = "AGENTIC_WORKER_ID";
/// Environment variable holding the publish (and heartbeat) period in ms.
pub const PERIOD_ENV: &str = "AGENTIC_ENGINE_STATE_PERIOD_MS";
/// Default publish (and heartbeat) period in ms.
pub const DEFAULT_PERIOD_MS: u64 = 50;
/// Environment variable holding a shared-memory file's mode (octal, e.g. `644`).
pub const FILE_MODE_ENV: &str = "AGENTIC_ENGINE_STATE_FILE_MODE";
/// Default mode of a shared-memory file: the owner reads and writes.
pub const DEFAULT_FILE_MODE: u32 = 0o600;
/// Default staleness threshold in ms: a heartbeat older than this makes an
/// engine stale (the heartbeat policy's number, in the unit of the flags).
pub const DEFAULT_STALE_AFTER_MS: u64 =
    engine_state_shm_format::heartbeat::DEFAULT_STALE_AFTER.as_millis() as u64;

/// The value of the environment variable `name`, unless unset or blank.
pub fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

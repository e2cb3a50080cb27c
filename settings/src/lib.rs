//! engine-state's settings, in one place (README.md, "Configuration"): the
//! environment variables every component reads, their defaults, the engine-id
//! rule ([`engine_id`]), what in a URI is a secret ([`redact`]), where engine
//! state lives ([`StateUri`], parsed at the scheme level) and, with the `cli`
//! feature, the command-line flags the binaries share ([`cli`]). Explicit
//! values (flags, arguments) always win over the environment, which wins over
//! the defaults.

mod engine_id;
mod redact;
mod uri;

#[cfg(feature = "cli")]
pub mod cli;

pub use engine_id::{default_engine_id, engine_id, fallback_engine_id, hostname, DataParallel};
pub use redact::{is_secret_parameter, redact, VISIBLE_PARAMETERS};
pub use uri::{BadUri, NoRedis, RedisUri, StateUri};

/// Environment variable naming where engine state lives (a `file://`
/// directory or a `redis://` server).
pub const URI_ENV: &str = "AGENTIC_ENGINE_STATE_URI";
/// Where engine state lives by default: a directory in `/dev/shm`.
pub const DEFAULT_URI: &str = "file:///dev/shm/agentic_engine_state";
/// Environment variable holding the engine id.
pub const ENGINE_ID_ENV: &str = "AGENTIC_WORKER_ID";
/// Environment variable holding the publish (and heartbeat) period in ms.
pub const PERIOD_ENV: &str = "AGENTIC_ENGINE_STATE_PERIOD_MS";
/// Default publish (and heartbeat) period in ms: the heartbeat policy's
/// number (shm-format owns it, as `WriterOptions::default` uses it), in the
/// unit of the variable.
pub const DEFAULT_PERIOD_MS: u64 =
    engine_state_shm_format::heartbeat::DEFAULT_PUBLISH_PERIOD.as_millis() as u64;
/// Environment variable holding a shared-memory file's mode (octal, e.g. `644`).
pub const FILE_MODE_ENV: &str = "AGENTIC_ENGINE_STATE_FILE_MODE";
/// Default mode of a shared-memory file: the owner reads and writes
/// (shm-format owns it, as `WriterOptions::default` uses it).
pub use engine_state_shm_format::DEFAULT_FILE_MODE;
/// Default staleness threshold in ms: a heartbeat older than this makes an
/// engine stale (the heartbeat policy's number, in the unit of the flags).
pub const DEFAULT_STALE_AFTER_MS: u64 =
    engine_state_shm_format::heartbeat::DEFAULT_STALE_AFTER.as_millis() as u64;

/// Environment variable naming the Redis server esagent relays to (its
/// `--redis`; a password is safer here than on the command line).
pub const REDIS_URI_ENV: &str = "AGENTIC_ENGINE_STATE_REDIS_URI";
/// Environment variable holding esagent's change-detection interval in µs
/// (its `--poll-us`).
pub const AGENT_POLL_ENV: &str = "AGENTIC_ENGINE_STATE_AGENT_POLL_US";
/// Default of esagent's `--poll-us`: keeps publish → visible via the agent
/// under 2 ms (p99, loopback) at a few percent of a core for a thousand
/// engines.
pub const DEFAULT_AGENT_POLL_US: u64 = 1000;
/// Environment variable holding the address of esagent's `/metrics` and
/// `/healthz` (its `--listen`).
pub const AGENT_LISTEN_ENV: &str = "AGENTIC_ENGINE_STATE_AGENT_LISTEN";
/// Default address of esagent's `/metrics` and `/healthz`.
pub const DEFAULT_AGENT_LISTEN: &str = "127.0.0.1:9464";
/// Environment variable holding esagent's grace in seconds before it
/// removes a dead writer's file (its `--cleanup-grace-s`; 0: never).
pub const CLEANUP_GRACE_ENV: &str = "AGENTIC_ENGINE_STATE_CLEANUP_GRACE_S";

/// The value of the environment variable `name`, unless unset or blank. A
/// value that is not UTF-8 is an error, never taken for unset: a worker id
/// or URI set to bytes this process cannot read must not silently become
/// the default.
pub fn env(name: &str) -> Result<Option<String>, NotUnicode> {
    match std::env::var(name) {
        Ok(value) => Ok(Some(value).filter(|v| !v.trim().is_empty())),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(value)) => Err(NotUnicode {
            name: name.to_owned(),
            value: std::os::unix::ffi::OsStrExt::as_bytes(value.as_os_str())
                .escape_ascii()
                .to_string(),
        }),
    }
}

/// An environment variable set to bytes that are not UTF-8.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotUnicode {
    /// The variable.
    pub name: String,
    /// Its bytes, escaped (`\xff`) so they can be shown.
    pub value: String,
}

impl NotUnicode {
    /// What to do about it, for messages that show the value their own way.
    pub const ADVICE: &'static str = "set it to a UTF-8 value, or unset it for the default";
}

impl std::fmt::Display for NotUnicode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}=\"{}\" is not UTF-8: {}",
            self.name,
            // A URI's credentials stay hidden here too.
            redact(&self.value),
            NotUnicode::ADVICE
        )
    }
}

impl std::error::Error for NotUnicode {}

//! Publisher settings: arguments win over the environment (README.md,
//! "Configuration").

use std::time::Duration;

use engine_state_redis::StateUri;
use engine_state_settings::{env, hostname, DEFAULT_FILE_MODE, DEFAULT_PERIOD_MS};
use engine_state_shm_format::EngineId;

use crate::error::Error;

pub use engine_state_settings::{default_engine_id, ENGINE_ID_ENV, FILE_MODE_ENV, PERIOD_ENV};

/// Default publish period.
pub const DEFAULT_PERIOD: Duration = Duration::from_millis(DEFAULT_PERIOD_MS);

/// Everything a [`crate::Publisher`] needs.
#[derive(Clone, Debug)]
pub struct PublisherConfig {
    /// Where to publish.
    pub uri: StateUri,
    /// The engine's id.
    pub engine_id: EngineId,
    /// The heartbeat (and capture) period.
    pub period: Duration,
    /// Permission bits of a shared-memory file.
    pub file_mode: u32,
}

impl PublisherConfig {
    /// Builds the configuration from explicit values, falling back to the
    /// environment, then to the defaults (engine id: `<hostname>-<pid>`, see
    /// [`engine_state_settings::engine_id`]).
    pub fn resolve(
        uri: Option<&str>,
        engine_id: Option<&str>,
        period_ms: Option<u64>,
        file_mode: Option<u32>,
    ) -> Result<PublisherConfig, Error> {
        let uri = StateUri::from_flag_or_env(uri)?;
        // An environment value that is not UTF-8 is a configuration error,
        // never the default.
        let env = |name| {
            env(name).map_err(|e| Error::Config {
                what: e.to_string(),
            })
        };
        let engine_id = match engine_id {
            Some(id) => EngineId::new(id)?,
            None => EngineId::new(&engine_state_settings::engine_id(
                env(ENGINE_ID_ENV)?.as_deref(),
                None,
                &hostname(),
                std::process::id(),
            ))?,
        };
        let period_ms = match period_ms {
            Some(ms) => ms,
            None => match env(PERIOD_ENV)? {
                Some(text) => text.trim().parse().map_err(|_| Error::Config {
                    what: format!("{PERIOD_ENV}={text:?} is not a whole number of milliseconds"),
                })?,
                None => DEFAULT_PERIOD.as_millis() as u64,
            },
        };
        if !(1..=60_000).contains(&period_ms) {
            return Err(Error::Config {
                what: format!("publish period {period_ms} ms is outside 1..=60000 ms (default 50)"),
            });
        }
        let file_mode = match file_mode {
            Some(mode) => mode,
            None => match env(FILE_MODE_ENV)? {
                Some(text) => u32::from_str_radix(text.trim(), 8).map_err(|_| Error::Config {
                    what: format!(
                        "{FILE_MODE_ENV}={text:?} is not an octal mode such as 600 or 644"
                    ),
                })?,
                None => DEFAULT_FILE_MODE,
            },
        };
        if file_mode & !0o777 != 0 || file_mode & 0o600 != 0o600 {
            return Err(Error::Config {
                what: format!(
                    "file mode {file_mode:o} must be permission bits (at most 777) that let the owner \
                     read and write (at least 600)"
                ),
            });
        }
        Ok(PublisherConfig {
            uri,
            engine_id,
            period: Duration::from_millis(period_ms),
            file_mode,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/FORMAT.md states one default period, checked against the
    /// writer's default (reader/tests/format_doc.rs).
    #[test]
    fn default_period_is_the_writers() {
        let writer = engine_state_shm_format::WriterOptions::default();
        assert_eq!(DEFAULT_PERIOD, writer.publish_period);
    }

    #[test]
    fn explicit_values_are_validated() {
        let config =
            PublisherConfig::resolve(Some("file:///tmp/x"), Some("e0"), Some(20), Some(0o644))
                .unwrap();
        assert_eq!(config.engine_id.as_str(), "e0");
        assert_eq!(config.period, Duration::from_millis(20));
        assert_eq!(config.file_mode, 0o644);
        let err = |r: Result<PublisherConfig, Error>| r.unwrap_err().to_string();
        assert!(err(PublisherConfig::resolve(
            Some("file:///tmp/x"),
            Some("../x"),
            None,
            None
        ))
        .contains("invalid engine id"));
        assert!(err(PublisherConfig::resolve(
            Some("nope"),
            Some("e"),
            None,
            None
        ))
        .contains("bad engine-state URI"));
        assert!(err(PublisherConfig::resolve(
            Some("/tmp"),
            Some("e"),
            Some(0),
            None
        ))
        .contains("1..=60000"));
        assert!(err(PublisherConfig::resolve(
            Some("/tmp"),
            Some("e"),
            None,
            Some(0o400)
        ))
        .contains("at least 600"));
    }

    #[test]
    fn default_id_is_valid_and_host_unique() {
        let id = default_engine_id();
        assert!(EngineId::new(&id).is_ok(), "{id}");
        assert!(id.ends_with(&format!("-{}", std::process::id())));
    }
}

//! Where engine state lives: `file://` directories and `redis://` servers (DESIGN §4, §7, §9).

use std::fmt;
use std::path::PathBuf;

#[cfg(feature = "redis")]
use engine_state_redis::RedisTarget;
use engine_state_settings::redact;

use crate::error::Error;

pub use engine_state_settings::{DEFAULT_URI, URI_ENV};

/// A parsed engine-state URI.
#[derive(Clone, PartialEq, Eq)]
pub enum StateUri {
    /// `file:///abs/dir` (or a bare absolute path): one file per engine.
    Shm {
        /// The directory.
        dir: PathBuf,
    },
    /// `redis://[user:pass@]host:port/db[?prefix=P&ttl_ms=N]` or `rediss://…`
    /// (TLS), with the default `redis` feature.
    #[cfg(feature = "redis")]
    Redis {
        /// The server, database, prefix and expiry, parsed and checked;
        /// its `Display` hides the password.
        target: RedisTarget,
    },
}

impl StateUri {
    /// Parses `uri`; errors say which forms are accepted.
    pub fn parse(uri: &str) -> Result<StateUri, Error> {
        let uri = uri.trim();
        let bad = |why: &str| Error::BadUri {
            uri: redact(uri),
            reason: why.to_owned(),
        };
        // A file URI (or path) names a directory and nothing else: a query
        // would become part of the directory's name, and with it any secret
        // in it (`?password=…`) would be shown wherever the directory is.
        let is_file = uri.starts_with("file://") || uri.starts_with('/');
        if is_file && uri.contains('?') {
            return Err(bad(
                "a query is not allowed in a file URI (a '?' would become part of the \
                 directory's name): give the directory alone, as in \
                 file:///dev/shm/agentic_engine_state, and rename a directory whose name has a '?'",
            ));
        }
        if let Some(rest) = uri.strip_prefix("file://") {
            // file:///abs/path (empty authority) or file://localhost/abs/path
            let path = rest.strip_prefix("localhost").unwrap_or(rest);
            if !path.starts_with('/') {
                return Err(bad(
                    "a file URI needs an absolute path, as in file:///dev/shm/agentic_engine_state",
                ));
            }
            return Ok(StateUri::Shm {
                dir: PathBuf::from(path),
            });
        }
        if uri.starts_with('/') {
            return Ok(StateUri::Shm {
                dir: PathBuf::from(uri),
            });
        }
        if uri.starts_with("redis://") || uri.starts_with("rediss://") {
            let rest = uri.split_once("://").map(|(_, r)| r).unwrap_or("");
            let host_part = rest.rsplit_once('@').map(|(_, h)| h).unwrap_or(rest);
            let host = host_part.split(['/', '?']).next().unwrap_or("");
            if host.is_empty() {
                return Err(bad(
                    "a Redis URI needs a host, as in redis://127.0.0.1:6379/0",
                ));
            }
            // Port, database, prefix and TTL are checked now, not at first use.
            #[cfg(feature = "redis")]
            return Ok(StateUri::Redis {
                target: RedisTarget::parse(uri)?,
            });
            #[cfg(not(feature = "redis"))]
            return Err(bad(
                "this build has no Redis support: rebuild engine-state-reader with its `redis` \
                 feature (on by default), or use file:///dir (shared memory)",
            ));
        }
        if uri.is_empty() {
            return Err(bad("it is empty"));
        }
        Err(bad(
            "use file:///dir (shared memory) or redis://host:port/db (Redis)",
        ))
    }

    /// The URI from `AGENTIC_ENGINE_STATE_URI`, or the default.
    /// A value that is not UTF-8 is refused, not taken for unset.
    pub fn from_env() -> Result<StateUri, Error> {
        match engine_state_settings::env(URI_ENV) {
            Ok(Some(value)) => StateUri::parse(&value),
            Ok(None) => StateUri::parse(DEFAULT_URI),
            Err(e) => Err(not_unicode(&e)),
        }
    }

    /// `uri` when given (a flag wins over the environment), else [`StateUri::from_env`].
    pub fn from_flag_or_env(uri: Option<&str>) -> Result<StateUri, Error> {
        match uri {
            Some(uri) => StateUri::parse(uri),
            None => StateUri::from_env(),
        }
    }
}

/// The error for a URI variable that is not UTF-8: its value (redacted)
/// shown once, as the URI.
fn not_unicode(e: &engine_state_settings::NotUnicode) -> Error {
    Error::BadUri {
        uri: redact(&e.value),
        reason: format!(
            "{} is not UTF-8: {}",
            e.name,
            engine_state_settings::NotUnicode::ADVICE
        ),
    }
}

impl fmt::Display for StateUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // Parsing refuses queries, but a `Shm` built directly may hold
            // any path: shown through the same rule as every URI.
            StateUri::Shm { dir } => f.write_str(&redact(&format!("file://{}", dir.display()))),
            #[cfg(feature = "redis")]
            StateUri::Redis { target } => write!(f, "{target}"),
        }
    }
}

impl fmt::Debug for StateUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StateUri({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_file_uris_and_paths() {
        let shm = |d: &str| StateUri::Shm {
            dir: PathBuf::from(d),
        };
        assert_eq!(
            StateUri::parse(DEFAULT_URI).unwrap(),
            shm("/dev/shm/agentic_engine_state")
        );
        assert_eq!(
            StateUri::parse("file://localhost/tmp/x").unwrap(),
            shm("/tmp/x")
        );
        assert_eq!(StateUri::parse(" /tmp/y ").unwrap(), shm("/tmp/y"));
        assert_eq!(
            StateUri::parse("file:///tmp/x").unwrap().to_string(),
            "file:///tmp/x"
        );
    }

    #[cfg(feature = "redis")]
    #[test]
    fn parses_redis_uris_and_hides_passwords() {
        let uri = StateUri::parse("redis://user:s3cret@10.0.0.1:6379/2").unwrap();
        assert!(matches!(uri, StateUri::Redis { .. }));
        assert_eq!(uri.to_string(), "redis://user:***@10.0.0.1:6379/2");
        assert!(!format!("{uri:?}").contains("s3cret"));
        assert!(!format!(
            "{}",
            StateUri::parse("redis://:pw@h:1/0?prefix=p:").unwrap()
        )
        .contains("pw"));
    }

    #[test]
    fn refuses_bad_uris_with_guidance() {
        for (uri, hint) in [
            ("", "empty"),
            ("file://relative/dir", "absolute path"),
            ("http://x", "file:///dir"),
            ("relative/dir", "file:///dir"),
            ("redis://", "needs a host"),
            ("redis://user:pw@/0", "needs a host"),
            (
                "file:///dev/shm/x?password=pw",
                "query is not allowed in a file URI",
            ),
            (
                "file:///dev/shm/x?token=pw&a=b",
                "query is not allowed in a file URI",
            ),
            ("/dev/shm/x?secret=pw", "query is not allowed in a file URI"),
            (
                "file://localhost/x?api_key=pw#f",
                "query is not allowed in a file URI",
            ),
        ] {
            let err = StateUri::parse(uri).unwrap_err().to_string();
            assert!(err.contains(hint), "{uri:?}: {err}");
            assert!(!err.contains("pw@"), "password leaked: {err}");
            assert!(!err.contains("=pw"), "query secret leaked: {err}");
        }
    }

    #[test]
    fn a_uri_variable_that_is_not_utf8_is_shown_once_and_redacted() {
        let e = engine_state_settings::NotUnicode {
            name: URI_ENV.to_owned(),
            value: r"file:///d\xfe?token=t".to_owned(),
        };
        let text = not_unicode(&e).to_string();
        assert_eq!(text.matches("xfe").count(), 1, "{text}");
        assert!(text.contains(URI_ENV) && !text.contains("=t"), "{text}");
    }

    #[test]
    fn an_at_sign_in_a_directory_name_is_shown_as_it_is() {
        let uri = StateUri::parse("file:///dev/shm/a:b@c").unwrap();
        assert_eq!(uri.to_string(), "file:///dev/shm/a:b@c");
    }

    #[test]
    fn a_directory_built_with_a_query_is_shown_redacted() {
        let uri = StateUri::Shm {
            dir: PathBuf::from("/tmp/x?password=hunter2"),
        };
        assert_eq!(uri.to_string(), "file:///tmp/x?password=***");
        assert!(!format!("{uri:?}").contains("hunter2"));
    }
}

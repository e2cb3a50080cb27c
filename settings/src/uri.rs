//! Where engine state lives: `file://` directories and `redis://` servers
//! (docs/ARCHITECTURE.md, "Crates"; docs/REDIS.md).
//!
//! This crate parses a URI at the scheme level: a file URI into its
//! directory, a Redis URI into whatever type the caller names for it
//! ([`RedisUri`]). `engine-state-redis` implements that for its
//! `RedisTarget` (server, database, prefix, TTL, checked at parse time), so
//! the rule for every scheme has one owner here while the Redis crate, which
//! depends on this one, owns what a Redis URI means. Without Redis support a
//! program names [`NoRedis`], which refuses every Redis URI.

use std::fmt;
use std::path::PathBuf;

use crate::redact;
use crate::{DEFAULT_URI, URI_ENV};

/// A parsed engine-state URI. `R` is the parsed Redis part: `RedisTarget`
/// (`engine_state_redis::StateUri`, re-exported by the reader as
/// `engine_state_reader::StateUri`), or [`NoRedis`] in a build without Redis.
#[derive(Clone, PartialEq, Eq)]
pub enum StateUri<R> {
    /// `file:///abs/dir` (or a bare absolute path): one file per engine.
    Shm {
        /// The directory.
        dir: PathBuf,
    },
    /// `redis://[user:pass@]host:port/db[?prefix=P&ttl_ms=N]` or `rediss://…`
    /// (TLS).
    Redis {
        /// The server, database, prefix and expiry, parsed and checked;
        /// its `Display` hides the password.
        target: R,
    },
}

/// How a Redis URI (`redis://` or `rediss://`, with a host) becomes the
/// Redis part of a [`StateUri`].
pub trait RedisUri: Sized {
    /// Parses and checks `uri` (trimmed; it starts with `redis://` or
    /// `rediss://` and names a host). Errors hide the password.
    fn parse_redis_uri(uri: &str) -> Result<Self, BadUri>;
}

/// The Redis part of a [`StateUri`] in a build without Redis support: there
/// is none (no value of this type exists), and parsing a Redis URI says how
/// to get it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NoRedis {}

impl RedisUri for NoRedis {
    fn parse_redis_uri(uri: &str) -> Result<Self, BadUri> {
        Err(BadUri::new(
            uri,
            "this build has no Redis support: rebuild engine-state-reader with its `redis` \
             feature (on by default), or use file:///dir (shared memory)",
        ))
    }
}

impl fmt::Display for NoRedis {
    fn fmt(&self, _: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {}
    }
}

/// A URI that cannot be parsed: which forms are accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadUri {
    /// The URI, credentials hidden.
    pub uri: String,
    /// What is wrong and which forms work.
    pub reason: String,
}

impl BadUri {
    /// The error for `uri` (shown redacted) and `reason`.
    pub fn new(uri: &str, reason: &str) -> BadUri {
        BadUri {
            uri: redact(uri),
            reason: reason.to_owned(),
        }
    }
}

impl fmt::Display for BadUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad engine-state URI {:?}: {}", self.uri, self.reason)
    }
}

impl std::error::Error for BadUri {}

impl<R: RedisUri> StateUri<R> {
    /// Parses `uri`; errors say which forms are accepted.
    pub fn parse(uri: &str) -> Result<StateUri<R>, BadUri> {
        let uri = uri.trim();
        let bad = |why: &str| BadUri::new(uri, why);
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
            return Ok(StateUri::Redis {
                target: R::parse_redis_uri(uri)?,
            });
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
    pub fn from_env() -> Result<StateUri<R>, BadUri> {
        match crate::env(URI_ENV) {
            Ok(Some(value)) => StateUri::parse(&value),
            Ok(None) => StateUri::parse(DEFAULT_URI),
            Err(e) => Err(not_unicode(&e)),
        }
    }

    /// `uri` when given (a flag wins over the environment), else [`StateUri::from_env`].
    pub fn from_flag_or_env(uri: Option<&str>) -> Result<StateUri<R>, BadUri> {
        match uri {
            Some(uri) => StateUri::parse(uri),
            None => StateUri::from_env(),
        }
    }
}

/// The error for a URI variable that is not UTF-8: its value (redacted)
/// shown once, as the URI.
fn not_unicode(e: &crate::NotUnicode) -> BadUri {
    BadUri {
        uri: redact(&e.value),
        reason: format!("{} is not UTF-8: {}", e.name, crate::NotUnicode::ADVICE),
    }
}

impl<R: fmt::Display> fmt::Display for StateUri<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // Parsing refuses queries, but a `Shm` built directly may hold
            // any path: shown through the same rule as every URI.
            StateUri::Shm { dir } => f.write_str(&redact(&format!("file://{}", dir.display()))),
            StateUri::Redis { target } => write!(f, "{target}"),
        }
    }
}

impl<R: fmt::Display> fmt::Debug for StateUri<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StateUri({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Redis part that keeps the URI, redacted: the parser's own tests
    /// need no Redis crate (`RedisTarget`'s are in redis/src/target.rs and
    /// reader/src/uri.rs).
    #[derive(Clone, Debug, PartialEq, Eq)]
    struct Text(String);

    impl RedisUri for Text {
        fn parse_redis_uri(uri: &str) -> Result<Self, BadUri> {
            Ok(Text(redact(uri)))
        }
    }

    impl fmt::Display for Text {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(&self.0)
        }
    }

    type Uri = StateUri<Text>;

    #[test]
    fn parses_file_uris_and_paths() {
        let shm = |d: &str| Uri::Shm {
            dir: PathBuf::from(d),
        };
        assert_eq!(
            Uri::parse(DEFAULT_URI).unwrap(),
            shm("/dev/shm/agentic_engine_state")
        );
        assert_eq!(Uri::parse("file://localhost/tmp/x").unwrap(), shm("/tmp/x"));
        assert_eq!(Uri::parse(" /tmp/y ").unwrap(), shm("/tmp/y"));
        assert_eq!(
            Uri::parse("file:///tmp/x").unwrap().to_string(),
            "file:///tmp/x"
        );
    }

    #[test]
    fn hands_redis_uris_to_the_redis_part_trimmed() {
        assert_eq!(
            Uri::parse(" redis://u:pw@h:1/0 ").unwrap(),
            Uri::Redis {
                target: Text("redis://u:***@h:1/0".into())
            }
        );
    }

    #[test]
    fn without_redis_a_redis_uri_says_how_to_get_it() {
        let err = StateUri::<NoRedis>::parse("redis://:pw@h:1/0")
            .unwrap_err()
            .to_string();
        assert!(err.contains("no Redis support"), "{err}");
        assert!(!err.contains("pw@"), "{err}");
        assert!(StateUri::<NoRedis>::parse("/tmp/x").is_ok());
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
            let err = Uri::parse(uri).unwrap_err().to_string();
            assert!(err.contains(hint), "{uri:?}: {err}");
            assert!(!err.contains("pw@"), "password leaked: {err}");
            assert!(!err.contains("=pw"), "query secret leaked: {err}");
        }
    }

    #[test]
    fn a_uri_variable_that_is_not_utf8_is_shown_once_and_redacted() {
        let e = crate::NotUnicode {
            name: URI_ENV.to_owned(),
            value: r"file:///d\xfe?token=t".to_owned(),
        };
        let text = not_unicode(&e).to_string();
        assert_eq!(text.matches("xfe").count(), 1, "{text}");
        assert!(text.contains(URI_ENV) && !text.contains("=t"), "{text}");
    }

    #[test]
    fn an_at_sign_in_a_directory_name_is_shown_as_it_is() {
        let uri = Uri::parse("file:///dev/shm/a:b@c").unwrap();
        assert_eq!(uri.to_string(), "file:///dev/shm/a:b@c");
    }

    #[test]
    fn a_directory_built_with_a_query_is_shown_redacted() {
        let uri = Uri::Shm {
            dir: PathBuf::from("/tmp/x?password=hunter2"),
        };
        assert_eq!(uri.to_string(), "file:///tmp/x?password=***");
        assert!(!format!("{uri:?}").contains("hunter2"));
    }
}

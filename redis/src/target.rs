//! Which Redis server, database and key prefix a `redis://` URI names, and
//! how to connect to it (docs/REDIS.md, "URIs").

use std::fmt;
use std::time::{Duration, Instant};

use engine_state_shm_format::heartbeat::DEFAULT_STALE_AFTER;

use crate::error::Error;
use crate::redact::{is_secret_parameter, redact};

/// Key prefix when the URI has no `?prefix=`.
pub const DEFAULT_PREFIX: &str = "engine_state:";
/// Expiry of an engine's key when the URI has no `?ttl_ms=`: the default
/// `stale_after`, so a key outlives its last heartbeat by exactly that.
pub const DEFAULT_TTL: Duration = DEFAULT_STALE_AFTER;
/// How long a writer's connection attempt, command or reply may take when
/// the URI has no `?timeout_ms=` (publisher sink, node agent).
pub const NETWORK_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a reader's connection attempt or read may take when the URI has
/// no `?timeout_ms=`: well under the default `stale_after` (2 s), so that a
/// paused or unreachable server costs a router at most this per read (and
/// nothing during the reconnection backoff that follows).
pub const READ_TIMEOUT: Duration = Duration::from_millis(500);
/// The range `?timeout_ms=` accepts.
const TIMEOUT_MS_RANGE: std::ops::RangeInclusive<u64> = 10..=60_000;

/// A parsed `redis://` or `rediss://` URI.
///
/// `redis://[user:password@]host[:port][/db][?prefix=P&ttl_ms=N&timeout_ms=T]`:
/// `prefix` (default `engine_state:`) separates fleets sharing one server;
/// `ttl_ms` (default 2000) is how long a publisher's key outlives its last
/// write; `timeout_ms` bounds every connection attempt and every reply
/// (default [`READ_TIMEOUT`] for readers, [`NETWORK_TIMEOUT`] for writers).
/// `rediss://` connects with TLS (add `#insecure` to skip certificate
/// checks, for tests only). `Display` and every error hide the password.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisTarget {
    /// The URI as given, password hidden.
    display: String,
    /// What redis-rs connects to: the URI without our query parameters.
    connect_url: String,
    /// The password, to scrub from any error text.
    password: Option<String>,
    prefix: String,
    ttl: Duration,
    /// `?timeout_ms=`, when given.
    timeout: Option<Duration>,
    /// The timeout when the URI gives none (readers and writers differ).
    default_timeout: Duration,
}

impl RedisTarget {
    /// Parses and checks `uri` (no connection is made).
    pub fn parse(uri: &str) -> Result<RedisTarget, Error> {
        let uri = uri.trim();
        let bad = |reason: String| Error::BadUri {
            uri: redact(uri),
            reason,
        };
        let (base, query) = match uri.split_once('?') {
            Some((base, rest)) => {
                // A fragment (#insecure) comes after the query: keep it on the base.
                let (query, fragment) = match rest.split_once('#') {
                    Some((q, f)) => (q, Some(f)),
                    None => (rest, None),
                };
                let base = match fragment {
                    Some(f) => format!("{base}#{f}"),
                    None => base.to_owned(),
                };
                (base, query)
            }
            None => (uri.to_owned(), ""),
        };
        let mut prefix = DEFAULT_PREFIX.to_owned();
        let mut ttl = DEFAULT_TTL;
        let mut timeout = None;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match name {
                "prefix" => {
                    if value.is_empty()
                        || value.len() > 64
                        || !value
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"._:-/{}".contains(&b))
                    {
                        return Err(bad(format!(
                            "prefix {value:?} must be 1 to 64 characters: letters, digits and . _ : - / {{ }}, \
                             e.g. ?prefix=fleet-a:"
                        )));
                    }
                    prefix = value.to_owned();
                }
                "ttl_ms" => {
                    ttl = match value.parse::<u64>() {
                        Ok(ms) if (10..=3_600_000).contains(&ms) => Duration::from_millis(ms),
                        _ => {
                            return Err(bad(format!(
                                "ttl_ms={value:?} must be a whole number of milliseconds in \
                                 10..=3600000 (default 2000)"
                            )))
                        }
                    }
                }
                "timeout_ms" => {
                    timeout = match value.parse::<u64>() {
                        Ok(ms) if TIMEOUT_MS_RANGE.contains(&ms) => Some(Duration::from_millis(ms)),
                        _ => {
                            return Err(bad(format!(
                                "timeout_ms={value:?} must be a whole number of milliseconds in \
                                 10..=60000 (default 500 for readers, 1000 for writers)"
                            )))
                        }
                    }
                }
                other => {
                    // The name only: the value may be a credential (?password=...).
                    let hint = if is_secret_parameter(other) {
                        "; give the password in the URI's user part, \
                         redis://user:PASSWORD@host:port/db"
                    } else {
                        ""
                    };
                    return Err(bad(format!(
                        "unknown parameter {other:?}; the parameters are prefix (default \
                         {DEFAULT_PREFIX}), ttl_ms (default 2000) and timeout_ms{hint}"
                    )));
                }
            }
        }
        let password = password_of(&base);
        // redis-rs parses the rest (host, port, db, user, password, TLS);
        // its messages never contain the password, and we scrub them anyway.
        if cfg!(not(feature = "tls")) && base.starts_with("rediss://") {
            return Err(bad(
                "this build has no TLS support: rebuild engine-state-reader with its `tls` \
                 feature (on by default), or use redis://"
                    .to_owned(),
            ));
        }
        let info = redis::IntoConnectionInfo::into_connection_info(base.as_str()).map_err(|e| {
            bad(format!(
                "{}; the form is redis://[user:password@]host[:port][/db][?prefix=P] (rediss:// for TLS)",
                scrub(&e.to_string(), password.as_deref())
            ))
        })?;
        if matches!(info.addr(), redis::ConnectionAddr::Unix(_)) {
            return Err(bad(
                "Unix sockets are not supported; use redis://host:port/db".to_owned(),
            ));
        }
        Ok(RedisTarget {
            display: redact(uri),
            connect_url: base,
            password,
            prefix,
            ttl,
            timeout,
            default_timeout: NETWORK_TIMEOUT,
        })
    }

    /// The same target with [`READ_TIMEOUT`] as its timeout unless the URI
    /// gives one (what [`crate::RedisSource`] uses).
    pub fn for_reading(mut self) -> RedisTarget {
        self.default_timeout = READ_TIMEOUT;
        self
    }

    /// How long a connection attempt or a reply may take: `?timeout_ms=`, else
    /// [`NETWORK_TIMEOUT`] ([`READ_TIMEOUT`] after [`RedisTarget::for_reading`]).
    pub fn timeout(&self) -> Duration {
        self.timeout.unwrap_or(self.default_timeout)
    }

    /// The key prefix (default `engine_state:`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// How long a publisher's key outlives its last write (`?ttl_ms=`, default 2 s).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Connects (and authenticates), then sends `PING`, all within
    /// [`RedisTarget::timeout`]: a server that wants a password nobody gave
    /// only says so at the first command, and that should fail here, clearly;
    /// a paused server (whose kernel still accepts connections) fails with
    /// "timed out". The connection keeps that timeout for every reply.
    pub fn connect(&self) -> Result<redis::Connection, Error> {
        let con = self.connect_by(Instant::now() + self.timeout())?;
        con.set_read_timeout(Some(self.timeout()))
            .and_then(|()| con.set_write_timeout(Some(self.timeout())))
            .map_err(|e| self.error("cannot set timeouts", &e))?;
        Ok(con)
    }

    /// [`RedisTarget::connect`] finished by `deadline` (connect, `PING`):
    /// the reader's [`crate::RedisSource`] connects and reads within one
    /// deadline per read. The socket timeouts are left at what was left;
    /// [`query_by`] sets them again before each wait.
    pub(crate) fn connect_by(&self, deadline: Instant) -> Result<redis::Connection, Error> {
        #[cfg(feature = "tls")]
        {
            // rustls needs one process-wide crypto provider; ring is the one
            // this crate builds. Already installed (by us or the host
            // program) is fine.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let info = redis::IntoConnectionInfo::into_connection_info(self.connect_url.as_str())
            .map_err(|e| self.error("cannot use the URI", &e))?;
        // No `CLIENT SETINFO` at connect: on a paused server its replies
        // would be waited for one by one, each for the whole timeout.
        let settings = info.redis_settings().clone().set_skip_set_lib_name();
        let client = redis::Client::open(info.set_redis_settings(settings))
            .map_err(|e| self.error("cannot use the URI", &e))?;
        let left = time_left(deadline).map_err(|e| self.error("cannot connect", &e))?;
        let mut con = client
            .get_connection_with_timeout(left)
            .map_err(|e| self.error("cannot connect", &e))?;
        // The PING gets what is left of the deadline, so that connecting as
        // a whole takes at most `timeout`, not twice that.
        query_by(
            &mut con,
            &redis::cmd("PING").get_packed_command(),
            1,
            deadline,
        )
        .and_then(|mut replies| match replies.pop() {
            Some(redis::Value::ServerError(e)) => Err(e.into()),
            _ => Ok(()),
        })
        .map_err(|e| self.error("cannot talk to the server", &e))?;
        Ok(con)
    }

    /// An [`Error::Redis`] for `error`, password scrubbed, with a hint.
    pub fn error(&self, what: &str, error: &redis::RedisError) -> Error {
        let mut text = scrub(&error.to_string(), self.password.as_deref());
        let code = error.code().unwrap_or("");
        // A socket timeout surfaces as EAGAIN ("Resource temporarily
        // unavailable"), which reads like a refusal: say what happened.
        let timed_out = error.is_timeout()
            || text.contains("(os error 11)")
            || text.contains("Resource temporarily unavailable");
        if timed_out {
            text = format!(
                "timed out after {} ms without a reply",
                self.timeout().as_millis()
            );
        }
        let hint = if code == "WRONGPASS"
            || code == "NOAUTH"
            || error.kind() == redis::ErrorKind::AuthenticationFailed
            || text.contains("WRONGPASS")
            || text.contains("NOAUTH")
        {
            "check the user and password in the URI (redis://user:password@host:port/db)"
        } else if code == "NOPERM" || is_permission_error(&text) {
            "give this Redis user read and write access to the prefix's keys, and EVAL for \
             publishers (ACL, e.g. ~PREFIX* +ping +@read +@write +eval)"
        } else if timed_out {
            "check that Redis runs at that address, is not paused or overloaded, and that the \
             network lets you reach it (redis-cli -h HOST -p PORT ping); a slow link may need a \
             longer ?timeout_ms="
        } else if error.is_connection_refusal() || error.is_io_error() {
            "check that Redis runs at that address (redis-cli -h HOST -p PORT ping)"
        } else {
            "check the URI and the Redis server's log"
        };
        Error::Redis {
            uri: self.to_string(),
            error: format!("{what}: {text}"),
            hint,
        }
    }
}

/// Sends `request` (`count` commands) and reads their replies, all by
/// `deadline`: before the send and before each reply the socket's timeouts
/// are set to what is left of it, so that a server that stops answering
/// (paused, overloaded) costs the whole pipeline at most the deadline, not
/// the timeout once per reply (redis-rs' `req_packed_commands` waits the
/// full socket timeout for each reply of a pipeline). Stops at the first
/// failure: the connection is then out of step and must be dropped.
///
/// Setting a socket timeout is a system call; a pipeline of 2 000 replies
/// mostly served from the read buffer would pay it 2 000 times. So it is
/// set again only when [`TIMEOUT_REFRESH`] has passed since it was last set:
/// a wait then ends at most that long after the deadline.
pub fn query_by(
    con: &mut redis::Connection,
    request: &[u8],
    count: usize,
    deadline: Instant,
) -> redis::RedisResult<Vec<redis::Value>> {
    let set_timeouts = |con: &redis::Connection| -> redis::RedisResult<Instant> {
        let left = time_left(deadline)?;
        con.set_read_timeout(Some(left))?;
        con.set_write_timeout(Some(left))?;
        Ok(Instant::now())
    };
    let mut set_at = set_timeouts(con)?;
    con.send_packed_command(request)?;
    let mut replies = Vec::with_capacity(count);
    for _ in 0..count {
        if set_at.elapsed() >= TIMEOUT_REFRESH {
            set_at = set_timeouts(con)?;
        }
        replies.push(con.recv_response()?);
    }
    Ok(replies)
}

/// How stale the socket timeouts [`query_by`] sets may get: the most a wait
/// may end after the read's deadline (scheduling slack aside).
pub const TIMEOUT_REFRESH: Duration = Duration::from_millis(1);

/// What is left until `deadline` (at least 1 ms: a zero socket timeout means
/// "none"), or a timeout error when it has passed.
fn time_left(deadline: Instant) -> redis::RedisResult<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(std::io::Error::from(std::io::ErrorKind::TimedOut).into());
    }
    Ok(left.max(Duration::from_millis(1)))
}

/// Whether an error's text is the server refusing a command by its ACL
/// (`NOPERM`): the user may connect but not run that command or touch those
/// keys. Retrying does not help; granting does (the hint of
/// [`RedisTarget::error`] says what).
pub fn is_permission_error(text: &str) -> bool {
    // The server's code, or how redis-rs prints its kind ("NoPerm: this
    // user has no permissions to run the 'eval' command").
    text.contains("NOPERM") || text.contains("NoPerm:")
}

fn password_of(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let userinfo = rest.rsplit_once('@')?.0;
    let password = match userinfo.split_once(':') {
        Some((_, pw)) => pw,
        None => userinfo,
    };
    (!password.is_empty()).then(|| password.to_owned())
}

/// `text` with every occurrence of the password replaced by `***`.
fn scrub(text: &str, password: Option<&str>) -> String {
    match password {
        Some(pw) if pw.len() >= 2 => text.replace(pw, "***"),
        _ => text.to_owned(),
    }
}

/// A parsed engine-state URI whose Redis part is a [`RedisTarget`]: the
/// scheme-level rules are `engine-state-settings`' (`settings/src/uri.rs`),
/// the Redis part is parsed here. The reader re-exports it as
/// `engine_state_reader::StateUri`.
pub type StateUri = engine_state_settings::StateUri<RedisTarget>;

impl engine_state_settings::RedisUri for RedisTarget {
    fn parse_redis_uri(uri: &str) -> Result<Self, engine_state_settings::BadUri> {
        RedisTarget::parse(uri).map_err(|e| match e {
            Error::BadUri { uri, reason } => engine_state_settings::BadUri { uri, reason },
            // Parsing makes no other error; shown as a bad URI all the same.
            other => engine_state_settings::BadUri::new(uri, &other.to_string()),
        })
    }
}

impl fmt::Display for RedisTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.display)
    }
}

impl fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "RedisTarget({self}, ttl {:?}, timeout {:?})",
            self.ttl,
            self.timeout()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parameters_shown_unredacted_are_the_ones_parsed() {
        // redact shows these values and hides every other: each must be a
        // parameter this parser accepts (and none a credential).
        for name in engine_state_settings::VISIBLE_PARAMETERS {
            let uri = format!("redis://h:1/0?{name}=100");
            assert!(RedisTarget::parse(&uri).is_ok(), "{uri}");
            assert!(redact(&uri).ends_with("=100"), "{uri}");
        }
    }

    #[test]
    fn parses_server_db_prefix_and_ttl() {
        let t =
            RedisTarget::parse("redis://u:pw@127.0.0.1:6380/3?prefix=fleet-a:&ttl_ms=500").unwrap();
        assert_eq!(t.prefix(), "fleet-a:");
        assert_eq!(t.ttl(), Duration::from_millis(500));
        assert_eq!(
            t.to_string(),
            "redis://u:***@127.0.0.1:6380/3?prefix=fleet-a:&ttl_ms=500"
        );
        assert!(!format!("{t:?}").contains("pw@"));
        let d = RedisTarget::parse("redis://localhost").unwrap();
        assert_eq!((d.prefix(), d.ttl()), (DEFAULT_PREFIX, DEFAULT_TTL));
    }

    #[test]
    fn refuses_malformed_uris_without_leaking_the_password() {
        for (uri, hint) in [
            ("redis://:s3cret@h:1/notadb", "database"),
            ("redis://:s3cret@h:1/0?prefix=a b", "prefix"),
            ("redis://:s3cret@h:1/0?prefix=", "prefix"),
            ("redis://:s3cret@h:1/0?ttl_ms=0", "ttl_ms"),
            ("redis://:s3cret@h:1/0?ttl_ms=x", "ttl_ms"),
            ("redis://:s3cret@h:1/0?db=2", "unknown parameter"),
            ("redis://:s3cret@h:notaport/0", "redis://"),
        ] {
            let err = RedisTarget::parse(uri).unwrap_err().to_string();
            assert!(err.contains(hint), "{uri}: {err}");
            assert!(!err.contains("s3cret"), "password leaked: {err}");
        }
    }

    #[test]
    fn scrubs_passwords_from_text() {
        assert_eq!(scrub("a hunter2 b", Some("hunter2")), "a *** b");
        assert_eq!(password_of("redis://u:pw@h"), Some("pw".into()));
        assert_eq!(password_of("redis://pw@h"), Some("pw".into()));
        assert_eq!(password_of("redis://h:1"), None);
    }
}

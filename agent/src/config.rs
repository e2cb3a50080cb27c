//! esagent's settings: flags win over the environment (README.md,
//! "Configuration").

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser};
use engine_state_reader::StateUri;
use engine_state_redis::RedisTarget;
use engine_state_settings::cli::{StaleAfterArg, UriArg};
use engine_state_settings::{
    AGENT_LISTEN_ENV, AGENT_POLL_ENV, CLEANUP_GRACE_ENV, DEFAULT_PERIOD_MS, PERIOD_ENV,
    REDIS_URI_ENV,
};

use crate::error::Error;

/// Default address of `/metrics` and `/healthz`.
pub const DEFAULT_LISTEN: &str = engine_state_settings::DEFAULT_AGENT_LISTEN;

/// Relay every engine that publishes into this host's shared-memory directory
/// to Redis, so engines need no network client of their own; serve Prometheus
/// metrics about them. Without --redis (metrics-only mode) nothing is relayed:
/// the agent only serves /metrics and /healthz, and needs no Redis.
///
/// Every poll interval the agent checks each engine's sequence and heartbeat
/// words (one cache line, lock-free like any reader) and relays at once the
/// snapshots that changed and heartbeats nearly a period newer than the last
/// relayed; every 500 ms it reads the whole directory. Each batch goes to Redis as one pipeline. Engines whose
/// heartbeat stops are no longer written, so their keys expire and Redis
/// readers see them dead. HTTP: GET /metrics
/// (Prometheus text format), GET /healthz (503 while the directory cannot be
/// listed); at most a quarter of the open-file limit of connections at once,
/// idle ones closed after 2 s. A missing directory is created at start.
/// Stops cleanly on SIGTERM or SIGINT, within 1 s.
#[derive(Debug, Parser)]
#[command(name = "esagent", version)]
#[command(mut_arg("uri", |a| a.help(
    "The shared-memory directory the engines of this host publish into \
     (file:///dir). [default: file:///dev/shm/agentic_engine_state]"
)))]
#[command(mut_arg("stale_after_ms", |a| a.help(
    "A heartbeat older than this (ms) makes an engine stale in the metrics."
)))]
pub struct Args {
    #[command(flatten)]
    pub uri: UriArg,
    /// Where to relay: redis://[user:password@]host:port/db[?prefix=P&ttl_ms=N]
    /// or rediss://… for TLS. The key prefix separates fleets sharing one
    /// server (default engine_state:); ttl_ms is how long a key outlives its
    /// engine's last heartbeat (default 2000). With a password, prefer the
    /// environment variable: a flag is visible to every user in `ps`.
    /// Not given: metrics-only mode (no relay; /metrics and /healthz only).
    #[arg(long, env = REDIS_URI_ENV, hide_env_values = true)]
    pub redis: Option<String>,
    /// The engines' publish (and heartbeat) period, in ms: a heartbeat nine
    /// tenths of a period newer than the one relayed is relayed (what keeps the keys
    /// alive). The whole directory is read every 500 ms.
    #[arg(long, env = PERIOD_ENV, default_value_t = DEFAULT_PERIOD_MS,
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub period_ms: u64,
    /// How often the engines are checked for a new snapshot, in µs: at most
    /// this much is added to publish → visible latency. A check costs two
    /// loads from one cache line per engine; only changed engines are read
    /// and relayed.
    /// Values above the period act as the period.
    #[arg(long, env = AGENT_POLL_ENV, default_value_t = DEFAULT_POLL_US,
          value_parser = clap::value_parser!(u64).range(100..=60_000_000))]
    pub poll_us: u64,
    /// Address of the HTTP endpoints /metrics and /healthz (port 0: any free
    /// port; the chosen address is printed on stdout).
    #[arg(long, env = AGENT_LISTEN_ENV, default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// Remove the file of an engine whose writer process is gone after this
    /// many seconds (0: never, the default). Off by default because the file
    /// is the last word of a crashed engine (readers show it dead, with its
    /// last snapshot), a restarted engine replaces it anyway, and the agent
    /// can only tell a dead writer when it shares the engines' pid namespace.
    #[arg(long, env = CLEANUP_GRACE_ENV, default_value_t = 0)]
    pub cleanup_grace_s: u64,
    #[command(flatten)]
    pub stale_after: StaleAfterArg,
}

/// Default of `--poll-us` (see [`engine_state_settings::DEFAULT_AGENT_POLL_US`]).
pub const DEFAULT_POLL_US: u64 = engine_state_settings::DEFAULT_AGENT_POLL_US;

/// Everything [`crate::run`] needs.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// The shared-memory directory to watch.
    pub shm_dir: PathBuf,
    /// The Redis server, database and key prefix to relay to (None:
    /// metrics-only mode, nothing is relayed).
    pub redis: Option<RedisTarget>,
    /// The engines' period: heartbeats 9/10 of it newer than the relayed
    /// one are relayed.
    pub period: Duration,
    /// Change-detection interval (new snapshots and heartbeats are relayed
    /// within it).
    pub poll: Duration,
    /// Address of `/metrics` and `/healthz`.
    pub listen: SocketAddr,
    /// Remove files of dead writers after this long (None: never).
    pub cleanup_grace: Option<Duration>,
    /// Staleness threshold for the status gauge.
    pub stale_after: Duration,
}

impl Args {
    /// Parses the process's flags and environment, like `Args::parse()`
    /// (exits with clap's message on a bad flag), and returns warnings about
    /// how they were given: a Redis password in `--redis` on the command
    /// line, where every user of the host can read it (`ps`,
    /// `/proc/<pid>/cmdline`).
    pub fn parse_with_warnings() -> (Args, Vec<String>) {
        let matches = Args::command().get_matches();
        let args = Args::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
        let mut warnings = Vec::new();
        if matches.value_source("redis") == Some(ValueSource::CommandLine)
            && args.redis.as_deref().is_some_and(has_password)
        {
            warnings.push(format!(
                "warning: the Redis password is on the command line (--redis), where every \
                 user of this host can read it (ps, /proc/<pid>/cmdline); give the URI in \
                 {REDIS_URI_ENV} instead"
            ));
        }
        (args, warnings)
    }

    /// Checks the flags and turns them into a configuration.
    pub fn into_config(self) -> Result<AgentConfig, Error> {
        let shm_dir = match StateUri::from_flag_or_env(self.uri.uri.as_deref())? {
            StateUri::Shm { dir } => dir,
            StateUri::Redis { .. } => {
                return Err(Error::Config {
                    what: "--uri names the engines' shared-memory directory (file:///dir); \
                           give the Redis server with --redis"
                        .to_owned(),
                })
            }
        };
        let redis = match self.redis.as_deref().map(StateUri::parse).transpose()? {
            None => None,
            Some(StateUri::Redis { target }) => Some(target),
            Some(StateUri::Shm { .. }) => {
                return Err(Error::Config {
                    what: "--redis needs a redis:// or rediss:// URI (or leave it out for \
                           metrics only: no relay)"
                        .to_owned(),
                })
            }
        };
        Ok(AgentConfig {
            shm_dir,
            redis,
            period: Duration::from_millis(self.period_ms),
            poll: Duration::from_micros(self.poll_us),
            listen: self.listen,
            cleanup_grace: (self.cleanup_grace_s > 0)
                .then(|| Duration::from_secs(self.cleanup_grace_s)),
            stale_after: Duration::from_millis(self.stale_after.stale_after_ms),
        })
    }
}

/// Whether a Redis URI carries a password (`redis://[user]:password@host`,
/// or a `password=` query parameter).
fn has_password(uri: &str) -> bool {
    let rest = uri.split_once("://").map_or(uri, |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    let in_userinfo = authority
        .rsplit_once('@')
        .and_then(|(userinfo, _)| userinfo.split_once(':'))
        .is_some_and(|(_, password)| !password.is_empty());
    in_userinfo || rest.contains("password=")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<AgentConfig, Error> {
        Args::try_parse_from([&["esagent"], args].concat())
            .map_err(|e| Error::Config {
                what: e.to_string(),
            })?
            .into_config()
    }

    #[test]
    fn flags_become_a_config() {
        let config = parse(&[
            "--uri",
            "file:///tmp/engines",
            "--redis",
            "redis://:pw@127.0.0.1:6379/2?prefix=a:",
            "--period-ms",
            "20",
            "--cleanup-grace-s",
            "30",
            "--poll-us",
            "250",
        ])
        .unwrap();
        assert_eq!(config.shm_dir, PathBuf::from("/tmp/engines"));
        assert_eq!(config.redis.as_ref().unwrap().prefix(), "a:");
        assert_eq!(config.period, Duration::from_millis(20));
        assert_eq!(config.poll, Duration::from_micros(250));
        assert_eq!(config.cleanup_grace, Some(Duration::from_secs(30)));
        assert!(!format!("{config:?}").contains("pw@"));
        let off = parse(&["--uri", "/tmp/e", "--redis", "redis://h"]).unwrap();
        assert_eq!(off.cleanup_grace, None, "cleanup is off by default");
        assert_eq!(off.period, Duration::from_millis(50));
        assert_eq!(off.poll, Duration::from_micros(DEFAULT_POLL_US));
    }

    #[test]
    fn without_redis_the_agent_only_serves_metrics() {
        let config = parse(&["--uri", "/tmp/e"]).unwrap();
        assert!(config.redis.is_none());
        assert_eq!(config.shm_dir, PathBuf::from("/tmp/e"));
    }

    #[test]
    fn passwords_in_uris_are_noticed() {
        for (uri, has) in [
            ("redis://:pw@h:6379/0", true),
            ("rediss://user:pw@h/0?prefix=a:", true),
            ("redis://h:6379/0?password=pw", true),
            ("redis://user@h:6379/0", false),
            ("redis://h:6379/0?prefix=a:b@c", false),
            ("redis://h", false),
        ] {
            assert_eq!(has_password(uri), has, "{uri}");
        }
    }

    #[test]
    fn wrong_uris_are_refused_with_guidance() {
        let err = parse(&["--uri", "redis://h", "--redis", "redis://h"]).unwrap_err();
        assert!(err.to_string().contains("--redis"), "{err}");
        let err = parse(&["--uri", "/tmp/e", "--redis", "file:///x"]).unwrap_err();
        assert!(err.to_string().contains("redis://"), "{err}");
        let err = parse(&["--uri", "/tmp/e", "--redis", "redis://:pw@h/x"]).unwrap_err();
        assert!(!err.to_string().contains("pw@"), "{err}");
    }
}

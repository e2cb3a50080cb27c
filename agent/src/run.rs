//! The agent's main loop: poll and relay, metrics, health, clean shutdown.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine_state_redis::{Backoff, RedisTarget, SinkStats};
use metrics_exporter_prometheus::{PrometheusHandle, PrometheusRecorder};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::cleanup::Cleanup;
use crate::config::AgentConfig;
use crate::error::Error;
use crate::health::{self, Health};
use crate::relay::{Relay, FULL_PASS_INTERVAL};
use crate::telemetry;

/// How often the exporter drains histogram samples and drops idle gauges.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);
/// How long shutdown waits for pending writes to be acknowledged.
const SHUTDOWN_FLUSH: Duration = Duration::from_millis(900);
/// [`Agent::run`] returns at most this long after its shutdown token is
/// cancelled, even when the relay thread is stuck in a Redis call (a server
/// that stopped answering holds a read or connect for up to the network
/// timeout, on top of the flush).
pub const SHUTDOWN_LIMIT: Duration = Duration::from_secs(1);

/// A configured agent with its listener bound (so the address is known
/// before it runs, e.g. with port 0).
#[derive(Debug)]
pub struct Agent {
    config: AgentConfig,
    listener: TcpListener,
    relay: Relay,
    /// This agent's metrics (not the process's: see `telemetry::recorder`).
    recorder: PrometheusRecorder,
    /// Most HTTP connections open at once.
    max_connections: usize,
}

impl Agent {
    /// Raises the process's open-file limit to its hard limit, creates the
    /// agent's metrics recorder, binds the listener, opens the directory and
    /// starts the Redis sink (none in metrics-only mode).
    ///
    /// Each agent records into its own recorder (never the process-wide
    /// one), so several agents can run in one process.
    pub async fn bind(config: AgentConfig) -> Result<Agent, Error> {
        let max_connections = crate::http::connection_cap(raise_fd_limit());
        let recorder = telemetry::recorder();
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|io| Error::Listen {
                addr: config.listen,
                io,
            })?;
        let relay = metrics::with_local_recorder(&recorder, || Relay::new(&config))?;
        Ok(Agent {
            config,
            listener,
            relay,
            recorder,
            max_connections,
        })
    }

    /// The address `/metrics` and `/healthz` are served on.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// Relays until `shutdown` is cancelled, then writes what is pending and
    /// returns, at most [`SHUTDOWN_LIMIT`] after the cancellation (then
    /// without waiting for the relay thread: a process should exit without
    /// waiting for the runtime's blocking threads, e.g. with
    /// `Runtime::shutdown_background`).
    ///
    /// The relay runs on a thread of its own: it wakes every poll interval
    /// (sub-millisecond, which tokio's millisecond timer cannot do), and at
    /// once when `shutdown` is cancelled (see [`Pause`]).
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        let Agent {
            config,
            listener,
            relay,
            recorder,
            max_connections,
        } = self;
        if config.redis.is_none() {
            // Said at every start: a Redis URI that went missing (a secret not
            // mounted, a renamed variable) must not pass for a choice.
            tracing::warn!(
                "esagent: no --redis (nor {}): metrics-only mode, nothing is relayed to Redis; \
                 readers on other hosts will not see this host's engines",
                engine_state_settings::REDIS_URI_ENV
            );
        }
        let health = Arc::new(Health::new(FULL_PASS_INTERVAL));
        let server = tokio::spawn(crate::http::serve(
            listener,
            recorder.handle(),
            health.clone(),
            max_connections,
            shutdown.clone(),
        ));
        let relay_shutdown = shutdown.clone();
        let mut relaying = tokio::task::spawn_blocking(move || {
            let pause = Pause::new(relay_shutdown);
            // Every metric of the loop (and of the relay it drives) goes to
            // this agent's recorder: it is this thread's for the loop's length.
            metrics::with_local_recorder(&recorder, || {
                relay_loop(config, relay, &recorder.handle(), &health, &pause);
            });
        });
        let limit = async {
            shutdown.cancelled().await;
            tokio::time::sleep(SHUTDOWN_LIMIT).await;
        };
        tokio::select! {
            finished = &mut relaying => {
                if let Err(error) = finished {
                    if error.is_panic() {
                        std::panic::resume_unwind(error.into_panic());
                    }
                }
            }
            () = limit => tracing::warn!(
                "esagent: Redis did not take the pending writes within {SHUTDOWN_LIMIT:?} of \
                 the stop; stopping without them"
            ),
        }
        let _ = server.await;
        Ok(())
    }
}

/// Polls every `config.poll`, reads everything (and refreshes gauges and
/// health) every [`FULL_PASS_INTERVAL`], until `shutdown`.
fn relay_loop(
    config: AgentConfig,
    mut relay: Relay,
    metrics: &PrometheusHandle,
    health: &Health,
    pause: &Pause,
) {
    let mut cleanup = config.cleanup_grace.map(Cleanup::new);
    let mut gauges = telemetry::EngineGauges::default();
    let poll = config.poll.min(config.period);
    let start = Instant::now();
    let (mut next_poll, mut next_tick) = (start, start);
    let mut upkeep_at = start;
    let mut redis_state = RedisState {
        connected: true,
        errors: 0,
    };
    telemetry::register_counters(relay.relays());
    while !pause.is_cancelled() {
        let now = Instant::now();
        if now < next_tick {
            relay.poll();
        } else {
            // Like tokio's `MissedTickBehavior::Skip`: a late tick is not caught up.
            next_tick += FULL_PASS_INTERVAL;
            if next_tick <= now {
                next_tick = now + FULL_PASS_INTERVAL;
            }
            let report = relay.tick();
            let redis = relay
                .sink_stats()
                .map(|stats| redis_state.update(stats, config.redis.as_ref()));
            gauges.record(relay.reading(), redis.as_ref().map(|r| r.connected), now);
            if now >= upkeep_at {
                upkeep_at = now + UPKEEP_INTERVAL;
                metrics.run_upkeep();
            }
            if let Some(cleanup) = cleanup.as_mut() {
                cleanup.run(relay.shm_dir(), relay.reading(), now);
            }
            let relayed = match redis {
                Some(RedisReport {
                    connected,
                    relayed,
                    ref last_error,
                }) => format!(
                    "relayed: {relayed}\nunreadable: {}\nredis: {}\n",
                    report.read_errors,
                    health::redis_line(connected, last_error.as_deref()),
                ),
                None => format!(
                    "unreadable: {}\nredis: none (metrics only)\n",
                    report.read_errors
                ),
            };
            health.tick(
                format!("engines: {}\n{relayed}", report.engines),
                relay.directory_error().map(str::to_owned),
            );
        }
        next_poll += poll;
        let now = Instant::now();
        if next_poll <= now {
            next_poll = now + poll; // late (a long tick, or descheduled): do not catch up
        }
        // With no engines there is nothing to poll every millisecond: one
        // poll a period finds the first engine at the next listing (once a
        // second) and notices a shutdown.
        let wake = if !relay.relays() {
            next_tick // metrics only: nothing to poll
        } else if relay.reading().engines.is_empty() {
            // A poll of no engine only checks whether a listing is due.
            next_tick.min(now + config.period)
        } else {
            next_poll.min(next_tick)
        };
        pause.until(wake);
    }
    relay.shutdown(SHUTDOWN_FLUSH);
}

/// What the relay loop remembers of the sink between full passes.
#[derive(Debug)]
struct RedisState {
    connected: bool,
    /// The sink's error count, as last added to the counter.
    errors: u64,
}

/// The sink's state at one full pass.
#[derive(Clone, Debug)]
struct RedisReport {
    connected: bool,
    relayed: u64,
    last_error: Option<String>,
}

impl RedisState {
    /// Brings the relay counters up to the sink's and logs a change of
    /// connection.
    fn update(&mut self, stats: &SinkStats, redis: Option<&RedisTarget>) -> RedisReport {
        let errors = stats.errors.load(Ordering::Relaxed);
        if errors > self.errors {
            metrics::counter!(telemetry::RELAY_ERRORS).increment(errors - self.errors);
            self.errors = errors;
        }
        let connected = stats.connected.load(Ordering::Relaxed);
        let redis = redis.map_or_else(String::new, ToString::to_string);
        if connected != self.connected {
            self.connected = connected;
            if connected {
                tracing::info!("esagent: connected to Redis at {redis}");
            } else {
                let error = stats
                    .last_error()
                    .unwrap_or_else(|| format!("Redis at {redis} is not reachable yet"));
                tracing::warn!(
                    "esagent: {error}; retrying with backoff ({})",
                    Backoff::describe()
                );
            }
        }
        let relayed = stats.written.load(Ordering::Relaxed);
        metrics::counter!(telemetry::RELAYED).absolute(relayed);
        metrics::counter!(telemetry::RELAY_REFUSED).absolute(stats.refused.load(Ordering::Relaxed));
        metrics::counter!(telemetry::REGISTRY_ERRORS)
            .absolute(stats.registry_errors.load(Ordering::Relaxed));
        RedisReport {
            connected,
            relayed,
            last_error: stats.last_error(),
        }
    }
}

/// The relay thread's waits between passes, cut short by a shutdown: the
/// thread parks until its next pass, and a task of the runtime unparks it
/// when the token is cancelled.
#[derive(Debug)]
struct Pause {
    shutdown: CancellationToken,
}

impl Pause {
    /// Called on the thread that will wait, inside a tokio runtime (e.g. in
    /// `spawn_blocking`): arranges for `shutdown` to wake this thread.
    fn new(shutdown: CancellationToken) -> Pause {
        let thread = std::thread::current();
        let cancelled = shutdown.clone().cancelled_owned();
        tokio::spawn(async move {
            cancelled.await;
            // A park token left for a thread that no longer waits costs one
            // spurious wake-up of its next park, which every park allows.
            thread.unpark();
        });
        Pause { shutdown }
    }

    fn is_cancelled(&self) -> bool {
        self.shutdown.is_cancelled()
    }

    /// Waits until `deadline` or until the shutdown; true on shutdown.
    fn until(&self, deadline: Instant) -> bool {
        loop {
            // Cancelled before the park: the unpark is either still to come
            // or its token is already set, so the park cannot miss it.
            if self.is_cancelled() {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            std::thread::park_timeout(deadline - now);
        }
    }
}

/// Raises the soft limit of open files to the hard limit (the HTTP side's
/// share of it is capped, see `http::connection_cap`); returns the soft
/// limit in force.
fn raise_fd_limit() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 1024;
    };
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        return hard;
    }
    soft
}

/// Binds and runs an agent until `shutdown` is cancelled.
pub async fn run(config: AgentConfig, shutdown: CancellationToken) -> Result<(), Error> {
    Agent::bind(config).await?.run(shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each agent records into its own recorder: two in one process (one
    /// engine each) export only their own engine.
    #[tokio::test]
    async fn agents_in_one_process_keep_their_metrics_apart() {
        use clap::Parser;
        use engine_state_shm_format::{EngineId, ShmWriter, Snapshot, WriterOptions};

        let ids = ["engine-a", "engine-b"];
        let dirs = ids.map(|_| tempfile::tempdir().unwrap());
        let _writers: Vec<ShmWriter> = ids
            .iter()
            .zip(&dirs)
            .map(|(id, dir)| {
                let snapshot = Snapshot {
                    num_running: 1,
                    ..Snapshot::default()
                };
                let id = EngineId::new(id).unwrap();
                ShmWriter::create(dir.path(), &id, &WriterOptions::default(), &snapshot).unwrap()
            })
            .collect();
        let shutdown = CancellationToken::new();
        // Cancelled on a failed assert too: the runtime waits for the relay threads.
        let _stop = shutdown.clone().drop_guard();
        let (mut handles, mut runs) = (Vec::new(), Vec::new());
        for dir in &dirs {
            let uri = dir.path().to_str().unwrap();
            let args =
                crate::Args::parse_from(["esagent", "--uri", uri, "--listen", "127.0.0.1:0"]);
            let agent = Agent::bind(args.into_config().unwrap()).await.unwrap();
            handles.push(agent.recorder.handle());
            runs.push(tokio::spawn(agent.run(shutdown.clone())));
        }
        let series = |id: &str| format!(r#"engine_state_num_running{{engine="{id}"}} 1"#);
        let deadline = Instant::now() + Duration::from_secs(30);
        let texts = loop {
            let texts: Vec<String> = handles.iter().map(PrometheusHandle::render).collect();
            if texts
                .iter()
                .zip(ids)
                .all(|(text, id)| text.contains(&series(id)))
            {
                break texts;
            }
            assert!(
                Instant::now() < deadline,
                "each agent's engine in its metrics: {texts:?}"
            );
            // A poll: the relay runs on blocking threads with std `Instant`,
            // which tokio's paused clock does not drive.
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        for (text, other) in texts.iter().zip(ids.iter().rev()) {
            assert!(
                !text.contains(other),
                "another agent's engine {other}:\n{text}"
            );
            assert!(text.contains("engine_state_engines 1\n"), "{text}");
        }
        shutdown.cancel();
        for run in runs {
            run.await.unwrap().unwrap();
        }
    }

    #[tokio::test]
    async fn a_pause_ends_at_its_deadline_or_at_once_on_shutdown() {
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        // Told when the short pause is over: the shutdown comes after it
        // (an event, not a sleep that hopes the thread got there).
        let (short_over, short_is_over) = tokio::sync::oneshot::channel();
        let waiting = tokio::task::spawn_blocking(move || {
            let pause = Pause::new(token);
            let short = Instant::now() + Duration::from_millis(10);
            assert!(!pause.until(short), "not cancelled");
            assert!(Instant::now() >= short);
            short_over.send(()).unwrap();
            let started = Instant::now();
            // Twenty seconds, unless the shutdown cuts it short.
            assert!(pause.until(started + Duration::from_secs(20)));
            started.elapsed()
        });
        short_is_over.await.unwrap();
        shutdown.cancel();
        let waited = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("the pause ended with the shutdown")
            .unwrap();
        assert!(waited < Duration::from_secs(10), "{waited:?}");
    }
}

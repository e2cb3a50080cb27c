//! The agent's main loop: poll and relay, metrics, health, clean shutdown.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::cleanup::Cleanup;
use crate::config::AgentConfig;
use crate::error::Error;
use crate::health::Health;
use crate::relay::{Relay, FULL_PASS_INTERVAL};
use crate::telemetry;

/// How often the exporter drains histogram samples and drops idle gauges.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);
/// How long shutdown waits for pending writes.
const SHUTDOWN_FLUSH: Duration = Duration::from_secs(1);

/// A configured agent with its listener bound (so the address is known
/// before it runs, e.g. with port 0).
#[derive(Debug)]
pub struct Agent {
    config: AgentConfig,
    listener: TcpListener,
    relay: Relay,
    metrics: PrometheusHandle,
}

impl Agent {
    /// Installs the metrics recorder, binds the listener, opens the
    /// directory and starts the Redis sink.
    pub async fn bind(config: AgentConfig) -> Result<Agent, Error> {
        let metrics = telemetry::install();
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|io| Error::Listen {
                addr: config.listen,
                io,
            })?;
        let relay = Relay::new(&config)?;
        Ok(Agent {
            config,
            listener,
            relay,
            metrics,
        })
    }

    /// The address `/metrics` and `/healthz` are served on.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// Relays until `shutdown` is cancelled, then writes what is pending and returns.
    ///
    /// The relay runs on a thread of its own: it wakes every poll interval
    /// (sub-millisecond, which tokio's millisecond timer cannot do) and
    /// checks `shutdown` at each wake-up.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        let Agent {
            config,
            listener,
            relay,
            metrics,
        } = self;
        let health = Arc::new(Health::new(FULL_PASS_INTERVAL));
        let server = tokio::spawn(crate::http::serve(
            listener,
            metrics.clone(),
            health.clone(),
            shutdown.clone(),
        ));
        let relaying = tokio::task::spawn_blocking(move || {
            relay_loop(config, relay, &metrics, &health, &shutdown)
        });
        if let Err(error) = relaying.await {
            if error.is_panic() {
                std::panic::resume_unwind(error.into_panic());
            }
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
    shutdown: &CancellationToken,
) {
    let mut cleanup = config.cleanup_grace.map(Cleanup::new);
    let mut gauges = telemetry::EngineGauges::default();
    let poll = config.poll.min(config.period);
    let start = Instant::now();
    let (mut next_poll, mut next_tick) = (start, start);
    let mut upkeep_at = start;
    let mut connected = true;
    let mut relay_errors = 0;
    while !shutdown.is_cancelled() {
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
            let stats = relay.sink_stats();
            let errors = stats.errors.load(Ordering::Relaxed);
            if errors > relay_errors {
                metrics::counter!(telemetry::RELAY_ERRORS).increment(errors - relay_errors);
                relay_errors = errors;
            }
            let now_connected = stats.connected.load(Ordering::Relaxed);
            if now_connected != connected {
                connected = now_connected;
                if connected {
                    eprintln!("esagent: connected to Redis at {}", config.redis);
                } else {
                    let error = stats.last_error().unwrap_or_else(|| {
                        format!("Redis at {} is not reachable yet", config.redis)
                    });
                    eprintln!("esagent: {error}; retrying with backoff (50 ms to 5 s)");
                }
            }
            gauges.record(relay.reading(), connected, now);
            let relayed = stats.written.load(Ordering::Relaxed);
            metrics::counter!(telemetry::RELAYED).absolute(relayed);
            if now >= upkeep_at {
                upkeep_at = now + UPKEEP_INTERVAL;
                metrics.run_upkeep();
            }
            if let Some(cleanup) = cleanup.as_mut() {
                cleanup.run(relay.shm_dir(), relay.reading(), now);
            }
            health.tick(format!(
                "engines: {}\nrelayed: {}\nunreadable: {}\nredis: {}\n",
                report.engines,
                relayed,
                report.read_errors,
                if connected {
                    "connected"
                } else {
                    "unreachable (retrying)"
                },
            ));
        }
        next_poll += poll;
        let now = Instant::now();
        if next_poll <= now {
            next_poll = now + poll; // late (a long tick, or descheduled): do not catch up
        }
        // With no engines there is nothing to poll every millisecond: one
        // poll a period finds the first engine at the next listing (once a
        // second) and notices a shutdown.
        let wake = if relay.reading().engines.is_empty() {
            // A poll of no engine only checks whether a listing is due.
            next_tick.min(now + config.period)
        } else {
            next_poll.min(next_tick)
        };
        std::thread::sleep(wake.saturating_duration_since(now));
    }
    relay.shutdown(SHUTDOWN_FLUSH);
}

/// Binds and runs an agent until `shutdown` is cancelled.
pub async fn run(config: AgentConfig, shutdown: CancellationToken) -> Result<(), Error> {
    Agent::bind(config).await?.run(shutdown).await
}

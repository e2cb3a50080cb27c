//! `esroute`: flags (and `--engines-file`) → [`Config`] →
//! [`engine_state_proxy::serve`].

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use engine_state_proxy::{Config, EngineSpec};
use engine_state_reader::StateUri;
use engine_state_router::{CacheKnowledge, Policy, RealStateUse, RouterSettings};

/// An OpenAI-compatible routing proxy on the engine-state router. It
/// accepts `POST /v1/completions` and `/v1/chat/completions`, reads the
/// prompt as token ids (text: one token per UTF-8 byte, the router crate's
/// deterministic mapping, which essim serve shares), picks an engine with
/// the router (its policy, its reservations, the engines' published state
/// and cache digests), forwards the request unchanged to that engine and
/// streams its answer back; the reservation is released when the stream
/// ends, fails, times out or the client goes away. The session comes from
/// the `x-session-id` header or the body's `session_id`. `GET /health` and
/// `GET /metrics` (Prometheus) report on the proxy; SIGTERM or Ctrl-C stops
/// accepting and drains the streams in flight. It prints `esroute
/// listening on ADDR` once serving. Engines come from --engine and/or
/// --engines-file (at least one).
#[derive(Debug, Parser)]
#[command(name = "esroute", version, verbatim_doc_comment)]
struct Flags {
    /// Address to listen on, e.g. 127.0.0.1:8080 (port 0: any free port).
    #[arg(long)]
    listen: String,
    /// An engine as ID=URL, e.g. sim-0=http://127.0.0.1:8000 (repeat for
    /// each engine; ID is its engine-state engine id).
    #[arg(long = "engine", required_unless_present = "engines_file")]
    engines: Vec<EngineSpec>,
    /// A file of engines, one ID=URL a line (# comments and blank lines
    /// ignored); combinable with --engine, each id once.
    #[arg(long)]
    engines_file: Option<PathBuf>,
    /// Routing policy: load_only, lmetric, sticky or unified.
    #[arg(long, default_value = "unified")]
    policy: Policy,
    /// Where fresh engine state is merged: never, placement or always.
    #[arg(long, default_value = "always")]
    real_state_use: RealStateUse,
    /// Where cache hits come from: engine (published digests) or estimated.
    #[arg(long, default_value = "engine")]
    cache_knowledge: CacheKnowledge,
    /// Where engine state is read: file:///dir or redis://host:port/db
    /// [default: $AGENTIC_ENGINE_STATE_URI, else file:///dev/shm/agentic_engine_state].
    #[arg(long)]
    uri: Option<String>,
    /// Route on the router's own counters alone; read no engine state.
    #[arg(long, conflicts_with_all = ["uri", "share_reservations"])]
    no_engine_state: bool,
    /// This replica's id, under which --share-reservations publishes.
    #[arg(long)]
    replica_id: Option<String>,
    /// Publish this replica's reservations and merge the other replicas'
    /// (docs/ROUTING.md, "Shared reservations"); needs --replica-id.
    #[arg(long, requires = "replica_id")]
    share_reservations: bool,
    /// How often engine state and peers are read, in ms.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..))]
    poll_ms: u64,
    /// Largest request body accepted, in bytes (larger: 413).
    #[arg(long, default_value_t = 8 << 20)]
    max_body_bytes: usize,
    /// Timeout for connecting to an engine, in ms.
    #[arg(long, default_value_t = 2_000)]
    connect_timeout_ms: u64,
    /// Timeout for the engine's response head and between two chunks, in ms.
    #[arg(long, default_value_t = 60_000)]
    read_timeout_ms: u64,
    /// After SIGTERM/Ctrl-C, how long in-flight streams may still run, in ms.
    #[arg(long, default_value_t = 30_000)]
    drain_timeout_ms: u64,
    /// Threads serving requests: 1 runs everything on one thread (no
    /// wake-ups between workers); N > 1 a work-stealing pool of N; 0 one
    /// worker per CPU.
    #[arg(long, default_value_t = 0)]
    threads: usize,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut flags = Flags::parse();
    if let Some(path) = &flags.engines_file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read --engines-file {}", path.display()))?;
        let listed = EngineSpec::parse_list(&text, &path.display().to_string())?;
        flags.engines.extend(listed);
    }
    EngineSpec::check_unique(&flags.engines)?;
    let state_uri = if flags.no_engine_state {
        None
    } else {
        Some(StateUri::from_flag_or_env(flags.uri.as_deref()).context("--uri")?)
    };
    let config = Config {
        settings: RouterSettings {
            policy: flags.policy,
            real_state_use: flags.real_state_use,
            cache_knowledge: flags.cache_knowledge,
            ..RouterSettings::default()
        },
        state_uri,
        replica_id: flags.replica_id,
        share_reservations: flags.share_reservations,
        poll_interval: Duration::from_millis(flags.poll_ms),
        max_body_bytes: flags.max_body_bytes,
        connect_timeout: Duration::from_millis(flags.connect_timeout_ms),
        read_timeout: Duration::from_millis(flags.read_timeout_ms),
        drain_timeout: Duration::from_millis(flags.drain_timeout_ms),
        ..Config::new(flags.engines)
    };
    let mut runtime = match flags.threads {
        1 => tokio::runtime::Builder::new_current_thread(),
        0 => tokio::runtime::Builder::new_multi_thread(),
        n => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(n);
            builder
        }
    };
    let runtime = runtime
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(&flags.listen)
            .await
            .with_context(|| format!("cannot listen on {}; pick a free address", flags.listen))?;
        println!("esroute listening on {}", listener.local_addr()?);
        engine_state_proxy::serve(config, listener, shutdown_signal()).await?;
        Ok(())
    })
}

/// SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => {
            let _ = ctrl_c.await;
            return;
        }
    };
    tokio::select! {
        _ = ctrl_c => {}
        _ = term.recv() => {}
    }
}

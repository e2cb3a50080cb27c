//! `essim serve`: a fake vLLM fleet in real time. N engines, each the
//! engine model ([`crate::Engine`]) stepping against the wall clock on its
//! own thread (a step lasts its modelled duration divided by the time
//! scale), each behind its own HTTP listener speaking the subset of vLLM's
//! OpenAI API routers and benchmarks use, each publishing engine-state
//! through the real `Publisher` as the vLLM hook does.
//!
//! Layout: `tokens` (text → token ids, generated tokens, block hashes),
//! `engine_loop` (the engine thread and its publisher), `http` (the routes).

mod engine_loop;
mod http;
mod tokens;

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::AtomicU64;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use axum::serve::ListenerExt;
use engine_state_publisher::{Publisher, PublisherConfig};

pub use self::http::{metrics_text, DEFAULT_MAX_TOKENS};
pub use self::tokens::{
    chat_text, kv_block_hashes, output_seed, output_tokens, text_tokens, Message,
};
use crate::engine::Engine;
use crate::profile::EngineProfile;

/// What `essim serve` runs.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// Engines `sim-<F>` … `sim-<F+N-1>`, F = `first_id`.
    pub engines: usize,
    /// The first engine's number (several fleets, or one engine per
    /// process, under one engine-state directory keep distinct ids).
    pub first_id: usize,
    /// Engine `i` listens on this port + `i` (port 0: every engine on a
    /// free port of the OS's choosing).
    pub listen_base: SocketAddr,
    /// Modelled time runs this many times faster than the wall clock.
    pub time_scale: f64,
    /// Where engine-state goes (`None`: the environment, then the default).
    pub uri: Option<String>,
    /// Every engine's profile.
    pub profile: EngineProfile,
    /// The served model name.
    pub model: String,
    /// The capture and heartbeat period.
    pub period: Duration,
}

/// Run the fleet until SIGINT or SIGTERM. When every engine listens and
/// publishes, prints one line per engine on stdout, `sim-<i> http://ADDR`,
/// and flushes it (a caller that chose port 0 reads its ports there).
pub fn serve(config: ServeConfig) -> anyhow::Result<()> {
    config.profile.validate()?;
    anyhow::ensure!(config.engines >= 1, "--engines must be ≥ 1");
    anyhow::ensure!(
        config.time_scale.is_finite() && config.time_scale > 0.0,
        "--time-scale must be a factor > 0, not {}",
        config.time_scale
    );
    let mut listeners = Vec::new();
    for i in 0..config.engines {
        let mut addr = config.listen_base;
        if addr.port() != 0 {
            let port = u16::try_from(usize::from(addr.port()) + i)
                .ok()
                .context("--listen-base: port + engines passes 65535")?;
            addr.set_port(port);
        }
        let listener = TcpListener::bind(addr).with_context(|| format!("binding {addr}"))?;
        listener.set_nonblocking(true)?;
        listeners.push(listener);
    }
    let mut threads = Vec::new();
    let mut states = Vec::new();
    for i in 0..config.engines {
        let engine_id = format!("sim-{}", config.first_id + i);
        let period_ms = config.period.as_millis() as u64;
        let publisher_config = PublisherConfig::resolve(
            config.uri.as_deref(),
            Some(&engine_id),
            Some(period_ms),
            None,
        )
        .with_context(|| format!("{engine_id}: publisher settings"))?;
        let publisher = Publisher::start(publisher_config)
            .with_context(|| format!("{engine_id}: starting its publisher"))?;
        let profile = config.profile.clone();
        let (commands, receiver) = mpsc::channel();
        let gauges = Arc::new(Mutex::new(engine_loop::Gauges::default()));
        let settings = engine_loop::LoopSettings {
            time_scale: config.time_scale,
            period: config.period,
        };
        let loop_gauges = Arc::clone(&gauges);
        threads.push(
            std::thread::Builder::new()
                .name(engine_id.clone())
                .spawn(move || {
                    // The engine model is not Send (its residency captures
                    // are Rc): made on its thread.
                    let mut engine = Engine::new(profile);
                    engine.publish_residency();
                    engine_loop::run(engine, publisher, receiver, loop_gauges, settings)
                })?,
        );
        states.push(Arc::new(http::EngineHttp {
            engine_id,
            index: config.first_id + i,
            model: config.model.clone(),
            kv_blocks: config.profile.kv_blocks(),
            commands,
            gauges,
            next_id: AtomicU64::new(0),
        }));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let result = runtime.block_on(async move {
        // Before the ready lines: a signal right after them must be caught.
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mut servers = Vec::new();
        for (listener, state) in listeners.into_iter().zip(states) {
            let listener = tokio::net::TcpListener::from_std(listener)?;
            println!("{} http://{}", state.engine_id, listener.local_addr()?);
            // TCP_NODELAY: a streamed response's head and first token are
            // two writes; without it the token waits for the client's
            // delayed ACK of the head (40 ms on Linux) whenever it comes
            // sooner than that, as vLLM's server (uvicorn) does not let it.
            let listener = listener.tap_io(|stream| {
                let _ = stream.set_nodelay(true);
            });
            let mut stop = stop_rx.clone();
            let app = http::router(state);
            servers.push(tokio::spawn(async move {
                axum::serve(listener, app)
                    .with_graceful_shutdown(async move {
                        let _ = stop.wait_for(|&s| s).await;
                    })
                    .await
            }));
        }
        use std::io::Write;
        std::io::stdout().flush()?;
        tokio::select! {
            _ = term.recv() => {}
            _ = interrupt.recv() => {}
        }
        eprintln!("essim serve: stopping (in-flight streams drain)");
        let _ = stop_tx.send(true);
        for server in servers {
            server.await??;
        }
        anyhow::Ok(())
    });
    // The runtime's tasks (and the engines' senders they hold) go first;
    // then each engine thread sees its channel closed and closes its
    // publisher.
    drop(runtime);
    for thread in threads {
        let _ = thread.join();
    }
    result
}

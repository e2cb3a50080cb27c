use std::io::IsTerminal;

use engine_state_agent::{Agent, Args, CancellationToken};
use tokio::signal::unix::{signal, SignalKind};
use tracing_subscriber::filter::{EnvFilter, LevelFilter};

fn main() -> std::process::ExitCode {
    let (args, warnings) = Args::parse_with_warnings();
    init_logging();
    for warning in warnings {
        tracing::warn!("esagent: {warning}");
    }
    match main_inner(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("esagent: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Log events go to stderr, at `info` and above unless `RUST_LOG` says
/// otherwise (e.g. `RUST_LOG=warn`, `RUST_LOG=engine_state_agent=debug`).
/// Colours only on a terminal.
fn init_logging() {
    let builder = EnvFilter::builder().with_default_directive(LevelFilter::INFO.into());
    let (filter, bad) = match builder.from_env() {
        Ok(filter) => (filter, None),
        Err(e) => (
            EnvFilter::builder()
                .with_default_directive(LevelFilter::INFO.into())
                .parse_lossy(""),
            Some(e),
        ),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
    if let Some(e) = bad {
        tracing::warn!(
            "esagent: RUST_LOG is not a valid filter ({e}); logging at info. Give a level \
             (RUST_LOG=warn) or per-target levels (RUST_LOG=info,engine_state_agent=debug)"
        );
    }
}

fn main_inner(args: Args) -> anyhow::Result<()> {
    let config = args.into_config()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(async {
        let shutdown = CancellationToken::new();
        let mut terminate = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        let agent = Agent::bind(config.clone()).await?;
        // The address ends the first line of stdout (with port 0, callers read it there).
        match &config.redis {
            Some(redis) => println!(
                "esagent: relaying {} to {redis} (new snapshots: checked every {:?}; \
                 heartbeats: every {:?}); metrics on http://{}/metrics",
                config.shm_dir.display(),
                config.poll.min(config.period),
                config.period,
                agent.local_addr()
            ),
            None => println!(
                "esagent: watching {} (metrics only: no --redis, nothing is relayed); \
                 metrics on http://{}/metrics",
                config.shm_dir.display(),
                agent.local_addr()
            ),
        }
        let cancel = shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = interrupt.recv() => {}
            }
            cancel.cancel();
        });
        agent.run(shutdown).await?;
        tracing::info!("esagent: stopped");
        Ok(())
    });
    // The relay thread may still be stuck in a call to a Redis that stopped
    // answering: `run` has given up on it, and so does the exit.
    runtime.shutdown_background();
    result
}

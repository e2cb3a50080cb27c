use engine_state_agent::{Agent, Args, CancellationToken};
use tokio::signal::unix::{signal, SignalKind};

fn main() -> std::process::ExitCode {
    match main_inner() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("esagent: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn main_inner() -> anyhow::Result<()> {
    let (args, warnings) = Args::parse_with_warnings();
    for warning in warnings {
        eprintln!("esagent: {warning}");
    }
    let config = args.into_config()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(async {
        let shutdown = CancellationToken::new();
        let mut terminate = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        let agent = Agent::bind(config.clone()).await?;
        println!(
            "esagent: relaying {} to {} (new snapshots: checked every {:?}; \
             heartbeats: every {:?}); metrics on http://{}/metrics",
            config.shm_dir.display(),
            config.redis,
            config.poll.min(config.period),
            config.period,
            agent.local_addr()
        );
        let cancel = shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = interrupt.recv() => {}
            }
            cancel.cancel();
        });
        agent.run(shutdown).await?;
        eprintln!("esagent: stopped");
        Ok(())
    });
    // The relay thread may still be stuck in a call to a Redis that stopped
    // answering: `run` has given up on it, and so does the exit.
    runtime.shutdown_background();
    result
}

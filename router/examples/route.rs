//! Linking the router into a Rust program: poll engine state, pick, reserve,
//! release. Run it next to `make demo` (or any publishers):
//!
//! ```sh
//! AGENTIC_ENGINE_STATE_URI=file:///dev/shm/engine_state_demo cargo run --example route -p engine-state-router
//! ```

use std::time::Duration;

use engine_state_reader::{open, ReaderOptions, Reading, StateUri};
use engine_state_router::{Policy, Request, Router, RouterSettings};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let uri = StateUri::from_flag_or_env(None)?;
    let mut source = open(&uri, ReaderOptions::default())?;
    let mut reading = Reading::default();
    source.read_into(&mut reading)?;
    let engines: Vec<String> = reading
        .engines
        .iter()
        .map(|e| e.engine_id.to_string())
        .collect();
    if engines.is_empty() {
        return Err(format!("no engines publish at {uri}; start some (make demo) first").into());
    }
    let settings = RouterSettings {
        policy: Policy::Unified,
        decode_weight: 0.01,
        ..RouterSettings::default()
    };
    let router = Router::with_instances(settings, &engines)?;

    for i in 0..10u32 {
        // In a real router: poll every 50 ms on a timer, not per request.
        source.read_into(&mut reading)?;
        router.update_from_reading(&reading);
        let prompt: Vec<u32> = (0..4096).map(|t| t * (i % 3 + 1)).collect();
        let request = Request::from_tokens(format!("req-{i}"), prompt)
            .with_session(format!("chat-{}", i % 3));
        let (decision, mut reservation) = router.pick(&request)?;
        println!(
            "{} -> {} ({})",
            decision.request_id,
            decision.instance_id,
            decision.reason.name()
        );
        // ... forward the request; an error here drops `reservation`: no leaked load.
        reservation.prefill_done(); // first token streamed
        reservation.complete();
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

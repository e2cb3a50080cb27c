//! A router replica for the cross-process tests of shared reservations
//! (tests/tests/replicas_cross_process.rs): a `Router` over the given
//! engines that publishes its reservations (`ReplicaPublisher`) and merges
//! its peers' (`open_replicas` + `Router::update_from_replicas`), driven by
//! commands on stdin, one JSON line on stdout per command:
//!
//! - `pick N TOKENS`: reads the peers, then picks and holds N requests of
//!   TOKENS tokens each → `{"held": total held}`
//! - `prefill`: `prefill_done` on every held request → `{"held": …}`
//! - `view`: reads the peers → `{"own": {engine: requests}, "peers": {engine:
//!   requests}, "replicas": {id: status}, "errors": [names]}`
//! - `complete`: completes every held request → `{"held": 0}`
//! - `exit` (or end of input): closes the publisher (its file is removed)
//!
//! Prints `{"ready": true}` once its file is published.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::time::Duration;

use clap::Parser;
use engine_state_publisher::{ReplicaOptions, ReplicaPublisher};
use engine_state_reader::{open_replicas, ReaderOptions, ReplicaReading, StateUri};
use engine_state_router::{Policy, Request, Reservation, Router, RouterSettings};
use engine_state_shm_format::EngineId;
use serde_json::json;

#[derive(Parser)]
struct Args {
    /// The engines' URI (the replicas' records live beside them).
    #[arg(long)]
    uri: String,
    /// This replica's id.
    #[arg(long)]
    replica_id: String,
    /// Engine ids, comma-separated.
    #[arg(long, value_delimiter = ',')]
    engines: Vec<String>,
    /// How often the replicas' directory (or registry) is listed, in ms.
    #[arg(long, default_value_t = 20)]
    rescan_ms: u64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let uri = StateUri::parse(&args.uri)?;
    let settings = RouterSettings {
        policy: Policy::LoadOnly,
        ..RouterSettings::default()
    };
    let router = Router::with_instances(settings, &args.engines)?;
    let publisher = ReplicaPublisher::start(
        &uri,
        &EngineId::new(&args.replica_id)?,
        ReplicaOptions::default(),
    )?;
    router.set_reservation_sink(Some(Box::new(publisher)));
    let options = ReaderOptions {
        rescan_interval: Duration::from_millis(args.rescan_ms),
        ..ReaderOptions::default()
    };
    let mut peers = open_replicas(&uri, Some(&args.replica_id), options)?;
    let mut reading = ReplicaReading::default();
    let mut held: Vec<Reservation> = Vec::new();
    let mut next = 0u64;
    let stdout = std::io::stdout();
    let say = |value: serde_json::Value| {
        let mut out = stdout.lock();
        writeln!(out, "{value}").and_then(|()| out.flush())
    };
    say(json!({"ready": true}))?;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["pick", n, tokens] => {
                peers.read_into(&mut reading)?;
                router.update_from_replicas(&reading);
                for _ in 0..n.parse::<u32>()? {
                    next += 1;
                    let id = format!("{}-{next}", args.replica_id);
                    let prompt = vec![next as u32; tokens.parse()?];
                    held.push(router.pick(&Request::from_tokens(id, prompt))?.1);
                }
                say(json!({"held": held.len()}))?;
            }
            ["prefill"] => {
                held.iter_mut().for_each(Reservation::prefill_done);
                say(json!({"held": held.len()}))?;
            }
            ["view"] => {
                peers.read_into(&mut reading)?;
                router.update_from_replicas(&reading);
                let (mut own, mut seen) = (BTreeMap::new(), BTreeMap::new());
                for view in router.instances() {
                    own.insert(view.instance_id.clone(), view.shadow.num_requests);
                    seen.insert(view.instance_id, view.peers.num_requests);
                }
                let replicas: BTreeMap<&str, &str> = reading
                    .replicas
                    .iter()
                    .map(|r| (&*r.replica_id, r.status.as_str()))
                    .collect();
                let errors: Vec<&str> = reading.errors.iter().map(|e| e.name.as_str()).collect();
                say(json!({"own": own, "peers": seen, "replicas": replicas, "errors": errors}))?;
            }
            ["complete"] => {
                held.drain(..).for_each(|mut r| r.complete());
                say(json!({"held": 0}))?;
            }
            ["exit"] => break,
            _ => anyhow::bail!("unknown command {line:?}"),
        }
    }
    router.set_reservation_sink(None);
    Ok(())
}

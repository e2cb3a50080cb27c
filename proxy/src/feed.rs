//! What the router learns besides its own reservations: engine state and
//! the peers' reservations (a poller thread), and which engines answer at
//! all (engine health, kept by the request path and a retry task).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use engine_state_reader::{
    open, open_replicas, ReaderOptions, Reading, ReplicaReading, ReplicaSource, Source, StateUri,
};
use engine_state_router::Router;

/// How long a source that could not be opened waits before the next try.
const REOPEN_AFTER: Duration = Duration::from_secs(1);

/// Reads engine state (with cache digests) and, when `peers_of` names this
/// replica, the other replicas' reservations, every `interval`, into the
/// router, until `stop` is set. A source that cannot be opened or read is
/// logged (once until it recovers) and retried; routing goes on on the
/// shadow counters meanwhile.
pub(crate) fn spawn_feed(
    router: Router,
    uri: StateUri,
    peers_of: Option<String>,
    interval: Duration,
    stop: Arc<AtomicBool>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("esroute-feed".into())
        .spawn(move || {
            let options = ReaderOptions::default().with_cache_digests(true);
            let mut engines: Option<Box<dyn Source>> = None;
            let mut peers: Option<Box<dyn ReplicaSource>> = None;
            let mut reading = Reading::default();
            let mut replicas = ReplicaReading::default();
            let mut complained = false;
            // Acquire: pairs with the Release store in `run` at shutdown.
            while !stop.load(Ordering::Acquire) {
                let mut failed = None;
                if engines.is_none() {
                    match open(&uri, options) {
                        Ok(source) => engines = Some(source),
                        Err(error) => failed = Some(format!("engine state at {uri}: {error}")),
                    }
                }
                if let Some(source) = engines.as_mut() {
                    match source.read_into(&mut reading) {
                        Ok(()) => {
                            router.update_from_reading(&reading);
                        }
                        Err(error) => {
                            failed = Some(format!("engine state at {uri}: {error}"));
                            engines = None;
                        }
                    }
                }
                if let Some(own) = &peers_of {
                    if peers.is_none() {
                        match open_replicas(&uri, Some(own), options) {
                            Ok(source) => peers = Some(source),
                            Err(error) => failed = Some(format!("peer replicas at {uri}: {error}")),
                        }
                    }
                    if let Some(source) = peers.as_mut() {
                        match source.read_into(&mut replicas) {
                            Ok(()) => {
                                router.update_from_replicas(&replicas);
                            }
                            Err(error) => {
                                failed = Some(format!("peer replicas at {uri}: {error}"));
                                peers = None;
                            }
                        }
                    }
                }
                match failed {
                    Some(message) => {
                        if !complained {
                            tracing::warn!(
                                "cannot read {message}; routing on the router's own counters, \
                                 retrying every {REOPEN_AFTER:?}"
                            );
                            complained = true;
                        }
                        std::thread::sleep(REOPEN_AFTER.max(interval));
                    }
                    None => {
                        if complained {
                            tracing::info!("engine state at {uri} is read again");
                            complained = false;
                        }
                        std::thread::sleep(interval);
                    }
                }
            }
        })
}

/// Engines taken out of routing because a connection to them failed, with
/// the reason; [`Health::retry`] puts them back once `GET /health` answers.
#[derive(Debug, Default)]
pub(crate) struct Health {
    down: Mutex<BTreeMap<String, String>>,
}

impl Health {
    fn down(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, String>> {
        self.down.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes `engine` out of routing (its sessions are placed anew later).
    /// Returns the number of engines down.
    pub fn mark_down(&self, router: &Router, engine: &str, reason: String) -> usize {
        let mut down = self.down();
        if down.insert(engine.to_owned(), reason).is_none() {
            // Fails only when already removed: nothing to undo.
            let _ = router.remove_instance(engine);
            tracing::warn!("engine {engine} is out of routing until GET /health answers");
        }
        down.len()
    }

    /// Puts `engine` back in routing. Returns the number of engines down.
    pub fn mark_up(&self, router: &Router, engine: &str) -> usize {
        let mut down = self.down();
        if down.remove(engine).is_some() {
            let _ = router.add_instance(engine);
            tracing::info!("engine {engine} answers again and is routed to");
        }
        down.len()
    }

    /// The engines down, with why (for a 503's message).
    pub fn describe(&self) -> String {
        let down = self.down();
        if down.is_empty() {
            return "every engine is shutting down (its engine state says so)".to_owned();
        }
        down.iter()
            .map(|(engine, reason)| format!("{engine}: {reason}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// The ids of the engines down now.
    pub fn down_ids(&self) -> Vec<String> {
        self.down().keys().cloned().collect()
    }
}

//! What the router learns besides its own reservations: engine state and
//! the peers' reservations (a poller thread), and which engines answer at
//! all (engine health, kept by the request path and a retry task).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use engine_state_reader::{
    open, open_replicas, ReaderOptions, Reading, ReplicaReading, ReplicaSource, Source, StateUri,
    Status,
};
use engine_state_router::Router;
use metrics::Gauge;

/// How long a source that could not be opened waits before the next try.
const REOPEN_AFTER: Duration = Duration::from_secs(1);

/// Reads engine state (with cache digests) and, when `peers_of` names this
/// replica, the other replicas' reservations, every `interval`, into the
/// router, until `stop` is set. A source that cannot be opened or read is
/// logged (once until it recovers) and retried; routing goes on on the
/// shadow counters meanwhile. An engine whose writer the reading finds dead
/// is taken out of routing ([`DeadWriters`]).
pub(crate) fn spawn_feed(
    router: Router,
    uri: StateUri,
    peers_of: Option<String>,
    interval: Duration,
    health: Arc<Health>,
    mut dead: DeadWriters,
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
                            dead.observe(&reading, &router, &health);
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

/// Takes an engine out of routing when engine state says its writer is
/// dead (the process is gone or its file was retired: docs/FORMAT.md,
/// "Liveness and staleness") — a killed engine is noticed within the
/// liveness bound, before a request fails to connect to it. Each death
/// counts once: an engine that `GET /health` put back while its old file
/// still reads dead stays routed. It is taken out again when it reads dead
/// after reading otherwise (or not at all) in between, or with another
/// writer's (pid, creation time) — a Redis record may carry neither, so the
/// reading in between is what re-arms there.
#[derive(Debug)]
pub(crate) struct DeadWriters {
    /// The engines this proxy routes to (other engines in the same
    /// engine-state directory are not its business).
    routed: HashSet<String>,
    /// Engine id → the writer (pid, creation time) seen dead, kept while
    /// the engine goes on reading dead.
    seen: HashMap<String, (u32, u64)>,
}

impl DeadWriters {
    pub fn new<'a>(routed: impl IntoIterator<Item = &'a str>) -> DeadWriters {
        DeadWriters {
            routed: routed.into_iter().map(str::to_owned).collect(),
            seen: HashMap::new(),
        }
    }

    /// Marks down every routed engine whose writer `reading` finds newly
    /// dead; forgets the deaths of engines that read otherwise or not at all.
    pub fn observe(&mut self, reading: &Reading, router: &Router, health: &Health) {
        self.seen
            .retain(|id, _| reading.get(id).is_some_and(|e| e.status == Status::Dead));
        for engine in &reading.engines {
            if engine.status != Status::Dead || !self.routed.contains(&*engine.engine_id) {
                continue;
            }
            let writer = (engine.writer.pid, engine.writer.created_unix_ns);
            if self.seen.insert(engine.engine_id.to_string(), writer) == Some(writer) {
                continue;
            }
            health.mark_down(
                router,
                &engine.engine_id,
                format!(
                    "its engine-state writer (pid {}) is dead",
                    engine.writer.pid
                ),
            );
        }
    }
}

/// Engines taken out of routing because a connection to them failed or
/// their engine-state writer died, with the reason; the proxy's retry task
/// puts them back once `GET /health` answers. It owns the
/// `esroute_engines_down` gauge, set under the same lock as the list.
#[derive(Debug)]
pub(crate) struct Health {
    down: Mutex<BTreeMap<String, String>>,
    gauge: Gauge,
}

impl Health {
    pub fn new(gauge: Gauge) -> Health {
        Health {
            down: Mutex::default(),
            gauge,
        }
    }

    fn down(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, String>> {
        self.down.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes `engine` out of routing (its sessions are placed anew later).
    pub fn mark_down(&self, router: &Router, engine: &str, reason: String) {
        let mut down = self.down();
        if down.insert(engine.to_owned(), reason).is_none() {
            // Fails only when already removed: nothing to undo.
            let _ = router.remove_instance(engine);
            tracing::warn!("engine {engine} is out of routing until GET /health answers");
        }
        self.gauge.set(down.len() as f64);
    }

    /// Puts `engine` back in routing.
    pub fn mark_up(&self, router: &Router, engine: &str) {
        let mut down = self.down();
        if down.remove(engine).is_some() {
            let _ = router.add_instance(engine);
            tracing::info!("engine {engine} answers again and is routed to");
        }
        self.gauge.set(down.len() as f64);
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use engine_state_reader::{EngineState, Writer};
    use engine_state_router::RouterSettings;
    use engine_state_shm_format::Snapshot;

    use super::*;

    fn engine(id: &str, status: Status, pid: u32, created_unix_ns: u64) -> EngineState {
        EngineState {
            engine_id: id.into(),
            status,
            snapshot: Snapshot::default(),
            heartbeat_age: Duration::from_millis(5),
            capture_age: Duration::from_millis(5),
            generation: 1,
            read_mono_ns: engine_state_shm_format::monotonic_ns(),
            writer: Writer {
                pid,
                created_unix_ns,
                ..Writer::default()
            },
            clock_ahead: false,
            cache: None,
        }
    }

    fn reading(engines: Vec<EngineState>) -> Reading {
        Reading {
            engines,
            errors: Vec::new(),
        }
    }

    #[test]
    fn a_dead_writer_takes_its_engine_out_once_per_death() {
        let router = Router::with_instances(RouterSettings::default(), ["a", "b"]).unwrap();
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let gauge = metrics::with_local_recorder(&recorder, || metrics::gauge!("down"));
        let health = Health::new(gauge);
        let down = || recorder.handle().render();
        let mut dead = DeadWriters::new(["a", "b"]);

        // Alive, and a dead writer of an engine this proxy does not route.
        let alive = reading(vec![
            engine("a", Status::Fresh, 10, 1),
            engine("b", Status::Stale, 11, 1),
            engine("other", Status::Dead, 12, 1),
        ]);
        dead.observe(&alive, &router, &health);
        assert_eq!(router.instance_ids(), ["a", "b"]);

        // a's writer dies: a is out, with the reason, counted.
        let died = reading(vec![
            engine("a", Status::Dead, 10, 1),
            engine("b", Status::Fresh, 11, 1),
        ]);
        dead.observe(&died, &router, &health);
        assert_eq!(router.instance_ids(), ["b"]);
        assert!(health
            .describe()
            .contains("a: its engine-state writer (pid 10) is dead"));
        assert!(down().contains("down 1"), "{}", down());

        // GET /health answers again (the retry task): a is back, and the
        // same dead file does not take it out a second time.
        health.mark_up(&router, "a");
        assert!(down().contains("down 0"), "{}", down());
        dead.observe(&died, &router, &health);
        assert_eq!(router.instance_ids().len(), 2);

        // A new writer for a (a restarted engine) that dies too: out again.
        let died_again = reading(vec![engine("a", Status::Dead, 20, 2)]);
        dead.observe(&died_again, &router, &health);
        assert_eq!(router.instance_ids(), ["b"]);

        // A writer with no identity (a Redis record: pid and creation time
        // 0) that reads alive in between, then dead again: out again.
        health.mark_up(&router, "a");
        for status in [Status::Dead, Status::Fresh, Status::Dead] {
            dead.observe(&reading(vec![engine("a", status, 0, 0)]), &router, &health);
            if status == Status::Dead {
                assert_eq!(router.instance_ids(), ["b"], "{status:?}");
                health.mark_up(&router, "a");
            }
        }
        assert_eq!(router.instance_ids().len(), 2);
    }
}

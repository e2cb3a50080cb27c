//! The state feed: how engine snapshots reach routers.
//!
//! - `none`: routers run on shadow counters alone.
//! - `periodic:P[+D]`: the hook's capture rule (docs/VLLM.md, "When it
//!   captures"): a snapshot at a step boundary at most every `P` ms, and at
//!   once when the engine turns busy or idle; it becomes readable `D` ms later
//!   (0 for shared memory, a network hop for Redis). A heartbeat is stamped
//!   every [`HEARTBEAT_PERIOD_NS`], also delayed by `D`.
//! - `scraped:P`: the older proxies' baseline — Prometheus gauges
//!   (`num_requests_running`, `num_requests_waiting`, KV usage) scraped every
//!   `P` ms (30,000 in the sweep); every other snapshot field is 0. The router
//!   merges them as `max(shadow, scraped)`: the nearest thing to "shadow
//!   counters reconciled to scraped metrics" its merge can express (a true
//!   reconciliation would also lower the shadow; documented in docs/ROUTING.md).
//!
//! An engine that publishes its cache residency ([`Engine::publish_residency`])
//! captures its cache digest with each periodic snapshot; it travels with
//! the snapshot (same delay) and is readable as `EngineState::cache`, as a
//! reader asked for digests returns it. Scrapes carry none.
//!
//! Routers read the way a proxy polling its reader before each pick does:
//! at every decision the driver builds a reader `Reading` of what is
//! readable now, each engine's state made by the reader's own judge
//! ([`judge`], the staleness rule included), and hands it to
//! `Router::update_from_reading`.

use std::collections::VecDeque;
use std::fmt;
use std::rc::Rc;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use engine_state_reader::{judge, max_ahead, Clocks, EngineState, Freshness, Observation, Writer};
use engine_state_shm_format::Snapshot;

use crate::engine::Engine;
use crate::error::SimError;
use crate::residency::Capture;

/// The hook's heartbeat period: the default publish period, 50 ms
/// (`AGENTIC_ENGINE_STATE_PERIOD_MS`; docs/VLLM.md, "When it captures"). Kept
/// at 50 ms whatever the capture period, so a long capture period measures
/// stale *snapshots*, not dead engines.
pub const HEARTBEAT_PERIOD_NS: u64 = 50_000_000;

/// `captured_unix_ns` = simulated time + this (2026-01-01), for display only.
const UNIX_EPOCH_OFFSET_NS: u64 = 1_767_225_600_000_000_000;

/// How engine state reaches the routers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FeedSpec {
    /// Shadow counters only.
    None,
    /// Hook-style captures at most every `period_ns`, readable `delay_ns` later.
    Periodic {
        /// Capture period.
        period_ns: u64,
        /// Capture → readable.
        delay_ns: u64,
    },
    /// Prometheus gauges scraped every `period_ns`.
    Scraped {
        /// Scrape period.
        period_ns: u64,
    },
}

impl FeedSpec {
    /// The capture (scrape) period, if any.
    pub fn period_ns(&self) -> Option<u64> {
        match *self {
            FeedSpec::None => None,
            FeedSpec::Periodic { period_ns, .. } | FeedSpec::Scraped { period_ns } => {
                Some(period_ns)
            }
        }
    }
}

fn ms(ns: u64) -> String {
    let ms = ns as f64 / 1e6;
    format!("{ms}")
}

impl fmt::Display for FeedSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            FeedSpec::None => f.write_str("none"),
            FeedSpec::Periodic {
                period_ns,
                delay_ns: 0,
            } => write!(f, "periodic:{}", ms(period_ns)),
            FeedSpec::Periodic {
                period_ns,
                delay_ns,
            } => write!(f, "periodic:{}+{}", ms(period_ns), ms(delay_ns)),
            FeedSpec::Scraped { period_ns } => write!(f, "scraped:{}", ms(period_ns)),
        }
    }
}

impl FromStr for FeedSpec {
    type Err = SimError;

    /// `none`, `periodic:PERIOD_MS[+DELAY_MS]`, `scraped:PERIOD_MS`.
    fn from_str(text: &str) -> Result<FeedSpec, SimError> {
        let bad = || {
            SimError::Config(format!(
                "feed {text:?}: expected none, periodic:PERIOD_MS[+DELAY_MS] or scraped:PERIOD_MS \
                 (e.g. periodic:50, periodic:50+5, scraped:30000)"
            ))
        };
        let to_ns = |s: &str| -> Result<u64, SimError> {
            let ms: f64 = s.trim().parse().map_err(|_| bad())?;
            (ms.is_finite() && ms >= 0.0)
                .then(|| (ms * 1e6).round() as u64)
                .ok_or_else(bad)
        };
        match text.split_once(':') {
            None if text == "none" => Ok(FeedSpec::None),
            Some(("periodic", rest)) => {
                let (period, delay) = rest.split_once('+').unwrap_or((rest, "0"));
                let period_ns = to_ns(period)?;
                if period_ns == 0 {
                    return Err(bad());
                }
                Ok(FeedSpec::Periodic {
                    period_ns,
                    delay_ns: to_ns(delay)?,
                })
            }
            Some(("scraped", rest)) => match to_ns(rest)? {
                0 => Err(bad()),
                period_ns => Ok(FeedSpec::Scraped { period_ns }),
            },
            _ => Err(bad()),
        }
    }
}

/// One engine's snapshots on their way to the routers.
#[derive(Debug)]
pub(crate) struct EngineFeed {
    engine_id: Arc<str>,
    /// Captured, not yet readable: `(readable at, snapshot, residency)`.
    in_transit: VecDeque<(u64, Snapshot, Option<Rc<Capture>>)>,
    readable: Option<(Snapshot, Option<Rc<Capture>>)>,
    last_capture_ns: Option<u64>,
}

impl EngineFeed {
    pub(crate) fn new(engine_id: &str) -> EngineFeed {
        EngineFeed {
            engine_id: engine_id.into(),
            in_transit: VecDeque::new(),
            readable: None,
            last_capture_ns: None,
        }
    }

    /// A step boundary (after `schedule()` or after `update_from_output()`)
    /// at `now_ns`; `turned` = the engine just turned busy or idle.
    pub(crate) fn step_boundary(
        &mut self,
        spec: &FeedSpec,
        engine: &mut Engine,
        now_ns: u64,
        turned: bool,
    ) {
        let FeedSpec::Periodic {
            period_ns,
            delay_ns,
        } = *spec
        else {
            return;
        };
        let due = self
            .last_capture_ns
            .is_none_or(|last| now_ns >= last + period_ns);
        if due || turned {
            let digest = engine.capture_residency(now_ns);
            self.capture(stamp(engine.snapshot(), now_ns), digest, now_ns, delay_ns);
        }
    }

    /// A Prometheus scrape at `now_ns`: only what vLLM's gauges export.
    pub(crate) fn scrape(&mut self, engine: &Engine, now_ns: u64) {
        let full = engine.snapshot();
        let gauges = Snapshot {
            num_running: full.num_running,
            num_waiting: full.num_waiting,
            gpu_blocks_total: full.gpu_blocks_total,
            gpu_blocks_free: full.gpu_blocks_free,
            flags: full.flags,
            ..Snapshot::default()
        };
        self.capture(stamp(gauges, now_ns), None, now_ns, 0);
    }

    fn capture(
        &mut self,
        snapshot: Snapshot,
        digest: Option<Rc<Capture>>,
        now_ns: u64,
        delay_ns: u64,
    ) {
        self.last_capture_ns = Some(now_ns);
        self.in_transit
            .push_back((now_ns + delay_ns, snapshot, digest));
    }

    /// What a reader would return for this engine at `now_ns`, if anything
    /// was ever readable.
    pub(crate) fn read(&mut self, spec: &FeedSpec, now_ns: u64) -> Option<EngineState> {
        while let Some((at, ..)) = self.in_transit.front() {
            if *at > now_ns {
                break;
            }
            let (_, snapshot, digest) = self.in_transit.pop_front().expect("just seen");
            self.readable = Some((snapshot, digest));
        }
        let (snapshot, digest) = self.readable.as_ref()?;
        let heartbeat_mono_ns = match *spec {
            // The newest heartbeat readable now was stamped `delay` ago or
            // earlier, at a multiple of the heartbeat period.
            FeedSpec::Periodic { delay_ns, .. } => {
                let stamped = now_ns.saturating_sub(delay_ns);
                stamped - stamped % HEARTBEAT_PERIOD_NS
            }
            // A scrape that answered is its own liveness signal.
            FeedSpec::Scraped { .. } | FeedSpec::None => now_ns,
        };
        let observation = Observation {
            engine_id: Arc::clone(&self.engine_id),
            snapshot,
            writer: Writer {
                pid: 0,
                publish_period_us: (HEARTBEAT_PERIOD_NS / 1000) as u32,
                created_unix_ns: UNIX_EPOCH_OFFSET_NS,
                heartbeat_mono_ns,
            },
            generation: 1,
            torn: false,
            retired: false,
            writer_alive: Some(true),
            // Simulated engines stamp with the simulated clock routers read.
            clocks: Clocks::Shared {
                max_ahead_ns: max_ahead(Duration::from_nanos(HEARTBEAT_PERIOD_NS)).as_nanos()
                    as u64,
            },
        };
        let mut state = judge(observation, now_ns, &Freshness::default());
        state.cache = digest.as_ref().map(|capture| capture.digest());
        Some(state)
    }
}

fn stamp(mut snapshot: Snapshot, now_ns: u64) -> Snapshot {
    snapshot.captured_mono_ns = now_ns;
    snapshot.captured_unix_ns = now_ns + UNIX_EPOCH_OFFSET_NS;
    snapshot
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::EngineProfile;
    use engine_state_reader::Status;

    #[test]
    fn feed_names_round_trip() {
        for text in ["none", "periodic:50", "periodic:10+2.5", "scraped:30000"] {
            assert_eq!(text.parse::<FeedSpec>().unwrap().to_string(), text);
        }
        let err = "periodic".parse::<FeedSpec>().unwrap_err().to_string();
        assert!(err.contains("periodic:PERIOD_MS"), "{err}");
        assert!("periodic:0".parse::<FeedSpec>().is_err());
    }

    #[test]
    fn a_digest_travels_with_its_snapshot_and_scrapes_carry_none() {
        let spec: FeedSpec = "periodic:100+10".parse().unwrap();
        let mut engine = Engine::new(EngineProfile::default());
        let mut feed = EngineFeed::new("e0");
        feed.step_boundary(&spec, &mut engine, 0, false);
        let state = feed.read(&spec, 10_000_000).unwrap();
        assert!(state.cache.is_none(), "the engine publishes no residency");

        engine.publish_residency();
        feed.step_boundary(&spec, &mut engine, 100_000_000, false);
        assert!(feed.read(&spec, 105_000_000).unwrap().cache.is_none());
        let state = feed.read(&spec, 110_000_000).unwrap();
        let digest = state.cache.expect("readable with its snapshot");
        assert_eq!((digest.version(), digest.len()), (1, 0));
        feed.scrape(&engine, 120_000_000);
        assert!(feed.read(&spec, 120_000_000).unwrap().cache.is_none());
    }

    #[test]
    fn captures_are_period_gated_delayed_and_aged_from_capture() {
        let spec: FeedSpec = "periodic:100+10".parse().unwrap();
        let mut engine = Engine::new(EngineProfile::default());
        let mut feed = EngineFeed::new("e0");
        feed.step_boundary(&spec, &mut engine, 0, false);
        assert!(feed.read(&spec, 5_000_000).is_none(), "still in transit");
        let state = feed.read(&spec, 10_000_000).unwrap();
        assert_eq!(state.capture_age, Duration::from_millis(10));
        assert_eq!(state.status, Status::Fresh);
        feed.step_boundary(&spec, &mut engine, 50_000_000, false);
        assert_eq!(feed.in_transit.len(), 0, "not due before 100 ms");
        feed.step_boundary(&spec, &mut engine, 60_000_000, true);
        assert_eq!(
            feed.in_transit.len(),
            1,
            "turning idle/busy captures at once"
        );
    }
}

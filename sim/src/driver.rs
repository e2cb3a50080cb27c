//! The discrete-event driver: trace arrivals, engine steps and feed scrapes
//! in simulated time, with the project's router deciding every placement.
//!
//! A request is picked and reserved at arrival by one router replica
//! (`Router::pick`, after the replica polls the feed), optionally migrated by
//! the router's own trigger (`Router::migrate_reservation`), queued on its
//! engine, marked `prefill_done` when the engine samples its first token and
//! `complete` when it samples its last.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use engine_state_reader::{Reading, Status};
use engine_state_router::{
    CacheKnowledge, Clock, DecisionLog, Policy, Reason, Request, Reservation, Router,
    RouterSettings, RouterStats, ShadowCounters,
};
use serde::{Deserialize, Serialize};

use crate::engine::{Engine, EngineRequest, ScheduledStep};
use crate::error::SimError;
use crate::feed::{EngineFeed, FeedSpec};
use crate::profile::EngineProfile;
use crate::share::{lock, LogSink, ShareLog};
use crate::trace::{mix, Trace};

/// How arrivals are split between router replicas.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    /// Replica `arrival index mod N` (a load balancer in front of the routers).
    #[default]
    RoundRobin,
    /// Replica by session hash (consistent hashing of sessions; requests
    /// without a session by their index).
    Session,
}

/// One simulated configuration.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// A name for reports.
    pub label: String,
    /// Engines (`e0`, `e1`, …).
    pub engines: usize,
    /// Every engine's profile.
    pub profile: EngineProfile,
    /// Every replica's router settings.
    pub router: RouterSettings,
    /// How engine state reaches the routers.
    pub feed: FeedSpec,
    /// Router replicas.
    pub routers: usize,
    /// How arrivals are split between them.
    pub split: Split,
    /// Ask the router's migration trigger about every request at arrival.
    pub migration: bool,
    /// Share of requests whose completion reaches the router late (0–1):
    /// for them `complete` is called [`RunConfig::late_completion_ns`] after
    /// the engine finished, so the shadow over-counts meanwhile — a proxy
    /// that sees stream ends late, or never hears of a disconnect until a
    /// timeout. 0 (the default) makes a single router's shadow exact.
    pub late_completion_fraction: f64,
    /// How late those completions are, ns.
    pub late_completion_ns: u64,
    /// Write the router's decision log (JSON Lines) here; with several
    /// replicas, replica `i` writes `PATH.r{i}`. Records are stamped with
    /// simulated time (`clock_ns`, ns from the trace's start: the routers run
    /// on the simulation's clock) and carry no wall-clock time.
    pub decision_log: Option<PathBuf>,
    /// Replicas share their reservations (`None`: they do not): each
    /// publishes every change of its own shadow, and before each pick reads
    /// every other replica's as published this many ns ago or earlier
    /// (0: the shared-memory path, every change visible at the next pick).
    /// One router has no peer: it changes nothing there.
    pub share_delay_ns: Option<u64>,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            label: String::new(),
            engines: 8,
            profile: EngineProfile::default(),
            router: RouterSettings::default(),
            feed: FeedSpec::None,
            routers: 1,
            split: Split::RoundRobin,
            migration: true,
            decision_log: None,
            late_completion_fraction: 0.0,
            late_completion_ns: 0,
            share_delay_ns: None,
        }
    }
}

impl RunConfig {
    /// `policy/real_state_use/feed/routers` unless a label was given, with
    /// the cache knowledge after the feed where engines publish digests (a
    /// periodic feed) (`unified/placement/periodic:50/engine/r4`), and the
    /// sharing delay
    /// in ms where replicas share their reservations
    /// (`unified/placement/periodic:50/engine/r4/share:0`).
    pub fn name(&self) -> String {
        if !self.label.is_empty() {
            return self.label.clone();
        }
        let digests = matches!(self.feed, FeedSpec::Periodic { .. });
        let knowledge = match digests {
            true => format!("/{}", self.router.cache_knowledge),
            false => String::new(),
        };
        let share = match self.share_delay_ms() {
            Some(ms) => format!("/share:{ms}"),
            None => String::new(),
        };
        format!(
            "{}/{}/{}{knowledge}/r{}{share}",
            policy_label(&self.router),
            self.router.real_state_use,
            self.feed,
            self.routers
        )
    }

    /// The sharing delay in ms, if the replicas share their reservations.
    pub fn share_delay_ms(&self) -> Option<f64> {
        self.share_delay_ns.map(|ns| ns as f64 / 1e6)
    }

    /// Whether the engines' cache digests reach the routers and are read:
    /// a periodic feed (as the vLLM hook publishes them) and `cache_knowledge
    /// = engine`, whatever `real_state_use` says (it is about load).
    pub fn reads_digests(&self) -> bool {
        matches!(self.feed, FeedSpec::Periodic { .. })
            && self.router.cache_knowledge == CacheKnowledge::Engine
    }

    /// The cache knowledge the routers work with: `engine` only where
    /// digests are read ([`RunConfig::reads_digests`]), else `estimated`.
    pub fn effective_cache_knowledge(&self) -> CacheKnowledge {
        match self.reads_digests() {
            true => CacheKnowledge::Engine,
            false => CacheKnowledge::Estimated,
        }
    }
}

/// `unified(1.3,0.01)` for non-default unified settings, else the policy name.
pub fn policy_label(settings: &RouterSettings) -> String {
    let defaults = RouterSettings::default();
    if settings.policy == Policy::Unified
        && (settings.overload_factor != defaults.overload_factor
            || settings.decode_weight != defaults.decode_weight)
    {
        format!(
            "unified({},{})",
            settings.overload_factor, settings.decode_weight
        )
    } else {
        settings.policy.to_string()
    }
}

/// What happened to one request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RequestRecord {
    /// Arrival, ns.
    pub arrival_ns: u64,
    /// First token, ns (0 if rejected).
    pub first_token_ns: u64,
    /// Last token, ns (0 if rejected).
    pub finish_ns: u64,
    /// Engine it ran on (after migration).
    pub engine: usize,
    /// Tokens generated.
    pub output_len: u64,
    /// Too long for the KV cache: never routed (vLLM refuses it).
    pub rejected: bool,
    /// Session, if any.
    pub session: Option<u64>,
}

/// Everything a run produced.
#[derive(Clone, Debug, Default)]
pub struct RunResult {
    /// Per request, in trace order.
    pub requests: Vec<RequestRecord>,
    /// Engine steps, all engines.
    pub steps: u64,
    /// Preemptions, all engines.
    pub preemptions: u64,
    /// Prefix-cache hit and queried tokens, all engines.
    pub prefix_hit_tokens: u64,
    /// Prefix-cache queried tokens, all engines.
    pub prefix_query_tokens: u64,
    /// Requests moved by `migrate_reservation`.
    pub migrations: u64,
    /// Decisions that consulted real state.
    pub decisions_consulting_real: u64,
    /// Picks whose instance real state changed: the router's policy on the
    /// shadow counters alone would have chosen another
    /// (`Decision::real_state_changed`; migrations are counted apart).
    pub decisions_real_changed: u64,
    /// Decisions made.
    pub decisions: u64,
    /// Decisions whose cache hit came from an engine's digest
    /// (`Decision::cache_knowledge`; the final one for a migrated request).
    pub decisions_engine_knowledge: u64,
    /// Picks that adopted a session (`Reason::Adoption`).
    pub adoptions: u64,
    /// Prompt tokens at first admissions (the denominator of the next two).
    pub admitted_prompt_tokens: u64,
    /// Σ over first admissions of the router's believed cache hit (the
    /// decision's `cache_hit_tokens`) above the engine's real hit.
    pub hit_overcounted_tokens: u64,
    /// Σ of the engine's real hit above the router's believed one.
    pub hit_undercounted_tokens: u64,
    /// Age (ns) of the chosen engine's real state at decisions that consulted
    /// fresh real state for it.
    pub decision_real_age_ns: Vec<u64>,
    /// Each replica's counters at the end.
    pub router_stats: Vec<RouterStats>,
    /// Instance shadows not back to zero at the end (must be 0).
    pub leaked_shadows: usize,
    /// With shared reservations: (peer, engine) entries handed to the
    /// replicas before their picks (`Router::update_peer_reservations`).
    pub peer_entries: u64,
    /// With shared reservations: instances whose peers' reservations, as
    /// each replica reads them once every record is old enough after the
    /// last completion, are not back to zero (must be 0).
    pub leaked_peer_reservations: usize,
    /// Requests in each engine, sampled every [`LOAD_SAMPLE_NS`] of
    /// simulated time: `(time ns, per engine)`.
    pub engine_load: Vec<(u64, Vec<u32>)>,
}

/// Sampling period of [`RunResult::engine_load`]: 1 s of simulated time.
pub const LOAD_SAMPLE_NS: u64 = 1_000_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// An engine's step ends (before arrivals at the same instant: the
    /// engine's boundary happens first, as its loop would see a request
    /// only at its next `schedule()`).
    StepEnd(usize),
    /// A trace request arrives.
    Arrival(usize),
    /// A Prometheus scrape of every engine.
    Scrape,
    /// A late completion reaches the router.
    LateComplete(usize),
}

struct EngineSlot {
    engine: Engine,
    feed: EngineFeed,
    in_flight: Option<ScheduledStep>,
}

/// Run one configuration over a trace. Deterministic: the same trace and
/// configuration give the same result.
pub fn simulate(trace: &Trace, config: &RunConfig) -> Result<RunResult, SimError> {
    config.profile.validate()?;
    if config.engines == 0 || config.routers == 0 {
        return Err(SimError::Config(
            "engines and routers must be ≥ 1".to_owned(),
        ));
    }
    let now = Arc::new(AtomicU64::new(0));
    let ids: Vec<String> = (0..config.engines).map(|i| format!("e{i}")).collect();
    let index_of: HashMap<&str, usize> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (id.as_str(), i))
        .collect();
    let routers = (0..config.routers)
        .map(|_| {
            let clock = Clock::from_fn({
                let now = Arc::clone(&now);
                move || now.load(Ordering::Relaxed)
            });
            let router = Router::with_clock(config.router.clone(), clock)?;
            // Each pick that consults real state is also made on the shadow
            // alone, by the router's own policy (RunResult::decisions_real_changed).
            router.set_shadow_comparison(true);
            for id in &ids {
                router.add_instance(id)?;
            }
            Ok(router)
        })
        .collect::<Result<Vec<_>, SimError>>()?;
    // Each replica publishes its reservations to a log the driver reads
    // them back from, `share_delay_ns` late (crate::share).
    let share = config.share_delay_ns.map(|delay_ns| {
        let log = Arc::new(Mutex::new(ShareLog::new(config.routers, &ids, delay_ns)));
        for (replica, router) in routers.iter().enumerate() {
            let sink = LogSink::new(Arc::clone(&log), Arc::clone(&now), replica);
            router.set_reservation_sink(Some(Box::new(sink)));
        }
        log
    });
    if let Some(path) = &config.decision_log {
        for (replica, router) in routers.iter().enumerate() {
            let path = match config.routers {
                1 => path.clone(),
                _ => PathBuf::from(format!("{}.r{replica}", path.display())),
            };
            router.set_decision_log(Some(DecisionLog::append_to(&path)?));
        }
    }
    // Engines publish their cache digests with periodic snapshots (as the
    // vLLM hook does); only tracked when the routers read them, which
    // changes nothing else.
    let publishes_residency = config.reads_digests();
    let mut engines: Vec<EngineSlot> = ids
        .iter()
        .map(|id| {
            let mut engine = Engine::new(config.profile.clone());
            if publishes_residency {
                engine.publish_residency();
            }
            EngineSlot {
                engine,
                feed: EngineFeed::new(id),
                in_flight: None,
            }
        })
        .collect();

    let mut events: BinaryHeap<Reverse<(u64, Event)>> = trace
        .requests
        .iter()
        .enumerate()
        .map(|(i, r)| Reverse((r.arrival_ns, Event::Arrival(i))))
        .collect();
    if let FeedSpec::Scraped { .. } = config.feed {
        events.push(Reverse((0, Event::Scrape)));
    }
    let mut result = RunResult {
        requests: vec![RequestRecord::default(); trace.requests.len()],
        ..RunResult::default()
    };
    let mut reservations: Vec<Option<Reservation>> =
        (0..trace.requests.len()).map(|_| None).collect();
    let mut outstanding = trace.requests.len();
    // The cache hit each request's (final) decision believed in.
    let mut believed_hit = vec![0u64; trace.requests.len()];
    let mut reading = Reading::default();

    let mut next_sample = 0;
    while let Some(Reverse((time, event))) = events.pop() {
        now.store(time, Ordering::Relaxed);
        while next_sample <= time {
            // State between events is constant: the sample at `next_sample`
            // is the state left by the last event before it.
            let load = engines
                .iter()
                .map(|slot| slot.engine.num_requests() as u32)
                .collect();
            result.engine_load.push((next_sample, load));
            next_sample += LOAD_SAMPLE_NS;
        }
        match event {
            Event::Arrival(index) => {
                let trace_request = &trace.requests[index];
                let record = &mut result.requests[index];
                *record = RequestRecord {
                    arrival_ns: time,
                    output_len: trace_request.output_len,
                    session: trace_request.session,
                    ..RequestRecord::default()
                };
                if !engines[0]
                    .engine
                    .fits(trace_request.input_len, trace_request.output_len)
                {
                    record.rejected = true;
                    outstanding -= 1;
                    continue;
                }
                let replica = match config.split {
                    Split::RoundRobin => index % config.routers,
                    Split::Session => {
                        let key = trace_request.session.unwrap_or(index as u64 | 1 << 63);
                        (mix(key, 0x5eed) % config.routers as u64) as usize
                    }
                };
                let router = &routers[replica];
                if config.feed != FeedSpec::None {
                    reading.clear();
                    reading.engines.extend(
                        engines
                            .iter_mut()
                            .filter_map(|slot| slot.feed.read(&config.feed, time)),
                    );
                    router.update_from_reading(&reading);
                }
                if let Some(log) = &share {
                    let peers = lock(log).peers(replica, time);
                    result.peer_entries += router.update_peer_reservations(&peers) as u64;
                }
                let mut request = Request::from_block_hashes(
                    format!("r{index}"),
                    trace_request.router_block_hashes(index),
                    trace_request.input_len,
                );
                if let Some(session) = trace_request.session {
                    request = request.with_session(format!("s{session}"));
                }
                let (decision, mut reservation) = router.pick(&request)?;
                if decision.real_state_changed() == Some(true) {
                    result.decisions_real_changed += 1;
                }
                if decision.reason == Reason::Adoption {
                    result.adoptions += 1;
                }
                let mut consulted = decision.consulted_real_state;
                let mut instance = decision.instance_id;
                let mut hit = (decision.cache_hit_tokens, decision.cache_knowledge);
                if config.migration {
                    if let Some(moved) = router.migrate_reservation(&request, &mut reservation)? {
                        result.migrations += 1;
                        consulted |= moved.consulted_real_state;
                        instance = moved.instance_id;
                        hit = (moved.cache_hit_tokens, moved.cache_knowledge);
                    }
                }
                result.decisions += 1;
                believed_hit[index] = hit.0;
                if hit.1 == CacheKnowledge::Engine {
                    result.decisions_engine_knowledge += 1;
                }
                // With no feed there is nothing to consult, whatever the setting says.
                if consulted && config.feed != FeedSpec::None {
                    result.decisions_consulting_real += 1;
                    if let Some(state) =
                        reading.get(&instance).filter(|s| s.status == Status::Fresh)
                    {
                        result
                            .decision_real_age_ns
                            .push(state.capture_age.as_nanos() as u64);
                    }
                }
                let engine = index_of[instance.as_str()];
                record.engine = engine;
                reservations[index] = Some(reservation);
                let slot = &mut engines[engine];
                slot.engine.add_request(EngineRequest {
                    id: index as u64,
                    prompt_len: trace_request.input_len,
                    output_len: trace_request.output_len,
                    block_hashes: trace_request.kv_block_hashes(index),
                    router_block_hashes: match publishes_residency {
                        true => trace_request.known_router_block_hashes(index),
                        false => Vec::new(),
                    },
                });
                if slot.in_flight.is_none() {
                    start_step(slot, engine, &config.feed, time, &mut events, true);
                    count_hits(slot, &believed_hit, trace, &mut result);
                }
            }
            Event::StepEnd(engine) => {
                let slot = &mut engines[engine];
                let step = slot.in_flight.take().expect("a step was in flight");
                let output = slot.engine.finish_step(&step);
                for id in output.first_token {
                    let index = id as usize;
                    result.requests[index].first_token_ns = time;
                    if let Some(reservation) = reservations[index].as_mut() {
                        reservation.prefill_done();
                    }
                }
                for id in output.finished {
                    let index = id as usize;
                    result.requests[index].finish_ns = time;
                    outstanding -= 1;
                    if late(config, index) {
                        let at = time + config.late_completion_ns;
                        events.push(Reverse((at, Event::LateComplete(index))));
                        continue;
                    }
                    let mut reservation = reservations[index].take().expect("reserved at arrival");
                    reservation.complete();
                }
                let idle = slot.engine.num_requests() == 0;
                slot.feed
                    .step_boundary(&config.feed, &mut slot.engine, time, idle);
                if !idle {
                    start_step(slot, engine, &config.feed, time, &mut events, false);
                    count_hits(slot, &believed_hit, trace, &mut result);
                }
            }
            Event::LateComplete(index) => {
                let mut reservation = reservations[index].take().expect("reserved at arrival");
                reservation.complete();
            }
            Event::Scrape => {
                for slot in &mut engines {
                    slot.feed.scrape(&slot.engine, time);
                }
                if outstanding > 0 {
                    let period = config
                        .feed
                        .period_ns()
                        .expect("scraped feeds have a period");
                    events.push(Reverse((time + period, Event::Scrape)));
                }
            }
        }
    }

    for slot in &engines {
        let counters = slot.engine.counters();
        result.steps += counters.steps;
        result.preemptions += counters.preemptions;
        result.prefix_hit_tokens += counters.prefix_hit_tokens;
        result.prefix_query_tokens += counters.prefix_query_tokens;
        assert_eq!(slot.engine.num_requests(), 0, "every engine drained");
    }
    if let Some(log) = &share {
        // Every record old enough: what each replica reads of the others
        // once the last completion has propagated.
        let settled = now.load(Ordering::Relaxed) + lock(log).delay_ns();
        now.store(settled, Ordering::Relaxed);
        for (replica, router) in routers.iter().enumerate() {
            let peers = lock(log).peers(replica, settled);
            router.update_peer_reservations(&peers);
            result.leaked_peer_reservations += router
                .instances()
                .iter()
                .filter(|view| view.peers != ShadowCounters::default())
                .count();
        }
    }
    for router in &routers {
        result.router_stats.push(router.stats());
        result.leaked_shadows += router
            .instances()
            .iter()
            .filter(|view| view.shadow != ShadowCounters::default())
            .count();
    }
    Ok(result)
}

/// Compare the router's believed cache hit of each request the step just
/// scheduled admitted for the first time with the engine's real one.
fn count_hits(slot: &EngineSlot, believed: &[u64], trace: &Trace, result: &mut RunResult) {
    let step = slot.in_flight.as_ref().expect("just started");
    for admission in step.admitted.iter().filter(|a| !a.resumed) {
        let index = admission.id as usize;
        let believed = believed[index];
        result.admitted_prompt_tokens += trace.requests[index].input_len;
        result.hit_overcounted_tokens += believed.saturating_sub(admission.hit_tokens);
        result.hit_undercounted_tokens += admission.hit_tokens.saturating_sub(believed);
    }
}

/// Whether request `index`'s completion reaches the router late (a fixed,
/// seedless choice per request, so every configuration delays the same ones).
fn late(config: &RunConfig, index: usize) -> bool {
    let unit = (mix(index as u64, 0x1a7e) >> 11) as f64 / (1u64 << 53) as f64;
    config.late_completion_fraction > 0.0 && unit < config.late_completion_fraction
}

fn start_step(
    slot: &mut EngineSlot,
    engine: usize,
    feed: &FeedSpec,
    now_ns: u64,
    events: &mut BinaryHeap<Reverse<(u64, Event)>>,
    turned_busy: bool,
) {
    let step = slot.engine.schedule();
    assert!(
        !step.is_empty(),
        "engine e{engine} has work but scheduled nothing (a request larger than the KV cache?)"
    );
    slot.feed
        .step_boundary(feed, &mut slot.engine, now_ns, turned_busy);
    events.push(Reverse((now_ns + step.duration_ns, Event::StepEnd(engine))));
    slot.in_flight = Some(step);
}

/// Engines per session: distinct engines each session's requests ran on.
pub fn engines_per_session(records: &[RequestRecord]) -> Vec<usize> {
    let mut by_session: HashMap<u64, HashSet<usize>> = HashMap::new();
    for r in records.iter().filter(|r| !r.rejected) {
        if let Some(s) = r.session {
            by_session.entry(s).or_default().insert(r.engine);
        }
    }
    let mut counts: Vec<(u64, usize)> = by_session.into_iter().map(|(s, e)| (s, e.len())).collect();
    counts.sort_unstable();
    counts.into_iter().map(|(_, n)| n).collect()
}

#[cfg(test)]
#[path = "driver_tests.rs"]
mod tests;

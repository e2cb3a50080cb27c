//! Decision latency: pick + reserve + release, block hashing included (the
//! prompt is given as token ids), for 8/64/256 instances and 2k/32k/200k-token
//! prompts, under `unified` and `lmetric`.
//!
//! The scenario (mirrored exactly by `bench/router_baseline.py`, the pure
//! Python baseline): every instance holds one session's history (a shared
//! 1024-token system prompt, a distinct first block, then a shared body, so
//! all later block hashes differ by chaining) in its prefix cache; odd instances hold an
//! outstanding request; every instance has fresh real state. The request
//! continues the history cached on instance N/2 with 256 new tokens, in that
//! session. Every iteration drops its reservation, so the state is the same
//! at every iteration.
//!
//! `decide_knowledge/unified`: the same scenario at 8 instances and 200k
//! tokens, each instance's cache known from its engine's digest (the blocks
//! of the history it holds, `cache_knowledge = engine`) against the router's
//! own estimate (`estimated`, no digests): issue 21's target, ≤ 50 µs.
//!
//! `decide_peers/unified`: the scenario at 8 instances and 2k tokens (the
//! cheapest pick, so the largest ratio) without peers, with 16 peer
//! replicas' reservations on every instance merged (issue 22's target: ≤ 2×
//! the pick without), and the same with a sink that takes this router's own
//! changes (a pick and its release each publish once).
//!
//! Run: `cargo bench -p engine-state-router --bench decide`; medians are in
//! `target/criterion/<group>/<case>/new/estimates.json`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use engine_state_router::{
    CacheKnowledge, PeerReservations, Policy, RealState, Request, Reservation, ReservationSink,
    Router, RouterSettings, ShadowCounters, BLOCK_TOKENS,
};
use engine_state_shm_format::{CacheDigest, Snapshot};

const SYSTEM_TOKENS: usize = 1024;
const NEW_TOKENS: usize = 256;

/// Deterministic pseudo-random token ids below 150,000 (a vocabulary's size).
fn tokens(seed: u64, len: usize) -> Vec<u32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % 150_000) as u32
        })
        .collect()
}

/// The router in its steady state, the held warm-up reservations, and the request.
fn scenario(
    policy: Policy,
    instances: usize,
    prompt_tokens: usize,
) -> (Router, Vec<Reservation>, Request) {
    scenario_knowing(policy, instances, prompt_tokens, CacheKnowledge::default())
}

/// [`scenario`] with `knowledge`; with `Engine`, each instance's real state
/// carries the digest of the history it holds.
fn scenario_knowing(
    policy: Policy,
    instances: usize,
    prompt_tokens: usize,
    knowledge: CacheKnowledge,
) -> (Router, Vec<Reservation>, Request) {
    let settings = RouterSettings {
        policy,
        cache_knowledge: knowledge,
        // Real state is given once; keep it fresh for the whole run.
        real_state_expiry_s: 3_600.0,
        ..RouterSettings::default()
    };
    let ids: Vec<String> = (0..instances).map(|i| format!("engine-{i}")).collect();
    let router = Router::with_instances(settings, &ids).unwrap();
    let system = tokens(0, SYSTEM_TOKENS);
    let history_len = prompt_tokens - SYSTEM_TOKENS - NEW_TOKENS;
    let head_len = history_len.min(BLOCK_TOKENS);
    let body = tokens(1_000_000, history_len - head_len);
    // A distinct first block per session; chaining makes every later block distinct.
    let history =
        |i: usize| [system.clone(), tokens(i as u64 + 1, head_len), body.clone()].concat();
    let mut held = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let request =
            Request::from_tokens(format!("warm-{i}"), history(i)).with_session(format!("s{i}"));
        let (_, reservation) = router.reserve_on(&request, id).unwrap();
        if i % 2 == 1 {
            held.push(reservation);
        }
    }
    router.update_real_state(ids.iter().enumerate().map(|(i, id)| {
        let snapshot = Snapshot {
            num_running: (i % 5) as u64,
            num_waiting: (i % 3) as u64,
            pending_prefill_tokens: ((i * 997) % 20_000) as u64,
            ongoing_decode_tokens: ((i * 7919) % 100_000) as u64,
            max_prefill_remaining: ((i * 997) % 20_000) as u64,
            gpu_blocks_total: 10_000,
            gpu_blocks_free: (10_000 - (i * 131) % 10_000) as u64,
            ..Snapshot::default()
        };
        let real = RealState::fresh(snapshot, Duration::from_millis(20));
        let real = match knowledge {
            CacheKnowledge::Engine => real.with_cache(CacheDigest::new(
                1,
                0,
                engine_state_router::block_hashes(&history(i)),
            )),
            CacheKnowledge::Estimated => real,
        };
        (id.as_str(), real)
    }));
    let k = instances / 2;
    let prompt = [history(k), tokens(999_999, NEW_TOKENS)].concat();
    assert_eq!(prompt.len(), prompt_tokens);
    let request = Request::from_tokens("bench", prompt).with_session(format!("s{k}"));
    (router, held, request)
}

fn decide(c: &mut Criterion) {
    for (policy, name) in [(Policy::Unified, "unified"), (Policy::LMetric, "lmetric")] {
        let mut group = c.benchmark_group(format!("decide/{name}"));
        for prompt_tokens in [2_000, 32_000, 200_000] {
            for instances in [8, 64, 256] {
                let (router, _held, request) = scenario(policy, instances, prompt_tokens);
                // For comparing with the Python baseline's "chose … by …".
                let (decision, _) = router.pick(&request).unwrap();
                eprintln!(
                    "{name} instances={instances} tokens={prompt_tokens}: chose {} by {}",
                    decision.instance_id,
                    decision.reason.name()
                );
                group.throughput(Throughput::Elements(1));
                let id =
                    BenchmarkId::new(format!("{prompt_tokens}tok"), format!("{instances}inst"));
                group.bench_function(id, |b| {
                    b.iter(|| {
                        let (decision, reservation) = router.pick(black_box(&request)).unwrap();
                        drop(reservation);
                        decision
                    })
                });
            }
        }
        group.finish();
    }
}

fn decide_knowledge(c: &mut Criterion) {
    let mut group = c.benchmark_group("decide_knowledge/unified");
    for (knowledge, name) in [
        (CacheKnowledge::Estimated, "estimated"),
        (CacheKnowledge::Engine, "engine"),
    ] {
        let (router, _held, request) = scenario_knowing(Policy::Unified, 8, 200_000, knowledge);
        let (decision, _) = router.pick(&request).unwrap();
        eprintln!(
            "unified {name} instances=8 tokens=200000: chose {} by {}",
            decision.instance_id,
            decision.reason.name()
        );
        group.throughput(Throughput::Elements(1));
        group.bench_function(format!("{name}/200000tok/8inst"), |b| {
            b.iter(|| {
                let (decision, reservation) = router.pick(black_box(&request)).unwrap();
                drop(reservation);
                decision
            })
        });
    }
    group.finish();
}

/// A sink that only keeps the last counters it was given (what a
/// shared-memory sink's map lookup and stores cost is the publisher's bench).
#[derive(Debug, Default)]
struct LastCounters(ShadowCounters, u64);

impl ReservationSink for LastCounters {
    fn reservations_changed(&mut self, _instance_id: &str, counters: &ShadowCounters) {
        self.0 = *counters;
        self.1 += 1;
    }
    fn instance_removed(&mut self, _instance_id: &str) {}
}

fn decide_peers(c: &mut Criterion) {
    let mut group = c.benchmark_group("decide_peers/unified");
    for (case, peers, sink) in [
        ("none", 0, false),
        ("16peers", 16, false),
        ("16peers+sink", 16, true),
    ] {
        let (router, _held, request) = scenario(Policy::Unified, 8, 2_000);
        let ids = router.instance_ids();
        let peers: Vec<PeerReservations> = (0..peers)
            .map(|p| {
                let engines = ids
                    .iter()
                    .enumerate()
                    .map(|(i, id)| {
                        let n = ((p + i) % 4) as u64 + 1;
                        let counters = ShadowCounters {
                            num_requests: n,
                            ongoing_tokens: 3_000 * n,
                            pending_prefill_tokens: 1_000 * n,
                            ongoing_decode_tokens: 2_000 * n,
                            num_prefilling: n,
                            max_prefill_remaining: 1_000,
                        };
                        (id.as_str().into(), counters)
                    })
                    .collect();
                PeerReservations::fresh(&format!("peer-{p}"), engines)
            })
            .collect();
        assert_eq!(
            router.update_peer_reservations(&peers),
            peers.len() * ids.len()
        );
        if sink {
            router.set_reservation_sink(Some(Box::new(LastCounters::default())));
        }
        group.throughput(Throughput::Elements(1));
        group.bench_function(format!("{case}/2000tok/8inst"), |b| {
            b.iter(|| {
                let (decision, reservation) = router.pick(black_box(&request)).unwrap();
                drop(reservation);
                decision
            })
        });
    }
    group.finish();
}

fn hashing(c: &mut Criterion) {
    let mut group = c.benchmark_group("block_hashes");
    for prompt_tokens in [2_000, 32_000, 200_000] {
        let prompt = tokens(1, prompt_tokens);
        group.throughput(Throughput::Bytes((prompt_tokens * 4) as u64));
        group.bench_function(format!("{prompt_tokens}tok"), |b| {
            b.iter(|| engine_state_router::block_hashes(black_box(&prompt)))
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = hashing, decide, decide_knowledge, decide_peers
}
criterion_main!(benches);

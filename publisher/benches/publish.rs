//! `Publisher::publish` to a shared-memory file: the hot path (validation,
//! stamping from the publisher's clock, one seqlock write, the heartbeat
//! stamp). BENCHMARKS.md's Python `publish()` adds the binding's cost on top.
//!
//! `replica_set`: a router replica's publish of its reservations on one
//! engine (`ReplicaPublisher::set`, what the router's sink does at every
//! pick, prefill_done and release: the writer's lock, one seqlock write of
//! the changed words) into a file on /dev/shm (as deployed), in the same
//! run as `publish` on /dev/shm: issue 22's target is ≤ 1 µs.

use criterion::{criterion_group, criterion_main, Criterion};
use engine_state_publisher::{Publisher, PublisherConfig, ReplicaOptions, ReplicaPublisher};
use engine_state_shm_format::{EngineId, Reservations, Snapshot};

/// A scratch directory on /dev/shm when there is one (else the default temp dir).
fn shm_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("es-bench-")
        .tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap()
}

fn publish(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", dir.path().display());
    let config = PublisherConfig::resolve(Some(&uri), Some("bench-0"), Some(50), None).unwrap();
    let mut publisher = Publisher::start(config).unwrap();
    let mut n = 0u64;
    c.bench_function("publish", |b| {
        b.iter(|| {
            n += 1;
            publisher
                .publish(Snapshot {
                    num_running: n & 7,
                    num_waiting: 1,
                    ..Snapshot::default()
                })
                .unwrap()
        })
    });
}

fn replica_set(c: &mut Criterion) {
    let dir = shm_dir();
    let uri =
        engine_state_redis::StateUri::parse(&format!("file://{}", dir.path().display())).unwrap();
    let mut group = c.benchmark_group("replica");
    let config = PublisherConfig {
        uri: uri.clone(),
        ..PublisherConfig::resolve(None, Some("bench-engine"), Some(50), None).unwrap()
    };
    let mut engine = Publisher::start(config).unwrap();
    let mut n = 0u64;
    group.bench_function("engine_publish_shm", |b| {
        b.iter(|| {
            n += 1;
            engine
                .publish(Snapshot {
                    num_running: n & 7,
                    ..Snapshot::default()
                })
                .unwrap()
        })
    });
    let replica = ReplicaPublisher::start(
        &uri,
        &EngineId::new("bench-router").unwrap(),
        ReplicaOptions::default(),
    )
    .unwrap();
    let engines: Vec<String> = (0..16).map(|i| format!("engine-{i}")).collect();
    for id in &engines {
        replica.set(id, &Reservations::default());
    }
    let mut n = 0u64;
    group.bench_function("replica_set_shm", |b| {
        b.iter(|| {
            n += 1;
            let counters = Reservations {
                num_requests: n & 7,
                ongoing_tokens: 1000 * (n & 7),
                pending_prefill_tokens: 500 * (n & 3),
                ..Reservations::default()
            };
            replica.set(&engines[(n % 16) as usize], &counters)
        })
    });
    assert_eq!(replica.stats().errors(), 0);
    group.finish();
}

criterion_group!(benches, publish, replica_set);
criterion_main!(benches);

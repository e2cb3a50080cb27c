//! `Publisher::publish` to a shared-memory file: the hot path (validation,
//! stamping from the publisher's clock, one seqlock write, the heartbeat
//! stamp). BENCHMARKS.md's Python `publish()` adds the binding's cost on top.

use criterion::{criterion_group, criterion_main, Criterion};
use engine_state_publisher::{Publisher, PublisherConfig};
use engine_state_shm_format::Snapshot;

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

criterion_group!(benches, publish);
criterion_main!(benches);

//! A router replica's publish on shared memory (docs/FORMAT.md, "Shared
//! reservations"): one `RouterFileWriter::set` into a file in /dev/shm,
//! against the engine writer's `ShmWriter::publish` of a snapshot in the
//! same run (the baseline: one seqlock write of 16 words), and a peer's
//! `RouterFile::read` of 16 engines. The bound: a publish ≤ 1 µs.

use std::hint::black_box;
use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion};
use engine_state_shm_format::{
    EngineId, Reservations, RouterFile, RouterFileWriter, RouterWriterOptions, ShmWriter, Snapshot,
    WriterOptions,
};

/// A scratch directory on shared memory when the host has it (what a
/// router uses), else in the temporary directory.
fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

fn counters(n: u64) -> Reservations {
    Reservations {
        num_requests: n & 15,
        ongoing_tokens: 1_000 * n,
        pending_prefill_tokens: 300 * n,
        ongoing_decode_tokens: 700 * n,
        num_prefilling: n & 3,
        max_prefill_remaining: 250 * n,
    }
}

fn publish(c: &mut Criterion) {
    let dir = scratch();
    let engines: Vec<String> = (0..16).map(|i| format!("engine-{i}")).collect();
    let mut router = RouterFileWriter::create(
        dir.path(),
        &EngineId::new("router-a").unwrap(),
        &RouterWriterOptions::default(),
    )
    .unwrap();
    for (i, engine) in engines.iter().enumerate() {
        router.set(engine, &counters(i as u64)).unwrap();
    }
    let mut engine = ShmWriter::create(
        dir.path(),
        &EngineId::new("engine-0").unwrap(),
        &WriterOptions::default(),
        &Snapshot::default(),
    )
    .unwrap();

    let mut group = c.benchmark_group("publish");
    let mut n = 0u64;
    group.bench_function("engine ShmWriter::publish (baseline)", |b| {
        b.iter(|| {
            n += 1;
            engine
                .publish(black_box(&Snapshot {
                    num_running: n & 7,
                    num_waiting: 1,
                    pending_prefill_tokens: n,
                    ..Snapshot::default()
                }))
                .unwrap()
        })
    });
    // A reserve: every counter of one engine changes (six words).
    group.bench_function("router set, six counters changed", |b| {
        b.iter(|| {
            n += 1;
            let engine = &engines[(n & 15) as usize];
            router.set(black_box(engine), &counters(n)).unwrap()
        })
    });
    // A prefill done: two counters change.
    group.bench_function("router set, two counters changed", |b| {
        let mut c = counters(1);
        b.iter(|| {
            n += 1;
            c.pending_prefill_tokens = n;
            c.ongoing_decode_tokens = n + 1;
            router.set(black_box(&engines[3]), &c).unwrap()
        })
    });
    // The same with the caller's clock reading (`set_at`).
    group.bench_function("router set_at, six counters changed", |b| {
        b.iter(|| {
            n += 1;
            let engine = &engines[(n & 15) as usize];
            router.set_at(black_box(engine), &counters(n), n).unwrap()
        })
    });
    group.finish();

    let reader = RouterFile::open(router.path()).unwrap();
    c.bench_function("router read, 16 engines", |b| {
        b.iter(|| black_box(reader.read().unwrap()))
    });
    // A poller's read: the same engines as last time, their ids kept.
    let mut record = reader.read().unwrap();
    c.bench_function("router read_into, 16 engines", |b| {
        b.iter(|| {
            reader.read_into(&mut record).unwrap();
            black_box(&record);
        })
    });
}

criterion_group!(benches, publish);
criterion_main!(benches);

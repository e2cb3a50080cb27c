//! The C ABI against the Rust reader, in the same run (issue 15's targets:
//! one engine read ≤ 2× the Rust read, a 1,024-engine scan ≤ 1.2×). The ABI
//! is called through its `extern "C"` functions exactly as C calls them; the
//! difference is what C pays: the handle's lock, the panic guard, and the
//! copy into a caller's fixed-size `EsEngine`.
//!
//! `cargo bench -p engine-state-capi --bench capi`

use std::ffi::CString;
use std::hint::black_box;
use std::path::Path;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use engine_state::{
    es_close, es_open, es_options_init_sized, es_read, es_read_engine, EsCode, EsEngine, EsOptions,
    EsSource,
};
use engine_state_reader::{ReaderOptions, Reading, ShmDir, Source};
use engine_state_shm_format::{monotonic_ns, EngineId, ShmWriter, Snapshot, WriterOptions};

fn shm_root() -> &'static Path {
    if Path::new("/dev/shm").is_dir() {
        Path::new("/dev/shm")
    } else {
        Path::new("/tmp")
    }
}

/// `n` engines `engine-0000`…, each with a busy snapshot.
fn engines_dir(n: usize) -> (tempfile::TempDir, Vec<ShmWriter>) {
    let dir = tempfile::tempdir_in(shm_root()).unwrap();
    let writers = (0..n)
        .map(|i| {
            let snapshot = Snapshot {
                captured_mono_ns: monotonic_ns(),
                num_running: i as u64,
                num_waiting: 3,
                gpu_blocks_total: 1000,
                gpu_blocks_free: 400,
                ..Snapshot::default()
            };
            let id = EngineId::new(&format!("engine-{i:04}")).unwrap();
            ShmWriter::create(dir.path(), &id, &WriterOptions::default(), &snapshot).unwrap()
        })
        .collect();
    (dir, writers)
}

/// Neither side lists the directory during the measurement.
const NO_RESCAN_NS: u64 = 3_600_000_000_000;

fn rust_source(dir: &Path) -> ShmDir {
    let options = ReaderOptions {
        rescan_interval: std::time::Duration::from_nanos(NO_RESCAN_NS),
        ..ReaderOptions::default()
    };
    ShmDir::open(dir, options).unwrap()
}

/// An `EsSource` handle, closed on drop.
struct Handle(*mut EsSource);

impl Handle {
    fn open(dir: &Path) -> Handle {
        let mut options = EsOptions::default();
        // SAFETY: a writable EsOptions of its size.
        let code = unsafe { es_options_init_sized(&mut options, std::mem::size_of::<EsOptions>()) };
        assert_eq!(code, EsCode::Ok);
        options.rescan_interval_ns = NO_RESCAN_NS;
        let uri = CString::new(format!("file://{}", dir.display())).unwrap();
        let mut source = std::ptr::null_mut();
        // SAFETY: a C string, whole options, a writable out-pointer.
        let code = unsafe { es_open(uri.as_ptr(), &options, &mut source) };
        assert_eq!(code, EsCode::Ok);
        Handle(source)
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: the handle from es_open, closed once.
        unsafe { es_close(self.0) };
    }
}

fn bench_one_engine(c: &mut Criterion) {
    let (dir, _writers) = engines_dir(1);
    let mut rust = rust_source(dir.path());
    let capi = Handle::open(dir.path());
    let id = CString::new("engine-0000").unwrap();
    let mut out = EsEngine::default();

    let mut group = c.benchmark_group("capi_read_one_engine");
    group.bench_function("rust_shm_dir_read_engine", |b| {
        b.iter(|| black_box(rust.read_engine("engine-0000")))
    });
    group.bench_function("c_abi_es_read_engine", |b| {
        b.iter(|| {
            // SAFETY: a live handle, a C string, a writable engine.
            let code = unsafe { es_read_engine(capi.0, id.as_ptr(), &mut out) };
            black_box((code, &out));
        })
    });
    group.finish();
}

fn bench_scan(c: &mut Criterion) {
    let mut group = c.benchmark_group("capi_scan_all_engines");
    for n in [1usize, 1024] {
        let (dir, _writers) = engines_dir(n);
        let mut rust = rust_source(dir.path());
        let mut reading = Reading::default();
        let capi = Handle::open(dir.path());
        let mut engines = vec![EsEngine::default(); n];
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::new("rust_shm_dir", n), &n, |b, _| {
            b.iter(|| {
                rust.read_into(&mut reading).unwrap();
                black_box(reading.engines.len())
            })
        });
        group.bench_with_input(BenchmarkId::new("c_abi_es_read", n), &n, |b, _| {
            b.iter(|| {
                let mut count = 0;
                // SAFETY: a live handle, an array of n engines, a count.
                let code = unsafe { es_read(capi.0, engines.as_mut_ptr(), n, &mut count) };
                assert_eq!((code, count), (EsCode::Ok, n));
                black_box(&engines);
            })
        });
    }
    group.finish();
}

/// 16 peer replicas of 8 engines each, read through `es_read_replicas`
/// against the Rust `ReplicaSource` in the same run (what a router reads
/// before a pick).
fn bench_replicas(c: &mut Criterion) {
    use engine_state::EsReservation;
    use engine_state::{es_close_replicas, es_open_replicas, es_read_replicas, EsReplica};
    use engine_state_reader::{open_replicas, ReplicaReading, StateUri};
    use engine_state_shm_format::{Reservations, RouterFileWriter, RouterWriterOptions};

    let root = tempfile::tempdir_in(shm_root()).unwrap();
    let state = root.path().join("engines");
    std::fs::create_dir(&state).unwrap();
    let _writers: Vec<RouterFileWriter> = (0..16)
        .map(|r| {
            let id = EngineId::new(&format!("replica-{r:02}")).unwrap();
            let mut w =
                RouterFileWriter::create(&state, &id, &RouterWriterOptions::default()).unwrap();
            for e in 0..8u64 {
                let counters = Reservations {
                    num_requests: e + 1,
                    ..Reservations::default()
                };
                w.set(&format!("engine-{e}"), &counters).unwrap();
            }
            w
        })
        .collect();
    let options = ReaderOptions {
        rescan_interval: std::time::Duration::from_nanos(NO_RESCAN_NS),
        ..ReaderOptions::default()
    };
    let uri = StateUri::parse(&format!("file://{}", state.display())).unwrap();
    let mut rust = open_replicas(&uri, Some("own"), options).unwrap();
    let mut reading = ReplicaReading::default();
    let c_uri = CString::new(format!("file://{}", state.display())).unwrap();
    let own = CString::new("own").unwrap();
    let mut handle = std::ptr::null_mut();
    // SAFETY: C strings, default options, a writable out-pointer.
    let code =
        unsafe { es_open_replicas(c_uri.as_ptr(), own.as_ptr(), std::ptr::null(), &mut handle) };
    assert_eq!(code, EsCode::Ok);
    let mut replicas = vec![EsReplica::default(); 16];
    let mut entries = vec![EsReservation::default(); 128];
    let mut group = c.benchmark_group("replicas_16x8");
    group.bench_function("rust", |b| {
        b.iter(|| {
            rust.read_into(&mut reading).unwrap();
            black_box(reading.replicas.len())
        })
    });
    group.bench_function("c_abi", |b| {
        b.iter(|| {
            let (mut count, mut entry_count) = (0, 0);
            // SAFETY: the live handle, arrays of 16 and 128, writable counts.
            let code = unsafe {
                es_read_replicas(
                    handle,
                    replicas.as_mut_ptr(),
                    16,
                    &mut count,
                    entries.as_mut_ptr(),
                    128,
                    &mut entry_count,
                )
            };
            assert_eq!((code, count, entry_count), (EsCode::Ok, 16, 128));
            black_box(count)
        })
    });
    group.finish();
    // SAFETY: closed once.
    unsafe { es_close_replicas(handle) };
}

criterion_group!(benches, bench_one_engine, bench_scan, bench_replicas);
criterion_main!(benches);

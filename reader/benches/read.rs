//! Read latency of the shared-memory reader against what routers use today.
//!
//! `cargo bench -p engine-state-reader --bench read` runs, in one process:
//! - criterion medians: one engine (seqlock read alone, and through `ShmDir`)
//!   with a writer *in another process* at 20 Hz; full scans of 8, 64 and
//!   1024 engines; the same against JSON files (parse included) and, when a
//!   `redis-server` is on the PATH, a Redis GET/MGET on loopback;
//! - a percentile pass (p50/p99/p999 of single reads, timer overhead
//!   subtracted) with the writer at 20 Hz and publishing continuously;
//! - one cache digest of 430 entries (a 220k-token engine's default
//!   capacity): the file's seqlock read and checks (`DigestFile::read`), and
//!   the decode of its Redis value.
//! - cache digests (docs/FORMAT.md, "Cache residency"): one engine with a
//!   430-entry digest read without digests, with digests whose version did
//!   not move, and with a version that moved at every read (the digest file
//!   read and a new `Arc`); 1,024 engines scanned the same three ways.
//!
//! The writer runs in a child process: this same executable, started with
//! `ES_BENCH_WRITER=<dir>:<id>:<hz|max>`.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use engine_state_reader::{ReaderOptions, Reading, ShmDir, Snapshot, Source};
use engine_state_shm_format::{
    decode_digest_value, encode_digest_value, monotonic_ns, CacheDigest, DigestFile, DigestOptions,
    DigestRecord, DigestWriter, EngineId, ShmFile, ShmWriter, WriterOptions,
};

fn snapshot(i: u64) -> Snapshot {
    Snapshot {
        captured_mono_ns: monotonic_ns(),
        step: i,
        num_running: 12,
        num_waiting: 3,
        gpu_blocks_total: 20_000,
        gpu_blocks_free: 5_000,
        pending_prefill_tokens: 40_000,
        ongoing_decode_tokens: 90_000,
        num_prefilling: 2,
        max_prefill_remaining: 31_000,
        ..Snapshot::default()
    }
}

/// Child mode: publish into `<dir>/<id>` at `hz` (or as fast as possible) until killed.
fn writer_main(spec: &str) {
    let mut parts = spec.splitn(3, ':');
    let (dir, id, rate) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    let id = EngineId::new(id).unwrap();
    let mut writer =
        ShmWriter::create(Path::new(dir), &id, &WriterOptions::default(), &snapshot(0)).unwrap();
    let period = match rate {
        "max" => None,
        hz => Some(Duration::from_secs_f64(1.0 / hz.parse::<f64>().unwrap())),
    };
    let mut i = 0;
    loop {
        i += 1;
        writer.publish(&snapshot(i)).unwrap();
        writer.stamp_heartbeat(monotonic_ns());
        if let Some(period) = period {
            std::thread::sleep(period);
        }
    }
}

struct Writer(Child);

impl Writer {
    fn start(dir: &Path, id: &str, rate: &str) -> Writer {
        let child = Command::new(std::env::current_exe().unwrap())
            .env("ES_BENCH_WRITER", format!("{}:{id}:{rate}", dir.display()))
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let path = dir.join(id);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !path.exists() {
            assert!(Instant::now() < deadline, "bench writer did not start");
            std::thread::sleep(Duration::from_millis(5));
        }
        Writer(child)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The JSON object a file-based feed writes per engine (what routers scrape today).
fn json_of(s: &Snapshot, id: &str) -> String {
    let mut map = serde_json::Map::new();
    map.insert("engine_id".into(), id.into());
    for (name, value) in Snapshot::FIELD_NAMES.iter().zip(s.to_words()) {
        map.insert((*name).into(), value.into());
    }
    serde_json::Value::Object(map).to_string()
}

/// What a JSON feed file holds, parsed the fast way (typed serde, no `Value`).
#[derive(serde::Deserialize)]
#[allow(dead_code)]
struct JsonState {
    engine_id: String,
    captured_mono_ns: u64,
    captured_unix_ns: u64,
    step: u64,
    num_running: u64,
    num_waiting: u64,
    gpu_blocks_total: u64,
    gpu_blocks_free: u64,
    pending_prefill_tokens: u64,
    ongoing_decode_tokens: u64,
    num_prefilling: u64,
    max_prefill_remaining: u64,
    num_preempted: u64,
    flags: u64,
}

/// Reads a JSON feed file (read + typed parse): the baseline reader.
fn read_json(path: &Path) -> JsonState {
    let text = std::fs::read(path).unwrap();
    serde_json::from_slice(&text).unwrap()
}

fn engines_dir(n: usize) -> (tempfile::TempDir, Vec<ShmWriter>, PathBuf) {
    let dir = tempfile::tempdir_in(shm_root()).unwrap();
    let writers = (0..n)
        .map(|i| {
            let id = EngineId::new(&format!("engine-{i:04}")).unwrap();
            ShmWriter::create(
                dir.path(),
                &id,
                &WriterOptions::default(),
                &snapshot(i as u64),
            )
            .unwrap()
        })
        .collect();
    let json_dir = dir.path().join(".json"); // dot-dir: invisible to ShmDir
    std::fs::create_dir(&json_dir).unwrap();
    for i in 0..n {
        std::fs::write(
            json_dir.join(format!("engine-{i:04}.json")),
            json_of(&snapshot(i as u64), "e"),
        )
        .unwrap();
    }
    (dir, writers, json_dir)
}

fn shm_root() -> &'static Path {
    if Path::new("/dev/shm").is_dir() {
        Path::new("/dev/shm")
    } else {
        Path::new("/tmp")
    }
}

fn no_rescan() -> ReaderOptions {
    ReaderOptions {
        rescan_interval: Duration::from_secs(3600),
        ..ReaderOptions::default()
    }
}

fn bench_one_engine(c: &mut Criterion) {
    let dir = tempfile::tempdir_in(shm_root()).unwrap();
    let _writer = Writer::start(dir.path(), "e0", "20");
    let file = ShmFile::open(dir.path().join("e0")).unwrap();
    let mut source = ShmDir::open(dir.path(), no_rescan()).unwrap();
    let json_path = dir.path().join(".e0.json");
    std::fs::write(&json_path, json_of(&snapshot(1), "e0")).unwrap();

    let mut group = c.benchmark_group("read_one_engine_writer_20hz");
    // The floor under any age computation: one CLOCK_MONOTONIC read.
    group.bench_function("clock_monotonic_ns", |b| {
        b.iter(|| black_box(monotonic_ns()))
    });
    group.bench_function("shm_seqlock_read", |b| b.iter(|| black_box(file.read())));
    group.bench_function("shm_dir_read_engine", |b| {
        b.iter(|| black_box(source.read_engine("e0")))
    });
    group.bench_function("json_file_read_parse", |b| {
        b.iter(|| black_box(read_json(&json_path)))
    });
    if let Some(mut redis) = RedisServer::start() {
        let mut con = redis.connection();
        let payload = snapshot(1).to_le_bytes().to_vec();
        let _: () = redis::cmd("SET")
            .arg("es:e0")
            .arg(&payload)
            .query(&mut con)
            .unwrap();
        group.bench_function("redis_get_loopback", |b| {
            b.iter(|| {
                black_box(
                    redis::cmd("GET")
                        .arg("es:e0")
                        .query::<Vec<u8>>(&mut con)
                        .unwrap(),
                )
            })
        });
        redis.stop();
    } else {
        eprintln!("redis-server not on PATH: skipping the Redis baseline");
    }
    group.finish();
}

fn bench_scan(c: &mut Criterion) {
    let mut group = c.benchmark_group("scan_all_engines");
    for n in [8usize, 64, 1024] {
        let (dir, _writers, json_dir) = engines_dir(n);
        let mut source = ShmDir::open(dir.path(), no_rescan()).unwrap();
        let mut reading = Reading::default();
        source.read_into(&mut reading).unwrap();
        assert_eq!(reading.engines.len(), n);
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::new("shm_dir", n), &n, |b, _| {
            b.iter(|| {
                source.read_into(&mut reading).unwrap();
                black_box(reading.engines.len())
            })
        });
        let paths: Vec<PathBuf> = (0..n)
            .map(|i| json_dir.join(format!("engine-{i:04}.json")))
            .collect();
        group.bench_with_input(BenchmarkId::new("json_files", n), &n, |b, _| {
            b.iter(|| paths.iter().map(|p| read_json(p).num_running).sum::<u64>())
        });
        if let Some(mut redis) = RedisServer::start() {
            let mut con = redis.connection();
            let keys: Vec<String> = (0..n).map(|i| format!("es:engine-{i:04}")).collect();
            for key in &keys {
                let _: () = redis::cmd("SET")
                    .arg(key)
                    .arg(snapshot(1).to_le_bytes().to_vec())
                    .query(&mut con)
                    .unwrap();
            }
            group.bench_with_input(BenchmarkId::new("redis_mget", n), &n, |b, _| {
                b.iter(|| {
                    black_box(
                        redis::cmd("MGET")
                            .arg(&keys)
                            .query::<Vec<Vec<u8>>>(&mut con)
                            .unwrap(),
                    )
                })
            });
            redis.stop();
        }
    }
    group.finish();
}

/// Child mode: create `n` files `torn-NNNN` in `dir` whose sequence is odd
/// (a write that never ended), then exit without retiring them: torn files
/// of a dead writer, as a crash mid-write leaves them.
fn torn_files_main(spec: &str) {
    use std::os::unix::fs::FileExt;
    let (dir, n) = spec.rsplit_once(':').unwrap();
    let writers: Vec<ShmWriter> = (0..n.parse::<usize>().unwrap())
        .map(|i| {
            let id = EngineId::new(&format!("torn-{i:04}")).unwrap();
            let writer =
                ShmWriter::create(Path::new(dir), &id, &WriterOptions::default(), &snapshot(0))
                    .unwrap();
            std::fs::OpenOptions::new()
                .write(true)
                .open(writer.path())
                .unwrap()
                .write_all_at(
                    &3u64.to_le_bytes(),
                    engine_state_shm_format::layout::SEQ_OFFSET as u64,
                )
                .unwrap();
            writer
        })
        .collect();
    std::mem::forget(writers); // no retiring: the files stay ACTIVE
    std::process::exit(0);
}

/// A scan of 8 live engines among 1,000 torn files of dead writers: each
/// torn file costs the seqlock's whole retry bound once, not at every read.
fn bench_torn_dead(c: &mut Criterion) {
    let (dir, _writers, _) = engines_dir(8);
    let status = Command::new(std::env::current_exe().unwrap())
        .env(
            "ES_BENCH_TORN_FILES",
            format!("{}:1000", dir.path().display()),
        )
        .status()
        .unwrap();
    assert!(status.success(), "the torn files' writer failed");
    let mut source = ShmDir::open(dir.path(), no_rescan()).unwrap();
    let mut reading = Reading::default();
    source.read_into(&mut reading).unwrap();
    assert_eq!(reading.engines.len(), 1008);
    let mut group = c.benchmark_group("scan_with_torn_dead_files");
    group.throughput(Throughput::Elements(1008));
    group.bench_function("shm_dir_8_live_1000_torn", |b| {
        b.iter(|| {
            source.read_into(&mut reading).unwrap();
            black_box(reading.engines.len())
        })
    });
    group.finish();
}

/// Entries of the digest benchmarks: ~220k tokens of KV cache in 512-token
/// router blocks (the example engine).
const DIGEST_ENTRIES: usize = 430;

/// One engine's writers: its file, and its digest file with
/// [`DIGEST_ENTRIES`] entries at `version`.
struct DigestEngine {
    engine: ShmWriter,
    digest: DigestWriter,
    version: u64,
    blocks: Vec<u64>,
}

impl DigestEngine {
    fn create(dir: &Path, i: usize) -> DigestEngine {
        let id = EngineId::new(&format!("engine-{i:04}")).unwrap();
        let engine = ShmWriter::create(dir, &id, &WriterOptions::default(), &snapshot(1)).unwrap();
        let blocks: Vec<u64> = (0..DIGEST_ENTRIES as u64)
            .map(|b| b.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ i as u64)
            .collect();
        let options = DigestOptions {
            capacity: DIGEST_ENTRIES,
            generation: engine.generation(),
            ..DigestOptions::default()
        };
        let first = CacheDigest::new(1, monotonic_ns(), blocks.clone());
        let digest = DigestWriter::create(dir, &id, &options, &first, 430, 0).unwrap();
        let mut engine = DigestEngine {
            engine,
            digest,
            version: 1,
            blocks,
        };
        engine.name_version();
        engine
    }

    /// A snapshot naming the digest's version (as a publisher's next publish).
    fn name_version(&mut self) {
        let snap = Snapshot {
            cache_blocks: DIGEST_ENTRIES as u64,
            cache_version: self.version,
            ..snapshot(self.version)
        };
        self.engine.publish(&snap).unwrap();
        self.engine.stamp_heartbeat(monotonic_ns());
    }

    /// A new digest version (one block changed), then a snapshot naming it.
    fn move_version(&mut self) {
        self.version += 1;
        self.blocks[0] = self.version;
        let digest = CacheDigest::new(self.version, monotonic_ns(), self.blocks.clone());
        self.digest.publish(&digest, 430, 0).unwrap();
        self.name_version();
    }
}

/// Cache digests: one engine and 1,024, each read without digests, with
/// digests that did not move, and with digests moved before every read
/// (the writes are not timed: `iter_custom` times the reads alone).
fn bench_digests(c: &mut Criterion) {
    let digests = no_rescan().with_cache_digests(true);
    let mut group = c.benchmark_group("read_with_cache_digests");
    for n in [1usize, 1024] {
        let tmp = tempfile::tempdir_in(shm_root()).unwrap();
        let dir = tmp.path().join("engines");
        std::fs::create_dir(&dir).unwrap();
        let mut engines: Vec<DigestEngine> =
            (0..n).map(|i| DigestEngine::create(&dir, i)).collect();
        let mut plain = ShmDir::open(&dir, no_rescan()).unwrap();
        let mut with = ShmDir::open(&dir, digests).unwrap();
        let mut reading = Reading::default();
        with.read_into(&mut reading).unwrap();
        assert_eq!(reading.engines.len(), n);
        assert!(reading.errors.is_empty(), "{:?}", reading.errors);
        assert!(reading
            .engines
            .iter()
            .all(|e| e.cache.as_ref().is_some_and(|d| d.len() == DIGEST_ENTRIES)));
        let label = if n == 1 { "one_engine" } else { "scan_1024" };
        group.throughput(Throughput::Elements(n as u64));
        group.bench_function(BenchmarkId::new(label, "no_digests"), |b| {
            b.iter(|| {
                plain.read_into(&mut reading).unwrap();
                black_box(reading.engines.len())
            })
        });
        group.bench_function(BenchmarkId::new(label, "digest_not_moved"), |b| {
            b.iter(|| {
                with.read_into(&mut reading).unwrap();
                black_box(reading.engines.len())
            })
        });
        group.bench_function(BenchmarkId::new(label, "digest_moved"), |b| {
            b.iter_custom(|iters| {
                let mut timed = Duration::ZERO;
                for _ in 0..iters {
                    for engine in &mut engines {
                        engine.move_version();
                    }
                    let start = Instant::now();
                    with.read_into(&mut reading).unwrap();
                    timed += start.elapsed();
                    black_box(reading.engines.len());
                }
                timed
            })
        });
        let moved = reading.engines[0].cache.as_ref().unwrap();
        assert_eq!(
            moved.version(),
            engines[0].version,
            "the moved digest was read"
        );
    }
    group.finish();
}

/// Single-read percentiles: criterion reports central values only.
fn percentiles() {
    fn report(name: &str, mut samples: Vec<u64>, overhead: u64) {
        samples.sort_unstable();
        let at =
            |q: f64| samples[((samples.len() as f64 - 1.0) * q) as usize].saturating_sub(overhead);
        println!(
            "{name:<44} p50 {:>7} ns   p99 {:>7} ns   p999 {:>8} ns",
            at(0.5),
            at(0.99),
            at(0.999)
        );
    }
    fn sample(n: usize, mut f: impl FnMut()) -> Vec<u64> {
        (0..n)
            .map(|_| {
                let start = Instant::now();
                f();
                start.elapsed().as_nanos() as u64
            })
            .collect()
    }
    const N: usize = 2_000_000;
    let timer = sample(N, || {});
    let mut sorted = timer.clone();
    sorted.sort_unstable();
    let overhead = sorted[N / 2];
    println!("\nsingle-read latency ({N} samples each, timer overhead {overhead} ns subtracted)");
    let dir = tempfile::tempdir_in(shm_root()).unwrap();
    for rate in ["20", "max"] {
        let id = format!("w{rate}");
        let _writer = Writer::start(dir.path(), &id, rate);
        let file = ShmFile::open(dir.path().join(&id)).unwrap();
        let mut torn = 0u64;
        let samples = sample(N, || {
            if black_box(file.read()).is_err() {
                torn += 1;
            }
        });
        let label = if rate == "max" {
            "writer publishing continuously"
        } else {
            "writer at 20 Hz"
        };
        report(&format!("shm seqlock read, {label}"), samples, overhead);
        println!("{:<44} torn results: {torn} of {N}", "");
    }
    let json_path = dir.path().join(".e.json");
    std::fs::write(&json_path, json_of(&snapshot(1), "e")).unwrap();
    report(
        "json file read + parse",
        sample(N / 20, || {
            black_box(read_json(&json_path).num_running);
        }),
        overhead,
    );
    if let Some(mut redis) = RedisServer::start() {
        let mut con = redis.connection();
        let _: () = redis::cmd("SET")
            .arg("k")
            .arg(snapshot(1).to_le_bytes().to_vec())
            .query(&mut con)
            .unwrap();
        let samples = sample(N / 40, || {
            drop(black_box(
                redis::cmd("GET").arg("k").query::<Vec<u8>>(&mut con),
            ))
        });
        report("redis GET on loopback (TCP)", samples, overhead);
        redis.stop();
    }
}

/// A throwaway `redis-server` on a free loopback port, if one is installed.
struct RedisServer {
    child: Child,
    port: u16,
}

impl RedisServer {
    fn start() -> Option<RedisServer> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .ok()?
            .local_addr()
            .ok()?
            .port();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .spawn()
            .ok()?;
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Some(RedisServer { child, port })
    }

    fn connection(&self) -> redis::Connection {
        redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))
            .unwrap()
            .get_connection()
            .unwrap()
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One digest of `entries` distinct blocks, read from its file and decoded
/// from its Redis value (docs/FORMAT.md, "Cache residency").
fn bench_cache_digest(c: &mut Criterion) {
    let entries = 430;
    let state = tempfile::tempdir_in(shm_root()).unwrap();
    let blocks: Vec<u64> = (0..entries as u64)
        .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .collect();
    let digest = CacheDigest::new(1, monotonic_ns(), blocks);
    let options = DigestOptions {
        capacity: entries,
        ..DigestOptions::default()
    };
    let id = EngineId::new("digest-0").unwrap();
    let writer = DigestWriter::create(state.path(), &id, &options, &digest, 430, 0).unwrap();
    let file = DigestFile::open(writer.path()).unwrap();
    assert_eq!(file.read().unwrap().len(), entries);
    let value = encode_digest_value(&DigestRecord {
        digest,
        ..DigestRecord::default()
    })
    .unwrap();
    let mut group = c.benchmark_group("read_cache_digest_430");
    group.bench_function("digest_file_read", |b| b.iter(|| black_box(file.read())));
    group.bench_function("decode_digest_value", |b| {
        b.iter(|| black_box(decode_digest_value(black_box(&value))))
    });
    group.finish();
    drop(writer);
}

fn main() {
    if let Ok(spec) = std::env::var("ES_BENCH_WRITER") {
        writer_main(&spec);
        return;
    }
    if let Ok(spec) = std::env::var("ES_BENCH_TORN_FILES") {
        torn_files_main(&spec);
    }
    let mut c = Criterion::default().configure_from_args();
    bench_one_engine(&mut c);
    bench_scan(&mut c);
    bench_torn_dead(&mut c);
    bench_cache_digest(&mut c);
    bench_digests(&mut c);
    c.final_summary();
    if std::env::args().any(|a| a == "--bench") {
        percentiles();
    }
}

//! Redis benchmarks (results in BENCHMARKS.md, history in docs/bench-history/; `make bench` runs them):
//!
//! 1. publish → visible to a reader in another process, direct sink and via
//!    the agent (p50/p99, loopback);
//! 2. reading 8, 64 and 1024 engines in one round trip;
//! 3. the agent relaying 1024 engines published at 20 Hz: its CPU use and
//!    relay lag;
//! 4. records the agent writes per engine and period for engines that run a
//!    real `Publisher` (heartbeat thread ticking between publishes);
//! 5. reading 8 engines whose registry also holds 100 000 junk members
//!    (half not engine ids, half valid ids with no key: a registry flood).
//!
//! Starts its own redis-server on a free port. Usage:
//! `redis_bench [--seconds N] [--poll-us N] [--only e2e|read|load|beats|flood]`
//! (default 10 s per latency run; the agent runs with its defaults unless
//! `--poll-us` is given; `--only` runs one of the parts).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use engine_state_reader::{open, ReaderOptions, Reading, StateUri};
use engine_state_redis::{engine_key, registry_key, RedisRecord, STATE_ACTIVE};
use engine_state_shm_format::{monotonic_ns, EngineId, ShmWriter, Snapshot, WriterOptions};
use engine_state_tests::{free_port, Proc, RedisServer};

fn flag(name: &str) -> Option<u64> {
    std::env::args()
        .skip_while(|a| a != name)
        .nth(1)
        .map(|s| s.parse().unwrap_or_else(|_| panic!("{name} N")))
}

/// Whether part `name` runs (all of them unless `--only` names one).
fn part(name: &str) -> bool {
    let only = std::env::args().skip_while(|a| a != "--only").nth(1);
    match only.as_deref() {
        None => true,
        Some(only @ ("e2e" | "read" | "load" | "beats" | "flood")) => only == name,
        Some(other) => {
            eprintln!("redis_bench: --only takes e2e, read, load, beats or flood, not {other:?}");
            std::process::exit(2)
        }
    }
}

fn main() {
    let seconds = flag("--seconds").unwrap_or(10);
    // Extra esagent flags: none (its defaults) unless --poll-us is given.
    let agent_flags: Vec<String> = flag("--poll-us")
        .map(|us| vec!["--poll-us".to_owned(), us.to_string()])
        .unwrap_or_default();
    let agent_label = if agent_flags.is_empty() {
        "esagent (defaults: --period-ms 50 --poll-us 1000)".to_owned()
    } else {
        format!("esagent {}", agent_flags.join(" "))
    };
    let redis = RedisServer::start();
    println!(
        "redis_bench: redis-server {} on 127.0.0.1:{}, {} cores, {seconds} s per latency run",
        redis_version(),
        redis.port(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );

    if part("e2e") {
        e2e_part(&redis, seconds, &agent_flags, &agent_label);
    }
    if part("read") {
        read_part(&redis);
    }
    if part("load") {
        println!("\n## {agent_label} relaying 1024 engines published at 20 Hz");
        agent_load(&redis, 1024, seconds.max(10), &agent_flags);
    }
    if part("beats") {
        heartbeat_records(&redis, seconds, &agent_flags);
    }
    if part("flood") {
        flood_part(&redis);
    }
}

/// A registry flood: 8 engines and 100 000 junk members (docs/REDIS.md, "A
/// registry flood"); reads 1 ms apart, so that several whole scans of the
/// registry (100 reads each) are measured.
fn flood_part(redis: &RedisServer) {
    const JUNK: usize = 100_000;
    println!("\n## one read of 8 engines with {JUNK} junk registry members (SSCAN steps of 1000)");
    let prefix = "flood:";
    fill(redis, prefix, 8);
    let mut con = redis.connection();
    for chunk in (0..JUNK).collect::<Vec<_>>().chunks(1000) {
        let junk: Vec<String> = chunk
            .iter()
            .map(|i| {
                if i % 2 == 0 {
                    format!("junk {i}")
                } else {
                    format!("junk{i}")
                }
            })
            .collect();
        let _: () = redis::cmd("SADD")
            .arg(registry_key(prefix))
            .arg(&junk)
            .query(&mut con)
            .unwrap();
    }
    let uri = redis.uri(&format!("?prefix={prefix}"));
    let mut source = open(&StateUri::parse(&uri).unwrap(), ReaderOptions::default()).unwrap();
    let mut reading = Reading::default();
    let mut times = Vec::with_capacity(1000);
    for _ in 0..1000 {
        let t = Instant::now();
        source.read_into(&mut reading).unwrap();
        times.push(t.elapsed().as_nanos() as u64);
        // (`fill`'s records are never rewritten: they turn stale after
        // 2 s, which is not what this measures.)
        let real = reading
            .engines
            .iter()
            .filter(|e| e.engine_id.starts_with("engine-") && e.snapshot.captured_mono_ns != 0)
            .count();
        assert_eq!(real, 8, "every real engine read");
        std::thread::sleep(Duration::from_millis(1));
    }
    report("8 engines + 100000 junk members", &times);
}

/// Records per engine and period that the agent writes for engines running
/// the real `Publisher` (`espublish`): each publish stamps the heartbeat, and
/// the heartbeat thread stamps it again at its own phase between publishes.
/// 1.00 is one record per publish and nothing else.
fn heartbeat_records(redis: &RedisServer, seconds: u64, flags: &[String]) {
    const ENGINES: usize = 16;
    const PERIOD_MS: u64 = 50;
    println!(
        "\n## records per engine and period: {ENGINES} espublish processes \
         (publish and heartbeat every {PERIOD_MS} ms), esagent relaying"
    );
    let dir = tempfile::tempdir_in("/dev/shm").expect("tmp dir in /dev/shm");
    let shm_uri = format!("file://{}", dir.path().display());
    let _writers: Vec<Proc> = (0..ENGINES)
        .map(|i| espublish(&shm_uri, &format!("beat-{i:02}"), PERIOD_MS))
        .collect();
    let port = free_port();
    let mut agent = Proc::spawn(
        Command::new(sibling("esagent"))
            .args(["--uri", &shm_uri, "--redis", &redis.uri("?prefix=beats:")])
            .args(flags)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .stdout(Stdio::piped()),
    );
    agent.first_line();
    std::thread::sleep(Duration::from_secs(2)); // every engine found and relayed
    let series = "engine_state_relay_lag_seconds_count";
    let (before, t0) = (metric(&scrape(port), series), Instant::now());
    std::thread::sleep(Duration::from_secs(seconds));
    let (after, elapsed) = (metric(&scrape(port), series), t0.elapsed());
    let periods = elapsed.as_secs_f64() * 1000.0 / PERIOD_MS as f64;
    println!(
        "via esagent: {:.2} records per engine and period ({:.0} records over {:.0} s)",
        (after - before) / ENGINES as f64 / periods,
        after - before,
        elapsed.as_secs_f64()
    );
    drop((agent, _writers));

    // The same engines writing to Redis themselves: SETs counted by Redis.
    let uri = redis.uri("?prefix=beats-direct:");
    let _writers: Vec<Proc> = (0..ENGINES)
        .map(|i| espublish(&uri, &format!("beat-{i:02}"), PERIOD_MS))
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    let mut con = redis.connection();
    let (before, t0) = (set_calls(&mut con), Instant::now());
    std::thread::sleep(Duration::from_secs(seconds));
    let (after, elapsed) = (set_calls(&mut con), t0.elapsed());
    let periods = elapsed.as_secs_f64() * 1000.0 / PERIOD_MS as f64;
    println!(
        "direct sink: {:.2} SETs per engine and period",
        (after - before) as f64 / ENGINES as f64 / periods
    );
}

/// `SET` calls the server has executed (`INFO commandstats`).
fn set_calls(con: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(con).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_set:calls="))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .expect("cmdstat_set in INFO commandstats")
}

fn e2e_part(redis: &RedisServer, seconds: u64, agent_flags: &[String], agent_label: &str) {
    println!("\n## publish -> visible to a reader in another process (loopback)");
    let uri = redis.uri("?prefix=direct:");
    let writer = espublish(&uri, "e2e", 10);
    report(
        "direct sink, publisher period 10 ms",
        &e2e(&uri, "e2e", seconds),
    );
    drop(writer);
    {
        let dir = tempfile::tempdir_in("/dev/shm").expect("tmp dir in /dev/shm");
        let shm_uri = format!("file://{}", dir.path().display());
        let prefix_uri = redis.uri("?prefix=agent:");
        let _writer = espublish(&shm_uri, "e2e", 10);
        let _agent = esagent(&shm_uri, &prefix_uri, agent_flags);
        report(
            &format!("via {agent_label}, publisher period 10 ms"),
            &e2e(&prefix_uri, "e2e", seconds),
        );
    }
}

fn read_part(redis: &RedisServer) {
    println!(
        "\n## one read of N engines (SMEMBERS every 250 ms, GETRANGE 0..192 + PTTL per key: one round trip)"
    );
    for n in [8, 64, 1024] {
        let uri = redis.uri(&format!("?prefix=read{n}:"));
        fill(redis, &format!("read{n}:"), n);
        report(&format!("{n} engines"), &read_times(&uri, n));
    }
}

fn sibling(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let path = exe.with_file_name(name);
    assert!(
        path.exists(),
        "{} is missing: cargo build --release --bins",
        path.display()
    );
    path
}

fn redis_version() -> String {
    let out = Command::new(engine_state_tests::redis_server_path())
        .arg("--version")
        .output()
        .expect("redis-server --version");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .find_map(|w| w.strip_prefix("v="))
        .unwrap_or("?")
        .to_owned()
}

fn espublish(uri: &str, id: &str, period_ms: u64) -> Proc {
    let mut proc = Proc::spawn(
        Command::new(sibling("espublish"))
            .args([
                "--uri",
                uri,
                "--engine-id",
                id,
                "--period-ms",
                &period_ms.to_string(),
            ])
            .args(["--set", "num_running=1"])
            .stdout(Stdio::piped()),
    );
    proc.first_line();
    proc
}

fn esagent(shm_uri: &str, redis_uri: &str, flags: &[String]) -> Proc {
    let mut proc = Proc::spawn(
        Command::new(sibling("esagent"))
            .args(["--uri", shm_uri, "--redis", redis_uri])
            .args(flags)
            .args(["--listen", &format!("127.0.0.1:{}", free_port())])
            .stdout(Stdio::piped()),
    );
    proc.first_line();
    proc
}

/// Polls the Redis source as fast as it can; each time the engine's `step`
/// changes, records (reader's CLOCK_MONOTONIC − the snapshot's
/// captured_mono_ns): same host, same clock, so the difference is valid.
fn e2e(uri: &str, id: &str, seconds: u64) -> Vec<u64> {
    let options = ReaderOptions::default();
    let mut source = open(&StateUri::parse(uri).unwrap(), options).unwrap();
    let mut reading = Reading::default();
    let mut last_step = None;
    let mut latencies = Vec::new();
    let end = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < end {
        source.read_into(&mut reading).unwrap();
        let now = monotonic_ns();
        if let Some(state) = reading.get(id) {
            if last_step.is_some_and(|s| s != state.snapshot.step) {
                latencies.push(now.saturating_sub(state.snapshot.captured_mono_ns));
            }
            last_step = Some(state.snapshot.step);
        }
    }
    latencies
}

fn fill(redis: &RedisServer, prefix: &str, n: usize) {
    let mut con = redis.connection();
    let mut pipe = redis::pipe();
    for i in 0..n {
        let id = format!("engine-{i:04}");
        let record = RedisRecord {
            state: STATE_ACTIVE,
            generation: 1,
            heartbeat_seq: 1,
            heartbeat_mono_ns: monotonic_ns(),
            ttl_ms: 600_000,
            snapshot: Snapshot {
                captured_mono_ns: monotonic_ns(),
                num_running: i as u64,
                ..Snapshot::default()
            },
            ..RedisRecord::default()
        };
        pipe.cmd("SET")
            .arg(engine_key(prefix, &id))
            .arg(&record.encode()[..])
            .arg("PX")
            .arg(600_000)
            .ignore();
        pipe.sadd(registry_key(prefix), &id).ignore();
    }
    let _: () = pipe.query(&mut con).unwrap();
}

fn read_times(uri: &str, n: usize) -> Vec<u64> {
    let mut source = open(&StateUri::parse(uri).unwrap(), ReaderOptions::default()).unwrap();
    let mut reading = Reading::default();
    let iterations = (200_000 / n).clamp(500, 20_000);
    let mut times = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let t = Instant::now();
        source.read_into(&mut reading).unwrap();
        times.push(t.elapsed().as_nanos() as u64);
        assert_eq!(reading.engines.len(), n);
    }
    times
}

fn agent_load(redis: &RedisServer, n: usize, seconds: u64, flags: &[String]) {
    let dir = tempfile::tempdir_in("/dev/shm").expect("tmp dir in /dev/shm");
    let mut writers: Vec<ShmWriter> = (0..n)
        .map(|i| {
            let id = EngineId::new(&format!("load-{i:04}")).unwrap();
            ShmWriter::create(
                dir.path(),
                &id,
                &WriterOptions::default(),
                &Snapshot::default(),
            )
            .unwrap()
        })
        .collect();
    let shm_uri = format!("file://{}", dir.path().display());
    let redis_uri = redis.uri("?prefix=load:");
    let port = free_port();
    let agent = Proc::spawn(
        Command::new(sibling("esagent"))
            .args(["--uri", &shm_uri, "--redis", &redis_uri])
            .args(flags)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .stdout(Stdio::null()),
    );
    let stop = Instant::now() + Duration::from_secs(seconds + 2);
    let publisher = std::thread::spawn(move || {
        // Every engine publishes (and heartbeats) at 20 Hz, spread over the
        // period as engines with independent clocks are: the period is cut
        // into 1 ms slices and each slice publishes its share of engines.
        const SLICES: usize = 50;
        let mut step = 0u64;
        let per_slice = writers.len().div_ceil(SLICES);
        let mut next = Instant::now();
        while Instant::now() < stop {
            step += 1;
            for (slice, chunk) in writers.chunks_mut(per_slice.max(1)).enumerate() {
                for (j, writer) in chunk.iter_mut().enumerate() {
                    let now = monotonic_ns();
                    writer
                        .publish(&Snapshot {
                            captured_mono_ns: now,
                            step,
                            num_running: (step + (slice * per_slice + j) as u64) % 7,
                            ..Snapshot::default()
                        })
                        .unwrap();
                    writer.stamp_heartbeat(now);
                }
                next += Duration::from_millis(50) / SLICES as u32;
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
        }
        writers
    });
    std::thread::sleep(Duration::from_secs(2)); // warm up: every engine registered
    let (cpu0, t0) = (cpu_ticks(agent.0.id()), Instant::now());
    let before = scrape(port);
    std::thread::sleep(Duration::from_secs(seconds));
    let (cpu1, elapsed) = (cpu_ticks(agent.0.id()), t0.elapsed());
    let after = scrape(port);
    let ticks_per_s = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    let cpu = (cpu1 - cpu0) as f64 / ticks_per_s / elapsed.as_secs_f64() * 100.0;
    // Per acknowledged record (the relayed-records counter is only
    // refreshed every full pass, which would skew a 10 s difference).
    let (count, sum) = (
        metric(&after, "engine_state_relay_lag_seconds_count")
            - metric(&before, "engine_state_relay_lag_seconds_count"),
        metric(&after, "engine_state_relay_lag_seconds_sum")
            - metric(&before, "engine_state_relay_lag_seconds_sum"),
    );
    println!(
        "agent CPU: {cpu:.1} % of one core over {:.0} s; {:.0} records/s relayed",
        elapsed.as_secs_f64(),
        count / elapsed.as_secs_f64()
    );
    println!(
        "relay lag (engine heartbeat stamp -> Redis ack): \
         mean {:.2} ms over {count:.0} records; buckets: {}",
        sum / count * 1000.0,
        buckets(&before, &after, "engine_state_relay_lag_seconds")
    );
    let mut source = open(
        &StateUri::parse(&redis_uri).unwrap(),
        ReaderOptions::default(),
    )
    .unwrap();
    let reading = source.read().unwrap();
    let fresh = reading.engines.iter().filter(|e| e.is_fresh()).count();
    println!(
        "a Redis reader sees {} engines, {fresh} fresh",
        reading.engines.len()
    );
    drop(agent);
    drop(publisher.join().unwrap());
}

fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    // Fields after the command: state is [0]; utime [11], stime [12].
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

fn scrape(port: u16) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(stream, "GET /metrics HTTP/1.1\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// "≤1ms: x %, ≤2ms: y %, …" from the histogram's cumulative buckets.
fn buckets(before: &str, after: &str, name: &str) -> String {
    let total = metric(after, &format!("{name}_count")) - metric(before, &format!("{name}_count"));
    ["0.001", "0.005", "0.02", "0.05", "0.1"]
        .iter()
        .map(|le| {
            let series = format!("{name}_bucket{{le=\"{le}\"}}");
            let n = metric(after, &series) - metric(before, &series);
            format!(
                "<= {} ms {:.1} %",
                le.parse::<f64>().unwrap() * 1000.0,
                n / total * 100.0
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn report(what: &str, samples: &[u64]) {
    if samples.is_empty() {
        println!("{what}: no samples");
        return;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let p = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize] as f64 / 1000.0;
    println!(
        "{what}: n={} p50 {:.0} µs, p99 {:.0} µs, max {:.0} µs",
        sorted.len(),
        p(0.5),
        p(0.99),
        p(1.0)
    );
}

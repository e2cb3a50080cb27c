//! esroute's cost (issue 23, part 5): the latency it adds per request and
//! its CPU at a fixed request rate, measured A/B in one run.
//!
//! Two fake engines (tests/support/mod.rs, in this process) stream
//! `CHUNKS` SSE chunks `GAP` apart; esroute runs as a child process in
//! front of them (`--no-engine-state`, its default policy). At 1, 100 and
//! 1,000 concurrent streams, rounds alternate direct (client → engine) and
//! proxied (client → esroute → engine) phases, each after its own warm-up,
//! and record every request's TTFT (to the first data chunk) and E2E (to
//! the end of the stream). Added latency is proxied minus direct, per
//! percentile (nearest rank, essim's `quantile`). The pick's share is the
//! mean of `esroute_pick_seconds` over the mean added TTFT (the pick
//! happens before the first chunk). The CPU part sends 1,000 requests/s open loop
//! for a few seconds and reads esroute's utime + stime from
//! /proc/<pid>/stat.
//!
//! `cargo bench -p engine-state-proxy --bench proxy_cost -- [--rounds N]
//! [--quick] [--only latency,cpu] [--pin] [--proxy-arg ARG]...`
//! (`--pin`: this process on CPU 0, esroute on CPU 1, with taskset.)

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde_json::json;

use support::*;

/// Chunks per stream, and the engine's gap between two of them.
const CHUNKS: u64 = 8;
const GAP: Duration = Duration::from_millis(20);
/// The CPU part's rate and its measured window.
const RATE: u64 = 1_000;

struct Args {
    rounds: usize,
    quick: bool,
    latency: bool,
    cpu: bool,
    pin: bool,
    proxy_args: Vec<String>,
}

fn args() -> Args {
    let mut args = Args {
        rounds: 3,
        quick: false,
        latency: true,
        cpu: true,
        pin: false,
        proxy_args: Vec::new(),
    };
    let mut given = std::env::args().skip(1);
    while let Some(arg) = given.next() {
        match arg.as_str() {
            "--rounds" => {
                args.rounds = given
                    .next()
                    .and_then(|n| n.parse().ok())
                    .expect("--rounds N")
            }
            "--quick" => args.quick = true,
            "--pin" => args.pin = true,
            "--proxy-arg" => args.proxy_args.push(given.next().expect("--proxy-arg ARG")),
            "--only" => {
                let parts = given.next().expect("--only latency,cpu");
                args.latency = parts.split(',').any(|p| p == "latency");
                args.cpu = parts.split(',').any(|p| p == "cpu");
            }
            // `cargo bench` passes --bench.
            "--bench" => {}
            other => panic!("unknown argument {other:?}; see the file's doc"),
        }
    }
    args
}

/// One request's timings.
#[derive(Clone, Copy)]
struct Timing {
    ttft: Duration,
    e2e: Duration,
}

fn body() -> Bytes {
    let prompt: Vec<u32> = (0..256).collect();
    let body = json!({"prompt": prompt, "max_tokens": CHUNKS, "stream": true,
                      "fake_gap_us": GAP.as_micros() as u64});
    Bytes::from(serde_json::to_vec(&body).unwrap())
}

async fn timed(http: &Http, url: &str, body: Bytes) -> Timing {
    let sent = Instant::now();
    let request = hyper::Request::post(format!("{url}/v1/completions"))
        .header("content-type", "application/json")
        .body(Full::new(body))
        .unwrap();
    let response: hyper::Response<Incoming> = http.request(request).await.expect("an answer");
    assert_eq!(response.status(), 200);
    let mut stream = response.into_body();
    let mut ttft = None;
    let mut last = Bytes::new();
    while let Some(frame) = stream.frame().await {
        if let Ok(data) = frame.expect("a whole stream").into_data() {
            ttft.get_or_insert_with(|| sent.elapsed());
            last = data;
        }
    }
    assert!(last.ends_with(b"data: [DONE]\n\n"), "a whole stream");
    Timing {
        ttft: ttft.expect("a data chunk"),
        e2e: sent.elapsed(),
    }
}

/// `streams` tasks, each sending `each` requests one after another to
/// `urls` (round-robin by task); every request's timing. The tasks start
/// spread over one stream's length, so arrivals are even, not in lockstep
/// (a burst of `streams` requests at one instant measures the burst).
async fn phase(http: &Http, urls: &[String], streams: usize, each: usize) -> Vec<Timing> {
    let body = body();
    let stream_length = GAP * (CHUNKS as u32 - 1);
    let tasks: Vec<_> = (0..streams)
        .map(|task| {
            let (http, url, body) = (http.clone(), urls[task % urls.len()].clone(), body.clone());
            let offset = stream_length * task as u32 / streams as u32;
            tokio::spawn(async move {
                tokio::time::sleep(offset).await;
                let mut timings = Vec::with_capacity(each);
                for _ in 0..each {
                    timings.push(timed(&http, &url, body.clone()).await);
                }
                timings
            })
        })
        .collect();
    let mut all = Vec::with_capacity(streams * each);
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    all
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let seconds: Vec<f64> = sorted.iter().map(Duration::as_secs_f64).collect();
    Duration::from_secs_f64(engine_state_sim::quantile(&seconds, p))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

struct Summary {
    e2e: [Duration; 2],
    ttft: [Duration; 2],
    n: usize,
}

fn summary(timings: &[Timing]) -> Summary {
    let mut e2e: Vec<Duration> = timings.iter().map(|t| t.e2e).collect();
    let mut ttft: Vec<Duration> = timings.iter().map(|t| t.ttft).collect();
    e2e.sort();
    ttft.sort();
    Summary {
        e2e: [percentile(&e2e, 0.5), percentile(&e2e, 0.99)],
        ttft: [percentile(&ttft, 0.5), percentile(&ttft, 0.99)],
        n: timings.len(),
    }
}

/// `(sum, count)` of `esroute_pick_seconds`.
async fn pick_totals(http: &Http, proxy: &str) -> (f64, f64) {
    let text = get_text(http, &format!("{proxy}/metrics")).await;
    (
        metric_line(&text, "esroute_pick_seconds_sum").unwrap_or(0.0),
        metric_line(&text, "esroute_pick_seconds_count").unwrap_or(0.0),
    )
}

/// utime + stime of a process (all its threads), in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/<pid>/stat");
    // Fields after the command's closing parenthesis; utime and stime are
    // fields 14 and 15 of the line, 12 and 13 after it.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / clock_ticks()
}

fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
        .unwrap_or(100.0)
}

fn pin(pid: u32, cpu: &str) {
    let status = std::process::Command::new("taskset")
        .args(["-a", "-p", "-c", cpu, &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .expect("taskset");
    assert!(status.success(), "taskset -a -p -c {cpu} {pid}");
}

fn main() {
    let args = args();
    // Before pinning, which narrows what this process may use.
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    if args.pin {
        // Before the runtime's threads exist: they inherit CPU 0.
        pin(std::process::id(), "0");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run(args, cores));
}

async fn run(args: Args, cores: usize) {
    let (url_a, fake_a) = start_fake().await;
    let (url_b, fake_b) = start_fake().await;
    let fakes = [fake_a, fake_b];
    let mut extra = vec!["--no-engine-state"];
    extra.extend(args.proxy_args.iter().map(String::as_str));
    let proxy = start_proxy(&[("a", &url_a), ("b", &url_b)], &extra);
    if args.pin {
        pin(proxy.child.id(), "1");
    }
    let http = client();
    let direct = vec![url_a.clone(), url_b.clone()];
    let proxied = vec![proxy.url.clone()];
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load = load.split(' ').next().unwrap_or("?").to_owned();
    println!(
        "esroute cost: {CHUNKS} chunks {GAP:?} apart per stream, 2 fake engines; {} rounds{}; \
         {cores} CPUs (load average {load}), {}; esroute args {:?}",
        args.rounds,
        if args.quick { " (quick)" } else { "" },
        if args.pin {
            "pinned: bench (client + engines) on CPU 0, esroute on CPU 1"
        } else {
            "not pinned"
        },
        extra,
    );
    if args.latency {
        latency(&args, &http, &direct, &proxied, &fakes).await;
    }
    if args.cpu {
        cpu(&args, &http, &proxied, proxy.child.id()).await;
    }
}

async fn latency(
    args: &Args,
    http: &Http,
    direct: &[String],
    proxied: &[String],
    fakes: &[Arc<Fake>],
) {
    let connections = || {
        fakes
            .iter()
            .map(|f| f.connections.load(Ordering::Relaxed))
            .sum::<usize>()
    };
    println!();
    println!(
        "| streams | path | requests | E2E p50 ms | E2E p99 ms | TTFT p50 ms | TTFT p99 ms | engine connections opened |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|");
    let mut added = Vec::new();
    let (pick_sum_0, pick_count_0) = pick_totals(http, &proxied[0]).await;
    for streams in [1usize, 100, 1_000] {
        // About 1 s of streaming per phase (a stream takes ~CHUNKS × GAP).
        let each = match (streams, args.quick) {
            (1, false) => 30,
            (1, true) => 10,
            (100, false) => 6,
            (100, true) => 2,
            (_, false) => 3,
            (_, true) => 1,
        };
        let mut timings: [Vec<Timing>; 2] = [Vec::new(), Vec::new()];
        let mut opened = [0usize; 2];
        for round in 0..args.rounds {
            // Alternate which path goes first.
            let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for path in order {
                let urls = if path == 0 { direct } else { proxied };
                // Warm-up: the connections of this concurrency exist.
                phase(http, urls, streams, 1).await;
                let before = connections();
                timings[path].extend(phase(http, urls, streams, each).await);
                opened[path] += connections() - before;
            }
        }
        let sums = [summary(&timings[0]), summary(&timings[1])];
        for (i, (path, s)) in ["direct", "esroute"].iter().zip(&sums).enumerate() {
            println!(
                "| {streams} | {path} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {} |",
                s.n,
                ms(s.e2e[0]),
                ms(s.e2e[1]),
                ms(s.ttft[0]),
                ms(s.ttft[1]),
                opened[i],
            );
        }
        let mean = |t: &[Timing], e2e: bool| {
            let total: f64 = t
                .iter()
                .map(|t| if e2e { t.e2e } else { t.ttft }.as_secs_f64())
                .sum();
            total / t.len() as f64
        };
        added.push((
            streams,
            sums,
            [true, false].map(|e2e| (mean(&timings[1], e2e) - mean(&timings[0], e2e)) * 1e3),
        ));
    }
    let (pick_sum, pick_count) = pick_totals(http, &proxied[0]).await;
    let pick_mean = (pick_sum - pick_sum_0) / (pick_count - pick_count_0).max(1.0);
    println!();
    println!(
        "| streams | added E2E p50 ms | added E2E p99 ms | added TTFT p50 ms | added TTFT p99 ms | added mean E2E / TTFT ms | pick's share of the added mean TTFT |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let diff = |a: Duration, b: Duration| ms(b) - ms(a);
    for (streams, [d, p], [mean_e2e, mean_ttft]) in &added {
        // The pick is on the first chunk's path; a mean within noise of
        // zero has no share to speak of.
        let share = if *mean_ttft > 0.01 {
            format!("{:.2} %", 100.0 * pick_mean * 1e3 / mean_ttft)
        } else {
            "— (added within noise)".to_owned()
        };
        println!(
            "| {streams} | {:.2} | {:.2} | {:.2} | {:.2} | {mean_e2e:.2} / {mean_ttft:.2} | {share} |",
            diff(d.e2e[0], p.e2e[0]),
            diff(d.e2e[1], p.e2e[1]),
            diff(d.ttft[0], p.ttft[0]),
            diff(d.ttft[1], p.ttft[1]),
        );
    }
    println!();
    println!(
        "pick + reserve (esroute_pick_seconds): mean {:.2} µs over {} picks",
        pick_mean * 1e6,
        pick_count - pick_count_0
    );
}

async fn cpu(args: &Args, http: &Http, proxied: &[String], pid: u32) {
    let seconds = if args.quick { 2 } else { 5 };
    let body = body();
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let warm_up = Duration::from_secs(1);
    let window = Duration::from_secs(seconds);
    let mut ticker = tokio::time::interval(Duration::from_micros(1_000_000 / RATE));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut tasks = Vec::new();
    let mut cpu_0 = None;
    let mut sent_in_window = 0u64;
    while start.elapsed() < warm_up + window {
        ticker.tick().await;
        if cpu_0.is_none() && start.elapsed() >= warm_up {
            cpu_0 = Some((cpu_seconds(pid), Instant::now()));
        }
        if cpu_0.is_some() {
            sent_in_window += 1;
        }
        let (http, url, body, done) =
            (http.clone(), proxied[0].clone(), body.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            timed(&http, &url, body).await;
            done.fetch_add(1, Ordering::Relaxed);
        }));
    }
    let (cpu_start, at) = cpu_0.expect("a window");
    let cpu = cpu_seconds(pid) - cpu_start;
    let elapsed = at.elapsed().as_secs_f64();
    for task in tasks {
        task.await.unwrap();
    }
    println!();
    println!(
        "esroute CPU at {:.0} requests/s ({} streams in flight on average, {seconds} s window): \
         {:.1} % of one core (utime+stime {:.2} s over {:.2} s); {} requests, all complete",
        sent_in_window as f64 / elapsed,
        RATE as f64 * (GAP * (CHUNKS as u32 - 1)).as_secs_f64(),
        100.0 * cpu / elapsed,
        cpu,
        elapsed,
        done.load(Ordering::Relaxed),
    );
}

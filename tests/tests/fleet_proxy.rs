//! The fake fleet and the routing proxy as users run them: two `essim serve`
//! processes (one engine each, so one can be killed alone) publishing
//! engine state into one directory, and `esroute` in front of them reading
//! it, all over real sockets (docs/ROUTING.md, "A request's lifecycle").
//!
//! - 100 streamed requests with token-id prompts, each response checked
//!   (first chunk, every token, usage, `[DONE]`); afterwards the router
//!   holds no reservation and the engines run nothing.
//! - An engine killed mid-stream: the client's stream fails, the
//!   reservation is released, and the engine leaves routing from its dead
//!   engine-state writer alone (no request has to fail to connect first);
//!   the next requests all go to the survivor.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use engine_state_tests::{bin, wait_for_within, Proc};
use serde_json::{json, Value};

/// Tokens each request generates.
const MAX_TOKENS: u64 = 8;
/// Modelled time runs this much faster than the wall clock.
const TIME_SCALE: &str = "10";

/// One `essim serve` process with one engine, `sim-<id>`.
struct Engine {
    proc: Proc,
    id: String,
    url: String,
}

fn engine(dir: &std::path::Path, id: usize) -> Engine {
    let mut proc = Proc::spawn(
        Command::new(bin("essim"))
            .args(["serve", "--engines", "1", "--listen-base", "127.0.0.1:0"])
            .args(["--first-id", &id.to_string(), "--time-scale", TIME_SCALE])
            .arg("--uri")
            .arg(format!("file://{}", dir.display()))
            .stdout(Stdio::piped()),
    );
    let line = proc.first_line();
    let (name, url) = line
        .trim()
        .split_once(' ')
        .unwrap_or_else(|| panic!("essim serve printed {line:?}, not `sim-<i> URL`"));
    assert_eq!(name, format!("sim-{id}"));
    Engine {
        proc,
        id: name.to_owned(),
        url: url.to_owned(),
    }
}

fn esroute(dir: &std::path::Path, engines: &[Engine]) -> (Proc, String) {
    let mut command = Command::new(bin("esroute"));
    command
        .args(["--listen", "127.0.0.1:0", "--poll-ms", "10"])
        .arg("--uri")
        .arg(format!("file://{}", dir.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    for engine in engines {
        command.args(["--engine", &format!("{}={}", engine.id, engine.url)]);
    }
    let mut proc = Proc::spawn(&mut command);
    let line = proc.first_line();
    let addr = line
        .trim()
        .strip_prefix("esroute listening on ")
        .unwrap_or_else(|| panic!("esroute printed {line:?}"));
    (proc, format!("http://{addr}"))
}

fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

fn prompt(i: usize) -> Vec<u64> {
    // Ten sessions; each request's prompt extends its session's.
    let session = i % 10;
    (0..64 + i as u64)
        .map(|t| session as u64 * 1_000 + t)
        .collect()
}

/// Sends request `i` streamed, checks the whole answer; returns the engine
/// that served it.
fn stream_one(client: &reqwest::blocking::Client, proxy: &str, i: usize) -> String {
    let tokens = prompt(i);
    let response = client
        .post(format!("{proxy}/v1/completions"))
        .header("x-session-id", format!("s{}", i % 10))
        .json(
            &json!({"model": "essim", "prompt": tokens, "max_tokens": MAX_TOKENS,
            "stream": true, "stream_options": {"include_usage": true}}),
        )
        .send()
        .unwrap();
    assert_eq!(response.status(), 200, "request {i}");
    let engine = response.headers()["x-esroute-engine"]
        .to_str()
        .unwrap()
        .to_owned();
    let events: Vec<String> = BufReader::new(response)
        .lines()
        .map(Result::unwrap)
        .filter_map(|line| line.strip_prefix("data: ").map(str::to_owned))
        .collect();
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let first = chunks[0]["choices"][0]["text"].as_str();
    assert_eq!(first.map(str::len), Some(1), "first chunk {}", chunks[0]);
    let with_tokens = chunks
        .iter()
        .filter(|c| c["choices"].as_array().is_some_and(|a| !a.is_empty()))
        .count();
    assert_eq!(with_tokens as u64, MAX_TOKENS, "request {i}: {events:?}");
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["prompt_tokens"], tokens.len() as u64, "request {i}");
    assert_eq!(usage["completion_tokens"], MAX_TOKENS, "request {i}");
    engine
}

fn text(client: &reqwest::blocking::Client, url: &str) -> String {
    client.get(url).send().unwrap().text().unwrap()
}

/// The sample of `name` whose labels include every one of `labels`.
fn sample(metrics: &str, name: &str, labels: &[&str]) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter(|l| {
            let rest = &l[name.len()..];
            (rest.starts_with('{') || rest.starts_with(' ')) && labels.iter().all(|x| l.contains(x))
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .next()
        .unwrap_or_else(|| panic!("no {name} {labels:?} in\n{metrics}"))
}

/// Nothing held: the router's total and every engine's own view are zero.
fn holds_nothing(metrics: &str, engines: &[&str]) -> bool {
    sample(metrics, "esroute_reservations_held", &[]) == 0.0
        && engines.iter().all(|e| {
            sample(
                metrics,
                "esroute_engine_requests",
                &[&format!("engine=\"{e}\""), "view=\"own\""],
            ) == 0.0
        })
}

fn engine_idle(client: &reqwest::blocking::Client, engine: &Engine) -> bool {
    let metrics = text(client, &format!("{}/metrics", engine.url));
    sample(&metrics, "vllm:num_requests_running", &[]) == 0.0
        && sample(&metrics, "vllm:num_requests_waiting", &[]) == 0.0
}

#[test]
fn a_hundred_streams_through_esroute_and_an_engine_killed_mid_stream() {
    let dir = tempfile::tempdir().unwrap();
    let mut engines = vec![engine(dir.path(), 0), engine(dir.path(), 1)];
    let (_esroute, proxy) = esroute(dir.path(), &engines);
    let client = client();
    let ids = ["sim-0", "sim-1"];

    // 100 requests, 10 at a time.
    let served: Vec<String> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..10)
            .map(|w| {
                let (client, proxy) = (&client, &proxy);
                scope.spawn(move || {
                    (0..10)
                        .map(|k| stream_one(client, proxy, w * 10 + k))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    assert_eq!(served.len(), 100);
    for id in ids {
        assert!(served.iter().any(|e| e == id), "{id} served nothing");
    }
    let metrics = text(&client, &format!("{proxy}/metrics"));
    assert!(holds_nothing(&metrics, &ids), "{metrics}");
    assert_eq!(
        sample(&metrics, "esroute_decisions_total", &["engine=\"sim-0\""])
            + sample(&metrics, "esroute_decisions_total", &["engine=\"sim-1\""]),
        100.0
    );
    for engine in &engines {
        wait_for_within(
            Duration::from_secs(5),
            || engine_idle(&client, engine),
            "the engines to run and queue nothing",
        );
    }

    // A long stream; its engine is killed after the first chunk.
    let response = client
        .post(format!("{proxy}/v1/completions"))
        .json(
            &json!({"model": "essim", "prompt": prompt(0), "max_tokens": 100_000,
            "stream": true}),
        )
        .send()
        .unwrap();
    assert_eq!(response.status(), 200);
    let victim = response.headers()["x-esroute-engine"]
        .to_str()
        .unwrap()
        .to_owned();
    let mut reader = BufReader::new(response);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert!(line.starts_with("data: "), "{line:?}");
    let (killed, survivor): (Vec<&mut Engine>, Vec<&mut Engine>) =
        engines.iter_mut().partition(|e| e.id == victim);
    let survivor = survivor[0].id.clone();
    killed.into_iter().next().unwrap().proc.kill();
    let killed_at = Instant::now();

    // The client's stream fails: it never reaches `[DONE]`.
    let mut rest = String::new();
    let read = reader.read_to_string(&mut rest);
    assert!(
        read.is_err() || !rest.contains("[DONE]"),
        "the stream of a killed engine ended cleanly"
    );
    let stream_errors = format!("engine=\"{victim}\"");
    wait_for_within(
        Duration::from_secs(5),
        || {
            let metrics = text(&client, &format!("{proxy}/metrics"));
            holds_nothing(&metrics, &ids)
                && sample(
                    &metrics,
                    "esroute_upstream_errors_total",
                    &[&stream_errors, "kind=\"stream\""],
                ) == 1.0
                && sample(&metrics, "esroute_releases_total", &["outcome=\"failed\""]) == 1.0
        },
        "the killed stream's reservation to be released as failed, one stream error",
    );

    // Out of routing from engine state alone: no request is sent meanwhile.
    wait_for_within(
        Duration::from_secs(5),
        || {
            let health: Value =
                serde_json::from_str(&text(&client, &format!("{proxy}/health"))).unwrap();
            health["routed"] == json!([survivor]) && health["down"] == json!([victim])
        },
        &format!("{victim} to leave routing after its engine was killed"),
    );
    let noticed = killed_at.elapsed();
    eprintln!("{victim} out of routing {noticed:?} after the kill");

    // The next requests all go to the survivor; none tries the dead one.
    for i in 0..20 {
        assert_eq!(stream_one(&client, &proxy, i), survivor);
    }
    let metrics = text(&client, &format!("{proxy}/metrics"));
    assert_eq!(
        sample(
            &metrics,
            "esroute_upstream_errors_total",
            &[&stream_errors, "kind=\"connect\""]
        ),
        0.0
    );
    assert_eq!(sample(&metrics, "esroute_engines_down", &[]), 1.0);
    assert!(holds_nothing(&metrics, &ids), "{metrics}");
}

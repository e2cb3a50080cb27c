//! `essim replay` as a real process against a real `essim serve`: every
//! request of an agentic trace answered with the trace's lengths, the
//! files it writes, round-robin over two URLs, session order, skipped
//! requests past --max-in-flight, and its errors.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Output};

use engine_state_sim::{AgenticSpec, TraceFormat, TraceSpec};
use serde_json::Value;

mod common;
use common::Fleet;

fn essim_replay(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_essim"))
        .arg("replay")
        .args(args)
        .output()
        .unwrap()
}

/// The rows of requests.csv, as column → cell maps.
fn read_rows(dir: &Path) -> Vec<HashMap<String, String>> {
    let text = std::fs::read_to_string(dir.join("requests.csv")).unwrap();
    let mut lines = text.lines();
    let header: Vec<String> = lines
        .next()
        .unwrap()
        .split(',')
        .map(str::to_owned)
        .collect();
    lines
        .map(|line| {
            let cells: Vec<&str> = line.split(',').collect();
            assert_eq!(cells.len(), header.len(), "{line}");
            header
                .iter()
                .cloned()
                .zip(cells.into_iter().map(str::to_owned))
                .collect()
        })
        .collect()
}

fn num(row: &HashMap<String, String>, column: &str) -> f64 {
    row[column]
        .parse()
        .unwrap_or_else(|_| panic!("{column} in {row:?}"))
}

fn summary(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap()
}

fn run_ok(args: &[&str]) -> String {
    let output = essim_replay(args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "essim replay failed: {stderr}");
    String::from_utf8(output.stdout).unwrap()
}

/// Three agentic sessions, at most 3 turns each, arrivals 4× denser (turns
/// often due before their predecessor ends), 20× faster than real time.
const AGENTIC: &[&str] = &[
    "--format",
    "agentic",
    "--sessions",
    "3",
    "--sessions-max-turns",
    "3",
    "--rate-scale",
    "4",
    "--time-scale",
    "20",
];

/// The trace of [`AGENTIC`], loaded as essim does.
/// A Mooncake trace in `dir` of unrelated 600-token requests, one per
/// `(timestamp ms, output tokens)`, each with its own two blocks.
fn mooncake_trace(dir: &Path, requests: &[(u64, u64)]) -> std::path::PathBuf {
    let lines: String = requests
        .iter()
        .enumerate()
        .map(|(i, (timestamp, output))| {
            format!(
                "{{\"timestamp\": {timestamp}, \"input_length\": 600, \"output_length\": {output}, \
                 \"hash_ids\": [{}, {}]}}\n",
                10 * i,
                10 * i + 1
            )
        })
        .collect();
    let path = dir.join("trace.jsonl");
    std::fs::write(&path, lines).unwrap();
    path
}

fn agentic_trace() -> engine_state_sim::Trace {
    TraceSpec {
        format: TraceFormat::Agentic,
        sessions_max_turns: Some(3),
        agentic: AgenticSpec {
            sessions: 3,
            ..AgenticSpec::default()
        },
        ..TraceSpec::default()
    }
    .load(4.0)
    .unwrap()
}

#[test]
fn an_agentic_trace_is_answered_in_session_order_with_its_lengths() {
    let fleet = Fleet::start(1, 20.0);
    let out = tempfile::tempdir().unwrap();
    let out_path = out.path().to_str().unwrap();
    let mut args = AGENTIC.to_vec();
    args.extend(["--url", &fleet.urls[0], "--out", out_path]);
    let stdout = run_ok(&args);
    assert!(stdout.contains("| TTFT s |"), "{stdout}");

    let trace = agentic_trace();
    let rows = read_rows(out.path());
    assert_eq!(rows.len(), trace.requests.len());
    assert!(rows.len() >= 4, "a few requests: {}", rows.len());
    for (i, (row, request)) in rows.iter().zip(&trace.requests).enumerate() {
        assert_eq!(row["id"], i.to_string());
        assert_eq!(row["outcome"], "ok", "{row:?}");
        assert_eq!(num(row, "prompt_tokens"), request.input_len as f64);
        assert_eq!(num(row, "completion_tokens"), request.output_len as f64);
        assert_eq!(row["session"], format!("s{}", request.session.unwrap()));
        assert_eq!(row["url"], fleet.urls[0]);
        assert_eq!(row["engine"], "", "essim serve names no engine");
        let (ttft, tpot, e2e) = (num(row, "ttft_s"), num(row, "tpot_s"), num(row, "e2e_s"));
        assert!(ttft > 0.0 && tpot > 0.0 && e2e >= ttft, "{row:?}");
        // Never early: sent at or after its (modelled) arrival.
        assert!(num(row, "sent_s") >= request.arrival_ns as f64 / 1e9 - 1e-3);
    }
    // Session order: turn n+1 sent only once turn n ended; some turns were
    // due before that (the wait is real, not vacuous).
    let mut held = 0;
    for session in 0..3u64 {
        let turns: Vec<(&HashMap<String, String>, u64)> = rows
            .iter()
            .zip(&trace.requests)
            .filter(|(_, r)| r.session == Some(session))
            .map(|(row, r)| (row, r.arrival_ns))
            .collect();
        for pair in turns.windows(2) {
            let (before, after) = (pair[0].0, pair[1].0);
            let ended = num(before, "sent_s") + num(before, "e2e_s");
            assert!(
                num(after, "sent_s") >= ended - 1e-5,
                "{before:?} then {after:?}"
            );
            held += usize::from(pair[1].1 as f64 / 1e9 < ended);
        }
    }
    assert!(held >= 1, "no turn was due before its predecessor ended");

    let summary = summary(out.path());
    assert_eq!(summary["requests"], rows.len());
    assert_eq!(summary["outcomes"]["ok"], rows.len());
    assert_eq!(summary["outcomes"]["skipped"], 0);
    assert_eq!(summary["time_scale"], 20.0);
    assert_eq!(summary["urls"][0], fleet.urls[0]);
    for measure in ["ttft_s", "tpot_s", "e2e_s"] {
        for stat in ["p50", "p90", "p99", "mean"] {
            assert!(
                summary[measure][stat].as_f64().unwrap() > 0.0,
                "{measure} {stat}"
            );
        }
    }
    assert!(summary["wall_s"].as_f64().unwrap() > 0.0);
    assert!(summary["held"].as_u64().unwrap() >= 1);
    // Sent on time: within 50 ms wall (1 s modelled at 20×) of its arrival.
    let lag = summary["send_lag_s"]["p99"].as_f64().unwrap();
    assert!((0.0..1.0).contains(&lag), "send lag p99 {lag} s");
}

#[test]
fn two_urls_take_requests_round_robin_and_text_and_chat_prompts_work() {
    let fleet = Fleet::start(2, 20.0);
    let out = tempfile::tempdir().unwrap();
    let mut args = AGENTIC.to_vec();
    args.extend([
        "--url",
        &fleet.urls[0],
        "--url",
        &fleet.urls[1],
        "--prompt",
        "text",
        "--out",
        out.path().to_str().unwrap(),
    ]);
    run_ok(&args);
    let rows = read_rows(out.path());
    let count = |url: &str| rows.iter().filter(|r| r["url"] == url).count();
    let (a, b) = (count(&fleet.urls[0]), count(&fleet.urls[1]));
    assert_eq!(a + b, rows.len());
    assert!(a.abs_diff(b) <= 1, "{a} and {b}");
    assert!(rows.iter().all(|r| r["outcome"] == "ok"));
    assert_eq!(summary(out.path())["urls"].as_array().unwrap().len(), 2);

    // Chat: the templated prompt has the trace's length.
    let chat = tempfile::tempdir().unwrap();
    let mut args = AGENTIC.to_vec();
    args.extend([
        "--url",
        &fleet.urls[0],
        "--endpoint",
        "chat",
        "--prompt",
        "text",
        "--out",
        chat.path().to_str().unwrap(),
    ]);
    run_ok(&args);
    let trace = agentic_trace();
    let chat_rows = read_rows(chat.path());
    assert_eq!(chat_rows.len(), trace.requests.len());
    for (row, request) in chat_rows.iter().zip(&trace.requests) {
        assert_eq!(row["outcome"], "ok", "{row:?}");
        assert_eq!(num(row, "prompt_tokens"), request.input_len as f64);
        assert_eq!(num(row, "completion_tokens"), request.output_len as f64);
    }
}

#[test]
fn past_max_in_flight_requests_are_skipped_and_counted() {
    let fleet = Fleet::start(1, 20.0);
    let dir = tempfile::tempdir().unwrap();
    // Four unrelated requests at once; the first holds the only slot for
    // its 400 tokens (≥ 160 ms wall at 20×: 8 ms a step modelled).
    let trace = mooncake_trace(dir.path(), &[(0, 400); 4]);
    let out = dir.path().join("out");
    run_ok(&[
        "--trace",
        trace.to_str().unwrap(),
        "--url",
        &fleet.urls[0],
        "--time-scale",
        "20",
        "--max-in-flight",
        "1",
        "--out",
        out.to_str().unwrap(),
    ]);
    let summary = summary(&out);
    assert_eq!(summary["outcomes"]["ok"], 1);
    assert_eq!(summary["outcomes"]["skipped"], 3);
    let rows = read_rows(&out);
    assert_eq!(rows.iter().filter(|r| r["outcome"] == "skipped").count(), 3);
    assert!(rows
        .iter()
        .filter(|r| r["outcome"] == "skipped")
        .all(|r| r["url"].is_empty() && r["ttft_s"].is_empty()));
}

#[test]
fn an_unreachable_url_and_bad_flags_fail_clearly() {
    // A port nobody listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let output = essim_replay(&["--format", "agentic", "--sessions", "1", "--url", &url]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(&url), "{stderr}");
    assert!(
        stderr.to_lowercase().contains("refused"),
        "the OS error: {stderr}"
    );

    // clap's errors: exit 2 and the flag named.
    let output = essim_replay(&["--format", "agentic", "--url", &url, "--time-scale", "x"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--time-scale"));
    let output = essim_replay(&["--format", "agentic"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--url"));
    // Checked before any request.
    let output = essim_replay(&["--format", "agentic", "--url", &url, "--time-scale", "0"]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--time-scale must be"));
    let output = essim_replay(&["--format", "agentic", "--url", &url, "--endpoint", "chat"]);
    assert!(String::from_utf8_lossy(&output.stderr).contains("--prompt text"));
}

/// A hand-written HTTP server: `/v1/models` answers 200; the n-th
/// completion (0-based) streams two tokens with an `x-esroute-engine`
/// header (n = 0), answers 503 (n = 1), or never answers (n = 2). The
/// completions' request heads go to the channel.
fn scripted_server() -> (String, std::sync::mpsc::Receiver<String>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (heads, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut completions = 0;
        let mut held = Vec::new();
        for stream in listener.incoming() {
            let mut stream = stream.unwrap();
            let heads = heads.clone();
            let mut request = Vec::new();
            let mut buffer = [0u8; 65536];
            // The head, then the body by its content-length.
            let (head, body_len) = loop {
                let n = stream.read(&mut buffer).unwrap();
                request.extend_from_slice(&buffer[..n]);
                if let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&request[..end]).to_lowercase();
                    let len = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length: "))
                        .map_or(0, |v| v.trim().parse::<usize>().unwrap());
                    break (head, end + 4 + len);
                }
            };
            while request.len() < body_len {
                let n = stream.read(&mut buffer).unwrap();
                request.extend_from_slice(&buffer[..n]);
            }
            if head.starts_with("get ") {
                let body = "{\"object\":\"list\",\"data\":[]}";
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                continue;
            }
            let _ = heads.send(head);
            match completions {
                0 => {
                    let chunk = |t: &str| {
                        format!("data: {{\"choices\":[{{\"index\":0,\"text\":\"{t}\"}}]}}\n\n")
                    };
                    let body = format!(
                        "{}{}data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":600,\
                         \"completion_tokens\":2,\"total_tokens\":602}}}}\n\ndata: [DONE]\n\n",
                        chunk("a"),
                        chunk("b")
                    );
                    let _ = write!(
                        stream,
                        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                         x-esroute-engine: sim-7\r\ncontent-length: {}\r\n\
                         connection: close\r\n\r\n{body}",
                        body.len()
                    );
                }
                1 => {
                    let _ = write!(
                        stream,
                        "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\
                         connection: close\r\n\r\n"
                    );
                }
                _ => held.push(stream),
            }
            completions += 1;
        }
    });
    (url, receiver)
}

#[test]
fn session_headers_engine_headers_http_errors_and_timeouts() {
    let (url, heads) = scripted_server();
    let dir = tempfile::tempdir().unwrap();
    // Three one-turn sessions, 0.2 s apart (so that the script's order is
    // the trace's).
    let trace = mooncake_trace(dir.path(), &[(0, 2), (200, 2), (400, 2)]);
    let out = dir.path().join("out");
    run_ok(&[
        "--trace",
        trace.to_str().unwrap(),
        "--url",
        &url,
        "--timeout-s",
        "0.5",
        "--out",
        out.to_str().unwrap(),
    ]);
    let rows = read_rows(&out);
    let outcomes: Vec<&str> = rows.iter().map(|r| r["outcome"].as_str()).collect();
    assert_eq!(outcomes, ["ok", "http_503", "timeout"]);
    assert_eq!(rows[0]["engine"], "sim-7");
    assert_eq!(rows[0]["completion_tokens"], "2");
    assert_eq!(rows[1]["engine"], "");
    let heads: Vec<String> = heads.try_iter().collect();
    assert_eq!(heads.len(), 3);
    for (i, head) in heads.iter().enumerate() {
        assert!(head.starts_with("post /v1/completions "), "{head}");
        assert!(head.contains(&format!("x-session-id: s{i}\r\n")), "{head}");
    }
    let summary = summary(&out);
    assert_eq!(summary["outcomes"]["http_503"], 1);
    assert_eq!(summary["outcomes"]["timeout"], 1);
    assert_eq!(summary["outcomes"]["ok"], 1);
}

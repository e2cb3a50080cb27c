//! `essim serve` as a real process over real sockets: streamed and whole
//! completions checked token by token, `/metrics`, `/health`, the
//! engine-state files its publishers write, and a client disconnect
//! aborting its request in the model.

use std::io::{BufRead, BufReader};
use std::process::Command;
use std::time::{Duration, Instant};

use engine_state_reader::{ReaderOptions, ShmDir, Status};
use serde_json::{json, Value};

mod common;
use common::Fleet;

fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

/// The `data:` payloads of a streamed response, in order.
fn sse(response: reqwest::blocking::Response) -> Vec<String> {
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    BufReader::new(response)
        .lines()
        .map(Result::unwrap)
        .filter_map(|line| line.strip_prefix("data: ").map(str::to_owned))
        .collect()
}

/// Check one streamed completion: first chunk, one chunk per token, the
/// last with finish_reason, a usage chunk, `[DONE]`.
fn check_stream(events: &[String], prompt_tokens: u64, max_tokens: u64) {
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let first = &chunks[0];
    assert_eq!(first["object"], "text_completion");
    assert_eq!(first["choices"][0]["text"].as_str().unwrap().len(), 1);
    let tokens: Vec<&Value> = chunks
        .iter()
        .filter(|c| !c["choices"].as_array().unwrap().is_empty())
        .collect();
    assert_eq!(tokens.len() as u64, max_tokens);
    for (k, chunk) in tokens.iter().enumerate() {
        let finish = &chunk["choices"][0]["finish_reason"];
        match k as u64 + 1 == max_tokens {
            true => assert_eq!(finish, "length"),
            false => assert!(finish.is_null(), "{chunk}"),
        }
    }
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(
        usage,
        &json!({"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens,
            "total_tokens": prompt_tokens + max_tokens})
    );
}

/// The value of an unlabelled-name metric line (the first sample of `name`).
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .and_then(|l| l.rsplit(' ').next())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
        .parse()
        .unwrap()
}

fn poll<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(8);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn streams_whole_responses_metrics_health_and_engine_state() {
    let fleet = Fleet::start(2, 10.0);
    let http = client();
    // 20 streamed requests with token-id prompts, 10 per engine, at once.
    let handles: Vec<_> = (0..20u64)
        .map(|i| {
            let url = format!("{}/v1/completions", fleet.urls[i as usize % 2]);
            let http = http.clone();
            std::thread::spawn(move || {
                let prompt: Vec<u64> = (0..(100 + 97 * i)).map(|t| (t * 31 + i) % 50_000).collect();
                let max_tokens = 5 + i;
                let body = json!({"model": "essim", "prompt": prompt, "max_tokens": max_tokens,
                    "stream": true});
                let events = sse(http.post(url).json(&body).send().unwrap());
                check_stream(&events, prompt.len() as u64, max_tokens);
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }

    // Not streamed, a text prompt: one token per byte.
    let whole: Value = http
        .post(format!("{}/v1/completions", fleet.urls[1]))
        .json(&json!({"prompt": "hello world", "max_tokens": 7}))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(whole["choices"][0]["text"].as_str().unwrap().len(), 7);
    assert_eq!(whole["choices"][0]["finish_reason"], "length");
    assert_eq!(
        whole["usage"],
        json!({"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18})
    );
    // Time-scaled: 100 decode steps last ≥ 100 × 8 ms (the default
    // profile's fixed step cost) modelled, a tenth of it on the wall clock
    // at --time-scale 10 (the bound: the 1× time, ten times the margin).
    let started = Instant::now();
    let timed = http
        .post(format!("{}/v1/completions", fleet.urls[1]))
        .json(&json!({"prompt": [5, 6, 7], "max_tokens": 100}))
        .send()
        .unwrap();
    assert_eq!(timed.status(), 200);
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(80) && elapsed < Duration::from_millis(800),
        "{elapsed:?}"
    );
    // The same prompt, the same output (greedy-like).
    let again: Value = http
        .post(format!("{}/v1/completions", fleet.urls[0]))
        .json(&json!({"prompt": "hello world", "max_tokens": 7}))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(again["choices"][0]["text"], whole["choices"][0]["text"]);

    // Chat, streamed: the role first, then the tokens.
    let events = sse(http
        .post(format!("{}/v1/chat/completions", fleet.urls[0]))
        .json(&json!({"messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 3, "stream": true}))
        .send()
        .unwrap());
    let role: Value = serde_json::from_str(&events[0]).unwrap();
    assert_eq!(role["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(events.len(), 1 + 3 + 1 + 1, "{events:?}");
    let usage: Value = serde_json::from_str(&events[4]).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 3);

    // Bad requests.
    let bad = http
        .post(format!("{}/v1/completions", fleet.urls[0]))
        .body("{not json")
        .send()
        .unwrap();
    assert_eq!(bad.status(), 400);
    let too_long = http
        .post(format!("{}/v1/completions", fleet.urls[0]))
        .json(&json!({"prompt": [1, 2, 3], "max_tokens": 10_000_000}))
        .send()
        .unwrap();
    assert_eq!(too_long.status(), 400);

    // /health, /v1/models, /metrics.
    for url in &fleet.urls {
        assert_eq!(
            http.get(format!("{url}/health")).send().unwrap().status(),
            200
        );
        let models: Value = http
            .get(format!("{url}/v1/models"))
            .send()
            .unwrap()
            .json()
            .unwrap();
        assert_eq!(models["data"][0]["id"], "essim");
    }
    let text = http
        .get(format!("{}/metrics", fleet.urls[0]))
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert_eq!(metric(&text, "vllm:num_requests_running"), 0.0);
    assert_eq!(metric(&text, "vllm:num_requests_waiting"), 0.0);
    let usage = metric(&text, "vllm:kv_cache_usage_perc");
    assert!((0.0..=1.0).contains(&usage));
    assert!(metric(&text, "vllm:prefix_cache_queries_total") > 0.0);
    metric(&text, "vllm:prefix_cache_hits_total");
    // 10 streamed (5, 7, … 23 tokens), a text one (7), the chat one (3).
    let expected: u64 = (0..20).step_by(2).map(|i| 5 + i).sum::<u64>() + 7 + 3;
    assert_eq!(
        metric(&text, "vllm:generation_tokens_total"),
        expected as f64
    );
    assert_eq!(metric(&text, "vllm:request_success_total"), 12.0);
    assert!(text.contains("# TYPE vllm:prefix_cache_hits counter"));

    // Engine-state: each engine's file, fresh, with a cache digest.
    let mut source = ShmDir::open(
        fleet.dir.path(),
        ReaderOptions::default().with_cache_digests(true),
    )
    .unwrap();
    for id in ["sim-0", "sim-1"] {
        let state = poll(id, || {
            source
                .read_engine(id)
                .unwrap()
                .filter(|s| s.status == Status::Fresh)
        });
        assert_eq!(state.snapshot.num_running, 0, "idle after the requests");
        assert!(state.snapshot.step > 0);
        assert!(state.snapshot.gpu_blocks_total > 0);
        assert!(state.snapshot.cache_version > 0, "a digest was published");
        let digest = state.cache.expect("the digest is readable");
        // Prompts of 100 + 97·i tokens: the longest ones hold whole 512-token blocks.
        assert!(!digest.is_empty(), "{id}: the digest lists held blocks");
    }
}

#[test]
fn a_client_that_disconnects_aborts_its_request() {
    let fleet = Fleet::start(1, 1.0);
    let http = client();
    let metrics = |name: &str| {
        let text = http
            .get(format!("{}/metrics", fleet.urls[0]))
            .send()
            .unwrap()
            .text()
            .unwrap();
        metric(&text, name)
    };
    let mut source = ShmDir::open(fleet.dir.path(), ReaderOptions::default()).unwrap();
    let mut running_in_state = || {
        source
            .read_engine("sim-0")
            .unwrap()
            .filter(|s| s.status == Status::Fresh)
            .map(|s| s.snapshot.num_running)
    };
    // At 1×: 50 decode steps last at least 50 × 8 ms on the wall clock.
    let started = Instant::now();
    let timed = http
        .post(format!("{}/v1/completions", fleet.urls[0]))
        .json(&json!({"prompt": [5, 6, 7], "max_tokens": 50}))
        .send()
        .unwrap();
    assert_eq!(timed.status(), 200);
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
    // Long enough to be mid-stream for minutes at 1× (≈ 10 ms a token).
    let body = json!({"prompt": (0..600).collect::<Vec<u32>>(), "max_tokens": 20_000,
        "stream": true});
    let response = http
        .post(format!("{}/v1/completions", fleet.urls[0]))
        .json(&body)
        .send()
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut lines = BufReader::new(response).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.starts_with("data: {"), "{first}");
    assert_eq!(metrics("vllm:num_requests_running"), 1.0);
    poll("the running request in engine-state", || {
        (running_in_state()? == 1).then_some(())
    });
    drop(lines); // the client goes away mid-stream
    poll("the abort", || {
        (metrics("vllm:num_requests_running") == 0.0).then_some(())
    });
    assert_eq!(metrics("vllm:num_requests_waiting"), 0.0);
    assert!(metrics("vllm:generation_tokens_total") < 20_000.0);
    poll("the abort in engine-state", || {
        (running_in_state()? == 0).then_some(())
    });

    // Not streamed: a client that gives up (its timeout) aborts too.
    let generated = metrics("vllm:generation_tokens_total");
    let body = json!({"prompt": (0..600).collect::<Vec<u32>>(), "max_tokens": 20_000});
    let gave_up = http
        .post(format!("{}/v1/completions", fleet.urls[0]))
        .json(&body)
        .timeout(Duration::from_millis(300))
        .send();
    assert!(gave_up.unwrap_err().is_timeout());
    poll("the abort of the whole request", || {
        (metrics("vllm:num_requests_running") == 0.0).then_some(())
    });
    let ran = metrics("vllm:generation_tokens_total") - generated;
    assert!(ran > 0.0 && ran < 20_000.0, "it ran, then stopped: {ran}");
}

#[test]
fn a_client_that_leaves_before_its_first_token_aborts_its_waiting_request() {
    // One running request at a time: the second one waits.
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("one-seq.toml");
    std::fs::write(&profile, "max_num_seqs = 1\n").unwrap();
    let profile = profile.display().to_string();
    let fleet = Fleet::start_with(1, 1.0, &["--profile", &profile]);
    let http = client();
    let metrics = |name: &str| {
        let text = http
            .get(format!("{}/metrics", fleet.urls[0]))
            .send()
            .unwrap()
            .text()
            .unwrap();
        metric(&text, name)
    };
    let url = format!("{}/v1/completions", fleet.urls[0]);
    let long = json!({"prompt": [1, 2, 3], "max_tokens": 20_000, "stream": true});
    let running = http.post(&url).json(&long).send().unwrap();
    let mut running = BufReader::new(running).lines();
    assert!(running.next().unwrap().unwrap().starts_with("data: {"));
    let waiting = http.post(&url).json(&long).send().unwrap();
    assert_eq!(waiting.status(), 200);
    poll("the second request waiting", || {
        (metrics("vllm:num_requests_waiting") == 1.0).then_some(())
    });
    drop(waiting); // no token was ever written to it
    poll("the waiting request's abort", || {
        (metrics("vllm:num_requests_waiting") == 0.0).then_some(())
    });
    assert_eq!(metrics("vllm:num_requests_running"), 1.0);
    drop(running);
    poll("the running request's abort", || {
        (metrics("vllm:num_requests_running") == 0.0).then_some(())
    });
}

#[test]
fn sigterm_stops_the_fleet_and_removes_its_files() {
    let mut fleet = Fleet::start(2, 10.0);
    for id in ["sim-0", "sim-1"] {
        assert!(fleet.dir.path().join(id).exists(), "{id} publishes");
    }
    let pid = fleet.child.id().to_string();
    let status = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(status.success());
    let exit = poll("essim serve to exit", || fleet.child.try_wait().unwrap());
    assert!(exit.success(), "{exit:?}");
    for id in ["sim-0", "sim-1"] {
        assert!(
            !fleet.dir.path().join(id).exists(),
            "{id}'s file is retired"
        );
    }
}

/// POST `body` to `path` of `url` (a render endpoint), expect `status`, the JSON back.
fn post_json(url: &str, path: &str, body: &Value, status: u16) -> Value {
    let response = client()
        .post(format!("{url}{path}"))
        .json(body)
        .send()
        .unwrap();
    assert_eq!(response.status(), status, "{path} {body}");
    response.json().unwrap()
}

#[test]
fn render_answers_the_token_ids_the_engine_runs_without_generating() {
    let fleet = Fleet::start(1, 10.0);
    let url = &fleet.urls[0];
    let bytes = |s: &str| s.bytes().map(u32::from).collect::<Vec<u32>>();
    let ids = |v: &Value| -> Vec<u32> { serde_json::from_value(v["token_ids"].clone()).unwrap() };

    // A completion: a list of one GenerateRequest; text is one token per byte.
    let text = json!({"model": "essim", "prompt": "hello world", "max_tokens": 7,
        "stream": true, "stream_options": {"include_usage": true}});
    let rendered = post_json(url, "/v1/completions/render", &text, 200);
    let list = rendered.as_array().unwrap();
    assert_eq!(list.len(), 1, "{rendered}");
    let first = &list[0];
    assert_eq!(ids(first), bytes("hello world"));
    assert!(first["request_id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(first["sampling_params"]["max_tokens"], 7);
    assert_eq!(first["model"], "essim");
    assert_eq!(first["stream"], true);
    assert_eq!(first["stream_options"]["include_usage"], true);
    // Token ids pass through as they are.
    let tokens = json!({"prompt": [5, 6, 70_000]});
    let rendered = post_json(url, "/v1/completions/render", &tokens, 200);
    assert_eq!(ids(&rendered[0]), vec![5, 6, 70_000]);
    assert_eq!(rendered[0]["sampling_params"]["max_tokens"], 16);

    // A chat: one GenerateRequest, the template's text.
    let messages = json!([{"role": "user", "content": "hi"}]);
    let chat = json!({"messages": messages, "max_tokens": 3});
    let rendered = post_json(url, "/v1/chat/completions/render", &chat, 200);
    assert!(rendered.is_object(), "{rendered}");
    assert!(rendered["request_id"]
        .as_str()
        .unwrap()
        .starts_with("chatcmpl-"));
    assert_eq!(ids(&rendered), bytes("<|user|>\nhi\n<|assistant|>\n"));
    // The engine runs exactly these tokens.
    let whole = post_json(url, "/v1/chat/completions", &chat, 200);
    assert_eq!(whole["usage"]["prompt_tokens"], ids(&rendered).len());

    // Bad requests are refused as the generation endpoints refuse them.
    post_json(url, "/v1/completions/render", &json!({"prompt": []}), 400);
    post_json(
        url,
        "/v1/chat/completions/render",
        &json!({"max_tokens": 3}),
        400,
    );
    let too_long = json!({"prompt": [1, 2, 3], "max_tokens": 10_000_000});
    post_json(url, "/v1/completions/render", &too_long, 400);

    // Rendering generated nothing: only the chat completion ran.
    let text = client()
        .get(format!("{url}/metrics"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert_eq!(metric(&text, "vllm:request_success_total"), 1.0);
    assert_eq!(metric(&text, "vllm:generation_tokens_total"), 3.0);
}

#[test]
fn a_streamed_first_token_is_not_held_back_by_nagle() {
    // At 1×, a 3-token prompt's first token comes one short step (≈ 10 ms)
    // after the response head. Without TCP_NODELAY on the engine's side it
    // waits for the client's delayed ACK of the head (40 ms on Linux) on a
    // kept-alive connection.
    let fleet = Fleet::start(1, 1.0);
    let http = client();
    let url = format!("{}/v1/completions", fleet.urls[0]);
    let mut firsts: Vec<Duration> = (0..20)
        .map(|i| {
            let body = json!({"prompt": [i, 2, 3], "max_tokens": 2, "stream": true});
            let started = Instant::now();
            let response = http.post(&url).json(&body).send().unwrap();
            let mut lines = BufReader::new(response).lines();
            assert!(lines.next().unwrap().unwrap().starts_with("data: {"));
            let first = started.elapsed();
            lines.for_each(drop);
            first
        })
        .collect();
    firsts.sort();
    assert!(firsts[10] < Duration::from_millis(35), "{firsts:?}");
}

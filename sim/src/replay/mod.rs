//! `essim replay`: send a trace to OpenAI-compatible URLs in real time and
//! measure TTFT, TPOT and E2E on the client side, per request.
//!
//! - Arrivals: a request at trace time t (after `--rate-scale`) is due at
//!   wall time t / K (`--time-scale K`); every time reported is wall time ×
//!   K, modelled seconds, comparable with `essim run` and with `essim serve
//!   --time-scale K`.
//! - Session order: the turns of a session go in the trace's order, each at
//!   its due time but never before the session's previous turn ended (its
//!   stream finished, failed, timed out or was skipped). The generator
//!   (`agentic.rs`) draws each turn's arrival as the previous arrival plus a
//!   think time and makes the previous output part of the next prompt, so a
//!   real client cannot send turn n+1 before turn n's output exists;
//!   essim's driver replays arrivals open loop and has no such wait, so the
//!   two differ where a turn ends after its successor's arrival (the wait
//!   shows in `sent_s`, such turns are counted `held` in summary.json;
//!   latencies are measured from the send). `send_lag_s` in summary.json:
//!   how late the other requests went out, the replayer's own error (the
//!   full agentic trace at 50× over 8 engines: p50 0.3 ms, p99 26 ms
//!   modelled, 0.5 ms wall).
//! - Prompts (`prompt`): the trace's prefix sharing, block by block, as
//!   token ids or as text; a session stream carries the previous turn's real
//!   output. A prompt is built shortly before it is due, off the send; a
//!   turn waiting on its predecessor is built right after it ended, from
//!   the session's context already serialised (the agentic trace's longest
//!   prompt, 117k tokens: 0.5 ms as token ids, 25 µs as text, against 3 ms
//!   and 1 ms from scratch).
//! - Requests are streamed (`stream_options.include_usage`), with
//!   `max_tokens` = the trace's output length and `ignore_eos`; a session's
//!   requests carry `x-session-id: s<N>` and `"user": "s<N>"`. Several URLs
//!   take requests round-robin, in send order.
//! - `--max-in-flight N`: a request due while N are in flight is not sent
//!   and counted `skipped`; `--timeout-s S` (modelled seconds, default 600)
//!   bounds each request from its send to its last byte.
//!
//! Layout: `prompt` (tokens, text and bodies), `client` (hyper, the probe,
//! one streamed request), `report` (requests.csv, summary.json, the table).
//!
//! Why not `vllm bench serve` (vLLM 0.33, read for this note:
//! `vllm/benchmarks/lib/endpoint_request_func.py`,
//! `vllm/benchmarks/datasets/datasets.py`): a request's only own header is
//! `x-request-id` (other headers are the same for every request) and its
//! body has no `user`, so no session id reaches a router; one URL
//! (`api_url`) takes every request; `SampleRequest` has an optional arrival
//! `timestamp`, but every dataset makes its prompts with the model's
//! Hugging Face tokenizer (`tokenizer(...)`, `tokenizer.decode(...)`). From
//! an earlier read of its Mooncake-style trace dataset (not in the stored
//! copy): block tokens are seeded with Python's per-process `hash()` (two
//! runs send different prompts), and a turn's output never enters the next
//! turn's prompt, so a session's sharing with the engine's cached output is
//! lost.

mod client;
mod prompt;
mod report;

use std::collections::HashMap;
use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

pub use self::client::Outcome;
pub use self::prompt::{prompt, Endpoint, Prompt, PromptKind, TOKEN_BASE, TOKEN_SPAN};
pub use self::report::{Row, Stats, Summary, CSV_HEADER};
use crate::trace::{Content, Trace};

/// A prompt is built this long (wall) before it is due.
const PREPARE_AHEAD: Duration = Duration::from_millis(100);
/// Failed requests reported one by one on stderr (then only counted).
const ERRORS_SHOWN: usize = 5;

/// What `essim replay` does.
#[derive(Clone, Debug)]
pub struct ReplayConfig {
    /// Base URLs (`http://HOST:PORT`), round-robin per request.
    pub urls: Vec<String>,
    /// Arrivals this many times denser in wall time; times reported × this.
    pub time_scale: f64,
    /// Token ids or text.
    pub prompt: PromptKind,
    /// Completions or chat.
    pub endpoint: Endpoint,
    /// The `model` field.
    pub model: String,
    /// Per-request timeout, modelled seconds.
    pub timeout_s: f64,
    /// Requests in flight at most; one more due is skipped.
    pub max_in_flight: usize,
    /// Write requests.csv and summary.json here.
    pub out: Option<PathBuf>,
}

impl ReplayConfig {
    fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(!self.urls.is_empty(), "--url: at least one is needed");
        anyhow::ensure!(
            self.time_scale.is_finite() && self.time_scale > 0.0,
            "--time-scale must be a factor > 0, not {}",
            self.time_scale
        );
        anyhow::ensure!(
            self.timeout_s.is_finite() && self.timeout_s > 0.0,
            "--timeout-s must be > 0, not {}",
            self.timeout_s
        );
        anyhow::ensure!(self.max_in_flight >= 1, "--max-in-flight must be ≥ 1");
        anyhow::ensure!(
            !(self.endpoint == Endpoint::Chat && self.prompt == PromptKind::Tokens),
            "--endpoint chat sends text: use it with --prompt text"
        );
        Ok(())
    }
}

/// What every request task shares.
struct Shared {
    trace: Arc<Trace>,
    config: ReplayConfig,
    client: client::HttpClient,
    /// The endpoint URL of each base URL.
    targets: Vec<String>,
    start: Instant,
    /// Requests sent and not yet ended: a send's `fetch_add` claims a slot
    /// (undone at once when over the limit), its end's `fetch_sub` frees
    /// it. Counts only: nothing else is published through it (Relaxed
    /// would do; AcqRel keeps the claim and the release in one order).
    in_flight: AtomicUsize,
    /// The next URL, round-robin: one `fetch_add` per sent request, the
    /// only operation on it.
    next_target: AtomicUsize,
    /// Failed requests (the first few are shown): `fetch_add` per failure,
    /// read once after every task ended (the join orders it).
    errors: AtomicUsize,
    rows: Mutex<Vec<Option<Row>>>,
    progress: Option<indicatif::ProgressBar>,
}

/// Replay `trace` (already loaded and rate-scaled) against the URLs:
/// probe each, send every request, write the files, return the summary.
pub fn replay(trace: Trace, config: ReplayConfig) -> anyhow::Result<Summary> {
    config.validate()?;
    let bases = config
        .urls
        .iter()
        .map(|u| client::base_url(u))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let out = config.out.clone();
    let (rows, summary) = runtime.block_on(run(trace, config, bases))?;
    if let Some(dir) = &out {
        report::write(dir, &rows, &summary)?;
    }
    Ok(summary)
}

async fn run(
    trace: Trace,
    config: ReplayConfig,
    bases: Vec<String>,
) -> anyhow::Result<(Vec<Row>, Summary)> {
    let http = client::client();
    for base in &bases {
        client::probe(&http, base).await?;
    }
    let n = trace.requests.len();
    let progress = std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::new(n as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{elapsed_precise} [{bar:40}] {pos}/{len} requests ({msg})",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        bar
    });
    // Chains: a session's turns in trace order; a request without a
    // session alone.
    let mut chains: Vec<Vec<usize>> = Vec::new();
    let mut by_session: HashMap<u64, usize> = HashMap::new();
    for (i, r) in trace.requests.iter().enumerate() {
        match r.session {
            Some(s) => {
                let chain = *by_session.entry(s).or_insert_with(|| {
                    chains.push(Vec::new());
                    chains.len() - 1
                });
                chains[chain].push(i);
            }
            None => chains.push(vec![i]),
        }
    }
    let name = trace.name.clone();
    let shared = Arc::new(Shared {
        trace: Arc::new(trace),
        targets: bases
            .iter()
            .map(|b| format!("{b}{}", config.endpoint.path()))
            .collect(),
        config,
        client: http,
        start: Instant::now(),
        in_flight: AtomicUsize::new(0),
        next_target: AtomicUsize::new(0),
        errors: AtomicUsize::new(0),
        rows: Mutex::new(vec![None; n]),
        progress,
    });
    let mut tasks = tokio::task::JoinSet::new();
    for chain in chains {
        tasks.spawn(run_chain(Arc::clone(&shared), chain));
    }
    while let Some(done) = tasks.join_next().await {
        done?;
    }
    let wall_s = shared.start.elapsed().as_secs_f64();
    if let Some(bar) = &shared.progress {
        bar.finish_and_clear();
    }
    let errors = shared.errors.load(Ordering::Relaxed);
    if errors > ERRORS_SHOWN {
        eprintln!(
            "essim replay: {} more failed requests (see requests.csv)",
            errors - ERRORS_SHOWN
        );
    }
    let rows: Vec<Row> = std::mem::take(&mut *lock(&shared.rows))
        .into_iter()
        .map(|r| r.expect("every request has its row"))
        .collect();
    let summary = Summary::of(
        &name,
        &rows,
        wall_s,
        shared.config.time_scale,
        &shared.config.urls,
    );
    Ok((rows, summary))
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Tokio's timer fires on whole milliseconds, late: sleep to within this
/// of a send's due time, then yield until it.
const TIMER_SLACK: Duration = Duration::from_millis(2);

/// Return at `due` (not a millisecond after, as `sleep_until` would).
async fn wait_until(due: Instant) {
    if let Some(early) = due.checked_sub(TIMER_SLACK) {
        tokio::time::sleep_until(early).await;
    }
    while Instant::now() < due {
        tokio::task::yield_now().await;
    }
}

/// One session's turns (or one request), in order.
async fn run_chain(shared: Arc<Shared>, chain: Vec<usize>) {
    let k = shared.config.time_scale;
    // The session's context: the last prompt and its real output.
    let mut context = Prompt::default();
    let mut previous_end: Option<Instant> = None;
    for index in chain {
        let request = &shared.trace.requests[index];
        let due = shared.start + Duration::from_secs_f64(request.arrival_ns as f64 / 1e9 / k);
        if let Some(prepare) = due.checked_sub(PREPARE_AHEAD) {
            tokio::time::sleep_until(prepare).await;
        }
        let session = request.session.map(|s| format!("s{s}"));
        let len = prompt::content_len(shared.config.endpoint, request.input_len);
        let stream = matches!(request.content, Content::Stream(_));
        let kind = shared.config.prompt;
        let (body, kept) = tokio::task::block_in_place(|| {
            let prompt = prompt(kind, request, index, std::mem::take(&mut context), len);
            let body = prompt::body(
                shared.config.endpoint,
                kind,
                &shared.config.model,
                &prompt,
                request.output_len,
                session.as_deref(),
            );
            (body, stream.then_some(prompt))
        });
        wait_until(due).await;
        let held = previous_end.is_some_and(|end| end > due);
        let (row, text) = send_one(&shared, index, session, body, held).await;
        previous_end = Some(Instant::now());
        if let Some(prompt) = kept {
            // Failed: the next turn has the trace's tokens where the output was.
            context = match row.outcome {
                Outcome::Ok => prompt.with_output(kind, &text),
                _ => prompt,
            };
        }
        if let Some(bar) = &shared.progress {
            bar.inc(1);
            bar.set_message(format!(
                "{} in flight",
                shared.in_flight.load(Ordering::Relaxed)
            ));
        }
        lock(&shared.rows)[index] = Some(row);
    }
}

/// Send one request now (or skip it): its row and generated text.
async fn send_one(
    shared: &Shared,
    index: usize,
    session: Option<String>,
    body: Vec<u8>,
    held: bool,
) -> (Row, String) {
    let k = shared.config.time_scale;
    let modelled = |d: Duration| d.as_secs_f64() * k;
    let mut row = Row {
        id: index,
        session,
        url: String::new(),
        engine: String::new(),
        sent_s: modelled(shared.start.elapsed()),
        due_s: shared.trace.requests[index].arrival_ns as f64 / 1e9,
        held,
        ttft_s: f64::NAN,
        tpot_s: f64::NAN,
        e2e_s: f64::NAN,
        prompt_tokens: None,
        completion_tokens: None,
        outcome: Outcome::Skipped,
    };
    let max = shared.config.max_in_flight;
    if shared.in_flight.fetch_add(1, Ordering::AcqRel) >= max {
        shared.in_flight.fetch_sub(1, Ordering::AcqRel);
        return (row, String::new());
    }
    let target = shared.next_target.fetch_add(1, Ordering::Relaxed) % shared.targets.len();
    row.url = shared.config.urls[target].clone();
    let timeout = Duration::from_secs_f64(shared.config.timeout_s / k);
    let mut sent = None;
    let answer = tokio::time::timeout(
        timeout,
        client::send(
            &shared.client,
            &shared.targets[target],
            body,
            row.session.as_deref(),
            &mut sent,
        ),
    )
    .await;
    shared.in_flight.fetch_sub(1, Ordering::AcqRel);
    if let Some(sent) = sent {
        row.sent_s = modelled(sent - shared.start);
    }
    let text = match answer {
        Err(_) => {
            row.outcome = Outcome::Timeout;
            String::new()
        }
        Ok(response) => {
            row.engine = response.engine;
            row.ttft_s = response.first_token.map_or(f64::NAN, modelled);
            row.e2e_s = response.end.map_or(f64::NAN, modelled);
            row.prompt_tokens = response.prompt_tokens;
            row.completion_tokens = response.completion_tokens;
            if let (Some(first), Some(last), Some(n)) = (
                response.first_token,
                response.last_token,
                response.completion_tokens,
            ) {
                if n >= 2 {
                    row.tpot_s = modelled(last - first) / (n - 1) as f64;
                }
            }
            row.outcome = response.outcome;
            response.text
        }
    };
    if !matches!(row.outcome, Outcome::Ok | Outcome::Skipped)
        && shared.errors.fetch_add(1, Ordering::Relaxed) < ERRORS_SHOWN
    {
        let detail = match &row.outcome {
            Outcome::Error(message) => format!(": {message}"),
            _ => String::new(),
        };
        let line = format!(
            "essim replay: request {index} to {}: {}{detail}",
            row.url,
            row.outcome.name()
        );
        match &shared.progress {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }
    (row, text)
}

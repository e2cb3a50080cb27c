//! `essim`: flags → configurations → `engine_state_sim`; prints a markdown
//! table and writes CSV, JSON and SVG plots with `--out DIR`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use engine_state_router::{CacheKnowledge, Policy, RealStateUse, RouterSettings};
use engine_state_sim::replay::{Endpoint, PromptKind, ReplayConfig};
use engine_state_sim::{
    markdown, read_csv, run_one, write_report, write_summary_plots, AgenticSpec, EngineProfile,
    FeedSpec, Outcome, RunConfig, Split, StepScenario, Summary, Sweep, TraceFormat, TraceSpec,
};

#[derive(Parser)]
#[command(
    name = "essim",
    version,
    about = "Replay request traces through modelled vLLM engines and the engine-state router"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Simulate configurations (every --policy × --feed × --cache-knowledge) over one trace.
    Run(RunArgs),
    /// Run a sweep file (TOML; see docs/ROUTING.md).
    Sweep {
        /// The sweep file.
        config: PathBuf,
        /// Write summary.csv, summary.json and SVG plots here.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Override the trace file named in the sweep.
        #[arg(long)]
        trace_path: Option<PathBuf>,
        /// Run only the first N configurations (for a quick look).
        #[arg(long)]
        first: Option<usize>,
        /// Configurations simulated at once (threads).
        #[arg(long, default_value_t = 1)]
        jobs: usize,
        /// Never ask the migration trigger (overrides the sweep file).
        #[arg(long)]
        no_migration: bool,
    },
    /// Redraw the plots that need only summary rows (TTFT p90 against feed
    /// period, replicas over one router) from summary.csv files, without
    /// re-running the sweep. Several CSVs: the seeds of one sweep (the
    /// ratios are medians over them; no p90-per-group plots).
    Plot {
        /// summary.csv files (or the directories holding them).
        #[arg(required = true)]
        csv: Vec<PathBuf>,
        /// Write the SVGs here (default: the first CSV's directory).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Describe a trace: counts, span, lengths, sessions, shared prefixes.
    TraceStats(TraceArgs),
    /// A fake vLLM fleet in real time over HTTP, for routers and demos.
    ///
    /// N modelled engines, each stepping
    /// against the wall clock (a step lasts its modelled duration divided by
    /// --time-scale) behind its own HTTP listener with the subset of vLLM's
    /// OpenAI API routers use (/v1/completions and /v1/chat/completions,
    /// streamed or not, with usage; /v1/models, /health, /metrics with
    /// vLLM's metric names), each publishing engine-state through the real
    /// Publisher as the vLLM hook does. Prompts: a list of token ids, or text
    /// (one token per UTF-8 byte); every request generates exactly
    /// max_tokens (default 16) lowercase letters. A client that disconnects
    /// aborts its request. When ready, prints `sim-<i> http://ADDR` per
    /// engine on stdout. Stops on SIGINT/SIGTERM, draining streams.
    Serve(ServeArgs),
    /// Send a trace to OpenAI-compatible URLs in real time; measure TTFT,
    /// TPOT and E2E per request on the client side.
    ///
    /// The trace comes from the same flags as `essim run`'s. A request at
    /// trace time t (after --rate-scale) is sent at wall time t/K
    /// (--time-scale K), but a session's turn never before its previous turn
    /// ended; every reported time is wall time × K (modelled seconds,
    /// comparable with essim run and with `essim serve --time-scale K`).
    /// Prompts reproduce the trace's prefix sharing block by block, as
    /// token ids or text (one token per byte); a session stream carries the
    /// previous turn's real output. Requests stream with usage, max_tokens =
    /// the trace's output length, `x-session-id` and `user` = s<session>.
    /// Every URL is probed first (GET /v1/models, else /health). With --out:
    /// requests.csv (one row per request) and summary.json.
    Replay(ReplayArgs),
    /// One engine model, step by step: a JSON scenario on stdin, one JSON line
    /// per step on stdout (for the check against vLLM's real scheduler,
    /// sim/tests_vllm).
    #[command(hide = true)]
    StepTrace {
        /// Engine profile (TOML; missing keys take the calibrated defaults).
        #[arg(long)]
        profile: Option<PathBuf>,
    },
}

#[derive(Args)]
struct ServeArgs {
    /// Engines, with ids sim-<F> … sim-<F+N-1> (F: --first-id).
    #[arg(long, default_value_t = 2)]
    engines: usize,
    /// The first engine's number F (fleets in several processes under one
    /// engine-state directory keep their ids apart: --engines 1 --first-id 1).
    #[arg(long, default_value_t = 0)]
    first_id: usize,
    /// This process's k-th engine, sim-<F+k>, listens on HOST:PORT+k. Port 0:
    /// every engine on a free port the OS picks (read them from the
    /// `sim-<i> http://ADDR` lines on stdout).
    #[arg(long, default_value = "127.0.0.1:8100")]
    listen_base: std::net::SocketAddr,
    /// Modelled time runs K times faster than the wall clock (every step K
    /// times shorter; a trace replayed K times denser keeps its dynamics).
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Where engine-state is published (file://DIR or redis://…; default:
    /// AGENTIC_ENGINE_STATE_URI, then file:///dev/shm/agentic_engine_state).
    #[arg(long)]
    uri: Option<String>,
    /// Engine profile (TOML; missing keys take the calibrated defaults).
    #[arg(long)]
    profile: Option<PathBuf>,
    /// The model name served (/v1/models, responses, metric labels).
    #[arg(long, default_value = "essim")]
    model: String,
    /// Capture period (ms): a snapshot at a step boundary at most this often,
    /// and the publisher's heartbeat period.
    #[arg(long, default_value_t = 50)]
    period_ms: u64,
}

#[derive(Args)]
struct ReplayArgs {
    #[command(flatten)]
    trace: TraceArgs,
    /// Base URL (http://HOST:PORT) of an engine or router; repeat for
    /// several: requests go round-robin, one each in send order.
    #[arg(long = "url", required = true)]
    urls: Vec<String>,
    /// Arrivals K times denser in wall time; reported latencies × K
    /// (modelled seconds; pair with `essim serve --time-scale K`).
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Prompts as token ids (a JSON list) or text (one token per UTF-8 byte).
    #[arg(long, value_enum, default_value = "tokens")]
    prompt: PromptKind,
    /// /v1/completions or /v1/chat/completions (chat: with --prompt text).
    #[arg(long, value_enum, default_value = "completions")]
    endpoint: Endpoint,
    /// The `model` field of every request.
    #[arg(long, default_value = "essim")]
    model: String,
    /// Per-request timeout, modelled seconds (send to last byte).
    #[arg(long, default_value_t = 600.0)]
    timeout_s: f64,
    /// Requests in flight at most: one due beyond it is not sent, counted `skipped`.
    #[arg(long, default_value_t = 4096)]
    max_in_flight: usize,
    /// Write requests.csv and summary.json here.
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Args)]
struct TraceArgs {
    /// Trace format (agentic = the built-in generator).
    #[arg(long, value_enum, default_value = "mooncake")]
    format: TraceFormat,
    /// Trace file (the default: the Mooncake synthetic trace beside the
    /// repository, for essim run from the repository root).
    #[arg(
        long,
        default_value = "../shared/traces/mooncake_synthetic_trace.jsonl"
    )]
    trace: PathBuf,
    /// Arrivals N times as dense.
    #[arg(long, default_value_t = 1.0)]
    rate_scale: f64,
    /// Keep the first N requests.
    #[arg(long)]
    limit: Option<usize>,
    /// Keep each session's first N turns.
    #[arg(long)]
    sessions_max_turns: Option<usize>,
    /// Skip and count malformed lines instead of failing.
    #[arg(long)]
    skip_bad: bool,
    /// Seed of the agentic generator.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Sessions of the agentic generator.
    #[arg(long, default_value_t = 274)]
    sessions: usize,
}

impl TraceArgs {
    fn spec(&self) -> TraceSpec {
        TraceSpec {
            format: self.format,
            path: Some(self.trace.clone()),
            skip_bad: self.skip_bad,
            sessions_max_turns: self.sessions_max_turns,
            limit: self.limit,
            agentic: AgenticSpec {
                seed: self.seed,
                sessions: self.sessions,
                ..AgenticSpec::default()
            },
        }
    }
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    trace: TraceArgs,
    /// Engines.
    #[arg(long, default_value_t = 8)]
    engines: usize,
    /// Policies (repeat for several).
    #[arg(long = "policy", default_value = "unified")]
    policies: Vec<Policy>,
    /// Where real state is used.
    #[arg(long, default_value = "always")]
    real_state_use: RealStateUse,
    /// Where cache hits come from (repeat for several): engine (the engines'
    /// cache digests, with a periodic feed) or estimated (the router's own).
    #[arg(long = "cache-knowledge", default_value = "engine")]
    cache_knowledge: Vec<CacheKnowledge>,
    /// unified: overload factor.
    #[arg(long, default_value_t = 2.0)]
    overload_factor: f64,
    /// unified: decode weight.
    #[arg(long, default_value_t = 0.0)]
    decode_weight: f64,
    /// Feeds (repeat for several): none, periodic:MS[+DELAY_MS], scraped:MS.
    #[arg(long = "feed", default_value = "periodic:50")]
    feeds: Vec<String>,
    /// Router replicas.
    #[arg(long, default_value_t = 1)]
    routers: usize,
    /// How arrivals are split between replicas.
    #[arg(long, value_enum, default_value = "round-robin")]
    split: SplitArg,
    /// Never ask the migration trigger.
    #[arg(long)]
    no_migration: bool,
    /// Router replicas share their reservations: each publishes every change
    /// of its own shadow and merges the others' before each pick (no effect
    /// with one router).
    #[arg(long)]
    share_reservations: bool,
    /// How late a replica sees the others' reservations, ms (0: shared
    /// memory, every change visible at the next pick; 1, 10, 50: Redis-like
    /// paths). Needs --share-reservations.
    #[arg(long, default_value_t = 0.0, requires = "share_reservations")]
    share_delay_ms: f64,
    /// Engine profile (TOML; missing keys take the calibrated defaults).
    #[arg(long)]
    profile: Option<PathBuf>,
    /// Share of completions the router learns of late (0–1; see --late-s).
    #[arg(long, default_value_t = 0.0)]
    late_fraction: f64,
    /// How late those completions reach the router, seconds.
    #[arg(long, default_value_t = 30.0)]
    late_s: f64,
    /// Write each router's decision log (JSON Lines) to PATH (PATH.N for the
    /// N-th configuration when there are several, .rI per replica).
    #[arg(long)]
    decision_log: Option<PathBuf>,
    /// Write summary.csv, summary.json, ttft_cdf.svg and engine_load_N.svg here.
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum SplitArg {
    RoundRobin,
    Session,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Run(args) => run(args),
        Command::Sweep {
            config,
            out,
            trace_path,
            first,
            jobs,
            no_migration,
        } => sweep(
            &config,
            out.as_deref(),
            trace_path,
            first,
            jobs,
            no_migration,
        ),
        Command::Plot { csv, out } => plot(&csv, out.as_deref()),
        Command::StepTrace { profile } => step_trace(profile.as_deref()),
        Command::Serve(args) => {
            engine_state_sim::serve::serve(engine_state_sim::serve::ServeConfig {
                engines: args.engines,
                first_id: args.first_id,
                listen_base: args.listen_base,
                time_scale: args.time_scale,
                uri: args.uri,
                profile: load_profile(args.profile.as_deref())?,
                model: args.model,
                period: std::time::Duration::from_millis(args.period_ms),
            })
        }
        Command::Replay(args) => replay(args),
        Command::TraceStats(args) => {
            let trace = args.spec().load(args.rate_scale)?;
            println!("{}", trace.stats());
            Ok(())
        }
    }
}

fn replay(args: ReplayArgs) -> anyhow::Result<()> {
    let trace = args.trace.spec().load(args.trace.rate_scale)?;
    eprintln!("{}", trace.stats());
    let summary = engine_state_sim::replay::replay(
        trace,
        ReplayConfig {
            urls: args.urls,
            time_scale: args.time_scale,
            prompt: args.prompt,
            endpoint: args.endpoint,
            model: args.model,
            timeout_s: args.timeout_s,
            max_in_flight: args.max_in_flight,
            out: args.out.clone(),
        },
    )?;
    println!("{}", summary.table());
    if let Some(dir) = &args.out {
        eprintln!("wrote {}", dir.display());
    }
    Ok(())
}

fn load_profile(path: Option<&Path>) -> anyhow::Result<EngineProfile> {
    Ok(match path {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading profile {}", path.display()))?;
            toml::from_str(&text).with_context(|| format!("parsing profile {}", path.display()))?
        }
        None => EngineProfile::default(),
    })
}

fn step_trace(profile: Option<&Path>) -> anyhow::Result<()> {
    use std::io::Write;
    let profile = load_profile(profile)?;
    let scenario: StepScenario = serde_json::from_reader(std::io::stdin().lock())
        .context("parsing the step-trace scenario (JSON on stdin; see sim/src/step_trace.rs)")?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for record in engine_state_sim::step_trace(&profile, &scenario)? {
        serde_json::to_writer(&mut out, &record)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

fn run(args: RunArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.share_delay_ms >= 0.0 && args.share_delay_ms.is_finite(),
        "--share-delay-ms must be a delay ≥ 0 ms (0 for shared memory), not {}",
        args.share_delay_ms
    );
    let share_delay_ns = args
        .share_reservations
        .then(|| (args.share_delay_ms * 1e6).round() as u64);
    let profile = load_profile(args.profile.as_deref())?;
    let trace = args.trace.spec().load(args.trace.rate_scale)?;
    eprintln!("{}", trace.stats());
    let mut outcomes = Vec::new();
    let several = args.policies.len() * args.feeds.len() * args.cache_knowledge.len() > 1;
    for &policy in &args.policies {
        for (feed, &cache_knowledge) in args
            .feeds
            .iter()
            .flat_map(|feed| args.cache_knowledge.iter().map(move |k| (feed, k)))
        {
            let decision_log = args.decision_log.as_ref().map(|path| match several {
                true => PathBuf::from(format!("{}.{}", path.display(), outcomes.len())),
                false => path.clone(),
            });
            let config = RunConfig {
                label: String::new(),
                engines: args.engines,
                profile: profile.clone(),
                router: RouterSettings {
                    policy,
                    real_state_use: args.real_state_use,
                    cache_knowledge,
                    overload_factor: args.overload_factor,
                    decode_weight: args.decode_weight,
                    ..RouterSettings::default()
                },
                feed: feed.parse::<FeedSpec>()?,
                routers: args.routers,
                split: match args.split {
                    SplitArg::RoundRobin => Split::RoundRobin,
                    SplitArg::Session => Split::Session,
                },
                migration: !args.no_migration,
                decision_log,
                late_completion_fraction: args.late_fraction,
                late_completion_ns: (args.late_s * 1e9) as u64,
                share_delay_ns,
            };
            let outcome = run_one(&trace, &config, args.trace.rate_scale)?;
            let s = &outcome.summary;
            eprintln!(
                "{}: {:.2} s wall, {} steps ({:.0} steps/s, {:.0}× real time)",
                s.config,
                s.wall_s,
                s.steps,
                s.steps as f64 / s.wall_s,
                s.simulated_s / s.wall_s
            );
            outcomes.push(outcome);
        }
    }
    report(&outcomes, args.out.as_deref(), false)
}

fn sweep(
    config: &Path,
    out: Option<&Path>,
    trace_path: Option<PathBuf>,
    first: Option<usize>,
    jobs: usize,
    no_migration: bool,
) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(config)
        .with_context(|| format!("reading sweep file {}", config.display()))?;
    let mut sweep = Sweep::from_toml(&text)?;
    if let Some(path) = trace_path {
        sweep.trace.path = Some(path);
    }
    if no_migration {
        sweep.migration = false;
    }
    let total = sweep.runs()?.len();
    let count = first.unwrap_or(total).min(total);
    let bar = indicatif::ProgressBar::new(count as u64).with_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} {elapsed_precise} {msg}")
            .expect("a valid template"),
    );
    let started = std::time::Instant::now();
    let mut done = 0;
    let outcomes = sweep.execute_first(count, jobs, |outcome| {
        done += 1;
        bar.set_message(outcome.summary.config.clone());
        bar.inc(1);
    })?;
    bar.finish_and_clear();
    let wall = started.elapsed().as_secs_f64();
    let steps: u64 = outcomes.iter().map(|o| o.summary.steps).sum();
    let requests: usize = outcomes.iter().map(|o| o.summary.requests).sum();
    eprintln!(
        "{done} configurations in {wall:.1} s wall ({jobs} jobs): {:.0} simulated steps/s, \
         {:.0} requests/s",
        steps as f64 / wall,
        requests as f64 / wall
    );
    report(&outcomes, out, true)
}

fn plot(csvs: &[PathBuf], out: Option<&Path>) -> anyhow::Result<()> {
    let mut seeds = Vec::new();
    for path in csvs {
        let file = match path.is_dir() {
            true => path.join("summary.csv"),
            false => path.clone(),
        };
        let text = std::fs::read_to_string(&file).with_context(|| {
            format!(
                "reading {} (a summary.csv of essim sweep --out)",
                file.display()
            )
        })?;
        seeds.push(read_csv(&text).with_context(|| format!("parsing {}", file.display()))?);
    }
    let dir = match out {
        Some(dir) => dir.to_path_buf(),
        None => {
            let first = &csvs[0];
            match first.is_dir() {
                true => first.clone(),
                false => first.parent().map_or_else(PathBuf::new, Path::to_path_buf),
            }
        }
    };
    for path in write_summary_plots(&dir, &seeds)? {
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

fn report(outcomes: &[Outcome], out: Option<&Path>, sweep: bool) -> anyhow::Result<()> {
    let rows: Vec<Summary> = outcomes.iter().map(|o| o.summary.clone()).collect();
    println!("{}", markdown(&rows));
    if let Some(dir) = out {
        write_report(dir, outcomes, sweep)?;
        eprintln!("wrote {}", dir.display());
    }
    Ok(())
}

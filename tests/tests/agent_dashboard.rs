//! The Grafana dashboard (deploy/grafana/engine-state.json) against live
//! agents: every query names only series an esagent exports — the relay's
//! only in the "Relay (Redis)" row, all the others also in metrics-only mode
//! (no `--redis`) —, and the exported families follow Prometheus
//! conventions (a `# HELP` each, `_total` only on counters, no value a float
//! cannot hold exactly, as a nanosecond stamp would be).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine_state_shm_format::{
    monotonic_ns, unix_ns, EngineId, ShmWriter, Snapshot, WriterOptions,
};
use engine_state_tests::*;

/// The title of the dashboard row whose panels show the relay.
const RELAY_ROW: &str = "Relay (Redis)";

/// A demo engine publishing into `dir` every 20 ms until `stop`.
fn demo_engine(dir: &std::path::Path, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    let dir = dir.to_owned();
    std::thread::spawn(move || {
        let id = EngineId::new("demo-0").unwrap();
        let snap = |step: u64| Snapshot {
            captured_mono_ns: monotonic_ns(),
            captured_unix_ns: unix_ns(),
            step,
            num_running: 3,
            num_waiting: 2,
            gpu_blocks_total: 1000,
            gpu_blocks_free: 400,
            pending_prefill_tokens: 5000,
            max_prefill_remaining: 2000,
            ..Snapshot::default()
        };
        let mut writer = ShmWriter::create(&dir, &id, &WriterOptions::default(), &snap(1)).unwrap();
        let mut step = 1;
        while !stop.load(Ordering::Relaxed) {
            step += 1;
            writer.publish(&snap(step)).unwrap();
            writer.stamp_heartbeat(monotonic_ns());
            // Pacing: a steady engine publishing every 20 ms for the
            // agent's real relay and metrics loops.
            std::thread::sleep(Duration::from_millis(20));
        }
    })
}

/// An in-process esagent on `dir` with `extra` flags (each has its own
/// metrics: the two agents of a test do not mix them).
fn agent(dir: &std::path::Path, extra: &[&str]) -> InProcessAgent {
    let uri = format!("file://{}", dir.display());
    let mut flags = vec!["--uri", &uri, "--period-ms", "20"];
    flags.extend(extra);
    InProcessAgent::start(&flags)
}

fn scrape(addr: &str) -> String {
    http_get(addr, "/metrics").1
}

/// The series names of a scrape (`_bucket`, `_sum`, `_count` included).
fn series(metrics: &str) -> BTreeSet<String> {
    metrics
        .lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .map(|line| line.split(['{', ' ']).next().unwrap().to_owned())
        .collect()
}

/// The metric names in a PromQL expression (identifiers of the project's
/// namespace: label names and functions are not).
fn metric_names(expr: &str) -> BTreeSet<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|word| word.starts_with("engine_state_"))
        .map(str::to_owned)
        .collect()
}

/// Every query of the dashboard, with the title of the row it is in
/// (templating variables: "templating").
fn dashboard_queries() -> Vec<(String, String)> {
    let path = workspace().join("deploy/grafana/engine-state.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    let mut queries = Vec::new();
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(query) = variable["definition"].as_str() {
            queries.push(("templating".to_owned(), query.to_owned()));
        }
    }
    let mut row = String::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        if panel["type"] == "row" {
            row = panel["title"].as_str().unwrap().to_owned();
            continue;
        }
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "panel {} has no query", panel["title"]);
        for target in targets {
            queries.push((row.clone(), target["expr"].as_str().unwrap().to_owned()));
        }
    }
    queries
}

/// Scrapes `addr` until every name of `wanted` is exported (histograms
/// appear with their first sample), at most a minute; the last scrape.
fn scrape_until(addr: &str, wanted: &BTreeSet<String>) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let metrics = scrape(addr);
        if wanted.is_subset(&series(&metrics)) || Instant::now() > deadline {
            return metrics;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Prometheus conventions of one scrape.
fn check_conventions(metrics: &str) {
    let mut kinds = BTreeMap::new();
    let mut helped = BTreeSet::new();
    for line in metrics.lines() {
        let words: Vec<&str> = line.splitn(4, ' ').collect();
        match words[..] {
            ["#", "TYPE", name, kind] => {
                kinds.insert(name.to_owned(), kind.to_owned());
            }
            ["#", "HELP", name, ..] => {
                helped.insert(name.to_owned());
            }
            _ => {}
        }
    }
    assert!(!kinds.is_empty(), "{metrics}");
    for (name, kind) in &kinds {
        assert!(helped.contains(name), "{name} has no # HELP\n{metrics}");
        assert_eq!(
            name.ends_with("_total"),
            kind == "counter",
            "{name} is a {kind}: _total is for counters"
        );
    }
    for line in metrics.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let value: f64 = value.parse().unwrap();
        assert!(
            value.abs() < 2f64.powi(53),
            "{series} = {value}: beyond a float's exact integers (a ns stamp?)"
        );
    }
}

#[test]
fn every_dashboard_query_names_families_a_live_agent_exports() {
    let queries = dashboard_queries();
    let all: BTreeSet<String> = queries.iter().flat_map(|(_, q)| metric_names(q)).collect();
    let outside_relay: BTreeSet<String> = queries
        .iter()
        .filter(|(row, _)| row != RELAY_ROW)
        .flat_map(|(_, q)| metric_names(q))
        .collect();
    assert!(all.len() > outside_relay.len() && !outside_relay.is_empty());

    let dir = tempfile::tempdir().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let engine = demo_engine(dir.path(), stop.clone());

    // Metrics only: no Redis anywhere.
    let metrics_only = agent(dir.path(), &[]);
    let metrics = scrape_until(metrics_only.addr(), &outside_relay);
    let exported = series(&metrics);
    let missing: Vec<_> = outside_relay.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "dashboard queries outside the {RELAY_ROW:?} row name {missing:?}, which a \
         metrics-only esagent does not export:\n{metrics}"
    );
    let relay_only: Vec<_> = all
        .difference(&outside_relay)
        .filter(|name| exported.contains(*name))
        .collect();
    assert!(
        relay_only.is_empty(),
        "a metrics-only agent exports relay metrics {relay_only:?}:\n{metrics}"
    );
    assert!(
        !exported
            .iter()
            .any(|s| s.contains("relay") || s.contains("redis")),
        "a metrics-only agent exports no relay metrics:\n{metrics}"
    );
    check_conventions(&metrics);

    // Relaying to a real Redis: every query.
    let redis = RedisServer::start();
    let relaying = agent(dir.path(), &["--redis", &redis.uri("?prefix=dash:")]);
    let metrics = scrape_until(relaying.addr(), &all);
    let exported = series(&metrics);
    let missing: Vec<_> = all.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "dashboard queries name {missing:?}, which esagent does not export:\n{metrics}"
    );
    check_conventions(&metrics);

    stop.store(true, Ordering::Relaxed);
    engine.join().unwrap();
}

#[test]
fn metric_names_are_read_from_promql() {
    assert_eq!(
        metric_names(
            "histogram_quantile(0.99, sum by (le) (rate(engine_state_relay_lag_seconds_bucket\
             [$__rate_interval]))) + time() - engine_state_step{engine=~\"$engine\"}"
        ),
        BTreeSet::from([
            "engine_state_relay_lag_seconds_bucket".to_owned(),
            "engine_state_step".to_owned()
        ])
    );
}

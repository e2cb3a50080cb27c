//! What `essim replay` writes: one row per request (`requests.csv`), the
//! summary (`summary.json`) and a short table on stdout. Times are modelled
//! seconds (wall seconds × the time scale); percentiles are essim's own
//! ([`crate::quantile`], nearest rank).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context as _;
use serde::Serialize;

use super::client::Outcome;
use crate::metrics::{mean, quantile, sorted};

/// One request as the client saw it.
#[derive(Clone, Debug)]
pub struct Row {
    /// Its index in the trace.
    pub id: usize,
    /// The session id sent (`s<N>`), if any.
    pub session: Option<String>,
    /// The URL it went to (empty when skipped).
    pub url: String,
    /// The `x-esroute-engine` response header, if any.
    pub engine: String,
    /// Sent, modelled seconds from the replay's start.
    pub sent_s: f64,
    /// Time to first token, modelled seconds (NaN: none).
    pub ttft_s: f64,
    /// Time per output token after the first, modelled seconds.
    pub tpot_s: f64,
    /// Send to the end of the stream, modelled seconds.
    pub e2e_s: f64,
    /// From `usage`.
    pub prompt_tokens: Option<u64>,
    /// From `usage`.
    pub completion_tokens: Option<u64>,
    /// How it ended.
    pub outcome: Outcome,
}

/// The CSV header of `requests.csv`.
pub const CSV_HEADER: &str = "id,session,url,engine,sent_s,ttft_s,tpot_s,e2e_s,\
prompt_tokens,completion_tokens,outcome";

fn cell(value: f64) -> String {
    if value.is_nan() {
        String::new()
    } else {
        format!("{value:.6}")
    }
}

fn count(value: Option<u64>) -> String {
    value.map_or_else(String::new, |v| v.to_string())
}

/// `requests.csv`: a header, then one row per request in trace order;
/// missing values are empty cells.
pub fn csv(rows: &[Row]) -> String {
    let mut text = String::from(CSV_HEADER);
    text.push('\n');
    for r in rows {
        let _ = writeln!(
            text,
            "{},{},{},{},{},{},{},{},{},{},{}",
            r.id,
            r.session.as_deref().unwrap_or(""),
            r.url,
            r.engine,
            cell(r.sent_s),
            cell(r.ttft_s),
            cell(r.tpot_s),
            cell(r.e2e_s),
            count(r.prompt_tokens),
            count(r.completion_tokens),
            r.outcome.name()
        );
    }
    text
}

/// p50, p90, p99 and mean of one measure over the `ok` requests (`null`
/// in JSON when there are none).
#[derive(Clone, Debug, Serialize)]
pub struct Stats {
    /// Median.
    pub p50: Option<f64>,
    /// 90th percentile.
    pub p90: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
    /// Mean.
    pub mean: Option<f64>,
}

impl Stats {
    fn of(values: Vec<f64>) -> Stats {
        let values = sorted(values.into_iter().filter(|v| !v.is_nan()).collect());
        let some = |v: f64| (!v.is_nan()).then_some(v);
        Stats {
            p50: some(quantile(&values, 0.5)),
            p90: some(quantile(&values, 0.9)),
            p99: some(quantile(&values, 0.99)),
            mean: some(mean(&values)),
        }
    }
}

/// `summary.json`.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// The trace's name.
    pub trace: String,
    /// Requests in the trace.
    pub requests: usize,
    /// Requests per outcome (`ok`, `http_<code>`, `error`, `timeout`, `skipped`).
    pub outcomes: BTreeMap<String, usize>,
    /// TTFT over the `ok` requests, modelled seconds.
    pub ttft_s: Stats,
    /// TPOT over the `ok` requests with ≥ 2 tokens, modelled seconds.
    pub tpot_s: Stats,
    /// E2E over the `ok` requests, modelled seconds.
    pub e2e_s: Stats,
    /// Wall seconds from the replay's start (trace time 0) to the last response.
    pub wall_s: f64,
    /// Arrivals were sent this many times denser than the trace's (after
    /// `--rate-scale`); every time above is wall time × this factor.
    pub time_scale: f64,
    /// The URLs, in round-robin order.
    pub urls: Vec<String>,
}

impl Summary {
    /// Reduce the rows.
    pub fn of(trace: &str, rows: &[Row], wall_s: f64, time_scale: f64, urls: &[String]) -> Summary {
        let mut outcomes: BTreeMap<String, usize> = ["ok", "error", "timeout", "skipped"]
            .into_iter()
            .map(|k| (k.to_owned(), 0))
            .collect();
        for r in rows {
            *outcomes.entry(r.outcome.name()).or_default() += 1;
        }
        let ok: Vec<&Row> = rows.iter().filter(|r| r.outcome == Outcome::Ok).collect();
        Summary {
            trace: trace.to_owned(),
            requests: rows.len(),
            outcomes,
            ttft_s: Stats::of(ok.iter().map(|r| r.ttft_s).collect()),
            tpot_s: Stats::of(ok.iter().map(|r| r.tpot_s).collect()),
            e2e_s: Stats::of(ok.iter().map(|r| r.e2e_s).collect()),
            wall_s,
            time_scale,
            urls: urls.to_vec(),
        }
    }

    /// The table printed on stdout.
    pub fn table(&self) -> String {
        let num = |v: Option<f64>, scale: f64| {
            v.map_or("–".to_owned(), |v| format!("{:.3}", v * scale))
        };
        let mut text = format!(
            "{}: {} requests in {:.1} s wall (time scale {}), {}\n\n",
            self.trace,
            self.requests,
            self.wall_s,
            self.time_scale,
            self.outcomes
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        text.push_str("| modelled | p50 | p90 | p99 | mean |\n|---|---:|---:|---:|---:|\n");
        for (name, stats, scale) in [
            ("TTFT s", &self.ttft_s, 1.0),
            ("TPOT ms", &self.tpot_s, 1e3),
            ("E2E s", &self.e2e_s, 1.0),
        ] {
            let _ = writeln!(
                text,
                "| {name} | {} | {} | {} | {} |",
                num(stats.p50, scale),
                num(stats.p90, scale),
                num(stats.p99, scale),
                num(stats.mean, scale)
            );
        }
        text
    }
}

/// Write `requests.csv` and `summary.json` into `dir` (made if missing).
pub fn write(dir: &Path, rows: &[Row], summary: &Summary) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join("requests.csv");
    std::fs::write(&path, csv(rows)).with_context(|| format!("writing {}", path.display()))?;
    let path = dir.join("summary.json");
    let json = serde_json::to_string_pretty(summary)? + "\n";
    std::fs::write(&path, json).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: usize, outcome: Outcome, ttft_s: f64) -> Row {
        Row {
            id,
            session: Some("s1".into()),
            url: "http://127.0.0.1:1".into(),
            engine: String::new(),
            sent_s: 0.5,
            ttft_s,
            tpot_s: f64::NAN,
            e2e_s: ttft_s * 2.0,
            prompt_tokens: Some(10),
            completion_tokens: None,
            outcome,
        }
    }

    #[test]
    fn rows_and_summary_count_every_outcome_and_use_essims_quantiles() {
        let rows = vec![
            row(0, Outcome::Ok, 1.0),
            row(1, Outcome::Ok, 3.0),
            row(2, Outcome::Http(503), f64::NAN),
            row(3, Outcome::Skipped, f64::NAN),
        ];
        let text = csv(&rows);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5);
        assert_eq!(lines[0], CSV_HEADER);
        assert_eq!(
            lines[1],
            "0,s1,http://127.0.0.1:1,,0.500000,1.000000,,2.000000,10,,ok"
        );
        assert!(lines[3].ends_with(",http_503"));
        let summary = Summary::of("t", &rows, 2.0, 4.0, &["u".into()]);
        assert_eq!(summary.outcomes["ok"], 2);
        assert_eq!(summary.outcomes["http_503"], 1);
        assert_eq!(summary.outcomes["skipped"], 1);
        assert_eq!(summary.outcomes["timeout"], 0);
        assert_eq!(summary.ttft_s.p50, Some(1.0));
        assert_eq!(summary.ttft_s.p99, Some(3.0));
        assert_eq!(summary.ttft_s.mean, Some(2.0));
        assert_eq!(summary.tpot_s.p50, None);
        assert!(summary
            .table()
            .contains("| TTFT s | 1.000 | 3.000 | 3.000 | 2.000 |"));
    }
}

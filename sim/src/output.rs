//! Reports: a markdown table for stdout, CSV and JSON files.

use std::fmt::Write as _;
use std::path::Path;

use crate::error::SimError;
use crate::metrics::Summary;
use crate::plots;
use crate::sweep::Outcome;

fn num(value: f64, decimals: usize) -> String {
    if value.is_nan() {
        "–".to_owned()
    } else {
        format!("{value:.decimals$}")
    }
}

/// A markdown table, one row per configuration.
pub fn markdown(rows: &[Summary]) -> String {
    let mut out = String::from(
        "| config | TTFT p50 s | p90 s | p99 s | mean s | TPOT p50 ms | p90 ms | E2E p50 s | p90 s \
         | tok/s | prefix hit | preempt | migr | req/engine max/med | engines/session \
         | real used | real changed | real age p50/p99 ms |\n",
    );
    out.push_str(
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {}% | {} | {} | {}/{} | {} | {}% | {}% | {}/{} |",
            r.config,
            num(r.ttft_p50_s, 2),
            num(r.ttft_p90_s, 2),
            num(r.ttft_p99_s, 2),
            num(r.ttft_mean_s, 2),
            num(r.tpot_p50_ms, 1),
            num(r.tpot_p90_ms, 1),
            num(r.e2e_p50_s, 2),
            num(r.e2e_p90_s, 2),
            num(r.throughput_tok_s, 0),
            num(100.0 * r.prefix_hit_rate, 1),
            r.preemptions,
            r.migrations,
            r.requests_per_engine_max,
            num(r.requests_per_engine_median, 0),
            num(r.engines_per_session_mean, 2),
            num(100.0 * r.decisions_consulting_real, 0),
            num(100.0 * r.decisions_real_changed, 1),
            num(r.real_state_age_p50_ms, 0),
            num(r.real_state_age_p99_ms, 0),
        );
    }
    out
}

/// The summaries as CSV (header = the JSON field names).
pub fn csv(rows: &[Summary]) -> String {
    let mut out = String::new();
    let values: Vec<serde_json::Map<String, serde_json::Value>> = rows
        .iter()
        .map(|r| match serde_json::to_value(r) {
            Ok(serde_json::Value::Object(map)) => map,
            _ => unreachable!("Summary serializes to an object"),
        })
        .collect();
    let Some(first) = values.first() else {
        return out;
    };
    out.push_str(&first.keys().cloned().collect::<Vec<_>>().join(","));
    out.push('\n');
    for map in &values {
        let cells: Vec<String> = map
            .values()
            .map(|v| match v {
                serde_json::Value::String(s) if s.contains(',') => format!("\"{s}\""),
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Null => String::new(),
                other => other.to_string(),
            })
            .collect();
        out.push_str(&cells.join(","));
        out.push('\n');
    }
    out
}

/// Write `summary.csv` and `summary.json` into `dir` (created if missing).
pub fn write_files(dir: &Path, rows: &[Summary]) -> Result<(), SimError> {
    std::fs::create_dir_all(dir).map_err(|e| SimError::io(dir, e))?;
    let json = serde_json::to_string_pretty(rows).expect("summaries serialize");
    for (name, text) in [("summary.csv", csv(rows)), ("summary.json", json)] {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| SimError::io(&path, e))?;
    }
    Ok(())
}

/// Write a run's or a sweep's files into `dir`: `summary.csv`,
/// `summary.json`, and SVG plots. A sweep (`by_group`) gets, per (rate,
/// replicas), TTFT p90 against feed period and a TTFT CDF of its no-feed and
/// 50 ms configurations (every configuration would be unreadable); a run gets
/// one TTFT CDF of all its configurations and each one's engine load.
pub fn write_report(dir: &Path, outcomes: &[Outcome], by_group: bool) -> Result<(), SimError> {
    let rows: Vec<Summary> = outcomes.iter().map(|o| o.summary.clone()).collect();
    write_files(dir, &rows)?;
    if !by_group {
        let series: Vec<(String, Vec<f64>)> = outcomes
            .iter()
            .map(|o| (o.summary.config.clone(), o.ttft_s.clone()))
            .collect();
        plots::ttft_cdf(&dir.join("ttft_cdf.svg"), &series)?;
        for (i, outcome) in outcomes.iter().enumerate() {
            plots::engine_load(
                &dir.join(format!("engine_load_{i}.svg")),
                &format!("requests per engine: {}", outcome.summary.config),
                &outcome.engine_load,
            )?;
        }
        return Ok(());
    }
    let mut groups: Vec<(f64, usize)> = rows.iter().map(|r| (r.rate_scale, r.routers)).collect();
    groups.dedup();
    for (rate, routers) in groups {
        let group: Vec<&Outcome> = outcomes
            .iter()
            .filter(|o| o.summary.rate_scale == rate && o.summary.routers == routers)
            .collect();
        let summaries: Vec<Summary> = group.iter().map(|o| o.summary.clone()).collect();
        let tag = format!("{rate}x_r{routers}");
        plots::p90_vs_period(
            &dir.join(format!("ttft_p90_vs_period_{tag}.svg")),
            &format!("TTFT p90 vs feed period ({rate}× rate, {routers} router(s))"),
            &summaries,
        )?;
        let series: Vec<(String, Vec<f64>)> = group
            .iter()
            .filter(|o| matches!(o.summary.feed.as_str(), "none" | "periodic:50"))
            .map(|o| (o.summary.config.clone(), o.ttft_s.clone()))
            .collect();
        plots::ttft_cdf(&dir.join(format!("ttft_cdf_{tag}.svg")), &series)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agentic::AgenticSpec;
    use crate::driver::{simulate, RunConfig};
    use crate::metrics::ttft_seconds;

    #[test]
    fn reports_render_and_write_with_plots() {
        let trace = AgenticSpec {
            sessions: 6,
            ..AgenticSpec::default()
        }
        .generate();
        let config = RunConfig {
            engines: 2,
            ..RunConfig::default()
        };
        let result = simulate(&trace, &config).unwrap();
        let rows = vec![Summary::of(&config, &result)];
        let table = markdown(&rows);
        assert_eq!(table.lines().count(), 3);
        assert!(table.contains("| unified/always/none/r1 |"), "{table}");
        let text = csv(&rows);
        let header: Vec<&str> = text.lines().next().unwrap().split(',').collect();
        assert!(header.contains(&"ttft_p90_s") && header.contains(&"feed"));
        assert_eq!(text.lines().count(), 2);
        let dir = tempfile::tempdir().unwrap();
        write_files(dir.path(), &rows).unwrap();
        let series = vec![("a".to_owned(), ttft_seconds(&result))];
        plots::ttft_cdf(&dir.path().join("cdf.svg"), &series).unwrap();
        plots::p90_vs_period(&dir.path().join("p90.svg"), "t", &rows).unwrap();
        plots::engine_load(&dir.path().join("load.svg"), "t", &result.engine_load).unwrap();
        for name in ["summary.csv", "summary.json", "cdf.svg", "load.svg"] {
            assert!(
                dir.path().join(name).metadata().unwrap().len() > 100,
                "{name}"
            );
        }
    }
}

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

/// The feed a sweep's CDFs and by-rate ratio plot show beside no feed.
pub const HEADLINE_FEED: &str = "periodic:50";

/// Read [`csv`]'s text back (a column the header lacks, or an empty cell,
/// takes [`Summary::default`]'s value; an unknown column is ignored).
pub fn read_csv(text: &str) -> Result<Vec<Summary>, SimError> {
    let bad = |line: usize, what: String| {
        SimError::Config(format!(
            "summary CSV line {line}: {what} (expected the summary.csv that essim run/sweep --out writes)"
        ))
    };
    let template = match serde_json::to_value(Summary::default()) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => unreachable!("Summary serializes to an object"),
    };
    let mut lines = text.lines().enumerate();
    let Some((_, header)) = lines.next() else {
        return Ok(Vec::new());
    };
    let header: Vec<&str> = header.split(',').collect();
    let mut rows = Vec::new();
    for (index, line) in lines.filter(|(_, l)| !l.is_empty()) {
        let cells = split_csv_line(line);
        if cells.len() != header.len() {
            return Err(bad(
                index + 1,
                format!("{} cells for {} columns", cells.len(), header.len()),
            ));
        }
        let mut map = serde_json::Map::new();
        for (&name, cell) in header.iter().zip(cells) {
            let value = match template.get(name) {
                None => continue,
                Some(_) if cell.is_empty() => continue,
                Some(serde_json::Value::String(_)) => serde_json::Value::String(cell),
                // Integers as integers; floats through Rust's own (exact)
                // parser, so that a row reads back bit for bit.
                Some(serde_json::Value::Number(n)) if n.is_u64() => cell
                    .parse::<u64>()
                    .map(serde_json::Value::from)
                    .map_err(|_| {
                        bad(index + 1, format!("column {name}: {cell:?} is not a count"))
                    })?,
                Some(_) => cell
                    .parse::<f64>()
                    .map(serde_json::Value::from)
                    .map_err(|_| {
                        bad(
                            index + 1,
                            format!("column {name}: {cell:?} is not a number"),
                        )
                    })?,
            };
            map.insert(name.to_owned(), value);
        }
        rows.push(
            serde_json::from_value(serde_json::Value::Object(map))
                .map_err(|e| bad(index + 1, e.to_string()))?,
        );
    }
    Ok(rows)
}

/// One CSV line's cells; a cell in double quotes may hold commas.
fn split_csv_line(line: &str) -> Vec<String> {
    let mut cells = vec![String::new()];
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => cells.push(String::new()),
            c => cells.last_mut().expect("one cell at least").push(c),
        }
    }
    cells
}

/// `(rate, routers)` groups in first-appearance order.
fn groups(rows: &[Summary]) -> Vec<(f64, usize)> {
    let mut groups: Vec<(f64, usize)> = Vec::new();
    for r in rows {
        if !groups.contains(&(r.rate_scale, r.routers)) {
            groups.push((r.rate_scale, r.routers));
        }
    }
    groups
}

/// The plots that need only summary rows, into `dir`: per (rate, routers),
/// `ttft_p90_vs_period_<rate>x_r<routers>.svg`; where the rows have 1 router
/// and R > 1 replicas, per rate `ttft_p90_ratio_r<R>_<rate>x.svg` (against
/// feed period), and over several rates `ttft_p90_ratio_r<R>_by_rate.svg`
/// (no feed and [`HEADLINE_FEED`]). `seeds` holds one sweep's rows per seed:
/// the ratios are medians over them, the p90 plots are drawn from a single
/// seed only. Returns the files written.
pub fn write_summary_plots(
    dir: &Path,
    seeds: &[Vec<Summary>],
) -> Result<Vec<std::path::PathBuf>, SimError> {
    std::fs::create_dir_all(dir).map_err(|e| SimError::io(dir, e))?;
    let mut written = Vec::new();
    let Some(rows) = seeds.first() else {
        return Ok(written);
    };
    let seeded = match seeds.len() {
        1 => String::new(),
        n => format!(", median of {n} seeds"),
    };
    if seeds.len() == 1 {
        for (rate, routers) in groups(rows) {
            let group: Vec<Summary> = rows
                .iter()
                .filter(|r| r.rate_scale == rate && r.routers == routers)
                .cloned()
                .collect();
            let path = dir.join(format!("ttft_p90_vs_period_{rate}x_r{routers}.svg"));
            plots::p90_vs_period(
                &path,
                &format!("TTFT p90 vs feed period ({rate}× rate, {routers} router(s))"),
                &group,
            )?;
            written.push(path);
        }
    }
    let mut rates: Vec<f64> = Vec::new();
    let mut replicas: Vec<usize> = Vec::new();
    for (rate, routers) in groups(rows) {
        if !rates.contains(&rate) {
            rates.push(rate);
        }
        if routers > 1 && !replicas.contains(&routers) {
            replicas.push(routers);
        }
    }
    if !rows.iter().any(|r| r.routers == 1) {
        return Ok(written);
    }
    for &r in &replicas {
        for &rate in &rates {
            let of_rate: Vec<Vec<Summary>> = seeds
                .iter()
                .map(|rows| {
                    rows.iter()
                        .filter(|s| s.rate_scale == rate)
                        .cloned()
                        .collect()
                })
                .collect();
            let path = dir.join(format!("ttft_p90_ratio_r{r}_{rate}x.svg"));
            plots::replica_ratio(
                &path,
                &format!("TTFT p90, {r} replicas / 1 router ({rate}× rate{seeded})"),
                r,
                plots::RatioAxis::FeedPeriod,
                &of_rate,
            )?;
            written.push(path);
        }
        if rates.len() > 1 {
            let headline: Vec<Vec<Summary>> = seeds
                .iter()
                .map(|rows| {
                    rows.iter()
                        .filter(|s| s.feed == "none" || s.feed == HEADLINE_FEED)
                        .cloned()
                        .collect()
                })
                .collect();
            let path = dir.join(format!("ttft_p90_ratio_r{r}_by_rate.svg"));
            plots::replica_ratio(
                &path,
                &format!("TTFT p90, {r} replicas / 1 router, by rate{seeded}"),
                r,
                plots::RatioAxis::Rate,
                &headline,
            )?;
            written.push(path);
        }
    }
    Ok(written)
}

fn cdf_series<'a>(outcomes: &[&'a Outcome]) -> Vec<(&'a Summary, &'a [f64])> {
    outcomes
        .iter()
        .map(|o| (&o.summary, o.ttft_s.as_slice()))
        .collect()
}

/// Write a run's or a sweep's files into `dir`: `summary.csv`,
/// `summary.json`, and SVG plots. A sweep (`by_group`) gets
/// [`write_summary_plots`]' and, per (rate, replicas), a TTFT CDF of its
/// no-feed and [`HEADLINE_FEED`] configurations (every configuration would be
/// unreadable); a run gets one TTFT CDF of all its configurations and each
/// one's engine load.
pub fn write_report(dir: &Path, outcomes: &[Outcome], by_group: bool) -> Result<(), SimError> {
    let rows: Vec<Summary> = outcomes.iter().map(|o| o.summary.clone()).collect();
    write_files(dir, &rows)?;
    if !by_group {
        let all: Vec<&Outcome> = outcomes.iter().collect();
        plots::ttft_cdf(&dir.join("ttft_cdf.svg"), "TTFT CDF", &cdf_series(&all))?;
        for (i, outcome) in outcomes.iter().enumerate() {
            plots::engine_load(
                &dir.join(format!("engine_load_{i}.svg")),
                &format!("requests per engine: {}", outcome.summary.config),
                &outcome.engine_load,
            )?;
        }
        return Ok(());
    }
    write_summary_plots(dir, std::slice::from_ref(&rows))?;
    for (rate, routers) in groups(&rows) {
        let group: Vec<&Outcome> = outcomes
            .iter()
            .filter(|o| o.summary.rate_scale == rate && o.summary.routers == routers)
            .filter(|o| o.summary.feed == "none" || o.summary.feed == HEADLINE_FEED)
            .collect();
        plots::ttft_cdf(
            &dir.join(format!("ttft_cdf_{rate}x_r{routers}.svg")),
            &format!("TTFT CDF, no feed and {HEADLINE_FEED} ({rate}× rate, {routers} router(s))"),
            &cdf_series(&group),
        )?;
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
        // The CSV reads back to the same rows (NaN cells: NaN again).
        let back = read_csv(&text).unwrap();
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].config, rows[0].config);
        assert_eq!(back[0].ttft_p90_s, rows[0].ttft_p90_s);
        assert_eq!(csv(&back), text);
        let dir = tempfile::tempdir().unwrap();
        write_files(dir.path(), &rows).unwrap();
        let ttft = ttft_seconds(&result);
        plots::ttft_cdf(&dir.path().join("cdf.svg"), "t", &[(&rows[0], &ttft)]).unwrap();
        plots::p90_vs_period(&dir.path().join("p90.svg"), "t", &rows).unwrap();
        plots::engine_load(&dir.path().join("load.svg"), "t", &result.engine_load).unwrap();
        for name in ["summary.csv", "summary.json", "cdf.svg", "load.svg"] {
            assert!(
                dir.path().join(name).metadata().unwrap().len() > 100,
                "{name}"
            );
        }
    }

    #[test]
    fn a_csv_reads_back_despite_missing_and_unknown_columns() {
        let text = "config,policy,feed,ttft_p90_s,real_state_age_p50_ms,routers,future\n\
                    \"unified(1.3,0.01)/never/none/r4\",\"unified(1.3,0.01)\",none,4.5,,4,x\n";
        let rows = read_csv(text).unwrap();
        assert_eq!(rows[0].policy, "unified(1.3,0.01)");
        assert_eq!(rows[0].routers, 4);
        assert_eq!(rows[0].ttft_p90_s, 4.5);
        assert!(rows[0].real_state_age_p50_ms.is_nan());
        assert_eq!(rows[0].cache_knowledge, "", "a column from before it");
        assert_eq!(rows[0].share_delay_ms, None, "a column from before it");
        let shared = Summary {
            share_delay_ms: Some(10.0),
            ..rows[0].clone()
        };
        let text = csv(&[rows[0].clone(), shared]);
        let back = read_csv(&text).unwrap();
        assert_eq!(
            (back[0].share_delay_ms, back[1].share_delay_ms),
            (None, Some(10.0))
        );
        assert_eq!(rows[0].rate_scale, 1.0);
        let err = read_csv("config,ttft_p90_s\na,fast\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("line 2") && err.contains("ttft_p90_s"),
            "{err}"
        );
        let err = read_csv("config,ttft_p90_s\na\n").unwrap_err().to_string();
        assert!(err.contains("1 cells for 2 columns"), "{err}");
    }
}

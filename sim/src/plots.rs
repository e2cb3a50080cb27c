//! SVG plots (plotters, SVG backend only): TTFT CDF per configuration, TTFT
//! p90 against feed period per policy and real-state use, and per-engine load
//! over time.

use std::collections::BTreeMap;
use std::path::Path;

use plotters::prelude::*;

use crate::error::SimError;
use crate::metrics::Summary;

fn plot_error(path: &Path, e: impl std::fmt::Display) -> SimError {
    SimError::io(path, std::io::Error::other(e.to_string()))
}

/// A TTFT CDF with one line per `(label, sorted TTFT seconds)`; x is log-scaled.
pub fn ttft_cdf(path: &Path, series: &[(String, Vec<f64>)]) -> Result<(), SimError> {
    let max = series
        .iter()
        .filter_map(|(_, v)| v.last().copied())
        .fold(1.0f64, f64::max);
    let min = series
        .iter()
        .filter_map(|(_, v)| v.first().copied())
        .fold(max, f64::min)
        .max(1e-3);
    let root = SVGBackend::new(path, (1000, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_error(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption("TTFT CDF", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d((min..max * 1.05).log_scale(), 0.0..1.0)
        .map_err(|e| plot_error(path, e))?;
    chart
        .configure_mesh()
        .x_desc("TTFT (s, log)")
        .y_desc("fraction of requests")
        .draw()
        .map_err(|e| plot_error(path, e))?;
    for (i, (label, values)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let n = values.len().max(1) as f64;
        // At most ~400 points per line keeps the SVG small.
        let stride = (values.len() / 400).max(1);
        let points = values
            .iter()
            .enumerate()
            .filter(|(k, _)| k % stride == 0 || k + 1 == values.len())
            .map(|(k, &v)| (v.max(min), (k + 1) as f64 / n));
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(|e| plot_error(path, e))?
            .label(label.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(|e| plot_error(path, e))?;
    root.present().map_err(|e| plot_error(path, e))
}

/// TTFT p90 against feed period (log x), one line per policy/real-state use
/// of `rows` with a periodic feed; `never` (no feed) drawn flat across.
pub fn p90_vs_period(path: &Path, title: &str, rows: &[Summary]) -> Result<(), SimError> {
    let mut lines: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let periods: Vec<f64> = rows
        .iter()
        .filter(|r| r.feed.starts_with("periodic"))
        .map(|r| r.feed_period_ms)
        .collect();
    let (lo, hi) = periods
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &p| (lo.min(p), hi.max(p)));
    if periods.is_empty() {
        return Ok(());
    }
    for r in rows {
        if r.feed.starts_with("periodic") {
            lines
                .entry(format!("{}/{}", r.policy, r.real_state_use))
                .or_default()
                .push((r.feed_period_ms, r.ttft_p90_s));
        } else if r.feed == "none" {
            lines
                .entry(format!("{}/never", r.policy))
                .or_default()
                .extend([(lo, r.ttft_p90_s), (hi, r.ttft_p90_s)]);
        }
    }
    let y_max = lines
        .values()
        .flatten()
        .map(|p| p.1)
        .filter(|y| y.is_finite())
        .fold(0.1f64, f64::max);
    let root = SVGBackend::new(path, (1000, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_error(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d((lo..hi * 1.2).log_scale(), 0.0..y_max * 1.1)
        .map_err(|e| plot_error(path, e))?;
    chart
        .configure_mesh()
        .x_desc("feed period (ms, log)")
        .y_desc("TTFT p90 (s)")
        .draw()
        .map_err(|e| plot_error(path, e))?;
    for (i, (label, mut points)) in lines.into_iter().enumerate() {
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(|e| plot_error(path, e))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| plot_error(path, e))?;
    root.present().map_err(|e| plot_error(path, e))
}

/// Requests in each engine over time, one line per engine.
pub fn engine_load(path: &Path, title: &str, samples: &[(u64, Vec<u32>)]) -> Result<(), SimError> {
    let engines = samples.first().map_or(0, |(_, load)| load.len());
    let t_max = samples
        .last()
        .map_or(1.0, |(t, _)| *t as f64 / 1e9)
        .max(1.0);
    let y_max = samples
        .iter()
        .flat_map(|(_, load)| load.iter().copied())
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let root = SVGBackend::new(path, (1000, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_error(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..t_max, 0.0..y_max * 1.05)
        .map_err(|e| plot_error(path, e))?;
    chart
        .configure_mesh()
        .x_desc("simulated time (s)")
        .y_desc("requests in engine")
        .draw()
        .map_err(|e| plot_error(path, e))?;
    for engine in 0..engines {
        let color = Palette99::pick(engine).to_rgba();
        let points = samples
            .iter()
            .map(|(t, load)| (*t as f64 / 1e9, f64::from(load[engine])));
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(1)))
            .map_err(|e| plot_error(path, e))?
            .label(format!("e{engine}"))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| plot_error(path, e))?;
    root.present().map_err(|e| plot_error(path, e))
}

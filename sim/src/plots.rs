//! SVG plots (plotters, SVG backend only): TTFT CDF, TTFT p90 against feed
//! period, TTFT p90 of router replicas over one router, each as small
//! multiples (one panel per policy, one shared legend beside the panels), and
//! per-engine load over time.
//!
//! Readability rules, kept by [`small_multiples`]: a fixed categorical
//! palette without pale colours (Okabe–Ito without its yellow; black is the
//! no-feed baseline, dashed), a marker shape per series besides its colour,
//! series nudged apart on the x axis where several share a point (so equal
//! values do not hide each other), and the legend outside the data.

use std::collections::BTreeMap;
use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::error::SimError;
use crate::metrics::{quantile, Summary};

/// Okabe–Ito's colour-blind-safe categorical palette without its yellow
/// (too pale on white) and black (the baseline's).
const PALETTE: [RGBColor; 6] = [
    RGBColor(0x00, 0x72, 0xB2), // blue
    RGBColor(0xD5, 0x5E, 0x00), // vermillion
    RGBColor(0x00, 0x9E, 0x73), // bluish green
    RGBColor(0xCC, 0x79, 0xA7), // reddish purple
    RGBColor(0xE6, 0x9F, 0x00), // orange
    RGBColor(0x56, 0xB4, 0xE9), // sky blue
];
/// The no-feed baseline: black, dashed, no markers.
const BASELINE: RGBColor = RGBColor(0, 0, 0);
/// Marker shapes; a cycle length prime to the palette's, so colour and shape
/// together tell 30 series apart.
const SHAPES: usize = 5;
/// Neighbouring series sharing an x are drawn this factor apart (log x).
const DODGE: f64 = 1.045;
const PANEL: (u32, u32) = (430, 300);
const LEGEND_WIDTH: u32 = 270;
const TITLE_HEIGHT: u32 = 40;
/// The TTFT fractions marked on each CDF line.
const CDF_MARKS: [f64; 4] = [0.25, 0.5, 0.75, 0.9];
/// How a label names a delivery delay (`…, delay 5 ms`).
const DELAY_PREFIX: &str = "delay ";
/// How a label names shared reservations' delay (`…, shared 10 ms`).
const SHARE_PREFIX: &str = "shared ";
/// The label part of replicas that do not share their reservations, where
/// others in the same chart do.
const UNSHARED: &str = "unshared";
/// The label of the no-feed baseline.
pub const NO_FEED: &str = "no feed";

fn plot_error(path: &Path, e: impl std::fmt::Display) -> SimError {
    SimError::io(path, std::io::Error::other(e.to_string()))
}

/// How a line is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Solid, with markers.
    Series,
    /// The no-feed baseline: dashed black, no markers.
    Baseline,
    /// Markers only (a configuration off the line's axis: scraped metrics).
    Points,
}

/// One line of a small-multiples chart.
#[derive(Clone, Debug)]
struct Line {
    panel: String,
    label: String,
    kind: Kind,
    points: Vec<(f64, f64)>,
    /// Where markers go (every point, or a CDF's marked fractions).
    marks: Vec<(f64, f64)>,
    /// Vertical whiskers `(x, low, high)` (the spread over seeds).
    whiskers: Vec<(f64, f64, f64)>,
}

impl Line {
    fn new(panel: &str, label: &str, kind: Kind, points: Vec<(f64, f64)>) -> Line {
        let marks = if kind == Kind::Baseline {
            Vec::new()
        } else {
            points.clone()
        };
        Line {
            panel: panel.to_owned(),
            label: label.to_owned(),
            kind,
            points,
            marks,
            whiskers: Vec::new(),
        }
    }
}

/// A chart's axes and title.
struct Frame<'a> {
    title: &'a str,
    x_desc: &'a str,
    y_desc: &'a str,
    /// A fixed y range for every panel; otherwise each panel's own `0..max`.
    y_fixed: Option<(f64, f64)>,
    /// A thin grey horizontal reference line (ratio 1).
    reference_y: Option<f64>,
    /// Nudge series apart on x.
    dodge: bool,
}

/// A label's colour and marker; baselines are black.
#[derive(Clone, Copy)]
struct Style {
    color: RGBColor,
    shape: usize,
    kind: Kind,
}

/// A marker's outline in pixels around its point: a circle (12-gon),
/// triangle, square, diamond, or downward triangle.
fn shape_outline(shape: usize) -> Vec<(i32, i32)> {
    match shape % SHAPES {
        0 => (0..12)
            .map(|k| {
                let a = f64::from(k) * std::f64::consts::PI / 6.0;
                (
                    (4.5 * a.cos()).round() as i32,
                    (4.5 * a.sin()).round() as i32,
                )
            })
            .collect(),
        1 => vec![(0, -6), (5, 3), (-5, 3)],
        2 => vec![(-4, -4), (4, -4), (4, 4), (-4, 4)],
        3 => vec![(0, -6), (5, 0), (0, 6), (-5, 0)],
        _ => vec![(0, 6), (5, -3), (-5, -3)],
    }
}

/// A filled marker of `shape` at `at` (a macro: plotters' composed element
/// type cannot be named outside the crate).
macro_rules! marker {
    ($at:expr, $shape:expr, $color:expr) => {
        EmptyElement::at($at) + Polygon::new(shape_outline($shape), $color.filled())
    };
}

/// Distinct values in first-appearance order.
fn distinct<'a>(values: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for v in values {
        if !out.iter().any(|o| o == v) {
            out.push(v.to_owned());
        }
    }
    out
}

/// A tick label without a needless fraction: 10, 2.5, 0.25.
fn tick(value: f64) -> String {
    let text = format!("{value:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// The x ticks of a log axis over `lo..=hi`: its 1-2-5 values, or its
/// decades alone where those would be more than 8.
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let mut ticks = Vec::new();
    let mut decade = 10f64.powf(lo.log10().floor());
    while decade <= hi {
        for m in [1.0, 2.0, 5.0] {
            let t = m * decade;
            if t >= lo / 1.0001 && t <= hi * 1.0001 {
                ticks.push(t);
            }
        }
        decade *= 10.0;
    }
    if ticks.len() > 8 {
        ticks.retain(|&t| (t.log10() - t.log10().round()).abs() < 1e-9);
    }
    ticks
}

/// The nearest 1-2-5 value strictly below (`up` false) or above `value`.
fn nice_bound(value: f64, up: bool) -> f64 {
    let decade = 10f64.powf(value.log10().floor());
    let candidates = [0.5, 1.0, 2.0, 5.0, 10.0, 20.0].map(|m| m * decade);
    if up {
        candidates.into_iter().find(|&c| c > value * 1.0001)
    } else {
        candidates.into_iter().rev().find(|&c| c < value / 1.0001)
    }
    .unwrap_or(value)
}

/// A log range around `values` from a 1-2-5 value below the least to one
/// above the greatest (at least 10 % of room each side).
fn padded_log_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| v.is_finite() && *v > 0.0)
        .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi {
        return (0.1, 10.0);
    }
    (nice_bound(lo / 1.1, false), nice_bound(hi * 1.1, true))
}

/// Each label's style. Baselines are black; the others take a palette colour
/// per label and a marker shape per label, except that labels ending in a
/// delivery delay (`…, delay N ms`) or a sharing of reservations (`…,
/// shared N ms`, `…, unshared`) share the colour of the rest of the label
/// and take their shape from that last part: one colour per knowledge and
/// use, one shape per delay.
fn styles(labels: &[String], lines: &[Line]) -> BTreeMap<String, Style> {
    let split = |label: &str| -> (String, Option<String>) {
        match label.rsplit_once(", ") {
            Some((rest, delay))
                if delay.starts_with(DELAY_PREFIX)
                    || delay.starts_with(SHARE_PREFIX)
                    || delay == UNSHARED =>
            {
                (rest.to_owned(), Some(delay.to_owned()))
            }
            _ => (label.to_owned(), None),
        }
    };
    let mut colours: Vec<String> = Vec::new();
    let mut delays: Vec<String> = Vec::new();
    let mut styles = BTreeMap::new();
    for label in labels {
        let kind = lines
            .iter()
            .find(|l| &l.label == label)
            .map_or(Kind::Series, |l| l.kind);
        if kind == Kind::Baseline {
            let color = BASELINE;
            styles.insert(
                label.clone(),
                Style {
                    color,
                    shape: 0,
                    kind,
                },
            );
            continue;
        }
        let (colour_key, delay) = split(label);
        let c = colours
            .iter()
            .position(|k| *k == colour_key)
            .unwrap_or_else(|| {
                colours.push(colour_key);
                colours.len() - 1
            });
        let shape = match delay {
            Some(delay) => delays.iter().position(|d| *d == delay).unwrap_or_else(|| {
                delays.push(delay);
                delays.len() - 1
            }),
            None => c,
        };
        let color = PALETTE[c % PALETTE.len()];
        styles.insert(label.clone(), Style { color, shape, kind });
    }
    styles
}

/// Nudge each panel's marked series apart on x (log axis), centred on the
/// true value, so that series of equal value stay visible side by side.
fn dodge(lines: &mut [Line]) {
    let panels = distinct(lines.iter().map(|l| l.panel.as_str()));
    for panel in &panels {
        let dodged: Vec<usize> = (0..lines.len())
            .filter(|&i| &lines[i].panel == panel && lines[i].kind != Kind::Baseline)
            .collect();
        let mid = (dodged.len() as f64 - 1.0) / 2.0;
        for (k, &i) in dodged.iter().enumerate() {
            let factor = DODGE.powf(k as f64 - mid);
            let line = &mut lines[i];
            for p in line.points.iter_mut().chain(line.marks.iter_mut()) {
                p.0 *= factor;
            }
            for w in &mut line.whiskers {
                w.0 *= factor;
            }
        }
    }
}

/// One panel per distinct `panel` (in first-appearance order, up to 3 a row),
/// a legend of every label on the right.
fn small_multiples(path: &Path, frame: &Frame, mut lines: Vec<Line>) -> Result<(), SimError> {
    let err = |e: DrawingAreaErrorKind<_>| plot_error(path, e);
    let panels = distinct(lines.iter().map(|l| l.panel.as_str()));
    let labels = distinct(lines.iter().map(|l| l.label.as_str()));
    let styles = styles(&labels, &lines);
    if frame.dodge {
        dodge(&mut lines);
    }
    let (x_lo, x_hi) = padded_log_range(
        lines
            .iter()
            .flat_map(|l| l.points.iter().chain(&l.marks).map(|p| p.0)),
    );
    let cols = panels.len().clamp(1, 3);
    let rows = panels.len().div_ceil(cols).max(1);
    let size = (
        PANEL.0 * cols as u32 + LEGEND_WIDTH,
        TITLE_HEIGHT + PANEL.1 * rows as u32,
    );
    let root = SVGBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (main, legend) = root.split_horizontally(PANEL.0 * cols as u32);
    let main = main.titled(frame.title, ("sans-serif", 22)).map_err(err)?;
    let areas = main.split_evenly((rows, cols));
    for (panel, area) in panels.iter().zip(&areas) {
        let in_panel: Vec<&Line> = lines.iter().filter(|l| &l.panel == panel).collect();
        let (y_lo, y_hi) = frame.y_fixed.unwrap_or_else(|| {
            let max = in_panel
                .iter()
                .flat_map(|l| {
                    l.points
                        .iter()
                        .map(|p| p.1)
                        .chain(l.whiskers.iter().map(|w| w.2))
                })
                .chain(frame.reference_y)
                .filter(|y| y.is_finite())
                .fold(0.0f64, f64::max);
            (0.0, if max > 0.0 { max * 1.1 } else { 1.0 })
        });
        let mut chart = ChartBuilder::on(area)
            .caption(panel, ("sans-serif", 17))
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(52)
            .build_cartesian_2d((x_lo..x_hi).log_scale(), y_lo..y_hi)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc(frame.x_desc)
            .y_desc(frame.y_desc)
            .light_line_style(WHITE.mix(0.0))
            .disable_x_mesh()
            .x_labels(0)
            .x_label_formatter(&|_| String::new())
            .y_label_formatter(&|y| tick(*y))
            .draw()
            .map_err(err)?;
        // plotters' own log ticks crowd a narrow range and skip a wide one's
        // 1-2-5 values: grid lines and labels at log_ticks' values instead.
        let tick_font =
            TextStyle::from(("sans-serif", 12).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
        for t in log_ticks(x_lo, x_hi) {
            chart
                .draw_series(LineSeries::new(
                    [(t, y_lo), (t, y_hi)],
                    BLACK.mix(0.15).stroke_width(1),
                ))
                .map_err(err)?;
            let (x, y) = chart.backend_coord(&(t, y_lo));
            root.draw(&PathElement::new(vec![(x, y), (x, y + 4)], BLACK))
                .map_err(err)?;
            root.draw(&Text::new(tick(t), (x, y + 6), tick_font.clone()))
                .map_err(err)?;
        }
        if let Some(y) = frame.reference_y {
            chart
                .draw_series(LineSeries::new(
                    [(x_lo, y), (x_hi, y)],
                    RGBColor(0x99, 0x99, 0x99).stroke_width(1),
                ))
                .map_err(err)?;
        }
        // Baselines last: dashed over a series of equal value, both show.
        let mut in_panel = in_panel;
        in_panel.sort_by_key(|l| l.kind == Kind::Baseline);
        for line in in_panel {
            let style = styles[&line.label];
            let stroke = style.color.stroke_width(2);
            match line.kind {
                Kind::Baseline => {
                    chart
                        .draw_series(DashedLineSeries::new(line.points.clone(), 9, 6, stroke))
                        .map_err(err)?;
                }
                Kind::Series => {
                    chart
                        .draw_series(LineSeries::new(line.points.clone(), stroke))
                        .map_err(err)?;
                }
                Kind::Points => {}
            }
            for &(x, lo, hi) in &line.whiskers {
                chart
                    .draw_series(LineSeries::new(
                        [(x, lo), (x, hi)],
                        style.color.stroke_width(1),
                    ))
                    .map_err(err)?;
            }
            if line.kind != Kind::Baseline {
                chart
                    .draw_series(
                        line.marks
                            .iter()
                            .map(|&p| marker!(p, style.shape, style.color)),
                    )
                    .map_err(err)?;
            }
        }
    }
    let font = ("sans-serif", 14).into_font();
    for (i, label) in labels.iter().enumerate() {
        let style = styles[label];
        let y = TITLE_HEIGHT as i32 + 20 + 24 * i as i32;
        let stroke = style.color.stroke_width(2);
        let sample: Vec<Vec<(i32, i32)>> = match style.kind {
            Kind::Baseline => vec![vec![(8, y), (17, y)], vec![(23, y), (32, y)]],
            Kind::Series => vec![vec![(8, y), (32, y)]],
            Kind::Points => Vec::new(),
        };
        for segment in sample {
            legend
                .draw(&PathElement::new(segment, stroke))
                .map_err(err)?;
        }
        if style.kind != Kind::Baseline {
            legend
                .draw(&marker!((20, y), style.shape, style.color))
                .map_err(err)?;
        }
        legend
            .draw(&Text::new(label.clone(), (40, y - 8), font.clone()))
            .map_err(err)?;
    }
    root.present().map_err(err)
}

/// What distinguishes a row's line within its policy's panel: real-state use,
/// delivery delay, cache knowledge and shared reservations, each only where
/// `rows` vary in it.
struct LabelParts {
    uses: bool,
    delays: bool,
    knowledge: bool,
    sharing: bool,
}

/// `shared N ms` where the row's replicas share their reservations (rows
/// from before the `share_delay_ms` column: not shared).
fn sharing(row: &Summary) -> Option<String> {
    row.share_delay_ms
        .map(|ms| format!("{SHARE_PREFIX}{} ms", tick(ms)))
}

/// How a no-feed row is drawn: the dashed baseline, or, where its replicas
/// share their reservations, a line of its own (`no feed, shared 0 ms`),
/// flat across the feed periods.
fn no_feed(row: &Summary) -> (String, Kind) {
    match sharing(row) {
        None => (NO_FEED.to_owned(), Kind::Baseline),
        Some(shared) => (format!("{NO_FEED}, {shared}"), Kind::Series),
    }
}

fn feed_delay(feed: &str) -> &str {
    feed.split_once('+').map_or("0", |(_, delay)| delay)
}

/// Rows from before the `cache_knowledge` column hold the estimate only.
fn knowledge(row: &Summary) -> &str {
    match row.cache_knowledge.as_str() {
        "" => "estimated",
        k => k,
    }
}

impl LabelParts {
    fn of(rows: &[&Summary]) -> LabelParts {
        let fed: Vec<&&Summary> = rows.iter().filter(|r| r.feed != "none").collect();
        let varies = |f: &dyn Fn(&Summary) -> &str| distinct(fed.iter().map(|r| f(r))).len() > 1;
        LabelParts {
            uses: varies(&|r| r.real_state_use.as_str()),
            delays: varies(&|r| feed_delay(&r.feed)),
            knowledge: varies(&|r| knowledge(r)),
            sharing: {
                let shares: Vec<Option<String>> = fed.iter().map(|r| sharing(r)).collect();
                shares.iter().any(|s| *s != shares[0])
            },
        }
    }

    /// The label of a fed row; `feed` adds the feed's name (a CDF line, a
    /// by-rate ratio line).
    fn label(&self, row: &Summary, feed: bool) -> String {
        let mut parts: Vec<String> = Vec::new();
        if self.knowledge {
            parts.push(knowledge(row).to_owned());
        }
        if self.uses || parts.is_empty() && !feed {
            parts.push(row.real_state_use.clone());
        }
        if feed || row.feed.starts_with("scraped") {
            parts.push(row.feed.clone());
        } else if self.delays {
            parts.push(format!("{DELAY_PREFIX}{} ms", feed_delay(&row.feed)));
        }
        if self.sharing {
            parts.push(sharing(row).unwrap_or_else(|| UNSHARED.to_owned()));
        }
        parts.join(", ")
    }
}

/// A TTFT CDF (x log-scaled) per policy: one line per configuration of
/// `series` (`(row, sorted TTFT seconds)`), the no-feed one dashed; markers at
/// the 25th, 50th, 75th and 90th percentiles.
pub fn ttft_cdf(path: &Path, title: &str, series: &[(&Summary, &[f64])]) -> Result<(), SimError> {
    let rows: Vec<&Summary> = series.iter().map(|(r, _)| *r).collect();
    let parts = LabelParts::of(&rows);
    let lines = series
        .iter()
        .map(|(row, values)| {
            let n = values.len().max(1) as f64;
            // At most ~400 points per line keeps the SVG small.
            let stride = (values.len() / 400).max(1);
            let points = values
                .iter()
                .enumerate()
                .filter(|(k, _)| k % stride == 0 || k + 1 == values.len())
                .map(|(k, &v)| (v.max(1e-3), (k + 1) as f64 / n))
                .collect();
            let (label, kind) = match row.feed.as_str() {
                "none" => no_feed(row),
                _ => (parts.label(row, true), Kind::Series),
            };
            let mut line = Line::new(&row.policy, &label, kind, points);
            if kind != Kind::Baseline {
                line.marks = CDF_MARKS
                    .iter()
                    .map(|&q| (quantile(values, q).max(1e-3), q))
                    .filter(|p| p.0.is_finite())
                    .collect();
            }
            line
        })
        .collect();
    let frame = Frame {
        title,
        x_desc: "TTFT (s, log)",
        y_desc: "fraction of requests",
        y_fixed: Some((0.0, 1.0)),
        reference_y: None,
        dodge: false,
    };
    small_multiples(path, &frame, lines)
}

/// TTFT p90 against feed period (log x) per policy: one line per real-state
/// use (and delivery delay and cache knowledge, where `rows` vary in them),
/// scraped metrics as markers at their period, no feed dashed across.
pub fn p90_vs_period(path: &Path, title: &str, rows: &[Summary]) -> Result<(), SimError> {
    let refs: Vec<&Summary> = rows.iter().collect();
    let parts = LabelParts::of(&refs);
    let mut lines: Vec<Line> = Vec::new();
    let mut add = |panel: &str, label: String, kind: Kind, point: (f64, f64)| match lines
        .iter_mut()
        .find(|l| l.panel == panel && l.label == label)
    {
        Some(line) => line.points.push(point),
        None => lines.push(Line::new(panel, &label, kind, vec![point])),
    };
    let periods = rows
        .iter()
        .filter(|r| r.feed.starts_with("periodic"))
        .map(|r| r.feed_period_ms);
    let (lo, hi) = periods.fold((f64::MAX, f64::MIN), |(lo, hi), p| (lo.min(p), hi.max(p)));
    if lo > hi {
        return Ok(());
    }
    for r in rows {
        let point = (r.feed_period_ms, r.ttft_p90_s);
        if r.feed.starts_with("periodic") {
            add(&r.policy, parts.label(r, false), Kind::Series, point);
        } else if r.feed.starts_with("scraped") {
            add(&r.policy, parts.label(r, false), Kind::Points, point);
        } else if r.feed == "none" {
            let (label, kind) = no_feed(r);
            add(&r.policy, label.clone(), kind, (lo, r.ttft_p90_s));
            add(&r.policy, label, kind, (hi, r.ttft_p90_s));
        }
    }
    for line in &mut lines {
        line.points.sort_by(|a, b| a.0.total_cmp(&b.0));
        if line.kind != Kind::Baseline {
            line.marks = line.points.clone();
        }
    }
    let frame = Frame {
        title,
        x_desc: "feed period (ms, log)",
        y_desc: "TTFT p90 (s)",
        y_fixed: None,
        reference_y: None,
        dodge: true,
    };
    small_multiples(path, &frame, lines)
}

/// The x axis of [`replica_ratio`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RatioAxis {
    /// Feed period (rows of one rate); scraped metrics as markers, no feed
    /// dashed across.
    FeedPeriod,
    /// Arrival-rate factor; one line per feed.
    Rate,
}

/// TTFT p90 of `replicas` round-robin router replicas over that of 1 router,
/// per policy: one line per cache knowledge (and real-state use, delivery
/// delay, where the rows vary in them), a grey line at 1 (as good as one
/// router). `seeds` holds one sweep's rows per seed (or one element): each
/// point is the median ratio over seeds, with a whisker over their range.
/// Rows pair on policy, real-state use, feed, rate and cache knowledge (a
/// replicas' row sharing reservations with the 1-router row that does not:
/// one router has no peer); a row without its counterpart is left out.
pub fn replica_ratio(
    path: &Path,
    title: &str,
    replicas: usize,
    axis: RatioAxis,
    seeds: &[Vec<Summary>],
) -> Result<(), SimError> {
    let lines = ratio_lines(replicas, axis, seeds);
    if lines.is_empty() {
        return Ok(());
    }
    let y_desc = format!("TTFT p90, {replicas} replicas / 1 router");
    let frame = Frame {
        title,
        x_desc: match axis {
            RatioAxis::FeedPeriod => "feed period (ms, log)",
            RatioAxis::Rate => "arrival rate (× the trace's, log)",
        },
        y_desc: &y_desc,
        y_fixed: None,
        reference_y: Some(1.0),
        dodge: true,
    };
    small_multiples(path, &frame, lines)
}

/// [`replica_ratio`]'s lines, before dodging.
fn ratio_lines(replicas: usize, axis: RatioAxis, seeds: &[Vec<Summary>]) -> Vec<Line> {
    type Key = (String, String, String, u64, String);
    let key = |r: &Summary| -> Key {
        (
            r.policy.clone(),
            r.real_state_use.clone(),
            r.feed.clone(),
            r.rate_scale.to_bits(),
            knowledge(r).to_owned(),
        )
    };
    let all: Vec<&Summary> = seeds
        .iter()
        .flatten()
        .filter(|r| r.routers == replicas)
        .collect();
    let parts = LabelParts::of(&all);
    // (panel, label, kind) → x (bits) → ratios over seeds.
    type Cell = ((String, String, Kind), BTreeMap<u64, Vec<f64>>);
    let mut cells: Vec<Cell> = Vec::new();
    let mut flat_x: Vec<f64> = Vec::new();
    for rows in seeds {
        // The unshared 1-router row wins where there are both (they are the
        // same run).
        let mut ones: Vec<&Summary> = rows.iter().filter(|r| r.routers == 1).collect();
        ones.sort_by_key(|r| r.share_delay_ms.is_none());
        let one: BTreeMap<Key, f64> = ones.iter().map(|r| (key(r), r.ttft_p90_s)).collect();
        for r in rows.iter().filter(|r| r.routers == replicas) {
            let Some(base) = one.get(&key(r)) else {
                continue;
            };
            let ratio = r.ttft_p90_s / base;
            let (label, kind, x) = match (axis, r.feed.as_str()) {
                (_, "none") => {
                    let (label, kind) = no_feed(r);
                    (label, kind, r.rate_scale)
                }
                (RatioAxis::Rate, _) => (parts.label(r, true), Kind::Series, r.rate_scale),
                (RatioAxis::FeedPeriod, feed) if feed.starts_with("scraped") => {
                    (parts.label(r, false), Kind::Points, r.feed_period_ms)
                }
                (RatioAxis::FeedPeriod, _) => {
                    flat_x.push(r.feed_period_ms);
                    (parts.label(r, false), Kind::Series, r.feed_period_ms)
                }
            };
            let id = (r.policy.clone(), label, kind);
            let slot = match cells.iter().position(|(k, _)| *k == id) {
                Some(i) => i,
                None => {
                    cells.push((id, BTreeMap::new()));
                    cells.len() - 1
                }
            };
            cells[slot].1.entry(x.to_bits()).or_default().push(ratio);
        }
    }
    let (lo, hi) = flat_x
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &p| (lo.min(p), hi.max(p)));
    let mut lines = Vec::new();
    for ((panel, label, kind), by_x) in cells {
        let mut points = Vec::new();
        let mut whiskers = Vec::new();
        for (x, mut ratios) in by_x {
            ratios.sort_by(f64::total_cmp);
            // The median of an even count: the mean of the middle two.
            let n = ratios.len();
            let median = (ratios[(n - 1) / 2] + ratios[n / 2]) / 2.0;
            let x = f64::from_bits(x);
            points.push((x, median));
            if n > 1 {
                whiskers.push((x, ratios[0], ratios[n - 1]));
            }
        }
        if label.starts_with(NO_FEED) && axis == RatioAxis::FeedPeriod {
            if lo > hi {
                continue;
            }
            let y = points.first().map_or(f64::NAN, |p| p.1);
            points = vec![(lo, y), (hi, y)];
            whiskers.clear();
        }
        let mut line = Line::new(&panel, &label, kind, points);
        line.whiskers = whiskers;
        lines.push(line);
    }
    lines
}

/// Requests in each engine over time, one line per engine.
pub fn engine_load(path: &Path, title: &str, samples: &[(u64, Vec<u32>)]) -> Result<(), SimError> {
    let err = |e: DrawingAreaErrorKind<_>| plot_error(path, e);
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
    let root = SVGBackend::new(path, (1000 + LEGEND_WIDTH / 2, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (main, legend) = root.split_horizontally(1000);
    let mut chart = ChartBuilder::on(&main)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..t_max, 0.0..y_max * 1.05)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("simulated time (s)")
        .y_desc("requests in engine")
        .draw()
        .map_err(err)?;
    let color = |engine: usize| match engine / PALETTE.len() {
        0 => PALETTE[engine],
        _ => [BASELINE, RGBColor(0x66, 0x66, 0x66)][(engine / PALETTE.len() - 1) % 2],
    };
    for engine in 0..engines {
        let points = samples
            .iter()
            .map(|(t, load)| (*t as f64 / 1e9, f64::from(load[engine])));
        chart
            .draw_series(LineSeries::new(points, color(engine).stroke_width(1)))
            .map_err(err)?;
    }
    draw_engine_legend(&legend, engines, color).map_err(err)?;
    root.present().map_err(err)
}

fn draw_engine_legend<DB: DrawingBackend>(
    legend: &DrawingArea<DB, Shift>,
    engines: usize,
    color: impl Fn(usize) -> RGBColor,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    for engine in 0..engines {
        let y = 30 + 22 * engine as i32;
        legend.draw(&PathElement::new(
            vec![(8, y), (32, y)],
            color(engine).stroke_width(2),
        ))?;
        legend.draw(&Text::new(
            format!("e{engine}"),
            (40, y - 8),
            ("sans-serif", 14),
        ))?;
    }
    Ok(())
}

#[cfg(test)]
#[path = "plots_tests.rs"]
mod tests;

use super::*;

fn row(policy: &str, real_state_use: &str, feed: &str, routers: usize, p90: f64) -> Summary {
    Summary {
        config: format!("{policy}/{real_state_use}/{feed}/r{routers}"),
        policy: policy.to_owned(),
        real_state_use: real_state_use.to_owned(),
        cache_knowledge: "estimated".to_owned(),
        feed: feed.to_owned(),
        feed_period_ms: feed
            .split_once(':')
            .map_or(0.0, |(_, p)| p.split('+').next().unwrap().parse().unwrap()),
        routers,
        ttft_p90_s: p90,
        ..Summary::default()
    }
}

/// Every `<text>` of an SVG: its x attribute and its content.
fn texts(svg: &str) -> Vec<(i32, String)> {
    svg.split("<text ")
        .skip(1)
        .map(|t| {
            let x = t.split("x=\"").nth(1).unwrap().split('"').next().unwrap();
            let content = t
                .split_once('>')
                .unwrap()
                .1
                .split("</text>")
                .next()
                .unwrap();
            (x.parse().unwrap(), content.trim().to_owned())
        })
        .collect()
}

fn count(texts: &[(i32, String)], content: &str) -> usize {
    texts.iter().filter(|(_, t)| t == content).count()
}

const POLICIES: [&str; 4] = ["lmetric", "sticky", "unified", "unified(1.3,0.01)"];

fn sweep_rows() -> Vec<Summary> {
    let mut rows = Vec::new();
    for (i, policy) in POLICIES.iter().enumerate() {
        let base = 1.0 + i as f64;
        rows.push(row(policy, "never", "none", 1, base));
        for (use_, delta) in [("placement", 0.0), ("always", 0.5)] {
            for period in [10, 50, 1000] {
                // placement and always equal at 50 ms: they must not hide.
                let p90 = base + if period == 50 { 0.0 } else { delta };
                rows.push(row(policy, use_, &format!("periodic:{period}"), 1, p90));
            }
            rows.push(row(policy, use_, "scraped:30000", 1, base * 2.0));
        }
    }
    rows
}

#[test]
fn a_multi_policy_plot_has_one_panel_per_policy_and_the_legend_beside_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p90.svg");
    p90_vs_period(&path, "the title", &sweep_rows()).unwrap();
    let svg = std::fs::read_to_string(&path).unwrap();
    let texts = texts(&svg);
    assert_eq!(count(&texts, "the title"), 1);
    for policy in POLICIES {
        assert_eq!(count(&texts, policy), 1, "one panel titled {policy}");
    }
    // One shared legend, right of the 3 panel columns, one entry per series.
    for label in [
        NO_FEED,
        "placement",
        "always",
        "placement, scraped:30000",
        "always, scraped:30000",
    ] {
        let entries: Vec<_> = texts.iter().filter(|(_, t)| t == label).collect();
        assert_eq!(entries.len(), 1, "{label}");
        assert!(entries[0].0 >= 3 * PANEL.0 as i32, "{label} at {entries:?}");
    }
    // Markers in the palette's colours only (no pale ones).
    let palette: Vec<String> = PALETTE
        .iter()
        .map(|c| format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2))
        .collect();
    let fills: Vec<&str> = svg
        .split("<polygon ")
        .skip(1)
        .map(|p| {
            p.split("fill=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap()
        })
        .collect();
    assert!(fills.len() >= 4 * 8, "markers drawn: {}", fills.len());
    assert!(
        fills.iter().all(|f| palette.iter().any(|p| p == f)),
        "{fills:?}"
    );
    // The baseline is dashed: many short black segments, not one polyline.
    assert!(svg.matches("stroke=\"#000000\"").count() > 4 * 10);
}

#[test]
fn a_single_policy_plot_has_one_panel() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p90.svg");
    let rows: Vec<Summary> = sweep_rows()
        .into_iter()
        .filter(|r| r.policy == "sticky")
        .collect();
    p90_vs_period(&path, "t", &rows).unwrap();
    let texts = texts(&std::fs::read_to_string(&path).unwrap());
    assert_eq!(count(&texts, "sticky"), 1);
    assert_eq!(count(&texts, "lmetric"), 0);
}

#[test]
fn cdf_panels_per_policy_with_one_shared_legend() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cdf.svg");
    let rows: Vec<Summary> = sweep_rows()
        .into_iter()
        .filter(|r| r.feed == "none" || r.feed == "periodic:50")
        .collect();
    let ttft: Vec<f64> = (1..=100).map(|k| f64::from(k) / 10.0).collect();
    let series: Vec<(&Summary, &[f64])> = rows.iter().map(|r| (r, ttft.as_slice())).collect();
    ttft_cdf(&path, "cdf", &series).unwrap();
    let texts = texts(&std::fs::read_to_string(&path).unwrap());
    for policy in POLICIES {
        assert_eq!(count(&texts, policy), 1, "{policy}");
    }
    assert_eq!(count(&texts, NO_FEED), 1);
    assert_eq!(count(&texts, "placement, periodic:50"), 1);
}

#[test]
fn equal_series_are_nudged_apart_and_the_baseline_is_not() {
    let flat = |label: &str, kind| Line::new("p", label, kind, vec![(50.0, 2.0), (1000.0, 2.0)]);
    let mut lines = vec![
        flat("a", Kind::Series),
        flat("b", Kind::Series),
        flat(NO_FEED, Kind::Baseline),
    ];
    dodge(&mut lines);
    let (a, b) = (lines[0].points[0].0, lines[1].points[0].0);
    assert!(a < 50.0 && b > 50.0, "{a} {b}");
    assert!(((a * b).sqrt() - 50.0).abs() < 1e-9, "centred on the value");
    assert_eq!(lines[0].marks[0].0, a, "markers move with their line");
    assert_eq!(lines[2].points[0].0, 50.0);
}

fn replica_rows(estimated: f64, engine: f64) -> Vec<Summary> {
    let mut rows = Vec::new();
    for knowledge in ["estimated", "engine"] {
        let mut none1 = row("unified", "never", "none", 1, 2.0);
        let mut none4 = row("unified", "never", "none", 4, 6.0);
        none1.cache_knowledge = knowledge.to_owned();
        none4.cache_knowledge = knowledge.to_owned();
        rows.extend([none1, none4]);
        for feed in ["periodic:50", "periodic:1000"] {
            let mut one = row("unified", "placement", feed, 1, 2.0);
            let ratio = if knowledge == "engine" {
                engine
            } else {
                estimated
            };
            let mut four = row("unified", "placement", feed, 4, 2.0 * ratio);
            one.cache_knowledge = knowledge.to_owned();
            four.cache_knowledge = knowledge.to_owned();
            rows.extend([one, four]);
        }
    }
    // A 4-replica row without its 1-router counterpart is left out.
    rows.push(row("sticky", "placement", "periodic:50", 4, 9.0));
    rows
}

#[test]
fn replica_ratios_are_medians_over_seeds_per_cache_knowledge() {
    let seeds = vec![
        replica_rows(2.0, 1.0),
        replica_rows(3.0, 1.1),
        replica_rows(2.5, 1.3),
    ];
    let lines = ratio_lines(4, RatioAxis::FeedPeriod, &seeds);
    let find = |label: &str| lines.iter().find(|l| l.label == label).unwrap();
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(lines.iter().all(|l| l.panel == "unified"));
    let estimated = find("estimated");
    assert_eq!(estimated.kind, Kind::Series);
    assert_eq!(estimated.points, vec![(50.0, 2.5), (1000.0, 2.5)]);
    assert_eq!(
        estimated.whiskers,
        vec![(50.0, 2.0, 3.0), (1000.0, 2.0, 3.0)]
    );
    assert_eq!(find("engine").points[0], (50.0, 1.1));
    let baseline = find(NO_FEED);
    assert_eq!(baseline.kind, Kind::Baseline);
    assert_eq!(baseline.points, vec![(50.0, 3.0), (1000.0, 3.0)]);
    // Two seeds: the median is the mean of the middle two.
    let two = ratio_lines(4, RatioAxis::FeedPeriod, &seeds[..2]);
    let engine = two.iter().find(|l| l.label == "engine").unwrap();
    assert!((engine.points[0].1 - 1.05).abs() < 1e-12);
    // By rate: one line per knowledge and feed, x the rate.
    let by_rate = ratio_lines(4, RatioAxis::Rate, &seeds);
    assert!(by_rate
        .iter()
        .any(|l| l.label == "engine, periodic:50" && l.points == vec![(1.0, 1.1)]));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ratio.svg");
    replica_ratio(&path, "ratio", 4, RatioAxis::FeedPeriod, &seeds).unwrap();
    let texts = texts(&std::fs::read_to_string(&path).unwrap());
    assert_eq!(count(&texts, "unified"), 1);
    assert_eq!(count(&texts, "engine"), 1);
}

#[test]
fn tick_labels_drop_needless_fractions() {
    assert_eq!(tick(10.0), "10");
    assert_eq!(tick(30000.0), "30000");
    assert_eq!(tick(2.5), "2.5");
    assert_eq!(tick(0.25), "0.25");
    assert_eq!(tick(0.0), "0");
}

#[test]
fn log_axes_span_and_label_1_2_5_values_only() {
    assert_eq!(padded_log_range([50.0, 1000.0].into_iter()), (20.0, 2000.0));
    assert_eq!(padded_log_range([0.5, 2.0].into_iter()), (0.2, 5.0));
    assert_eq!(
        padded_log_range([10.0, 30000.0].into_iter()),
        (5.0, 50000.0)
    );
    assert_eq!(
        log_ticks(20.0, 2000.0),
        vec![20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0]
    );
    assert_eq!(log_ticks(0.2, 5.0), vec![0.2, 0.5, 1.0, 2.0, 5.0]);
    assert_eq!(log_ticks(5.0, 50000.0), vec![10.0, 100.0, 1000.0, 10000.0]);
}

#[test]
fn delays_share_their_series_colour_and_differ_in_shape() {
    let labels: Vec<String> = [
        NO_FEED,
        "engine, delay 0 ms",
        "engine, delay 5 ms",
        "estimated, delay 0 ms",
        "estimated, delay 5 ms",
        "placement",
    ]
    .map(String::from)
    .to_vec();
    let lines: Vec<Line> = labels
        .iter()
        .map(|l| {
            let kind = if l == NO_FEED {
                Kind::Baseline
            } else {
                Kind::Series
            };
            Line::new("p", l, kind, vec![(1.0, 1.0)])
        })
        .collect();
    let styles = styles(&labels, &lines);
    let style = |l: &str| styles[l];
    assert_eq!(style(NO_FEED).color, BASELINE);
    assert_eq!(
        style("engine, delay 0 ms").color,
        style("engine, delay 5 ms").color
    );
    assert_ne!(
        style("engine, delay 0 ms").color,
        style("estimated, delay 0 ms").color
    );
    assert_eq!(
        style("engine, delay 0 ms").shape,
        style("estimated, delay 0 ms").shape
    );
    assert_ne!(
        style("engine, delay 0 ms").shape,
        style("engine, delay 5 ms").shape
    );
    assert_ne!(
        style("placement").color,
        style("estimated, delay 0 ms").color
    );
}

#[test]
fn shared_replicas_pair_with_the_unshared_router_and_get_their_own_lines() {
    let shared = |mut r: Summary, ms: Option<f64>| {
        r.share_delay_ms = ms;
        r
    };
    let rows = vec![
        row("unified", "placement", "periodic:50", 1, 2.0),
        // The same run (one router has no peer): the unshared one is paired.
        shared(
            row("unified", "placement", "periodic:50", 1, 99.0),
            Some(0.0),
        ),
        row("unified", "placement", "periodic:50", 4, 6.0),
        shared(
            row("unified", "placement", "periodic:50", 4, 2.2),
            Some(0.0),
        ),
        shared(
            row("unified", "placement", "periodic:50", 4, 3.0),
            Some(10.0),
        ),
        row("lmetric", "never", "none", 1, 4.0),
        row("lmetric", "never", "none", 4, 8.0),
        shared(row("lmetric", "never", "none", 4, 4.4), Some(0.0)),
    ];
    let lines = ratio_lines(4, RatioAxis::Rate, std::slice::from_ref(&rows));
    let find = |panel: &str, label: &str| {
        let line = lines
            .iter()
            .find(|l| l.panel == panel && l.label == label)
            .unwrap_or_else(|| panic!("{panel} / {label} in {lines:?}"));
        (line.kind, line.points[0].1)
    };
    assert_eq!(lines.len(), 5, "{lines:?}");
    assert_eq!(
        find("unified", "periodic:50, unshared"),
        (Kind::Series, 3.0)
    );
    let (kind, ratio) = find("unified", "periodic:50, shared 0 ms");
    assert!(kind == Kind::Series && (ratio - 1.1).abs() < 1e-12);
    assert_eq!(find("unified", "periodic:50, shared 10 ms").1, 1.5);
    assert_eq!(find("lmetric", NO_FEED), (Kind::Baseline, 2.0));
    let (kind, ratio) = find("lmetric", "no feed, shared 0 ms");
    assert!(kind == Kind::Series && (ratio - 1.1).abs() < 1e-12);
    // One colour per the rest of the label, one shape per sharing.
    let labels = distinct(lines.iter().map(|l| l.label.as_str()));
    let styles = styles(&labels, &lines);
    let (a, b) = (
        styles["periodic:50, unshared"],
        styles["periodic:50, shared 10 ms"],
    );
    assert_eq!(a.color, b.color);
    assert_ne!(a.shape, b.shape);
    let dir = tempfile::tempdir().unwrap();
    // Against rate the feed names the line; against period the use does.
    for (name, axis, label) in [
        ("rate", RatioAxis::Rate, "periodic:50, shared 10 ms"),
        ("period", RatioAxis::FeedPeriod, "placement, shared 10 ms"),
    ] {
        let path = dir.path().join(format!("{name}.svg"));
        replica_ratio(&path, "ratio", 4, axis, std::slice::from_ref(&rows)).unwrap();
        let texts = texts(&std::fs::read_to_string(&path).unwrap());
        let legend = |label: &str| count(&texts, label);
        assert_eq!(legend(label), 1, "{name}: {texts:?}");
        assert_eq!(legend("no feed, shared 0 ms"), 1, "{name}: {texts:?}");
    }
    p90_vs_period(&dir.path().join("p90.svg"), "t", &rows).unwrap();
}

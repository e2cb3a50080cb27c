//! The human-readable engine table of `esdump`.
//!
//! By default it fits a 120-column terminal: the columns a person watches
//! (load, KV use, ages) and engine ids cut to [`ENGINE_WIDTH`] characters;
//! `--wide` shows every snapshot field and the full ids ([`View`]).

use std::borrow::Cow;
use std::cmp::Ordering;
use std::fmt::Write;

use engine_state_reader::{millis, printable, EngineState, Reading};
use engine_state_shm_format::{EngineId, Snapshot, FIELD_COUNT};

/// How a snapshot field is shown, and what the totals row makes of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A count or a number of blocks: in the default table, summed in the
    /// totals row.
    Sum,
    /// Only with `--wide`; summed in the totals row.
    WideSum,
    /// In the default table; not summed (a word, not a quantity).
    Shown,
    /// Only with `--wide`; not summed (a stamp, a counter or a maximum, whose
    /// sum over engines means nothing).
    WideOnly,
}

/// The column label of each snapshot field and how it is shown, in word
/// order (`Snapshot::FIELD_NAMES`).
const FIELD_LABELS: [(&str, Kind); FIELD_COUNT] = [
    ("MONO_NS", Kind::WideOnly),
    ("CAPTURED_UTC", Kind::WideOnly),
    ("STEP", Kind::WideOnly),
    ("RUN", Kind::Sum),
    ("WAIT", Kind::Sum),
    ("BLK_TOTAL", Kind::WideSum),
    ("BLK_FREE", Kind::WideSum),
    ("PEND_PREFILL", Kind::Sum),
    ("DECODE_TOK", Kind::Sum),
    ("PREFILLING", Kind::WideSum),
    ("MAX_PREFILL", Kind::WideOnly),
    ("PREEMPT", Kind::WideSum),
    ("FLAGS", Kind::Shown),
];

/// The longest engine id the default table shows whole; a longer one is
/// shown as its first and last characters around `…` (the end of an id is
/// often its replica number). `--wide` shows every id whole.
pub const ENGINE_WIDTH: usize = 24;

/// What the table shows: which columns, which engines, in which order.
#[derive(Clone, Debug, Default)]
pub struct View {
    /// Every column and whole engine ids (`--wide`).
    pub wide: bool,
    /// The column to sort the rows by (`--sort`, see [`SortKey::parse`]).
    pub sort: Option<SortKey>,
    /// Only engines whose id starts with this (`--filter`).
    pub filter: Option<String>,
}

/// A column to sort by: numbers descending (the busiest engine first), words
/// (ENGINE, STATUS, FLAGS) ascending; ties keep the reader's order (by
/// engine id).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SortKey(Column);

impl SortKey {
    /// The column labelled `label` (case-insensitive), any column of
    /// `--wide` included; an unknown label is an error listing them all.
    pub fn parse(label: &str) -> Result<SortKey, String> {
        let columns = columns(true);
        columns
            .iter()
            .find(|(l, _)| l.eq_ignore_ascii_case(label))
            .map(|(_, c)| SortKey(*c))
            .ok_or_else(|| {
                let labels: Vec<&str> = columns.iter().map(|(l, _)| *l).collect();
                format!(
                    "unknown column {:?}; the columns are: {}",
                    printable(label),
                    labels.join(", ")
                )
            })
    }
}

/// What a column shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Column {
    Engine,
    Status,
    /// The snapshot word of this index.
    Field(usize),
    KvUsed,
    HeartbeatAge,
    CaptureAge,
}

/// The columns, in order: the engine and its status, the snapshot fields in
/// word order (the KV used fraction after the free blocks, or where they
/// would be), both ages, and the capture stamps last (wall clock, then
/// monotonic). Without `wide`, only the fields that are not wide-only.
fn columns(wide: bool) -> Vec<(&'static str, Column)> {
    let is_stamp = |name: &&str| Snapshot::CAPTURE_STAMPS.contains(name);
    let shown = |word: usize| wide || matches!(FIELD_LABELS[word].1, Kind::Sum | Kind::Shown);
    let mut columns = vec![("ENGINE", Column::Engine), ("STATUS", Column::Status)];
    for (word, name) in Snapshot::FIELD_NAMES.iter().enumerate() {
        if !is_stamp(name) && shown(word) {
            columns.push((FIELD_LABELS[word].0, Column::Field(word)));
        }
        if *name == "gpu_blocks_free" {
            columns.push(("KV_USED", Column::KvUsed));
        }
    }
    columns.push(("HB_AGE_MS", Column::HeartbeatAge));
    columns.push(("CAP_AGE_MS", Column::CaptureAge));
    for (word, name) in Snapshot::FIELD_NAMES.iter().enumerate().rev() {
        if is_stamp(name) && shown(word) {
            columns.push((FIELD_LABELS[word].0, Column::Field(word)));
        }
    }
    columns
}

/// A value to sort rows by.
#[derive(Clone, Debug, PartialEq, PartialOrd)]
enum Key {
    Number(f64),
    Text(String),
}

impl Column {
    /// The cell of `engine` in this column.
    fn cell(self, engine: &EngineState, wide: bool) -> String {
        match self {
            Column::Engine => {
                let name = shown_name(&engine.engine_id);
                if wide {
                    name.into_owned()
                } else {
                    shortened(&name, ENGINE_WIDTH)
                }
            }
            Column::Status => engine.status.to_string(),
            Column::Field(word) => {
                let value = engine.snapshot.to_words()[word];
                match Snapshot::FIELD_NAMES[word] {
                    "flags" => flags(value),
                    "captured_unix_ns" => utc_time(value),
                    _ => value.to_string(),
                }
            }
            Column::KvUsed => kv_used(engine.gpu_kv_used_frac()),
            Column::HeartbeatAge => format!("{:.1}", millis(engine.heartbeat_age)),
            Column::CaptureAge => format!("{:.1}", millis(engine.capture_age)),
        }
    }

    /// What `--sort` orders `engine` by in this column.
    fn key(self, engine: &EngineState) -> Key {
        match self {
            Column::Engine => Key::Text(engine.engine_id.to_string()),
            Column::Status => Key::Text(engine.status.to_string()),
            Column::Field(word) if Snapshot::FIELD_NAMES[word] == "flags" => {
                Key::Text(self.cell(engine, true))
            }
            Column::Field(word) => Key::Number(engine.snapshot.to_words()[word] as f64),
            Column::KvUsed => Key::Number(engine.gpu_kv_used_frac().unwrap_or(-1.0)),
            Column::HeartbeatAge => Key::Number(engine.heartbeat_age.as_secs_f64()),
            Column::CaptureAge => Key::Number(engine.capture_age.as_secs_f64()),
        }
    }

    /// The totals row's cell: `TOTAL (<engines>)`, the sum over `engines`
    /// of a count or number of blocks, KV used of the summed blocks, blank
    /// for the rest (status, flags, ages, stamps, step, max prefill).
    fn total(self, engines: &[&EngineState]) -> String {
        let sum = |word: usize| -> u64 {
            engines
                .iter()
                .map(|e| e.snapshot.to_words()[word])
                .fold(0u64, u64::saturating_add)
        };
        let word_of = |name: &str| Snapshot::FIELD_NAMES.iter().position(|n| *n == name);
        match self {
            Column::Engine => format!("TOTAL ({})", engines.len()),
            Column::Field(word) if matches!(FIELD_LABELS[word].1, Kind::Sum | Kind::WideSum) => {
                sum(word).to_string()
            }
            Column::KvUsed => {
                let mut blocks = Snapshot::default();
                if let (Some(total), Some(free)) =
                    (word_of("gpu_blocks_total"), word_of("gpu_blocks_free"))
                {
                    let mut words = blocks.to_words();
                    words[total] = sum(total);
                    words[free] = sum(free);
                    blocks = Snapshot::from_words(words);
                }
                kv_used(blocks.gpu_kv_used_frac())
            }
            _ => String::new(),
        }
    }

    /// Names and words left-aligned, numbers right-aligned.
    fn left_aligned(self) -> bool {
        match self {
            Column::Engine | Column::Status => true,
            Column::Field(word) => Snapshot::FIELD_NAMES[word] == "flags",
            _ => false,
        }
    }

    /// Words sort ascending, numbers descending.
    fn descending(self) -> bool {
        !self.left_aligned()
    }
}

fn kv_used(frac: Option<f64>) -> String {
    frac.map_or("-".into(), |f| format!("{:.1}%", f * 100.0))
}

/// `name` if it has at most `width` characters, else its first and last
/// characters around `…`, `width` characters in all.
fn shortened(name: &str, width: usize) -> String {
    let chars: Vec<char> = name.chars().collect();
    if chars.len() <= width {
        return name.to_owned();
    }
    let tail = (width - 1) / 2;
    let head = width - 1 - tail;
    let mut out: String = chars[..head].iter().collect();
    out.push('…');
    out.extend(&chars[chars.len() - tail..]);
    out
}

/// Renders `reading` as an aligned table, one row per engine that `view`
/// shows (in its order), a totals row when it shows two or more, and every
/// error of the read below (errors are not filtered: one may concern the
/// whole source).
pub fn render(reading: &Reading, view: &View) -> String {
    let columns = columns(view.wide);
    let mut engines: Vec<&EngineState> = reading
        .engines
        .iter()
        .filter(|e| {
            view.filter
                .as_deref()
                .is_none_or(|prefix| e.engine_id.starts_with(prefix))
        })
        .collect();
    if let Some(SortKey(column)) = view.sort {
        engines.sort_by(|a, b| {
            let order = column
                .key(a)
                .partial_cmp(&column.key(b))
                .unwrap_or(Ordering::Equal);
            if column.descending() {
                order.reverse()
            } else {
                order
            }
        });
    }
    let mut rows: Vec<Vec<String>> =
        vec![columns.iter().map(|(label, _)| label.to_string()).collect()];
    for engine in &engines {
        rows.push(
            columns
                .iter()
                .map(|(_, column)| column.cell(engine, view.wide))
                .collect(),
        );
    }
    if engines.len() >= 2 {
        rows.push(
            columns
                .iter()
                .map(|(_, column)| column.total(&engines))
                .collect(),
        );
    }
    let widths: Vec<usize> = (0..columns.len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        for ((cell, (_, column)), width) in row.iter().zip(&columns).zip(&widths) {
            if column.left_aligned() {
                let _ = write!(out, "{cell:<width$}  ");
            } else {
                let _ = write!(out, "{cell:>width$}  ");
            }
        }
        out.truncate(out.trim_end().len());
        out.push('\n');
    }
    if engines.is_empty() {
        if reading.engines.is_empty() {
            out.push_str("(no engines)\n");
        } else {
            let _ = writeln!(
                out,
                "(no engines match the filter; {} in all)",
                reading.engines.len()
            );
        }
    }
    for error in &reading.errors {
        let _ = writeln!(
            out,
            "! {}: {}",
            shown_name(&error.name),
            printable(&error.to_string())
        );
    }
    out
}

/// `name` as it is when it is a valid engine id, else escaped like a Rust
/// string literal (`\u{1b}`, `\n`): a file name or Redis registry member is
/// chosen by whoever can write there, and must not move the terminal's
/// cursor, change its colours or forge extra lines.
pub(crate) fn shown_name(name: &str) -> Cow<'_, str> {
    if EngineId::new(name).is_ok() {
        Cow::Borrowed(name)
    } else {
        Cow::Owned(name.escape_debug().to_string())
    }
}

fn flags(flags: u64) -> String {
    let mut names = Vec::new();
    if flags & engine_state_reader::FLAG_IDLE != 0 {
        names.push("idle");
    }
    if flags & engine_state_reader::FLAG_SHUTTING_DOWN != 0 {
        names.push("shutdown");
    }
    if names.is_empty() {
        "-".to_owned()
    } else {
        names.join(",")
    }
}

/// `HH:MM:SS.mmm` (UTC) of a Unix time in ns.
fn utc_time(unix_ns: u64) -> String {
    if unix_ns == 0 {
        return "-".to_owned();
    }
    let ms = unix_ns / 1_000_000;
    let day_ms = ms % 86_400_000;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        day_ms / 3_600_000,
        day_ms / 60_000 % 60,
        day_ms / 1000 % 60,
        day_ms % 1000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default header (fits 120 columns).
    const EXPECTED_HEADER: [&str; 10] = [
        "ENGINE",
        "STATUS",
        "RUN",
        "WAIT",
        "KV_USED",
        "PEND_PREFILL",
        "DECODE_TOK",
        "FLAGS",
        "HB_AGE_MS",
        "CAP_AGE_MS",
    ];
    /// The `--wide` header: every column.
    const EXPECTED_HEADER_WIDE: [&str; 18] = [
        "ENGINE",
        "STATUS",
        "STEP",
        "RUN",
        "WAIT",
        "BLK_TOTAL",
        "BLK_FREE",
        "KV_USED",
        "PEND_PREFILL",
        "DECODE_TOK",
        "PREFILLING",
        "MAX_PREFILL",
        "PREEMPT",
        "FLAGS",
        "HB_AGE_MS",
        "CAP_AGE_MS",
        "CAPTURED_UTC",
        "MONO_NS",
    ];
    use engine_state_reader::Status;
    use std::time::Duration;

    #[test]
    fn one_row_per_engine_with_every_column() {
        let reading = Reading {
            engines: vec![EngineState {
                engine_id: "engine-0".into(),
                status: Status::Fresh,
                snapshot: Snapshot {
                    num_running: 12,
                    gpu_blocks_total: 1000,
                    gpu_blocks_free: 250,
                    captured_unix_ns: 3_723_004_000_000, // 01:02:03.004
                    flags: 1,
                    ..Snapshot::default()
                },
                heartbeat_age: Duration::from_millis(12),
                capture_age: Duration::from_millis(40),
                generation: 1,
                read_mono_ns: 0,
                writer: Default::default(),
                clock_ahead: false,
            }],
            errors: vec![],
        };
        let wide = View {
            wide: true,
            ..View::default()
        };
        let text = render(&reading, &wide);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        // The header, pinned: a change of columns or their order shows here.
        let header: Vec<&str> = lines[0].split_whitespace().collect();
        assert_eq!(header, EXPECTED_HEADER_WIDE);
        let default = render(&reading, &View::default());
        let header: Vec<&str> = default.lines().next().unwrap().split_whitespace().collect();
        assert_eq!(header, EXPECTED_HEADER);
        for cell in [
            "engine-0",
            "fresh",
            "12",
            "75.0%",
            "250",
            "1000",
            "idle",
            "12.0",
            "40.0",
            "01:02:03.004",
        ] {
            assert!(lines[1].contains(cell), "{cell} missing in {}", lines[1]);
        }
        assert!(render(&Reading::default(), &View::default()).contains("(no engines)"));
    }

    #[test]
    fn every_snapshot_field_has_its_column() {
        let columns = columns(true);
        assert_eq!(columns.len(), 2 + FIELD_COUNT + 3);
        for word in 0..FIELD_COUNT {
            let at = columns
                .iter()
                .filter(|(_, c)| *c == Column::Field(word))
                .count();
            assert_eq!(at, 1, "{}", Snapshot::FIELD_NAMES[word]);
        }
        // Every plain count in its own column, under its label.
        let engine = EngineState {
            engine_id: "e".into(),
            status: Status::Fresh,
            snapshot: Snapshot::from_words(core::array::from_fn(|i| 1000 + i as u64)),
            heartbeat_age: Duration::ZERO,
            capture_age: Duration::ZERO,
            generation: 1,
            read_mono_ns: 0,
            writer: Default::default(),
            clock_ahead: false,
        };
        let text = render(
            &Reading {
                engines: vec![engine],
                errors: vec![],
            },
            &View {
                wide: true,
                ..View::default()
            },
        );
        let lines: Vec<Vec<&str>> = text
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        for (index, (label, column)) in columns.iter().enumerate() {
            assert_eq!(lines[0][index], *label);
            if let Column::Field(word) = column {
                if *label != "FLAGS" && *label != "CAPTURED_UTC" {
                    assert_eq!(lines[1][index], (1000 + word).to_string(), "{label}");
                }
            }
        }
    }

    #[test]
    fn hostile_names_and_messages_are_escaped() {
        assert_eq!(shown_name("engine-0"), "engine-0");
        assert_eq!(shown_name("a\u{1b}[31mb\nc"), "a\\u{1b}[31mb\\nc");
        let reading = Reading {
            engines: vec![],
            errors: vec![engine_state_reader::EngineError::new(
                "e\u{1b}[31m\nx",
                engine_state_reader::Error::Directory {
                    dir: "/d/e\u{1b}[31m\nx".into(),
                    io: std::io::Error::other("boom"),
                },
            )],
        };
        let text = render(&reading, &View::default());
        assert!(!text.contains('\u{1b}'), "{text}");
        assert_eq!(
            text.lines().filter(|l| l.starts_with("! ")).count(),
            1,
            "{text}"
        );
        assert_eq!(
            text.lines().count(),
            3,
            "header, (no engines), one error: {text}"
        );
    }

    /// An engine of a realistic fleet: a 24-character id, a few hundred
    /// requests, ~220k tokens of KV.
    fn fleet_engine(i: u64) -> EngineState {
        EngineState {
            engine_id: format!("prod-use1-llama70b-r{i:04}").into(),
            status: if i % 7 == 0 {
                Status::Stale
            } else {
                Status::Fresh
            },
            snapshot: Snapshot {
                captured_mono_ns: 1_234_567_890_123_456 + i,
                captured_unix_ns: 1_780_000_000_000_000_000 + i,
                step: 9_876_543 + i,
                num_running: 200 + i % 56,
                num_waiting: i % 200,
                gpu_blocks_total: 13_750,
                gpu_blocks_free: 13_750 - (i * 97) % 13_750,
                pending_prefill_tokens: 3_000_000 + i * 1_001,
                ongoing_decode_tokens: 200_000 + i,
                num_prefilling: 12 + i % 5,
                max_prefill_remaining: 32_768,
                num_preempted: i % 3,
                flags: if i % 11 == 0 { 3 } else { i % 2 },
                ..Snapshot::default()
            },
            heartbeat_age: Duration::from_micros(12_345 + i),
            capture_age: Duration::from_millis(45_000 + i),
            generation: 1,
            read_mono_ns: 0,
            writer: Default::default(),
            clock_ahead: false,
        }
    }

    fn fleet(n: u64) -> Reading {
        Reading {
            engines: (0..n).map(fleet_engine).collect(),
            errors: vec![],
        }
    }

    #[test]
    fn a_realistic_fleet_fits_120_columns_and_wide_has_the_raw_columns() {
        let reading = fleet(500);
        let text = render(&reading, &View::default());
        for line in text.lines() {
            assert!(line.chars().count() <= 120, "{} wide: {line}", line.len());
        }
        assert_eq!(text.lines().count(), 1 + 500 + 1, "header, rows, totals");
        for raw in [
            "MONO_NS",
            "CAPTURED_UTC",
            "STEP",
            "BLK_TOTAL",
            "MAX_PREFILL",
        ] {
            assert!(!text.lines().next().unwrap().contains(raw), "{raw}");
        }
        let wide = render(
            &reading,
            &View {
                wide: true,
                ..View::default()
            },
        );
        let header: Vec<&str> = wide.lines().next().unwrap().split_whitespace().collect();
        assert_eq!(header, EXPECTED_HEADER_WIDE);
        assert!(wide.lines().nth(1).unwrap().contains("1234567890123456"));
        assert!(wide.lines().any(|l| l.chars().count() > 120));
    }

    #[test]
    fn long_engine_ids_keep_their_ends_by_default_and_are_whole_when_wide() {
        let mut engine = fleet_engine(17);
        engine.engine_id = "a-very-long-engine-identifier-of-replica-0017".into();
        let reading = Reading {
            engines: vec![engine],
            errors: vec![],
        };
        let row = render(&reading, &View::default());
        let cell = row
            .lines()
            .nth(1)
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap();
        assert_eq!(cell, "a-very-long-…eplica-0017");
        assert_eq!(cell.chars().count(), ENGINE_WIDTH);
        let wide = View {
            wide: true,
            ..View::default()
        };
        assert!(render(&reading, &wide).contains("a-very-long-engine-identifier-of-replica-0017 "));
    }

    /// The engine ids of a table's rows, the totals row left out.
    fn ids(text: &str) -> Vec<String> {
        text.lines()
            .skip(1)
            .filter(|l| !l.starts_with("TOTAL") && !l.starts_with('('))
            .map(|l| l.split_whitespace().next().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn sort_by_any_label_numbers_descending_words_ascending() {
        let mut reading = fleet(4);
        reading.engines[2].snapshot.num_waiting = 5_000;
        reading.engines[0].snapshot.num_waiting = 4_000;
        reading.engines[1].snapshot.num_waiting = 1;
        reading.engines[3].snapshot.num_waiting = 1;
        let view = |label: &str| View {
            sort: Some(SortKey::parse(label).unwrap()),
            ..View::default()
        };
        let id = |i: u64| format!("prod-use1-llama70b-r{i:04}");
        assert_eq!(
            ids(&render(&reading, &view("wait"))),
            [id(2), id(0), id(1), id(3)],
            "descending; ties keep the reader's order"
        );
        assert_eq!(
            ids(&render(&reading, &view("Engine"))),
            [id(0), id(1), id(2), id(3)]
        );
        reading.engines.reverse();
        assert_eq!(
            ids(&render(&reading, &view("ENGINE"))),
            [id(0), id(1), id(2), id(3)]
        );
        // A wide-only column sorts the default table too.
        reading.engines[1].snapshot.step = u64::MAX;
        let first = ids(&render(&reading, &view("step")))[0].clone();
        assert_eq!(first, &*reading.engines[1].engine_id);
        let error = SortKey::parse("queue").unwrap_err();
        assert!(error.contains("unknown column \"queue\""), "{error}");
        for label in EXPECTED_HEADER_WIDE {
            assert!(error.contains(label), "{label} missing in {error}");
            assert!(SortKey::parse(&label.to_lowercase()).is_ok(), "{label}");
        }
    }

    #[test]
    fn filter_keeps_engines_with_the_prefix_and_totals_sum_them() {
        let mut reading = fleet(3);
        reading.engines[1].engine_id = "other-1".into();
        for (i, engine) in reading.engines.iter_mut().enumerate() {
            let i = i as u64;
            engine.snapshot.num_running = 10 + i;
            engine.snapshot.num_waiting = 100 * (i + 1);
            engine.snapshot.gpu_blocks_total = 1000;
            engine.snapshot.gpu_blocks_free = 250 * (i + 1);
            engine.snapshot.pending_prefill_tokens = 1_000 * (i + 1);
            engine.snapshot.ongoing_decode_tokens = 7;
            engine.snapshot.num_preempted = 1;
        }
        let filtered = View {
            filter: Some("prod-".into()),
            wide: true,
            ..View::default()
        };
        let text = render(&reading, &filtered);
        assert_eq!(
            ids(&text),
            ["prod-use1-llama70b-r0000", "prod-use1-llama70b-r0002"]
        );
        let totals = text.lines().find(|l| l.starts_with("TOTAL")).unwrap();
        let cells: Vec<&str> = totals.split("  ").filter(|c| !c.is_empty()).collect();
        // Engines 0 and 2: RUN 10+12, WAIT 100+300, blocks 2000 of which
        // 250+750 free (KV used 50 %), PEND_PREFILL 1000+3000, DECODE 14,
        // PREFILLING 12+14, PREEMPT 2; status, flags, ages, stamps, step, max prefill blank.
        // Numbers are right-aligned: a cell ends where its label ends.
        let header_line = text.lines().next().unwrap();
        let at = |label: &str| -> &str {
            let end = header_line.find(&format!(" {label}")).unwrap() + 1 + label.len();
            let cell = totals.get(..end).unwrap_or(totals);
            if cell.ends_with(' ') {
                ""
            } else {
                cell.rsplit(' ').next().unwrap()
            }
        };
        assert_eq!(cells[0].trim(), "TOTAL (2)");
        for (label, sum) in [
            ("RUN", "22"),
            ("WAIT", "400"),
            ("BLK_TOTAL", "2000"),
            ("BLK_FREE", "1000"),
            ("KV_USED", "50.0%"),
            ("PEND_PREFILL", "4000"),
            ("DECODE_TOK", "14"),
            ("PREFILLING", "26"),
            ("PREEMPT", "2"),
        ] {
            assert_eq!(at(label), sum, "{label} in {totals}");
        }
        assert_eq!(cells.len(), 1 + 9, "nothing else summed: {totals}");
        let none = View {
            filter: Some("nope".into()),
            ..View::default()
        };
        let text = render(&reading, &none);
        assert!(
            text.contains("(no engines match the filter; 3 in all)"),
            "{text}"
        );
        // One engine shown: no totals row.
        let one = View {
            filter: Some("other".into()),
            ..View::default()
        };
        assert_eq!(render(&reading, &one).lines().count(), 2);
    }
}

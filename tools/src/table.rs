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
    // Not summed: a prefix cached on several engines would count several
    // times (and the sum would not fit the default table's 120 columns).
    ("CACHE", Kind::Shown),
    ("CACHE_VER", Kind::WideOnly),
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
    columns.push(("HB_MS", Column::HeartbeatAge));
    columns.push(("CAP_MS", Column::CaptureAge));
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
    /// A snapshot word, compared exactly (stamps exceed f64's 2^53).
    Integer(u64),
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
            Column::Field(word) => Key::Integer(engine.snapshot.to_words()[word]),
            Column::KvUsed => Key::Number(engine.gpu_kv_used_frac().unwrap_or(-1.0)),
            Column::HeartbeatAge => Key::Number(engine.heartbeat_age.as_secs_f64()),
            Column::CaptureAge => Key::Number(engine.capture_age.as_secs_f64()),
        }
    }

    /// The totals row's cell: `TOTAL (<engines>)`, the sum over `engines`
    /// of a count or number of blocks, KV used of the summed blocks, blank
    /// for the rest (status, flags, cache blocks and version, ages, stamps,
    /// step, max prefill).
    fn total(self, engines: &[&EngineState]) -> String {
        let sum = |word: usize| -> u64 {
            engines
                .iter()
                .map(|e| e.snapshot.to_words()[word])
                .fold(0u64, u64::saturating_add)
        };
        match self {
            Column::Engine => format!("TOTAL ({})", engines.len()),
            Column::Field(word) if matches!(FIELD_LABELS[word].1, Kind::Sum | Kind::WideSum) => {
                sum(word).to_string()
            }
            Column::KvUsed => {
                // Each engine's free blocks as readers take them, at most
                // its total (`Snapshot::gpu_kv_used_frac`), then summed.
                let blocks = engines.iter().fold(Snapshot::default(), |mut all, e| {
                    let s = &e.snapshot;
                    all.gpu_blocks_total = all.gpu_blocks_total.saturating_add(s.gpu_blocks_total);
                    all.gpu_blocks_free = all
                        .gpu_blocks_free
                        .saturating_add(s.gpu_blocks_free.min(s.gpu_blocks_total));
                    all
                });
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

/// Two ids shortened to the same text (`prod-use1-ll…b-tp8-r0001` from
/// `…llama70b-tp8-r0001` and `…llama405b-tp8-r0001`) would be two rows that
/// look alike: those are shown whole.
fn show_colliding_names_whole(
    rows: &mut [Vec<String>],
    columns: &[(&'static str, Column)],
    engines: &[&EngineState],
) {
    let Some(c) = columns
        .iter()
        .position(|(_, col)| matches!(col, Column::Engine))
    else {
        return;
    };
    let mut seen = std::collections::HashMap::<String, usize>::new();
    for row in rows.iter() {
        *seen.entry(row[c].clone()).or_default() += 1;
    }
    for (row, engine) in rows.iter_mut().zip(engines) {
        if seen[&row[c]] > 1 {
            row[c] = shown_name(&engine.engine_id).into_owned();
        }
    }
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
    if !view.wide {
        show_colliding_names_whole(&mut rows[1..], &columns, &engines);
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
#[path = "table_tests.rs"]
mod tests;

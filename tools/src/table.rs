//! The human-readable engine table of `esdump`.

use std::borrow::Cow;
use std::fmt::Write;

use engine_state_reader::{millis, printable, EngineState, Reading};
use engine_state_shm_format::{EngineId, Snapshot, FIELD_COUNT};

/// The column label of each snapshot field, in word order
/// (`Snapshot::FIELD_NAMES`).
const FIELD_LABELS: [&str; FIELD_COUNT] = [
    "MONO_NS",
    "CAPTURED_UTC",
    "STEP",
    "RUN",
    "WAIT",
    "BLK_TOTAL",
    "BLK_FREE",
    "PEND_PREFILL",
    "DECODE_TOK",
    "PREFILLING",
    "MAX_PREFILL",
    "PREEMPT",
    "FLAGS",
];

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

/// The columns, in order: the engine and its status, every snapshot field
/// in word order (the KV used fraction after the free blocks), both ages,
/// and the capture stamps last (wall clock, then monotonic).
fn columns() -> Vec<(&'static str, Column)> {
    let is_stamp = |name: &&str| Snapshot::CAPTURE_STAMPS.contains(name);
    let mut columns = vec![("ENGINE", Column::Engine), ("STATUS", Column::Status)];
    for (word, name) in Snapshot::FIELD_NAMES.iter().enumerate() {
        if is_stamp(name) {
            continue;
        }
        columns.push((FIELD_LABELS[word], Column::Field(word)));
        if *name == "gpu_blocks_free" {
            columns.push(("KV_USED", Column::KvUsed));
        }
    }
    columns.push(("HB_AGE_MS", Column::HeartbeatAge));
    columns.push(("CAP_AGE_MS", Column::CaptureAge));
    for (word, name) in Snapshot::FIELD_NAMES.iter().enumerate().rev() {
        if is_stamp(name) {
            columns.push((FIELD_LABELS[word], Column::Field(word)));
        }
    }
    columns
}

impl Column {
    /// The cell of `engine` in this column.
    fn cell(self, engine: &EngineState) -> String {
        match self {
            Column::Engine => shown_name(&engine.engine_id).into_owned(),
            Column::Status => engine.status.to_string(),
            Column::Field(word) => {
                let value = engine.snapshot.to_words()[word];
                match Snapshot::FIELD_NAMES[word] {
                    "flags" => flags(value),
                    "captured_unix_ns" => utc_time(value),
                    _ => value.to_string(),
                }
            }
            Column::KvUsed => engine
                .gpu_kv_used_frac()
                .map_or("-".into(), |f| format!("{:.1}%", f * 100.0)),
            Column::HeartbeatAge => format!("{:.1}", millis(engine.heartbeat_age)),
            Column::CaptureAge => format!("{:.1}", millis(engine.capture_age)),
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
}

/// Renders `reading` as an aligned table, one row per engine, errors below.
pub fn render(reading: &Reading) -> String {
    let columns = columns();
    let mut rows: Vec<Vec<String>> =
        vec![columns.iter().map(|(label, _)| label.to_string()).collect()];
    for engine in &reading.engines {
        rows.push(
            columns
                .iter()
                .map(|(_, column)| column.cell(engine))
                .collect(),
        );
    }
    let widths: Vec<usize> = (0..columns.len())
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
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
    if reading.engines.is_empty() {
        out.push_str("(no engines)\n");
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

    const EXPECTED_HEADER: [&str; 18] = [
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
        let text = render(&reading);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        // The header, pinned: a change of columns or their order shows here.
        let header: Vec<&str> = lines[0].split_whitespace().collect();
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
        assert!(render(&Reading::default()).contains("(no engines)"));
    }

    #[test]
    fn every_snapshot_field_has_its_column() {
        let columns = columns();
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
        let text = render(&Reading {
            engines: vec![engine],
            errors: vec![],
        });
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
        let text = render(&reading);
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
}

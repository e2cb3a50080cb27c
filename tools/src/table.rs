//! The human-readable engine table of `esdump`.

use std::borrow::Cow;
use std::fmt::Write;

use engine_state_reader::{millis, printable, Reading};
use engine_state_shm_format::EngineId;

const COLUMNS: [&str; 18] = [
    "ENGINE",
    "STATUS",
    "RUN",
    "WAIT",
    "KV_USED",
    "BLK_FREE",
    "BLK_TOTAL",
    "PEND_PREFILL",
    "DECODE_TOK",
    "PREFILLING",
    "MAX_PREFILL",
    "PREEMPT",
    "STEP",
    "FLAGS",
    "HB_AGE_MS",
    "CAP_AGE_MS",
    "CAPTURED_UTC",
    "MONO_NS",
];

/// Renders `reading` as an aligned table, one row per engine, errors below.
pub fn render(reading: &Reading) -> String {
    let mut rows: Vec<Vec<String>> = vec![COLUMNS.iter().map(|c| c.to_string()).collect()];
    for e in &reading.engines {
        let s = &e.snapshot;
        rows.push(vec![
            shown_name(&e.engine_id).into_owned(),
            e.status.to_string(),
            s.num_running.to_string(),
            s.num_waiting.to_string(),
            e.gpu_kv_used_frac()
                .map_or("-".into(), |f| format!("{:.1}%", f * 100.0)),
            s.gpu_blocks_free.to_string(),
            s.gpu_blocks_total.to_string(),
            s.pending_prefill_tokens.to_string(),
            s.ongoing_decode_tokens.to_string(),
            s.num_prefilling.to_string(),
            s.max_prefill_remaining.to_string(),
            s.num_preempted.to_string(),
            s.step.to_string(),
            flags(s.flags),
            format!("{:.1}", millis(e.heartbeat_age)),
            format!("{:.1}", millis(e.capture_age)),
            utc_time(s.captured_unix_ns),
            s.captured_mono_ns.to_string(),
        ]);
    }
    let widths: Vec<usize> = (0..COLUMNS.len())
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        for (c, cell) in row.iter().enumerate() {
            // Names and words left-aligned, numbers right-aligned.
            if c < 2 || c == 13 {
                let _ = write!(out, "{cell:<w$}  ", w = widths[c]);
            } else {
                let _ = write!(out, "{cell:>w$}  ", w = widths[c]);
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
    use engine_state_reader::{EngineState, Snapshot, Status};
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
        assert!(lines[0].starts_with("ENGINE") && lines[0].contains("KV_USED"));
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

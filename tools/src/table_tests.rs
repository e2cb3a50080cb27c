//! Tests of `table.rs` (a sibling file: docs/ARCHITECTURE.md, "Layout conventions").

use super::*;

/// The default header (fits 120 columns).
const EXPECTED_HEADER: [&str; 11] = [
    "ENGINE",
    "STATUS",
    "RUN",
    "WAIT",
    "KV_USED",
    "PEND_PREFILL",
    "DECODE_TOK",
    "FLAGS",
    "CACHE",
    "HB_MS",
    "CAP_MS",
];
/// The `--wide` header: every column.
const EXPECTED_HEADER_WIDE: [&str; 20] = [
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
    "CACHE",
    "CACHE_VER",
    "HB_MS",
    "CAP_MS",
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
            cache: None,
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
        cache: None,
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
            // At most the digest's default capacity for 13 750 blocks of 16 tokens.
            cache_blocks: 429 - i % 50,
            cache_version: 1_000_000 + i,
            ..Snapshot::default()
        },
        heartbeat_age: Duration::from_micros(12_345 + i),
        capture_age: Duration::from_millis(45_000 + i),
        generation: 1,
        read_mono_ns: 0,
        writer: Default::default(),
        clock_ahead: false,
        cache: None,
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
        assert!(
            line.chars().count() <= 120,
            "{} wide: {line}\n{text}",
            line.len()
        );
    }
    assert_eq!(text.lines().count(), 1 + 500 + 1, "header, rows, totals");
    for raw in [
        "MONO_NS",
        "CAPTURED_UTC",
        "STEP",
        "BLK_TOTAL",
        "MAX_PREFILL",
        "CACHE_VER",
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
fn the_totals_kv_used_takes_each_engines_free_blocks_at_most_its_total() {
    let mut reading = fleet(2);
    // A reports more free than total blocks (0 % used as readers take
    // it), B none free (100 %): together 50 %, not 0 %.
    reading.engines[0].snapshot.gpu_blocks_total = 1000;
    reading.engines[0].snapshot.gpu_blocks_free = 3000;
    reading.engines[1].snapshot.gpu_blocks_total = 1000;
    reading.engines[1].snapshot.gpu_blocks_free = 0;
    let text = render(&reading, &View::default());
    let header: Vec<&str> = text.lines().next().unwrap().split_whitespace().collect();
    let column = header.iter().position(|l| *l == "KV_USED").unwrap();
    let totals = text.lines().find(|l| l.starts_with("TOTAL")).unwrap();
    // "TOTAL (2)" is two words; STATUS is blank in the totals row.
    let cells: Vec<&str> = totals.split_whitespace().collect();
    assert_eq!(cells[column], "50.0%", "{totals}");
}

#[test]
fn sorting_by_a_stamp_compares_it_exactly() {
    // Two stamps 1 ns apart above 2^53: equal as f64, not as u64.
    let mut reading = fleet(2);
    reading.engines[0].snapshot.captured_unix_ns = 1_780_000_000_000_000_000;
    reading.engines[1].snapshot.captured_unix_ns = 1_780_000_000_000_000_001;
    let view = View {
        sort: Some(SortKey::parse("captured_utc").unwrap()),
        wide: true,
        ..View::default()
    };
    assert_eq!(
        ids(&render(&reading, &view)),
        ["prod-use1-llama70b-r0001", "prod-use1-llama70b-r0000"]
    );
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
        engine.snapshot.cache_blocks = 400 + i;
        engine.snapshot.cache_version = 9;
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
    // PREFILLING 12+14, PREEMPT 2; status, flags, cache blocks and
    // version, ages, stamps, step, max prefill blank.
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

#[test]
fn ids_that_shorten_alike_are_shown_whole() {
    let mut reading = fleet(3);
    reading.engines[0].engine_id = "prod-use1-llama70b-tp8-r0001".into();
    reading.engines[1].engine_id = "prod-use1-llama405b-tp8-r0001".into();
    let text = render(&reading, &View::default());
    let shown = ids(&text);
    assert_eq!(
        shown[..2],
        [
            "prod-use1-llama70b-tp8-r0001",
            "prod-use1-llama405b-tp8-r0001"
        ]
    );
    // The third, unique, is still shortened only if long: it is 24 chars.
    assert_eq!(shown[2], "prod-use1-llama70b-r0002");
}

//! `esdump --replicas`: the router replicas' shared reservations
//! (docs/ROUTING.md, "Shared reservations"), one row per replica and
//! engine it holds reservations on, then the per-replica errors.

use std::fmt::Write as _;

use engine_state_reader::{millis, printable, ReplicaReading};
use engine_state_shm_format::Reservations;

/// The column label of each counter, by its name in
/// `Reservations::FIELD_NAMES` (the one list): a test checks every counter
/// has one, and the columns follow that list's order.
const COUNTER_LABELS: [(&str, &str); Reservations::FIELD_NAMES.len()] = [
    ("num_requests", "REQ"),
    ("ongoing_tokens", "ONGOING_TOK"),
    ("pending_prefill_tokens", "PEND_PREFILL"),
    ("ongoing_decode_tokens", "DECODE_TOK"),
    ("num_prefilling", "PREFILLING"),
    ("max_prefill_remaining", "MAX_PREFILL"),
];

/// The label of counter `name`.
fn label(name: &str) -> &'static str {
    COUNTER_LABELS
        .iter()
        .find(|(field, _)| *field == name)
        .map_or("?", |(_, label)| label)
}

/// The table of `reading`: REPLICA, STATUS, ENGINE, one column per counter
/// ([`COUNTER_LABELS`]: REQ, ONGOING_TOK, PEND_PREFILL, DECODE_TOK,
/// PREFILLING, MAX_PREFILL), HB_MS. A replica
/// that lists no engine (or whose record is torn) shows one row with `-`.
/// Names are shown escaped ([`printable`]).
pub fn render(reading: &ReplicaReading) -> String {
    let header: Vec<&str> = ["REPLICA", "STATUS", "ENGINE"]
        .into_iter()
        .chain(Reservations::FIELD_NAMES.iter().map(|name| label(name)))
        .chain(["HB_MS"])
        .collect();
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
    for replica in &reading.replicas {
        let head = |engine: String| {
            vec![
                printable(&replica.replica_id).into_owned(),
                replica.status.to_string(),
                engine,
            ]
        };
        let heartbeat = format!("{:.0}", millis(replica.heartbeat_age));
        if replica.engines.is_empty() {
            let mut row = head("-".to_owned());
            row.extend(std::iter::repeat_n(
                "-".to_owned(),
                Reservations::FIELD_NAMES.len(),
            ));
            row.push(heartbeat.clone());
            rows.push(row);
        }
        for (engine, r) in &replica.engines {
            let mut row = head(printable(engine).into_owned());
            row.extend(r.fields().map(|(_, value)| value.to_string()));
            row.push(heartbeat.clone());
            rows.push(row);
        }
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(c, (cell, &w))| match c {
                0..=2 => format!("{cell:<w$}"),
                _ => format!("{cell:>w$}"),
            })
            .collect();
        let _ = writeln!(out, "{}", cells.join("  ").trim_end());
    }
    if reading.replicas.is_empty() {
        out.push_str("(no router replica shares its reservations here)\n");
    }
    for error in &reading.errors {
        let _ = writeln!(out, "error: {}", printable(&error.to_string()));
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use engine_state_reader::{EngineError, ReplicaState, Status};

    use super::*;

    #[test]
    fn every_counter_has_a_label() {
        for name in Reservations::FIELD_NAMES {
            assert_ne!(label(name), "?", "{name}");
        }
    }

    #[test]
    fn one_row_per_replica_and_engine_then_the_errors() {
        let replica = |id: &str, engines: Vec<(Arc<str>, Reservations)>| ReplicaState {
            replica_id: id.into(),
            status: Status::Fresh,
            heartbeat_age: Duration::from_millis(12),
            changed_age: None,
            generation: 1,
            read_mono_ns: 0,
            writer_pid: 7,
            engines,
        };
        let busy = Reservations {
            num_requests: 3,
            ongoing_tokens: 4500,
            pending_prefill_tokens: 1200,
            ongoing_decode_tokens: 3300,
            num_prefilling: 1,
            max_prefill_remaining: 1200,
        };
        let reading = ReplicaReading {
            replicas: vec![
                replica(
                    "router-a",
                    vec![("e0".into(), busy), ("e1".into(), Reservations::default())],
                ),
                replica("router-\u{1b}b", vec![]),
            ],
            errors: vec![EngineError::new(
                "junk",
                engine_state_reader::Error::BadUri {
                    uri: "x".into(),
                    reason: "y".into(),
                },
            )],
        };
        let text = render(&reading);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5, "{text}");
        assert!(lines[0].starts_with("REPLICA"));
        let cells: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            cells,
            ["router-a", "fresh", "e0", "3", "4500", "1200", "3300", "1", "1200", "12"]
        );
        assert!(
            lines[3].contains("router-\\u{1b}b") && lines[3].contains(" - "),
            "{text}"
        );
        assert!(lines[4].starts_with("error: "));
        assert!(render(&ReplicaReading::default()).contains("no router replica"));
    }
}
